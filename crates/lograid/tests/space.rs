//! Space: a volume larger than the pool fills it up, gets ENOSPC, and loses
//! nothing already written; trimming frees space for new writes; a volume
//! that fits is overwritten many times over without running out (the
//! cleaner keeps up). A degraded pool (narrower rows) holds less: its
//! status says so, and filled past that it refuses new blocks promptly
//! instead of crawling, and gets its capacity back with a replacement.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{Model, SimPool};
use lograid::device::{CrashMode, SimRng};

#[test]
fn full_pool_refuses_writes_and_loses_nothing() {
    // Overcommitted: the volume is twice what the pool can store.
    let mut pool = SimPool::create(3, 1, 8 << 20, 2.0);
    let size = pool.volume_size();
    let mut model = Model::new(size);
    let chunk = 64 * 1024;
    let mut off = 0;
    let mut hit_full = false;
    while off + chunk <= size {
        let data = model.write(off, chunk);
        match pool.volume().write(off, &data) {
            Ok(()) => {}
            Err(lograid::Error::NoSpace) => {
                model.forget_last_write();
                hit_full = true;
                break;
            }
            Err(e) => panic!("write at {off}: {e}"),
        }
        off += chunk;
    }
    assert!(
        hit_full,
        "an overcommitted volume never reported the pool full"
    );
    assert!(
        off > size / 4,
        "pool reported full far too early: {off} of {size}"
    );
    // Nothing already written is harmed, before and after a flush, and across a crash.
    let all = pool.read_all().expect("read after ENOSPC");
    model
        .check_exact(0, &all)
        .expect("data intact after ENOSPC");
    pool.volume().flush().expect("flush of a full pool");
    model.flushed();
    let mut rng = SimRng(7);
    pool = pool
        .crash(CrashMode::DropAll, &mut rng)
        .expect("reopen a full pool");
    let all = pool.read_all().expect("read after reopen");
    model.after_crash(&all).expect("data intact after reopen");
    // Further writes of new blocks still fail cleanly; overwrites still work.
    let data = model.write(off, chunk);
    assert!(matches!(
        pool.volume().write(off, &data),
        Err(lograid::Error::NoSpace)
    ));
    model.forget_last_write();
    let data = model.write(0, chunk);
    pool.volume()
        .write(0, &data)
        .expect("overwrite in a full pool");
    // Trimming frees space: new blocks can be written again.
    pool.volume().trim(chunk, off / 2).expect("trim");
    model.trim(chunk, off / 2);
    pool.volume().flush().expect("flush after trim");
    model.flushed();
    let data = model.write(off, chunk);
    pool.volume()
        .write(off, &data)
        .expect("write after trim freed space");
    let all = pool.read_all().expect("read");
    model
        .check_exact(0, &all)
        .expect("data after trim and write");
    pool.pool().check_invariants().expect("invariants");
}

#[test]
fn overwriting_a_volume_that_fits_never_runs_out() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.9);
    let size = pool.volume_size();
    let mut model = Model::new(size);
    let mut rng = SimRng(11);
    // Five times the volume in random 4-64 KiB writes, flushing now and then.
    let mut written = 0;
    let mut n = 0u64;
    while written < 5 * size {
        let len = (rng.below(16) + 1) * 4096;
        let off = rng.below((size - len) / 4096) * 4096;
        let data = model.write(off, len);
        pool.volume()
            .write(off, &data)
            .unwrap_or_else(|e| panic!("write {n} at {off} (+{len}) after {written} bytes: {e}"));
        written += len;
        n += 1;
        if n.is_multiple_of(64) {
            pool.volume().flush().expect("flush");
            model.flushed();
        }
    }
    let all = pool.read_all().expect("read");
    model.check_exact(0, &all).expect("contents");
    pool.pool().check_invariants().expect("invariants");
    let st = pool.pool().status();
    assert!(st.counters.relocated_blocks > 0, "the cleaner never ran");
}

