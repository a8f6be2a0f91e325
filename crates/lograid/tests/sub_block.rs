//! Sub-block writes (512-byte granularity inside 4 KiB blocks), which the
//! pool holds in memory as overlays until they are merged into their blocks
//! (in the background, by a writer that finds the table full, by every
//! flush, FUA write, checkpoint and clean close):
//! - a random mix of sub-block and whole-block writes, trims, zeroes, reads,
//!   flushes, FUA writes, checkpoints, cleaning and crashes, checked byte
//!   for byte against a model after every read (block status too), with
//!   tables of a few overlays (writers merge all the time), with the
//!   background resolver, and with the default table;
//! - threads writing disjoint sectors of shared blocks (every read exact),
//!   and threads writing overlapping ranges (every read returns, per
//!   sector, a write that was current at some instant of the read);
//! - durability: flushed (or FUA, or checkpointed) sub-block writes survive
//!   a power cut that drops everything unflushed; unflushed ones survive a
//!   clean close;
//! - space: a full pool refuses a sub-block write to a block it does not
//!   store at write time (not at the flush), the blocks overlays will need
//!   are reserved, and overwrites of stored blocks still work;
//! - errors: an old block unreadable beyond parity fails the flush (the
//!   write stays, and fails the flush again) until the block is rewritten.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;
#[path = "common/corrupt.rs"]
mod corrupt;

use common::{sector_pattern, sector_tag, test_options, Model, SimPool, SECTOR};
use lograid::device::{CrashMode, Hold, SimRng};
use lograid::format::BLOCK_SIZE;
use lograid::{Allocation, Error, PoolOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BS: u64 = BLOCK_SIZE as u64;
const SECTORS_PER_BLOCK: u64 = BS / SECTOR as u64;

fn options(max_overlays: usize, background: bool) -> PoolOptions {
    PoolOptions {
        max_overlays,
        background_resolver: background,
        ..test_options()
    }
}

/// A random range inside one block that does not cover all of it.
fn sub_block_range(rng: &mut SimRng, blocks: u64) -> (u64, u64) {
    let block = rng.below(blocks);
    let first = rng.below(SECTORS_PER_BLOCK);
    let n = 1 + rng.below(SECTORS_PER_BLOCK - first);
    let n = if first == 0 && n == SECTORS_PER_BLOCK {
        7
    } else {
        n
    };
    (block * BS + first * SECTOR as u64, n * SECTOR as u64)
}

/// Checks block status over a range read: a block the model holds
/// written data in must be reported allocated (data).
fn check_block_status(pool: &SimPool, model: &Model, off: u64, len: u64, what: &str) {
    let first = off / BS;
    let last = (off + len).div_ceil(BS);
    let status = pool
        .volume()
        .block_status(first * BS, (last - first) * BS)
        .unwrap_or_else(|e| panic!("{what}: block status: {e}"));
    let mut at = first * BS;
    for (run, state) in status {
        let mut b = at / BS;
        while b * BS < at + run {
            let s = (b * SECTORS_PER_BLOCK) as usize;
            let written = model.current[s..s + SECTORS_PER_BLOCK as usize]
                .iter()
                .any(|&t| t != 0 && t != u64::MAX);
            assert!(
                !written || state == Allocation::Data,
                "{what}: block {b} holds written data but block status says {state:?}"
            );
            b += 1;
        }
        at += run;
    }
}

/// A model run: the pool, the model it is checked against, and the counts
/// it reports.
struct ModelRun {
    what: String,
    rng: SimRng,
    pool: SimPool,
    model: Model,
    /// Blocks of the volume.
    blocks: u64,
    /// Sub-block writes, reads, flushes, crashes.
    stats: [usize; 4],
    /// Overlays merged by the pools that crashed since the start.
    merged: u64,
}

fn model_run(seed: u64, options: PoolOptions, ops: usize) {
    let what = format!(
        "seed {seed} (max_overlays {}, background {})",
        options.max_overlays, options.background_resolver
    );
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options);
    let mut run = ModelRun {
        what,
        rng: SimRng(seed),
        model: Model::new(pool.volume_size()),
        blocks: pool.volume_size() / BS,
        pool,
        stats: [0; 4],
        merged: 0,
    };
    for op in 0..ops {
        run = run.op(op);
    }
    run.finish();
}

