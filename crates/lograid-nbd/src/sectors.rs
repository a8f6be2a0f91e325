//! Requests at any byte offset and length on exports that take whole 512-byte sectors, and the
//! per-export stripe locks that keep a read-modify-write from losing a concurrent write's bytes.
//!
//! A client that did not ask for block sizes (`NBD_OPT_EXPORT_NAME`, or `NBD_OPT_GO` without
//! `NBD_INFO_BLOCK_SIZE`) may send any offset and length (the protocol's default minimum block
//! size is 1). Reads are widened to the covering sectors; writes and zeroed ranges that cover a
//! sector only in part read that sector, patch it and write it back whole; trims shrink to the
//! whole sectors inside (a trim is a hint).
//!
//! Locking: every write, write-zeroes and trim (aligned or not, from any connection to the
//! export) holds [`SectorLocks`] over its range while it runs: exclusively the stripes of its
//! partly covered sectors, shared the others. So a read-modify-write of a sector excludes every
//! other write to that sector between its read and its write-back, and writes that touch no
//! partly covered sector only ever share. Reads take no lock.
//!
//! Used by this crate's server and by the NFS server (lograid-nfs), each with stripe locks of
//! its own per export.
//!
//! Owns: the widening arithmetic, the read-modify-write, and the stripe locks. Must never: pass
//! an export an offset or length that is not a multiple of [`SECTOR`], or past its (rounded)
//! size; or let a read-modify-write interleave with another write to the same sector.

use std::io;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::export::Export;
use crate::proto::{MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE};

/// The export contract's unit.
pub const SECTOR: u64 = MIN_BLOCK_SIZE as u64;
/// Bytes one stripe lock stands for at a time (consecutive granules map to consecutive stripes).
const GRANULE: u64 = PREFERRED_BLOCK_SIZE as u64;
/// Stripe locks per export. A request covering this many granules or more takes all of them.
const STRIPES: usize = 64;
/// An unaligned write or read whose covering sectors span at most this many bytes goes through
/// one buffer of that size (one export write); a larger one patches its edge sectors
/// separately and passes its aligned middle straight through (no copy of the payload).
pub const MERGE_MAX: u64 = 64 * 1024;

fn round_down(x: u64) -> u64 {
    x / SECTOR * SECTOR
}

fn round_up(x: u64) -> u64 {
    x.div_ceil(SECTOR) * SECTOR
}

pub(crate) fn is_aligned(offset: u64, length: u64) -> bool {
    offset % SECTOR == 0 && length % SECTOR == 0
}

/// Buffer bytes (beyond the request's own payload or reply) that serving `[offset,
/// offset+length)` unaligned takes at most: counted in the connection's in-flight budget.
pub fn scratch_bytes(offset: u64, length: u64) -> u32 {
    if is_aligned(offset, length) || length == 0 {
        return 0;
    }
    let covering = round_up(offset.saturating_add(length)) - round_down(offset);
    if covering <= MERGE_MAX {
        covering as u32
    } else {
        SECTOR as u32
    }
}

/// The stripe locks of one export, shared by every connection to it (see the module docs).
pub struct SectorLocks {
    stripes: Box<[RwLock<()>]>,
}

impl Default for SectorLocks {
    fn default() -> Self {
        SectorLocks {
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        }
    }
}

/// Held locks; released on drop.
pub struct RangeGuard<'a> {
    _shared: Vec<RwLockReadGuard<'a, ()>>,
    _exclusive: Vec<RwLockWriteGuard<'a, ()>>,
}

