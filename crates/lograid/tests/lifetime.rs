//! Hot and cold data apart: once the cleaner has run, an overwrite of a
//! block whose previous version lived long goes to the cleaner's head
//! (beside relocated data) instead of the user head. Recovery applies rows
//! in sequence order, and rows get their numbers when sealed, so two heads
//! holding versions of one block must not be sealed out of order: these
//! tests put a long-lived block in the cleaner head's open row, act on it
//! from the user head's side, cut the power, and check the newest version
//! (or the trim) is what comes back.

mod common;

use common::{pattern, Model, SimPool};
use lograid::device::{CrashMode, PowerCut, SimRng};
use lograid::PoolOptions;

const BLOCK: u64 = 4096;
/// Blocks at the start of the volume overwritten over and over (hot).
const HOT_BLOCKS: u64 = 16;

/// A pool whose volume was written whole once (cold), then whose first
/// `HOT_BLOCKS` blocks were overwritten round after round with the cleaner
/// emptying segments, so that it knows how long hot blocks live.
fn pool_with_hot_and_cold() -> SimPool {
    pool_with_hot_and_cold_options(4 << 20, PoolOptions::default())
}

/// Members large enough for a cold head (at least 64 segments of 64 KiB).
const COLD_HEAD_MEMBER_BYTES: u64 = 6 << 20;

fn pool_with_hot_and_cold_options(member_bytes: u64, options: PoolOptions) -> SimPool {
    let p = SimPool::create_with_options(3, 1, member_bytes, 0.6, options);
    let vol = p.volume();
    let blocks = vol.size_bytes() / BLOCK;
    for b in 0..blocks {
        vol.write(b * BLOCK, &pattern(1, 1)).expect("fill");
    }
    vol.flush().expect("flush");
    hot_rounds(&p);
    p
}

/// Overwrites the first `HOT_BLOCKS` blocks round after round, the
/// cleaner emptying a segment after each: the pool learns how long hot
/// blocks live.
fn hot_rounds(p: &SimPool) {
    for round in 0..24u8 {
        hot_round(p, 2 + round, 1);
    }
}

/// Overwrites the first `HOT_BLOCKS` blocks with `tag`, flushes, and has
/// the cleaner empty up to `segments` segments.
fn hot_round(p: &SimPool, tag: u8, segments: usize) {
    for b in 0..HOT_BLOCKS {
        p.volume()
            .write(b * BLOCK, &pattern(tag, 1))
            .expect("hot write");
    }
    p.volume().flush().expect("flush");
    p.pool().clean(segments).expect("clean");
}

fn long_lived_blocks(p: &SimPool) -> u64 {
    p.pool().status().cleaner.long_lived_written_bytes / BLOCK
}

/// The last block of the volume: written once by the fill, long ago.
fn cold_block(p: &SimPool) -> u64 {
    p.volume().size_bytes() / BLOCK - 1
}

/// Overwrites block `b` (written long ago) with `tag`; checks it went to
/// the cleaner's head.
fn write_long_lived(p: &SimPool, b: u64, tag: u8) {
    let before = long_lived_blocks(p);
    p.volume()
        .write(b * BLOCK, &pattern(tag, 1))
        .expect("write");
    assert_eq!(
        long_lived_blocks(p),
        before + 1,
        "setup: block {b} went to the cleaner's head"
    );
}

fn read_block(p: &SimPool, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK as usize];
    p.volume().read(b * BLOCK, &mut buf).expect("read");
    buf
}

#[test]
fn an_overwrite_of_long_lived_data_goes_beside_relocated_data() {
    let p = pool_with_hot_and_cold();
    let before = long_lived_blocks(&p);
    let x = cold_block(&p);
    p.volume().write(x * BLOCK, &pattern(90, 1)).expect("write");
    assert_eq!(
        long_lived_blocks(&p),
        before + 1,
        "the overwrite of a block written long ago goes to the cleaner's head"
    );
    let hot_before = long_lived_blocks(&p);
    p.volume().write(0, &pattern(91, 1)).expect("hot overwrite");
    assert_eq!(
        long_lived_blocks(&p),
        hot_before,
        "an overwrite of a block rewritten moments ago stays in the user head"
    );
    p.pool().check_invariants().expect("invariants");
}