impl ModelRun {
    /// Checks the invariants, then runs operation `op`, of the kind the
    /// dice pick (a crash reopens the pool: the run is passed on).
    fn op(mut self, op: usize) -> ModelRun {
        let what = &self.what;
        self.pool
            .pool()
            .check_invariants()
            .unwrap_or_else(|m| panic!("{what} before op {op}: invariant: {m}"));
        let blocks = self.blocks;
        match self.rng.below(100) {
            // Inside one block, anywhere in the volume.
            0..=29 => {
                let (off, len) = sub_block_range(&mut self.rng, blocks);
                self.write(off, len, false, op);
                self.stats[0] += 1;
            }
            // Inside one of a few hot blocks: writes merge into one overlay
            // and complete it.
            30..=39 => {
                let (off, len) = sub_block_range(&mut self.rng, 6);
                self.write(off, len, false, op);
                self.stats[0] += 1;
            }
            // 512-byte or 4 KiB granular, across blocks.
            40..=54 => {
                let (off, len) = self.model.random_range(&mut self.rng, 32 * 1024);
                self.write(off, len, false, op);
            }
            55..=69 => self.read_and_check(op),
            70..=74 => self.trim(op),
            75..=79 => self.write_zeroes(op),
            80..=84 => self.flush(op),
            85..=87 => {
                let (off, len) = sub_block_range(&mut self.rng, blocks);
                self.write(off, len, true, op);
            }
            88..=91 => {
                // A burst of sub-block writes: the table fills up.
                for _ in 0..8 {
                    let (off, len) = sub_block_range(&mut self.rng, blocks);
                    self.write(off, len, false, op);
                    self.stats[0] += 1;
                }
            }
            92 => self.checkpoint(op),
            93 => self.clean(op),
            94 => return self.crash(op),
            _ => {
                // A whole block, aligned.
                let off = self.rng.below(blocks) * BS;
                let len = ((1 + self.rng.below(4)) * BS).min(blocks * BS - off);
                self.write(off, len, false, op);
            }
        }
        self
    }

    /// A write (FUA if `fua`) of data the model makes up.
    fn write(&mut self, off: u64, len: u64, fua: bool, op: usize) {
        let (pool, model, what) = (&self.pool, &mut self.model, &self.what);
        let data = model.write(off, len);
        let r = if fua {
            pool.volume().write_fua(off, &data)
        } else {
            pool.volume().write(off, &data)
        };
        match r {
            Ok(()) if fua => model.flushed(),
            Ok(()) => {}
            Err(Error::NoSpace) => model.forget_last_write(),
            Err(e) => panic!("{what} op {op}: write {off}+{len}: {e}"),
        }
    }

    /// A read, checked against the model, and the block status over it.
    fn read_and_check(&mut self, op: usize) {
        let (pool, model, what) = (&self.pool, &mut self.model, &self.what);
        let (off, len) = model.random_range(&mut self.rng, 64 * 1024);
        let mut buf = vec![0u8; len as usize];
        pool.volume()
            .read(off, &mut buf)
            .unwrap_or_else(|e| panic!("{what} op {op}: read: {e}"));
        model
            .check_exact(off, &buf)
            .unwrap_or_else(|m| panic!("{what} op {op}: read {off}+{len}: {m}"));
        check_block_status(pool, model, off, len, &format!("{what} op {op}"));
        self.stats[1] += 1;
    }

    fn trim(&mut self, op: usize) {
        let (pool, model, what) = (&self.pool, &mut self.model, &self.what);
        let (off, len) = model.random_range(&mut self.rng, 64 * 1024);
        pool.volume()
            .trim(off, len)
            .unwrap_or_else(|e| panic!("{what} op {op}: trim: {e}"));
        model.trim(off, len);
    }

    /// Write-zeroes inside one block or across blocks.
    fn write_zeroes(&mut self, op: usize) {
        let (pool, model, what, rng) = (&self.pool, &mut self.model, &self.what, &mut self.rng);
        let (off, len) = if rng.below(2) == 0 {
            sub_block_range(rng, self.blocks)
        } else {
            model.random_range(rng, 32 * 1024)
        };
        pool.volume()
            .write_zeroes(off, len, rng.below(2) == 0)
            .unwrap_or_else(|e| panic!("{what} op {op}: zero: {e}"));
        model.zero(off, len);
    }

    fn flush(&mut self, op: usize) {
        let what = &self.what;
        self.pool
            .volume()
            .flush()
            .unwrap_or_else(|e| panic!("{what} op {op}: flush: {e}"));
        self.model.flushed();
        self.stats[2] += 1;
    }

    fn checkpoint(&mut self, op: usize) {
        let what = &self.what;
        self.pool
            .pool()
            .checkpoint()
            .unwrap_or_else(|e| panic!("{what} op {op}: checkpoint: {e}"));
        self.model.flushed();
    }

    fn clean(&mut self, op: usize) {
        let what = &self.what;
        self.pool
            .pool()
            .clean(1)
            .unwrap_or_else(|e| panic!("{what} op {op}: clean: {e}"));
        self.model.flushed();
    }

    /// A crash of a random kind; the pool reopens and holds what the model
    /// allows.
    fn crash(mut self, op: usize) -> ModelRun {
        let what = &self.what;
        self.merged += self.pool.pool().status().overlays_merged;
        let mode = match self.rng.below(4) {
            0 => CrashMode::DropAll,
            1 => CrashMode::KeepRandomSubset,
            2 => CrashMode::TearOne,
            _ => CrashMode::KeepAll,
        };
        let pool = self
            .pool
            .crash(mode, &mut self.rng)
            .unwrap_or_else(|e| panic!("{what} op {op}: reopen after {mode:?}: {e}"));
        let all = pool
            .read_all()
            .unwrap_or_else(|e| panic!("{what} op {op}: read after crash: {e}"));
        self.model
            .after_crash(&all)
            .unwrap_or_else(|m| panic!("{what} op {op}: after {mode:?} crash: {m}"));
        self.stats[3] += 1;
        ModelRun { pool, ..self }
    }

