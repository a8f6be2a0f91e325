//! A pool: N members turned into thin volumes protected by P parity columns.
//! This module owns the pool's lifecycle (create, open with recovery, close
//! with a checkpoint), the volume table, and the public API. The data path
//! is split by concern: `log` (heads, open rows, sealing), `io` (writing
//! rows, flush, reads with checksum verification and repair), `overlay`
//! (sub-block writes held in memory until merged into their blocks), `recovery`
//! (checkpoint load and roll-forward), `checkpoint`, `cleaner`, `create`.
//!
//! Locking: one mutex (`Core`) guards all bookkeeping and is never held
//! across member I/O. `reuse` is a read-write lock that readers hold while
//! reading member blocks, so that a segment freed by the cleaner is never
//! rewritten under a reader.

mod background;
mod checkpoint;
mod cleaner;
pub mod create;
mod io;
mod log;
mod members;
mod overlay;
mod rebuild;
mod recovery;
mod row_writer;
mod scrub;
mod state;
mod status;

/// Opening pools and what recovery reports.
pub mod recovery_api {
    pub use super::recovery::{open_members, read_superblock, RecoveryReport};
}

pub use create::{CreateOptions, DEFAULT_CHUNK_BYTES};
pub use members::ReshapeStatus;
pub use scrub::{LostBlock, ScrubReport};
pub use status::{CleanerState, CleanerStatus, MemberStatus, PoolStatus, VolumeStatus};

use crate::device::{Device, IoPool};
use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE;
use crate::layout::Geometry;
use crate::sync::{Condvar, Mutex, RwLock};
use state::{full_row_shape, Core};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Runtime options for an opened pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Threads writing and reading members.
    pub io_threads: usize,
    /// Log blocks written between automatic checkpoints (bounds recovery time).
    pub checkpoint_interval_blocks: u64,
    /// Rows sealed but not yet written, at most (bounds memory).
    pub max_inflight_rows: usize,
    /// Bytes of rows sealed but not yet written, at most (bounds memory).
    pub max_inflight_bytes: usize,
    /// Start a background thread that cleans before space runs low.
    pub background_cleaner: bool,
    /// How the cleaner picks the segment to empty.
    pub cleaner_policy: CleanerPolicy,
    /// Discard segments on the members when they become free (punch holes
    /// in file members, BLKDISCARD on block devices), so thin or flash
    /// backing storage gets the space back.
    pub discard: bool,
    /// Share of the time a rebuild or rebalance may take while users are
    /// doing I/O (0.05 to 1; it runs flat out when they are idle).
    pub reshape_share: f64,
    /// Blocks with sub-block writes held in memory (4 KiB each), at most;
    /// they are merged into their blocks in the background, by a writer
    /// that finds the table full, and by every flush (at least 1).
    pub max_overlays: usize,
    /// Start a background thread that merges sub-block writes into their
    /// blocks (keeping the table at most a quarter full).
    pub background_resolver: bool,
}

/// How the cleaner chooses its victim segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanerPolicy {
    /// The segment with the fewest live blocks.
    Greedy,
    /// The segment with the highest (1-u)/u * age: free space gained per
    /// block moved, weighted by how long the segment has gone unchanged
    /// since it was sealed (after Rosenblum and Ousterhout's LFS; the
    /// (1-u)/u form did better than (1-u)/(1+u) in simulation). Cold
    /// segments are cleaned at a higher utilization than hot ones, which
    /// are left to empty by themselves.
    #[default]
    CostBenefit,
}

impl CleanerPolicy {
    pub fn name(self) -> &'static str {
        match self {
            CleanerPolicy::Greedy => "greedy",
            CleanerPolicy::CostBenefit => "cost-benefit",
        }
    }
}

impl std::str::FromStr for CleanerPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "greedy" => Ok(CleanerPolicy::Greedy),
            "cost-benefit" => Ok(CleanerPolicy::CostBenefit),
            _ => Err(format!(
                "unknown cleaner policy '{s}' (greedy, cost-benefit)"
            )),
        }
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            io_threads: 32,
            checkpoint_interval_blocks: 1 << 18,
            max_inflight_rows: 64,
            max_inflight_bytes: 256 << 20,
            background_cleaner: true,
            cleaner_policy: CleanerPolicy::default(),
            discard: false,
            reshape_share: 0.5,
            max_overlays: 4096,
            background_resolver: true,
        }
    }
}

