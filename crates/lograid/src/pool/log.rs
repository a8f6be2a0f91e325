//! The log heads: opening rows in a head's segment, appending blocks and
//! trims to the open row, and sealing it into a row with a header and a
//! final geometry (a short row when sealed before it is full). Rows of one
//! head form a chain: each header names the previous header's CRC and the
//! segment the head moves to next, so recovery can follow the chain from a
//! checkpoint without scanning the pool. Runs under the ledger lock; no I/O.

use super::ledger::{
    full_row_shape, Ledger, OpenRow, SealedRow, SegState, EXTRA_ENTRIES, NO_SEGMENT,
};
use super::Shape;
use crate::format::row::{header_blocks_for, Entry, EntryKind, HeadId, RowHeader, RowKind};
use crate::format::BLOCK_SIZE;
use crate::layout::{RowGeom, SegmentIndex};
use crate::map::Loc;
use std::sync::Arc;

/// Why an append could not proceed.
#[derive(Debug)]
pub enum AppendError {
    /// No free segment for this head right now: clean, then retry.
    NeedSegment,
}

impl Ledger {
    /// Takes a free segment for `head`, keeping the floor that lets the
    /// cleaner and the checkpoint always proceed.
    pub fn take_free_segment(&mut self, head: HeadId, shape: &Shape) -> Option<u32> {
        self.take_free_segment_above(head, shape, None)
    }

    /// Free segments `head` must leave (`floor` if given: see
    /// `append_range_record`).
    fn head_floor(&self, head: HeadId, shape: &Shape, floor: Option<usize>) -> usize {
        floor.unwrap_or_else(|| match head {
            HeadId::User => shape.user_floor_segments(self),
            HeadId::Cleaner | HeadId::Cold => shape.cleaner_floor_segments(self),
            HeadId::Checkpoint => 0,
        })
    }

    fn take_free_segment_above(
        &mut self,
        head: HeadId,
        shape: &Shape,
        floor: Option<usize>,
    ) -> Option<u32> {
        let floor = self.head_floor(head, shape, floor);
        if self.free.len() <= floor {
            return None;
        }
        let s = self.free.pop_front()?;
        let seg = &mut self.segments[s as usize];
        assert_eq!(
            seg.state,
            SegState::Free,
            "free list holds a segment that is not free"
        );
        assert_eq!(seg.live_blocks, 0, "free segment {s} has live blocks");
        seg.state = SegState::Reserved(head);
        seg.members_mask = shape.geometry.segment_members(s, self.active_mask);
        seg.parity = shape.segment_parity(seg.members_mask);
        seg.rows.clear();
        seg.fill_blocks = 0;
        seg.written_by = head;
        (seg.birth, seg.births) = (0, 0);
        // A new incarnation: nothing written before is read in it.
        for stale in &shape.stale {
            stale.clear(s);
        }
        Some(s)
    }

    /// Makes sure `head` has a segment with room for a full row and a
    /// reserved next segment (leaving `floor` free segments if given, else
    /// the head's own floor).
    fn ensure_head_room(
        &mut self,
        head: HeadId,
        shape: &Shape,
        floor: Option<usize>,
    ) -> Result<(), AppendError> {
        let chunk = shape.geometry.chunk_blocks;
        let seg_blocks = shape.geometry.segment_blocks;
        let h = &self.heads[head.index()];
        let room = h.segment != NO_SEGMENT && h.offset + chunk <= seg_blocks;
        // A data head in a segment has its next one reserved, except after
        // a recovery that could not reserve it: see `chain_head_room`.
        if head != HeadId::Checkpoint
            && h.segment != NO_SEGMENT
            && (h.next_segment == NO_SEGMENT || h.next_unrecorded)
        {
            let last_row = h.offset + 2 * chunk > seg_blocks;
            return self.chain_head_room(head, shape, floor, (room, last_row));
        }
        if room {
            return Ok(());
        }
        // Need to move: to the reserved next segment (or a fresh one: a
        // head's first, or the checkpoint's), and reserve the one after it
        // first so the chain never dangles.
        let fresh = h.next_segment == NO_SEGMENT;
        debug_assert!(
            !fresh || h.segment == NO_SEGMENT || head == HeadId::Checkpoint,
            "log head {head:?} would move to a segment no row names"
        );
        let current = if fresh {
            self.take_free_segment_above(head, shape, floor)
                .ok_or(AppendError::NeedSegment)?
        } else {
            h.next_segment
        };
        let next = match self.take_free_segment_above(head, shape, floor) {
            Some(n) => n,
            None => {
                if fresh {
                    self.release_reserved(SegmentIndex(current));
                }
                return Err(AppendError::NeedSegment);
            }
        };
        let seq = self.next_seq;
        let h = &mut self.heads[head.index()];
        let old = h.segment;
        h.segment = current;
        h.offset = 0;
        h.next_segment = next;
        if old != NO_SEGMENT {
            if head == HeadId::Checkpoint {
                self.segments[old as usize].state = SegState::Checkpoint;
            } else {
                self.seal_segment(SegmentIndex(old), seq);
            }
        }
        let seg = &mut self.segments[current as usize];
        seg.state = SegState::Open(head);
        Ok(())
    }