    /// Reports the counts; after a clean close and reopen the volume holds
    /// exactly what the model does.
    fn finish(self) {
        let ModelRun {
            what,
            pool,
            mut model,
            stats,
            merged,
            ..
        } = self;
        eprintln!(
            "{what}: {} sub-block writes, {} reads, {} flushes, {} crashes; {} overlays merged",
            stats[0],
            stats[1],
            stats[2],
            stats[3],
            merged + pool.pool().status().overlays_merged
        );
        let pool = pool
            .reopen_clean()
            .unwrap_or_else(|e| panic!("{what}: clean reopen: {e}"));
        let all = pool.read_all().expect("read all");
        model.flushed();
        model
            .check_exact(0, &all)
            .unwrap_or_else(|m| panic!("{what}: after a clean reopen: {m}"));
    }
}

#[test]
fn model_with_a_tiny_overlay_table() {
    for seed in 1..=4 {
        model_run(seed, options(4, false), 3000);
    }
}

#[test]
fn model_with_the_background_resolver() {
    for seed in 11..=13 {
        model_run(seed, options(16, true), 3000);
    }
}

#[test]
fn model_with_the_default_table() {
    for seed in 21..=23 {
        model_run(seed, options(4096, false), 3000);
    }
}

/// Each thread owns two sectors of every block of a small area: all
/// threads write into the same blocks (the same overlays, which they
/// complete in turn) but never the same sector, so every read is exact.
#[test]
fn threads_writing_disjoint_sectors_of_shared_blocks() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(8, true));
    let vol = pool.volume().clone();
    let blocks = 6u64;
    let threads = 4u64;
    let owned = |t: u64, s: u64| (s % SECTORS_PER_BLOCK) / 2 == t;
    let finals: Vec<Vec<(u64, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let vol = vol.clone();
                scope.spawn(move || {
                    let mut rng = SimRng(100 + t);
                    let mut mine = vec![0u64; (blocks * SECTORS_PER_BLOCK) as usize];
                    for i in 0..3000u64 {
                        let b = rng.below(blocks);
                        // One or both of its sectors of block b.
                        let first = b * SECTORS_PER_BLOCK + 2 * t + rng.below(2);
                        let n = if first.is_multiple_of(2) {
                            1 + rng.below(2)
                        } else {
                            1
                        };
                        match rng.below(10) {
                            0..=5 => {
                                let tag = ((t + 1) << 32) | (i + 1);
                                let mut data = vec![0u8; (n as usize) * SECTOR];
                                for (j, c) in data.chunks_mut(SECTOR).enumerate() {
                                    sector_pattern(tag, first + j as u64, c);
                                }
                                vol.write(first * SECTOR as u64, &data)
                                    .unwrap_or_else(|e| panic!("thread {t} op {i}: write: {e}"));
                                for s in first..first + n {
                                    mine[s as usize] = tag;
                                }
                            }
                            6..=8 => {
                                let mut buf = vec![0u8; BLOCK_SIZE];
                                vol.read(b * BS, &mut buf)
                                    .unwrap_or_else(|e| panic!("thread {t} op {i}: read: {e}"));
                                for (j, c) in buf.chunks(SECTOR).enumerate() {
                                    let s = b * SECTORS_PER_BLOCK + j as u64;
                                    if !owned(t, s) {
                                        continue;
                                    }
                                    assert_eq!(
                                        sector_tag(c, s),
                                        Some(mine[s as usize]),
                                        "thread {t} op {i}: sector {s} of its own"
                                    );
                                }
                            }
                            _ => vol
                                .flush()
                                .unwrap_or_else(|e| panic!("thread {t} op {i}: flush: {e}")),
                        }
                    }
                    mine.iter()
                        .enumerate()
                        .filter(|(s, _)| owned(t, *s as u64))
                        .map(|(s, &tag)| (s as u64, tag))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pool.pool().check_invariants().expect("invariants");
    let merged = pool.pool().status().overlays_merged;
    assert!(
        merged > 0,
        "no overlay was ever merged: the test shows nothing"
    );
    let check = |pool: &SimPool, when: &str| {
        let mut buf = vec![0u8; (blocks * BS) as usize];
        pool.volume().read(0, &mut buf).expect("read back");
        for (s, tag) in finals.iter().flatten() {
            let at = *s as usize * SECTOR;
            assert_eq!(
                sector_tag(&buf[at..at + SECTOR], *s),
                Some(*tag),
                "{when}: sector {s}"
            );
        }
    };
    check(&pool, "after the threads");
    let pool = pool.reopen_clean().expect("clean reopen");
    check(&pool, "after a clean reopen");
}

/// One write to a sector: its tag and when it ran (ticks of a shared clock).
#[derive(Clone, Copy)]
struct Span {
    tag: u64,
    start: u64,
    end: u64,
}

/// Threads write overlapping random ranges (mostly sub-block) over a few
/// blocks and read them. Each sector read must hold a write that was
/// current at some instant of the read: one that had begun before the read
/// ended and that no write begun after it ended had replaced before the
/// read began. At the end, after a flush and a clean reopen, each sector
/// holds a write that no later write (begun after it ended) replaced.
#[test]
fn threads_writing_overlapping_ranges_read_consistent_values() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(6, true));
    let vol = pool.volume().clone();
    let blocks = 12u64;
    let sectors = (blocks * SECTORS_PER_BLOCK) as usize;
    let clock = AtomicU64::new(1);
    let history: Mutex<Vec<Vec<Span>>> = Mutex::new(vec![
        vec![Span {
            tag: 0,
            start: 0,
            end: 0
        }];
        sectors
    ]);
    #[allow(clippy::type_complexity)]
    let reads: Mutex<Vec<(u64, Vec<u8>, u64, u64)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (vol, clock, history, reads) = (vol.clone(), &clock, &history, &reads);
            scope.spawn(move || {
                let mut rng = SimRng(200 + t);
                for i in 0..1200u64 {
                    let first = rng.below(sectors as u64);
                    let longest = if rng.below(4) == 0 { 24 } else { 6 };
                    let n = (1 + rng.below(longest)).min(sectors as u64 - first);
                    match rng.below(10) {
                        0..=5 => {
                            let tag = ((t + 1) << 32) | (i + 1);
                            let mut data = vec![0u8; n as usize * SECTOR];
                            for (j, c) in data.chunks_mut(SECTOR).enumerate() {
                                sector_pattern(tag, first + j as u64, c);
                            }
                            let start = clock.fetch_add(1, Ordering::SeqCst);
                            vol.write(first * SECTOR as u64, &data)
                                .unwrap_or_else(|e| panic!("thread {t} op {i}: write: {e}"));
                            let end = clock.fetch_add(1, Ordering::SeqCst);
                            let mut h = history.lock().unwrap();
                            for s in first..first + n {
                                h[s as usize].push(Span { tag, start, end });
                            }
                        }
                        6..=8 => {
                            let mut buf = vec![0u8; n as usize * SECTOR];
                            let start = clock.fetch_add(1, Ordering::SeqCst);
                            vol.read(first * SECTOR as u64, &mut buf)
                                .unwrap_or_else(|e| panic!("thread {t} op {i}: read: {e}"));
                            let end = clock.fetch_add(1, Ordering::SeqCst);
                            reads.lock().unwrap().push((first, buf, start, end));
                        }
                        _ => vol
                            .flush()
                            .unwrap_or_else(|e| panic!("thread {t} op {i}: flush: {e}")),
                    }
                }
            });
        }
    });
    let history = history.into_inner().unwrap();
    let reads = reads.into_inner().unwrap();
    let mut checked = 0;
    for (first, buf, start, end) in &reads {
        for (j, c) in buf.chunks(SECTOR).enumerate() {
            let s = *first as usize + j;
            let tag = sector_tag(c, s as u64)
                .unwrap_or_else(|| panic!("sector {s} holds bytes no write produced"));
            let h = &history[s];
            let ok = h
                .iter()
                .filter(|w| w.tag == tag)
                .any(|w| w.start < *end && !h.iter().any(|w2| w2.start > w.end && w2.end < *start));
            assert!(
                ok,
                "read [{start}, {end}] of sector {s} returned write {tag:#x}, not current at any instant of the read"
            );
            checked += 1;
        }
    }
    assert!(checked > 1000, "too few sectors read: {checked}");
    vol.flush().expect("flush");
    pool.pool().check_invariants().expect("invariants");
    let pool = pool.reopen_clean().expect("clean reopen");
    let mut buf = vec![0u8; sectors * SECTOR];
    pool.volume().read(0, &mut buf).expect("read back");
    for (s, c) in buf.chunks(SECTOR).enumerate() {
        let tag = sector_tag(c, s as u64).expect("a pattern we wrote");
        let h = &history[s];
        let ok = h
            .iter()
            .filter(|w| w.tag == tag)
            .any(|w| !h.iter().any(|w2| w2.start > w.end));
        assert!(
            ok,
            "sector {s} ended with write {tag:#x}, which a later write replaced"
        );
    }
}