/// Facts fixed while a pool is open.
pub struct Shape {
    pub geometry: Geometry,
    /// Parity columns of new rows (changed by `Pool::set_parity`).
    pub parity: std::sync::atomic::AtomicU8,
    pub pool_uuid: u128,
    pub pool_name: String,
    pub created_unix: u64,
    /// Random per opening; stamped in every row header.
    pub nonce: u64,
    /// The member table of the superblock this pool was opened from:
    /// recovery lays segments taken after its checkpoint over these members
    /// (see `recovery::segment_mask_candidates`).
    pub recorded_members: Vec<crate::format::superblock::MemberRecord>,
    /// Per member index, the segments it does not hold yet (a member that
    /// took a failed one's place, while its rows are rebuilt onto it).
    pub stale: Vec<Arc<crate::device::StaleSegments>>,
}

impl Shape {
    /// An empty stale map per member index.
    pub fn no_stale(geometry: &Geometry) -> Vec<Arc<crate::device::StaleSegments>> {
        (0..crate::format::MAX_MEMBERS)
            .map(|_| {
                Arc::new(crate::device::StaleSegments::new(
                    geometry.data_start_block * crate::format::BLOCK_BYTES,
                    geometry.segment_blocks as u64 * crate::format::BLOCK_BYTES,
                ))
            })
            .collect()
    }

    /// A device for member `m` (sharing its stale map).
    pub fn device(&self, m: usize, member: Arc<dyn crate::device::Member>) -> Arc<Device> {
        Arc::new(Device::new(member, self.stale[m].clone()))
    }

    /// Parity columns of new rows.
    pub fn parity(&self) -> u8 {
        self.parity.load(Ordering::Relaxed)
    }

    /// Can new rows go to a segment laid over `members_mask`? Only with full
    /// parity, unless fewer members are active than that needs (a pool
    /// degraded past what new rows can fully protect writes with what it has).
    pub fn segment_usable(&self, members_mask: u32, active_mask: u32) -> bool {
        let n = members_mask.count_ones();
        n > self.parity() as u32 || (n >= 2 && n == active_mask.count_ones())
    }

    /// Parity of rows in a segment laid over `members_mask`: the pool's
    /// parity, reduced only when too few members are left to hold it and
    /// one data column (degraded beyond what new rows can fully protect).
    pub fn segment_parity(&self, members_mask: u32) -> u8 {
        self.parity()
            .min(members_mask.count_ones().saturating_sub(1) as u8)
    }

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
    pub fn checkpoint_segments_needed(&self, core: &Core) -> usize {
        let entries = core.stored_blocks + core.volumes.len() as u64 * 8;
        let rows: u64 = core.segments.iter().map(|s| s.rows.len() as u64).sum();
        let bytes = 4096 + entries * 12 + rows * 21 + core.segments.len() as u64 * 40;
        // Sized for the narrowest rows the pool may have to write: with
        // `parity` members lost, so that a checkpoint still fits after
        // members fail (the rows then hold less, and a full pool that could
        // not checkpoint could neither clean nor take a replacement).
        let mut worst = core.active_mask_full(&self.geometry);
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
    pub fn cleaner_floor_segments(&self, core: &Core) -> usize {
        self.checkpoint_segments_needed(core)
    }

    /// Free segments user writes may not use (left for the cleaner).
    pub fn user_floor_segments(&self, core: &Core) -> usize {
        self.cleaner_floor_segments(core) + 2
    }
}

impl Core {
    fn active_mask_full(&self, geometry: &Geometry) -> u32 {
        geometry.segment_members(0, self.active_mask)
    }
}

/// Set LOGRAID_CHECK_INVARIANTS=1 to verify the bookkeeping after every
/// flush, checkpoint, cleaning pass and recovery (slow; for tests).
pub(crate) fn paranoid() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LOGRAID_CHECK_INVARIANTS").is_some())
}

