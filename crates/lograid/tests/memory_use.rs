//! The engine's memory by kind in `status` (`memory`): each kind follows
//! what the engine holds, and the total is their sum.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{pattern, SimPool};
use lograid::MemoryUse;

const BLOCK: u64 = lograid::format::BLOCK_BYTES;

fn memory(pool: &SimPool) -> MemoryUse {
    let status = pool.pool().status();
    let m = status.memory.clone();
    assert_eq!(m.map_bytes, status.map_memory_bytes);
    assert_eq!(
        m.total_bytes,
        m.map_bytes
            + m.open_row_bytes
            + m.in_flight_row_bytes
            + m.kept_row_bytes
            + m.held_write_bytes
            + m.column_buffer_bytes
            + m.scratch_bytes
    );
    assert_eq!(m.held_write_bytes, status.overlay_blocks as u64 * BLOCK);
    m
}

#[test]
fn memory_by_kind_follows_rows_maps_and_held_writes() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let empty = memory(&pool);
    assert_eq!(empty.map_bytes, 0);
    assert_eq!(empty.open_row_bytes, 0);
    assert_eq!(empty.in_flight_row_bytes, 0);
    assert_eq!(empty.held_write_bytes, 0);

    // One block: an open row and a map page.
    pool.volume().write(0, &pattern(1, 1)).unwrap();
    let one = memory(&pool);
    assert!(one.open_row_bytes > 0, "{one:?}");
    assert!(one.map_bytes > 0, "{one:?}");

    // Many rows written and flushed: nothing open or in flight, buffers kept.
    let blocks = 400;
    pool.volume()
        .write(0, &pattern(2, blocks as usize))
        .unwrap();
    pool.volume().flush().unwrap();
    let flushed = memory(&pool);
    assert_eq!(flushed.open_row_bytes, 0, "{flushed:?}");
    assert_eq!(flushed.in_flight_row_bytes, 0, "{flushed:?}");
    assert!(flushed.kept_row_bytes > 0, "{flushed:?}");
    assert!(flushed.map_bytes >= one.map_bytes, "{flushed:?}");

    // A sub-block write is held as its block until merged.
    pool.volume().write(BLOCK * 3, &[7u8; 512]).unwrap();
    let held = memory(&pool);
    assert_eq!(held.held_write_bytes, BLOCK, "{held:?}");
    pool.volume().flush().unwrap();
    assert_eq!(memory(&pool).held_write_bytes, 0);

    // A scrub reads whole rows into column buffers and keeps them for the
    // next rows: at most two rows' columns (three members here).
    assert_eq!(memory(&pool).column_buffer_bytes, 0);
    pool.pool().scrub(false, |_, _| true).unwrap();
    let scrubbed = memory(&pool);
    let column = scrubbed.column_buffer_bytes / 3;
    assert!(column > 0, "{scrubbed:?}");
    assert!(scrubbed.column_buffer_bytes <= 6 * column, "{scrubbed:?}");
}

#[test]
fn degraded_reads_keep_scratch_buffers_within_their_bound() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let data: Vec<u8> = (0..64u8).flat_map(|i| pattern(i, 1)).collect();
    pool.volume().write(0, &data).unwrap();
    pool.volume().flush().unwrap();
    assert_eq!(memory(&pool).scratch_bytes, 0);
    // Member 0 gone: a third of the blocks are rebuilt from their rows,
    // each 4 KiB read one at a time on this thread.
    pool.sims[0].set_dead(true);
    let mut buf = vec![0u8; BLOCK as usize];
    for i in 0..64u8 {
        pool.volume().read(u64::from(i) * BLOCK, &mut buf).unwrap();
        assert_eq!(buf, pattern(i, 1), "block {i}");
    }
    let degraded = memory(&pool);
    // The columns of one rebuild, kept for the next (three members: two
    // read, one rebuilt, and the request's own buffer), never past the bound.
    assert!(degraded.scratch_bytes >= 2 * BLOCK, "{degraded:?}");
    assert!(
        degraded.scratch_bytes <= lograid::device::SCRATCH_KEEP_BYTES as u64,
        "{degraded:?}"
    );
}
