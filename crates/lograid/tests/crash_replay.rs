//! Crash replay: a pool runs a random workload on recording members, which
//! log every write, flush and discard the drives receive, in one global
//! order. Then, for many cut points in that log, the members' images are
//! rebuilt as a power cut at that instant could have left them, the pool is
//! opened from them, and what it holds is checked against a model of what
//! the workload had acknowledged and flushed by then.
//!
//! A cut point is, per member, how many of its own records (writes,
//! discards, flushes) had happened: the members are separate drives, so
//! that vector is all a power cut decides. Cut points are taken at places
//! in the global log (so they are consistent: nothing after the cut caused
//! anything before it) and named by their vector (the global interleaving
//! of members served by parallel I/O threads changes from run to run; each
//! member's own sequence does not). Two kinds:
//! - flush boundaries: every point right after the members' flushes (the
//!   last of a run of consecutive flush records: the images do not change
//!   within a run, and the guarantees only grow along it); each member's
//!   image is its initial image plus every record up to the cut;
//! - random points: each member keeps the writes its last completed flush
//!   covered; the writes it received after that, up to the cut, land in a
//!   random order, a random subset of them dropped, and with a tear one of
//!   them (per member) lands only in part (a prefix of its 512-byte sectors).
//!
//! At each cut: the pool opens with no manual repair; its bookkeeping passes
//! `check_invariants`; every sector of the volume reads back, holding either
//! the value the model had made durable by the last flush that completed
//! before the cut, or the value of a write issued after that flush (and
//! before the cut); a scrub finds no lost block that a flush covered; and
//! the reopened pool takes a write and a flush.
//!
//! Knobs (environment):
//! - `LOGRAID_REPLAY_SEED`: the workload seed (printed). The workload is
//!   drawn from it, and each cut draws from its own RNG derived from the
//!   seed, the shape and the cut. The members' I/O is not fixed by the
//!   seed: the row writer thread and a writer that finds its queue full
//!   may write two rows in either order, and flushes land between them at
//!   different places, so two runs of one seed differ slightly (the I/O
//!   fingerprint printed with a failure tells whether a rerun saw the same
//!   I/O; `LOGRAID_REPLAY_ONLY` re-checks a cut of a run that did).
//! - `LOGRAID_REPLAY_CUTS`: cut points per shape (default 40; up to half
//!   are flush boundaries, evenly sampled when there are more, the rest
//!   random). Long mode: `LOGRAID_REPLAY_CUTS=400` (every flush boundary,
//!   over 1,000 cut points over the three shapes).
//! - `LOGRAID_REPLAY_OPS`: workload operations per shape (default 240).
//! - `LOGRAID_REPLAY_FILL`: volume size in percent of usable space (60).
//! - `LOGRAID_REPLAY_ONLY=<members>x<parity>@<c0>,<c1>,...:<flush|random>`:
//!   check only that cut point (a failure prints the line to use).
//!
//! Fast: `cargo nextest run -p lograid --test crash_replay`.
//! Long: `LOGRAID_REPLAY_CUTS=400 cargo nextest run -p lograid --test crash_replay --no-capture`.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{sector_pattern, sector_tag, test_options, SECTOR};
use lograid::device::{IoLog, Member, Record, RecordingMember, SimMember, SimRng};
use lograid::{create_pool, open_members, CreateOptions, Volume};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// Size of each simulated drive (as in model.rs).
const MEMBER_BYTES: u64 = 8 << 20;
/// Volume size as a fraction of usable capacity (`LOGRAID_REPLAY_FILL`
/// in percent overrides it: a fuller volume makes the cleaner work harder).
const FILL: f64 = 0.6;
/// Write data the log may hold per shape.
const LOG_LIMIT: usize = 512 << 20;
const DEFAULT_SEED: u64 = 0x1095_a1d0_7e57_0001;
const DEFAULT_CUTS: usize = 40;
const DEFAULT_OPS: usize = 240;

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={s} is not a number"))
        }
        Err(_) => default,
    }
}

/// A well-mixed 64-bit hash (splitmix64's finaliser), to derive seeds.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

// ---------------------------------------------------------------------------
// The workload and what it was told.

/// What an operation did to the volume's sectors, as far as the model knows.
#[derive(Debug, Clone)]
enum Step {
    /// Sectors `[first, first + n)` were written with write `tag`. `acked`
    /// false: the write failed (no space) and may have applied in part.
    Write {
        first: usize,
        n: usize,
        tag: u64,
        acked: bool,
    },
    /// Sectors `[first, first + n)` read as zero after it (trim of whole
    /// blocks, write-zeroes).
    Zero { first: usize, n: usize },
    /// A flush (or FUA, checkpoint, cleaning pass): once it returned,
    /// everything acknowledged before it is durable.
    Flush,
}

/// One operation and where it sat in the I/O log: the records `[start, end)`
/// were made while it ran.
#[derive(Debug, Clone)]
struct Op {
    start: usize,
    end: usize,
    what: &'static str,
    step: Step,
}

#[derive(Default, Debug)]
struct WorkloadStats {
    writes: usize,
    overwrites: usize,
    trims: usize,
    zeroes: usize,
    flushes: usize,
    fua: usize,
    cleans: usize,
    segments_cleaned: usize,
    checkpoints: usize,
    reads: usize,
    no_space: usize,
}

