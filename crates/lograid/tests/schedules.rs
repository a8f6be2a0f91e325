//! The engine's own code (its foreground paths: the background cleaner and
//! resolver are off, since their timed waits never time out under shuttle)
//! under a controlled thread scheduler (shuttle):
//! writes, flushes, a FUA write, a checkpoint and a volume deletion run on
//! four threads, and shuttle picks which thread runs at every lock, wait,
//! channel operation and spawn, in the engine and in these threads alike,
//! so interleavings that real threads hit rarely are explored on purpose
//! (random schedules, and PCT schedules that favour a few deep preemptions).
//! The power is cut (on paper) at the instant each flush, FUA write or
//! checkpoint returns, before its thread reaches another scheduling point,
//! and once more by a fifth task at a step the scheduler picks: each takes the
//! members' durable images and what had been acknowledged by then in one
//! go (no task runs between two scheduling points, so that is one instant).
//! In half of the schedules the members also lose power for real at a
//! member I/O drawn from the scheduler's random source, so that the
//! engine's failure handling runs under the same interleavings; in others
//! (with parity) one member alone dies at such an I/O. Every image taken
//! is reopened and checked: a write a completed flush covered (one that
//! returned before the flush began, or a FUA write that returned) is
//! there; the volume being deleted is either gone (and then its deletion
//! had been durable) or whole; and a member that died is either recorded
//! faulted or holds every covered write itself (the pool reopened without
//! another member still reads them: no flush counted on a dead member's
//! part of the parity without recording it dead).
//!
//! Meanwhile the checkpoint's and the deletion's threads read blocks of
//! both volumes through `try_read_now` (as the NBD server's event loop
//! does: a lookup under a lock taken with `try_lock`, the member read after
//! it): every read done that way returns bytes some write put there, never
//! those of a segment freed and written anew under it.
//!
//! A second scenario explores the sub-block write protocol (overlays held in
//! memory, merged into their blocks later, each merge a conditional write
//! decided in one lock section and done in another): with a table of one
//! overlay, a sub-block write beside the full table (merged by the writer
//! itself while a flush merges the table), whole-block writes that take the
//! same block A to B and back to A, a write that completes another block's
//! overlay and one merged into that overlay meanwhile. Every sector must end
//! with a value some order of those writes gives, before and after a power
//! cut.
//!
//! A third scenario explores reads that look blocks up without the ledger
//! lock (`read_index`): one- and many-block reads beside whole-block writes
//! that fill rows (sealed, in flight, written by the row writer's threads)
//! and a sub-block write, and a volume holding a sub-block write deleted
//! while it is read. Every sector read is one some write put there (a read
//! must not take a block of a row in flight from a member that does not
//! hold it yet), a sub-block write is seen once acknowledged, and a read of
//! the volume being deleted fails or holds its sub-block write.
//!
//! Built only with the `shuttle` feature, which puts the engine's locks,
//! condition variables, channels and threads on shuttle (`src/sync.rs`):
//!
//!     cargo nextest run -p lograid --release --features shuttle --test schedules
//!
//! `LOGRAID_SCHEDULES` sets the number of schedules of each kind (default
//! 500), `LOGRAID_SCHEDULE_SEED` the first seed. A failing schedule is
//! printed by shuttle and can be replayed with `shuttle::replay`.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should
#![cfg(feature = "shuttle")]

use lograid::device::{CrashMode, Member, PowerCut, SimMember, SimRng};
use lograid::{create_pool, open_members, CreateOptions, PoolOptions};
use shuttle::rand::Rng;
use shuttle::scheduler::{PctScheduler, RandomScheduler, Scheduler};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const BLOCK: usize = lograid::format::BLOCK_SIZE;
const MEMBER_BYTES: u64 = 4 << 20;
/// Blocks of the volume that is deleted during the run.
const DOOMED_BLOCKS: usize = 48;
/// Member I/Os the threads do at most (measured: see `budget_is_enough`);
/// the cut is drawn below it, so that it lands anywhere in the run or not
/// at all.
const MAX_IOS: u64 = 60;
/// Scheduling steps before the cutting task takes its snapshot, at most
/// (about what the cutting task gets in a run with four busy tasks).
const MAX_STEPS_TO_CUT: usize = 300;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn options() -> PoolOptions {
    PoolOptions {
        io_threads: 2,
        checkpoint_interval_blocks: 64,
        max_inflight_rows: 4,
        max_inflight_bytes: 4 << 20,
        background_cleaner: false,
        background_resolver: false,
        discard: true,
        ..Default::default()
    }
}

