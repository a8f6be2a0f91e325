//! `serve --pool UUID [--wait-for-members SECONDS] CANDIDATE...`: finding a pool's drives by
//! the pool's UUID instead of by their names, which change (macOS numbers its disks in the
//! order they appear; an enclosure's disks may appear after boot).
//!
//! Owns: expanding the candidates (paths; a directory stands for its *.img files; `*` and `?`
//! in a path's last component match names in its directory, expanded again at each scan),
//! reading each candidate's superblock without locking it, keeping the drives of the pool
//! (one path per member: /dev/diskN and /dev/rdiskN are the same disk), deciding whether
//! enough of them are here (every member; after the wait, enough for the parity to cover the
//! rest), and saying what it waits for. Must never: write to a candidate, wait for a candidate
//! that does not answer (a disk image served by this very process, once it restarts, would
//! never answer; it is skipped after `PROBE_TIMEOUT` and not asked again until it answers),
//! or hold more than one probe per candidate.

use anyhow::{bail, Context, Result};
use clap::Args;
use lograid::device::{FileMember, OpenMode};
use lograid::format::superblock::Superblock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a candidate has to open and show its superblock.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the candidates are scanned again while waiting.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// While waiting, the state is logged when it changes and at least this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// Most candidates looked at (and probes outstanding) at once.
const MAX_CANDIDATES: usize = 1024;

#[derive(Args, Default)]
pub struct ScanArgs {
    /// Serve the pool with this UUID (`lograid status` shows it): the drives given are
    /// candidates (paths, directories of *.img files, or patterns with * and ? in the last
    /// component such as '/dev/rdisk*', quoted so that lograid expands them), and the pool's
    /// drives are those whose superblock names it, whatever their names.
    #[arg(long, value_name = "UUID")]
    pub pool: Option<String>,
    /// With --pool: wait up to SECONDS for every member to appear, scanning the candidates
    /// again every second; then serve degraded if the parity covers those still missing
    /// (unless --no-degraded), or else wait on until enough appear.
    #[arg(long, value_name = "SECONDS", requires = "pool")]
    pub wait_for_members: Option<u64>,
}

/// The drives to open the pool with: `drives` as given, or with `--pool` the candidates that
/// are members of that pool (waiting for them as asked).
pub fn drives_to_open(
    scan: &ScanArgs,
    drives: &[PathBuf],
    allow_degraded: bool,
) -> Result<Vec<PathBuf>> {
    let Some(uuid) = &scan.pool else {
        return Ok(drives.to_vec());
    };
    let uuid = parse_uuid(uuid)?;
    if drives.is_empty() {
        bail!("--pool needs the candidate drives (e.g. '/dev/rdisk*')");
    }
    let wait = scan.wait_for_members.map(Duration::from_secs);
    find_members(uuid, drives, wait, allow_degraded)
}

/// A pool UUID as `lograid status` prints it: 32 hex digits (dashes ignored).
pub fn parse_uuid(text: &str) -> Result<u128> {
    let digits: String = text.chars().filter(|c| *c != '-').collect();
    if digits.len() != 32 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("--pool {text}: expected the pool's UUID, 32 hex digits (`lograid status` shows it)");
    }
    u128::from_str_radix(&digits, 16).with_context(|| format!("--pool {text}"))
}

/// Scans until the pool can be opened (see the module's comment); its drives, one per member.
fn find_members(
    uuid: u128,
    candidates: &[PathBuf],
    wait: Option<Duration>,
    allow_degraded: bool,
) -> Result<Vec<PathBuf>> {
    let started = Instant::now();
    let mut prober = Prober::default();
    let mut reported: Option<(String, Instant)> = None;
    loop {
        let paths = expand_candidates(candidates)?;
        let found = prober.members_of(uuid, &paths);
        let waited_out = wait.is_none_or(|w| started.elapsed() >= w);
        let presence = Presence::of(&found);
        match presence.decide(waited_out, allow_degraded) {
            Decision::Open => {
                presence.log_found(uuid);
                return Ok(presence.paths());
            }
            Decision::Wait(why) if wait.is_none() => {
                bail!("pool {uuid:032x}: {why} (among {} candidates)", paths.len())
            }
            Decision::Wait(why) => {
                let due = reported
                    .as_ref()
                    .is_none_or(|(last, at)| *last != why || at.elapsed() >= REPORT_EVERY);
                if due {
                    tracing::warn!(
                        "pool {uuid:032x}: waiting for members: {why} ({} candidates, {:.0} s so far)",
                        paths.len(),
                        started.elapsed().as_secs_f64()
                    );
                    reported = Some((why, Instant::now()));
                }
                std::thread::sleep(SCAN_INTERVAL);
            }
        }
    }
}

