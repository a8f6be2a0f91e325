//! The steady-state workloads: what `--patterns` accepts, and where each
//! write of a pattern goes.
//!
//! - `uniform`: random 4 KiB writes over the whole volume.
//! - `skewed`: 90% of the writes on the first 10% of the blocks (as fio's
//!   `random_distribution=zoned:90/10:10/90`, which the peers' script uses).
//! - `zipf:THETA`: block ranks drawn from Zipf's law with exponent THETA,
//!   rank r stored at a block given by a bijective scramble of r, so that
//!   the hottest blocks are spread over the volume rather than adjacent.
//! - `moving:SECONDS` or `moving:Nx`: `skewed`'s 90/10 hot set, moved to
//!   another tenth of the volume every SECONDS, or every time N times the
//!   volume's size has been written (which does not depend on the machine's
//!   speed). The hot tenth of move e is tenth 3e mod 10: each move lands
//!   away from the last, and ten moves visit every tenth.
//! - `seqmix[:RUN]`: half the bytes random 4 KiB writes, half sequential
//!   writes of RUN bytes (default 256K) walking the volume from its start
//!   and wrapping; a request is a run with probability 4K / (4K + RUN).
//! - `trace:PATH`: the writes of a block trace (`trace.rs`), looped.
//! - `sync:N`: random 4 KiB writes, each client flushing after every N of
//!   its writes, on an empty volume.

use super::trace::Trace;
use super::zipf::Zipf;
use crate::size::parse_size;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const BLOCK: u64 = 4096;

/// When `moving`'s hot set moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoveEvery {
    Seconds(f64),
    /// Every time this many times the volume's size has been written.
    VolumeWritten(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    Uniform,
    Skewed,
    Zipf { theta: f64 },
    Moving { every: MoveEvery },
    SeqMix { run_bytes: u64 },
    Trace { path: PathBuf },
    Sync { every: u32 },
}

/// What `--patterns` accepts, for error messages.
pub const PATTERN_FORMS: &str =
    "uniform, skewed, zipf:THETA, moving:SECONDS, moving:Nx, seqmix, seqmix:RUN, trace:PATH, sync:N";

impl std::str::FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Pattern, String> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let number = |a: &str, what: &str| -> Result<f64, String> {
            a.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("'{s}': {what} must be a number above 0"))
        };
        match (kind, arg) {
            ("uniform", None) => Ok(Pattern::Uniform),
            ("skewed", None) => Ok(Pattern::Skewed),
            ("zipf", Some(a)) => {
                let theta = number(a, "THETA (e.g. zipf:0.99)")?;
                if theta > 10.0 {
                    return Err(format!("'{s}': THETA must be at most 10"));
                }
                Ok(Pattern::Zipf { theta })
            }
            ("moving", Some(a)) => {
                let every = match a.trim().strip_suffix('x') {
                    Some(n) => MoveEvery::VolumeWritten(number(
                        n,
                        "N in moving:Nx (the volume's size written between moves)",
                    )?),
                    None => MoveEvery::Seconds(number(
                        a.trim().strip_suffix('s').unwrap_or(a),
                        "SECONDS in moving:SECONDS",
                    )?),
                };
                Ok(Pattern::Moving { every })
            }
            ("seqmix", None) => Ok(Pattern::SeqMix {
                run_bytes: 256 << 10,
            }),
            ("seqmix", Some(a)) => {
                let run_bytes = parse_size(a).map_err(|e| format!("'{s}': RUN: {e}"))?;
                if run_bytes < BLOCK || run_bytes % BLOCK != 0 || run_bytes > 64 << 20 {
                    return Err(format!(
                        "'{s}': RUN must be a multiple of 4K from 4K to 64M (e.g. seqmix:1M)"
                    ));
                }
                Ok(Pattern::SeqMix { run_bytes })
            }
            ("trace", Some(a)) if !a.trim().is_empty() => Ok(Pattern::Trace {
                path: PathBuf::from(a),
            }),
            ("sync", Some(a)) => {
                let every = a
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| {
                        format!("'{s}': N (writes per flush) must be a whole number from 1")
                    })?;
                Ok(Pattern::Sync { every })
            }
            ("uniform" | "skewed" | "zipf" | "moving" | "trace" | "sync", _) => {
                Err(format!("'{s}': expected one of {PATTERN_FORMS}"))
            }
            _ => Err(format!("unknown pattern '{s}' ({PATTERN_FORMS})")),
        }
    }
}