/// A pool on three simulated members with one volume "a" of 256 KiB.
fn new_pool(parity: u8, options: PoolOptions) -> (Vec<Arc<SimMember>>, lograid::Pool) {
    let sims: Vec<Arc<SimMember>> = (0..3)
        .map(|i| Arc::new(SimMember::new(&format!("sim{i}"), MEMBER_BYTES)))
        .collect();
    let members: Vec<Arc<dyn Member>> = sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect();
    let create = CreateOptions {
        name: "sched".into(),
        parity,
        chunk_bytes: 16 * 1024,
        segment_bytes: Some(64 * 1024),
        force: true,
        initial_volume: Some(("a".into(), 256 * 1024)),
    };
    let pool = create_pool(members, &create, options).expect("create");
    (sims, pool)
}

/// The pool the members' images hold (after a power cut).
fn reopen(images: Vec<Vec<u8>>, options: PoolOptions) -> lograid::Pool {
    let members: Vec<Arc<dyn Member>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img)) as Arc<dyn Member>)
        .collect();
    open_members(members, options, false).expect("reopen after the cut")
}

/// One acknowledged-or-not write of a single block of volume "a".
#[derive(Clone, Copy)]
struct Write {
    block: u64,
    tag: u8,
    start: u64,
    end: u64,
    ok: bool,
    fua: bool,
}

/// How a write is made: `write`, `write_fua`, or `try_write_now` (as the
/// NBD server's event loop does), falling back to `write`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Plain,
    Fua,
    AtOnce,
}

/// What had been acknowledged. A std mutex on purpose: it is never held
/// across a scheduling point, so recording an outcome and taking a
/// snapshot are not interleaved with anything.
#[derive(Default, Clone)]
struct Log {
    writes: Vec<Write>,
    /// Latest start of a flush or checkpoint that returned Ok.
    covered_before: u64,
    deleted: bool,
}

/// The members' durable images and what had been acknowledged, at one
/// instant.
struct Snapshot {
    images: Vec<Vec<u8>>,
    log: Log,
    /// The member that dies alone in this run, if one does.
    dying: Option<usize>,
}

fn snapshot(sims: &[Arc<SimMember>], log: &Log, dying: Option<usize>) -> Snapshot {
    let images = sims
        .iter()
        .map(|s| s.crash_image(CrashMode::DropAll, &mut SimRng(1)))
        .collect();
    Snapshot {
        images,
        log: log.clone(),
        dying,
    }
}

/// What the threads record as they run: a clock that orders their calls,
/// what had been acknowledged, and the snapshots taken the instant a
/// flush-like operation returned.
#[derive(Clone)]
struct Recorder {
    clock: Arc<AtomicU64>,
    log: Arc<Mutex<Log>>,
    sims: Vec<Arc<SimMember>>,
    snapshots: Arc<Mutex<Vec<Snapshot>>>,
    dying: Option<usize>,
}

impl Recorder {
    /// A write of block `block` of `vol`, every byte `tag`, made `how`,
    /// and its outcome.
    fn write(&self, vol: &lograid::Volume, block: u64, tag: u8, how: How) {
        let start = self.clock.fetch_add(1, Ordering::SeqCst);
        let data = vec![tag; BLOCK];
        let offset = block * BLOCK as u64;
        let r = match how {
            How::Plain => vol.write(offset, &data),
            How::Fua => vol.write_fua(offset, &data),
            How::AtOnce => match vol.try_write_now(offset, &data) {
                Some(r) => {
                    TAKEN_AT_ONCE.fetch_add(1, Ordering::Relaxed);
                    r
                }
                None => vol.write(offset, &data),
            },
        };
        let fua = how == How::Fua;
        let end = self.clock.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().writes.push(Write {
            block,
            tag,
            start,
            end,
            ok: r.is_ok(),
            fua,
        });
    }

    /// The instant a flush-like operation returns Ok, before its thread
    /// reaches another scheduling point, what it covers must be durable.
    fn covered(&self, op: &dyn Fn() -> lograid::Result<()>) {
        let start = self.clock.fetch_add(1, Ordering::SeqCst);
        if op().is_ok() {
            let mut l = self.log.lock().unwrap();
            l.covered_before = l.covered_before.max(start);
            self.snapshots
                .lock()
                .unwrap()
                .push(snapshot(&self.sims, &l, self.dying));
        }
    }
}

/// How the members fail in one schedule.
#[derive(Clone, Copy)]
enum Failure {
    None,
    /// Every member loses power after this many member I/Os.
    PowerCut(u64),
    /// Member `member` alone dies after `ios` I/Os of its own.
    MemberDies {
        member: usize,
        ios: u64,
    },
}

