//! A snapshot of a pool's state and counters for `lograid status`.

use super::ledger::{Ledger, SegState};
use super::stats::CleanerState;
use super::Engine;
use crate::device::CounterValues;
use crate::format::checkpoint::PoolCounters;
use crate::format::superblock::MemberState;
use crate::format::BLOCK_BYTES;
use crate::layout::MemberIndex;
use serde::{Deserialize, Serialize};

/// The cleaner's state and the write amplification it causes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CleanerStatus {
    pub state: CleanerState,
    pub policy: super::CleanerPolicy,
    pub discard: bool,
    /// Segments emptied since the pool was opened.
    pub segments_cleaned: u64,
    /// Live bytes moved by the cleaner since the pool was created.
    pub relocated_bytes: u64,
    pub discarded_bytes: u64,
    pub write_stalls: u64,
    pub write_stall_seconds: f64,
    /// Of the bytes relocated since the pool was opened: those writers out
    /// of room moved (they waited for it; the rest moved in the
    /// background), and those moved from segments the cleaner's own head
    /// had written (cold data moved again: blocks relocated before, and
    /// user writes judged long-lived).
    #[serde(default)]
    pub foreground_relocated_bytes: u64,
    #[serde(default)]
    pub relocated_again_bytes: u64,
    /// User bytes written beside the relocated data since the pool was
    /// opened, as likely to live long (their previous version had).
    #[serde(default)]
    pub long_lived_written_bytes: u64,
    /// Bytes written to the cold head since the pool was opened: blocks the
    /// cleaner moved again, kept apart from those it moved once.
    #[serde(default)]
    pub cold_written_bytes: u64,
    /// Member bytes written / volume bytes written over the last minute
    /// (or since opening, if shorter); null while nothing was written.
    pub write_amplification_last_minute: Option<f64>,
    pub window_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub index: usize,
    pub path: String,
    pub uuid: String,
    pub state: String,
    pub size_bytes: u64,
    pub counters: CounterValues,
    /// Reads, writes and flushes that took longer than `device::SLOW_IO`
    /// since the pool was opened.
    #[serde(default)]
    pub slow_ios: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub name: String,
    pub size_bytes: u64,
    pub stored_bytes: u64,
    pub map_memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub uuid: String,
    pub state: String,
    /// Opened for inspection only (writes refused).
    pub read_only: bool,
    pub members_total: usize,
    pub parity: u8,
    pub chunk_bytes: u64,
    pub segment_bytes_per_member: u64,
    pub members: Vec<MemberStatus>,
    pub capacity_bytes: u64,
    pub usable_bytes: u64,
    pub stored_bytes: u64,
    pub free_bytes: u64,
    pub segments_total: usize,
    pub segments_free: usize,
    pub segments_sealed: usize,
    pub segments_pending_free: usize,
    /// Segments holding data (sealed, open or holding the checkpoint).
    pub segments_in_use: usize,
    pub cleaner: CleanerStatus,
    pub volumes: Vec<VolumeStatus>,
    pub counters: PoolCounters,
    pub member_bytes_written: u64,
    /// Member bytes written / volume bytes written, since creation.
    pub write_amplification: f64,
    pub checksum_errors: u64,
    pub repaired_blocks: u64,
    pub map_memory_bytes: u64,
    pub map_bytes_per_stored_block: f64,
    pub recovery: Option<super::stats::RecoveryReport>,
    /// Faults, replacements and repairs since the pool was opened.
    #[serde(default)]
    pub events: Vec<Event>,
    /// A rebuild or rebalance under way.
    #[serde(default)]
    pub reshape: Option<super::ReshapeStatus>,
    /// Sub-block writes held in memory: the blocks they are in (merged
    /// into them by the next flush at the latest).
    #[serde(default)]
    pub overlay_blocks: usize,
    /// Of those, blocks not stored yet (reserved: not in `free_bytes`).
    #[serde(default)]
    pub overlay_blocks_unstored: u64,
    /// Overlays merged into their blocks since the pool was opened.
    #[serde(default)]
    pub overlays_merged: u64,
    /// The pool's health for scripts (`lograid status -x`), and why it
    /// is not healthy (one reason per line).
    #[serde(default)]
    pub health: Health,
    #[serde(default)]
    pub health_reasons: Vec<String>,
    /// Live blocks reads and scrubs found lost (more bad columns than
    /// parity) since the pool was opened.
    #[serde(default)]
    pub lost_blocks_seen: u64,
    /// Reads since the pool was opened that looked their blocks up without
    /// the ledger lock (`read_index`).
    #[serde(default)]
    pub reads_without_ledger_lock: u64,
    /// The engine's memory by kind.
    #[serde(default)]
    pub memory: MemoryUse,
}

