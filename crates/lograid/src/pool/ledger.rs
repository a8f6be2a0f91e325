//! The pool's in-memory state, guarded by one mutex (`Ledger`): volumes and
//! their maps (changed only under it; each map also has its own lock, for
//! reads without this one: `read_index`), the segment table, the log heads
//! with their open rows, rows in flight, and counters. Everything here is
//! bookkeeping; no I/O happens while the lock is held except copying into
//! row buffers.

use super::read_index::{ReadIndex, SegmentRows, VolumeView};
use crate::device::AlignedBuf;
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::checkpoint::PoolCounters;
use crate::format::row::{entries_capacity, Entry, HeadId, RowKind};
use crate::format::superblock::{CheckpointPointer, MemberRecord, MemberState};
use crate::format::BLOCK_SIZE;
use crate::layout::{Pba, RowGeom, SegmentIndex};
use crate::map::VolumeMap;
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

pub const NO_SEGMENT: u32 = u32::MAX;
/// Non-slot entries (trims, zeroes) a row can take beyond its slots.
pub const EXTRA_ENTRIES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    Free,
    Open(HeadId),
    Reserved(HeadId),
    Sealed,
    /// Holds (part of) the newest durable checkpoint, or one being written.
    Checkpoint,
    /// Emptied by the cleaner or by overwrites; reusable once a flush that
    /// started after `flush_gen` has completed.
    PendingFree {
        flush_gen: u64,
    },
}

pub struct Segment {
    pub state: SegState,
    pub members_mask: u32,
    pub parity: u8,
    pub live_blocks: u32,
    pub fill_blocks: u32,
    /// Sequence number when sealed (its age, for the cleaner; for relocated
    /// data too: dating it by its blocks' original writes makes cost-benefit
    /// clean full cold segments over and over).
    pub sealed_seq: u64,
    /// Rows in offset order (this incarnation of the segment), also read
    /// without the ledger lock (`SegmentRows`).
    pub rows: SegmentRows,
    /// The head that wrote this incarnation (in memory only: a segment
    /// recovered sealed counts as the user head's).
    pub written_by: HeadId,
    /// When its blocks were written by users, on average, on the clock of
    /// `Ledger::user_appends` (a relocated block keeps its source
    /// segment's); in memory only (`lifetime`).
    pub birth: u64,
    /// Blocks counted into `birth`.
    pub births: u32,
}

impl Segment {
    pub fn free() -> Segment {
        Segment {
            state: SegState::Free,
            members_mask: 0,
            parity: 0,
            live_blocks: 0,
            fill_blocks: 0,
            sealed_seq: 0,
            rows: SegmentRows::default(),
            written_by: HeadId::User,
            birth: 0,
            births: 0,
        }
    }
}

/// A row being filled in memory.
pub struct OpenRow {
    pub kind: RowKind,
    pub buf: AlignedBuf,
    /// Header blocks reserved at the start of `buf`.
    pub header_reserve: u16,
    pub slot_capacity: u32,
    pub entry_capacity: usize,
    pub entries: Vec<Entry>,
    /// For each slot, the index of its entry.
    pub slot_entry: Vec<u32>,
    pub segment: u32,
    pub offset: u32,
    pub members_mask: u32,
    pub parity: u8,
    pub checkpoint_id: u64,
    pub checkpoint_offset: u64,
    pub payload_bytes: u32,
}

impl OpenRow {
    pub fn slots(&self) -> u32 {
        self.slot_entry.len() as u32
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.slots() == 0
    }
    pub fn is_full(&self) -> bool {
        self.slots() >= self.slot_capacity || self.entries.len() >= self.entry_capacity
    }
    pub fn slot_bytes(&self, slot: u32) -> &[u8] {
        let at = (self.header_reserve as usize + slot as usize) * BLOCK_SIZE;
        &self.buf[at..at + BLOCK_SIZE]
    }
    pub fn slot_bytes_mut(&mut self, slot: u32) -> &mut [u8] {
        let at = (self.header_reserve as usize + slot as usize) * BLOCK_SIZE;
        &mut self.buf[at..at + BLOCK_SIZE]
    }
}