#[test]
fn a_trim_after_a_long_lived_overwrite_survives_a_power_cut() {
    let p = pool_with_hot_and_cold();
    let x = cold_block(&p);
    write_long_lived(&p, x, 90);
    // The trim goes to the user head; the block's data sits in the
    // cleaner head's open row.
    p.volume().trim(x * BLOCK, BLOCK).expect("trim");
    p.volume().write(BLOCK, &pattern(92, 1)).expect("hot write");
    p.volume().flush().expect("flush");
    let mut rng = SimRng(5);
    let p = p.crash(CrashMode::DropAll, &mut rng).expect("reopen");
    assert_eq!(
        read_block(&p, x),
        vec![0u8; BLOCK as usize],
        "the trimmed block stays trimmed after recovery"
    );
    assert_eq!(read_block(&p, 1), pattern(92, 1));
    p.pool().check_invariants().expect("invariants");
}

#[test]
fn a_second_overwrite_of_a_long_lived_block_survives_a_power_cut() {
    let p = pool_with_hot_and_cold();
    let x = cold_block(&p);
    write_long_lived(&p, x, 90);
    // Its current version is in the cleaner head's open row: the next
    // write follows it there, whatever its age says.
    p.volume()
        .write(x * BLOCK, &pattern(93, 1))
        .expect("rewrite");
    p.volume()
        .write(2 * BLOCK, &pattern(94, 1))
        .expect("hot write");
    p.volume().flush().expect("flush");
    let mut rng = SimRng(6);
    let p = p.crash(CrashMode::DropAll, &mut rng).expect("reopen");
    assert_eq!(read_block(&p, x), pattern(93, 1), "the newest version");
    assert_eq!(read_block(&p, 2), pattern(94, 1));
    p.pool().check_invariants().expect("invariants");
}

/// Overwrites need no new room, so a pool within its usable capacity never
/// refuses one, even when they all go to the cleaner's head (each must
/// move the clock `SpaceStalls` watches, or a long overwrite of long-lived
/// data looks like a pool that stopped moving).
#[test]
fn a_large_overwrite_of_long_lived_data_is_not_refused() {
    let p = SimPool::create(3, 1, 32 << 20, 0.9);
    let vol = p.volume();
    let blocks = vol.size_bytes() / BLOCK;
    // Scattered fill: the overwrite empties segments only by cleaning.
    let mut order: Vec<u64> = (0..blocks).collect();
    let mut rng = SimRng(42);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for b in order {
        vol.write(b * BLOCK, &pattern(1, 1)).expect("fill");
    }
    vol.flush().expect("flush");
    hot_rounds(&p);
    // Time passes on the user-append clock (in-place rewrites of block 0).
    for i in 0..200 * blocks {
        vol.write(0, &pattern((i % 200) as u8, 1))
            .expect("hot write");
    }
    let before = long_lived_blocks(&p);
    let data = pattern(100, (blocks - HOT_BLOCKS) as usize);
    vol.write(HOT_BLOCKS * BLOCK, &data)
        .expect("an overwrite of blocks the volume holds is not refused");
    assert!(
        long_lived_blocks(&p) > before,
        "setup: went to the cleaner's head"
    );
    p.pool().check_invariants().expect("invariants");
}