/// The live pool's exact contents (tags per sector; `u64::MAX` after a
/// failed write), for the reads the workload checks as it goes.
struct Live {
    current: Vec<u64>,
    next_tag: u64,
}

impl Live {
    fn random_range(&self, rng: &mut SimRng, max_len: u64) -> (u64, u64) {
        let size = self.current.len() as u64 * SECTOR as u64;
        let unit = if rng.below(2) == 0 {
            4096
        } else {
            SECTOR as u64
        };
        let off = rng.below(size / unit) * unit;
        let len = ((rng.below(max_len / unit) + 1) * unit).min(size - off);
        (off, len)
    }

    fn data(tag: u64, off: u64, len: u64) -> Vec<u8> {
        let first = off / SECTOR as u64;
        let mut data = vec![0u8; len as usize];
        for (i, s) in data.chunks_mut(SECTOR).enumerate() {
            sector_pattern(tag, first + i as u64, s);
        }
        data
    }
}

/// The sector a byte offset falls in.
fn sec(off: u64) -> usize {
    (off / SECTOR as u64) as usize
}

/// What the workload drives and keeps between operations: the live
/// contents, the ranges written so far (for overwrites), and the counts.
struct Workload<'a> {
    volume: &'a Volume,
    pool: &'a lograid::Pool,
    live: Live,
    written: Vec<(u64, u64)>,
    stats: &'a mut WorkloadStats,
}

/// Runs the workload; returns the operations with their log positions.
fn run_workload(
    volume: &Volume,
    pool: &lograid::Pool,
    log: &IoLog,
    rng: &mut SimRng,
    ops: usize,
    stats: &mut WorkloadStats,
) -> Vec<Op> {
    let sectors = (volume.size_bytes() / SECTOR as u64) as usize;
    let mut workload = Workload {
        volume,
        pool,
        live: Live {
            current: vec![0; sectors],
            next_tag: 1,
        },
        written: Vec::new(),
        stats,
    };
    let mut history: Vec<Op> = Vec::new();
    for i in 0..ops {
        let start = log.len();
        // One explicit checkpoint in the middle, whatever the dice say.
        let dice = if i == ops / 2 { 87 } else { rng.below(100) };
        let (what, steps) = workload.op(i, dice, rng);
        let end = log.len();
        for step in steps {
            history.push(Op {
                start,
                end,
                what,
                step,
            });
        }
    }
    pool.check_invariants()
        .unwrap_or_else(|m| panic!("after the workload: invariant: {m}"));
    history
}