/// Random sub-block writes over `blocks` blocks (some blocks written many
/// times), recorded in the model.
fn sub_block_writes(pool: &SimPool, model: &mut Model, rng: &mut SimRng, n: usize, blocks: u64) {
    for _ in 0..n {
        let (off, len) = sub_block_range(rng, blocks);
        let data = model.write(off, len);
        pool.volume().write(off, &data).expect("sub-block write");
    }
}

/// Reads the whole volume: it must be exactly the model.
fn check_all(pool: &SimPool, model: &mut Model, what: &str) {
    let all = pool
        .read_all()
        .unwrap_or_else(|e| panic!("{what}: read: {e}"));
    model
        .check_exact(0, &all)
        .unwrap_or_else(|m| panic!("{what}: {m}"));
}

#[test]
fn flushed_sub_block_writes_survive_a_power_cut() {
    let mut rng = SimRng(31);
    for (max_overlays, background) in [(8, false), (4096, false), (32, true)] {
        let what = format!("max_overlays {max_overlays}, background {background}");
        let mut pool =
            SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(max_overlays, background));
        let mut model = Model::new(pool.volume_size());
        let blocks = pool.volume_size() / BS;
        // Over stored and unstored blocks.
        let stored = model.write(0, 64 * BS);
        pool.volume().write(0, &stored).unwrap();
        sub_block_writes(&pool, &mut model, &mut rng, 600, blocks.min(300));
        pool.volume().flush().expect("flush");
        model.flushed();
        let held = pool.pool().status().overlay_blocks;
        assert_eq!(held, 0, "{what}: {held} overlays left after a flush");
        pool = pool.crash(CrashMode::DropAll, &mut rng).expect("reopen");
        check_all(
            &pool,
            &mut model,
            &format!("{what}: flushed, then a power cut"),
        );

        // Unflushed: a power cut that drops everything unflushed leaves
        // the flushed values.
        sub_block_writes(&pool, &mut model, &mut rng, 300, blocks.min(300));
        pool = pool.crash(CrashMode::DropAll, &mut rng).expect("reopen");
        let all = pool.read_all().expect("read");
        model
            .after_crash(&all)
            .unwrap_or_else(|m| panic!("{what}: unflushed, then a power cut: {m}"));

        // A FUA write makes itself and every write before it durable.
        sub_block_writes(&pool, &mut model, &mut rng, 100, blocks.min(300));
        let (off, len) = sub_block_range(&mut rng, blocks);
        let data = model.write(off, len);
        pool.volume().write_fua(off, &data).expect("FUA write");
        model.flushed();
        pool = pool.crash(CrashMode::DropAll, &mut rng).expect("reopen");
        check_all(&pool, &mut model, &format!("{what}: FUA, then a power cut"));

        // So does a checkpoint.
        sub_block_writes(&pool, &mut model, &mut rng, 100, blocks.min(300));
        pool.pool().checkpoint().expect("checkpoint");
        model.flushed();
        pool = pool.crash(CrashMode::DropAll, &mut rng).expect("reopen");
        check_all(
            &pool,
            &mut model,
            &format!("{what}: checkpoint, then a power cut"),
        );
    }
}