/// How many header blocks and slots a full row of `k` data columns of
/// height `h` has: the smallest header that lists every slot plus
/// `EXTRA_ENTRIES`.
pub fn full_row_shape(k: usize, h: usize) -> (u16, u32) {
    let total = (k * h) as u32;
    let mut hb = 1u16;
    loop {
        let slots = total - hb as u32;
        if entries_capacity(hb) >= slots as usize + EXTRA_ENTRIES {
            return (hb, slots);
        }
        hb += 1;
        assert!(hb as u32 <= total, "row too small for its header");
    }
}

/// A row sealed and being written (reads of its blocks are served from here).
pub struct SealedRow {
    pub geom: RowGeom,
    pub head: HeadId,
    pub buf: AlignedBuf,
    /// Block index in `buf` where data column 0 starts.
    pub start_block: usize,
}

impl SealedRow {
    pub fn column(&self, col: usize) -> &[u8] {
        let h = self.geom.height as usize;
        let at = (self.start_block + col * h) * BLOCK_SIZE;
        &self.buf[at..at + h * BLOCK_SIZE]
    }
    /// The block at (col, blk) if it is a data block held in memory.
    pub fn block(&self, col: usize, blk: usize) -> Option<&[u8]> {
        (col < self.geom.data_columns as usize)
            .then(|| &self.column(col)[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE])
    }
}

pub struct Head {
    pub id: HeadId,
    pub segment: u32,
    pub offset: u32,
    pub next_segment: u32,
    pub last_crc: u32,
    pub last_seq: u64,
    pub open: Option<OpenRow>,
    /// Move to a new segment once the open row is sealed (the member set
    /// changed under it).
    pub leave_segment: bool,
    /// `next_segment` was reserved when no row of the head's segment could
    /// name it any more (after recovery): only a checkpoint records it, and
    /// the head moves there once one has (cleared by `checkpoint_log_locked`).
    pub next_unrecorded: bool,
}

impl Head {
    pub fn new(id: HeadId) -> Head {
        Head {
            id,
            segment: NO_SEGMENT,
            offset: 0,
            next_segment: NO_SEGMENT,
            last_crc: 0,
            last_seq: 0,
            open: None,
            leave_segment: false,
            next_unrecorded: false,
        }
    }
}

pub struct VolumeState {
    pub id: u32,
    pub name: String,
    /// The size reads and writes may use: a size a durable checkpoint
    /// records.
    pub size_bytes: u64,
    /// A larger size a checkpoint under way records (the volume is being
    /// grown); it becomes `size_bytes` once that checkpoint is durable. A
    /// write into the new range is refused until then: acknowledged and
    /// flushed, it would be lost with the size if the power failed first.
    pub recording_size_bytes: Option<u64>,
    /// A checkpoint under way records the volume's creation: until it is
    /// durable the volume is not handed out (nothing written to it could
    /// be lost with it).
    being_created: bool,
    pub created_unix: u64,
    /// Its map and the size reads may use, shared with its handles.
    pub view: Arc<VolumeView>,
}

impl VolumeState {
    /// A volume a checkpoint records, with its map.
    pub fn recorded(
        (id, name): (u32, String),
        size_bytes: u64,
        created_unix: u64,
        map: VolumeMap,
    ) -> VolumeState {
        VolumeState::with((id, name), size_bytes, created_unix, map, false)
    }

    /// A new volume, handed out once a checkpoint records it (`mark_created`).
    pub fn being_created(
        (id, name): (u32, String),
        size_bytes: u64,
        created_unix: u64,
    ) -> VolumeState {
        VolumeState::with(
            (id, name),
            size_bytes,
            created_unix,
            VolumeMap::default(),
            true,
        )
    }

    fn with(
        (id, name): (u32, String),
        size_bytes: u64,
        created_unix: u64,
        map: VolumeMap,
        being_created: bool,
    ) -> VolumeState {
        let v = VolumeState {
            id,
            name,
            size_bytes,
            recording_size_bytes: None,
            being_created,
            created_unix,
            view: Arc::new(VolumeView::new(map)),
        };
        v.publish();
        v
    }

    /// Created, as far as users can tell (its creation is durable).
    pub fn exists(&self) -> bool {
        !self.being_created
    }

    /// Its creation is durable: reads and writes may use it.
    pub fn mark_created(&mut self) {
        self.being_created = false;
        self.publish();
    }