/// The engine's memory by kind, in bytes: what its bound is made of (the
/// maps, and row buffers up to the in-flight limits). Per-thread parity
/// buffers and a server's request buffers are not in it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryUse {
    /// The volume maps (`map_memory_bytes`).
    pub map_bytes: u64,
    /// The log heads' open rows, being filled.
    pub open_row_bytes: u64,
    /// Rows sealed and not yet written (about `max_inflight_rows` and
    /// `max_inflight_bytes` at most: a request under way or a flush may
    /// seal a few rows past them).
    pub in_flight_row_bytes: u64,
    /// Buffers of written rows kept for the next rows (at most half the
    /// in-flight limits).
    pub kept_row_bytes: u64,
    /// Sub-block writes held until merged into their blocks.
    pub held_write_bytes: u64,
    /// Whole-column buffers kept for the row reads of the cleaner, scrub
    /// and rebuild (one row's columns for each of them running at once).
    #[serde(default)]
    pub column_buffer_bytes: u64,
    /// Buffers the process's threads keep for rebuilding blocks from
    /// parity (a degraded read's columns; at most 128 KiB per thread).
    /// The process's, not the pool's: each pool it has open counts them.
    #[serde(default)]
    pub scratch_bytes: u64,
    /// The sum of the above.
    pub total_bytes: u64,
}

impl MemoryUse {
    fn of(ledger: &super::ledger::Ledger, map_bytes: u64, column_buffer_bytes: u64) -> MemoryUse {
        let len = |b: &crate::device::AlignedBuf| b.len() as u64;
        let open_row_bytes = ledger
            .heads
            .iter()
            .filter_map(|h| h.open.as_ref())
            .map(|r| len(&r.buf))
            .sum();
        let in_flight_row_bytes = ledger.inflight_bytes as u64;
        let kept_row_bytes = ledger.spare_buffers.iter().map(len).sum();
        let held_write_bytes = ledger.overlays.len() as u64 * crate::format::BLOCK_BYTES;
        let scratch_bytes = crate::device::scratch_kept_bytes();
        MemoryUse {
            map_bytes,
            open_row_bytes,
            in_flight_row_bytes,
            kept_row_bytes,
            held_write_bytes,
            column_buffer_bytes,
            scratch_bytes,
            total_bytes: map_bytes
                + open_row_bytes
                + in_flight_row_bytes
                + kept_row_bytes
                + held_write_bytes
                + column_buffer_bytes
                + scratch_bytes,
        }
    }
}

/// How the pool is, worst last: what `lograid status -x` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Every member present, nothing lost, room to write.
    #[default]
    Healthy,
    /// Free space below `LOW_SPACE_PERCENT` of usable.
    LowSpace,
    /// A rebuild or rebalance is under way.
    Rebuilding,
    /// Members missing or faulted, within the parity.
    Degraded,
    /// Blocks were found lost since the pool was opened.
    DataLost,
    /// The pool stopped writing (a fault past the parity, an internal error).
    Stopped,
}

impl Health {
    /// The exit code of `lograid status -x`: 0 healthy; 1 degraded,
    /// rebuilding or short of space; 2 data lost or stopped.
    pub fn exit_code(self) -> i32 {
        match self {
            Health::Healthy => 0,
            Health::LowSpace | Health::Rebuilding | Health::Degraded => 1,
            Health::DataLost | Health::Stopped => 2,
        }
    }
}

