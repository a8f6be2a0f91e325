//! The engine of one open pool (`Engine`): the shared state every path works
//! on (the shape, the open members, the ledger under its lock, the I/O pool,
//! the locks that order maintenance) and the few facilities every path uses:
//! the member table lookups, running an operation so that a panic stops the
//! pool writing instead of leaving half-done state, events, and the debug
//! invariant check. The paths themselves live in their own modules, each an
//! `impl Engine` block for one concern (see `pool/mod.rs`).

use super::device_table::{DeviceTable, Devices};
use super::ledger::{Head, Ledger, Segment};
use super::options::PoolOptions;
use super::row_writer;
use super::shape::Shape;
use super::stats;
use crate::device::{Device, IoPool, StripedCounter};
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::checkpoint::PoolCounters;
use crate::format::row::HeadId;
use crate::format::superblock::{MemberRecord, MemberState};
use crate::layout::MemberIndex;
use crate::sync::{Condvar, Mutex, ReadMostlyLock};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Set LOGRAID_CHECK_INVARIANTS=1 to verify the bookkeeping after every
/// flush, checkpoint, cleaning pass and recovery (slow; for tests).
pub(crate) fn paranoid() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("LOGRAID_CHECK_INVARIANTS").is_some_and(|v| !v.is_empty() && v != "0")
    })
}