/// Runs one schedule; `failure`: how the members fail; `cut_after`:
/// scheduling steps the cutting task waits before it takes its snapshot.
/// Returns the member I/Os done and the steps the cutting task waited.
fn run(parity: u8, failure: Failure, cut_after: usize) -> (u64, usize) {
    let (sims, pool) = new_pool(parity, options());
    let a = pool.volume("a").unwrap();
    let doomed = pool.create_volume("b", 256 * 1024).unwrap();
    doomed.write(0, &vec![0xbb; DOOMED_BLOCKS * BLOCK]).unwrap();
    pool.checkpoint().unwrap();
    let (budget, dying) = match failure {
        Failure::None => (1 << 30, None),
        Failure::PowerCut(ios) => (ios, None),
        Failure::MemberDies { member, .. } => (1 << 30, Some(member)),
    };
    let cut = PowerCut::after(budget);
    for s in &sims {
        s.power_cut_after(cut.clone());
    }
    if let Failure::MemberDies { member, ios } = failure {
        sims[member].power_cut_after(PowerCut::after(ios));
    }
    let rec = Recorder {
        clock: Arc::new(AtomicU64::new(1)),
        log: Arc::new(Mutex::new(Log::default())),
        sims: sims.clone(),
        snapshots: Arc::new(Mutex::new(Vec::new())),
        dying,
    };
    let threads = spawn_workload(&a, &pool, &rec);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cutter = spawn_cutter(&rec, &done, cut_after);
    for t in threads {
        t.join().expect("thread");
    }
    done.store(true, Ordering::SeqCst);
    let (during, steps) = cutter.join().expect("cutting task");
    let used = (budget as i64 - cut.remaining().max(0)) as u64;
    // The power goes out now if it had not yet.
    for s in &sims {
        s.power_cut_after(PowerCut::after(0));
    }
    let after = snapshot(&sims, &rec.log.lock().unwrap(), dying);
    drop((a, doomed, pool));
    let taken: Vec<Snapshot> = std::mem::take(&mut *rec.snapshots.lock().unwrap());
    for s in taken.into_iter().chain([during, after]) {
        check(s);
    }
    (used, steps)
}

/// The four threads of the workload: writes taken at once if they can be
/// and a flush, writes (one FUA) and a flush, a checkpoint, and the
/// deletion of volume "b".
fn spawn_workload(
    a: &lograid::Volume,
    pool: &lograid::Pool,
    rec: &Recorder,
) -> Vec<shuttle::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    {
        let (a, rec) = (a.clone(), rec.clone());
        threads.push(shuttle::thread::spawn(move || {
            rec.write(&a, 0, 0x10, How::AtOnce);
            rec.covered(&|| a.flush());
            rec.write(&a, 2, 0x12, How::AtOnce);
        }));
    }
    {
        let (a, rec) = (a.clone(), rec.clone());
        threads.push(shuttle::thread::spawn(move || {
            rec.write(&a, 1, 0x11, How::Plain);
            rec.write(&a, 3, 0x13, How::Fua);
            rec.covered(&|| a.flush());
        }));
    }
    {
        let (p, rec, a) = (pool.clone(), rec.clone(), a.clone());
        let b = p.volume("b").unwrap();
        threads.push(shuttle::thread::spawn(move || {
            read_at_once(&b, 5, &[0xbb]);
            rec.covered(&|| p.checkpoint());
            read_at_once(&a, 0, &[0, 0x10]);
            read_at_once(&b, 7, &[0xbb]);
        }));
    }
    {
        let (p, log, a) = (pool.clone(), rec.log.clone(), a.clone());
        let b = p.volume("b").unwrap();
        threads.push(shuttle::thread::spawn(move || {
            read_at_once(&a, 1, &[0, 0x11]);
            let deleted = p.delete_volume("b").is_ok();
            log.lock().unwrap().deleted = deleted;
            read_at_once(&b, 9, &[0xbb]);
            read_at_once(&a, 3, &[0, 0x13]);
        }));
    }
    threads
}

/// Reads done by `try_read_now` (the schedules must explore that path).
static READ_AT_ONCE: AtomicU64 = AtomicU64::new(0);

