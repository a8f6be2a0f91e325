//! The checkpoint: a snapshot of the volume table and maps, the segment
//! table (state, members, live count, row list), the log heads and the
//! in-place rebuilds under way (segments a member does not hold yet), as of a
//! sealed point in the log. It is stored as the payload of checkpoint rows;
//! the superblock points at the newest one. Recovery loads it and rolls the
//! log forward from the heads it records. Layout: docs/FORMAT.md,
//! "Checkpoint".

use super::{ByteReader, ByteWriter, FormatError, FORMAT_VERSION, MAX_SEGMENTS};
use crate::device::CounterValues;
use crate::layout::RowGeom;

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"LGRDCKPT";

/// Limits that bound what a hostile checkpoint can make us allocate.
const MAX_VOLUMES: u64 = 1 << 16;
const MAX_ROWS_PER_SEGMENT: u64 = 1 << 20;
const MAX_RUNS: u64 = 1 << 40;
const MAX_HEADS: u64 = 8;

/// Sizes of the checkpoint's parts (docs/FORMAT.md, "Checkpoint: fixed
/// prefix" and the tables after it). The decoder bounds allocations with
/// them; the offsets below are the documented ones.
const MEMBER_COUNTER_COUNT_AT: usize = 88;
const MEMBER_COUNTERS_AT: usize = 96;
/// Per member: 8 u64 counters.
const MEMBER_COUNTER_BYTES: usize = 64;
/// A map entry of a run: location (u64) and CRC (u32).
const MAP_ENTRY_BYTES: usize = 12;
/// A segment record without its rows (row count included).
const SEGMENT_RECORD_BYTES: usize = 30;
/// A row record of a segment.
const ROW_RECORD_BYTES: usize = 21;
/// A head record.
const HEAD_RECORD_BYTES: usize = 24;
/// A rebuild run: start and length (u32 each).
const REBUILD_RUN_BYTES: usize = 8;