    /// Its new size is durable.
    pub fn grow_to(&mut self, size_bytes: u64) {
        self.size_bytes = size_bytes;
        self.publish();
    }

    pub fn map(&self) -> RwLockReadGuard<'_, VolumeMap> {
        self.view.map()
    }

    pub fn map_mut(&mut self) -> RwLockWriteGuard<'_, VolumeMap> {
        self.view.map_mut()
    }

    /// The size reads may use: its size once it exists, else 0.
    pub fn readable_bytes(&self) -> u64 {
        if self.exists() {
            self.size_bytes
        } else {
            0
        }
    }

    /// Publishes `readable_bytes` to the view.
    fn publish(&self) {
        self.view.publish_readable_bytes(self.readable_bytes());
    }

    /// It is being deleted: no read without the ledger lock takes it from
    /// here on (before its overlays go: see `read_index`).
    pub(super) fn withdraw(&self) {
        self.view.publish_readable_bytes(0);
    }
}

impl Drop for VolumeState {
    /// A volume taken out of the ledger (deleted, or its creation undone)
    /// is read by no handle without the lock any more, and its map is
    /// freed (handles keep the view).
    fn drop(&mut self) {
        self.withdraw();
        let map = std::mem::take(&mut *self.view.map_mut());
        drop(map);
    }
}

pub struct Ledger {
    /// The volumes by id: added only by `add_volume` and taken out only by
    /// `remove_volume` (the overlay table publishes each one's overlays to
    /// its view; `check_read_index` finds one added otherwise).
    pub volumes: BTreeMap<u32, VolumeState>,
    pub segments: Vec<Segment>,
    pub free: VecDeque<u32>,
    pub heads: [Head; 4],
    pub next_seq: u64,
    pub next_volume_id: u32,
    pub inflight: Vec<Arc<SealedRow>>,
    /// The bytes of the rows in `inflight` (their buffers' lengths).
    pub inflight_bytes: usize,
    /// What reads look up without this lock (published under it).
    pub read_index: Arc<ReadIndex>,
    /// User blocks and trim/zero records appended since the pool opened (in
    /// memory only): what `SpaceStalls` watches to tell a full pool from
    /// one that moves.
    pub user_appends: u64,
    pub counters: PoolCounters,
    pub log_blocks_since_checkpoint: u64,
    /// Incremented by every flush when it seals the open rows.
    pub flush_gen: u64,
    /// The flush generation of the earliest change that only a checkpoint
    /// records, not the log (a volume deleted: its blocks released at
    /// once), if no durable checkpoint records it yet. Until one does, a
    /// flush releases only segments emptied before it: a crash before that
    /// checkpoint brings the volume back, and its blocks must still be
    /// there (`Engine::finish_flush`). Such changes and checkpoints both
    /// hold `maintenance`, so any checkpoint that completes records every
    /// one made before it (`after_checkpoint` clears this).
    pub unlogged_since_gen: Option<u64>,
    /// Every row with a sequence number up to this one is durable.
    pub flushed_seq: u64,
    /// Rows with a smaller sequence number are covered by the durable
    /// checkpoint; recovery replays the ones from here on.
    pub checkpoint_next_seq: u64,
    pub checkpoint: CheckpointPointer,
    pub checkpoint_segments: Vec<u32>,
    pub superblock_generation: u64,
    /// The member table, by index, as it is now (a fault, a member joining
    /// or leaving changes it before the superblocks record it).
    pub members: Vec<MemberRecord>,
    /// The member table as the durable superblocks record it.
    pub recorded_members: Vec<MemberRecord>,
    /// Members faulted since the pool was opened, by UUID (a slot may hold
    /// another drive since: a replacement in place), leaving ones included
    /// (they stay `Removing` in `members` for the reshape): every
    /// superblock written records each as faulted.
    pub faulted_uuids: Vec<u128>,
    /// Members eligible for new segments (state Active, present, working).
    pub active_mask: u32,
    /// Data blocks of the whole pool, and what writes may use.
    pub capacity_blocks: u64,
    pub usable_blocks: u64,
    /// Why the pool refuses writes, if it does.
    pub read_only_reason: Option<ReadOnlyReason>,
    /// Blocks stored (open or on disk) over all volumes.
    pub stored_blocks: u64,
    /// Spare aligned buffers for rows, by length.
    pub spare_buffers: Vec<AlignedBuf>,
    /// A checkpoint should be written soon (a member was faulted: the
    /// superblocks must say so).
    pub checkpoint_wanted: bool,
    /// Sub-block writes not yet merged into their blocks.
    pub overlays: super::overlay_table::OverlayTable,
    /// How long user blocks live before the cleaner finds them, on the
    /// clock of `user_appends` (`lifetime`); None until it first cleans.
    pub lifetime_threshold: Option<u64>,
    /// User blocks written to the cleaner's head as long-lived since the
    /// pool opened.
    pub long_lived_appends: u64,
    /// Blocks written to the cold head (moved again) since the pool opened.
    pub cold_appends: u64,
}