/// Reads block `block` of `vol` through `try_read_now`; if it was done, every
/// byte must be one of `tags` (bytes some write put there).
fn read_at_once(vol: &lograid::Volume, block: u64, tags: &[u8]) {
    let mut got = vec![0xa5u8; BLOCK];
    if let Some(Ok(())) = vol.try_read_now(block * BLOCK as u64, &mut got) {
        READ_AT_ONCE.fetch_add(1, Ordering::Relaxed);
        assert!(
            tags.iter().any(|&t| got.iter().all(|&x| x == t)),
            "a read done at once of block {block} returned bytes no write put there"
        );
    }
}

/// The cutting task: after `cut_after` scheduling steps (or once the
/// workload is `done`), it takes a snapshot; it returns it and the steps
/// it waited.
fn spawn_cutter(
    rec: &Recorder,
    done: &Arc<std::sync::atomic::AtomicBool>,
    cut_after: usize,
) -> shuttle::thread::JoinHandle<(Snapshot, usize)> {
    let (sims, log, done, dying) = (rec.sims.clone(), rec.log.clone(), done.clone(), rec.dying);
    shuttle::thread::spawn(move || {
        let mut steps = 0;
        while steps < cut_after && !done.load(Ordering::SeqCst) {
            shuttle::thread::yield_now();
            steps += 1;
        }
        (snapshot(&sims, &log.lock().unwrap(), dying), steps)
    })
}

/// With a member that died (`dying`) and was not recorded faulted: the
/// covered writes must read back with another member missing, from the
/// dead member's own columns.
fn check_dead_member_was_trusted_rightly(images: &[Vec<u8>], dying: usize, log: &Log) {
    let without = (dying + 1) % images.len();
    let rest: Vec<Vec<u8>> = images
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != without)
        .map(|(_, img)| img.clone())
        .collect();
    let members: Vec<Arc<dyn Member>> = rest
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img)) as Arc<dyn Member>)
        .collect();
    let pool = open_members(members, options(), false).unwrap_or_else(|e| {
        panic!("member {dying} died unrecorded; reopened with member {without} missing: {e}")
    });
    let a = pool.volume("a").expect("volume a");
    for w in log
        .writes
        .iter()
        .filter(|w| w.ok && (w.fua || w.end < log.covered_before))
    {
        let mut got = vec![0u8; BLOCK];
        a.read(w.block * BLOCK as u64, &mut got)
            .unwrap_or_else(|e| {
                panic!(
                    "member {dying} died unrecorded; with member {without} missing, \
                 covered block {} is lost: {e}",
                    w.block
                )
            });
        assert!(
            got.iter().all(|&b| b == w.tag),
            "member {dying} died unrecorded; with member {without} missing, block {} \
             lost covered write {:#x}",
            w.block,
            w.tag
        );
    }
}

/// Snapshots checked by this process (for the report).
static CHECKED: AtomicU64 = AtomicU64::new(0);
/// Writes `try_write_now` took (the schedules must explore that path).
static TAKEN_AT_ONCE: AtomicU64 = AtomicU64::new(0);

fn check(snapshot: Snapshot) {
    CHECKED.fetch_add(1, Ordering::Relaxed);
    let Snapshot { images, log, dying } = snapshot;
    let pool = reopen(images.clone(), options());
    pool.check_invariants().expect("invariants after the cut");
    let a = pool.volume("a").expect("volume a");
    for w in &log.writes {
        let mut got = vec![0u8; BLOCK];
        a.read(w.block * BLOCK as u64, &mut got)
            .unwrap_or_else(|e| panic!("block {} of a after the cut: {e}", w.block));
        let covered = w.ok && (w.fua || w.end < log.covered_before);
        if covered {
            assert!(
                got.iter().all(|&b| b == w.tag),
                "block {} lost write {:#x} (ran {}..{}, a flush began at {}, fua {})",
                w.block,
                w.tag,
                w.start,
                w.end,
                log.covered_before,
                w.fua
            );
        } else {
            assert!(
                got.iter().all(|&b| b == w.tag) || got.iter().all(|&b| b == 0),
                "block {} holds bytes no write put there",
                w.block
            );
        }
    }
    match pool.volume("b") {
        Ok(b) => {
            assert!(
                !log.deleted,
                "volume b is back although its deletion returned"
            );
            let mut got = vec![0u8; DOOMED_BLOCKS * BLOCK];
            b.read(0, &mut got)
                .unwrap_or_else(|e| panic!("the volume being deleted, after the cut: {e}"));
            assert!(
                got.iter().all(|&x| x == 0xbb),
                "the volume being deleted changed"
            );
        }
        Err(lograid::Error::NotFound(_)) => {}
        Err(e) => panic!("looking for volume b: {e}"),
    }
    if let Some(k) = dying {
        if pool.status().members[k].state != "faulted" {
            drop(pool);
            check_dead_member_was_trusted_rightly(&images, k, &log);
        }
    }
}