impl Pattern {
    /// The name in the JSON report and on stderr.
    pub fn name(&self) -> String {
        match self {
            Pattern::Uniform => "uniform".into(),
            Pattern::Skewed => "skewed".into(),
            Pattern::Zipf { theta } => format!("zipf:{theta}"),
            Pattern::Moving {
                every: MoveEvery::Seconds(s),
            } => format!("moving:{s}s"),
            Pattern::Moving {
                every: MoveEvery::VolumeWritten(n),
            } => format!("moving:{n}x"),
            Pattern::SeqMix { run_bytes } => format!("seqmix:{}K", run_bytes >> 10),
            Pattern::Trace { path } => format!("trace:{}", path.display()),
            Pattern::Sync { every } => format!("sync:{every}"),
        }
    }

    /// Client flushes after every this many writes per client (`sync:N`).
    pub fn flush_every(&self) -> Option<u32> {
        match self {
            Pattern::Sync { every } => Some(*every),
            _ => None,
        }
    }
}

/// Parses a comma-separated `--patterns` list.
pub fn parse_patterns(list: &str) -> Result<Vec<Pattern>, String> {
    let patterns = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Pattern>, String>>()?;
    if patterns.is_empty() {
        return Err(format!("no pattern given ({PATTERN_FORMS})"));
    }
    Ok(patterns)
}

/// A small fast generator (SplitMix64), one per writing thread.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        super::super::mix(self.0)
    }
    /// Uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A bijection of 0..n that scatters neighbours: a 4-round Feistel network
/// over the smallest even power of two not below n, walking the cycle until
/// the value falls inside 0..n (at most about 4 steps on average).
#[derive(Debug, Clone)]
pub struct Scramble {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Scramble {
    pub fn new(n: u64, seed: u64) -> Scramble {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let keys = std::array::from_fn(|i| super::super::mix(seed ^ (i as u64 + 1)));
        Scramble { n, half_bits, keys }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let f = super::super::mix(right ^ k) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }

    pub fn apply(&self, x: u64) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        let mut y = self.round_trip(x);
        while y >= self.n {
            y = self.round_trip(y);
        }
        y
    }
}

/// How far the overwrite has got: what `moving` moves by.
#[derive(Debug, Clone, Copy, Default)]
pub struct Position {
    /// User bytes written since the overwrite began.
    pub bytes: u64,
    pub seconds: f64,
}

/// One write: offset and length in bytes (multiples of 4 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    pub offset: u64,
    pub len: u64,
}

enum Kind {
    Uniform,
    Skewed,
    Zipf(Zipf, Scramble),
    Moving(MoveEvery),
    SeqMix {
        run_blocks: u64,
        cursor: AtomicU64,
    },
    Trace {
        trace: Arc<Trace>,
        cursor: AtomicU64,
    },
}

/// Where the writes of one pattern go on one volume; shared by the
/// writing threads.
pub struct Generator {
    blocks: u64,
    kind: Kind,
}

impl Generator {
    /// `trace` is the loaded trace of a `trace:` pattern.
    pub fn new(pattern: &Pattern, volume_bytes: u64, trace: Option<Arc<Trace>>) -> Generator {
        let blocks = (volume_bytes / BLOCK).max(1);
        let kind = match (pattern, trace) {
            (Pattern::Skewed, _) => Kind::Skewed,
            (Pattern::Zipf { theta }, _) => {
                Kind::Zipf(Zipf::new(blocks, *theta), Scramble::new(blocks, 0x21bf))
            }
            (Pattern::Moving { every }, _) => Kind::Moving(*every),
            (Pattern::SeqMix { run_bytes }, _) => Kind::SeqMix {
                run_blocks: (run_bytes / BLOCK).clamp(1, blocks),
                cursor: AtomicU64::new(0),
            },
            (Pattern::Trace { .. }, Some(trace)) => Kind::Trace {
                trace,
                cursor: AtomicU64::new(0),
            },
            _ => Kind::Uniform,
        };
        Generator { blocks, kind }
    }

    /// The longest write it makes.
    pub fn max_len(&self) -> u64 {
        match &self.kind {
            Kind::SeqMix { run_blocks, .. } => run_blocks * BLOCK,
            Kind::Trace { trace, .. } => trace.max_len().clamp(BLOCK, self.blocks * BLOCK),
            _ => BLOCK,
        }
    }