pub(crate) struct Engine {
    pub shape: Shape,
    /// Open members by index; `device` hands out a clone.
    pub devices: DeviceTable,
    pub ledger: Mutex<Ledger>,
    /// Signalled when rows complete or segments are freed.
    pub progress: Condvar,
    /// Signalled when the overlay table passes its low watermark.
    pub overlay_wake: Condvar,
    /// Held while resolving a batch of overlays (one batch at a time, so
    /// that no two threads merge the same overlay).
    pub resolving: Mutex<()>,
    /// Held shared by whoever reads member blocks it looked up in the map
    /// (reads, the cleaner, scrub, rebuild) until those reads are done, and
    /// exclusively while segments freed by a flush are released for reuse:
    /// no read ever returns blocks of a segment written again under it.
    pub reuse: ReadMostlyLock,
    /// Serializes checkpoints, cleaning passes, member and volume changes
    /// and the reshape (flushes never wait for it: one that finds a
    /// checkpoint due try-locks it).
    pub maintenance: Mutex<()>,
    /// Held while superblocks are written and until the ledger's checkpoint
    /// pointer is the one they record (`checkpoint_log_locked`,
    /// `record_faults`): one superblock write at a time, each pointing at a
    /// checkpoint whose segments stay. Taken after `maintenance`, before
    /// the ledger.
    pub superblocks: Mutex<()>,
    pub io: IoPool,
    /// Whole-column buffers kept between row reads (`read_row_columns`).
    pub column_buffers: super::column_buffers::ColumnBuffers,
    pub options: PoolOptions,
    pub closed: AtomicBool,
    /// User bytes read without the ledger lock (looked up through
    /// `read_index`, or by `try_read_blocks_now` on an event loop), counted
    /// here so that those reads take no lock to count; `counters` adds
    /// them to the ledger's.
    pub user_bytes_read_now: StripedCounter,
    /// What reads look up without the ledger lock (the ledger's, shared).
    pub read_index: Arc<super::read_index::ReadIndex>,
    /// Reads that looked their blocks up that way.
    pub reads_without_ledger_lock: StripedCounter,
    pub recovery_report: Mutex<Option<stats::RecoveryReport>>,
    /// Counters and samples kept while the pool is open (not persisted).
    pub stats: Mutex<stats::RuntimeStats>,
    pub reshape: Mutex<stats::ReshapeStats>,
    pub reshape_paused: AtomicBool,
    /// Writes the rows user writes seal, in the background.
    pub row_writer: row_writer::RowWriter,
    /// Flushes of the log, one at a time, shared by those that wait.
    pub flushes: super::durability::FlushCombiner,
}

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random u64 from the kernel (getentropy: Linux's glibc and macOS alike).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getentropy fills exactly the 8 bytes of b (at most 256 allowed).
    let rc = unsafe { libc::getentropy(b.as_mut_ptr().cast(), b.len()) };
    if rc == 0 {
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

impl Engine {
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
                let reason = ReadOnlyReason::Internal {
                    during: what.to_string(),
                    message: msg,
                };
                tracing::error!("{reason}");
                self.ledger
                    .lock()
                    .read_only_reason
                    .get_or_insert(reason.clone());
                self.progress.notify_all();
                Err(Error::ReadOnly(reason))
            }
        }
    }

    /// The open member at index `m`, if any.
    pub(crate) fn device(&self, m: MemberIndex) -> Option<Arc<Device>> {
        open_device(&self.devices.load(), m).cloned()
    }

    /// The pool's counters: the ledger's, with the bytes read without its
    /// lock added.
    pub(crate) fn counters(&self, ledger: &Ledger) -> PoolCounters {
        let mut counters = ledger.counters;
        counters.user_bytes_read += self.user_bytes_read_now.get();
        counters
    }

    /// The member at index `m` even if faulted (for its counters).
    pub(crate) fn device_any(&self, m: MemberIndex) -> Option<Arc<Device>> {
        self.devices.load().get(m.0).cloned().flatten()
    }

    /// Every open member, with its index.
    pub(crate) fn open_devices(&self) -> Vec<(MemberIndex, Arc<Device>)> {
        self.devices
            .load()
            .iter()
            .enumerate()
            .filter_map(|(m, d)| Some((MemberIndex(m), d.clone()?)))
            .filter(|(_, d)| !d.retired.load(Ordering::Relaxed))
            .collect()
    }

    /// Panics with `context` if an invariant is broken (only when paranoid).
    pub(crate) fn debug_check(&self, context: &str) {
        if paranoid() {
            if let Err(m) = self.ledger.lock().check_invariants(&self.shape) {
                panic!("invariant broken after {context}: {m}");
            }
        }
    }

    /// Logs a repaired block (`what` says where and how it was found), at
    /// most `LogBudget`'s rate; says how many lines were left out.
    pub(crate) fn log_repair(&self, what: std::fmt::Arguments<'_>) {
        self.log_block_event(false, what);
    }

    /// Logs a write refused for want of space, at most `LogBudget`'s rate.
    pub(crate) fn log_no_space(&self, volume: &str, offset: u64, bytes: usize) {
        let turn = self.stats.lock().no_space_lines.take();
        let left_out = match turn {
            stats::LogTurn::Log { left_out } => left_out,
            stats::LogTurn::StartQuiet | stats::LogTurn::Quiet => return,
        };
        let free = self.ledger.lock().free_blocks() * crate::format::BLOCK_BYTES;
        tracing::error!(
            "volume '{volume}' offset {offset}: write of {bytes} bytes refused: pool '{}' is \
             full (ENOSPC; {free} bytes free{}); trim or delete data, or add or replace members",
            self.shape.pool_name,
            if left_out > 0 {
                format!("; {left_out} more refused writes not logged")
            } else {
                String::new()
            }
        );
    }

    /// Logs a block found lost (an error), at the same rate limit.
    pub(crate) fn log_lost(&self, what: std::fmt::Arguments<'_>) {
        self.stats.lock().lost_blocks_seen += 1;
        self.log_block_event(true, what);
    }

    fn log_block_event(&self, lost: bool, what: std::fmt::Arguments<'_>) {
        let turn = self.stats.lock().repair_lines.take();
        let left_out = match turn {
            stats::LogTurn::Log { left_out } => left_out,
            stats::LogTurn::StartQuiet => {
                tracing::warn!(
                    "more repaired or lost blocks than the log takes: the next ones are \
                     counted (lograid status), not logged, for a few seconds (rate limit)"
                );
                return;
            }
            stats::LogTurn::Quiet => return,
        };
        if left_out > 0 {
            tracing::warn!("{left_out} more repaired or lost blocks were not logged (rate limit)");
        }
        if lost {
            tracing::error!("{what}");
        } else {
            tracing::warn!("{what}");
        }
    }

    /// Logs a state change (fault, replace, add, repair) and keeps it for
    /// `lograid status` (the last few).
    pub(crate) fn event(&self, message: String) {
        tracing::warn!("{message}");
        let mut stats = self.stats.lock();
        let when = super::now_unix();
        stats.events.push_back((when, message));
        while stats.events.len() > 32 {
            stats.events.pop_front();
        }
    }

    /// The path of member `m`, or "-".
    pub(crate) fn member_name(&self, m: MemberIndex) -> String {
        self.device(m)
            .map(|d| d.member.describe())
            .unwrap_or_else(|| "-".into())
    }
}

