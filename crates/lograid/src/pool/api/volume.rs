//! The public API of one volume: read, write, FUA write, flush, trim,
//! write-zeroes and block status. Checks alignment and range, runs each call
//! guarded (a panic stops the pool writing), and hands it to the engine.

use super::super::range::{self};
use super::super::read::{fits, gone, within_size, Allocation, ReadTarget};
use super::super::read_index::VolumeView;
use super::super::Engine;
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE;
use crate::format::SECTOR_BYTES;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A handle on one volume.
#[derive(Clone)]
pub struct Volume {
    pub(crate) engine: Arc<Engine>,
    pub(super) id: u32,
    pub(super) name: String,
    /// Its map and readable size, looked up without the ledger lock.
    pub(super) view: Arc<VolumeView>,
}

impl Volume {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    /// The size reads and writes may use (0 once the volume is deleted).
    pub fn size_bytes(&self) -> u64 {
        self.view.readable_bytes()
    }

    /// What the engine's reads need of this handle.
    fn target(&self) -> ReadTarget<'_> {
        ReadTarget {
            id: self.id,
            name: &self.name,
            view: &self.view,
        }
    }

    /// Checks that the pool is open, alignment, and range.
    fn check(&self, offset: u64, length: u64) -> Result<()> {
        self.check_open_and_aligned(offset, length)?;
        self.check_range(offset, length)
    }

    /// Checks the range against the volume's size: the size published to
    /// the view, without the lock; a range past it is checked under the lock
    /// (a deleted volume says so first).
    fn check_range(&self, offset: u64, length: u64) -> Result<()> {
        // (A deleted volume's size is 0: an empty request there asks the ledger.)
        let readable = self.view.readable_bytes();
        if readable > 0 && fits((offset, length), readable) {
            return Ok(());
        }
        let size = self
            .engine
            .ledger
            .lock()
            .volume(self.id)
            .map(|v| v.size_bytes)
            .ok_or_else(|| gone(&self.name))?;
        within_size(&self.name, (offset, length), size)
    }

    /// Checks what needs no lock: the pool is open, the request is aligned.
    fn check_open_and_aligned(&self, offset: u64, length: u64) -> Result<()> {
        if self.engine.closed.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly(ReadOnlyReason::Closed));
        }
        if !offset.is_multiple_of(SECTOR_BYTES) || !length.is_multiple_of(SECTOR_BYTES) {
            return Err(Error::Misaligned { offset, length });
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` (both multiples of 512). Every
    /// block is checked against its checksum and repaired from parity if it
    /// does not match; a block that cannot be repaired fails the read.
    /// After an error the contents of `buf` are unspecified.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        // The range is checked with the map lookup (against the size as of it).
        let asked = (offset, buf.len() as u64);
        self.check_open_and_aligned(offset, asked.1)?;
        if buf.is_empty() || offset.checked_add(asked.1).is_none() {
            return self.check_range(offset, asked.1);
        }
        let bs = BLOCK_SIZE as u64;
        let first = offset / bs;
        let last = (offset + buf.len() as u64 - 1) / bs;
        let count = (last - first + 1) as usize;
        let head = (offset % bs) as usize;
        self.engine.guarded("read", || {
            if head == 0 && buf.len().is_multiple_of(BLOCK_SIZE) {
                return self.engine.read_blocks(self.target(), first, buf, asked);
            }
            let mut tmp = vec![0u8; count * BLOCK_SIZE];
            self.engine
                .read_blocks(self.target(), first, &mut tmp, asked)?;
            buf.copy_from_slice(&tmp[head..head + buf.len()]);
            Ok(())
        })
    }

    /// A read of whole 4 KiB blocks at a 4 KiB-aligned offset, done only if
    /// it needs no wait: no lock held elsewhere, every block in memory or
    /// in its member's cache, every checksum right (a caller on an event
    /// loop then needs no thread hand-off). `None`: not done (`buf` may
    /// hold part of it); call `read`, which waits for the members, repairs,
    /// and says why a read is refused. `Some(Err)`: the engine stopped.
    pub fn try_read_now(&self, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        let length = buf.len() as u64;
        if buf.is_empty()
            || !buf.len().is_multiple_of(BLOCK_SIZE)
            || !offset.is_multiple_of(BLOCK_SIZE as u64)
            || offset.checked_add(length).is_none()
            || self.engine.closed.load(Ordering::Relaxed)
        {
            return None;
        }
        let lba = offset / BLOCK_SIZE as u64;
        self.engine
            .guarded("read", || {
                let done =
                    self.engine
                        .try_read_blocks_now(self.target(), lba, buf, (offset, length));
                Ok(done.map(Ok))
            })
            .unwrap_or_else(|e| Some(Err(e)))
    }

    /// Writes `data` at `offset` (multiples of 512). Acknowledged from memory
    /// until the next flush, like a drive's write cache.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        let written = self.engine.guarded("write", || {
            self.engine.write(self.id, &self.name, offset, data)
        });
        if matches!(written, Err(Error::NoSpace)) {
            self.engine.log_no_space(&self.name, offset, data.len());
        }
        written
    }

    /// One 4 KiB write at a 4 KiB-aligned offset, only if it can be taken
    /// at once, without waiting for a lock, for rows in flight or for room
    /// (a caller on an event loop then needs no thread hand-off). `None`:
    /// nothing was written; call `write`, which may wait, and says why a
    /// write is refused. `Some(Err)`: taken, and then failed (a row write
    /// failed beyond the parity, or the engine stopped).
    pub fn try_write_now(&self, offset: u64, data: &[u8]) -> Option<Result<()>> {
        if data.len() != BLOCK_SIZE
            || !offset.is_multiple_of(BLOCK_SIZE as u64)
            || self.engine.closed.load(Ordering::Relaxed)
        {
            return None;
        }
        let lba = offset / BLOCK_SIZE as u64;
        self.engine
            .guarded("write", || {
                Ok(self.engine.try_write_block_now(self.id, lba, data))
            })
            .unwrap_or_else(|e| Some(Err(e)))
    }

    /// Writes and makes the data durable before returning (FUA).
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    /// Makes every write acknowledged before this call durable.
    pub fn flush(&self) -> Result<()> {
        if self.engine.closed.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly(ReadOnlyReason::Closed));
        }
        self.engine
            .guarded("flush", || self.engine.flush_acknowledged())
    }

    /// Unmaps whole 4 KiB blocks inside the range (a hint: partial blocks at
    /// the edges are left as they are). Trimmed blocks read as zero.
    pub fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.check(offset, length)?;
        self.engine.guarded("trim", || {
            self.engine
                .range_op(self.id, &self.name, offset, length, range::RangeOp::Trim)
        })
    }

    /// Makes the range read as zero. Partial blocks at the edges are
    /// written with zeroes; whole blocks are unmapped (reported as holes),
    /// or with `keep_allocated` become zero records (reported as allocated
    /// zeroes, NBD's NO_HOLE). Neither stores a data block.
    pub fn write_zeroes(&self, offset: u64, length: u64, keep_allocated: bool) -> Result<()> {
        self.check(offset, length)?;
        let mode = if keep_allocated {
            range::RangeOp::ZeroAllocated
        } else {
            range::RangeOp::ZeroUnmapped
        };
        self.engine.guarded("write zeroes", || {
            self.engine
                .range_op(self.id, &self.name, offset, length, mode)
        })
    }

    /// Allocation of [offset, offset+length) as runs (length, state).
    pub fn block_status(&self, offset: u64, length: u64) -> Result<Vec<(u64, Allocation)>> {
        self.check(offset, length)?;
        Ok(self.engine.block_status(self.id, offset, length))
    }
}
