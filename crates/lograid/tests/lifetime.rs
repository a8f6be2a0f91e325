//! Hot and cold data apart: once the cleaner has run, an overwrite of a
//! block whose previous version lived long goes to the cleaner's head
//! (beside relocated data) instead of the user head. Recovery applies rows
//! in sequence order, and rows get their numbers when sealed, so two heads
//! holding versions of one block must not be sealed out of order: these
//! tests put a long-lived block in the cleaner head's open row, act on it
//! from the user head's side, cut the power, and check the newest version
//! (or the trim) is what comes back.

mod common;

use common::{pattern, SimPool};
use lograid::device::{CrashMode, SimRng};

const BLOCK: u64 = 4096;
/// Blocks at the start of the volume overwritten over and over (hot).
const HOT_BLOCKS: u64 = 16;

/// A pool whose volume was written whole once (cold), then whose first
/// `HOT_BLOCKS` blocks were overwritten round after round with the cleaner
/// emptying segments, so that it knows how long hot blocks live.
fn pool_with_hot_and_cold() -> SimPool {
    let p = SimPool::create(3, 1, 4 << 20, 0.6);
    let vol = p.volume();
    let blocks = vol.size_bytes() / BLOCK;
    for b in 0..blocks {
        vol.write(b * BLOCK, &pattern(1, 1)).expect("fill");
    }
    vol.flush().expect("flush");
    for round in 0..24u8 {
        for b in 0..HOT_BLOCKS {
            vol.write(b * BLOCK, &pattern(2 + round, 1))
                .expect("hot write");
        }
        vol.flush().expect("flush");
        p.pool().clean(1).expect("clean");
    }
    p
}

fn long_lived_blocks(p: &SimPool) -> u64 {
    p.pool().status().cleaner.long_lived_written_bytes / BLOCK
}

/// The last block of the volume: written once by the fill, long ago.
fn cold_block(p: &SimPool) -> u64 {
    p.volume().size_bytes() / BLOCK - 1
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
    let before = long_lived_blocks(&p);
    p.volume().write(x * BLOCK, &pattern(90, 1)).expect("write");
    assert_eq!(
        long_lived_blocks(&p),
        before + 1,
        "setup: in the cleaner's head"
    );
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
    let before = long_lived_blocks(&p);
    p.volume().write(x * BLOCK, &pattern(90, 1)).expect("write");
    assert_eq!(
        long_lived_blocks(&p),
        before + 1,
        "setup: in the cleaner's head"
    );
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