impl Workload<'_> {
    /// Runs operation `i`, the kind `dice` picks; returns its name and what
    /// it did to the volume's sectors.
    fn op(&mut self, i: usize, dice: u64, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        match dice {
            // A write, or an overwrite of a range written before.
            0..=49 => {
                let over = dice >= 40 && !self.written.is_empty();
                self.write(i, over, rng)
            }
            // Trim: whole blocks inside the range read as zero.
            50..=57 => self.trim(i, rng),
            // Write zeroes (the whole range reads as zero).
            58..=61 => self.write_zeroes(i, rng),
            62..=75 => self.flush(i),
            // A FUA write: the write, then a flush, in one call.
            76..=81 => self.fua_write(i, rng),
            // Cleaning: relocates live blocks and checkpoints.
            82..=86 => self.clean(i, rng),
            87..=88 => self.checkpoint(i),
            // A read of the live pool, which must be exact.
            _ => self.read_live(i, rng),
        }
    }

    fn write(&mut self, i: usize, over: bool, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let (off, len) = if over {
            self.written[rng.below(self.written.len() as u64) as usize]
        } else {
            self.live.random_range(rng, 64 * 1024)
        };
        let tag = self.live.next_tag;
        self.live.next_tag += 1;
        let acked = match self.volume.write(off, &Live::data(tag, off, len)) {
            Ok(()) => true,
            Err(lograid::Error::NoSpace) => false,
            Err(e) => panic!("op {i}: write failed: {e}"),
        };
        let (first, n) = (sec(off), sec(len));
        let value = if acked { tag } else { u64::MAX };
        self.live.current[first..first + n].fill(value);
        self.stats.no_space += usize::from(!acked);
        if over {
            self.stats.overwrites += 1;
        } else {
            self.stats.writes += 1;
            self.written.push((off, len));
        }
        let step = Step::Write {
            first,
            n,
            tag,
            acked,
        };
        (if over { "overwrite" } else { "write" }, vec![step])
    }

    fn trim(&mut self, i: usize, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let (off, len) = self.live.random_range(rng, 256 * 1024);
        self.volume
            .trim(off, len)
            .unwrap_or_else(|e| panic!("op {i}: trim failed: {e}"));
        self.stats.trims += 1;
        let (a, b) = (off.div_ceil(4096) * 4096, (off + len) / 4096 * 4096);
        if a < b {
            self.live.current[sec(a)..sec(b)].fill(0);
            (
                "trim",
                vec![Step::Zero {
                    first: sec(a),
                    n: sec(b - a),
                }],
            )
        } else {
            ("trim", vec![])
        }
    }

    fn write_zeroes(&mut self, i: usize, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let (off, len) = self.live.random_range(rng, 64 * 1024);
        self.volume
            .write_zeroes(off, len, rng.below(2) == 0)
            .unwrap_or_else(|e| panic!("op {i}: write zeroes failed: {e}"));
        self.stats.zeroes += 1;
        self.live.current[sec(off)..sec(off + len)].fill(0);
        let step = Step::Zero {
            first: sec(off),
            n: sec(len),
        };
        ("write-zeroes", vec![step])
    }

    fn flush(&mut self, i: usize) -> (&'static str, Vec<Step>) {
        self.volume
            .flush()
            .unwrap_or_else(|e| panic!("op {i}: flush failed: {e}"));
        self.stats.flushes += 1;
        ("flush", vec![Step::Flush])
    }

    fn fua_write(&mut self, i: usize, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let (off, len) = self.live.random_range(rng, 16 * 1024);
        let tag = self.live.next_tag;
        self.live.next_tag += 1;
        let acked = match self.volume.write_fua(off, &Live::data(tag, off, len)) {
            Ok(()) => true,
            Err(lograid::Error::NoSpace) => false,
            Err(e) => panic!("op {i}: FUA write failed: {e}"),
        };
        let (first, n) = (sec(off), sec(len));
        self.live.current[first..first + n].fill(if acked { tag } else { u64::MAX });
        self.stats.fua += 1;
        self.stats.no_space += usize::from(!acked);
        let write = Step::Write {
            first,
            n,
            tag,
            acked,
        };
        // A failed FUA write did not flush.
        let steps = if acked {
            vec![write, Step::Flush]
        } else {
            vec![write]
        };
        ("fua-write", steps)
    }

    fn clean(&mut self, i: usize, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let freed = self
            .pool
            .clean(1 + rng.below(3) as usize)
            .unwrap_or_else(|e| panic!("op {i}: clean failed: {e}"));
        self.stats.cleans += 1;
        self.stats.segments_cleaned += freed;
        ("clean", vec![Step::Flush])
    }

    fn checkpoint(&mut self, i: usize) -> (&'static str, Vec<Step>) {
        self.pool
            .checkpoint()
            .unwrap_or_else(|e| panic!("op {i}: checkpoint failed: {e}"));
        self.stats.checkpoints += 1;
        ("checkpoint", vec![Step::Flush])
    }

    /// Reads a random range of the live pool and checks it exactly.
    fn read_live(&mut self, i: usize, rng: &mut SimRng) -> (&'static str, Vec<Step>) {
        let (off, len) = self.live.random_range(rng, 128 * 1024);
        let mut buf = vec![0u8; len as usize];
        self.volume
            .read(off, &mut buf)
            .unwrap_or_else(|e| panic!("op {i}: read failed: {e}"));
        for (j, bytes) in buf.chunks(SECTOR).enumerate() {
            let s = sec(off) + j;
            let want = self.live.current[s];
            let got = sector_tag(bytes, s as u64);
            if want != u64::MAX && got != Some(want) {
                panic!("op {i}: live read of sector {s}: got {got:?}, want write #{want}");
            }
        }
        self.stats.reads += 1;
        ("read", vec![])
    }
}

// ---------------------------------------------------------------------------
// Cut points.

/// A cut point: per member, how many of its records had happened.
type Cut = Vec<usize>;

/// Whether `a` happened no later than `b` on every member.
fn le(a: &[usize], b: &[usize]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y)
}

/// `prefix[k]`: the cut after the first `k` records of the global log.
fn prefixes(records: &[Record], members: usize) -> Vec<Cut> {
    let mut out = Vec::with_capacity(records.len() + 1);
    let mut cut = vec![0; members];
    out.push(cut.clone());
    for r in records {
        cut[r.member()] += 1;
        out.push(cut.clone());
    }
    out
}

fn cut_name(cut: &[usize]) -> String {
    cut.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------
// What the volume may hold at a cut point.

/// An op with its log positions as cuts.
struct OpAt<'a> {
    op: &'a Op,
    start: Cut,
    end: Cut,
}

/// The values each sector may hold after the last flush that completed
/// before a cut, kept up to date as cut points advance.
struct Expect<'a> {
    ops: Vec<OpAt<'a>>,
    /// Possible values per sector once the last applied flush returned
    /// (one value, or several after a failed write).
    durable: Vec<Vec<u64>>,
    /// Ops applied to `durable` (all of them up to a flush).
    applied: usize,
}