impl SectorLocks {
    /// `lock` for a sector-aligned write inside one granule, without waiting: `None` if a
    /// read-modify-write holds its stripe (or the range is not of that kind).
    pub fn try_lock_aligned(&self, offset: u64, end: u64) -> Option<RwLockReadGuard<'_, ()>> {
        if end <= offset
            || !is_aligned(offset, end - offset)
            || offset / GRANULE != (end - 1) / GRANULE
        {
            return None;
        }
        let stripe = (offset / GRANULE % STRIPES as u64) as usize;
        match self.stripes[stripe].try_read() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(error)) => Some(error.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Locks for a write to `[offset, end)`: exclusive on the stripes of a partly covered first
    /// or last sector, shared on the rest (nothing for an empty range). Stripes are always taken
    /// in index order and each once, so two callers never wait on each other in a cycle.
    pub fn lock(&self, offset: u64, end: u64) -> RangeGuard<'_> {
        let mut guard = RangeGuard {
            _shared: Vec::new(),
            _exclusive: Vec::new(),
        };
        if end <= offset {
            return guard;
        }
        let first = offset / GRANULE;
        let last = (end - 1) / GRANULE;
        let stripe = |granule: u64| (granule % STRIPES as u64) as usize;
        let mut exclusive = [false; STRIPES];
        // A partly covered sector lies in the granule of `offset` (resp. `end - 1`): granules
        // are whole sectors.
        if offset % SECTOR != 0 {
            exclusive[stripe(first)] = true;
        }
        if end % SECTOR != 0 {
            exclusive[stripe(last)] = true;
        }
        let mut wanted = [false; STRIPES];
        if last - first + 1 >= STRIPES as u64 {
            wanted = [true; STRIPES];
        } else {
            for granule in first..=last {
                wanted[stripe(granule)] = true;
            }
        }
        for (index, lock) in self.stripes.iter().enumerate() {
            if !wanted[index] {
                continue;
            }
            // A poisoned stripe only means a panic elsewhere while it was held; the bytes it
            // guards are whatever the export has, as after any failed write.
            if exclusive[index] {
                guard
                    ._exclusive
                    .push(lock.write().unwrap_or_else(|error| error.into_inner()));
            } else {
                guard
                    ._shared
                    .push(lock.read().unwrap_or_else(|error| error.into_inner()));
            }
        }
        guard
    }
}

/// Reads `[offset, offset+buf.len())` (inside the rounded size) into `buf`, widening to whole
/// sectors where needed.
pub fn read(export: &dyn Export, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let length = buf.len() as u64;
    if is_aligned(offset, length) {
        return export.read(offset, buf);
    }
    let end = offset + length;
    let start = round_down(offset);
    let stop = round_up(end);
    if stop - start <= MERGE_MAX {
        let mut covering = vec![0u8; (stop - start) as usize];
        export.read(start, &mut covering)?;
        let head = (offset - start) as usize;
        buf.copy_from_slice(&covering[head..head + buf.len()]);
        return Ok(());
    }
    // Large: the partly covered edge sectors through a sector buffer, the middle in place.
    let middle_start = round_up(offset);
    let middle_end = round_down(end);
    let mut sector = vec![0u8; SECTOR as usize];
    if offset < middle_start {
        export.read(start, &mut sector)?;
        let head = (offset - start) as usize;
        buf[..(middle_start - offset) as usize].copy_from_slice(&sector[head..]);
    }
    if middle_start < middle_end {
        let range = (middle_start - offset) as usize..(middle_end - offset) as usize;
        export.read(middle_start, &mut buf[range])?;
    }
    if middle_end < end {
        export.read(middle_end, &mut sector)?;
        let tail = (end - middle_end) as usize;
        buf[(middle_end - offset) as usize..].copy_from_slice(&sector[..tail]);
    }
    Ok(())
}

/// What a read-modify-write puts into its range: bytes of a write, or zeroes.
#[derive(Clone, Copy)]
enum Fill<'a> {
    Bytes(&'a [u8]),
    Zeroes(usize),
}

impl Fill<'_> {
    fn len(&self) -> usize {
        match self {
            Fill::Bytes(bytes) => bytes.len(),
            Fill::Zeroes(length) => *length,
        }
    }
}

/// Writes `fill` at `offset` through one buffer covering the whole sectors around it: the
/// first and last sector are read first when `fill` covers them only in part. The caller holds
/// the stripe locks.
fn merge_write(export: &dyn Export, offset: u64, fill: Fill<'_>, fua: bool) -> io::Result<()> {
    let end = offset + fill.len() as u64;
    let start = round_down(offset);
    let stop = round_up(end);
    let mut merged = vec![0u8; (stop - start) as usize];
    let head_partial = offset != start;
    let tail_partial = end != stop;
    if head_partial && tail_partial && stop - start <= 2 * SECTOR {
        export.read(start, &mut merged)?;
    } else {
        if head_partial {
            export.read(start, &mut merged[..SECTOR as usize])?;
        }
        if tail_partial {
            let last = merged.len() - SECTOR as usize;
            export.read(stop - SECTOR, &mut merged[last..])?;
        }
    }
    let range = (offset - start) as usize..(end - start) as usize;
    match fill {
        Fill::Bytes(bytes) => merged[range].copy_from_slice(bytes),
        Fill::Zeroes(_) => merged[range].fill(0),
    }
    export.write(start, &merged, fua)
}

