//! A pool: N members turned into thin volumes protected by P parity columns.
//! This module owns the pool's lifecycle (create, open with recovery, close
//! with a checkpoint), the volume table, and the public API. The data path
//! is split by concern: `log` (heads, open rows, sealing), `io` (writing
//! rows, flush, reads with checksum verification and repair), `overlay`
//! (sub-block writes held in memory until merged into their blocks), `recovery`
//! (checkpoint load and roll-forward), `checkpoint`, `cleaner`, `create`.
//!
//! Locking: one mutex (`Ledger`) guards all bookkeeping and is never held
//! across member I/O. `reuse` is a read-write lock that readers hold while
//! reading member blocks, so that a segment freed by the cleaner is never
//! rewritten under a reader.

mod background;
mod checkpoint;
mod cleaner;
pub mod create;
mod durability;
mod engine;
mod faults;
mod ledger;
mod log;
mod members;
mod open;
mod options;
mod overlay;
mod overlay_table;
mod range;
mod read;
mod rebuild;
mod replay;
mod row_writer;
mod rows;
mod scrub;
mod shape;
mod space;
mod stats;
mod status;
mod stripe;
mod write;

/// Opening pools and what recovery reports.
pub mod recovery_api {
    pub use super::open::{open_members, read_superblock};
    pub use super::stats::RecoveryReport;
}

pub use create::{CreateOptions, DEFAULT_CHUNK_BYTES};
pub(crate) use engine::{now_unix, random_u128, random_u64, Engine};
pub use members::ReshapeStatus;
pub use options::{CleanerPolicy, PoolOptions};
pub use scrub::{LostBlock, ScrubReport};
pub use shape::Shape;
pub use stats::CleanerState;
pub use status::{CleanerStatus, MemberStatus, PoolStatus, VolumeStatus};

use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE;
use ledger::Ledger;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Ledger {}

/// An open pool. Cheap to clone; closing writes a final checkpoint.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Engine>,
    _cleaner: Arc<background::BackgroundThread>,
    _resolver: Arc<background::BackgroundThread>,
}

/// Allocation state of a range, as block status reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Allocation {
    Data,
    Zero,
    Hole,
}

/// A handle on one volume.
#[derive(Clone)]
pub struct Volume {
    inner: Arc<Engine>,
    id: u32,
    name: String,
}

pub const SECTOR: u64 = 512;

impl Pool {
    fn from_inner(inner: Arc<Engine>) -> Pool {
        inner.start_row_writer();
        let cleaner = background::BackgroundThread::start(
            &inner,
            inner.options.background_cleaner,
            "lograid-cleaner",
            background::cleaner_loop,
        );
        let resolver = background::BackgroundThread::start(
            &inner,
            inner.options.background_resolver,
            "lograid-resolver",
            background::resolver_loop,
        );
        Pool {
            inner,
            _cleaner: cleaner,
            _resolver: resolver,
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.shape.pool_name
    }
    pub fn uuid(&self) -> u128 {
        self.inner.shape.pool_uuid
    }

    /// What recovery did when this pool was opened.
    pub fn recovery_report(&self) -> Option<stats::RecoveryReport> {
        self.inner.recovery_report.lock().clone()
    }

    /// The volumes that exist (a volume being created is not listed until
    /// its creation is durable).
    pub fn volumes(&self) -> Vec<Volume> {
        let ledger = self.inner.ledger.lock();
        ledger
            .volumes
            .values()
            .filter(|v| v.exists())
            .map(|v| Volume {
                inner: self.inner.clone(),
                id: v.id,
                name: v.name.clone(),
            })
            .collect()
    }

    pub fn volume(&self, name: &str) -> Result<Volume> {
        self.volumes()
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::NotFound(format!("volume '{name}' in pool '{}'", self.name())))
    }