impl<'a> Expect<'a> {
    fn new(ops: &'a [Op], prefix: &[Cut], sectors: usize) -> Expect<'a> {
        Expect {
            ops: ops
                .iter()
                .map(|op| OpAt {
                    op,
                    start: prefix[op.start].clone(),
                    end: prefix[op.end].clone(),
                })
                .collect(),
            durable: vec![vec![0]; sectors],
            applied: 0,
        }
    }

    fn apply(state: &mut Vec<u64>, step: &Step) {
        match *step {
            Step::Write {
                tag, acked: true, ..
            } => {
                state.clear();
                state.push(tag);
            }
            Step::Write {
                tag, acked: false, ..
            } => state.push(tag),
            Step::Zero { .. } => {
                state.clear();
                state.push(0);
            }
            Step::Flush => {}
        }
    }

    fn range(step: &Step) -> std::ops::Range<usize> {
        match *step {
            Step::Write { first, n, .. } | Step::Zero { first, n } => first..first + n,
            Step::Flush => 0..0,
        }
    }

    /// Advances to `cut` (cuts come in log order): applies every op up to
    /// the last flush whose every record happened before the cut (that
    /// flush returned, so what it covers is durable).
    fn advance(&mut self, cut: &[usize]) {
        let last_flush = self
            .ops
            .iter()
            .rposition(|o| matches!(o.op.step, Step::Flush) && le(&o.end, cut));
        if let Some(f) = last_flush {
            while self.applied <= f {
                let step = &self.ops[self.applied].op.step;
                for s in Self::range(step) {
                    Self::apply(&mut self.durable[s], step);
                }
                self.applied += 1;
            }
        }
    }

    /// Ops after the last flush that had begun by `cut` (some member had
    /// received I/O issued after they started).
    fn begun(&self, cut: &[usize]) -> impl Iterator<Item = &OpAt<'a>> + '_ {
        let cut = cut.to_vec();
        self.ops[self.applied..]
            .iter()
            .take_while(move |o| !le(&cut, &o.start))
    }

    /// Values written after the last flush by ops that had begun by the
    /// cut: a power cut may have kept any of them.
    fn later(&self, cut: &[usize]) -> BTreeMap<usize, Vec<u64>> {
        let mut later: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for o in self.begun(cut) {
            let value = match o.op.step {
                Step::Write { tag, .. } => tag,
                Step::Zero { .. } => 0,
                Step::Flush => continue,
            };
            for s in Self::range(&o.op.step) {
                later.entry(s).or_default().push(value);
            }
        }
        later
    }

    /// Which op the cut fell in, for failure reports.
    fn during(&self, cut: &[usize]) -> String {
        self.ops
            .iter()
            .enumerate()
            .find(|(_, o)| !le(cut, &o.start) && !le(&o.end, cut))
            .map(|(i, o)| {
                format!(
                    "inside op {i} ({}, from {} to {})",
                    o.op.what,
                    cut_name(&o.start),
                    cut_name(&o.end)
                )
            })
            .unwrap_or_else(|| "between ops".into())
    }
}

// ---------------------------------------------------------------------------
// Member images at a cut point.

/// One of a member's own records.
#[derive(Clone, Copy)]
enum Event {
    /// A write or discard: the record's index in the global log.
    Change(usize),
    /// A flush, covering the member's first `covers` events.
    Flush { covers: usize },
}

/// Rebuilds the members' images from the log, kept up to date as cut points
/// advance: `base` holds, per member, every change its flushes have made
/// durable.
struct Images<'a> {
    records: &'a [Record],
    /// Per member: its records, in order.
    events: Vec<Vec<Event>>,
    /// Per member: `durable[n]`, how many of its events are durable once
    /// its first `n` have happened (the flushes among them cover them).
    durable: Vec<Vec<usize>>,
    base: Vec<Vec<u8>>,
    /// Per member: how many of its events are in `base`.
    applied: Vec<usize>,
    /// Over all cuts: unflushed writes and discards a power cut kept,
    /// dropped, and tore.
    kept: u64,
    dropped: u64,
    torn: u64,
}

/// What a power cut keeps of the writes not yet flushed.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// All of them, in order.
    All,
    /// Each with probability `quarters`/4, in a random order; with `tear`,
    /// one kept write per member lands only in part.
    Subset { quarters: u64, tear: bool },
}