    /// The set of active members changed: heads leave segments laid over
    /// members no longer active, and reserved segments take the new set, so
    /// that new rows carry full parity over the members present. The caller
    /// checkpoints right after, so recovery sees the new masks.
    pub fn member_set_changed(&mut self, shape: &Shape) {
        let active = self.active_mask;
        for i in HeadId::DATA.map(HeadId::index) {
            let (seg, next) = (self.heads[i].segment, self.heads[i].next_segment);
            let target = shape.geometry.segment_members(seg, active);
            if seg != NO_SEGMENT
                && (self.segments[seg as usize].members_mask != target
                    || self.segments[seg as usize].parity != shape.segment_parity(target))
            {
                // A row being filled there is sealed where it stands (its
                // lost column is covered by its parity); then the head moves.
                if self.heads[i].open.is_some() {
                    self.heads[i].leave_segment = true;
                } else {
                    self.heads[i].offset = shape.geometry.segment_blocks;
                }
            }
            if next != NO_SEGMENT {
                let seg = &mut self.segments[next as usize];
                seg.members_mask = shape.geometry.segment_members(next, active);
                seg.parity = shape.segment_parity(seg.members_mask);
            }
        }
        for s in 0..self.segments.len() {
            if self.segments[s].state == SegState::Free {
                self.segments[s].members_mask = shape.geometry.segment_members(s as u32, active);
            }
        }
        let segments = &self.segments;
        self.free
            .retain(|&s| shape.segment_usable(segments[s as usize].members_mask, active));
        // Segments that became usable (members added) join the free list.
        let mut listed = vec![false; self.segments.len()];
        for &s in &self.free {
            listed[s as usize] = true;
        }
        for (s, seg) in self.segments.iter().enumerate() {
            if seg.state == SegState::Free
                && !listed[s]
                && shape.segment_usable(seg.members_mask, active)
            {
                self.free.push_back(s as u32);
            }
        }
    }

    /// Segment `s` is empty and no longer needed: free, and in the free
    /// list if the members active now can hold it with full parity (a
    /// segment only members that left could hold stays out of it).
    pub fn release_segment(&mut self, s: SegmentIndex, shape: &Shape) {
        let active = self.active_mask;
        let seg = self.segment_mut(s);
        seg.state = SegState::Free;
        seg.rows.clear();
        seg.members_mask = shape.geometry.segment_members(s.0, active);
        if shape.segment_usable(seg.members_mask, active) {
            self.free.push_back(s.0);
        }
    }

    /// Moves `head` out of its segment now if it has no open row (a head
    /// left in a segment over a member that is leaving keeps the member in
    /// use until its next row otherwise).
    pub fn move_head_off(&mut self, head: HeadId, shape: &Shape) -> Result<(), AppendError> {
        let h = &mut self.heads[head.index()];
        if h.segment == NO_SEGMENT || h.open.is_some() {
            return Ok(());
        }
        h.offset = shape.geometry.segment_blocks;
        self.ensure_head_room(head, shape, None)
    }