#[test]
fn unflushed_sub_block_writes_survive_a_clean_close() {
    let mut rng = SimRng(41);
    for (max_overlays, background) in [(8, false), (4096, false), (32, true)] {
        let what = format!("max_overlays {max_overlays}, background {background}");
        let pool =
            SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(max_overlays, background));
        let mut model = Model::new(pool.volume_size());
        let blocks = pool.volume_size() / BS;
        let stored = model.write(0, 32 * BS);
        pool.volume().write(0, &stored).unwrap();
        pool.volume().flush().unwrap();
        sub_block_writes(&pool, &mut model, &mut rng, 500, blocks.min(200));
        check_all(&pool, &mut model, &format!("{what}: before closing"));
        let pool = pool.reopen_clean().expect("clean reopen");
        model.flushed();
        check_all(&pool, &mut model, &format!("{what}: after a clean close"));
        assert_eq!(pool.pool().status().overlay_blocks, 0);
    }
}

/// A pool filled with whole blocks: a sub-block write to a block it does
/// not store fails at once with NoSpace; one to a stored block works. After
/// a trim frees blocks, sub-block writes to new blocks take them (reserved:
/// a whole-block write to a new block then fails), and the flush that
/// merges them succeeds.
#[test]
fn full_pool_refuses_sub_block_writes_to_new_blocks_at_write_time() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 2.0, options(64, false));
    let mut model = Model::new(pool.volume_size());
    let chunk = 64 * 1024;
    // Blocks from `stored_end` on may be unstored.
    let stored_end = fill_with_whole_blocks(&pool, &mut model, chunk);
    let new_block = stored_end + 4 * chunk;
    let taken = sub_block_writes_take_the_room_left(&pool, &mut model, new_block);
    overwrites_of_stored_blocks_still_work(&pool, &mut model, stored_end);
    trimmed_room_is_reserved_for_overlays_on_new_blocks(&pool, &mut model, new_block, taken);
}

/// Free blocks of the pool.
fn free(pool: &SimPool) -> u64 {
    pool.pool().status().free_bytes / BS
}

