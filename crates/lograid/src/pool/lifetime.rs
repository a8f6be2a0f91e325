//! Separating data by expected lifetime: which log head a user block goes
//! to, so that segments hold blocks that die together and the cleaner finds
//! them nearly empty (skewed traffic then costs less than uniform).
//!
//! The rule infers a block's lifetime from its previous version, as SepBIT
//! does for cloud block storage, without a timestamp per block: every
//! segment keeps the mean time its blocks were written by users (`birth`,
//! on the clock of `Ledger::user_appends`; a relocated block keeps its
//! source segment's), and the pool keeps how old, on average, the segments
//! the cleaner empties are (`lifetime_threshold`). A block whose previous
//! version was younger than that when it was overwritten is likely to be
//! overwritten soon again: it goes to the user head with the other short-
//! lived data. One whose previous version lived longer goes to the
//! cleaner's head, beside the relocated blocks, which have lived long too.
//! New blocks go to the user head. Blocks the cleaner moves go to its
//! head the first time, and to the cold head when moved again (from a
//! segment the cleaner's or the cold head wrote): data that survived two
//! cleanings is the coldest, and kept apart its segments stay full (a model
//! of these rules, `bench/cleaner_model.py`, moves a fifth less under
//! skewed overwrites).
//!
//! Ordering: recovery applies rows in sequence order, and a row's number is
//! given when it is sealed, so a block whose current version still sits in
//! a head's open row is written to that same head (its rows are sealed in
//! order); a trim over such a block first seals that head's row
//! (`Ledger::seal_heads_holding`).
//!
//! Owns: the segments' birth estimates, the threshold and the choice of
//! head. In memory only: after a restart the threshold starts anew at the
//! first segment cleaned, and until then every write goes to the user head.

use super::ledger::Ledger;
use super::shape::Shape;
use crate::format::row::{EntryKind, HeadId};
use crate::layout::Pba;
use crate::map::Loc;
use std::sync::Arc;

/// Whether the cleaner's head may take user writes, for one batch of
/// writes: asked once (the floor walks the segment table), and only when a
/// block of the batch would go there.
#[derive(Default)]
pub struct LongLivedRoom(Option<bool>);

/// Pools with fewer segments have no cold head: it gains little there, and
/// its two segments (the one it fills and the next, reserved), which the
/// capacity keeps in reserve from here on (`update_capacity`), would be a
/// large part of a small pool.
pub const COLD_HEAD_MIN_SEGMENTS: usize = 64;

/// How many victims the threshold averages over, roughly (an exponential
/// moving average with this weight; SepBIT averages the last 16).
const THRESHOLD_VICTIMS: u64 = 16;

impl Ledger {
    /// The head a user write goes to, given where the block's current
    /// version is (`old`); `room`: the batch's answer to whether the
    /// cleaner's head may take user writes, asked only for a block that
    /// would go there.
    pub fn head_for_user_block(&self, old: Loc, room: &mut LongLivedRoom, shape: &Shape) -> HeadId {
        match old {
            Loc::Open { head, .. } => head,
            Loc::Disk(pba)
                if self.head_by_lifetime(pba, shape) == HeadId::Cleaner
                    && *room
                        .0
                        .get_or_insert_with(|| self.long_lived_head_open(shape)) =>
            {
                HeadId::Cleaner
            }
            _ => HeadId::User,
        }
    }

    /// The head a block the cleaner moves from segment `source` goes to:
    /// the cold head if the segment was written by the cleaner's heads and
    /// the cold head has a segment (it gets one when the pool is created or
    /// opened, where a checkpoint records it), else the cleaner's.
    pub fn head_for_moved_block(&self, source: u32) -> HeadId {
        let moved_before = self
            .segments
            .get(source as usize)
            .is_some_and(|s| matches!(s.written_by, HeadId::Cleaner | HeadId::Cold));
        if moved_before && self.heads[HeadId::Cold.index()].segment != super::ledger::NO_SEGMENT {
            HeadId::Cold
        } else {
            HeadId::Cleaner
        }
    }

    /// Gives the cold head its first segment and the reserved next one if it
    /// has none, the pool has at least `COLD_HEAD_MIN_SEGMENTS`, and two free
    /// segments more than a writer needs; true if it did. Only where a
    /// checkpoint follows before anything is written (the pool's creation,
    /// its opening): recovery follows a head's chain from where the
    /// checkpoint records it.
    pub fn prime_cold_head(&mut self, shape: &Shape) -> bool {
        let room = shape.user_floor_segments(self) + 1 + 2 + 2;
        self.heads[HeadId::Cold.index()].segment == super::ledger::NO_SEGMENT
            && self.segments.len() >= COLD_HEAD_MIN_SEGMENTS
            && self.free.len() >= room
            && self.prime_head(HeadId::Cold, shape).is_ok()
    }

    /// Whether user writes may go to the cleaner's head now: not while
    /// free segments are within one of the user floor (user writes filling
    /// that head would take the room the cleaner's moves need).
    fn long_lived_head_open(&self, shape: &Shape) -> bool {
        self.free.len() > shape.user_floor_segments(self) + 1
    }

    /// User head if the version at `pba` dies younger than the segments the
    /// cleaner empties live (or its segment is not dated: recovered after a
    /// restart), else the cleaner's.
    fn head_by_lifetime(&self, pba: Pba, shape: &Shape) -> HeadId {
        let (Some(threshold), Some((s, _))) = (
            self.lifetime_threshold,
            shape.geometry.segment_of(pba.block),
        ) else {
            return HeadId::User;
        };
        let seg = &self.segments[s as usize];
        let age = self.user_appends.saturating_sub(seg.birth);
        if seg.births == 0 || age < threshold {
            HeadId::User
        } else {
            HeadId::Cleaner
        }
    }

