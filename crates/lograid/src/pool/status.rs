//! A snapshot of a pool's state and counters for `lograid status`.

use super::state::SegState;
use super::PoolInner;
use crate::device::CounterValues;
use crate::format::checkpoint::PoolCounters;
use crate::format::BLOCK_BYTES;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    pub index: usize,
    pub path: String,
    pub uuid: String,
    pub state: String,
    pub size_bytes: u64,
    pub counters: CounterValues,
}

#[derive(Debug, Clone, Serialize)]
pub struct VolumeStatus {
    pub name: String,
    pub size_bytes: u64,
    pub stored_bytes: u64,
    pub map_memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
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
    pub volumes: Vec<VolumeStatus>,
    pub counters: PoolCounters,
    pub member_bytes_written: u64,
    /// Member bytes written / volume bytes written, since creation.
    pub write_amplification: f64,
    pub checksum_errors: u64,
    pub repaired_blocks: u64,
    pub map_memory_bytes: u64,
    pub map_bytes_per_stored_block: f64,
    pub recovery: Option<super::recovery::RecoveryReport>,
}

pub fn collect(inner: &PoolInner) -> PoolStatus {
    let core = inner.core.lock();
    let shape = &inner.shape;
    let members: Vec<MemberStatus> = (0..shape.member_uuids.len())
        .map(|i| {
            let dev = inner.devices[i].as_ref();
            let state = match dev {
                None => "missing".to_string(),
                Some(_) if core.active_mask & (1 << i) == 0 => "faulted".to_string(),
                Some(_) => "online".to_string(),
            };
            MemberStatus {
                index: i,
                path: dev
                    .map(|d| d.member.describe())
                    .unwrap_or_else(|| "-".into()),
                uuid: format!("{:032x}", shape.member_uuids[i]),
                state,
                size_bytes: shape.geometry.member_blocks[i] * BLOCK_BYTES,
                counters: dev.map(|d| d.counters.values()).unwrap_or_default(),
            }
        })
        .collect();
    let volumes: Vec<VolumeStatus> = core
        .volumes
        .values()
        .map(|v| VolumeStatus {
            name: v.name.clone(),
            size_bytes: v.size_bytes,
            stored_bytes: v.map.stored_blocks() * BLOCK_BYTES,
            map_memory_bytes: v.map.memory_bytes(),
        })
        .collect();
    let member_bytes_written: u64 = members.iter().map(|m| m.counters.bytes_written).sum();
    let map_memory_bytes: u64 = volumes.iter().map(|v| v.map_memory_bytes).sum();
    let stored_blocks = core.stored_blocks;
    let missing = members.iter().filter(|m| m.state != "online").count();
    let fault = core
        .read_only_reason
        .as_ref()
        .filter(|r| r.as_str() != super::recovery::OPENED_READ_ONLY);
    let state = match (fault, missing) {
        (Some(r), _) => format!("read-only ({r})"),
        (None, 0) => "online".into(),
        (None, n) => format!("degraded ({n} member(s) unavailable)"),
    };
    PoolStatus {
        name: shape.pool_name.clone(),
        uuid: format!("{:032x}", shape.pool_uuid),
        state,
        read_only: core.read_only_reason.is_some(),
        members_total: members.len(),
        parity: shape.parity,
        chunk_bytes: shape.geometry.chunk_blocks as u64 * BLOCK_BYTES,
        segment_bytes_per_member: shape.geometry.segment_blocks as u64 * BLOCK_BYTES,
        capacity_bytes: inner.capacity_blocks * BLOCK_BYTES,
        usable_bytes: inner.usable_blocks * BLOCK_BYTES,
        stored_bytes: stored_blocks * BLOCK_BYTES,
        free_bytes: inner.usable_blocks.saturating_sub(stored_blocks) * BLOCK_BYTES,
        segments_total: core.segments.len(),
        segments_free: core.free.len(),
        segments_sealed: core
            .segments
            .iter()
            .filter(|s| s.state == SegState::Sealed)
            .count(),
        segments_pending_free: core
            .segments
            .iter()
            .filter(|s| matches!(s.state, SegState::PendingFree { .. }))
            .count(),
        volumes,
        counters: core.counters,
        member_bytes_written,
        write_amplification: if core.counters.user_bytes_written > 0 {
            member_bytes_written as f64 / core.counters.user_bytes_written as f64
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
        recovery: inner.recovery_report.lock().clone(),
        members,
    }
}