    /// Creates a thin volume of `size_bytes` (a multiple of 4096). It is
    /// handed out (here and by `volume`) once a checkpoint recording it is
    /// durable: nothing written to it can be lost with it.
    pub fn create_volume(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        validate_volume_name(name)?;
        validate_volume_size(size_bytes)?;
        let _m = self.inner.maintenance.lock();
        let id = {
            let mut ledger = self.inner.ledger.lock();
            check_writable(&ledger)?;
            if ledger.volumes.values().any(|v| v.name == name) {
                return Err(Error::Exists(format!("volume '{name}'")));
            }
            let id = ledger.next_volume_id;
            ledger.next_volume_id += 1;
            ledger.volumes.insert(
                id,
                ledger::VolumeState {
                    id,
                    name: name.to_string(),
                    size_bytes,
                    recording_size_bytes: None,
                    being_created: true,
                    created_unix: now_unix(),
                    map: Default::default(),
                },
            );
            id
        };
        let recorded = self.inner.checkpoint_log_locked();
        let mut ledger = self.inner.ledger.lock();
        match recorded {
            Ok(()) => {
                let v = ledger.volumes.get_mut(&id).expect("volume being created");
                v.being_created = false;
            }
            Err(e) => {
                ledger.volumes.remove(&id);
                return Err(e);
            }
        }
        Ok(Volume {
            inner: self.inner.clone(),
            id,
            name: name.to_string(),
        })
    }