/// Writes whole `chunk`s from the start of the volume until the pool is
/// full, and flushes; returns where the stored blocks end.
fn fill_with_whole_blocks(pool: &SimPool, model: &mut Model, chunk: u64) -> u64 {
    let size = pool.volume_size();
    let mut off = 0;
    loop {
        assert!(off + chunk <= size, "the overcommitted pool never filled");
        let data = model.write(off, chunk);
        match pool.volume().write(off, &data) {
            Ok(()) => off += chunk,
            Err(Error::NoSpace) => {
                model.forget_last_write();
                break;
            }
            Err(e) => panic!("write at {off}: {e}"),
        }
    }
    pool.volume().flush().expect("flush");
    model.flushed();
    check_all(pool, model, "full");
    off
}

/// Whatever room is left (if any) goes to overlays on new blocks from
/// `new_block` on; then the next one is refused at write time. Returns how
/// many new blocks the overlays took.
fn sub_block_writes_take_the_room_left(pool: &SimPool, model: &mut Model, new_block: u64) -> u64 {
    let mut taken = 0;
    loop {
        let at = new_block + taken * BS + 512;
        let data = model.write(at, 1024);
        match pool.volume().write(at, &data) {
            Ok(()) => taken += 1,
            Err(Error::NoSpace) => {
                model.forget_last_write();
                break;
            }
            Err(e) => panic!("sub-block write to a new block: {e}"),
        }
        assert!(
            taken < 10_000,
            "sub-block writes to new blocks never ran out"
        );
    }
    assert_eq!(free(pool), 0, "NoSpace with room left");
    // At write time: this fails now, not at the next flush.
    let data = model.write(new_block + (taken + 1) * BS, 512);
    assert!(matches!(
        pool.volume().write(new_block + (taken + 1) * BS, &data),
        Err(Error::NoSpace)
    ));
    model.forget_last_write();
    taken
}

/// Overwrites of stored blocks, partial or whole, still work in the full
/// pool, and it flushes.
fn overwrites_of_stored_blocks_still_work(pool: &SimPool, model: &mut Model, stored_end: u64) {
    let mut rng = SimRng(51);
    for _ in 0..200 {
        let (off, len) = sub_block_range(&mut rng, stored_end / BS);
        let data = model.write(off, len);
        pool.volume()
            .write(off, &data)
            .expect("sub-block overwrite");
    }
    let data = model.write(BS, 2 * BS);
    pool.volume()
        .write(BS, &data)
        .expect("whole-block overwrite");
    check_all(pool, model, "full, after overwrites");
    pool.volume().flush().expect("flush of a full pool");
    model.flushed();
    check_all(pool, model, "full, flushed");
}

/// Trimmed blocks make room; overlays on new blocks (past the `taken` ones
/// from `new_block`) reserve it, and the flush merges them into it.
fn trimmed_room_is_reserved_for_overlays_on_new_blocks(
    pool: &SimPool,
    model: &mut Model,
    new_block: u64,
    taken: u64,
) {
    pool.volume().trim(0, 8 * BS).expect("trim");
    model.trim(0, 8 * BS);
    pool.volume().flush().expect("flush");
    let room = free(pool);
    assert!(room >= 8, "a trim of 8 stored blocks freed {room}");
    let base = new_block + (taken + 10) * BS;
    for i in 0..room {
        let data = model.write(base + i * BS + 1024, 512);
        pool.volume()
            .write(base + i * BS + 1024, &data)
            .unwrap_or_else(|e| panic!("sub-block write {i} of {room} into freed room: {e}"));
    }
    assert_eq!(free(pool), 0);
    let data = model.write(base + (room + 1) * BS, 512);
    assert!(
        matches!(
            pool.volume().write(base + (room + 1) * BS, &data),
            Err(Error::NoSpace)
        ),
        "a sub-block write to a new block got a block reserved for another"
    );
    model.forget_last_write();
    if room <= 64 {
        assert_eq!(pool.pool().status().overlay_blocks_unstored, room);
    }
    let data = model.write(base + room * BS, BS);
    assert!(
        matches!(
            pool.volume().write(base + room * BS, &data),
            Err(Error::NoSpace)
        ),
        "a whole-block write took a block reserved for a sub-block write"
    );
    model.forget_last_write();
    pool.volume()
        .flush()
        .expect("flush merging into reserved blocks");
    model.flushed();
    assert_eq!(pool.pool().status().overlay_blocks, 0);
    check_all(pool, model, "after merging into reserved blocks");
    pool.pool().check_invariants().expect("invariants");
}