/// The paths the candidates stand for now, each once, in order: a pattern's matches sorted.
pub fn expand_candidates(candidates: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for candidate in candidates {
        let name = candidate
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let expanded = if name.contains(['*', '?']) {
            let dir = candidate.parent().unwrap_or(Path::new("."));
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            matches_in(dir, &name)
        } else if candidate.is_dir() {
            matches_in(candidate, "*.img")
        } else {
            vec![candidate.clone()]
        };
        for path in expanded {
            if !out.contains(&path) {
                out.push(path);
            }
        }
        if out.len() > MAX_CANDIDATES {
            bail!("more than {MAX_CANDIDATES} candidate drives; name them more narrowly");
        }
    }
    Ok(out)
}

/// The entries of `dir` whose names match `pattern`, sorted (none if it cannot be read).
fn matches_in(dir: &Path, pattern: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| wildcard_match(pattern, name))
        .collect();
    names.sort();
    names.into_iter().map(|name| dir.join(name)).collect()
}

/// Whether `name` matches `pattern`: `*` any run of characters, `?` one; as a shell does, a
/// name starting with a dot matches only a pattern starting with one.
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    // Where the last `*` was, and the name position it has taken up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some('?') => {
                p += 1;
                n += 1;
            }
            Some(c) if *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// What reading a candidate showed.
enum Probe {
    Member(Box<Superblock>),
    NotAMember,
}

/// Reads candidates' superblocks on threads of their own, so that one that does not answer
/// holds up nothing; it is asked again only once it has answered.
#[derive(Default)]
struct Prober {
    pending: HashMap<PathBuf, Receiver<Probe>>,
}

impl Prober {
    /// The candidates among `paths` that hold a superblock of pool `uuid`, with it.
    fn members_of(&mut self, uuid: u128, paths: &[PathBuf]) -> Vec<(PathBuf, Superblock)> {
        for path in paths {
            if !self.pending.contains_key(path) && self.pending.len() < MAX_CANDIDATES {
                if let Some(receiver) = start_probe(path) {
                    self.pending.insert(path.clone(), receiver);
                }
            }
        }
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let mut found = Vec::new();
        for path in paths {
            let Some(receiver) = self.pending.get(path) else {
                continue;
            };
            match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(probe) => {
                    self.pending.remove(path);
                    if let Probe::Member(sb) = probe {
                        if sb.pool_uuid == uuid {
                            found.push((path.clone(), *sb));
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    tracing::debug!(
                        "{}: no answer within {PROBE_TIMEOUT:?}; skipped",
                        path.display()
                    );
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.pending.remove(path);
                }
            }
        }
        found
    }
}

/// Starts reading `path`'s superblock on a thread of its own.
fn start_probe(path: &Path) -> Option<Receiver<Probe>> {
    let (sender, receiver) = mpsc::channel();
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("lograid-probe".into())
        .spawn(move || {
            let probe = match FileMember::open(&path, OpenMode::Peek)
                .map_err(|e| e.to_string())
                .and_then(|member| lograid::read_superblock(&member).map_err(|e| e.to_string()))
            {
                Ok(sb) => Probe::Member(Box::new(sb)),
                Err(why) => {
                    tracing::trace!("{}: not a member: {why}", path.display());
                    Probe::NotAMember
                }
            };
            let _ = sender.send(probe);
        });
    match spawned {
        Ok(_) => Some(receiver),
        Err(e) => {
            tracing::debug!("cannot start a probe thread: {e}");
            None
        }
    }
}

/// Which members of a pool are here, by its newest superblock among them.
#[derive(Debug, PartialEq)]
struct Presence {
    /// One path per member present: (member index, path).
    present: Vec<(usize, PathBuf)>,
    /// Members that may hold rows and are not here: (index, member UUID).
    missing: Vec<(usize, u128)>,
    parity: usize,
    pool_name: String,
}

/// What to do after a scan.
#[derive(Debug, PartialEq)]
enum Decision {
    Open,
    /// Not yet, and why.
    Wait(String),
}

impl Presence {
    fn of(found: &[(PathBuf, Superblock)]) -> Presence {
        let Some(newest) = found
            .iter()
            .map(|(_, sb)| sb)
            .max_by_key(|sb| sb.generation)
        else {
            return Presence {
                present: Vec::new(),
                missing: Vec::new(),
                parity: 0,
                pool_name: String::new(),
            };
        };
        let mut present: Vec<(usize, PathBuf)> = Vec::new();
        for (path, sb) in found {
            let Some(member_uuid) = sb.members.get(usize::from(sb.member_index)).map(|m| m.uuid)
            else {
                continue;
            };
            let Some(index) = newest.members.iter().position(|m| m.uuid == member_uuid) else {
                continue;
            };
            if !present.iter().any(|(i, _)| *i == index) {
                present.push((index, path.clone()));
            }
        }
        present.sort();
        let missing = newest
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| m.state.may_hold_rows() && !present.iter().any(|(p, _)| p == i))
            .map(|(i, m)| (i, m.uuid))
            .collect();
        Presence {
            present,
            missing,
            parity: usize::from(newest.parity),
            pool_name: newest.pool_name.clone(),
        }
    }

