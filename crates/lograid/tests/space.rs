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