impl<'a> Images<'a> {
    fn new(records: &'a [Record], prefix: &[Cut], members: usize) -> Images<'a> {
        let mut events = vec![Vec::new(); members];
        for (i, r) in records.iter().enumerate() {
            let m = r.member();
            events[m].push(match r {
                // `covers` counts global records: the member's own among them.
                Record::Flush { covers, .. } => Event::Flush {
                    covers: prefix[*covers][m],
                },
                _ => Event::Change(i),
            });
        }
        let durable = events
            .iter()
            .map(|ev| {
                let mut d = vec![0];
                for e in ev {
                    let best = *d.last().expect("non-empty");
                    d.push(match *e {
                        Event::Flush { covers } => best.max(covers),
                        Event::Change(_) => best,
                    });
                }
                d
            })
            .collect();
        Images {
            records,
            events,
            durable,
            base: vec![vec![0u8; MEMBER_BYTES as usize]; members],
            applied: vec![0; members],
            kept: 0,
            dropped: 0,
            torn: 0,
        }
    }

    /// The images a power cut at `cut` could leave.
    fn at(&mut self, cut: &[usize], keep: Keep, rng: &mut SimRng) -> Vec<Vec<u8>> {
        let mut images = Vec::with_capacity(self.base.len());
        for (m, &upto) in cut.iter().enumerate() {
            // What the member's completed flushes made durable.
            let mark = self.durable[m][upto];
            while self.applied[m] < mark {
                if let Event::Change(i) = self.events[m][self.applied[m]] {
                    self.records[i].apply(&mut self.base[m], None);
                }
                self.applied[m] += 1;
            }
            let mut image = self.base[m].clone();
            // What it received since, still in its volatile cache.
            let mut pending: Vec<usize> = self.events[m][self.applied[m]..upto]
                .iter()
                .filter_map(|e| match *e {
                    Event::Change(i) => Some(i),
                    Event::Flush { .. } => None,
                })
                .collect();
            let mut torn = None;
            if let Keep::Subset { quarters, tear } = keep {
                let before = pending.len() as u64;
                pending.retain(|_| rng.below(4) < quarters);
                self.dropped += before - pending.len() as u64;
                for i in (1..pending.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    pending.swap(i, j);
                }
                if tear && !pending.is_empty() {
                    torn = Some(rng.below(pending.len() as u64) as usize);
                    self.torn += 1;
                }
            }
            self.kept += pending.len() as u64;
            for (k, &i) in pending.iter().enumerate() {
                let r = &self.records[i];
                let keep_sectors =
                    (torn == Some(k)).then(|| rng.below(r.len() / SECTOR as u64) as usize);
                r.apply(&mut image, keep_sectors);
            }
            images.push(image);
        }
        images
    }
}

// ---------------------------------------------------------------------------
// Checking one cut point.

#[derive(Default, Debug)]
struct CheckStats {
    /// Sectors found holding a write issued after the last flush.
    unflushed_landed: u64,
    /// Sectors whose durable value was a write (not zero) and read back.
    flushed_written_sectors: u64,
    rows_replayed: u64,
    scrub_repaired: u64,
    scrub_unreadable_rows: u64,
    scrub_lost_unflushed: u64,
}

/// Reads the whole volume; blocks that cannot be read are named.
fn read_volume(volume: &Volume) -> (Vec<u8>, Vec<String>) {
    let size = volume.size_bytes() as usize;
    let mut data = vec![0u8; size];
    let mut errors = Vec::new();
    const CHUNK: usize = 256 * 1024;
    for (c, chunk) in data.chunks_mut(CHUNK).enumerate() {
        if volume.read((c * CHUNK) as u64, chunk).is_ok() {
            continue;
        }
        for (b, block) in chunk.chunks_mut(4096).enumerate() {
            let off = (c * CHUNK + b * 4096) as u64;
            if let Err(e) = volume.read(off, block) {
                errors.push(format!("read of the block at byte {off} failed: {e}"));
                block.fill(0xee); // matches no write
            }
        }
    }
    (data, errors)
}

/// Opens the pool from `images` and checks it: `durable` gives the values
/// each sector may hold from before the last completed flush, `later` those
/// written since by ops that had begun by the cut.
fn check_cut(
    images: Vec<Vec<u8>>,
    durable: &[Vec<u64>],
    later: &BTreeMap<usize, Vec<u64>>,
) -> Result<CheckStats, String> {
    let mut stats = CheckStats::default();
    let (pool, volume) = open_cut(images, durable, &mut stats)?;
    check_sectors(&volume, durable, later, &mut stats)?;
    check_scrub(&pool, durable, &mut stats)?;
    check_takes_a_write(&volume)?;
    Ok(stats)
}

/// Check 1: the pool opens from the images, with no manual repair, and
/// holds the volume at the size it was created with.
fn open_cut(
    images: Vec<Vec<u8>>,
    durable: &[Vec<u64>],
    stats: &mut CheckStats,
) -> Result<(lograid::Pool, Volume), String> {
    let members: Vec<Arc<dyn Member>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img)) as Arc<dyn Member>)
        .collect();
    let pool =
        open_members(members, test_options(), false).map_err(|e| format!("open failed: {e}"))?;
    stats.rows_replayed = pool.recovery_report().map_or(0, |r| r.rows_replayed);
    pool.check_invariants()
        .map_err(|m| format!("invariant after open: {m}"))?;
    let volume = pool
        .volume("vol")
        .map_err(|e| format!("volume 'vol' missing after open: {e}"))?;
    if volume.size_bytes() != (durable.len() * SECTOR) as u64 {
        return Err(format!(
            "volume size {} after open, created with {}",
            volume.size_bytes(),
            durable.len() * SECTOR
        ));
    }
    Ok((pool, volume))
}

/// Check 2: every sector reads back a value it may hold: the durable one (what
/// the last completed flush covered) or one written after that flush.
fn check_sectors(
    volume: &Volume,
    durable: &[Vec<u64>],
    later: &BTreeMap<usize, Vec<u64>>,
    stats: &mut CheckStats,
) -> Result<(), String> {
    let (data, read_errors) = read_volume(volume);
    let mut problems = read_errors;
    for (s, bytes) in data.chunks(SECTOR).enumerate() {
        let allowed = &durable[s];
        let tag = match sector_tag(bytes, s as u64) {
            Some(t) => t,
            None => {
                if bytes.iter().all(|&b| b == 0xee) {
                    continue; // an unreadable block, reported above
                }
                problems.push(format!(
                    "sector {s} (byte {}) holds bytes no write produced (flushed value: {allowed:?})",
                    s * SECTOR
                ));
                continue;
            }
        };
        if allowed.contains(&tag) {
            if tag != 0 {
                stats.flushed_written_sectors += 1;
            }
            continue;
        }
        if later.get(&s).is_some_and(|l| l.contains(&tag)) {
            stats.unflushed_landed += 1;
            continue;
        }
        problems.push(format!(
            "sector {s} (byte {}) holds write #{tag}; flushed value {allowed:?}, later writes {:?}{}",
            s * SECTOR,
            later.get(&s).cloned().unwrap_or_default(),
            if allowed.iter().all(|&v| v != 0) {
                " — a flushed write was lost"
            } else {
                " — a value no flush or later write explains"
            }
        ));
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(8);
        return Err(format!(
            "{n} bad sector(s)/block(s):\n    {}",
            problems.join("\n    ")
        ));
    }
    Ok(())
}