/// Skewed overwrites whose hot tenth moves every time the volume's size is
/// written, at 75% full, with writers on several threads: the cleaner keeps
/// up (long-lived overwrites go to its head, victims wait for checkpoints)
/// and no write is refused while the pool has room. A writer whose cleaning
/// pass found the cleaner's head out of room (emptied segments waiting for
/// the checkpoint the pass then wrote) used to get ENOSPC at once.
#[test]
fn a_moving_hot_set_never_runs_out() {
    moving_hot_set(lograid::CleanerPolicy::CostBenefit);
}

#[test]
fn a_moving_hot_set_never_runs_out_greedy() {
    moving_hot_set(lograid::CleanerPolicy::Greedy);
}

fn moving_hot_set(policy: lograid::CleanerPolicy) {
    let options = lograid::PoolOptions {
        cleaner_policy: policy,
        ..common::test_options()
    };
    let pool = std::sync::Arc::new(SimPool::create_with_options(3, 1, 8 << 20, 0.75, options));
    let blocks = pool.volume_size() / 4096;
    let block = vec![7u8; 4096];
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (pool, block) = (pool.clone(), block.clone());
            scope.spawn(move || {
                let mut rng = SimRng(100 + t);
                let per_thread = 8 * blocks;
                for i in 0..per_thread {
                    // The hot tenth: the `i * 4 / blocks`-th, moving.
                    let tenth = (blocks / 10).max(1);
                    let phase = (i * 4 / blocks) % 10;
                    let b = if rng.below(10) < 9 {
                        (phase * tenth + rng.below(tenth)) % blocks
                    } else {
                        rng.below(blocks)
                    };
                    pool.volume()
                        .write(b * 4096, &block)
                        .unwrap_or_else(|e| panic!("thread {t}, write {i} at block {b}: {e}"));
                    if i.is_multiple_of(256) {
                        pool.volume().flush().expect("flush");
                    }
                }
            });
        }
    });
    pool.pool().check_invariants().expect("invariants");
    let st = pool.pool().status();
    assert!(
        st.cleaner.long_lived_written_bytes > 0,
        "no overwrite went to the cleaner's head"
    );
}

/// A writer stuck on a full pool (retrying on ENOSPC, as a filesystem's
/// writeback does) is freed by another volume being deleted, and, after
/// that space is used up too, by trims: the cleaner must reclaim what they
/// release with the pool at its floor, never deadlocking for lack of room.
#[test]
fn stuck_writer_on_a_full_pool_is_freed_by_delete_and_trim() {
    let options = lograid::PoolOptions {
        background_cleaner: true,
        ..common::test_options()
    };
    let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.6, options);
    let usable = pool.pool().status().usable_bytes / 4096 * 4096;
    let main = pool.volume().clone();
    let size = main.size_bytes();
    // A scratch volume takes the rest of the space.
    let scratch = pool
        .pool()
        .create_volume("scratch", usable)
        .expect("scratch volume");
    let block = vec![0x5au8; 64 * 1024];
    let mut off = 0;
    while off + block.len() as u64 <= usable {
        match scratch.write(off, &block) {
            Ok(()) => off += block.len() as u64,
            Err(lograid::Error::NoSpace) => break,
            Err(e) => panic!("scratch write: {e}"),
        }
    }
    scratch.flush().expect("flush scratch");
    // The writer fills the main volume with a known pattern, retrying while full.
    let writer = {
        let main = main.clone();
        std::thread::spawn(move || {
            let mut retries = 0u64;
            let mut off = 0u64;
            while off < size {
                let len = (64 * 1024).min(size - off);
                let data: Vec<u8> = (0..len).map(|i| ((off + i) / 4096 % 251) as u8).collect();
                match main.write(off, &data) {
                    Ok(()) => off += data.len() as u64,
                    Err(lograid::Error::NoSpace) => {
                        retries += 1;
                        assert!(retries < 20_000, "writer never got space back");
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(e) => panic!("main write at {off}: {e}"),
                }
            }
            main.flush().expect("flush main");
            retries
        })
    };
    // Let the writer get stuck, then free space: half by trim, then the rest by delete.
    std::thread::sleep(std::time::Duration::from_millis(200));
    scratch.trim(0, off / 2).expect("trim scratch");
    scratch.flush().expect("flush after trim");
    std::thread::sleep(std::time::Duration::from_millis(100));
    pool.pool()
        .delete_volume("scratch")
        .expect("delete scratch");
    let retries = writer.join().expect("writer thread");
    assert!(
        retries > 0,
        "the writer never found the pool full (test too weak)"
    );
    let mut buf = vec![0u8; size as usize];
    main.read(0, &mut buf).expect("read back");
    for (i, chunk) in buf.chunks(4096).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == (i % 251) as u8),
            "block {i} holds the wrong data"
        );
    }
    pool.pool().check_invariants().expect("invariants");
}