    /// The birth to count for a block appended with `kind` (`source`: a
    /// relocated block's old address, encoded).
    pub fn birth_of(&self, kind: EntryKind, source: u64, shape: &Shape) -> u64 {
        if kind != EntryKind::Relocated {
            return self.user_appends;
        }
        shape
            .geometry
            .segment_of(Pba::decode(source).block)
            .map_or(self.user_appends, |(s, _)| self.segments[s as usize].birth)
    }

    /// Counts a block born at `birth` into segment `s`'s mean.
    pub fn note_birth(&mut self, s: u32, birth: u64) {
        let seg = &mut self.segments[s as usize];
        let n = u64::from(seg.births) + 1;
        let mean = seg.birth as i128 + (birth as i128 - seg.birth as i128) / n as i128;
        seg.birth = mean.max(0) as u64;
        seg.births = seg.births.saturating_add(1);
    }

    /// The cleaner is about to empty segment `s`: its age moves the
    /// threshold (unless it is not dated: recovered after a restart).
    pub fn note_victim(&mut self, s: u32) {
        let seg = &self.segments[s as usize];
        if seg.births == 0 {
            return;
        }
        let age = self.user_appends.saturating_sub(seg.birth);
        self.lifetime_threshold = Some(match self.lifetime_threshold {
            None => age,
            Some(t) => (t * (THRESHOLD_VICTIMS - 1) + age) / THRESHOLD_VICTIMS,
        });
    }

    /// Seals the open row of the cleaner's heads (the cleaner's and the cold
    /// one, which takes a user write of a block still in its open row) if it
    /// holds user data for a block of `volume` in `lba..end`, so that a
    /// record the user head appends over them is replayed after it.
    /// (Relocated entries need not: they apply only if the map still points
    /// at their source.)
    pub fn seal_heads_holding(
        &mut self,
        volume: u32,
        lba: u64,
        end: u64,
        shape: &Shape,
    ) -> Vec<Arc<super::ledger::SealedRow>> {
        let mut sealed = Vec::new();
        for head in [HeadId::Cleaner, HeadId::Cold] {
            let held = self.heads[head.index()].open.as_ref().is_some_and(|row| {
                row.entries.iter().any(|e| {
                    e.kind == EntryKind::Data && e.volume == volume && (lba..end).contains(&e.lba)
                })
            });
            if held {
                sealed.extend(self.seal(head, shape));
            }
        }
        sealed
    }
}

#[cfg(test)]
mod tests {
    use crate::format::row::{Entry, EntryKind, HeadId};
    use crate::format::{crc32c, BLOCK_SIZE};
    use crate::map::Loc;

    /// A user write of a block whose current version is in the cold head's
    /// open row goes there too (rows are numbered when sealed); a trim after
    /// it seals that row first, so that recovery replays the trim last and
    /// the block stays trimmed after a power cut.
    #[test]
    fn a_trim_over_user_data_in_the_cold_heads_open_row_survives_a_power_cut() {
        let (pool, vol, sims) = crate::pool::test_pool::sim_pool();
        let options = crate::pool::test_pool::options();
        assert_ne!(
            pool.engine.ledger.lock().heads[HeadId::Cold.index()].segment,
            crate::pool::ledger::NO_SEGMENT,
            "setup: a pool of this size has a cold head"
        );
        let first = vec![0x11u8; BLOCK_SIZE];
        vol.write(0, &first).unwrap();
        vol.flush().unwrap();
        // The cleaner moves block 0 a second time: into the cold head's open row.
        {
            let mut ledger = pool.engine.ledger.lock();
            let (Loc::Disk(pba), crc) = ledger.volume(vol.id()).unwrap().map().get(0) else {
                panic!("setup: block 0 is on the members");
            };
            let entry = Entry {
                kind: EntryKind::Relocated,
                volume: vol.id(),
                lba: 0,
                crc,
                count: 1,
                source: pba.encode(),
            };
            let sealed = ledger
                .append_block(
                    HeadId::Cold,
                    entry,
                    Loc::Disk(pba),
                    &first,
                    &pool.engine.shape,
                )
                .unwrap();
            assert!(sealed.is_none());
        }
        // A user write follows the block into the cold head; a trim goes to
        // the user head.
        vol.write(0, &[0x22u8; BLOCK_SIZE]).unwrap();
        assert_eq!(
            pool.status().cleaner.cold_written_bytes,
            2 * BLOCK_SIZE as u64
        );
        vol.trim(0, BLOCK_SIZE as u64).unwrap();
        vol.flush().unwrap();
        {
            let ledger = pool.engine.ledger.lock();
            let seq = |h: HeadId| ledger.heads[h.index()].last_seq;
            assert!(
                seq(HeadId::Cold) < seq(HeadId::User),
                "the cold row is sealed before the trim's"
            );
        }
        drop(vol);
        let (pool, _) = crate::pool::test_pool::power_cut(pool, &sims, options);
        let mut got = vec![0xffu8; BLOCK_SIZE];
        pool.volume("v").unwrap().read(0, &mut got).unwrap();
        assert_eq!(got, vec![0u8; BLOCK_SIZE], "the block stays trimmed");
        assert_eq!(crc32c(&got), crate::format::zero_block_crc());
        pool.check_invariants().unwrap();
    }
}
