//! Trims and zeroes: the whole blocks of a range become holes (a trim or a
//! zero record in the log, no data block written) or allocated zeroes;
//! the partial blocks at the edges of a zeroed range are written with
//! zeroes. Bounded records, so that the ledger lock is held briefly.

use super::ledger::check_writable;
use super::log::AppendError;
use super::read::gone;
use super::space::SpaceStalls;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::row::EntryKind;
use crate::format::{BLOCK_BYTES, BLOCK_SIZE};
use crate::map::VolumeMap;
use std::ops::Range;

impl Engine {
    /// Trims or zeroes the whole blocks of a range (see `RangeOp`); the
    /// zeroing ops also overwrite partial blocks at the edges with zeroes.
    pub(crate) fn range_op(
        &self,
        id: u32,
        name: &str,
        offset: u64,
        length: u64,
        op: RangeOp,
    ) -> Result<()> {
        let end = offset + length;
        let first = offset.div_ceil(BLOCK_BYTES);
        let last = end / BLOCK_BYTES;
        if op != RangeOp::Trim {
            self.zero_partial_blocks(id, name, offset, end)?;
        }
        let mut lba = first;
        let mut room = RecordRoom::default();
        while lba < last {
            match self.record_range_step(id, name, lba..last, op, room.relief)? {
                RecordStep::Done => break,
                RecordStep::Appended { next } => lba = next,
                RecordStep::NeedSegment => self.make_room_for_records(&mut room)?,
            }
        }
        Ok(())
    }

    /// Writes zeroes over the parts of `offset..end` that do not cover a
    /// whole block (all of it when it lies inside one block).
    fn zero_partial_blocks(&self, id: u32, name: &str, offset: u64, end: u64) -> Result<()> {
        let zeros = [0u8; BLOCK_SIZE];
        let first = offset.div_ceil(BLOCK_BYTES);
        let last = end / BLOCK_BYTES;
        if first > last {
            return self.write(id, name, offset, &zeros[..(end - offset) as usize]);
        }
        if offset < first * BLOCK_BYTES {
            let head_bytes = (first * BLOCK_BYTES - offset) as usize;
            self.write(id, name, offset, &zeros[..head_bytes])?;
        }
        if end > last * BLOCK_BYTES {
            let tail_bytes = (end - last * BLOCK_BYTES) as usize;
            self.write(id, name, last * BLOCK_BYTES, &zeros[..tail_bytes])?;
        }
        Ok(())
    }

    /// Appends the next record of a range operation over `blocks` (one
    /// bounded step) and writes the rows it sealed.
    fn record_range_step(
        &self,
        id: u32,
        name: &str,
        blocks: Range<u64>,
        op: RangeOp,
        relief: bool,
    ) -> Result<RecordStep> {
        let sealed = {
            let mut ledger = self.ledger.lock();
            self.wait_for_inflight_room(&mut ledger);
            check_writable(&ledger)?;
            let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
            let Some((run, kind)) = next_record(&vol.map(), blocks.clone(), op) else {
                // The rest is unmapped: only overlays to drop.
                ledger.overlays.remove_range(id, blocks.start, blocks.end);
                return Ok(RecordStep::Done);
            };
            let count = (run.end - run.start) as u32;
            // Blocks of the run in the cleaner head's open row: that row
            // gets the lower sequence number (`lifetime`).
            let mut rows = ledger.seal_heads_holding(id, run.start, run.end, &self.shape);
            match ledger.append_range_record(id, run.start, count, kind, relief, &self.shape) {
                Ok(row) => {
                    // Blocks skipped before the run were unmapped.
                    ledger.overlays.remove_range(id, blocks.start, run.end);
                    rows.extend(row);
                    (rows, run.end)
                }
                Err(AppendError::NeedSegment) => {
                    drop(ledger);
                    self.write_rows(rows)?;
                    return Ok(RecordStep::NeedSegment);
                }
            }
        };
        let (rows, next) = sealed;
        self.write_rows(rows)?;
        Ok(RecordStep::Appended { next })
    }

    /// Room for the next record: the cleaner makes some; if it cannot
    /// (a pool holding more than it may, after a member failed) or stands
    /// at a fixed point, the records may use its reserve; if even that is
    /// full, the pool is.
    fn make_room_for_records(&self, room: &mut RecordRoom) -> Result<()> {
        if self.record_waiting_heads()? {
            return Ok(());
        }
        if room.relief {
            return Err(Error::NoSpace);
        }
        if room.stalls.check(self.ledger.lock().user_appends).is_err() {
            room.relief = true;
            return Ok(());
        }
        match self.make_space() {
            Ok(()) => Ok(()),
            Err(Error::NoSpace) => {
                room.relief = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Where a range operation stands after one step.
enum RecordStep {
    /// Nothing left to record.
    Done,
    /// A record was appended; the operation goes on at `next`.
    Appended { next: u64 },
    /// No free segment for the record.
    NeedSegment,
}

/// Trims and zeroes free room, so they may use the cleaner's reserve when
/// the cleaner cannot make room for their records (`relief`).
#[derive(Default)]
struct RecordRoom {
    relief: bool,
    stalls: SpaceStalls,
}

/// The blocks the next record over `blocks` covers, and its kind: for
/// `ZeroAllocated` every block (a zero record, in bounded steps); else the
/// next run of mapped blocks (a trim record; unmapped blocks need none).
/// None: nothing left to record.
fn next_record(
    map: &VolumeMap,
    blocks: Range<u64>,
    op: RangeOp,
) -> Option<(Range<u64>, EntryKind)> {
    let (lba, last) = (blocks.start, blocks.end);
    if op == RangeOp::ZeroAllocated {
        let end = (lba + MAX_RANGE_RECORD_BLOCKS).min(last);
        return Some((lba..end, EntryKind::Zero));
    }
    let (next, _, _) = map.iter_range(lba..last).next()?;
    let mut run_end = next;
    for (b, _, _) in map.iter_range(next..last) {
        if b != run_end || run_end - next >= MAX_RANGE_RECORD_BLOCKS {
            break;
        }
        run_end += 1;
    }
    Some((next..run_end, EntryKind::Trim))
}

/// Blocks one trim or zero record covers at most (bounds the time the ledger
/// lock is held for one record).
const MAX_RANGE_RECORD_BLOCKS: u64 = 1 << 16;

/// What a range operation does to the whole blocks it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    /// Unmap (a hint; reads return zeroes).
    Trim,
    /// Read as zero, unmapped (a hole).
    ZeroUnmapped,
    /// Read as zero, reported allocated (NBD NO_HOLE).
    ZeroAllocated,
}
