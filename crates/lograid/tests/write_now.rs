//! Writes taken at once (`Volume::try_write_now`, for callers on an event
//! loop): what one takes is a write like any other (read back, sealed into
//! rows, durable after a flush across a power cut), and what it cannot take
//! at once it leaves untouched for `write`, which says why.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{pattern, SimPool};
use lograid::device::{CrashMode, SimRng};
use lograid::Error;

const BLOCK: usize = lograid::format::BLOCK_SIZE;

#[test]
fn writes_taken_at_once_read_back_and_survive_a_power_cut_after_a_flush() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let blocks = pool.volume_size() as usize / BLOCK;
    let data = pattern(3, blocks);
    let mut taken = 0;
    // Backwards, so that rows hold blocks out of order; many rows are sealed.
    for b in (0..blocks).rev() {
        let block = &data[b * BLOCK..(b + 1) * BLOCK];
        let offset = (b * BLOCK) as u64;
        match pool.volume().try_write_now(offset, block) {
            Some(result) => {
                result.unwrap();
                taken += 1;
            }
            // The row writer's threads held the lock, rows in flight were
            // at their limit, or the head needed a segment.
            None => {
                assert!(b + 1 < blocks, "the first write into an idle pool is taken");
                pool.volume().write(offset, block).unwrap();
            }
        }
    }
    assert!(taken > 0);
    assert!(pool.read_all().unwrap() == data, "read back before the cut");
    pool.volume().flush().unwrap();
    let pool = pool.crash(CrashMode::DropAll, &mut SimRng(11)).unwrap();
    assert!(pool.read_all().unwrap() == data, "read back after the cut");
}

#[test]
fn what_cannot_be_taken_at_once_is_left_to_write() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let vol = pool.volume();
    let size = pool.volume_size();
    let block = pattern(5, 1);
    // Not one whole aligned block, or past the end: declined, and `write`
    // handles it (or says why not).
    assert!(vol.try_write_now(512, &block).is_none());
    assert!(vol.try_write_now(0, &pattern(5, 2)).is_none());
    assert!(vol.try_write_now(0, &block[..512]).is_none());
    assert!(vol.try_write_now(size, &block).is_none());
    assert!(matches!(
        vol.write(size, &block),
        Err(Error::OutOfRange { .. })
    ));
    // Nothing was written by the declined calls.
    assert!(pool.read_all().unwrap().iter().all(|&b| b == 0));
    // An offset whose end does not fit in 64 bits is declined, and the pool
    // goes on writing.
    let top = u64::MAX / BLOCK as u64 * BLOCK as u64;
    assert!(vol.try_write_now(top, &block).is_none());
    assert!(matches!(
        vol.write(top, &block),
        Err(Error::OutOfRange { .. })
    ));
    vol.write(0, &block).unwrap();
    assert!(!pool.pool().status().read_only);
    // A closed pool declines too; `write` says it is closed.
    pool.pool().close().unwrap();
    assert!(vol.try_write_now(0, &block).is_none());
    assert!(matches!(vol.write(0, &block), Err(Error::ReadOnly(_))));
}

#[test]
fn a_full_pool_declines_a_new_block_and_write_says_no_space() {
    // A volume larger than the pool holds (thin): it fills before its end.
    let pool = SimPool::create(3, 1, 4 << 20, 3.0);
    let vol = pool.volume();
    let block = pattern(9, 1);
    let mut b = 0u64;
    let no_space = loop {
        let offset = b * BLOCK as u64;
        match vol.try_write_now(offset, &block) {
            Some(result) => result.unwrap(),
            None => match vol.write(offset, &block) {
                Ok(()) => {}
                Err(e) => break (offset, e),
            },
        }
        b += 1;
    };
    assert!(matches!(no_space.1, Error::NoSpace), "{:?}", no_space.1);
    assert!(vol.try_write_now(no_space.0, &block).is_none());
    // What was written before the pool filled is intact.
    let mut buf = vec![0u8; BLOCK];
    for i in 0..b {
        vol.read(i * BLOCK as u64, &mut buf).unwrap();
        assert!(buf == block, "block {i}");
    }
}