fn config() -> shuttle::Config {
    let mut config = shuttle::Config::new();
    // The engine's frames (row buffers are on the heap, but parity and
    // recovery go deep) need more than shuttle's default task stack.
    config.stack_size = 1 << 20;
    config.max_steps = shuttle::MaxSteps::FailAfter(20_000_000);
    config
}

fn explore(kind: &str, n: usize, seed: u64, scheduler: impl Scheduler + 'static) {
    let before = CHECKED.load(Ordering::Relaxed);
    let taken_before = TAKEN_AT_ONCE.load(Ordering::Relaxed);
    let read_before = READ_AT_ONCE.load(Ordering::Relaxed);
    shuttle::Runner::new(scheduler, config()).run(|| {
        let mut rng = shuttle::rand::thread_rng();
        // Without parity every member's missed flush loses data; with it,
        // only two at once do.
        let parity = rng.gen_range(0..2);
        let failure = match rng.gen_range(0..4) {
            0 | 1 => Failure::PowerCut(rng.gen_range(0..MAX_IOS)),
            2 if parity > 0 => Failure::MemberDies {
                member: rng.gen_range(0..3),
                ios: rng.gen_range(0..MAX_IOS / 3),
            },
            _ => Failure::None,
        };
        run(parity, failure, rng.gen_range(0..MAX_STEPS_TO_CUT));
    });
    let checked = CHECKED.load(Ordering::Relaxed) - before;
    let taken = TAKEN_AT_ONCE.load(Ordering::Relaxed) - taken_before;
    let read = READ_AT_ONCE.load(Ordering::Relaxed) - read_before;
    eprintln!(
        "{kind}: {n} schedules from seed {seed:#x}, {checked} cut images checked, \
         {taken} writes taken at once, {read} reads done at once"
    );
    assert!(n < 20 || taken > 0, "no schedule took a write at once");
    assert!(n < 20 || read > 0, "no schedule read at once");
}

/// Schedules of each kind to explore, and the first seed.
fn schedules() -> (usize, u64) {
    (
        env_num("LOGRAID_SCHEDULES", 500) as usize,
        env_num("LOGRAID_SCHEDULE_SEED", 0x5eed),
    )
}

/// Random schedules: every step picks a runnable thread at random.
#[test]
fn random_schedules_with_a_power_cut_lose_no_flushed_write() {
    let (n, seed) = schedules();
    explore("random", n, seed, RandomScheduler::new_from_seed(seed, n));
}

/// PCT schedules (probabilistic concurrency testing): threads run by
/// priority with up to 3 priority changes at random steps, which finds
/// bugs that need a few preemptions at the right places.
#[test]
fn pct_schedules_with_a_power_cut_lose_no_flushed_write() {
    let (n, seed) = schedules();
    explore("pct", n, seed, PctScheduler::new_from_seed(seed, 3, n));
}

/// `MAX_IOS` and `MAX_STEPS_TO_CUT` cover the whole run: with no cut, the
/// threads do fewer member I/Os than that, and the cutting task gets more
/// steps, so that cuts drawn below them land anywhere in the run.
#[test]
fn cut_ranges_cover_the_run() {
    shuttle::Runner::new(RandomScheduler::new_from_seed(1, 20), config()).run(|| {
        let (used, steps) = run(1, Failure::None, usize::MAX);
        assert!(
            used < MAX_IOS,
            "a run without a cut did {used} member I/Os; raise MAX_IOS"
        );
        assert!(
            steps * 2 > MAX_STEPS_TO_CUT,
            "the cutting task got {steps} steps in a run: lower MAX_STEPS_TO_CUT"
        );
    });
}

fn fill(byte: u8, sectors: usize) -> Vec<u8> {
    vec![byte; sectors * 512]
}

