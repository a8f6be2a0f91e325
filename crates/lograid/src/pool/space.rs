//! Space accounting: what the pool can hold (capacity at the width new rows
//! are written with, less a reserve), the free segments each writer must
//! leave (for checkpoints, then for the cleaner), and when a writer out of
//! room gives up (`SpaceStalls`). Pure arithmetic over the shape and the
//! ledger; no I/O, no locks of its own.

use super::ledger::{full_row_shape, Ledger};
use super::lifetime::COLD_HEAD_MIN_SEGMENTS;
use super::shape::Shape;
use crate::error::{Error, Result};
use crate::format::superblock::MemberState;
use crate::format::BLOCK_SIZE;
use crate::layout::Geometry;

impl Shape {
    /// Data blocks a full segment of `width` members holds.
    pub fn segment_capacity(&self, members_mask: u32, parity: u8) -> u64 {
        let width = members_mask.count_ones() as usize;
        if width <= parity as usize {
            return 0;
        }
        let k = width - parity as usize;
        let chunk = self.geometry.chunk_blocks as usize;
        let (_, slots) = full_row_shape(k, chunk);
        (self.geometry.segment_blocks as u64 / chunk as u64) * slots as u64
    }

    /// Segments to keep free for the checkpoint (the newest one stays until
    /// the next one is durable).
    pub fn checkpoint_segments_needed(&self, ledger: &Ledger) -> usize {
        let entries = ledger.stored_blocks + ledger.volumes.len() as u64 * 8;
        let rows: u64 = ledger.segments.iter().map(|s| s.rows.len() as u64).sum();
        let bytes = 4096 + entries * 12 + rows * 21 + ledger.segments.len() as u64 * 40;
        // Sized for the narrowest rows the pool may have to write: with
        // `parity` members lost, so that a checkpoint still fits after
        // members fail (the rows then hold less, and a full pool that could
        // not checkpoint could neither clean nor take a replacement).
        let mut worst = ledger.active_mask_full(&self.geometry);
        for _ in 0..self.parity() {
            if worst.count_ones() > 2 {
                worst &= worst - 1;
            }
        }
        let per_segment = self
            .segment_capacity(worst, self.segment_parity(worst))
            .max(1)
            * BLOCK_SIZE as u64;
        (bytes.div_ceil(per_segment) + 1) as usize
    }

    /// Free segments the cleaner may not use (left for checkpoints).
    pub fn cleaner_floor_segments(&self, ledger: &Ledger) -> usize {
        self.checkpoint_segments_needed(ledger)
    }

    /// Free segments user writes may not use (left for the cleaner).
    pub fn user_floor_segments(&self, ledger: &Ledger) -> usize {
        self.cleaner_floor_segments(ledger) + 2
    }
}

impl Ledger {
    fn active_mask_full(&self, geometry: &Geometry) -> u32 {
        geometry.segment_members(0, self.active_mask)
    }

    /// Members new rows may be laid over, now or once the superblocks
    /// record them: active ones (present and working) and joining ones.
    /// Faulted, missing, leaving and removed members are not.
    pub(crate) fn writable_members(&self) -> u32 {
        (self.active_mask & self.members_in(MemberState::Active))
            | self.members_in(MemberState::Joining)
    }

    /// Recomputes the pool's capacity from its member table: what every
    /// segment holds at the width new rows are written with now (over the
    /// writable members, see `writable_members`). A degraded pool's rows
    /// are narrower, so its capacity shrinks to what they hold, even for
    /// segments still holding wider rows: the cleaner rewrites those at the
    /// new width, and accounting them wider would let the pool take more
    /// than the cleaner can make room for. Called whenever the member set
    /// or the parity changes.
    pub(crate) fn update_capacity(&mut self, shape: &Shape) {
        let writable = self.writable_members();
        let segment_count = shape.geometry.segment_count();
        let at_width = |m: u32| shape.segment_capacity(m, shape.segment_parity(m));
        let capacity_blocks: u64 = (0..segment_count)
            .map(|s| shape.geometry.segment_members(s, writable))
            .filter(|&m| shape.segment_usable(m, writable))
            .map(at_width)
            .sum();
        let per_segment = at_width(shape.geometry.segment_members(0, writable));
        // Reserve: two segments per head (the cold head's where the pool is
        // large enough to have one), two for the cleaner, 5% slack, and a
        // checkpoint.
        let cold_head = if segment_count as usize >= COLD_HEAD_MIN_SEGMENTS {
            2
        } else {
            0
        };
        let reserve_segments = 8 + cold_head + (segment_count as u64).div_ceil(20);
        self.capacity_blocks = capacity_blocks;
        self.usable_blocks =
            capacity_blocks.saturating_sub(reserve_segments * per_segment) * 97 / 100;
    }
}

/// Times in a row a writer may call `make_space` while no user block is
/// appended anywhere in the pool before it gives up with ENOSPC. Cleaning
/// can reach a fixed point in a nearly full pool (each pass frees about
/// what its relocations and the checkpoint that releases the segment take):
/// without this bound the writer would clean forever. Writers that lose the
/// freed room to others do not count it against themselves: the pool moved.
const MAX_SPACE_STALLS: u32 = 16;

/// Counts a writer's calls to `make_space` with no progress in the pool.
#[derive(Default)]
pub(crate) struct SpaceStalls {
    stalls: u32,
    /// The pool's `Ledger::user_appends` at the last call.
    seen: Option<u64>,
}

impl SpaceStalls {
    /// Called before each `make_space`; `progress`: the pool's
    /// `Ledger::user_appends` now. ENOSPC after `MAX_SPACE_STALLS` calls in a row without
    /// any change.
    pub fn check(&mut self, progress: u64) -> Result<()> {
        if self.seen != Some(progress) {
            self.seen = Some(progress);
            self.stalls = 0;
        }
        self.stalls += 1;
        if self.stalls > MAX_SPACE_STALLS {
            tracing::debug!(
                "a writer found no free segment after cleaning {MAX_SPACE_STALLS} times \
                 with nothing written meanwhile: pool full"
            );
            return Err(Error::NoSpace);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_stalls_give_up_only_when_nothing_moves() {
        let mut s = SpaceStalls::default();
        for _ in 0..MAX_SPACE_STALLS {
            s.check(7).expect("within the bound");
        }
        assert!(matches!(s.check(7), Err(Error::NoSpace)));
        // Another writer appended meanwhile: the count starts again.
        let mut s = SpaceStalls::default();
        for round in 0..(3 * MAX_SPACE_STALLS as u64) {
            s.check(round / 4).expect("the pool moves every 4 calls");
        }
    }
}