    fn decide(&self, waited_out: bool, allow_degraded: bool) -> Decision {
        if self.present.is_empty() {
            return Decision::Wait("no member of the pool found".into());
        }
        if self.missing.is_empty() {
            return Decision::Open;
        }
        let covered = self.missing.len() <= self.parity;
        if covered && allow_degraded && waited_out {
            return Decision::Open;
        }
        let missing: Vec<String> = self
            .missing
            .iter()
            .map(|(i, uuid)| format!("member {i} ({uuid:032x})"))
            .collect();
        Decision::Wait(format!(
            "pool '{}': {} of {} members found; missing {}{}",
            self.pool_name,
            self.present.len(),
            self.present.len() + self.missing.len(),
            missing.join(", "),
            if covered && allow_degraded {
                ""
            } else if covered {
                " (--no-degraded: all are needed)"
            } else {
                " (more than the parity covers)"
            }
        ))
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.present.iter().map(|(_, path)| path.clone()).collect()
    }

    fn log_found(&self, uuid: u128) {
        let found: Vec<String> = self
            .present
            .iter()
            .map(|(i, path)| format!("member {i} at {}", path.display()))
            .collect();
        tracing::info!(
            "pool {uuid:032x} ('{}'): {}",
            self.pool_name,
            found.join(", ")
        );
        if !self.missing.is_empty() {
            let missing: Vec<String> = self.missing.iter().map(|(i, _)| i.to_string()).collect();
            tracing::warn!(
                "pool '{}': members {} did not appear; serving degraded",
                self.pool_name,
                missing.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lograid::format::superblock::{CheckpointPointer, MemberRecord, MemberState};

    #[test]
    fn wildcards_match_as_a_shell_does() {
        assert!(wildcard_match("rdisk*", "rdisk4"));
        assert!(wildcard_match("rdisk*", "rdisk"));
        assert!(wildcard_match("rdisk?", "rdisk4"));
        assert!(!wildcard_match("rdisk?", "rdisk14"));
        assert!(wildcard_match("*.img", "m0.img"));
        assert!(!wildcard_match("*.img", "m0.img.bak"));
        assert!(wildcard_match("a*b*c", "axxbyyc"));
        assert!(wildcard_match("a*b*c", "abcbc"));
        assert!(!wildcard_match("a*b*c", "acb"));
        assert!(wildcard_match("*", "x"));
        assert!(!wildcard_match("*", ".hidden"));
        assert!(wildcard_match(".*", ".hidden"));
        assert!(!wildcard_match("disk", "disk4"));
        // No blow-up on many stars.
        assert!(!wildcard_match(&"*a".repeat(30), &"a".repeat(29)));
    }

    #[test]
    fn a_pool_uuid_reads_as_status_prints_it() {
        let uuid = 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef_u128;
        assert_eq!(parse_uuid(&format!("{uuid:032x}")).unwrap(), uuid);
        assert_eq!(
            parse_uuid("01234567-89ab-cdef-0123-456789ABCDEF").unwrap(),
            uuid
        );
        for bad in ["", "xyz", "0123", &"g".repeat(32), &"0".repeat(33)] {
            assert!(parse_uuid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn candidates_expand_to_paths_each_once() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["disk2", "disk10", "disk1s1", ".disk9", "rdisk2", "m.img"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let d = dir.path();
        let expanded = expand_candidates(&[
            d.join("disk*"),
            d.join("disk2"),
            d.join("absent"),
            d.to_path_buf(),
            d.join("nothing-matches-*"),
        ])
        .unwrap();
        assert_eq!(
            expanded,
            [
                d.join("disk10"),
                d.join("disk1s1"),
                d.join("disk2"),
                d.join("absent"),
                d.join("m.img")
            ]
        );
        assert!(expand_candidates(&[d.join("no-such-dir/*")])
            .unwrap()
            .is_empty());
    }

    fn superblock(uuids: &[u128], index: u8, generation: u64, parity: u8) -> Superblock {
        Superblock {
            pool_uuid: 7,
            pool_name: "tank".into(),
            created_unix: 0,
            member_index: index,
            generation,
            parity,
            chunk_blocks: 16,
            segment_blocks: 1024,
            data_start_block: 4,
            members: uuids
                .iter()
                .map(|&uuid| MemberRecord {
                    uuid,
                    size_blocks: 1 << 20,
                    state: MemberState::Active,
                })
                .collect(),
            checkpoint: CheckpointPointer::default(),
        }
    }

    #[test]
    fn the_pool_opens_with_every_member_or_after_the_wait_with_enough() {
        let members = [11, 12, 13];
        let at = |name: &str, index: u8| (PathBuf::from(name), superblock(&members, index, 5, 1));
        // All three, one of them under two names: one path each, in member order.
        let all = Presence::of(&[
            at("/dev/disk9", 2),
            at("/dev/rdisk4", 0),
            at("/dev/disk4", 0),
            at("/dev/rdisk7", 1),
        ]);
        assert_eq!(
            all.paths(),
            [
                PathBuf::from("/dev/rdisk4"),
                "/dev/rdisk7".into(),
                "/dev/disk9".into()
            ]
        );
        assert_eq!(all.decide(false, true), Decision::Open);
        // Two of three, parity 1: waits until the wait is over, then opens (degraded).
        let two = Presence::of(&[at("/a", 0), at("/c", 2)]);
        assert_eq!(two.missing, [(1, 12)]);
        let Decision::Wait(why) = two.decide(false, true) else {
            panic!("opened before the wait was over")
        };
        assert!(
            why.contains("2 of 3 members found; missing member 1"),
            "{why}"
        );
        assert_eq!(two.decide(true, true), Decision::Open);
        // ... unless degraded is refused.
        let Decision::Wait(why) = two.decide(true, false) else {
            panic!("opened degraded with --no-degraded")
        };
        assert!(why.contains("--no-degraded"), "{why}");
        // One of three: more than the parity covers; waits however long it waited.
        let one = Presence::of(&[at("/a", 0)]);
        let Decision::Wait(why) = one.decide(true, true) else {
            panic!("opened with too few members")
        };
        assert!(why.contains("more than the parity covers"), "{why}");
        // None.
        assert!(matches!(
            Presence::of(&[]).decide(true, true),
            Decision::Wait(_)
        ));
    }

    #[test]
    fn the_newest_superblock_says_who_the_members_are() {
        // Member 1 was replaced (generation 6: uuid 14 in slot 1); the old drive (generation
        // 5, uuid 12) is not one of them, and a removed member is not waited for.
        let mut newest = superblock(&[11, 14, 13], 0, 6, 1);
        newest.members[2].state = MemberState::Removed;
        let old = superblock(&[11, 12, 13], 1, 5, 1);
        let presence = Presence::of(&[("/new0".into(), newest), ("/old1".into(), old)]);
        assert_eq!(presence.paths(), [PathBuf::from("/new0")]);
        assert_eq!(presence.missing, [(1, 14)]);
    }
}