/// The sub-block scenario (see the module comment). Block 1 goes A, B, A
/// while one sector of it is written beside a full table; block 2's
/// overlay (sectors 0..7, 0x01) is completed by a write of sectors 5..8
/// (0x02) while sector 0 (0x03) is merged into it.
fn run_overlays() {
    let options = PoolOptions {
        max_overlays: 1,
        ..options()
    };
    let (sims, pool) = new_pool(1, options.clone());
    let a = pool.volume("a").unwrap();
    const X: u64 = 4096;
    const Z: u64 = 2 * 4096;
    a.write(X, &fill(0x41, 8)).unwrap();
    a.flush().unwrap();
    a.write(Z, &fill(0x01, 7)).unwrap(); // the table's one overlay
    let mut threads = Vec::new();
    let spawn = |f: Box<dyn FnOnce() + Send>| shuttle::thread::spawn(f);
    {
        let a = a.clone();
        threads.push(spawn(Box::new(move || {
            a.write(X + 3 * 512, &fill(0x99, 1)).unwrap();
        })));
    }
    {
        let a = a.clone();
        threads.push(spawn(Box::new(move || {
            a.write(X, &fill(0x42, 8)).unwrap();
            a.write(X, &fill(0x41, 8)).unwrap();
        })));
    }
    {
        let a = a.clone();
        threads.push(spawn(Box::new(move || a.flush().unwrap())));
    }
    {
        let a = a.clone();
        threads.push(spawn(Box::new(move || {
            a.write(Z + 5 * 512, &fill(0x02, 3)).unwrap();
        })));
    }
    {
        let a = a.clone();
        threads.push(spawn(Box::new(move || {
            a.write(Z, &fill(0x03, 1)).unwrap();
        })));
    }
    for t in threads {
        t.join().expect("thread");
    }
    check_overlays(&a, "before the power cut");
    a.flush().unwrap();
    let images: Vec<Vec<u8>> = sims
        .iter()
        .map(|s| s.crash_image(CrashMode::DropAll, &mut SimRng(1)))
        .collect();
    drop((a, pool));
    let pool = reopen(images, options);
    check_overlays(&pool.volume("a").unwrap(), "after the power cut");
}

/// Block 1: A (0x41) everywhere but sector 3, which is A or 0x99 (the
/// sub-block write before or after the last A); never B (0x42). Block 2:
/// sector 0 from the last write to it, 1-4 from the overlay, 5-7 from the
/// completing write.
fn check_overlays(a: &lograid::Volume, when: &str) {
    let mut got = vec![0u8; 2 * 4096];
    a.read(4096, &mut got)
        .unwrap_or_else(|e| panic!("{when}: read: {e}"));
    let byte = |block: usize, sector: usize| {
        let s = &got[block * 4096 + sector * 512..block * 4096 + (sector + 1) * 512];
        assert!(
            s.iter().all(|&b| b == s[0]),
            "{when}: block {} sector {sector} is torn",
            block + 1
        );
        s[0]
    };
    let x: Vec<u8> = (0..8).map(|i| byte(0, i)).collect();
    let ok_x = x
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 0x41 || (i == 3 && v == 0x99));
    assert!(
        ok_x,
        "{when}: block 1 (A, B, A and sector 3 beside a full table) holds {x:x?}"
    );
    let z: Vec<u8> = (0..8).map(|i| byte(1, i)).collect();
    assert_eq!(
        z,
        [3, 1, 1, 1, 1, 2, 2, 2],
        "{when}: block 2 (an overlay completed while written)"
    );
}

fn explore_overlays(kind: &str, n: usize, seed: u64, scheduler: impl Scheduler + 'static) {
    shuttle::Runner::new(scheduler, config()).run(run_overlays);
    eprintln!("{kind}: {n} schedules of sub-block merges from seed {seed:#x}");
}

#[test]
fn random_schedules_of_sub_block_merges() {
    let (n, seed) = schedules();
    explore_overlays("random", n, seed, RandomScheduler::new_from_seed(seed, n));
}

#[test]
fn pct_schedules_of_sub_block_merges() {
    let (n, seed) = schedules();
    explore_overlays("pct", n, seed, PctScheduler::new_from_seed(seed, 3, n));
}

/// Blocks of volume "a" the reads-without-the-lock scenario writes.
const UNLOCKED_BLOCKS: u64 = 8;

/// Whole-block tags of that scenario, oldest first.
const WHOLE_TAGS: [u8; 3] = [0x10, 0x20, 0x30];

/// The sub-block write's tag (sector 0 of block `SUB_BLOCK`).
const SUB_TAG: u8 = 0x44;
const SUB_BLOCK: u64 = 5;

/// Reads without the ledger lock, over all schedules of the scenario.
static UNLOCKED_READS: AtomicU64 = AtomicU64::new(0);

/// What the scenario's threads tell each other: per block of "a", the
/// newest whole-block tag acknowledged (its rank in `WHOLE_TAGS`); whether
/// the sub-block write was acknowledged; whether block 5's last whole write
/// began after that.
#[derive(Default)]
struct Acked {
    rank: [std::sync::atomic::AtomicUsize; UNLOCKED_BLOCKS as usize],
    sub_done: std::sync::atomic::AtomicBool,
    last_after_sub: std::sync::atomic::AtomicBool,
}