    /// `ensure_head_room` for a data head in a segment without a recorded
    /// next one (recovery left it so). Recovery finds where a head went on
    /// only from its segment's last row or from a checkpoint, so: with room
    /// left, the next segment is reserved if one is free (the rows from here
    /// on name it), and the segment's last row waits for one; with the
    /// segment full, one is reserved and the head waits for a checkpoint to
    /// record it (`checkpoint_wanted`; writers that get `NeedSegment`
    /// checkpoint in `make_space`).
    /// (`room`: a row fits in the head's segment; `last_row`: no other
    /// would fit after it.)
    fn chain_head_room(
        &mut self,
        head: HeadId,
        shape: &Shape,
        floor: Option<usize>,
        (room, last_row): (bool, bool),
    ) -> Result<(), AppendError> {
        if self.heads[head.index()].next_unrecorded {
            // Asked again: the checkpoint that cleared the wish may have failed.
            self.checkpoint_wanted = true;
            return Err(AppendError::NeedSegment);
        }
        let reserved = self.reserve_next_segment(head, shape, floor);
        if room && (reserved || !last_row) {
            return Ok(());
        }
        if !room && reserved {
            self.heads[head.index()].next_unrecorded = true;
            self.checkpoint_wanted = true;
        }
        Err(AppendError::NeedSegment)
    }

    /// Whether a head waits for a checkpoint to record its next segment.
    pub fn heads_wait_for_checkpoint(&self) -> bool {
        self.heads.iter().any(|h| h.next_unrecorded)
    }

    /// Reserves the segment `head` moves to next, if a free one is above
    /// its floor; whether it has one now.
    fn reserve_next_segment(&mut self, head: HeadId, shape: &Shape, floor: Option<usize>) -> bool {
        if self.heads[head.index()].next_segment != NO_SEGMENT {
            return true;
        }
        let Some(next) = self.take_free_segment_above(head, shape, floor) else {
            return false;
        };
        self.heads[head.index()].next_segment = next;
        true
    }

    /// After recovery: every data head in a segment gets its next one
    /// reserved (recovery may have left it without one), so that the rows
    /// it writes name where it goes. Whether any head got one: the caller
    /// checkpoints, so that recovery finds the reservation too.
    pub fn rechain_heads(&mut self, shape: &Shape) -> bool {
        let mut rechained = false;
        for head in HeadId::DATA {
            let h = &self.heads[head.index()];
            if h.segment == NO_SEGMENT || h.next_segment != NO_SEGMENT {
                continue;
            }
            if self.reserve_next_segment(head, shape, None) {
                // Recorded by the checkpoint the opening writes next.
                self.heads[head.index()].next_unrecorded = true;
                rechained = true;
            } else {
                tracing::warn!(
                    "recovery: log head {head:?} has no next segment and no free one to reserve"
                );
            }
        }
        rechained
    }

    /// Gives a head its first segment and the reserved next one (at creation).
    pub fn prime_head(&mut self, head: HeadId, shape: &Shape) -> Result<(), AppendError> {
        self.ensure_head_room(head, shape, None)
    }

    fn release_reserved(&mut self, s: SegmentIndex) {
        self.segment_mut(s).state = SegState::Free;
        self.free.push_front(s.0);
    }

    /// A segment a head has left: sealed, or pending free if nothing in it is live.
    pub fn seal_segment(&mut self, s: SegmentIndex, seq: u64) {
        let flush_gen = self.flush_gen;
        let seg = self.segment_mut(s);
        seg.sealed_seq = seq;
        seg.state = if seg.live_blocks == 0 {
            SegState::PendingFree { flush_gen }
        } else {
            SegState::Sealed
        };
    }

    /// Opens a row for `head` at its current position.
    fn open_row(
        &mut self,
        head: HeadId,
        kind: RowKind,
        shape: &Shape,
        floor: Option<usize>,
    ) -> Result<(), AppendError> {
        self.ensure_head_room(head, shape, floor)?;
        let h = &self.heads[head.index()];
        let seg = &self.segments[h.segment as usize];
        let width = seg.members_mask.count_ones() as usize;
        let k = width - seg.parity as usize;
        let chunk = shape.geometry.chunk_blocks as usize;
        let (hb, slots) = full_row_shape(k, chunk);
        let (segment, offset, members_mask, parity) =
            (h.segment, h.offset, seg.members_mask, seg.parity);
        // A row sealed with a smaller header than reserved starts that many
        // blocks into the buffer, and its columns may then reach that many
        // blocks past k * chunk: the buffer has room for that shift.
        let buf = self.buffer((k * chunk + hb as usize) * BLOCK_SIZE);
        self.heads[head.index()].open = Some(OpenRow {
            kind,
            buf,
            header_reserve: hb,
            slot_capacity: slots,
            entry_capacity: slots as usize + EXTRA_ENTRIES,
            entries: Vec::with_capacity(slots as usize),
            slot_entry: Vec::with_capacity(slots as usize),
            segment,
            offset,
            members_mask,
            parity,
            checkpoint_id: 0,
            checkpoint_offset: 0,
            payload_bytes: 0,
        });
        Ok(())
    }