impl Ledger {
    /// Whether the durable superblocks record a member that was faulted
    /// since as one whose columns can be trusted.
    pub fn faults_unrecorded(&self) -> bool {
        self.recorded_members
            .iter()
            .any(|r| self.is_unrecorded_fault(r))
    }

    fn is_unrecorded_fault(&self, r: &MemberRecord) -> bool {
        matches!(
            r.state,
            MemberState::Active | MemberState::Joining | MemberState::Removing
        ) && self.faulted_uuids.contains(&r.uuid)
    }

    /// `table` with every member faulted since the pool was opened
    /// recorded faulted (a leaving one too: after a restart it is not
    /// trusted, and is replaced like any faulted member).
    pub fn with_faults(&self, mut table: Vec<MemberRecord>) -> Vec<MemberRecord> {
        for r in table.iter_mut() {
            if self.is_unrecorded_fault(r) {
                r.state = MemberState::Faulted;
            }
        }
        table
    }

    /// Members (mask) in `state`.
    pub fn members_in(&self, state: MemberState) -> u32 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == state)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// Segment `s`'s bookkeeping.
    pub fn segment(&self, s: SegmentIndex) -> &Segment {
        &self.segments[s.slot()]
    }

    /// Segment `s`'s bookkeeping, to change.
    pub fn segment_mut(&mut self, s: SegmentIndex) -> &mut Segment {
        &mut self.segments[s.slot()]
    }

    /// Every segment of the data area, in order.
    pub fn segment_indices(&self) -> impl Iterator<Item = SegmentIndex> {
        (0..self.segments.len() as u32).map(SegmentIndex)
    }

    pub fn volume(&self, id: u32) -> Option<&VolumeState> {
        self.volumes.get(&id)
    }

    /// Adds a volume (its id new: callers check); the overlay table
    /// publishes its overlays to its view.
    pub fn add_volume(&mut self, volume: VolumeState) {
        let id = volume.id;
        assert!(!self.volumes.contains_key(&id), "volume {id} added twice");
        self.overlays.watch(id, volume.view.overlays_counter());
        self.volumes.insert(id, volume);
    }

    /// Takes volume `id` out (deleted, or its creation failed), in the
    /// order reads without the ledger lock rely on (`read_index`): its size
    /// withdrawn, then its overlays dropped. The caller frees its blocks;
    /// its map is freed when the returned state is dropped.
    pub fn remove_volume(&mut self, id: u32) -> Option<VolumeState> {
        let vol = self.volumes.remove(&id)?;
        vol.withdraw();
        crate::sync::schedule_point();
        self.overlays.remove_volume(id);
        crate::sync::schedule_point();
        Some(vol)
    }

    /// Publishes the rows in flight for reads without this lock, with
    /// `sealing` (a row about to be pushed: published before the map names
    /// its blocks).
    pub fn publish_rows_in_flight(&self, sealing: Option<RowGeom>) {
        let rows = self.inflight.iter().map(|r| r.geom).chain(sealing);
        self.read_index.publish_rows_in_flight(rows);
    }

    /// Publishes the segments' row lists to reads without this lock (when
    /// the segment table is made or grows).
    pub fn publish_segment_rows(&self) {
        self.read_index
            .publish_segments(self.segments.iter().map(|s| &s.rows));
    }

    /// What reads without the lock look up agrees with the ledger: the
    /// segments' row lists, the rows in flight, the overlays held, each
    /// volume's readable size.
    fn check_read_index(&self) -> std::result::Result<(), String> {
        if !self
            .read_index
            .segments_published(self.segments.iter().map(|s| &s.rows))
        {
            return Err(format!(
                "the row lists published for reads are not those of the {} segments",
                self.segments.len()
            ));
        }
        let published = self.read_index.rows_in_flight();
        if published.len() != self.inflight.len()
            || !self.inflight.iter().all(|r| published.contains(&r.geom))
        {
            return Err(format!(
                "{} rows in flight, {} published for reads",
                self.inflight.len(),
                published.len()
            ));
        }
        if self.overlays.published_volumes() != self.volumes.len() {
            return Err(format!(
                "{} volumes' overlays published, {} volumes",
                self.overlays.published_volumes(),
                self.volumes.len()
            ));
        }
        for v in self.volumes.values() {
            if !self.overlays.publishes_to(v.id, &v.view.overlays_counter()) {
                return Err(format!(
                    "volume {}'s overlays are not published to its view",
                    v.id
                ));
            }
            if v.view.readable_bytes() != v.readable_bytes() {
                return Err(format!(
                    "volume {} reads {} bytes, published {}",
                    v.id,
                    v.readable_bytes(),
                    v.view.readable_bytes()
                ));
            }
        }
        Ok(())
    }

    /// Data held in memory for `pba` (a row in flight), if any.
    pub fn inflight_block(&self, geometry: &crate::layout::Geometry, pba: Pba) -> Option<&[u8]> {
        for row in &self.inflight {
            if let Some((col, blk)) = row.geom.locate(geometry, pba) {
                return row.block(col, blk);
            }
        }
        None
    }

    /// Takes a spare row buffer of `len` bytes or allocates one.
    pub fn buffer(&mut self, len: usize) -> AlignedBuf {
        if let Some(i) = self.spare_buffers.iter().position(|b| b.len() == len) {
            return self.spare_buffers.swap_remove(i);
        }
        AlignedBuf::zeroed(len)
    }

    /// Keeps a written row's buffer for a later row, unless `keep_rows` spare buffers or
    /// `keep_bytes` spare bytes are kept already (then it is freed). Spares of another length
    /// (rows from before the row width changed) are freed first: only an exact length is
    /// ever reused.
    pub fn recycle(&mut self, buf: AlignedBuf, keep_rows: usize, keep_bytes: usize) {
        self.spare_buffers.retain(|b| b.len() == buf.len());
        let spare_bytes: usize = self.spare_buffers.iter().map(|b| b.len()).sum();
        if self.spare_buffers.len() < keep_rows && spare_bytes + buf.len() <= keep_bytes {
            self.spare_buffers.push(buf);
        }
    }
}

