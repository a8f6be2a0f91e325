//! Space: a volume larger than the pool fills it up, gets ENOSPC, and loses
//! nothing already written; trimming frees space for new writes; a volume
//! that fits is overwritten many times over without running out (the
//! cleaner keeps up).

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