    /// The open row of `head`, opened if needed.
    pub fn open_row_mut(
        &mut self,
        head: HeadId,
        kind: RowKind,
        shape: &Shape,
    ) -> Result<&mut OpenRow, AppendError> {
        self.open_row_mut_above(head, kind, shape, None)
    }

    fn open_row_mut_above(
        &mut self,
        head: HeadId,
        kind: RowKind,
        shape: &Shape,
        floor: Option<usize>,
    ) -> Result<&mut OpenRow, AppendError> {
        if self.heads[head.index()].open.is_none() {
            self.open_row(head, kind, shape, floor)?;
        }
        Ok(self.heads[head.index()].open.as_mut().expect("open row"))
    }

    /// Appends one block to `head`'s open row and points the map at it;
    /// `now` is where the map shows the block (the caller looked it up under
    /// this hold of the ledger). For a user write to a block already in this
    /// open row, overwrites it in place. Returns a sealed row when the row
    /// filled up.
    pub fn append_block(
        &mut self,
        head: HeadId,
        entry: Entry,
        now: Loc,
        block: &[u8],
        shape: &Shape,
    ) -> Result<Option<Arc<SealedRow>>, AppendError> {
        debug_assert!(entry.kind.owns_slot());
        debug_assert_eq!(block.len(), BLOCK_SIZE);
        if head == HeadId::User {
            if let Loc::Open {
                head: HeadId::User,
                slot,
            } = now
            {
                let row = self.heads[head.index()]
                    .open
                    .as_mut()
                    .expect("map points into the open row");
                row.slot_bytes_mut(slot).copy_from_slice(block);
                let e = row.slot_entry[slot as usize] as usize;
                row.entries[e].crc = entry.crc;
                self.volumes
                    .get_mut(&entry.volume)
                    .expect("volume")
                    .map_mut()
                    .set(entry.lba, now, entry.crc);
                self.user_appends += 1;
                return Ok(None);
            }
        }
        // User data keeps the floor left for the cleaner in whichever head
        // it goes to (`lifetime`); asked only when one of the cleaner's
        // heads opens a row for it (the floor walks the segment table).
        let floor = (entry.kind == EntryKind::Data
            && head != HeadId::User
            && self.heads[head.index()].open.is_none())
        .then(|| shape.user_floor_segments(self));
        let birth = self.birth_of(entry.kind, entry.source, shape);
        let row = self.open_row_mut_above(head, RowKind::Data, shape, floor)?;
        let slot = row.slots();
        row.slot_bytes_mut(slot).copy_from_slice(block);
        row.slot_entry.push(row.entries.len() as u32);
        row.entries.push(entry);
        let full = row.is_full();
        let segment = row.segment;
        self.note_birth(segment, birth);
        if head == HeadId::Cold {
            self.cold_appends += 1;
        }
        if entry.kind == EntryKind::Data && head != HeadId::User {
            self.long_lived_appends += 1;
        }
        let old = self
            .volumes
            .get_mut(&entry.volume)
            .expect("volume exists")
            .map_mut()
            .set(entry.lba, Loc::Open { head, slot }, entry.crc);
        self.release_loc(old.0, shape);
        if !old.0.is_stored() {
            self.stored_blocks += 1;
        }
        // Every user block moves the clock, in whichever head it went to.
        self.user_appends += u64::from(entry.kind == EntryKind::Data);
        Ok(if full { self.seal(head, shape) } else { None })
    }

