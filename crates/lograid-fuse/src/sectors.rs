//! Widening the kernel's byte ranges to the export contract's whole sectors.
//!
//! Owns: [`SECTOR`], rounding to it, reads widened to whole sectors, and [`Edges`]: unaligned
//! writes and zeroed ranges done as a read-merge-write of their partly covered sectors, under
//! one lock. Must never: pass an export an offset or length that is not a multiple of
//! [`SECTOR`] or that runs past its size, or let two read-merge-writes interleave (each would
//! write back the other's sector as it was).

use std::io;
use std::ops::Range;

use lograid_nbd::Export;
use parking_lot::Mutex;

/// The export contract's unit: offsets and lengths passed to an [`Export`] are multiples of it.
pub(crate) const SECTOR: u64 = lograid_nbd::proto::MIN_BLOCK_SIZE as u64;

fn round_down(x: u64) -> u64 {
    x / SECTOR * SECTOR
}

fn round_up(x: u64) -> u64 {
    x.div_ceil(SECTOR) * SECTOR
}

/// Reads `[offset, end)` (end within the size) through `buffer`, widening to whole sectors;
/// returns where in `buffer` the bytes asked for are. The buffer only grows: it is not
/// cleared or zeroed per request (the export overwrites what it reads into).
pub(crate) fn read_range(
    export: &dyn Export,
    offset: u64,
    end: u64,
    buffer: &mut Vec<u8>,
) -> io::Result<Range<usize>> {
    let start = round_down(offset);
    let stop = round_up(end).min(round_down(export.size_bytes()).max(start));
    let len = (stop - start) as usize;
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    export.read(start, &mut buffer[..len])?;
    let head = (offset - start) as usize;
    Ok(head..head + (end - offset) as usize)
}

/// Writes of partly covered sectors, one at a time.
#[derive(Default)]
pub(crate) struct Edges {
    /// Serialises the read-modify-write of partly covered 512-byte sectors (unaligned writes and
    /// punched ranges come from tools writing the file directly, never from a loop device).
    lock: Mutex<()>,
}

impl Edges {
    /// Writes `data` at `offset` (within the size). Unaligned edges are read, merged and written
    /// back whole under the lock.
    pub(crate) fn write_range(
        &self,
        export: &dyn Export,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(SECTOR) && end.is_multiple_of(SECTOR) {
            return export.write(offset, data, fua);
        }
        let _edges = self.lock.lock();
        let start = round_down(offset);
        let stop = round_up(end);
        if stop > export.size_bytes() {
            // The last sector is not whole: nothing can write it under the contract.
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut merged = vec![0u8; (stop - start) as usize];
        export.read(start, &mut merged)?;
        merged[(offset - start) as usize..(end - start) as usize].copy_from_slice(data);
        export.write(start, &merged, fua)
    }

    /// Zeroes `[offset, end)`: whole sectors by `whole` (trim or write-zeroes), edges by writing
    /// zero bytes.
    pub(crate) fn zero_range(
        &self,
        export: &dyn Export,
        offset: u64,
        end: u64,
        whole: impl FnOnce(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let first = round_up(offset).min(end);
        let last = round_down(end).max(first);
        if offset < first {
            self.write_range(export, offset, &vec![0; (first - offset) as usize], false)?;
        }
        if last < end {
            self.write_range(export, last, &vec![0; (end - last) as usize], false)?;
        }
        if first < last {
            whole(first, last - first)?;
        }
        Ok(())
    }
}