/// Reads that look blocks up without the ledger lock (`read_index`), beside
/// writes that fill rows (sealed, in flight, then written) and a sub-block
/// write. Blocks 0..8 hold 0x10 (flushed) when the threads start; one thread
/// writes them 0x20 then 0x30 (each pass fills a row); one writes sector 0
/// of block 5 (0x44) and reads it back; two read them, a block at a time
/// and all at once. Volume "b", holding a sub-block write, is deleted while
/// it is read: each read fails as deleted or holds that write. Every sector
/// read is one some write put there, no older than what was acknowledged
/// before the read began (never unwritten member blocks of a row still in
/// flight: no checksum error, no repair, in the whole run), and the
/// sub-block write is seen once acknowledged unless a later whole-block
/// write replaced it.
fn run_unlocked_reads() {
    let (_sims, pool) = new_pool(1, options());
    let a = pool.volume("a").unwrap();
    let blocks = UNLOCKED_BLOCKS as usize;
    a.write(0, &vec![WHOLE_TAGS[0]; blocks * BLOCK]).unwrap();
    a.flush().unwrap();
    // Volume "b": block 0 flushed as 0x10, then sector 0 written 0x55 (held
    // as an overlay: the resolver is off), while "b" is deleted and read.
    let b = pool.create_volume("b", 64 * 1024).unwrap();
    b.write(0, &[0x10; BLOCK]).unwrap();
    b.flush().unwrap();
    b.write(0, &[0x55; 512]).unwrap();
    let acked = Arc::new(Acked::default());
    let mut threads = Vec::new();
    {
        let pool = pool.clone();
        threads.push(shuttle::thread::spawn(move || {
            pool.delete_volume("b").unwrap();
        }));
    }
    threads.push(spawn_reads_of_deleted(&b));
    {
        let (a, acked) = (a.clone(), acked.clone());
        threads.push(shuttle::thread::spawn(move || {
            for (rank, &tag) in WHOLE_TAGS.iter().enumerate().skip(1) {
                for b in 0..UNLOCKED_BLOCKS {
                    if b == SUB_BLOCK && acked.sub_done.load(Ordering::SeqCst) {
                        acked.last_after_sub.store(true, Ordering::SeqCst);
                    }
                    a.write(b * BLOCK as u64, &vec![tag; BLOCK]).unwrap();
                    acked.rank[b as usize].store(rank, Ordering::SeqCst);
                }
            }
            a.flush().unwrap();
        }));
    }
    let sub_before = Arc::new(AtomicU64::new(0));
    {
        let (a, acked, sub_before) = (a.clone(), acked.clone(), sub_before.clone());
        threads.push(shuttle::thread::spawn(move || {
            let before = acked.rank[SUB_BLOCK as usize].load(Ordering::SeqCst);
            sub_before.store(before as u64, Ordering::SeqCst);
            a.write(SUB_BLOCK * BLOCK as u64, &[SUB_TAG; 512]).unwrap();
            acked.sub_done.store(true, Ordering::SeqCst);
            let floor = acked.rank[SUB_BLOCK as usize].load(Ordering::SeqCst);
            let mut got = vec![0u8; BLOCK];
            a.read(SUB_BLOCK * BLOCK as u64, &mut got).unwrap();
            let sector0 = check_sectors(&got, SUB_BLOCK, floor, "the sub-block writer's read");
            assert!(
                sector0 == SUB_TAG || rank_of(sector0) > before,
                "block 5 sector 0 read back older than the sub-block write acknowledged"
            );
        }));
    }
    {
        let (a, acked) = (a.clone(), acked.clone());
        threads.push(shuttle::thread::spawn(move || {
            let mut got = vec![0u8; BLOCK];
            for b in (0..UNLOCKED_BLOCKS).rev() {
                let floor = acked.rank[b as usize].load(Ordering::SeqCst);
                a.read(b * BLOCK as u64, &mut got).unwrap();
                check_sectors(&got, b, floor, "a read of one block");
            }
        }));
    }
    {
        let (a, acked) = (a.clone(), acked.clone());
        threads.push(shuttle::thread::spawn(move || {
            let mut got = vec![0u8; blocks * BLOCK];
            for _ in 0..2 {
                let floors: Vec<usize> = acked
                    .rank
                    .iter()
                    .map(|r| r.load(Ordering::SeqCst))
                    .collect();
                match a.try_read_now(0, &mut got) {
                    Some(r) => r.unwrap(),
                    None => a.read(0, &mut got).unwrap(),
                }
                for (b, block) in got.chunks(BLOCK).enumerate() {
                    let floor = floors[b];
                    check_sectors(block, b as u64, floor, "a read of every block");
                }
            }
        }));
    }
    for t in threads {
        t.join().expect("thread");
    }
    let mut got = vec![0u8; blocks * BLOCK];
    a.read(0, &mut got).unwrap();
    let last = WHOLE_TAGS.len() - 1;
    for (b, block) in got.chunks(BLOCK).enumerate() {
        let first = check_sectors(block, b as u64, last, "the read after the threads");
        let sub_may_be_last = !acked.last_after_sub.load(Ordering::SeqCst);
        let sub_must_be_last = sub_before.load(Ordering::SeqCst) as usize == last;
        let ok = match (b as u64 == SUB_BLOCK, first) {
            (true, SUB_TAG) => sub_may_be_last,
            (true, 0x30) => !sub_must_be_last,
            (false, 0x30) => true,
            _ => false,
        };
        assert!(
            ok,
            "block {b} does not hold the last writes (sector 0: {first:#x})"
        );
    }
    let status = pool.status();
    assert_eq!(
        (status.checksum_errors, status.repaired_blocks),
        (0, 0),
        "a read found a block that did not match its checksum"
    );
    UNLOCKED_READS.fetch_add(status.reads_without_ledger_lock, Ordering::Relaxed);
}