    pub fn next(&self, rng: &mut Rng, at: Position) -> Req {
        let block = |b: u64| Req {
            offset: b * BLOCK,
            len: BLOCK,
        };
        match &self.kind {
            Kind::Uniform => block(rng.below(self.blocks)),
            Kind::Skewed => block(self.hot_set(rng, 0)),
            Kind::Zipf(zipf, scramble) => block(scramble.apply(zipf.sample(rng) - 1)),
            Kind::Moving(every) => {
                let volume = self.blocks * BLOCK;
                let moves = match *every {
                    MoveEvery::Seconds(s) => (at.seconds / s) as u64,
                    MoveEvery::VolumeWritten(n) => (at.bytes as f64 / (n * volume as f64)) as u64,
                };
                block(self.hot_set(rng, moves.wrapping_mul(3) % 10))
            }
            Kind::SeqMix { run_blocks, cursor } => {
                if rng.below(BLOCK + run_blocks * BLOCK) >= BLOCK {
                    return block(rng.below(self.blocks));
                }
                let runs = (self.blocks / run_blocks).max(1);
                let run = cursor.fetch_add(1, Ordering::Relaxed) % runs;
                Req {
                    offset: run * run_blocks * BLOCK,
                    len: run_blocks * BLOCK,
                }
            }
            Kind::Trace { trace, cursor } => {
                let i = cursor.fetch_add(1, Ordering::Relaxed);
                trace.request(i, self.blocks * BLOCK)
            }
        }
    }