/// Writes `data` at `offset` (inside the rounded size; `data` not empty).
pub fn write(
    export: &dyn Export,
    locks: &SectorLocks,
    offset: u64,
    data: &[u8],
    fua: bool,
) -> io::Result<()> {
    let end = offset + data.len() as u64;
    let _guard = locks.lock(offset, end);
    if is_aligned(offset, data.len() as u64) {
        return export.write(offset, data, fua);
    }
    if round_up(end) - round_down(offset) <= MERGE_MAX {
        return merge_write(export, offset, Fill::Bytes(data), fua);
    }
    // Large: the partly covered edge sectors by read-modify-write, the middle straight from
    // the payload. Each part is a write of its own (NBD makes no promise of atomicity).
    let middle_start = round_up(offset);
    let middle_end = round_down(end);
    if offset < middle_start {
        let head = (middle_start - offset) as usize;
        merge_write(export, offset, Fill::Bytes(&data[..head]), fua)?;
    }
    if middle_start < middle_end {
        let range = (middle_start - offset) as usize..(middle_end - offset) as usize;
        export.write(middle_start, &data[range], fua)?;
    }
    if middle_end < end {
        let tail = (middle_end - offset) as usize;
        merge_write(export, middle_end, Fill::Bytes(&data[tail..]), fua)?;
    }
    Ok(())
}

/// Zeroes `[offset, offset+length)` (inside the rounded size; `length > 0`): the whole sectors
/// with the export's write-zeroes, a partly covered first or last sector by read-modify-write.
pub(crate) fn write_zeroes(
    export: &dyn Export,
    locks: &SectorLocks,
    offset: u64,
    length: u64,
    no_hole: bool,
    fua: bool,
) -> io::Result<()> {
    let end = offset + length;
    let _guard = locks.lock(offset, end);
    if is_aligned(offset, length) {
        return export.write_zeroes(offset, length, no_hole, fua);
    }
    let middle_start = round_up(offset);
    let middle_end = round_down(end);
    if middle_start >= middle_end {
        // Inside one sector, or two partly covered neighbours.
        return merge_write(export, offset, Fill::Zeroes(length as usize), fua);
    }
    if offset < middle_start {
        let head = (middle_start - offset) as usize;
        merge_write(export, offset, Fill::Zeroes(head), fua)?;
    }
    export.write_zeroes(middle_start, middle_end - middle_start, no_hole, fua)?;
    if middle_end < end {
        merge_write(
            export,
            middle_end,
            Fill::Zeroes((end - middle_end) as usize),
            fua,
        )?;
    }
    Ok(())
}

/// Trims the whole sectors inside `[offset, offset+length)` (`length > 0`); partly covered
/// ones are left as they are (a trim is a hint), and a range inside one sector trims nothing.
pub(crate) fn trim(
    export: &dyn Export,
    locks: &SectorLocks,
    offset: u64,
    length: u64,
    fua: bool,
) -> io::Result<()> {
    let first = round_up(offset);
    let last = round_down(offset + length);
    if first >= last {
        return Ok(());
    }
    let _guard = locks.lock(first, last);
    export.trim(first, last - first, fua)
}

/// `[offset, offset+length)` widened to whole sectors: the aligned start, and the aligned
/// length (at most `u32::MAX` rounded down to a sector, so it can be asked for in one call).
pub(crate) fn widen(offset: u64, length: u32) -> (u64, u32) {
    let start = round_down(offset);
    let stop = round_up(offset + u64::from(length));
    let widest = round_down(u64::from(u32::MAX));
    (start, (stop - start).min(widest) as u32)
}