    /// Grows a volume (shrinking is refused: it would drop data). The new
    /// range takes writes once a checkpoint recording the size is durable.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<()> {
        validate_volume_size(size_bytes)?;
        let _m = self.inner.maintenance.lock();
        let id = {
            let mut ledger = self.inner.ledger.lock();
            check_writable(&ledger)?;
            let v = ledger
                .volumes
                .values_mut()
                .find(|v| v.name == name && v.exists())
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            if size_bytes < v.size_bytes {
                return Err(Error::Refused(format!(
                    "volume '{name}' is {} bytes; shrinking to {size_bytes} would drop data",
                    v.size_bytes
                )));
            }
            v.recording_size_bytes = Some(size_bytes);
            v.id
        };
        let recorded = self.inner.checkpoint_log_locked();
        let mut ledger = self.inner.ledger.lock();
        let v = ledger.volumes.get_mut(&id).expect("volume being grown");
        v.recording_size_bytes = None;
        if recorded.is_ok() {
            v.size_bytes = size_bytes;
        }
        recorded
    }

    /// Deletes a volume and frees its blocks. The space becomes reusable
    /// only once a checkpoint recording the deletion is durable (until
    /// then a crash brings the volume back, whole).
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        let _m = self.inner.maintenance.lock();
        let sealed = {
            let mut ledger = self.inner.ledger.lock();
            check_writable(&ledger)?;
            let id = ledger
                .volumes
                .values()
                .find(|v| v.name == name && v.exists())
                .map(|v| v.id)
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            // Seal first so no open slot refers to the volume.
            let sealed = self.inner.seal_open_rows(&mut ledger);
            ledger.overlays.remove_volume(id);
            let vol = ledger.volumes.remove(&id).expect("volume");
            for (_, loc, _) in vol.map.iter_from(0) {
                ledger.release_loc(loc, &self.inner.shape);
                if loc.is_stored() {
                    ledger.stored_blocks -= 1;
                }
            }
            // Segments it emptied wait for the checkpoint below.
            let gen = ledger.flush_gen;
            ledger.unlogged_since_gen.get_or_insert(gen);
            sealed
        };
        self.inner.write_rows(sealed)?;
        self.inner.checkpoint_log_locked()
    }

    /// Flushes everything (sub-block writes held in memory included) and
    /// writes a checkpoint.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner
            .guarded("checkpoint", || self.inner.checkpoint_acknowledged())
    }

    /// Runs the cleaner until `segments` more segments are free or nothing
    /// more can be gained; returns segments freed.
    pub fn clean(&self, segments: usize) -> Result<usize> {
        self.inner.guarded("cleaning", || {
            let cleaned = self.inner.clean_segments(segments, false)?;
            // Make what was emptied reusable now (and, as ever, everything
            // acknowledged durable).
            self.inner.checkpoint_acknowledged()?;
            Ok(cleaned)
        })
    }

    /// Reads and checks every row (data, headers, parity), rewrites what is
    /// wrong and can be rebuilt (unless `repair` is false), and reports the
    /// live blocks that cannot. `progress(done, total)` (rows) is called
    /// every 20 ms or so and last with `done == total`; returning false
    /// stops the scrub (the report says so); the scrub waits while it runs.
    pub fn scrub(
        &self,
        repair: bool,
        mut progress: impl FnMut(u64, u64) -> bool,
    ) -> Result<ScrubReport> {
        if repair {
            check_writable(&self.inner.ledger.lock())?;
        }
        self.inner
            .guarded("scrub", || self.inner.scrub(repair, &mut progress))
    }

    /// Verifies the in-memory bookkeeping (free list, live counts, maps);
    /// for tests and `lograid check`.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.ledger.lock().check_invariants(&self.inner.shape)
    }

    pub fn status(&self) -> PoolStatus {
        status::collect(&self.inner)
    }

    /// Closes the pool: flush, final checkpoint. Further use of volumes fails.
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        self._cleaner.stop();
        self._resolver.stop();
        let read_only = self.inner.ledger.lock().read_only_reason.is_some();
        if !read_only {
            self.inner
                .guarded("close", || self.inner.checkpoint_acknowledged())?;
        }
        self.inner.row_writer.stop();
        self.inner.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl Volume {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn size_bytes(&self) -> u64 {
        self.inner
            .ledger
            .lock()
            .volume(self.id)
            .map(|v| v.size_bytes)
            .unwrap_or(0)
    }

    /// Checks alignment and range; returns the volume size.
    fn check(&self, offset: u64, length: u64) -> Result<()> {
        if self.inner.closed.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly("pool is closed".into()));
        }
        if !offset.is_multiple_of(SECTOR) || !length.is_multiple_of(SECTOR) {
            return Err(Error::Misaligned { offset, length });
        }
        let size = self
            .inner
            .ledger
            .lock()
            .volume(self.id)
            .map(|v| v.size_bytes)
            .ok_or_else(|| Error::NotFound(format!("volume '{}' was deleted", self.name)))?;
        if offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange {
                volume: self.name.clone(),
                offset,
                length,
                size,
            });
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` (both multiples of 512). Every
    /// block is checked against its checksum and repaired from parity if it
    /// does not match; a block that cannot be repaired fails the read.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = BLOCK_SIZE as u64;
        let first = offset / bs;
        let last = (offset + buf.len() as u64 - 1) / bs;
        let count = (last - first + 1) as usize;
        let head = (offset % bs) as usize;
        self.inner.guarded("read", || {
            if head == 0 && buf.len().is_multiple_of(BLOCK_SIZE) {
                return self.inner.read_blocks(self.id, &self.name, first, buf);
            }
            let mut tmp = vec![0u8; count * BLOCK_SIZE];
            self.inner
                .read_blocks(self.id, &self.name, first, &mut tmp)?;
            buf.copy_from_slice(&tmp[head..head + buf.len()]);
            Ok(())
        })
    }

    /// Writes `data` at `offset` (multiples of 512). Acknowledged from memory
    /// until the next flush, like a drive's write cache.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.inner.guarded("write", || {
            self.inner.write(self.id, &self.name, offset, data)
        })
    }

    /// Writes and makes the data durable before returning (FUA).
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    /// Makes every write acknowledged before this call durable.
    pub fn flush(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Relaxed) {
            return Err(Error::ReadOnly("pool is closed".into()));
        }
        self.inner
            .guarded("flush", || self.inner.flush_acknowledged())
    }

    /// Unmaps whole 4 KiB blocks inside the range (a hint: partial blocks at
    /// the edges are left as they are). Trimmed blocks read as zero.
    pub fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.check(offset, length)?;
        self.inner.guarded("trim", || {
            self.inner
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
        self.inner.guarded("write zeroes", || {
            self.inner
                .range_op(self.id, &self.name, offset, length, mode)
        })
    }

    /// Allocation of [offset, offset+length) as runs (length, state).
    pub fn block_status(&self, offset: u64, length: u64) -> Result<Vec<(u64, Allocation)>> {
        self.check(offset, length)?;
        Ok(self.inner.block_status(self.id, offset, length))
    }
}

fn check_writable(ledger: &Ledger) -> Result<()> {
    match &ledger.read_only_reason {
        Some(r) => Err(Error::ReadOnly(r.clone())),
        None => Ok(()),
    }
}

fn validate_volume_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Error::InvalidArgument(format!(
            "volume name '{name}': use 1-64 characters of letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(())
}

fn validate_volume_size(size_bytes: u64) -> Result<()> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_SIZE as u64) || size_bytes > (1u64 << 60)
    {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes}: must be a non-zero multiple of 4096 bytes"
        )));
    }
    Ok(())
}

// Pools and volumes are shared across threads by every front end.
const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Pool>();
    is_send_sync::<Volume>();
};