/// Check 3: a scrub (checking only) loses no block a flush covered.
fn check_scrub(
    pool: &lograid::Pool,
    durable: &[Vec<u64>],
    stats: &mut CheckStats,
) -> Result<(), String> {
    let report = pool
        .scrub(false, |_, _| true)
        .map_err(|e| format!("scrub failed: {e}"))?;
    if !report.complete {
        return Err("scrub did not complete".into());
    }
    stats.scrub_repaired = report.repaired_blocks;
    stats.scrub_unreadable_rows = report.unreadable_rows;
    for lost in &report.lost_blocks {
        if lost.volume != "vol" {
            return Err(format!("scrub: lost block in unknown volume {lost:?}"));
        }
        let first = (lost.offset / SECTOR as u64) as usize;
        let covered = (first..first + 4096 / SECTOR).any(|s| durable[s].iter().any(|&v| v != 0));
        if covered {
            return Err(format!(
                "scrub: the flushed block at byte {} is lost (report {report:?})",
                lost.offset
            ));
        }
        stats.scrub_lost_unflushed += 1;
    }
    pool.check_invariants()
        .map_err(|m| format!("invariant after scrub: {m}"))?;
    Ok(())
}

/// Check 4: the recovered pool works: a write, a flush, and it reads back.
fn check_takes_a_write(volume: &Volume) -> Result<(), String> {
    let probe: Vec<u8> = (0..4096).map(|i| (i % 251) as u8 + 1).collect();
    volume
        .write(0, &probe)
        .and_then(|_| volume.flush())
        .map_err(|e| format!("write + flush after recovery failed: {e}"))?;
    let mut back = vec![0u8; 4096];
    volume
        .read(0, &mut back)
        .map_err(|e| format!("read after recovery write failed: {e}"))?;
    if back != probe {
        return Err("a write after recovery did not read back".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// One shape: record, choose cut points, check them.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CutKind {
    Flush,
    Random,
}

impl CutKind {
    fn name(self) -> &'static str {
        match self {
            CutKind::Flush => "flush",
            CutKind::Random => "random",
        }
    }
}

/// The RNG of one cut, from the seed, the shape and the cut alone.
fn cut_rng(seed: u64, parity: u8, cut: &[usize], kind: CutKind) -> SimRng {
    let h = cut.iter().fold(
        mix(seed ^ (cut.len() as u64) << 8 ^ parity as u64),
        |h, &c| mix(h ^ c as u64),
    );
    SimRng(mix(h ^ kind as u64) | 1)
}

/// `LOGRAID_REPLAY_ONLY=<m>x<p>@<c0>,<c1>,...:<kind>`: `None` if unset,
/// `Some(None)` if it names another shape.
fn only_cut(members: usize, parity: u8) -> Option<Option<(Cut, CutKind)>> {
    let spec = std::env::var("LOGRAID_REPLAY_ONLY").ok()?;
    let usage = "LOGRAID_REPLAY_ONLY=<members>x<parity>@<c0>,<c1>,...:<flush|random>";
    let (shape, rest) = spec.split_once('@').expect(usage);
    if shape != format!("{members}x{parity}") {
        return Some(None);
    }
    let (cut, kind) = rest.split_once(':').unwrap_or((rest, "random"));
    let cut: Cut = cut.split(',').map(|c| c.parse().expect(usage)).collect();
    assert_eq!(cut.len(), members, "{usage}: one count per member");
    let kind = match kind {
        "flush" => CutKind::Flush,
        "random" => CutKind::Random,
        _ => panic!("{usage}"),
    };
    Some(Some((cut, kind)))
}

/// A fingerprint of each member's I/O sequence (kind, where, how much), to
/// tell whether a rerun with the same seed received the same I/O.
fn fingerprint(records: &[Record], prefix: &[Cut]) -> u64 {
    let mut per_member = vec![0u64; prefix[0].len()];
    for r in records {
        let (kind, at) = match r {
            Record::Write { offset, .. } => (1, *offset),
            Record::Flush { covers, member } => (2, prefix[*covers][*member] as u64),
            Record::Discard { offset, .. } => (3, *offset),
        };
        let h = &mut per_member[r.member()];
        *h = mix(*h ^ mix(kind << 56 ^ at) ^ r.len());
    }
    per_member.iter().fold(0, |h, &m| mix(h ^ m))
}

struct Failure {
    cut: Cut,
    kind: CutKind,
    keep: Keep,
    during: String,
    message: String,
}

/// A shape's run: its knobs (from the environment) and its name.
struct Knobs {
    seed: u64,
    cuts_wanted: usize,
    ops_wanted: usize,
    members: usize,
    parity: u8,
    shape: String,
}

/// What recording a shape's workload left: every member's I/O in one log,
/// the workload's operations placed in it, and the volume it ran on.
struct Recording {
    records: Vec<Record>,
    /// `prefix[k]`: the cut after the first `k` records.
    prefix: Vec<Cut>,
    ops: Vec<Op>,
    /// The first record of the workload (cut points start there).
    base: usize,
    /// The volume's size in bytes.
    size: u64,
    /// The volume's size as a fraction of usable capacity.
    fill: f64,
    /// The I/O fingerprint.
    print: u64,
}

fn replay_shape(members: usize, parity: u8) {
    let seed = env_num("LOGRAID_REPLAY_SEED", DEFAULT_SEED);
    let cuts_wanted = env_num("LOGRAID_REPLAY_CUTS", DEFAULT_CUTS as u64) as usize;
    let ops_wanted = env_num("LOGRAID_REPLAY_OPS", DEFAULT_OPS as u64) as usize;
    let only = only_cut(members, parity);
    if only == Some(None) {
        return; // another shape is being reproduced
    }
    let knobs = Knobs {
        seed,
        cuts_wanted,
        ops_wanted,
        members,
        parity,
        shape: format!("{members}x{parity}"),
    };
    let rec = record(&knobs);
    let boundaries = flush_boundaries(&rec);
    let cuts: Vec<(Cut, CutKind)> = match only {
        Some(Some(cut)) => vec![cut],
        _ => choose_cuts(&knobs, &rec, &boundaries),
    };
    let failures = check_cuts(&knobs, &rec, &cuts, boundaries.len());
    let shape = &knobs.shape;
    if let Some(f) = failures.first() {
        panic!(
            "crash replay {shape}, seed {seed:#x}: {} of {} cut points failed; first: cut {} \
             ({}, {:?}, {}): {}",
            failures.len(),
            cuts.len(),
            cut_name(&f.cut),
            f.kind.name(),
            f.keep,
            f.during,
            f.message
        );
    }
}

/// A pool on recording members, set up with its volume and checkpointed:
/// the pool, the volume, its size and the fill it was made with.
fn create_recorded_pool(knobs: &Knobs, log: &IoLog) -> (lograid::Pool, Volume, u64, f64) {
    let Knobs {
        members, parity, ..
    } = *knobs;
    let dyn_members: Vec<Arc<dyn Member>> = (0..members)
        .map(|i| {
            let sim: Arc<dyn Member> = Arc::new(SimMember::new(&format!("sim{i}"), MEMBER_BYTES));
            Arc::new(RecordingMember::new(i, sim, log.clone())) as Arc<dyn Member>
        })
        .collect();
    let opts = CreateOptions {
        name: "test".into(),
        parity,
        chunk_bytes: 16 * 1024,
        segment_bytes: Some(64 * 1024),
        force: true,
        initial_volume: None,
    };
    let pool = create_pool(dyn_members, &opts, test_options()).expect("create pool");
    let usable = pool.status().usable_bytes;
    let fill = env_num("LOGRAID_REPLAY_FILL", (FILL * 100.0) as u64) as f64 / 100.0;
    let size = ((usable as f64 * fill) as u64 / 4096).max(16) * 4096;
    let volume = pool.create_volume("vol", size).expect("create volume");
    pool.checkpoint().expect("checkpoint after setup");
    (pool, volume, size, fill)
}

/// Record: a pool on recording members, set up, then the workload, then
/// the power goes out.
fn record(knobs: &Knobs) -> Recording {
    let Knobs {
        seed,
        ops_wanted,
        members,
        parity,
        ref shape,
        ..
    } = *knobs;
    let started = Instant::now();
    let log = IoLog::new(LOG_LIMIT);
    let (pool, volume, size, fill) = create_recorded_pool(knobs, &log);
    // Cut points start here: before, the pool did not exist yet.
    let base = log.len();
    let mut rng = SimRng(mix(seed ^ ((members as u64) << 8 | parity as u64)) | 1);
    let mut wstats = WorkloadStats::default();
    let ops = run_workload(&volume, &pool, &log, &mut rng, ops_wanted, &mut wstats);
    // The power goes out: the pool is dropped without a close.
    drop(volume);
    drop(pool);
    assert!(
        !log.overflowed(),
        "the I/O log outgrew {LOG_LIMIT} bytes: raise LOG_LIMIT"
    );
    let records = log.take();
    let prefix = prefixes(&records, members);
    let data_bytes: u64 = records
        .iter()
        .map(|r| match r {
            Record::Write { bytes, .. } => bytes.len() as u64,
            _ => 0,
        })
        .sum();
    let print = fingerprint(&records, &prefix);
    eprintln!(
        "crash replay {shape}: seed {seed:#x} (LOGRAID_REPLAY_SEED), {ops_wanted} ops, {} records \
         ({} MiB written), I/O fingerprint {print:#018x}, recorded in {:.1?}",
        records.len(),
        data_bytes >> 20,
        started.elapsed()
    );
    eprintln!("crash replay {shape}: workload {wstats:?}");
    Recording {
        records,
        prefix,
        ops,
        base,
        size,
        fill,
        print,
    }
}

/// Flush boundaries, as global log positions: after each run of flush
/// records.
fn flush_boundaries(rec: &Recording) -> Vec<usize> {
    let records = &rec.records;
    (rec.base..records.len())
        .filter(|&i| {
            matches!(records[i], Record::Flush { .. })
                && !matches!(records.get(i + 1), Some(Record::Flush { .. }))
        })
        .map(|i| i + 1)
        .collect()
}

/// The cut points to check, in log order: up to half of them flush
/// boundaries (evenly spaced), the rest random points of the log.
fn choose_cuts(knobs: &Knobs, rec: &Recording, boundaries: &[usize]) -> Vec<(Cut, CutKind)> {
    let Knobs {
        seed,
        cuts_wanted,
        members,
        parity,
        ..
    } = *knobs;
    let (records, prefix, base) = (&rec.records, &rec.prefix, rec.base);
    let mut at: BTreeSet<(usize, CutKind)> = BTreeSet::new();
    let flush_budget = boundaries.len().min(cuts_wanted / 2);
    for k in 0..flush_budget {
        // Evenly spaced, the last boundary always included.
        let i = (k + 1) * boundaries.len() / flush_budget - 1;
        at.insert((boundaries[i], CutKind::Flush));
    }
    let span = records.len() - base + 1;
    let random_wanted = (cuts_wanted - flush_budget).min(span);
    let mut pick = SimRng(mix(seed ^ 0xc075 ^ (members as u64) << 8 ^ parity as u64) | 1);
    let mut random = 0;
    while random < random_wanted {
        if at.insert((base + pick.below(span as u64) as usize, CutKind::Random)) {
            random += 1;
        }
    }
    // In log order: images and model advance with the cuts.
    at.into_iter()
        .map(|(k, kind)| (prefix[k].clone(), kind))
        .collect()
}

impl CheckStats {
    fn add(&mut self, s: &CheckStats) {
        self.unflushed_landed += s.unflushed_landed;
        self.flushed_written_sectors += s.flushed_written_sectors;
        self.rows_replayed += s.rows_replayed;
        self.scrub_repaired += s.scrub_repaired;
        self.scrub_unreadable_rows += s.scrub_unreadable_rows;
        self.scrub_lost_unflushed += s.scrub_lost_unflushed;
    }
}

/// Checking a shape's cut points, in log order: the model and the images
/// advance with the cuts.
struct Checker<'a> {
    knobs: &'a Knobs,
    rec: &'a Recording,
    expect: Expect<'a>,
    images: Images<'a>,
    failures: Vec<Failure>,
    totals: CheckStats,
}