    /// 90% of the draws in tenth `tenth` of the blocks, the rest anywhere else.
    fn hot_set(&self, rng: &mut Rng, tenth: u64) -> u64 {
        let start = self.blocks * tenth / 10;
        let end = (self.blocks * (tenth + 1) / 10)
            .max(start + 1)
            .min(self.blocks);
        let hot = end - start;
        if rng.below(100) < 90 || hot >= self.blocks {
            return start + rng.below(hot);
        }
        let b = rng.below(self.blocks - hot);
        if b >= start {
            b + hot
        } else {
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_name_themselves() {
        let cases = [
            ("uniform", "uniform"),
            ("skewed", "skewed"),
            ("zipf:0.99", "zipf:0.99"),
            ("moving:30", "moving:30s"),
            ("moving:30s", "moving:30s"),
            ("moving:0.5x", "moving:0.5x"),
            ("seqmix", "seqmix:256K"),
            ("seqmix:1M", "seqmix:1024K"),
            ("trace:bench/traces/x.csv", "trace:bench/traces/x.csv"),
            ("sync:8", "sync:8"),
        ];
        for (given, name) in cases {
            let p: Pattern = given.parse().unwrap();
            assert_eq!(p.name(), name);
            assert_eq!(p.name().parse::<Pattern>().unwrap(), p, "{given}");
        }
        assert_eq!(
            parse_patterns(" uniform, zipf:0.9 ,").unwrap(),
            [Pattern::Uniform, Pattern::Zipf { theta: 0.9 }]
        );
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (given, says) in [
            ("hot", "unknown pattern 'hot'"),
            ("zipf", "expected one of"),
            ("zipf:0", "THETA (e.g. zipf:0.99) must be a number above 0"),
            ("zipf:x", "must be a number above 0"),
            ("zipf:11", "at most 10"),
            ("moving:-3", "SECONDS in moving:SECONDS"),
            ("moving:zx", "N in moving:Nx"),
            ("seqmix:3K", "multiple of 4K"),
            ("seqmix:lots", "RUN:"),
            ("trace:", "expected one of"),
            ("sync:0", "whole number from 1"),
            ("uniform:2", "expected one of"),
        ] {
            let err = parse_patterns(given).unwrap_err();
            assert!(err.contains(says), "{given}: {err}");
        }
        assert!(parse_patterns(" , ").unwrap_err().contains("no pattern"));
    }

    fn draws(g: &Generator, n: usize, at: Position) -> Vec<Req> {
        let mut rng = Rng::new(11);
        (0..n).map(|_| g.next(&mut rng, at)).collect()
    }

    /// Share of the draws whose block is in tenth `t` of `blocks`.
    fn share_in_tenth(reqs: &[Req], blocks: u64, t: u64) -> f64 {
        let (lo, hi) = (blocks * t / 10, blocks * (t + 1) / 10);
        let n = reqs
            .iter()
            .filter(|r| (lo..hi).contains(&(r.offset / BLOCK)))
            .count();
        n as f64 / reqs.len() as f64
    }

    #[test]
    fn skewed_puts_90_percent_on_the_first_tenth() {
        let blocks = 100_000;
        let g = Generator::new(&Pattern::Skewed, blocks * BLOCK, None);
        let reqs = draws(&g, 200_000, Position::default());
        let hot = share_in_tenth(&reqs, blocks, 0);
        // 90% aimed there, plus the cold draws' tenth of nothing: 0.9 exactly.
        assert!((hot - 0.9).abs() < 0.005, "{hot}");
        assert!(reqs
            .iter()
            .all(|r| r.offset < blocks * BLOCK && r.len == BLOCK));
        // The cold tenth-and-rest is spread: every other tenth gets about 1/90.
        for t in 1..10 {
            let s = share_in_tenth(&reqs, blocks, t);
            assert!((s - 0.1 / 9.0).abs() < 0.003, "tenth {t}: {s}");
        }
    }

    #[test]
    fn moving_hot_set_moves_by_time_and_by_bytes() {
        let blocks = 100_000;
        let volume = blocks * BLOCK;
        let by_time = Generator::new(
            &Pattern::Moving {
                every: MoveEvery::Seconds(10.0),
            },
            volume,
            None,
        );
        let hot_tenth = |g: &Generator, at: Position| {
            let reqs = draws(g, 50_000, at);
            let shares: Vec<f64> = (0..10).map(|t| share_in_tenth(&reqs, blocks, t)).collect();
            let (t, s) = shares
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap();
            assert!((s - 0.9).abs() < 0.01, "{shares:?}");
            t
        };
        let at = |seconds: f64, bytes: u64| Position { bytes, seconds };
        assert_eq!(hot_tenth(&by_time, at(0.0, 0)), 0);
        assert_eq!(hot_tenth(&by_time, at(9.9, volume * 5)), 0);
        assert_eq!(hot_tenth(&by_time, at(10.0, 0)), 3);
        assert_eq!(hot_tenth(&by_time, at(25.0, 0)), 6);
        let by_bytes = Generator::new(
            &Pattern::Moving {
                every: MoveEvery::VolumeWritten(0.5),
            },
            volume,
            None,
        );
        assert_eq!(hot_tenth(&by_bytes, at(100.0, volume / 2 - 1)), 0);
        assert_eq!(hot_tenth(&by_bytes, at(0.0, volume / 2)), 3);
        // Ten moves visit every tenth once.
        let tenths: std::collections::BTreeSet<u64> = (0..10u64).map(|e| e * 3 % 10).collect();
        assert_eq!(tenths.len(), 10);
    }

    #[test]
    fn zipf_blocks_are_scrambled_over_the_volume() {
        // A bijection, for sizes that are and are not powers of two.
        for n in [1u64, 2, 3, 7, 64, 1000, 4099] {
            let s = Scramble::new(n, 5);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = s.apply(x);
                assert!(y < n && !seen[y as usize], "n {n}: {x} -> {y}");
                seen[y as usize] = true;
            }
        }
        // The ten hottest blocks are not neighbours.
        let blocks = 1 << 20;
        let g = Generator::new(&Pattern::Zipf { theta: 0.99 }, blocks * BLOCK, None);
        let mut counts = std::collections::HashMap::new();
        for r in draws(&g, 300_000, Position::default()) {
            *counts.entry(r.offset / BLOCK).or_insert(0u64) += 1;
        }
        let mut hot: Vec<(u64, u64)> = counts.into_iter().map(|(b, c)| (c, b)).collect();
        hot.sort_unstable_by(|a, b| b.cmp(a));
        let mut top: Vec<u64> = hot[..10].iter().map(|&(_, b)| b).collect();
        top.sort_unstable();
        assert!(top.windows(2).all(|w| w[1] - w[0] > 16), "{top:?}");
    }

    #[test]
    fn seqmix_writes_half_its_bytes_in_runs_walking_the_volume() {
        let blocks = 39 * 64 + 10; // 39 whole runs of 256 KiB
        let g = Generator::new(
            &Pattern::SeqMix {
                run_bytes: 256 << 10,
            },
            blocks * BLOCK,
            None,
        );
        let reqs = draws(&g, 100_000, Position::default());
        let runs: Vec<&Req> = reqs.iter().filter(|r| r.len > BLOCK).collect();
        let run_bytes: u64 = runs.iter().map(|r| r.len).sum();
        let all: u64 = reqs.iter().map(|r| r.len).sum();
        let share = run_bytes as f64 / all as f64;
        assert!((share - 0.5).abs() < 0.03, "{share}");
        // In order, wrapping at the last whole run.
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.offset, (i as u64 % 39) * (256 << 10));
            assert_eq!(r.len, 256 << 10);
        }
        assert_eq!(g.max_len(), 256 << 10);
    }
}
