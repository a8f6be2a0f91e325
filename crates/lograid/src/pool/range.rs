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
            let zeros = vec![0u8; BLOCK_SIZE];
            if first > last {
                return self.write(id, name, offset, &zeros[..length as usize]);
            }
            if offset < first * BLOCK_BYTES {
                self.write(
                    id,
                    name,
                    offset,
                    &zeros[..(first * BLOCK_BYTES - offset) as usize],
                )?;
            }
            if end > last * BLOCK_BYTES {
                self.write(
                    id,
                    name,
                    last * BLOCK_BYTES,
                    &zeros[..(end - last * BLOCK_BYTES) as usize],
                )?;
            }
        }
        let mut lba = first;
        // Trims and zeroes free room: if the cleaner cannot make any for
        // their records (a pool holding more than it may, after a member
        // failed), they may use the cleaner's reserve.
        let mut relief = false;
        let mut stalls = SpaceStalls::default();
        while lba < last {
            let mut sealed = Vec::new();
            let mut need_segment = false;
            {
                let mut ledger = self.ledger.lock();
                self.wait_for_inflight_room(&mut ledger);
                check_writable(&ledger)?;
                let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
                let (start, run_end, kind) = if op == RangeOp::ZeroAllocated {
                    // Every block becomes a zero record, in bounded steps.
                    (
                        lba,
                        (lba + MAX_RANGE_RECORD_BLOCKS).min(last),
                        EntryKind::Zero,
                    )
                } else {
                    // Only mapped blocks need a record: the next run of them.
                    let Some((next, _, _)) = vol.map.iter_from(lba).next().filter(|e| e.0 < last)
                    else {
                        // The rest is unmapped: only overlays to drop.
                        ledger.overlays.remove_range(id, lba, last);
                        break;
                    };
                    let mut run_end = next;
                    for (b, _, _) in vol.map.iter_from(next) {
                        if b != run_end || b >= last || run_end - next >= MAX_RANGE_RECORD_BLOCKS {
                            break;
                        }
                        run_end += 1;
                    }
                    (next, run_end, EntryKind::Trim)
                };
                match ledger.append_range_record(
                    id,
                    start,
                    (run_end - start) as u32,
                    kind,
                    relief,
                    &self.shape,
                ) {
                    Ok(row) => {
                        sealed.extend(row);
                        // Blocks skipped before the run were unmapped.
                        ledger.overlays.remove_range(id, lba, run_end);
                        lba = run_end;
                    }
                    Err(AppendError::NeedSegment) => need_segment = true,
                }
            }
            self.write_rows(sealed)?;
            if need_segment {
                if relief {
                    return Err(Error::NoSpace);
                }
                // The cleaner at a fixed point: the records may use its reserve.
                if stalls.check(self.ledger.lock().user_appends).is_err() {
                    relief = true;
                    continue;
                }
                match self.make_space() {
                    Ok(()) => {}
                    Err(Error::NoSpace) => relief = true,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
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