impl PoolInner {
    /// Runs `f`; if it panics (a broken invariant: a bug), the pool stops
    /// writing at once — no flush, no checkpoint — so that what is on disk
    /// stays what recovery can trust, and the call fails with an error.
    pub(crate) fn guarded<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                let reason = format!(
                    "internal error during {what}: {msg}; the pool stopped writing to protect its data \
                     (reopening it replays the log up to the last flush)"
                );
                tracing::error!("{reason}");
                self.core
                    .lock()
                    .read_only_reason
                    .get_or_insert(reason.clone());
                self.progress.notify_all();
                Err(Error::ReadOnly(reason))
            }
        }
    }

    /// The open member at index `m`, if any.
    pub(crate) fn device(&self, m: usize) -> Option<Arc<Device>> {
        self.devices
            .read()
            .get(m)
            .cloned()
            .flatten()
            .filter(|d| !d.retired.load(Ordering::Relaxed))
    }

    /// The member at index `m` even if faulted (for its counters).
    pub(crate) fn device_any(&self, m: usize) -> Option<Arc<Device>> {
        self.devices.read().get(m).cloned().flatten()
    }

    /// Every open member, with its index.
    pub(crate) fn open_devices(&self) -> Vec<(usize, Arc<Device>)> {
        self.devices
            .read()
            .iter()
            .enumerate()
            .filter_map(|(m, d)| Some((m, d.clone()?)))
            .filter(|(_, d)| !d.retired.load(Ordering::Relaxed))
            .collect()
    }

    /// Panics with `context` if an invariant is broken (only when paranoid).
    pub(crate) fn debug_check(&self, context: &str) {
        if paranoid() {
            if let Err(m) = self.core.lock().check_invariants(&self.shape) {
                panic!("invariant broken after {context}: {m}");
            }
        }
    }
}

pub(crate) struct PoolInner {
    pub shape: Shape,
    /// Open members by index (None: missing, or removed). Written only
    /// when a member joins or leaves; `device` hands out a clone.
    pub devices: RwLock<Vec<Option<Arc<Device>>>>,
    pub core: Mutex<Core>,
    /// Signalled when rows complete or segments are freed.
    pub progress: Condvar,
    /// Signalled when the overlay table passes its low watermark.
    pub overlay_wake: Condvar,
    /// Held while resolving a batch of overlays (one batch at a time, so
    /// that no two threads merge the same overlay).
    pub resolving: Mutex<()>,
    pub reuse: RwLock<()>,
    /// Serializes flushes, checkpoints and cleaning passes.
    pub maintenance: Mutex<()>,
    pub io: IoPool,
    pub options: PoolOptions,
    pub closed: AtomicBool,
    pub recovery_report: Mutex<Option<recovery::RecoveryReport>>,
    /// Counters and samples kept while the pool is open (not persisted).
    pub stats: Mutex<status::RuntimeStats>,
    pub reshape: Mutex<members::ReshapeStats>,
    pub reshape_paused: AtomicBool,
    /// Writes the rows user writes seal, in the background.
    pub row_writer: row_writer::RowWriter,
}

/// An open pool. Cheap to clone; closing writes a final checkpoint.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
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
    inner: Arc<PoolInner>,
    id: u32,
    name: String,
}

pub const SECTOR: u64 = 512;