/// Checks every cut; prints what was checked; returns the failures.
fn check_cuts(
    knobs: &Knobs,
    rec: &Recording,
    cuts: &[(Cut, CutKind)],
    boundaries: usize,
) -> Vec<Failure> {
    let shape = &knobs.shape;
    let sectors = (rec.size / SECTOR as u64) as usize;
    let mut checker = Checker {
        knobs,
        rec,
        expect: Expect::new(&rec.ops, &rec.prefix, sectors),
        images: Images::new(&rec.records, &rec.prefix, knobs.members),
        failures: Vec::new(),
        totals: CheckStats::default(),
    };
    let (mut n_flush, mut n_random) = (0, 0);
    let checking = Instant::now();
    for (cut, kind) in cuts {
        checker.check(cut, *kind);
        match kind {
            CutKind::Flush => n_flush += 1,
            CutKind::Random => n_random += 1,
        }
    }
    let Checker {
        images,
        failures,
        totals,
        ..
    } = checker;
    eprintln!(
        "crash replay {shape}: checked {} cut points ({n_flush} flush boundaries of {}, \
         {n_random} random) in {:.1?}; unflushed writes kept {}, dropped {}, torn {}; \
         {totals:?}; {} failed",
        cuts.len(),
        boundaries,
        checking.elapsed(),
        images.kept,
        images.dropped,
        images.torn,
        failures.len()
    );
    failures
}