/// Random whole and sub-block writes, trims, write-zeroes, flushes,
/// cleaning and checkpoints, biased towards blocks written moments ago (so
/// versions meet in the open rows of both heads), with power cuts: every
/// flushed write survives and nothing unflushed comes back wrong. Frequent
/// flushes and rare checkpoints keep it sensitive to the ordering rules.
#[test]
fn random_crashes_with_long_lived_data() {
    for seed in 0..40u64 {
        let mut rng = SimRng(seed * 7919 + 1);
        let mut p = SimPool::create(3, 1, 4 << 20, 0.5);
        let size = p.volume_size();
        let blocks = size / BLOCK;
        let mut model = Model::new(size);
        for b in 0..blocks {
            let d = model.write(b * BLOCK, BLOCK);
            p.volume().write(b * BLOCK, &d).expect("fill");
        }
        p.volume().flush().expect("flush");
        model.flushed();
        let mut recent: Vec<u64> = Vec::new();
        for crash in 0..3 {
            for i in 0..400u64 {
                let dice = rng.below(100);
                let hot = rng.below(4) != 0;
                let b = if !recent.is_empty() && rng.below(3) == 0 {
                    recent[rng.below(recent.len() as u64) as usize]
                } else if hot {
                    rng.below(16)
                } else {
                    rng.below(blocks)
                };
                recent.push(b);
                if recent.len() > 8 {
                    recent.remove(0);
                }
                if dice < 45 {
                    let n = 1 + rng.below(3).min(blocks - b - 1);
                    let d = model.write(b * BLOCK, n * BLOCK);
                    p.volume().write(b * BLOCK, &d).expect("write");
                } else if dice < 55 {
                    let off = b * BLOCK + rng.below(8) * 512;
                    let len = ((1 + rng.below(3)) * 512).min(size - off);
                    let d = model.write(off, len);
                    p.volume().write(off, &d).expect("sub-block write");
                } else if dice < 63 {
                    let n = 1 + rng.below(4).min(blocks - b - 1);
                    p.volume().trim(b * BLOCK, n * BLOCK).expect("trim");
                    model.trim(b * BLOCK, n * BLOCK);
                } else if dice < 70 {
                    let off = b * BLOCK + rng.below(8) * 512;
                    let len = ((1 + rng.below(12)) * 512).min(size - off);
                    p.volume()
                        .write_zeroes(off, len, rng.below(2) == 0)
                        .expect("write zeroes");
                    model.zero(off, len);
                } else if dice < 97 {
                    p.volume().flush().expect("flush");
                    model.flushed();
                } else if dice < 99 {
                    p.pool().clean(1).expect("clean");
                    model.flushed();
                } else if i % 7 == 0 {
                    p.pool().checkpoint().expect("checkpoint");
                    model.flushed();
                }
            }
            p.pool().check_invariants().expect("invariants");
            let mode = [
                CrashMode::KeepRandomSubset,
                CrashMode::TearOne,
                CrashMode::DropAll,
            ][crash % 3];
            p = p.crash(mode, &mut rng).expect("reopen");
            p.pool()
                .check_invariants()
                .expect("invariants after reopen");
            let data = p.read_all().expect("read");
            if let Err(e) = model.after_crash(&data) {
                panic!("seed {seed} crash {crash}: {e}");
            }
        }
    }
}

fn cold_written_blocks(p: &SimPool) -> u64 {
    p.pool().status().cleaner.cold_written_bytes / BLOCK
}

/// Cleans segment after segment with the hot blocks rewritten between,
/// until the cleaner has moved blocks a second time (to the cold head).
fn clean_until_moved_again(p: &SimPool) {
    for round in 0..64u8 {
        if cold_written_blocks(p) > 0 {
            return;
        }
        hot_round(p, 100 + round, 4);
    }
    panic!("setup: nothing was moved to the cold head");
}

/// Blocks the cleaner moves a second time go to the cold head, and what
/// it holds comes back after a power cut, flushed or not: the pool holds
/// the same bytes as a model of every write.
#[test]
fn blocks_moved_again_go_to_the_cold_head_and_survive_a_power_cut() {
    for (seed, mode) in [
        (1, CrashMode::DropAll),
        (2, CrashMode::KeepRandomSubset),
        (3, CrashMode::TearOne),
    ] {
        let p = pool_with_hot_and_cold_options(COLD_HEAD_MEMBER_BYTES, PoolOptions::default());
        clean_until_moved_again(&p);
        let again = p.pool().status().cleaner.relocated_again_bytes / BLOCK;
        assert!(
            again >= cold_written_blocks(&p),
            "only blocks moved again go to the cold head ({again} moved again)"
        );
        let before = p.read_all().expect("read");
        // More moves into the cold head, the last ones not flushed by a
        // user flush (the pass flushes its own moves).
        p.pool().clean(4).expect("clean");
        let mut rng = SimRng(seed);
        let p = p.crash(mode, &mut rng).expect("reopen");
        p.pool().check_invariants().expect("invariants");
        assert!(
            p.read_all().expect("read") == before,
            "{mode:?}: moves change no byte, across a power cut"
        );
    }
}

/// A pool opened again keeps moving blocks to the cold head (its place is
/// in the checkpoints), and a power cut after more moves loses nothing.
#[test]
fn the_cold_head_continues_after_a_reopen_and_a_power_cut() {
    let p = pool_with_hot_and_cold_options(COLD_HEAD_MEMBER_BYTES, PoolOptions::default());
    clean_until_moved_again(&p);
    let p = p.reopen_clean().expect("reopen");
    assert_eq!(cold_written_blocks(&p), 0, "counted since opened");
    clean_until_moved_again(&p);
    let before = p.read_all().expect("read");
    p.pool().clean(4).expect("clean");
    let mut rng = SimRng(9);
    let p = p.crash(CrashMode::DropAll, &mut rng).expect("reopen");
    p.pool().check_invariants().expect("invariants");
    assert!(p.read_all().expect("read") == before);
}