    /// Appends a trim or zero record covering [lba, lba+count) to the user
    /// head and updates the map. Returns a sealed row if the entry filled it.
    /// With `relief`, the head may take the free segments kept for the
    /// cleaner (not those kept for checkpoints): for records that give room
    /// back when the cleaner cannot make any.
    pub fn append_range_record(
        &mut self,
        volume: u32,
        lba: u64,
        count: u32,
        kind: EntryKind,
        relief: bool,
        shape: &Shape,
    ) -> Result<Option<Arc<SealedRow>>, AppendError> {
        debug_assert!(matches!(kind, EntryKind::Trim | EntryKind::Zero));
        let floor = relief.then(|| shape.cleaner_floor_segments(self));
        let row = self.open_row_mut_above(HeadId::User, RowKind::Data, shape, floor)?;
        row.entries.push(Entry {
            kind,
            volume,
            lba,
            crc: 0,
            count,
            source: 0,
        });
        let full = row.is_full();
        self.user_appends += 1;
        let new = if kind == EntryKind::Zero {
            Loc::Zero
        } else {
            Loc::Unmapped
        };
        // One hold of the map for the record (through the view, so the
        // ledger's segments can be updated meanwhile).
        let view = self.volumes.get(&volume).expect("volume").view.clone();
        let mut map = view.map_mut();
        for b in lba..lba + count as u64 {
            let old = map.set(b, new, 0);
            self.release_loc(old.0, shape);
            if old.0.is_stored() {
                self.stored_blocks -= 1;
                self.counters.trimmed_blocks += 1;
            }
        }
        Ok(if full {
            self.seal(HeadId::User, shape)
        } else {
            None
        })
    }

    /// Accounts for a location that no longer holds a volume's current block.
    pub fn release_loc(&mut self, loc: Loc, shape: &Shape) {
        if let Loc::Disk(pba) = loc {
            let (s, _) = shape
                .geometry
                .segment_of(pba.block)
                .expect("mapped block in data area");
            let flush_gen = self.flush_gen;
            let seg = &mut self.segments[s as usize];
            assert!(seg.live_blocks > 0, "segment {s} live count underflow");
            seg.live_blocks -= 1;
            if seg.live_blocks == 0 && seg.state == SegState::Sealed {
                seg.state = SegState::PendingFree { flush_gen };
            }
        }
    }

    /// Seals `head`'s open row (if it holds anything) into a row with its
    /// final geometry and header; the map moves from open slots to disk
    /// addresses. The caller writes the returned row.
    pub fn seal(&mut self, head: HeadId, shape: &Shape) -> Option<Arc<SealedRow>> {
        let h = &mut self.heads[head.index()];
        if h.open.as_ref().is_none_or(|r| r.is_empty()) {
            return None;
        }
        let mut row = h.open.take()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let (geom, start_block) = sealed_geometry(&mut row, shape, seq);
        let header = self.seal_header(head, &mut row, &geom, shape);
        let (bytes, crc) = header.encode();
        let hb = geom.header_blocks as usize;
        row.buf[start_block * BLOCK_SIZE..(start_block + hb) * BLOCK_SIZE].copy_from_slice(&bytes);
        self.advance_head(head, &geom, crc, shape);
        // Reads without the ledger lock see the row in flight before the
        // map names its blocks (`read_index`).
        self.publish_rows_in_flight(Some(geom));
        crate::sync::schedule_point();
        let live = match row.kind {
            RowKind::Data => self.map_slots_to_disk(head, &row, &header, &geom, shape),
            _ => 0,
        };
        self.account_sealed(&geom, live, shape);
        let sealed = Arc::new(SealedRow {
            geom,
            head,
            buf: row.buf,
            start_block,
        });
        self.inflight_bytes += sealed.buf.len();
        self.inflight.push(sealed.clone());
        Some(sealed)
    }

    /// The header of `row`, sealed as `geom` at the end of `head`'s chain
    /// (its entries move into it).
    fn seal_header(
        &self,
        head: HeadId,
        row: &mut OpenRow,
        geom: &RowGeom,
        shape: &Shape,
    ) -> RowHeader {
        let h = &self.heads[head.index()];
        assert_eq!(h.segment, row.segment, "row outside its head's segment");
        assert_eq!(h.offset, row.offset, "row not at its head's position");
        RowHeader {
            header_blocks: geom.header_blocks,
            kind: row.kind,
            head,
            pool_uuid: shape.pool_uuid,
            nonce: shape.nonce,
            seq: geom.seq,
            prev_crc: h.last_crc,
            segment: row.segment,
            offset_blocks: row.offset,
            height: geom.height,
            data_columns: geom.data_columns,
            width: row.members_mask.count_ones() as u8,
            parity: row.parity,
            members_mask: row.members_mask,
            next_segment: h.next_segment,
            slots: row.slots(),
            checkpoint_id: row.checkpoint_id,
            checkpoint_offset: row.checkpoint_offset,
            payload_bytes: row.payload_bytes,
            flushed_seq: self.flushed_seq,
            entries: std::mem::take(&mut row.entries),
        }
    }