impl Ledger {
    /// Checks the bookkeeping invariants; returns the first violation.
    /// Cheap enough for tests to call after every operation.
    pub fn check_invariants(&self, shape: &super::Shape) -> Result<(), String> {
        let mut in_free = vec![false; self.segments.len()];
        for &s in &self.free {
            let s = s as usize;
            if in_free[s] {
                return Err(format!("segment {s} is in the free list twice"));
            }
            in_free[s] = true;
            if self.segments[s].state != SegState::Free {
                return Err(format!(
                    "segment {s} is in the free list but {:?}",
                    self.segments[s].state
                ));
            }
        }
        for (s, seg) in self.segments.iter().enumerate() {
            let mask = shape.geometry.segment_members(s as u32, self.active_mask);
            if seg.state == SegState::Free
                && !in_free[s]
                && shape.segment_usable(mask, self.active_mask)
            {
                return Err(format!("segment {s} is free but not in the free list"));
            }
        }
        for h in HeadId::DATA.map(|h| &self.heads[h.index()]) {
            if h.segment != NO_SEGMENT
                && self.segments[h.segment as usize].state != SegState::Open(h.id)
            {
                return Err(format!(
                    "head {:?} is in segment {} which is {:?}",
                    h.id, h.segment, self.segments[h.segment as usize].state
                ));
            }
            if h.next_unrecorded && h.next_segment == NO_SEGMENT {
                return Err(format!("head {:?} waits to record no segment", h.id));
            }
            if h.next_segment != NO_SEGMENT
                && self.segments[h.next_segment as usize].state != SegState::Reserved(h.id)
            {
                return Err(format!(
                    "head {:?} reserved segment {} which is {:?}",
                    h.id, h.next_segment, self.segments[h.next_segment as usize].state
                ));
            }
        }
        let inflight_bytes: usize = self.inflight.iter().map(|r| r.buf.len()).sum();
        if inflight_bytes != self.inflight_bytes {
            return Err(format!(
                "rows in flight hold {inflight_bytes} bytes, counted {}",
                self.inflight_bytes
            ));
        }
        self.check_read_index()?;
        let (live, stored) = self.check_map_entries(shape, check_threads(self.stored_blocks))?;
        for (s, seg) in self.segments.iter().enumerate() {
            if seg.live_blocks != live[s] {
                return Err(format!(
                    "segment {s}: live count {} but {} blocks map into it",
                    seg.live_blocks, live[s]
                ));
            }
        }
        if stored != self.stored_blocks {
            return Err(format!(
                "stored blocks {} but maps hold {stored}",
                self.stored_blocks
            ));
        }
        self.overlays
            .check(|vol, lba| self.volume(vol).map(|v| v.map().get(lba).0.is_stored()))
    }
}