/// The power cut at every point of cleaning passes that move blocks to the
/// cold head (after its rows, between them and the pass's checkpoint, in the
/// checkpoint): recovery follows the cold head's chain, and no segment it
/// emptied is reused before its moves are durable. Freed segments are
/// discarded (zeroed on the simulated drives), so one reused or read too
/// early shows as lost data.
#[test]
fn power_cuts_during_moves_to_the_cold_head_lose_nothing() {
    let options = PoolOptions {
        discard: true,
        checkpoint_interval_blocks: 1 << 20,
        ..Default::default()
    };
    let mut cuts_in_passes = 0;
    for budget in (10..2000).step_by(41) {
        let p = pool_with_hot_and_cold_options(COLD_HEAD_MEMBER_BYTES, options.clone());
        clean_until_moved_again(&p);
        let before = p.read_all().expect("read");
        let cold_before = cold_written_blocks(&p);
        let cut = PowerCut::after(budget);
        for s in &p.sims {
            s.power_cut_after(cut.clone());
        }
        // Hot blocks rewritten with the bytes they hold (the volume stays
        // `before`), flushed, and a pass, until the power is cut.
        for _ in 0..40 {
            let hot = &before[..(HOT_BLOCKS * BLOCK) as usize];
            let done = p.volume().write(0, hot).is_ok()
                && p.volume().flush().is_ok()
                && p.pool().clean(4).is_ok();
            if !done || cut.tripped() {
                break;
            }
        }
        if cut.tripped() && cold_written_blocks(&p) > cold_before {
            cuts_in_passes += 1;
        }
        let mut rng = SimRng(budget);
        let images = p.images_now(CrashMode::DropAll, &mut rng);
        drop(p);
        let p = SimPool::open_images(images, options.clone()).expect("reopen");
        p.pool().check_invariants().expect("invariants");
        assert!(
            p.read_all().expect("read") == before,
            "power cut after {budget} member I/Os: the volume changed"
        );
    }
    assert!(
        cuts_in_passes > 5,
        "setup: {cuts_in_passes} cuts after moves to the cold head"
    );
}

/// Random 4 KiB overwrites of a volume filled whole, flushed every 64,
/// six times its size: none refused. `hot`: 90% of them on a tenth of it.
fn overwrite_nearly_full(segments: u64, fill: f64, hot: bool, seed: u64) -> Result<(), String> {
    // 64 KiB segments per member in `SimPool`, past 1 MiB of superblocks.
    let p = SimPool::create(3, 1, (1 << 20) + segments * 65536 + 8192, fill);
    let size = p.volume_size();
    let blocks = size / BLOCK;
    let mut model = Model::new(size);
    let mut rng = SimRng(seed);
    for b in (0..blocks).step_by(16) {
        let n = 16.min(blocks - b);
        let d = model.write(b * BLOCK, n * BLOCK);
        p.volume()
            .write(b * BLOCK, &d)
            .map_err(|e| format!("fill: {e}"))?;
    }
    for i in 0..6 * blocks {
        let b = if hot && rng.below(10) < 9 {
            rng.below((blocks / 10).max(1))
        } else {
            rng.below(blocks)
        };
        let d = model.write(b * BLOCK, BLOCK);
        p.volume().write(b * BLOCK, &d).map_err(|e| {
            let st = p.pool().status();
            format!(
                "overwrite {i} of {}: {e} ({} segments free)",
                6 * blocks,
                st.segments_free
            )
        })?;
        if i % 64 == 63 {
            p.volume().flush().map_err(|e| e.to_string())?;
        }
    }
    model.check_exact(0, &p.read_all().map_err(|e| e.to_string())?)?;
    p.pool().check_invariants().map_err(|e| e.to_string())
}

/// Pools large enough to have a cold head keep its two segments in reserve,
/// so that a nearly full one takes overwrites as one without it does.
#[test]
fn nearly_full_pools_take_overwrites_with_or_without_a_cold_head() {
    let mut failed = Vec::new();
    for segments in [40, 64, 96] {
        for fill in [0.85, 0.9] {
            for hot in [false, true] {
                if let Err(e) = overwrite_nearly_full(segments, fill, hot, segments) {
                    failed.push(format!("{segments} segments, {fill} full, hot {hot}: {e}"));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