/// The pool's health and the reasons for it (all that apply).
fn health_of(
    engine: &Engine,
    ledger: &super::ledger::Ledger,
    missing: u32,
    reshape: bool,
) -> (Health, Vec<String>) {
    let mut found = Vec::new();
    if let Some(r) = ledger.read_only_reason.as_ref().filter(|r| r.is_fault()) {
        found.push((Health::Stopped, format!("stopped writing: {r}")));
    }
    let lost = engine.stats.lock().lost_blocks_seen;
    if lost > 0 {
        found.push((
            Health::DataLost,
            format!("{lost} block(s) found lost since opened"),
        ));
    }
    if missing > 0 {
        found.push((
            Health::Degraded,
            format!("{missing} member(s) missing, faulted or not yet rebuilt"),
        ));
    }
    if reshape {
        found.push((
            Health::Rebuilding,
            "a rebuild or rebalance is under way".into(),
        ));
    }
    if ledger.space_is_low() {
        found.push((
            Health::LowSpace,
            format!(
                "low on space: {} MiB of {} MiB usable can still be written",
                (ledger.free_blocks() * BLOCK_BYTES) >> 20,
                (ledger.usable_blocks * BLOCK_BYTES) >> 20
            ),
        ));
    }
    let health = found.iter().map(|(h, _)| *h).max().unwrap_or_default();
    (health, found.into_iter().map(|(_, why)| why).collect())
}

/// A state change worth telling the user about.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub unix_time: u64,
    pub message: String,
}

pub fn collect(engine: &Engine) -> PoolStatus {
    let reshape = engine.reshape_status();
    let ledger = engine.ledger.lock();
    let shape = &engine.shape;
    let members = member_statuses(engine, &ledger);
    let volumes = volume_statuses(&ledger);
    let member_bytes_written: u64 = members.iter().map(|m| m.counters.bytes_written).sum();
    let map_memory_bytes: u64 = volumes.iter().map(|v| v.map_memory_bytes).sum();
    let stored_blocks = ledger.stored_blocks;
    let missing = engine.lost_members(&ledger);
    let state = pool_state(&ledger, missing);
    let (health, health_reasons) = health_of(engine, &ledger, missing, reshape.is_some());
    let lost_blocks_seen = engine.stats.lock().lost_blocks_seen;
    PoolStatus {
        name: shape.pool_name.clone(),
        uuid: format!("{:032x}", shape.pool_uuid),
        state,
        read_only: ledger.read_only_reason.is_some(),
        members_total: members.len(),
        parity: shape.parity(),
        chunk_bytes: shape.geometry.chunk_blocks as u64 * BLOCK_BYTES,
        segment_bytes_per_member: shape.geometry.segment_blocks as u64 * BLOCK_BYTES,
        capacity_bytes: ledger.capacity_blocks * BLOCK_BYTES,
        usable_bytes: ledger.usable_blocks * BLOCK_BYTES,
        stored_bytes: stored_blocks * BLOCK_BYTES,
        free_bytes: ledger.free_blocks() * BLOCK_BYTES,
        segments_total: ledger.segments.len(),
        segments_free: ledger.free.len(),
        segments_sealed: segments_where(&ledger, |s| s == SegState::Sealed),
        segments_pending_free: segments_where(&ledger, |s| {
            matches!(s, SegState::PendingFree { .. })
        }),
        segments_in_use: segments_where(&ledger, |s| {
            !matches!(s, SegState::Free | SegState::PendingFree { .. })
        }),
        cleaner: cleaner_status(engine, &ledger, member_bytes_written),
        volumes,
        counters: engine.counters(&ledger),
        member_bytes_written,
        write_amplification: if ledger.counters.user_bytes_written > 0 {
            member_bytes_written as f64 / ledger.counters.user_bytes_written as f64
        } else {
            0.0
        },
        checksum_errors: members.iter().map(|m| m.counters.checksum_errors).sum(),
        repaired_blocks: members.iter().map(|m| m.counters.repaired_blocks).sum(),
        map_memory_bytes,
        map_bytes_per_stored_block: if stored_blocks > 0 {
            map_memory_bytes as f64 / stored_blocks as f64
        } else {
            0.0
        },
        recovery: engine.recovery_report.lock().clone(),
        events: engine
            .stats
            .lock()
            .events
            .iter()
            .map(|(t, m)| Event {
                unix_time: *t,
                message: m.clone(),
            })
            .collect(),
        members,
        reshape,
        overlay_blocks: ledger.overlays.len(),
        overlay_blocks_unstored: ledger.overlays.unstored(),
        overlays_merged: ledger.overlays.resolved,
        reads_without_ledger_lock: engine.reads_without_ledger_lock.get(),
        health,
        health_reasons,
        lost_blocks_seen,
        memory: MemoryUse::of(
            &ledger,
            map_memory_bytes,
            engine.column_buffers.kept_bytes(),
        ),
    }
}