/// Stored blocks from which the check of the maps at opening is split over
/// threads (about 50 ns a block on one core, 3 ms for these; 13 s for a
/// pool holding 1 TB of 4 KiB blocks written at random), against about
/// 50 µs to start a thread.
const PARALLEL_CHECK_BLOCKS: u64 = 1 << 16;

/// Threads the check of the maps uses at most.
const MAX_CHECK_THREADS: usize = 16;

/// Threads for checking maps holding `stored` blocks: one below
/// `PARALLEL_CHECK_BLOCKS`, else one per CPU, at most `MAX_CHECK_THREADS`.
fn check_threads(stored: u64) -> usize {
    if stored < PARALLEL_CHECK_BLOCKS {
        return 1;
    }
    crate::sync::available_cpus().clamp(1, MAX_CHECK_THREADS)
}

impl Ledger {
    /// Checks every map entry against the segment table (a block on a
    /// member lies in a data slot of a row of a segment holding data) and
    /// counts the blocks on members per segment and the blocks stored; on
    /// `threads` threads, each volume split into that many block ranges
    /// (the last one open, so that an entry past the volume's size is
    /// checked too), against a copy of the segments' row lists.
    fn check_map_entries(
        &self,
        shape: &super::Shape,
        threads: usize,
    ) -> Result<(Vec<u32>, u64), String> {
        let threads = threads.max(1);
        let parts: Vec<(&VolumeState, std::ops::Range<u64>)> = self
            .volumes
            .values()
            .flat_map(|v| {
                let blocks = v.size_bytes.div_ceil(crate::format::BLOCK_BYTES);
                let step = blocks.div_ceil(threads as u64).max(1);
                let last = threads as u64 - 1;
                (0..threads as u64).map(move |t| {
                    let end = if t == last {
                        u64::MAX
                    } else {
                        ((t + 1) * step).min(blocks)
                    };
                    (v, (t * step).min(blocks)..end)
                })
            })
            .collect();
        let rows: Vec<Vec<RowGeom>> = self.segments.iter().map(|s| s.rows.to_vec()).collect();
        let tallies = crate::sync::parallel(threads, |t| {
            let mut tally = (vec![0u32; self.segments.len()], 0u64);
            for (v, range) in parts.iter().skip(t).step_by(threads) {
                self.check_map_range(shape, &rows, (v, range.clone()), &mut tally)?;
            }
            Ok::<_, String>(tally)
        });
        let mut live = vec![0u32; self.segments.len()];
        let mut stored = 0u64;
        for tally in tallies {
            let (l, n) = tally?;
            for (sum, x) in live.iter_mut().zip(l) {
                *sum += x;
            }
            stored += n;
        }
        Ok((live, stored))
    }