impl Checker<'_> {
    /// Checks one cut: the images a power cut there could leave, against
    /// what the model says the volume may hold.
    fn check(&mut self, cut: &Cut, kind: CutKind) {
        let mut crng = cut_rng(self.knobs.seed, self.knobs.parity, cut, kind);
        let keep = match kind {
            CutKind::Flush => Keep::All,
            CutKind::Random => Keep::Subset {
                quarters: crng.below(4),
                tear: crng.below(2) == 0,
            },
        };
        self.expect.advance(cut);
        let later = self.expect.later(cut);
        let member_images = self.images.at(cut, keep, &mut crng);
        match check_cut(member_images, &self.expect.durable, &later) {
            Ok(s) => self.totals.add(&s),
            Err(message) => self.failed(cut, kind, keep, message),
        }
    }

    /// Reports a failed cut, with the line that reproduces it.
    fn failed(&mut self, cut: &Cut, kind: CutKind, keep: Keep, message: String) {
        let Knobs {
            seed,
            ops_wanted,
            ref shape,
            ..
        } = *self.knobs;
        let (fill, print) = (self.rec.fill, self.rec.print);
        let during = self.expect.during(cut);
        eprintln!(
            "crash replay {shape}: FAILED at cut {} ({}, {keep:?}, {during}): {message}\n  \
             reproduce: LOGRAID_REPLAY_SEED={seed:#x} LOGRAID_REPLAY_OPS={ops_wanted} \
             LOGRAID_REPLAY_FILL={} LOGRAID_REPLAY_ONLY={shape}@{}:{} (I/O fingerprint {print:#018x})",
            cut_name(cut),
            kind.name(),
            (fill * 100.0).round(),
            cut_name(cut),
            kind.name()
        );
        self.failures.push(Failure {
            cut: cut.clone(),
            kind,
            keep,
            during,
            message,
        });
    }
}

#[test]
fn crash_replay_3_1() {
    replay_shape(3, 1);
}

#[test]
fn crash_replay_4_2() {
    replay_shape(4, 2);
}

#[test]
fn crash_replay_6_3() {
    replay_shape(6, 3);
}