// The documented sizes and offsets are the sums of the fields' widths, in
// the order the writer streams them.
const _: () = {
    const U8: usize = size_of::<u8>();
    const U16: usize = size_of::<u16>();
    const U32: usize = size_of::<u32>();
    const U64: usize = size_of::<u64>();
    // magic, version, checkpoint_id, next_seq, next_volume_id, 7 counters.
    let counters_at = CHECKPOINT_MAGIC.len() + U32 + U64 + U64 + U32;
    assert!(counters_at == 32);
    assert!(counters_at + 7 * U64 == MEMBER_COUNTER_COUNT_AT);
    assert!(MEMBER_COUNTER_COUNT_AT + U64 == MEMBER_COUNTERS_AT);
    assert!(MEMBER_COUNTER_BYTES == 8 * U64);
    assert!(MAP_ENTRY_BYTES == U64 + U32);
    // state, members_mask, parity, live_blocks, fill_blocks, sealed_seq, row_count.
    assert!(SEGMENT_RECORD_BYTES == U8 + U32 + U8 + U32 + U32 + U64 + U64);
    // offset, height, data_columns, header_blocks, slots, seq.
    assert!(ROW_RECORD_BYTES == U32 + U16 + U8 + U16 + U32 + U64);
    // segment, offset, next_segment, last_crc, last_seq.
    assert!(HEAD_RECORD_BYTES == 4 * U32 + U64);
    assert!(REBUILD_RUN_BYTES == 2 * U32);
    // Segment numbers (u32 on disk) and row records' segment field.
    assert!(MAX_SEGMENTS <= u32::MAX as u64);
    // The heads the engine writes fit the decoder's limit.
    assert!(super::row::HeadId::ALL.len() as u64 <= MAX_HEADS);
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentStateCode {
    Free = 0,
    /// Being written by a log head (user 1, cleaner 2, cold 6).
    OpenUser = 1,
    OpenCleaner = 2,
    Sealed = 3,
    /// Reserved as the next segment of a head (user 4, cleaner 5, cold 7).
    ReservedUser = 4,
    ReservedCleaner = 5,
    OpenCold = 6,
    ReservedCold = 7,
}

impl SegmentStateCode {
    fn from_code(c: u8) -> Result<Self, FormatError> {
        Ok(match c {
            0 => Self::Free,
            1 => Self::OpenUser,
            2 => Self::OpenCleaner,
            3 => Self::Sealed,
            4 => Self::ReservedUser,
            5 => Self::ReservedCleaner,
            6 => Self::OpenCold,
            7 => Self::ReservedCold,
            _ => return Err(FormatError::Invalid(format!("segment state {c}"))),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    pub state: SegmentStateCode,
    pub members_mask: u32,
    pub parity: u8,
    pub live_blocks: u32,
    pub fill_blocks: u32,
    pub sealed_seq: u64,
    pub rows: Vec<RowGeom>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeadRecord {
    /// u32::MAX: no segment yet.
    pub segment: u32,
    pub offset: u32,
    pub next_segment: u32,
    pub last_crc: u32,
    pub last_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix: u64,
    /// (lba, encoded location, crc) in LBA order.
    pub entries: Vec<(u64, u64, u32)>,
}

/// Pool-wide counters kept across restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PoolCounters {
    pub user_bytes_written: u64,
    pub user_bytes_read: u64,
    pub relocated_blocks: u64,
    pub trimmed_blocks: u64,
    pub checkpoints: u64,
    pub rows_written: u64,
    pub short_rows: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointImage {
    pub checkpoint_id: u64,
    pub next_seq: u64,
    pub next_volume_id: u32,
    pub counters: PoolCounters,
    pub member_counters: Vec<CounterValues>,
    pub volumes: Vec<VolumeRecord>,
    pub segments: Vec<SegmentRecord>,
    pub heads: Vec<HeadRecord>,
    /// Members that took a failed member's place, with the segments not yet
    /// rebuilt onto them.
    pub rebuilds: Vec<RebuildRecord>,
}

/// A member being rebuilt in place: the segments it does not hold yet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebuildRecord {
    pub member: u8,
    /// Rows with a smaller sequence number were written before it took its
    /// place (rows written since are on it).
    pub since_seq: u64,
    /// Stale segments, strictly increasing.
    pub segments: Vec<u32>,
}

/// Streams a checkpoint out; the caller adds volumes and segments in that
/// order, then finishes with the heads and rebuilds.
pub struct CheckpointWriter {
    w: ByteWriter,
}

impl CheckpointWriter {
    pub fn new(
        checkpoint_id: u64,
        next_seq: u64,
        next_volume_id: u32,
        counters: &PoolCounters,
        member_counters: &[CounterValues],
        volume_count: usize,
    ) -> Self {
        let mut w = ByteWriter::with_capacity(1 << 16);
        w.raw(&CHECKPOINT_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u64(checkpoint_id);
        w.u64(next_seq);
        w.u32(next_volume_id);
        for v in [
            counters.user_bytes_written,
            counters.user_bytes_read,
            counters.relocated_blocks,
            counters.trimmed_blocks,
            counters.checkpoints,
            counters.rows_written,
            counters.short_rows,
        ] {
            w.u64(v);
        }
        w.u64(member_counters.len() as u64);
        for c in member_counters {
            for v in [
                c.bytes_read,
                c.bytes_written,
                c.reads,
                c.writes,
                c.flushes,
                c.io_errors,
                c.checksum_errors,
                c.repaired_blocks,
            ] {
                w.u64(v);
            }
        }
        debug_assert_eq!(
            w.len(),
            MEMBER_COUNTERS_AT + MEMBER_COUNTER_BYTES * member_counters.len(),
            "checkpoint prefix layout"
        );
        w.u64(volume_count as u64);
        CheckpointWriter { w }
    }

    /// One volume; `entries` in LBA order.
    pub fn volume(
        &mut self,
        id: u32,
        name: &str,
        size_bytes: u64,
        created_unix: u64,
        entries: impl Iterator<Item = (u64, u64, u32)>,
    ) {
        let w = &mut self.w;
        w.u32(id);
        w.str16(name);
        w.u64(size_bytes);
        w.u64(created_unix);
        // Runs of consecutive LBAs: (start, length) then the entries, written in place (the
        // run count and each run's length patched once known: no second buffer, no copy).
        let count_at = w.len();
        w.u64(0);
        let mut run_count = 0u64;
        // The current run: where its length goes, its first LBA, its length.
        let mut run: Option<(usize, u64, u32)> = None;
        for (lba, loc, crc) in entries {
            let extends = run.is_some_and(|(_, start, len)| {
                start.checked_add(u64::from(len)) == Some(lba) && len < u32::MAX
            });
            if !extends {
                if let Some((len_at, _, len)) = run {
                    w.u32_at(len_at, len);
                }
                w.u64(lba);
                run = Some((w.len(), lba, 0));
                w.u32(0);
                run_count += 1;
            }
            if let Some((_, _, len)) = &mut run {
                *len += 1;
            }
            w.u64(loc);
            w.u32(crc);
        }
        if let Some((len_at, _, len)) = run {
            w.u32_at(len_at, len);
        }
        w.u64_at(count_at, run_count);
    }

    /// Makes room for `bytes` more (the caller's estimate of what follows), so that encoding
    /// a large map does not grow the buffer by doubling (a copy, and up to twice the memory).
    pub fn reserve(&mut self, bytes: usize) {
        self.w.reserve(bytes);
    }

    pub fn segments(&mut self, segments: &[SegmentRecord]) {
        let w = &mut self.w;
        let at = w.len();
        w.u64(segments.len() as u64);
        for s in segments {
            w.u8(s.state as u8);
            w.u32(s.members_mask);
            w.u8(s.parity);
            w.u32(s.live_blocks);
            w.u32(s.fill_blocks);
            w.u64(s.sealed_seq);
            w.u64(s.rows.len() as u64);
            for r in &s.rows {
                w.u32(r.offset);
                w.u16(r.height);
                w.u8(r.data_columns);
                w.u16(r.header_blocks);
                w.u32(r.slots);
                w.u64(r.seq);
            }
        }
        debug_assert_eq!(
            w.len() - at,
            8 + segments
                .iter()
                .map(|s| SEGMENT_RECORD_BYTES + ROW_RECORD_BYTES * s.rows.len())
                .sum::<usize>(),
            "checkpoint segment table layout"
        );
    }

    pub fn finish(mut self, heads: &[HeadRecord], rebuilds: &[RebuildRecord]) -> Vec<u8> {
        let w = &mut self.w;
        let at = w.len();
        w.u64(heads.len() as u64);
        for h in heads {
            w.u32(h.segment);
            w.u32(h.offset);
            w.u32(h.next_segment);
            w.u32(h.last_crc);
            w.u64(h.last_seq);
        }
        debug_assert_eq!(
            w.len() - at,
            8 + HEAD_RECORD_BYTES * heads.len(),
            "checkpoint heads layout"
        );
        w.u64(rebuilds.len() as u64);
        for r in rebuilds {
            w.u8(r.member);
            w.u64(r.since_seq);
            let runs = segment_runs(&r.segments);
            w.u64(runs.len() as u64);
            for (start, len) in runs {
                w.u32(start);
                w.u32(len);
            }
        }
        self.w.bytes
    }
}

impl CheckpointImage {
    /// Decodes a blob, part by part in the order the writer streams them:
    /// the fixed prefix, the member counters, the volumes, the segment
    /// table, the heads and the rebuilds; nothing may follow.
    pub fn decode(bytes: &[u8]) -> Result<CheckpointImage, FormatError> {
        let mut r = ByteReader::new(bytes);
        let prefix = read_prefix(&mut r)?;
        let member_counters = read_member_counters(&mut r)?;
        let volumes = read_volumes(&mut r)?;
        let segments = read_segments(&mut r)?;
        let heads = read_heads(&mut r)?;
        let rebuilds = read_rebuilds(&mut r, segments.len() as u64)?;
        if r.remaining() != 0 {
            return Err(FormatError::Invalid(format!(
                "{} trailing bytes",
                r.remaining()
            )));
        }
        Ok(CheckpointImage {
            checkpoint_id: prefix.checkpoint_id,
            next_seq: prefix.next_seq,
            next_volume_id: prefix.next_volume_id,
            counters: prefix.counters,
            member_counters,
            volumes,
            segments,
            heads,
            rebuilds,
        })
    }
}

/// The fixed prefix up to the member counters (offsets 0 to 88).
struct Prefix {
    checkpoint_id: u64,
    next_seq: u64,
    next_volume_id: u32,
    counters: PoolCounters,
}

/// Magic, version, ids and the pool counters.
fn read_prefix(r: &mut ByteReader) -> Result<Prefix, FormatError> {
    if r.take(CHECKPOINT_MAGIC.len())? != CHECKPOINT_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::BadVersion(version));
    }
    Ok(Prefix {
        checkpoint_id: r.u64()?,
        next_seq: r.u64()?,
        next_volume_id: r.u32()?,
        counters: PoolCounters {
            user_bytes_written: r.u64()?,
            user_bytes_read: r.u64()?,
            relocated_blocks: r.u64()?,
            trimmed_blocks: r.u64()?,
            checkpoints: r.u64()?,
            rows_written: r.u64()?,
            short_rows: r.u64()?,
        },
    })
}

/// The member counter count, then 8 u64 per member.
fn read_member_counters(r: &mut ByteReader) -> Result<Vec<CounterValues>, FormatError> {
    let n = r.count(super::MAX_MEMBERS as u64, "member counters")?;
    let mut member_counters = Vec::with_capacity(n);
    for _ in 0..n {
        member_counters.push(CounterValues {
            bytes_read: r.u64()?,
            bytes_written: r.u64()?,
            reads: r.u64()?,
            writes: r.u64()?,
            flushes: r.u64()?,
            io_errors: r.u64()?,
            checksum_errors: r.u64()?,
            repaired_blocks: r.u64()?,
        });
    }
    Ok(member_counters)
}

/// "Volumes": the volume count, then each volume and its map.
fn read_volumes(r: &mut ByteReader) -> Result<Vec<VolumeRecord>, FormatError> {
    let nv = r.count(MAX_VOLUMES, "volume")?;
    let mut volumes = Vec::with_capacity(nv);
    for _ in 0..nv {
        let id = r.u32()?;
        let name = r.str16()?;
        let size_bytes = r.u64()?;
        let created_unix = r.u64()?;
        let entries = read_map_runs(r, id)?;
        volumes.push(VolumeRecord {
            id,
            name,
            size_bytes,
            created_unix,
            entries,
        });
    }
    Ok(volumes)
}

/// A volume's map: the run count, then the runs, their LBAs strictly
/// increasing over the volume.
fn read_map_runs(r: &mut ByteReader, id: u32) -> Result<Vec<(u64, u64, u32)>, FormatError> {
    let runs = r.count(MAX_RUNS, "map run")?;
    let mut entries: Vec<(u64, u64, u32)> = Vec::new();
    for _ in 0..runs {
        let start = r.u64()?;
        if entries.last().is_some_and(|e| e.0 >= start) {
            return Err(FormatError::Invalid(format!(
                "volume {id}: map runs out of order at block {start}"
            )));
        }
        read_map_run_entries(r, start, &mut entries)?;
    }
    Ok(entries)
}

/// One run after its start LBA: its length, then that many entries (a
/// location and a CRC each) for LBAs `start`, `start + 1`, ...
fn read_map_run_entries(
    r: &mut ByteReader,
    start: u64,
    entries: &mut Vec<(u64, u64, u32)>,
) -> Result<(), FormatError> {
    let len = r.u32()? as u64;
    if len > (r.remaining() / MAP_ENTRY_BYTES) as u64 {
        return Err(FormatError::Truncated {
            needed: (len * MAP_ENTRY_BYTES as u64) as usize,
            available: r.remaining(),
        });
    }
    for i in 0..len {
        let lba = start
            .checked_add(i)
            .ok_or_else(|| FormatError::Invalid("map run overflows".into()))?;
        let loc = r.u64()?;
        let crc = r.u32()?;
        entries.push((lba, loc, crc));
    }
    Ok(())
}

/// "Segments": the segment count, then each segment record and its rows.
fn read_segments(r: &mut ByteReader) -> Result<Vec<SegmentRecord>, FormatError> {
    let ns = r.count(MAX_SEGMENTS, "segment")?;
    let mut segments = Vec::with_capacity(ns.min(r.remaining() / SEGMENT_RECORD_BYTES));
    for s in 0..ns {
        segments.push(read_segment(r, s as u32)?);
    }
    Ok(segments)
}

/// Segment `s`'s record: its fixed fields, the row count, the rows.
fn read_segment(r: &mut ByteReader, s: u32) -> Result<SegmentRecord, FormatError> {
    let state = SegmentStateCode::from_code(r.u8()?)?;
    let members_mask = r.u32()?;
    let parity = r.u8()?;
    let live_blocks = r.u32()?;
    let fill_blocks = r.u32()?;
    let sealed_seq = r.u64()?;
    let nr = r.count(MAX_ROWS_PER_SEGMENT, "row")?;
    let mut rows = Vec::with_capacity(nr.min(r.remaining() / ROW_RECORD_BYTES));
    for _ in 0..nr {
        rows.push(RowGeom {
            segment: s,
            offset: r.u32()?,
            height: r.u16()?,
            data_columns: r.u8()?,
            header_blocks: r.u16()?,
            slots: r.u32()?,
            members_mask,
            parity,
            seq: r.u64()?,
        });
    }
    Ok(SegmentRecord {
        state,
        members_mask,
        parity,
        live_blocks,
        fill_blocks,
        sealed_seq,
        rows,
    })
}

/// "Heads": the head count (at most 8), then 24 bytes per head.
fn read_heads(r: &mut ByteReader) -> Result<Vec<HeadRecord>, FormatError> {
    let nh = r.count(MAX_HEADS, "head")?;
    let mut heads = Vec::with_capacity(nh);
    for _ in 0..nh {
        heads.push(HeadRecord {
            segment: r.u32()?,
            offset: r.u32()?,
            next_segment: r.u32()?,
            last_crc: r.u32()?,
            last_seq: r.u64()?,
        });
    }
    Ok(heads)
}

/// "Rebuilds": the count, then each member's record, in increasing member
/// order; its runs lie within the `segments_total` segments of the table.
fn read_rebuilds(
    r: &mut ByteReader,
    segments_total: u64,
) -> Result<Vec<RebuildRecord>, FormatError> {
    let mut rebuilds: Vec<RebuildRecord> = Vec::new();
    let nr = r.count(super::MAX_MEMBERS as u64, "rebuild")?;
    for _ in 0..nr {
        let member = r.u8()?;
        if member as usize >= super::MAX_MEMBERS
            || rebuilds.last().is_some_and(|p| p.member >= member)
        {
            return Err(FormatError::Invalid(format!(
                "rebuild of member {member}: out of range or out of order"
            )));
        }
        let since_seq = r.u64()?;
        let segments = read_rebuild_runs(r, member, segments_total)?;
        rebuilds.push(RebuildRecord {
            member,
            since_seq,
            segments,
        });
    }
    Ok(rebuilds)
}

/// A rebuild's run count (bounded by what remains, 8 bytes a run), then
/// its runs: non-empty, strictly increasing, within the segment table
/// (which bounds what this allocates by the blob's own size).
fn read_rebuild_runs(
    r: &mut ByteReader,
    member: u8,
    segments_total: u64,
) -> Result<Vec<u32>, FormatError> {
    let runs = r.count((r.remaining() / REBUILD_RUN_BYTES) as u64, "rebuild run")?;
    let mut listed: Vec<u32> = Vec::new();
    for _ in 0..runs {
        let (start, len) = (r.u32()?, r.u32()?);
        let end = start as u64 + len as u64;
        if len == 0 || end > segments_total || listed.last().is_some_and(|&l| l >= start) {
            return Err(FormatError::Invalid(format!(
                "rebuild of member {member}: bad segment run {start}+{len}"
            )));
        }
        listed.extend(start..end as u32);
    }
    Ok(listed)
}

/// Strictly increasing segments as (start, length) runs.
fn segment_runs(segments: &[u32]) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &s in segments {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == s => *len += 1,
            _ => {
                assert!(
                    runs.last().is_none_or(|&(a, l)| a + l < s),
                    "rebuild segments not strictly increasing"
                );
                runs.push((s, 1));
            }
        }
    }
    runs
}