/// Data blocks of a full row of `k` data columns `chunk` blocks high (one
/// header block in these small rows).
fn row_slots(k: u64, chunk: u64) -> u64 {
    k * chunk - 1
}

/// Runs `body` and fails if it has not finished within `secs` seconds (a
/// hang detector: a single call that crawls is caught too).
fn within(secs: u64, body: impl FnOnce() + Send + 'static) {
    let (done, wait) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match wait.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => thread.join().expect("test body"),
        // The body panicked: report its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("not done after {secs} s: something crawls or hangs")
        }
    }
}

/// A pool 70% full loses a member: its rows get narrower (3 members, P=1:
/// one data column instead of two), so it now holds more than it can hold.
/// New blocks are refused at once (not after a crawl of cleaning), reads,
/// overwrites and trims go on, nothing is lost, and once the member is
/// replaced and the rebuild is done the pool has its full capacity again.
#[test]
fn degraded_pool_over_its_capacity_refuses_new_blocks_promptly() {
    within(20, || degraded_pool_over_its_capacity(false));
}

/// The same with the background cleaner running (as a served pool has it):
/// it must not spin on the degraded pool either.
#[test]
fn degraded_pool_over_its_capacity_with_the_background_cleaner() {
    within(20, || degraded_pool_over_its_capacity(true));
}

/// A degraded pool over its capacity: the pool, its volume and the model,
/// where the data written ends, and the status the pool had when healthy.
struct Degraded {
    pool: SimPool,
    vol: lograid::Volume,
    model: Model,
    size: u64,
    chunk: u64,
    /// The end of what the pool was filled with while healthy (70%).
    fill_end: u64,
    /// The end of what was written: new blocks go there.
    off: u64,
    healthy: lograid::PoolStatus,
}

fn degraded_pool_over_its_capacity(background_cleaner: bool) {
    let mut d = Degraded::filled_to_70_percent(background_cleaner);
    d.new_blocks_are_refused_once_a_member_fails();
    d.overwrites_and_reads_go_on();
    d.trims_give_room_back();
    d.replacement_gives_full_capacity_back();
}

impl Degraded {
    /// A healthy pool of 3 members (P=1), its volume filled to 70% and
    /// flushed.
    fn filled_to_70_percent(background_cleaner: bool) -> Degraded {
        let options = lograid::PoolOptions {
            background_cleaner,
            ..common::test_options()
        };
        let pool = SimPool::create_with_options(3, 1, 8 << 20, 1.0, options);
        let vol = pool.volume().clone();
        let size = pool.volume_size();
        let healthy = pool.pool().status();
        let mut model = Model::new(size);
        let chunk = 64 * 1024;
        let fill_end = size * 7 / 10 / chunk * chunk;
        let mut off = 0;
        while off < fill_end {
            let data = model.write(off, chunk);
            vol.write(off, &data)
                .unwrap_or_else(|e| panic!("fill at {off}: {e}"));
            off += chunk;
        }
        vol.flush().expect("flush");
        model.flushed();
        Degraded {
            pool,
            vol,
            model,
            size,
            chunk,
            fill_end,
            off,
            healthy,
        }
    }