/// Block-status descriptors for a range that starts `head` bytes into the first descriptor's
/// range and is `length` bytes long: the first descriptor loses `head` bytes (it is at least
/// a sector long, so it stays nonempty), and the list is cut to `length`.
pub(crate) fn narrow_descriptors(
    mut descriptors: Vec<(u32, u32)>,
    head: u32,
    length: u32,
) -> Vec<(u32, u32)> {
    if let Some(first) = descriptors.first_mut() {
        first.0 = first.0.saturating_sub(head).max(1);
    }
    let mut left = length;
    let mut keep = 0;
    for descriptor in descriptors.iter_mut() {
        if left == 0 {
            break;
        }
        descriptor.0 = descriptor.0.min(left);
        left -= descriptor.0;
        keep += 1;
    }
    descriptors.truncate(keep);
    descriptors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem_export::MemExport;

    const SIZE: u64 = 1 << 20;

    fn filled() -> MemExport {
        let export = MemExport::new("disk", SIZE);
        let bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        export.write(0, &bytes, false).unwrap();
        export
    }

    fn expected(changes: &[(u64, &[u8])]) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        for (offset, data) in changes {
            bytes[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
        bytes
    }

    fn contents(export: &MemExport) -> Vec<u8> {
        let mut bytes = vec![0u8; SIZE as usize];
        export.read(0, &mut bytes).unwrap();
        bytes
    }

    #[test]
    fn unaligned_reads_match_the_bytes() {
        let export = filled();
        let all = contents(&export);
        for (offset, length) in [
            (1u64, 1usize),
            (511, 2),
            (100, 300),
            (1000, 5000),
            (3, MERGE_MAX as usize + 7),
            (512, 70_000),
            (777, 200_000),
            (SIZE - 5, 5),
        ] {
            let mut buf = vec![0u8; length];
            read(&export, offset, &mut buf).unwrap();
            assert!(
                buf == all[offset as usize..offset as usize + length],
                "read at {offset}+{length}"
            );
        }
        assert_eq!(export.contract_violations(), 0);
    }

    #[test]
    fn unaligned_writes_keep_the_neighbouring_bytes() {
        let export = filled();
        let locks = SectorLocks::default();
        let small = vec![0xEEu8; 300];
        let across = vec![0xDDu8; 1000];
        let large = vec![0xCCu8; 200_000];
        let tail_only = vec![0xBBu8; 70_000];
        write(&export, &locks, 100, &small, false).unwrap();
        write(&export, &locks, 4000, &across, true).unwrap();
        write(&export, &locks, 10_001, &large, false).unwrap();
        write(&export, &locks, 512 * 700, &tail_only, false).unwrap();
        write(&export, &locks, SIZE - 1, &[0xAA], false).unwrap();
        assert!(
            contents(&export)
                == expected(&[
                    (100, &small),
                    (4000, &across),
                    (10_001, &large),
                    (512 * 700, &tail_only),
                    (SIZE - 1, &[0xAA]),
                ])
        );
        assert_eq!(export.contract_violations(), 0);
    }

    #[test]
    fn unaligned_zeroes_and_trims() {
        let export = filled();
        let locks = SectorLocks::default();
        write_zeroes(&export, &locks, 10, 20, false, false).unwrap();
        write_zeroes(&export, &locks, 1000, 100, true, false).unwrap();
        write_zeroes(&export, &locks, 5000, 10_000, false, true).unwrap();
        let zeroes = vec![0u8; 10_000];
        assert!(
            contents(&export)
                == expected(&[(10, &zeroes[..20]), (1000, &zeroes[..100]), (5000, &zeroes)])
        );
        // A trim inside one sector does nothing; a wider one trims only the whole sectors.
        trim(&export, &locks, 40_001, 100, false).unwrap();
        let before = contents(&export);
        trim(&export, &locks, 40_001, 2000, false).unwrap();
        let after = contents(&export);
        // Whole sectors inside [40_001, 42_001): [40_448, 41_984); MemExport reads them as zero.
        assert!(before[..40_448] == after[..40_448]);
        assert!(before[41_984..] == after[41_984..]);
        assert!(after[40_448..41_984].iter().all(|b| *b == 0));
        assert!(before[40_448..41_984].iter().any(|b| *b != 0));
        assert_eq!(export.contract_violations(), 0);
    }

    #[test]
    fn scratch_and_widening() {
        assert_eq!(scratch_bytes(0, 4096), 0);
        assert_eq!(scratch_bytes(1, 10), 512);
        assert_eq!(scratch_bytes(511, 2), 1024);
        assert_eq!(scratch_bytes(1, 1 << 20), 512);
        assert_eq!(widen(100, 10), (0, 512));
        assert_eq!(widen(1000, 1000), (512, 1536));
        assert_eq!(widen(1, u32::MAX), (0, u32::MAX / 512 * 512));
        assert_eq!(
            narrow_descriptors(vec![(1024, 0), (512, 3)], 100, 1000),
            vec![(924, 0), (76, 3)]
        );
        assert_eq!(narrow_descriptors(vec![(4096, 3)], 511, 1), vec![(1, 3)]);
    }

    #[test]
    fn locks_exclude_only_partly_covered_stripes() {
        let locks = SectorLocks::default();
        let stripe = |offset: u64| ((offset / GRANULE) % STRIPES as u64) as usize;
        let aligned = locks.lock(0, 1 << 20);
        // An aligned write only shares (every stripe, for one this long).
        assert!(locks.stripes.iter().all(|s| s.try_read().is_ok()));
        assert!(locks.stripes.iter().all(|s| s.try_write().is_err()));
        drop(aligned);
        assert!(locks.lock(5, 5)._shared.is_empty());
        let edge = locks.lock(100, 200);
        assert!(locks.stripes[stripe(100)].try_read().is_err());
        assert!(locks.stripes[stripe(GRANULE)].try_read().is_ok());
        drop(edge);
        assert!(locks.stripes[stripe(100)].try_write().is_ok());
    }
}