    /// Moves `head` past the row just sealed (to the segment's end if it
    /// was asked to leave the segment).
    fn advance_head(&mut self, head: HeadId, geom: &RowGeom, crc: u32, shape: &Shape) {
        let h = &mut self.heads[head.index()];
        h.last_crc = crc;
        h.last_seq = geom.seq;
        h.offset += geom.height as u32;
        if std::mem::take(&mut h.leave_segment) {
            h.offset = shape.geometry.segment_blocks;
        }
    }

    /// Points the map at the disk address of each slot of a sealed data
    /// row that still holds its block's newest version; returns how many.
    fn map_slots_to_disk(
        &mut self,
        head: HeadId,
        row: &OpenRow,
        header: &RowHeader,
        geom: &RowGeom,
        shape: &Shape,
    ) -> u32 {
        let mut live = 0u32;
        // One hold of a volume's map for each run of its slots (a row's
        // slots are mostly one volume's).
        let mut held = None;
        for (slot, &e) in row.slot_entry.iter().enumerate() {
            let entry = &header.entries[e as usize];
            let map = match &mut held {
                Some((id, map)) if *id == entry.volume => map,
                _ => {
                    held = None;
                    let Some(vol) = self.volumes.get_mut(&entry.volume) else {
                        continue;
                    };
                    &mut held.insert((entry.volume, vol.map_mut())).1
                }
            };
            let slot = slot as u32;
            let (loc, crc) = map.get(entry.lba);
            if loc == (Loc::Open { head, slot }) {
                let pba = geom.slot_pba(&shape.geometry, slot);
                map.set(entry.lba, Loc::Disk(pba), crc);
                live += 1;
            }
        }
        live
    }

    /// The segment and counters after a row was sealed.
    fn account_sealed(&mut self, geom: &RowGeom, live: u32, shape: &Shape) {
        let seg = &mut self.segments[geom.segment as usize];
        seg.live_blocks += live;
        seg.fill_blocks = geom.offset + geom.height as u32;
        seg.rows.push(*geom);
        self.counters.rows_written += 1;
        let full_blocks = geom.data_capacity_columns() as u32 * shape.geometry.chunk_blocks;
        if u32::from(geom.data_columns) * u32::from(geom.height) < full_blocks {
            self.counters.short_rows += 1;
        }
        self.log_blocks_since_checkpoint += geom.written_blocks();
    }
}

/// The final geometry of an open row sealed with sequence number `seq`
/// (as few columns as its blocks need, each at most a chunk high), and the
/// block of its buffer where the header starts (the reserve is sized for
/// the most entries a row can take); zeros the padding after the last
/// data block of the last column.
fn sealed_geometry(row: &mut OpenRow, shape: &Shape, seq: u64) -> (RowGeom, usize) {
    let k = row.members_mask.count_ones() - row.parity as u32;
    let hb = header_blocks_for(row.entries.len());
    assert!(hb <= row.header_reserve, "header outgrew its reserve");
    let used = hb as u32 + row.slots();
    let chunk = shape.geometry.chunk_blocks;
    let height = used.div_ceil(k).min(chunk);
    let data_columns = used.div_ceil(height);
    assert!(data_columns <= k && height <= chunk, "row geometry");
    let start_block = (row.header_reserve - hb) as usize;
    let end = (start_block + used as usize) * BLOCK_SIZE;
    let pad_end = (start_block + (data_columns * height) as usize) * BLOCK_SIZE;
    assert!(pad_end <= row.buf.len(), "row does not fit its buffer");
    row.buf[end..pad_end].fill(0);
    let geom = RowGeom {
        segment: row.segment,
        offset: row.offset,
        height: height as u16,
        data_columns: data_columns as u8,
        header_blocks: hb,
        slots: row.slots(),
        members_mask: row.members_mask,
        parity: row.parity,
        seq,
    };
    (geom, start_block)
}