    /// `check_map_entries` for blocks `range` of volume `v` (`rows`: each
    /// segment's rows), counted into `(live, stored)`.
    fn check_map_range(
        &self,
        shape: &super::Shape,
        rows: &[Vec<RowGeom>],
        (v, range): (&VolumeState, std::ops::Range<u64>),
        (live, stored): &mut (Vec<u32>, u64),
    ) -> Result<(), String> {
        let map = v.map();
        for (lba, loc, _) in map.iter_range(range) {
            if loc.is_stored() {
                *stored += 1;
            }
            let crate::map::Loc::Disk(pba) = loc else {
                continue;
            };
            let (s, off) = shape
                .geometry
                .segment_of(pba.block)
                .ok_or("mapped block outside the data area")?;
            live[s as usize] += 1;
            let seg = &self.segments[s as usize];
            if matches!(
                seg.state,
                SegState::Free | SegState::Reserved(_) | SegState::Checkpoint
            ) {
                return Err(format!(
                    "volume {} block {lba} maps into segment {s} which is {:?}",
                    v.id, seg.state
                ));
            }
            let slot = super::read_index::row_in(&rows[s as usize], off)
                .and_then(|r| r.slot_of(&shape.geometry, pba));
            if slot.is_none() {
                return Err(format!(
                    "volume {} block {lba} maps to member {} block {} (segment {s}), \
                     not a data slot of any row",
                    v.id, pba.member, pba.block
                ));
            }
        }
        Ok(())
    }
}

/// Refuses with the reason the pool stopped writing, if it did.
pub(crate) fn check_writable(ledger: &Ledger) -> Result<()> {
    match &ledger.read_only_reason {
        Some(r) => Err(Error::ReadOnly(r.clone())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::format::BLOCK_SIZE;
    use crate::layout::Pba;
    use crate::map::Loc;
    use crate::pool::test_pool::sim_pool;

    /// The opening's check is split from `PARALLEL_CHECK_BLOCKS` stored
    /// blocks on, over the CPUs up to the cap.
    #[test]
    fn the_map_check_splits_from_its_threshold() {
        assert_eq!(super::check_threads(0), 1);
        assert_eq!(super::check_threads(super::PARALLEL_CHECK_BLOCKS - 1), 1);
        let cpus = crate::sync::available_cpus();
        let split = super::check_threads(super::PARALLEL_CHECK_BLOCKS);
        assert_eq!(split, cpus.clamp(1, super::MAX_CHECK_THREADS));
        assert_eq!(super::check_threads(u64::MAX), split);
    }

    /// The check of the maps at opening, split over threads by block range,
    /// counts as it does on one, and refuses a forged entry wherever it
    /// lies: inside the volume, or past its size (the last range is open).
    #[test]
    fn the_map_check_split_over_threads_counts_and_refuses_as_on_one() {
        let (pool, vol, _sims) = sim_pool();
        let blocks = vol.size_bytes() / BLOCK_SIZE as u64;
        for b in (0..blocks).step_by(3) {
            vol.write(b * BLOCK_SIZE as u64, &[b as u8; BLOCK_SIZE])
                .unwrap();
        }
        vol.flush().unwrap();
        let shape = &pool.engine.shape;
        let mut ledger = pool.engine.ledger.lock();
        let one = ledger.check_map_entries(shape, 1).unwrap();
        assert_eq!(one.1, blocks.div_ceil(3), "setup: blocks stored");
        for threads in [2, 3, 7, 300] {
            assert_eq!(ledger.check_map_entries(shape, threads).unwrap(), one);
        }
        // A block mapped into a free segment, then the same past the size.
        let free = *ledger.free.front().unwrap();
        let g = &shape.geometry;
        let pba = Pba {
            member: 0,
            block: g.data_start_block + u64::from(free) * u64::from(g.segment_blocks),
        };
        let id = ledger.volumes.keys().next().copied().unwrap();
        for lba in [blocks / 2 + 1, blocks + 5] {
            let old = ledger
                .volumes
                .get_mut(&id)
                .unwrap()
                .map_mut()
                .set(lba, Loc::Disk(pba), 1);
            for threads in [1, 2, 3, 7] {
                let refused = ledger.check_map_entries(shape, threads).unwrap_err();
                assert!(
                    refused.contains(&format!("block {lba} maps into segment {free}")),
                    "{threads} threads: {refused}"
                );
            }
            ledger
                .volumes
                .get_mut(&id)
                .unwrap()
                .map_mut()
                .set(lba, old.0, old.1);
        }
        assert_eq!(ledger.check_map_entries(shape, 2).unwrap(), one);
    }
}
