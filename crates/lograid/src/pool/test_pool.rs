//! Unit tests' pool: three simulated 8 MiB members (64 KiB segments, 16 KiB
//! chunks, parity 1, about 112 segments: enough for a cold head), a 1 MiB
//! volume `v`, no background threads. Owns nothing outside tests.

use crate::device::{CrashMode, Member, SimMember, SimRng};
use crate::pool::api::open_members;
use crate::pool::create::create_pool;
use crate::pool::{CreateOptions, Pool, PoolOptions, Volume};
use std::sync::Arc;

/// The options the pool is created (and may be reopened) with.
pub(crate) fn options() -> PoolOptions {
    PoolOptions {
        io_threads: 2,
        background_cleaner: false,
        background_resolver: false,
        ..Default::default()
    }
}

/// The pool, its volume `v`, and its members (for crash images).
pub(crate) fn sim_pool() -> (Pool, Volume, Vec<Arc<SimMember>>) {
    sim_pool_of(3)
}

/// `sim_pool` with `members` members.
pub(crate) fn sim_pool_of(members: usize) -> (Pool, Volume, Vec<Arc<SimMember>>) {
    let sims: Vec<Arc<SimMember>> = (0..members)
        .map(|i| Arc::new(SimMember::new(&format!("sim{i}"), 8 << 20)))
        .collect();
    let members: Vec<Arc<dyn Member>> = sims.iter().map(|s| s.clone() as _).collect();
    let create = CreateOptions {
        name: "t".into(),
        parity: 1,
        chunk_bytes: 16 * 1024,
        segment_bytes: Some(64 * 1024),
        force: true,
        initial_volume: Some(("v".into(), 1 << 20)),
    };
    let pool = create_pool(members, &create, options()).expect("create pool");
    let vol = pool.volume("v").expect("volume v");
    (pool, vol, sims)
}

/// The members as a power cut now would leave them (every write no flush
/// covered lost), opened again with `options`; with the new members.
pub(crate) fn power_cut(
    pool: Pool,
    sims: &[Arc<SimMember>],
    options: PoolOptions,
) -> (Pool, Vec<Arc<SimMember>>) {
    power_cut_keeping(pool, sims, options, &|_| false)
}

/// `power_cut`, where the members `keep` names keep all their unflushed
/// writes (the others none).
pub(crate) fn power_cut_keeping(
    pool: Pool,
    sims: &[Arc<SimMember>],
    options: PoolOptions,
    keep: &dyn Fn(usize) -> bool,
) -> (Pool, Vec<Arc<SimMember>>) {
    let sims = crash_images(sims, keep);
    drop(pool);
    let members: Vec<Arc<dyn Member>> = sims.iter().map(|s| s.clone() as _).collect();
    let pool = open_members(members, options, false).expect("reopen after the power cut");
    (pool, sims)
}

/// New members holding what a power cut now would leave of `sims`: the
/// members `keep` names keep all their unflushed writes, the others none.
pub(crate) fn crash_images(
    sims: &[Arc<SimMember>],
    keep: &dyn Fn(usize) -> bool,
) -> Vec<Arc<SimMember>> {
    let mut rng = SimRng(7);
    sims.iter()
        .enumerate()
        .map(|(i, s)| {
            let mode = if keep(i) {
                CrashMode::KeepAll
            } else {
                CrashMode::DropAll
            };
            let image = s.crash_image(mode, &mut rng);
            Arc::new(SimMember::from_image(&format!("sim{i}"), image))
        })
        .collect()
}