    /// A member dies: new blocks are accepted until the fault is noticed,
    /// then refused, every time, at once; the status says degraded, with
    /// less usable than stored.
    fn new_blocks_are_refused_once_a_member_fails(&mut self) {
        let Degraded {
            pool,
            vol,
            model,
            size,
            chunk,
            off: end,
            healthy,
            ..
        } = self;
        let (size, chunk, mut off) = (*size, *chunk, *end);
        pool.sims[2].set_dead(true);
        // New blocks: accepted until the fault is noticed, then refused.
        let mut refused = false;
        while off + chunk <= size {
            let data = model.write(off, chunk);
            match vol.write(off, &data).and_then(|()| vol.flush()) {
                Ok(()) => off += chunk,
                Err(lograid::Error::NoSpace) => {
                    model.forget_last_write();
                    refused = true;
                    break;
                }
                Err(e) => panic!("write of new blocks at {off} after the fault: {e}"),
            }
        }
        *end = off;
        assert!(
            refused,
            "the degraded pool took a volume of its healthy size"
        );
        model.flushed();
        let degraded = pool.pool().status();
        assert!(degraded.state.starts_with("degraded"), "{}", degraded.state);
        assert!(
            degraded.usable_bytes < healthy.usable_bytes * 6 / 10,
            "usable {} degraded, {} healthy",
            degraded.usable_bytes,
            healthy.usable_bytes
        );
        assert!(degraded.stored_bytes > degraded.usable_bytes);
        assert_eq!(degraded.free_bytes, 0);
        // Still refused, every time, at once.
        for _ in 0..20 {
            let data = model.write(off, chunk);
            assert!(matches!(
                vol.write(off, &data),
                Err(lograid::Error::NoSpace)
            ));
            model.forget_last_write();
        }
    }

    /// Overwrites of stored blocks go through (until the cleaner cannot
    /// make room: then they are refused too, promptly), and everything
    /// reads back.
    fn overwrites_and_reads_go_on(&mut self) {
        let Degraded {
            pool,
            vol,
            model,
            fill_end,
            ..
        } = self;
        let fill_end = *fill_end;
        let mut rng = SimRng(5);
        let mut overwritten = 0;
        for i in 0..300 {
            let len = (rng.below(4) + 1) * 4096;
            let at = rng.below((fill_end - len) / 4096) * 4096;
            let data = model.write(at, len);
            match vol.write(at, &data) {
                Ok(()) => overwritten += 1,
                Err(lograid::Error::NoSpace) => model.forget_last_write(),
                Err(e) => panic!("overwrite {i} at {at}: {e}"),
            }
        }
        eprintln!("{overwritten} of 300 overwrites went through");
        assert!(
            overwritten >= 20,
            "only {overwritten} overwrites went through"
        );
        vol.flush().expect("flush");
        model.flushed();
        let all = pool.read_all().expect("read all degraded");
        model.check_exact(0, &all).expect("contents degraded");
    }

    /// Trims go through (their records may need the cleaner's reserve) and
    /// give room back.
    fn trims_give_room_back(&mut self) {
        let Degraded {
            pool,
            vol,
            model,
            chunk,
            fill_end,
            ..
        } = self;
        let (chunk, fill_end) = (*chunk, *fill_end);
        vol.trim(0, fill_end / 4)
            .expect("trim on the degraded pool");
        model.trim(0, fill_end / 4);
        vol.flush().expect("flush after trim");
        model.flushed();
        let data = model.write(fill_end / 2, chunk);
        vol.write(fill_end / 2, &data)
            .expect("overwrite after the trim");
        pool.pool().check_invariants().expect("invariants degraded");
    }

    /// Replace the failed member: full capacity again, new blocks fit, and
    /// everything reads back and scrubs clean.
    fn replacement_gives_full_capacity_back(self) {
        let Degraded {
            pool,
            vol,
            mut model,
            chunk,
            off,
            healthy,
            ..
        } = self;
        let new = std::sync::Arc::new(lograid::device::SimMember::new("new", 8 << 20));
        pool.pool()
            .replace_member(2, new)
            .expect("replace the failed member");
        pool.pool().reshape(|_, _| true).expect("rebuild");
        let after = pool.pool().status();
        assert_eq!(after.state, "online");
        assert!(after.reshape.is_none(), "{:?}", after.reshape);
        assert_eq!(after.capacity_bytes, healthy.capacity_bytes);
        assert_eq!(after.usable_bytes, healthy.usable_bytes);
        let data = model.write(off, chunk);
        vol.write(off, &data)
            .expect("new blocks after the replacement");
        vol.flush().expect("flush");
        model.flushed();
        let all = pool.read_all().expect("read all after the rebuild");
        model
            .check_exact(0, &all)
            .expect("contents after the rebuild");
        pool.pool().check_invariants().expect("invariants");
        let report = pool.pool().scrub(false, |_, _| true).expect("scrub");
        assert!(report.lost_blocks.is_empty() && report.unreadable_rows == 0);
    }
}