/// Reads block 0 of volume "b" (being deleted) twice: each fails as
/// deleted, or holds its acknowledged sub-block write (0x55 on 0x10).
fn spawn_reads_of_deleted(b: &lograid::Volume) -> shuttle::thread::JoinHandle<()> {
    let b = b.clone();
    shuttle::thread::spawn(move || {
        let mut got = vec![0u8; BLOCK];
        for _ in 0..2 {
            let read = match b.try_read_now(0, &mut got) {
                Some(r) => r,
                None => b.read(0, &mut got),
            };
            match read {
                Ok(()) => assert!(
                    got[..512].iter().all(|&x| x == 0x55) && got[512..].iter().all(|&x| x == 0x10),
                    "a read of a volume being deleted missed its sub-block write"
                ),
                Err(lograid::Error::NotFound(_)) => {}
                Err(e) => panic!("a read of a volume being deleted failed otherwise: {e}"),
            }
        }
    })
}

fn rank_of(tag: u8) -> usize {
    WHOLE_TAGS
        .iter()
        .position(|&t| t == tag)
        .unwrap_or(usize::MAX)
}

/// Checks that every sector of `block` (block `b` of the scenario) is
/// whole and holds a tag some write put there, no older than rank `floor`
/// (acknowledged before the read began; sector 0 of block 5 may hold the
/// sub-block write's tag instead); returns sector 0's.
fn check_sectors(block: &[u8], b: u64, floor: usize, what: &str) -> u8 {
    for (s, sector) in block.chunks(512).enumerate() {
        let tag = sector[0];
        let sub = b == SUB_BLOCK && s == 0 && tag == SUB_TAG;
        assert!(
            (sub || rank_of(tag) != usize::MAX) && sector.iter().all(|&x| x == tag),
            "{what}: block {b} sector {s} holds bytes no write put there"
        );
        assert!(
            sub || rank_of(tag) >= floor,
            "{what}: block {b} sector {s} holds {tag:#x}, older than a write acknowledged before the read"
        );
    }
    block[0]
}

fn explore_unlocked_reads(kind: &str, n: usize, seed: u64, scheduler: impl Scheduler + 'static) {
    let before = UNLOCKED_READS.load(Ordering::Relaxed);
    shuttle::Runner::new(scheduler, config()).run(run_unlocked_reads);
    let reads = UNLOCKED_READS.load(Ordering::Relaxed) - before;
    eprintln!("{kind}: {n} schedules of reads without the ledger lock from seed {seed:#x}: {reads} such reads");
    assert!(
        reads > 0,
        "no read looked its blocks up without the ledger lock"
    );
}

#[test]
fn random_schedules_of_reads_without_the_ledger_lock() {
    let (n, seed) = schedules();
    explore_unlocked_reads("random", n, seed, RandomScheduler::new_from_seed(seed, n));
}

#[test]
fn pct_schedules_of_reads_without_the_ledger_lock() {
    let (n, seed) = schedules();
    explore_unlocked_reads("pct", n, seed, PctScheduler::new_from_seed(seed, 3, n));
}