/// The old block under a sub-block write is unreadable beyond parity: the
/// flush fails with the reason (every time, never silently), the write
/// stays in memory, and rewriting the whole block clears it.
#[test]
fn unreadable_old_block_fails_the_flush_and_keeps_the_write() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(64, false));
    let vol = pool.volume().clone();
    let mut whole = vec![0u8; 16 * BLOCK_SIZE];
    for (s, c) in whole.chunks_mut(SECTOR).enumerate() {
        sector_pattern(1, s as u64, c);
    }
    vol.write(0, &whole).unwrap();
    vol.flush().unwrap();
    let victim = 5u64;
    // Every copy of the victim's stripe damaged: its data and parity.
    let view = corrupt::DiskView::capture(&pool.sims);
    let live = view.live_blocks(vol.id());
    let block = &live[&victim];
    let row = &view.rows[block.row];
    let (col, blk) = row
        .geom
        .locate(&view.geometry, block.pba)
        .expect("in its row");
    for c in std::iter::once(col).chain(row.parity_columns()) {
        corrupt::corrupt_block(&pool.sims, row.pba(&view.geometry, c, blk));
    }
    let mut patch = vec![0u8; 1024];
    for (j, c) in patch.chunks_mut(SECTOR).enumerate() {
        sector_pattern(2, victim * SECTORS_PER_BLOCK + 3 + j as u64, c);
    }
    vol.write(victim * BS + 3 * SECTOR as u64, &patch)
        .expect("a sub-block write does not read the old block");
    // Another block's sub-block write: the failing flush still merges it.
    vol.write(9 * BS + 512, &[0x77; 512]).unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 2);
    for attempt in 0..2 {
        match vol.flush() {
            Err(Error::Unrecoverable { offset, .. }) => assert_eq!(offset, victim * BS),
            other => panic!("flush {attempt} over an unreadable old block: {other:?}"),
        }
        assert_eq!(
            pool.pool().status().overlay_blocks,
            1,
            "the write was dropped"
        );
    }
    let mut buf = vec![0u8; BLOCK_SIZE];
    assert!(matches!(
        vol.read(victim * BS, &mut buf),
        Err(Error::Unrecoverable { .. })
    ));
    // Other blocks are fine, and the pool still writes.
    vol.read(0, &mut buf).expect("another block");
    assert_eq!(&buf[..], &whole[..BLOCK_SIZE]);
    vol.read(9 * BS, &mut buf).expect("the other merged block");
    let mut want = whole[9 * BLOCK_SIZE..10 * BLOCK_SIZE].to_vec();
    want[512..1024].fill(0x77);
    assert_eq!(buf, want);
    // A whole-block write replaces the old block and the overlay.
    let mut fresh = vec![0u8; BLOCK_SIZE];
    for (j, c) in fresh.chunks_mut(SECTOR).enumerate() {
        sector_pattern(3, victim * SECTORS_PER_BLOCK + j as u64, c);
    }
    vol.write(victim * BS, &fresh).unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 0);
    vol.flush().expect("flush after the block was rewritten");
    vol.read(victim * BS, &mut buf).unwrap();
    assert_eq!(buf, fresh);
    pool.pool().check_invariants().expect("invariants");
}

/// The background resolver keeps the table at most a quarter full, and
/// the table never exceeds its limit, whatever the writers do.
#[test]
fn background_resolver_keeps_the_table_low() {
    let limit = 64;
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(limit, true));
    let mut model = Model::new(pool.volume_size());
    let blocks = pool.volume_size() / BS;
    let stored = model.write(0, blocks * BS);
    pool.volume().write(0, &stored).unwrap();
    pool.volume().flush().unwrap();
    model.flushed();
    let reads_before: u64 = pool
        .pool()
        .status()
        .members
        .iter()
        .map(|m| m.counters.reads)
        .sum();
    let mut rng = SimRng(61);
    for _ in 0..1000 {
        let (off, len) = sub_block_range(&mut rng, blocks);
        let data = model.write(off, len);
        pool.volume().write(off, &data).unwrap();
        let held = pool.pool().status().overlay_blocks;
        assert!(held <= limit, "{held} overlays, limit {limit}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.pool().status().overlay_blocks > limit / 4 {
        assert!(
            Instant::now() < deadline,
            "the background resolver left {} overlays",
            pool.pool().status().overlay_blocks
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = pool.pool().status();
    let reads: u64 = st.members.iter().map(|m| m.counters.reads).sum();
    assert!(st.overlays_merged > 0);
    assert!(reads > reads_before, "merging never read an old block");
    check_all(&pool, &mut model, "after the resolver");
    pool.volume().flush().unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 0);
}

/// Block status sees overlays: a hole or zero block with a sub-block write
/// is data; partial zeroing is a sub-block write of zeroes.
#[test]
fn block_status_reports_blocks_with_overlays_as_data() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.5, options(64, false));
    let vol = pool.volume().clone();
    let status = |b: u64| vol.block_status(b * BS, BS).unwrap()[0].1;
    assert_eq!(status(3), Allocation::Hole);
    vol.write(3 * BS + 512, &[7u8; 512]).unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 1);
    assert_eq!(status(3), Allocation::Data);
    vol.write_zeroes(4 * BS, BS, true).unwrap();
    assert_eq!(status(4), Allocation::Zero);
    vol.write(4 * BS, &[9u8; 1024]).unwrap();
    assert_eq!(status(4), Allocation::Data);
    // Whole-block trim and zero drop the overlays.
    vol.trim(3 * BS, BS).unwrap();
    assert_eq!(status(3), Allocation::Hole);
    vol.write_zeroes(4 * BS, BS, false).unwrap();
    assert_eq!(status(4), Allocation::Hole);
    assert_eq!(pool.pool().status().overlay_blocks, 0);
    // Zeroing part of a stored block is a sub-block write of zeroes.
    vol.write(5 * BS, &[1u8; BLOCK_SIZE]).unwrap();
    vol.write_zeroes(5 * BS + 1024, 2048, false).unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 1);
    let mut buf = vec![0u8; BLOCK_SIZE];
    vol.read(5 * BS, &mut buf).unwrap();
    let mut want = vec![1u8; BLOCK_SIZE];
    want[1024..3072].fill(0);
    assert_eq!(buf, want);
    vol.flush().unwrap();
    assert_eq!(status(5), Allocation::Data);
    vol.read(5 * BS, &mut buf).unwrap();
    assert_eq!(buf, want);
}