impl Pool {
    fn from_inner(inner: Arc<PoolInner>) -> Pool {
        row_writer::RowWriter::start(&inner);
        let cleaner = background::BackgroundThread::start(
            &inner,
            inner.options.background_cleaner,
            "lograid-cleaner",
            cleaner::background_loop,
        );
        let resolver = background::BackgroundThread::start(
            &inner,
            inner.options.background_resolver,
            "lograid-resolver",
            overlay::background_loop,
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
    pub fn recovery_report(&self) -> Option<recovery::RecoveryReport> {
        self.inner.recovery_report.lock().clone()
    }

    /// The volumes that exist (a volume being created is not listed until
    /// its creation is durable).
    pub fn volumes(&self) -> Vec<Volume> {
        let core = self.inner.core.lock();
        core.volumes
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
            let mut core = self.inner.core.lock();
            check_writable(&core)?;
            if core.volumes.values().any(|v| v.name == name) {
                return Err(Error::Exists(format!("volume '{name}'")));
            }
            let id = core.next_volume_id;
            core.next_volume_id += 1;
            core.volumes.insert(
                id,
                state::VolumeState {
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
        let recorded = self.inner.checkpoint_locked();
        let mut core = self.inner.core.lock();
        match recorded {
            Ok(()) => {
                let v = core.volumes.get_mut(&id).expect("volume being created");
                v.being_created = false;
            }
            Err(e) => {
                core.volumes.remove(&id);
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
            let mut core = self.inner.core.lock();
            check_writable(&core)?;
            let v = core
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
        let recorded = self.inner.checkpoint_locked();
        let mut core = self.inner.core.lock();
        let v = core.volumes.get_mut(&id).expect("volume being grown");
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
            let mut core = self.inner.core.lock();
            check_writable(&core)?;
            let id = core
                .volumes
                .values()
                .find(|v| v.name == name && v.exists())
                .map(|v| v.id)
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            // Seal first so no open slot refers to the volume.
            let sealed = self.inner.seal_open_rows(&mut core);
            core.overlays.remove_volume(id);
            let vol = core.volumes.remove(&id).expect("volume");
            for (_, loc, _) in vol.map.iter_from(0) {
                core.release_loc(loc, &self.inner.shape);
                if loc.is_stored() {
                    core.stored_blocks -= 1;
                }
            }
            // Segments it emptied wait for the checkpoint below.
            let gen = core.flush_gen;
            core.unlogged_since_gen.get_or_insert(gen);
            sealed
        };
        self.inner.write_rows(sealed)?;
        self.inner.checkpoint_locked()
    }

    /// Flushes everything (sub-block writes held in memory included) and
    /// writes a checkpoint.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner
            .guarded("checkpoint", || self.inner.checkpoint_all())
    }

    /// Runs the cleaner until `segments` more segments are free or nothing
    /// more can be gained; returns segments freed.
    pub fn clean(&self, segments: usize) -> Result<usize> {
        self.inner.guarded("cleaning", || {
            let cleaned = self.inner.clean_segments(segments, false)?;
            // Make what was emptied reusable now (and, as ever, everything
            // acknowledged durable).
            self.inner.checkpoint_all()?;
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
            check_writable(&self.inner.core.lock())?;
        }
        self.inner
            .guarded("scrub", || self.inner.scrub(repair, &mut progress))
    }

    /// Verifies the in-memory bookkeeping (free list, live counts, maps);
    /// for tests and `lograid check`.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.core.lock().check_invariants(&self.inner.shape)
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
        let read_only = self.inner.core.lock().read_only_reason.is_some();
        if !read_only {
            self.inner
                .guarded("close", || self.inner.checkpoint_all())?;
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
            .core
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
            .core
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
        self.inner.guarded("flush", || self.inner.flush_all())
    }

    /// Unmaps whole 4 KiB blocks inside the range (a hint: partial blocks at
    /// the edges are left as they are). Trimmed blocks read as zero.
    pub fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.check(offset, length)?;
        self.inner.guarded("trim", || {
            self.inner
                .range_op(self.id, &self.name, offset, length, io::RangeOp::Trim)
        })
    }

    /// Makes the range read as zero. Partial blocks at the edges are
    /// written with zeroes; whole blocks are unmapped (reported as holes),
    /// or with `keep_allocated` become zero records (reported as allocated
    /// zeroes, NBD's NO_HOLE). Neither stores a data block.
    pub fn write_zeroes(&self, offset: u64, length: u64, keep_allocated: bool) -> Result<()> {
        self.check(offset, length)?;
        let mode = if keep_allocated {
            io::RangeOp::ZeroAllocated
        } else {
            io::RangeOp::ZeroUnmapped
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

fn check_writable(core: &Core) -> Result<()> {
    match &core.read_only_reason {
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

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random u64 from the kernel.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        u64::from_le_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    }
}

pub(crate) fn random_u128() -> u128 {
    ((random_u64() as u128) << 64) | random_u64() as u128
}

// Pools and volumes are shared across threads by every front end.
const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Pool>();
    is_send_sync::<Volume>();
};
