//! Many threads at once on one pool, with the background cleaner and
//! checkpoints running: each thread owns a region of the volume and checks
//! every read against its own model; at the end the pool is closed,
//! reopened and checked whole.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{Model, SimPool};
use lograid::device::SimRng;
use lograid::PoolOptions;
use std::sync::{Arc, Mutex};

#[test]
fn threads_cleaner_and_checkpoints_together() {
    let options = PoolOptions {
        io_threads: 4,
        checkpoint_interval_blocks: 2048,
        max_inflight_rows: 8,
        max_inflight_bytes: 16 << 20,
        background_cleaner: true,
        discard: true,
        ..Default::default()
    };
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.85, options);
    let size = pool.volume_size();
    let threads = 4u64;
    let region = size / threads / 4096 * 4096;
    let model = Arc::new(Mutex::new(Model::new(size)));
    let vol = pool.volume().clone();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let vol = vol.clone();
            let model = model.clone();
            scope.spawn(move || {
                let mut rng = SimRng(1000 + t);
                let base = t * region;
                for op in 0..3000 {
                    let len = (rng.below(16) + 1) * 512;
                    let off = base + rng.below((region - len) / 512) * 512;
                    match rng.below(10) {
                        0..=5 => {
                            let data = model.lock().unwrap().write(off, len);
                            vol.write(off, &data)
                                .unwrap_or_else(|e| panic!("thread {t} op {op}: write: {e}"));
                        }
                        6..=7 => {
                            let mut buf = vec![0u8; len as usize];
                            vol.read(off, &mut buf)
                                .unwrap_or_else(|e| panic!("thread {t} op {op}: read: {e}"));
                            model
                                .lock()
                                .unwrap()
                                .check_exact(off, &buf)
                                .unwrap_or_else(|m| panic!("thread {t} op {op}: {m}"));
                        }
                        8 => {
                            vol.trim(off, len).unwrap();
                            model.lock().unwrap().trim(off, len);
                        }
                        _ => vol
                            .flush()
                            .unwrap_or_else(|e| panic!("thread {t} op {op}: flush: {e}")),
                    }
                }
            });
        }
    });
    pool.pool()
        .check_invariants()
        .expect("invariants after the threads");
    let all = pool.read_all().expect("read all");
    let mut model = Arc::try_unwrap(model)
        .ok()
        .expect("sole owner")
        .into_inner()
        .unwrap();
    model.check_exact(0, &all).expect("contents");
    let pool = pool.reopen_clean().expect("reopen");
    let all = pool.read_all().expect("read all after reopen");
    model.check_exact(0, &all).expect("contents after reopen");
}