impl Engine {
    /// A new engine over `devices` with an empty ledger (creation and
    /// recovery fill it).
    pub(crate) fn new(
        shape: Shape,
        members: Vec<MemberRecord>,
        devices: Vec<Option<Arc<Device>>>,
        options: PoolOptions,
        active_mask: u32,
        superblock_generation: u64,
    ) -> Engine {
        let segment_count = shape.geometry.segment_count();
        let segments: Vec<Segment> = (0..segment_count).map(|_| Segment::free()).collect();
        let overlays = super::overlay_table::OverlayTable::new(options.max_overlays);
        let read_index = Arc::new(super::read_index::ReadIndex::default());
        let mut ledger = Ledger {
            volumes: BTreeMap::new(),
            segments,
            free: VecDeque::new(),
            heads: [
                Head::new(HeadId::User),
                Head::new(HeadId::Cleaner),
                Head::new(HeadId::Checkpoint),
                Head::new(HeadId::Cold),
            ],
            next_seq: 1,
            next_volume_id: 1,
            inflight: Vec::new(),
            inflight_bytes: 0,
            read_index: read_index.clone(),
            user_appends: 0,
            counters: Default::default(),
            log_blocks_since_checkpoint: 0,
            flush_gen: 0,
            unlogged_since_gen: None,
            flushed_seq: 0,
            checkpoint_next_seq: 0,
            checkpoint: Default::default(),
            checkpoint_segments: Vec::new(),
            superblock_generation,
            recorded_members: shape.recorded_members.clone(),
            faulted_uuids: Vec::new(),
            members,
            active_mask,
            capacity_blocks: 0,
            usable_blocks: 0,
            read_only_reason: None,
            stored_blocks: 0,
            spare_buffers: Vec::new(),
            checkpoint_wanted: false,
            overlays,
            lifetime_threshold: None,
            long_lived_appends: 0,
            cold_appends: 0,
        };
        for (s, seg) in ledger.segments.iter_mut().enumerate() {
            seg.members_mask = shape.geometry.segment_members(s as u32, active_mask);
            seg.parity = shape.parity();
        }
        ledger.update_capacity(&shape);
        ledger.publish_segment_rows();
        // A member recorded faulted is not trusted again, even if its drive
        // is here: its columns are rebuilt from parity until it is replaced.
        for (d, r) in devices.iter().zip(&ledger.members) {
            if let (Some(d), MemberState::Faulted) = (d, r.state) {
                d.retired.store(true, Ordering::Relaxed);
            }
        }
        Engine {
            io: IoPool::new(options.io_threads.max(devices.len()).max(2)),
            shape,
            devices: DeviceTable::new(devices),
            ledger: Mutex::new(ledger),
            progress: Condvar::new(),
            overlay_wake: Condvar::new(),
            resolving: Mutex::new(()),
            reuse: ReadMostlyLock::default(),
            maintenance: Mutex::new(()),
            superblocks: Mutex::new(()),
            column_buffers: Default::default(),
            options,
            closed: AtomicBool::new(false),
            user_bytes_read_now: StripedCounter::default(),
            read_index,
            reads_without_ledger_lock: StripedCounter::default(),
            recovery_report: Mutex::new(None),
            stats: Mutex::new(Default::default()),
            reshape: Mutex::new(Default::default()),
            reshape_paused: AtomicBool::new(false),
            row_writer: super::row_writer::RowWriter::inline(),
            flushes: Default::default(),
        }
    }
}

/// The open member at index `m` in `devices` (not retired), if any.
pub(crate) fn open_device(devices: &Devices, m: MemberIndex) -> Option<&Arc<Device>> {
    devices
        .get(m.0)
        .and_then(Option::as_ref)
        .filter(|d| !d.retired.load(Ordering::Relaxed))
}