/// `status` of a degraded pool reports what its narrower rows hold: with 3
/// members and P=1, one data column where there were two; with 4, two
/// where there were three. Replacing the member gives it all back.
#[test]
fn degraded_status_reports_the_capacity_of_narrower_rows() {
    for members in [3u64, 4] {
        let pool = SimPool::create(members as usize, 1, 8 << 20, 0.2);
        let healthy = pool.pool().status();
        let data = vec![7u8; 64 * 1024];
        pool.sims[1].set_dead(true);
        for i in 0..8 {
            pool.volume()
                .write(i * data.len() as u64, &data)
                .expect("write");
            pool.volume().flush().expect("flush");
        }
        let degraded = pool.pool().status();
        assert!(degraded.state.starts_with("degraded"), "{}", degraded.state);
        let chunk = healthy.chunk_bytes / 4096;
        let ratio = row_slots(members - 2, chunk) as f64 / row_slots(members - 1, chunk) as f64;
        for (what, d, h) in [
            ("capacity", degraded.capacity_bytes, healthy.capacity_bytes),
            ("usable", degraded.usable_bytes, healthy.usable_bytes),
        ] {
            let got = d as f64 / h as f64;
            assert!(
                (got - ratio).abs() < 0.01,
                "{members} members: {what} {d} degraded, {h} healthy: ratio {got:.3}, expected {ratio:.3}"
            );
        }
        assert_eq!(
            degraded.free_bytes,
            degraded.usable_bytes - degraded.stored_bytes
        );
        let new = std::sync::Arc::new(lograid::device::SimMember::new("new", 8 << 20));
        pool.pool().replace_member(1, new).expect("replace");
        pool.pool().reshape(|_, _| true).expect("rebuild");
        let after = pool.pool().status();
        assert_eq!(after.state, "online");
        assert_eq!(after.capacity_bytes, healthy.capacity_bytes);
        assert_eq!(after.usable_bytes, healthy.usable_bytes);
    }
}