fn cleaner_status(
    engine: &Engine,
    ledger: &super::ledger::Ledger,
    member_bytes: u64,
) -> CleanerStatus {
    let mut stats = engine.stats.lock();
    let (user, relocated, long_lived) = (
        ledger.counters.user_bytes_written,
        ledger.counters.relocated_blocks,
        ledger.long_lived_appends,
    );
    stats.sample(user, member_bytes, relocated);
    let (t_now, ..) = *stats.samples.back().expect("just sampled");
    let (t0, user0, member0, _) = *stats.samples.front().expect("just sampled");
    let user_delta = user.saturating_sub(user0);
    CleanerStatus {
        state: stats.cleaner_state,
        policy: engine.options.cleaner_policy,
        discard: engine.options.discard,
        segments_cleaned: stats.segments_cleaned,
        relocated_bytes: relocated * BLOCK_BYTES,
        discarded_bytes: stats.discarded_bytes,
        write_stalls: stats.write_stalls,
        write_stall_seconds: stats.write_stall_ns as f64 / 1e9,
        foreground_relocated_bytes: stats.foreground_relocated_blocks * BLOCK_BYTES,
        relocated_again_bytes: stats.relocated_again_blocks * BLOCK_BYTES,
        long_lived_written_bytes: long_lived * BLOCK_BYTES,
        cold_written_bytes: ledger.cold_appends * BLOCK_BYTES,
        write_amplification_last_minute: (user_delta > 0)
            .then(|| member_bytes.saturating_sub(member0) as f64 / user_delta as f64),
        window_seconds: t_now - t0,
    }
}

/// Each member that is not removed: its path, state and counters.
fn member_statuses(engine: &Engine, ledger: &Ledger) -> Vec<MemberStatus> {
    ledger
        .members
        .iter()
        .enumerate()
        .filter(|(_, r)| r.state != MemberState::Removed)
        .map(|(i, r)| {
            let dev = engine.device_any(MemberIndex(i));
            let state = match (r.state, &dev) {
                (MemberState::Removing, None) => "leaving (missing)",
                (MemberState::Removing, Some(_)) => "leaving",
                (MemberState::Faulted, _) => "faulted",
                (_, None) => "missing",
                _ if engine.shape.stale[i].count() > 0 => "rebuilding",
                (MemberState::Joining, _) => "joining",
                _ => "online",
            };
            MemberStatus {
                index: i,
                path: dev
                    .as_ref()
                    .map(|d| d.member.describe())
                    .unwrap_or_else(|| "-".into()),
                uuid: format!("{:032x}", r.uuid),
                state: state.to_string(),
                size_bytes: r.size_blocks * BLOCK_BYTES,
                counters: dev
                    .as_ref()
                    .map(|d| d.counters.values())
                    .unwrap_or_default(),
                slow_ios: dev.map_or(0, |d| d.latency.values().slow()),
            }
        })
        .collect()
}

/// Each volume that exists: its size, what it stores, its map's memory.
fn volume_statuses(ledger: &Ledger) -> Vec<VolumeStatus> {
    ledger
        .volumes
        .values()
        .filter(|v| v.exists())
        .map(|v| {
            let map = v.map();
            VolumeStatus {
                name: v.name.clone(),
                size_bytes: v.size_bytes,
                stored_bytes: map.stored_blocks() * BLOCK_BYTES,
                map_memory_bytes: map.memory_bytes(),
            }
        })
        .collect()
}

/// "online", "degraded (...)" or "read-only (reason)" (a pool opened
/// read-only on purpose is not a fault).
fn pool_state(ledger: &Ledger, missing: u32) -> String {
    let fault = ledger.read_only_reason.as_ref().filter(|r| r.is_fault());
    match (fault, missing) {
        (Some(r), _) => format!("read-only ({r})"),
        (None, 0) => "online".into(),
        (None, n) => format!("degraded ({n} member(s) unavailable or rebuilding)"),
    }
}

fn segments_where(ledger: &Ledger, state: impl Fn(SegState) -> bool) -> usize {
    ledger.segments.iter().filter(|s| state(s.state)).count()
}