/// Deleting a volume drops its overlays (and nothing else's).
#[test]
fn deleting_a_volume_drops_its_overlays() {
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.3, options(64, false));
    let other = pool.pool().create_volume("other", 1 << 20).unwrap();
    other.write(0, &[1u8; BLOCK_SIZE]).unwrap();
    for b in 0..4u64 {
        other.write(b * BS + 512, &[2u8; 512]).unwrap();
        pool.volume().write(b * BS + 1024, &[3u8; 512]).unwrap();
    }
    assert_eq!(pool.pool().status().overlay_blocks, 8);
    assert_eq!(pool.pool().status().overlay_blocks_unstored, 7);
    pool.pool().delete_volume("other").unwrap();
    pool.pool()
        .check_invariants()
        .expect("invariants after the delete");
    assert_eq!(pool.pool().status().overlay_blocks, 4);
    assert_eq!(pool.pool().status().overlay_blocks_unstored, 4);
    pool.volume().flush().unwrap();
    assert_eq!(pool.pool().status().overlay_blocks, 0);
    let mut buf = vec![0u8; BLOCK_SIZE];
    pool.volume().read(2 * BS, &mut buf).unwrap();
    let mut want = vec![0u8; BLOCK_SIZE];
    want[1024..1536].fill(3);
    assert_eq!(buf, want);
}

fn sectors(tag: u64, first_sector: u64, n: usize) -> Vec<u8> {
    let mut data = vec![0u8; n * SECTOR];
    for (i, c) in data.chunks_mut(SECTOR).enumerate() {
        sector_pattern(tag, first_sector + i as u64, c);
    }
    data
}

/// A sub-block write W that completes its block's overlay is written as a
/// whole block. If another write W' is merged into the overlay before W's
/// block is appended, the overlay stays over the new block; it must hold
/// W's bytes where W overlapped it, not the older ones (they would read,
/// and flush, as if W had never happened). W is held after the table handed
/// it the block (one row allowed in flight, that row's member writes held).
#[test]
fn a_write_completing_an_overlay_is_not_undone_by_a_write_merged_meanwhile() {
    let options = PoolOptions {
        max_inflight_rows: 1,
        ..test_options()
    };
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, options);
    let vol = pool.volume().clone();
    let b = 40u64;
    let s0 = b * SECTORS_PER_BLOCK;
    // The overlay: sectors 0..7 of the block (write 1).
    vol.write(b * BS, &sectors(1, s0, 7)).unwrap();
    for s in &pool.sims {
        s.hold(Hold::WritesIn {
            from: 2 * BS,
            to: u64::MAX,
        });
    }
    std::thread::scope(|scope| {
        // A row in flight whose member writes are held: later whole-block
        // writes wait for room.
        let filler = scope.spawn(|| vol.write(0, &vec![0x5a; 32 * BLOCK_SIZE]));
        std::thread::sleep(Duration::from_millis(200));
        // W: sectors 5..8 (write 2) completes the overlay, then waits.
        let w = scope.spawn(|| vol.write(b * BS + 5 * SECTOR as u64, &sectors(2, s0 + 5, 3)));
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !w.is_finished(),
            "the completing write did not wait (test setup)"
        );
        // W': sector 0 (write 3), merged into the overlay meanwhile.
        vol.write(b * BS, &sectors(3, s0, 1)).unwrap();
        for s in &pool.sims {
            s.release();
        }
        filler.join().unwrap().unwrap();
        w.join().unwrap().unwrap();
    });
    let tags = |vol: &lograid::Volume| -> Vec<u64> {
        let mut got = vec![0u8; BLOCK_SIZE];
        vol.read(b * BS, &mut got).unwrap();
        got.chunks(SECTOR)
            .enumerate()
            .map(|(i, c)| sector_tag(c, s0 + i as u64).expect("a written pattern"))
            .collect()
    };
    let want = vec![3, 1, 1, 1, 1, 2, 2, 2];
    assert_eq!(tags(&vol), want, "the block's sectors, by write");
    vol.flush().unwrap();
    let pool = pool.crash(CrashMode::DropAll, &mut SimRng(3)).unwrap();
    assert_eq!(tags(pool.volume()), want, "after a power cut");
}