/// A pool that fits in its narrower rows after losing a member (3 members,
/// P=1, a third full): new blocks are taken at a normal pace until it is
/// full at the new width, then refused; overwrites go on while the cleaner
/// can make room and are refused at once when it cannot (as in a healthy
/// full pool), never a crawl; once data is trimmed, every overwrite goes
/// through again. Nothing is lost.
#[test]
fn degraded_pool_fills_to_its_new_capacity_then_overwrites_go_on() {
    within(20, || {
        let pool = SimPool::create(3, 1, 8 << 20, 1.0);
        let vol = pool.volume().clone();
        let size = pool.volume_size();
        let mut model = Model::new(size);
        let chunk = 64 * 1024;
        let fill_end = size / 3 / chunk * chunk;
        let mut off = 0;
        while off < fill_end {
            let data = model.write(off, chunk);
            vol.write(off, &data).expect("fill");
            off += chunk;
        }
        vol.flush().expect("flush");
        model.flushed();
        pool.sims[0].set_dead(true);
        // Random writes anywhere (new blocks and overwrites) until full.
        let mut rng = SimRng(17);
        let mut writes = 0u64;
        loop {
            let len = (rng.below(16) + 1) * 4096;
            let at = rng.below((size - len) / 4096) * 4096;
            let data = model.write(at, len);
            match vol.write(at, &data) {
                Ok(()) => writes += 1,
                Err(lograid::Error::NoSpace) => {
                    model.forget_last_write();
                    break;
                }
                Err(e) => panic!("write {writes} at {at}: {e}"),
            }
            if writes.is_multiple_of(64) {
                vol.flush().expect("flush");
                model.flushed();
            }
        }
        vol.flush().expect("flush");
        model.flushed();
        let st = pool.pool().status();
        assert!(st.state.starts_with("degraded"), "{}", st.state);
        assert!(
            st.stored_bytes <= st.usable_bytes && st.stored_bytes > st.usable_bytes * 9 / 10,
            "refused at {} stored of {} usable",
            st.stored_bytes,
            st.usable_bytes
        );
        // Full: overwrites of what was written first, each through or
        // refused at once.
        let mut overwritten = 0;
        for i in 0..500 {
            let len = (rng.below(4) + 1) * 4096;
            let at = rng.below((fill_end - len) / 4096) * 4096;
            let data = model.write(at, len);
            match vol.write(at, &data) {
                Ok(()) => overwritten += 1,
                Err(lograid::Error::NoSpace) => model.forget_last_write(),
                Err(e) => panic!("overwrite {i} of a full degraded pool: {e}"),
            }
            if i % 64 == 0 {
                vol.flush().expect("flush");
                model.flushed();
            }
        }
        assert!(
            overwritten >= 100,
            "only {overwritten} overwrites went through"
        );
        vol.flush().expect("flush");
        model.flushed();
        // With room again (half of the first third trimmed), every
        // overwrite goes through.
        vol.trim(0, fill_end / 2).expect("trim");
        model.trim(0, fill_end / 2);
        vol.flush().expect("flush");
        model.flushed();
        for i in 0..1000 {
            let len = (rng.below(4) + 1) * 4096;
            let at = fill_end / 2 + rng.below((fill_end / 2 - len) / 4096) * 4096;
            let data = model.write(at, len);
            vol.write(at, &data)
                .unwrap_or_else(|e| panic!("overwrite {i} after the trim: {e}"));
            if i % 64 == 0 {
                vol.flush().expect("flush");
                model.flushed();
            }
        }
        vol.flush().expect("flush");
        model.flushed();
        let all = pool.read_all().expect("read all");
        model.check_exact(0, &all).expect("contents");
        pool.pool().check_invariants().expect("invariants");
    });
}

/// Sub-block writes to new blocks were acknowledged with room reserved for
/// them; a member then fails and the pool holds less than what is stored
/// plus those reservations. The flush still stores them (it used to answer
/// ENOSPC: the soak found it), and every write reads back.
#[test]
fn acknowledged_sub_block_writes_are_stored_after_a_member_fails() {
    within(20, || {
        let pool = SimPool::create(3, 1, 8 << 20, 1.0);
        let vol = pool.volume().clone();
        let size = pool.volume_size();
        let usable_blocks = pool.pool().status().usable_bytes / 4096;
        let mut model = Model::new(size);
        // 45% of the healthy capacity in whole blocks; rows of 2 columns
        // (1 data) after the failure hold 50%.
        let whole = usable_blocks * 45 / 100;
        let chunk = 16u64;
        let mut b = 0;
        while b < whole {
            let n = chunk.min(whole - b);
            let data = model.write(b * 4096, n * 4096);
            vol.write(b * 4096, &data).expect("fill");
            b += n;
        }
        vol.flush().expect("flush");
        model.flushed();
        // 10% more as one sector in each of as many new blocks: held in
        // memory, their room reserved.
        let sub = usable_blocks * 10 / 100;
        for i in 0..sub {
            let at = (whole + i) * 4096 + 512 * (i % 8);
            let data = model.write(at, 512);
            vol.write(at, &data).expect("sub-block write");
        }
        // A member dies; whole-block overwrites make the pool notice.
        pool.sims[0].set_dead(true);
        let mut tries = 0;
        while !pool.pool().status().state.starts_with("degraded") {
            let data = model.write(0, 64 * 1024);
            vol.write(0, &data).expect("overwrite");
            tries += 1;
            assert!(tries < 10_000, "the pool never noticed the dead member");
        }
        let st = pool.pool().status();
        assert!(
            st.stored_bytes / 4096 + sub > st.usable_bytes / 4096,
            "the test must hold more than the degraded pool can: {} + {sub} blocks of {}",
            st.stored_bytes / 4096,
            st.usable_bytes / 4096
        );
        vol.flush().expect("flush of acknowledged sub-block writes");
        model.flushed();
        let all = pool.read_all().expect("read");
        model.check_exact(0, &all).expect("every write reads back");
    });
}
