//! Rolling the log forward on open: loading the newest checkpoint (its
//! chain of checkpoint rows, then the image into the empty ledger), then
//! following each head's chain of rows written after it (rows found under
//! every member set and parity a segment may have been given since, each
//! accepted only if it continues its chain), telling a torn row (the end of
//! the log) from one rotted beyond parity (a later row proves it was
//! flushed), and applying the rows in sequence order. Works even with
//! members missing: headers are rebuilt from parity (`row_header`).

use super::ledger::{Ledger, SegState, VolumeState, NO_SEGMENT};
use super::shape::Shape;
use super::stripe::FoundRow;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::checkpoint::{
    CheckpointImage, HeadRecord, SegmentRecord, SegmentStateCode, VolumeRecord,
};
use crate::format::row::{Entry, EntryKind, HeadId, RowHeader, RowKind};
use crate::format::superblock::{MemberState, Superblock};
use crate::format::{crc32c, BLOCK_BYTES};
use crate::layout::MemberIndex;
use crate::layout::{Pba, RowGeom, SegmentIndex};
use crate::map::{Loc, VolumeMap};
use std::collections::VecDeque;

impl Engine {
    /// After the roll forward: a segment stays stale on a member rebuilt in
    /// place only while it holds rows written before the member took its
    /// place (segments reused since hold only rows written to it).
    pub(crate) fn prune_stale(&self, ledger: &Ledger) {
        for (m, stale) in self.shape.stale.iter().enumerate() {
            if stale.count() == 0 {
                continue;
            }
            let since = stale.since_seq();
            let keep: Vec<u32> = if ledger
                .members
                .get(m)
                .is_some_and(|r| r.state.may_hold_rows())
            {
                stale
                    .list()
                    .into_iter()
                    .filter(|&s| {
                        let seg = &ledger.segments[s as usize];
                        !matches!(seg.state, SegState::Free | SegState::Reserved(_))
                            && seg.members_mask & (1 << m) != 0
                            && seg.rows.read().iter().any(|r| r.seq < since)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            stale.reset(since, keep);
        }
    }

    /// Reads the checkpoint blob the superblock points at.
    pub(crate) fn read_checkpoint(&self, sb: &Superblock) -> Result<Vec<u8>> {
        let ptr = sb.checkpoint;
        let mut blob = Vec::with_capacity(ptr.blob_bytes.min(1 << 30) as usize);
        let (mut seg, mut off) = (ptr.segment, ptr.offset_blocks);
        let mut expect_crc: Option<u32> = None;
        let mut segments = Vec::new();
        while (blob.len() as u64) < ptr.blob_bytes {
            let gathered = blob.len() as u64;
            let found = self
                .find_row(seg, off, |found| {
                    found.header.kind == RowKind::Checkpoint
                        && found.header.checkpoint_id == ptr.checkpoint_id
                        && found.header.checkpoint_offset == gathered
                        && match expect_crc {
                            None => found.crc == ptr.first_row_crc,
                            Some(c) => found.header.prev_crc == c,
                        }
                })
                .ok_or_else(|| {
                    Error::Corrupt(format!(
                        "checkpoint row at segment {seg} offset {off} is unreadable \
                         or not the next of its chain"
                    ))
                })?;
            for (slot, e) in found.header.entries.iter().enumerate() {
                let pba = found.geom.slot_pba(&self.shape.geometry, slot as u32);
                let block = self.read_data_block(&found.geom, pba, e.crc).map_err(|d| {
                    Error::Corrupt(format!(
                        "checkpoint block at segment {seg} offset {off} slot {slot}: {d}"
                    ))
                })?;
                let take = (ptr.blob_bytes - blob.len() as u64).min(BLOCK_BYTES) as usize;
                blob.extend_from_slice(&block[..take]);
            }
            if !segments.contains(&seg) {
                segments.push(seg);
            }
            expect_crc = Some(found.crc);
            off += found.geom.height as u32;
            if off + self.shape.geometry.chunk_blocks > self.shape.geometry.segment_blocks {
                (seg, off) = (found.header.next_segment, 0);
            }
        }
        if crc32c(&blob) != ptr.blob_crc {
            return Err(Error::Corrupt("checkpoint checksum mismatch".into()));
        }
        let mut ledger = self.ledger.lock();
        ledger.checkpoint_segments = segments;
        Ok(blob)
    }

    /// Installs a decoded checkpoint into the (empty) ledger.
    pub(crate) fn load_image(&self, mut image: CheckpointImage) -> Result<()> {
        let mut ledger = self.ledger.lock();
        // Segments past what the members hold now (the largest member was
        // removed since) must be empty; they are dropped.
        if image.segments.len() > ledger.segments.len()
            && image.segments[ledger.segments.len()..].iter().all(|r| {
                r.state == SegmentStateCode::Free && r.rows.is_empty() && r.live_blocks == 0
            })
        {
            image.segments.truncate(ledger.segments.len());
        }
        if image.segments.len() != ledger.segments.len() {
            return Err(Error::Corrupt(format!(
                "checkpoint lists {} segments, the pool has {}",
                image.segments.len(),
                ledger.segments.len()
            )));
        }
        for (i, c) in image.member_counters.iter().enumerate() {
            if let Some(d) = self.device(MemberIndex(i)) {
                d.counters.restore(c);
            }
        }
        check_sequence_numbers(&image)?;
        check_volume_records(&image)?;
        ledger.next_seq = image.next_seq;
        ledger.checkpoint_next_seq = image.next_seq;
        ledger.next_volume_id = image.next_volume_id;
        ledger.counters = image.counters;
        for (s, record) in image.segments.into_iter().enumerate() {
            self.load_segment(&mut ledger, SegmentIndex(s as u32), record)?;
        }
        let member_slots = self.devices.load().len();
        for v in image.volumes {
            let volume = self.load_volume(&mut ledger, v, member_slots)?;
            ledger.add_volume(volume);
        }
        self.load_heads(&mut ledger, &image.heads)
    }

    /// Segment `s` as the checkpoint records it (its live count is rebuilt
    /// from the volume maps that follow).
    fn load_segment(
        &self,
        ledger: &mut Ledger,
        s: SegmentIndex,
        record: SegmentRecord,
    ) -> Result<()> {
        let segment_blocks = self.shape.geometry.segment_blocks as u64;
        for r in &record.rows {
            if r.offset as u64 + r.height as u64 > segment_blocks
                || r.data_columns as usize + r.parity as usize
                    > record.members_mask.count_ones() as usize
            {
                return Err(Error::Corrupt(format!(
                    "checkpoint row record out of bounds in segment {s}"
                )));
            }
        }
        let seg = ledger.segment_mut(s);
        seg.state = match record.state {
            SegmentStateCode::Free => SegState::Free,
            SegmentStateCode::OpenUser => SegState::Open(HeadId::User),
            SegmentStateCode::OpenCleaner => SegState::Open(HeadId::Cleaner),
            SegmentStateCode::ReservedUser => SegState::Reserved(HeadId::User),
            SegmentStateCode::ReservedCleaner => SegState::Reserved(HeadId::Cleaner),
            SegmentStateCode::OpenCold => SegState::Open(HeadId::Cold),
            SegmentStateCode::ReservedCold => SegState::Reserved(HeadId::Cold),
            SegmentStateCode::Sealed => SegState::Sealed,
        };
        if record.state != SegmentStateCode::Free {
            seg.members_mask = record.members_mask;
            seg.parity = record.parity;
        }
        seg.live_blocks = 0;
        seg.fill_blocks = record.fill_blocks;
        seg.sealed_seq = record.sealed_seq;
        seg.rows.replace(record.rows);
        Ok(())
    }

    /// A volume and its map as the checkpoint records them; every mapped
    /// block counts as live in its segment. Refuses locations outside the
    /// pool or past the volume's end.
    fn load_volume(
        &self,
        ledger: &mut Ledger,
        v: VolumeRecord,
        member_slots: usize,
    ) -> Result<VolumeState> {
        let mut map = VolumeMap::default();
        for (lba, loc, crc) in v.entries {
            let loc = Loc::decode(loc);
            match loc {
                Loc::Disk(pba) => {
                    let (s, _) = self
                        .shape
                        .geometry
                        .segment_of(pba.block)
                        .filter(|(s, _)| {
                            (*s as usize) < ledger.segments.len()
                                && (pba.member as usize) < member_slots
                        })
                        .ok_or_else(|| {
                            Error::Corrupt(format!(
                                "volume '{}' maps block {lba} outside the pool",
                                v.name
                            ))
                        })?;
                    ledger.segments[s as usize].live_blocks += 1;
                }
                Loc::Zero => {}
                _ => {
                    return Err(Error::Corrupt(format!(
                        "volume '{}' block {lba}: bad location",
                        v.name
                    )))
                }
            }
            if lba
                .checked_mul(BLOCK_BYTES)
                .is_none_or(|b| b >= v.size_bytes)
            {
                return Err(Error::Corrupt(format!(
                    "volume '{}' maps block {lba} past its end",
                    v.name
                )));
            }
            map.set(lba, loc, crc);
        }
        Ok(VolumeState::recorded(
            (v.id, v.name),
            v.size_bytes,
            v.created_unix,
            map,
        ))
    }

    /// The user and cleaner heads where the checkpoint left them.
    fn load_heads(&self, ledger: &mut Ledger, heads: &[HeadRecord]) -> Result<()> {
        // Data heads only (the checkpoint head is where this checkpoint is);
        // a checkpoint written before the cold head existed has none for it.
        for (i, h) in heads
            .iter()
            .enumerate()
            .filter(|&(i, _)| HeadId::DATA.iter().any(|d| d.index() == i))
        {
            let count = ledger.segments.len() as u32;
            let valid = |s: u32| s == NO_SEGMENT || s < count;
            if !valid(h.segment)
                || !valid(h.next_segment)
                || h.offset > self.shape.geometry.segment_blocks
            {
                return Err(Error::Corrupt(format!(
                    "checkpoint log head {i} is out of range"
                )));
            }
            // A head writes into a segment open for it, past the rows in it
            // (a next segment that is not reserved for it is dropped after
            // replay).
            if h.segment != NO_SEGMENT {
                let id = ledger.heads[i].id;
                let seg = &ledger.segments[h.segment as usize];
                let rows_end = seg
                    .rows
                    .read()
                    .iter()
                    .map(|r| r.offset + u32::from(r.height))
                    .max();
                if seg.state != SegState::Open(id)
                    || h.offset < seg.fill_blocks
                    || h.offset < rows_end.unwrap_or(0)
                {
                    return Err(Error::Corrupt(format!(
                        "checkpoint log head {i} is at segment {} offset {}, which it records \
                         as {:?} filled to {}",
                        h.segment, h.offset, seg.state, seg.fill_blocks
                    )));
                }
            }
            let head = &mut ledger.heads[i];
            head.segment = h.segment;
            head.offset = h.offset;
            head.next_segment = h.next_segment;
            head.last_crc = h.last_crc;
            head.last_seq = h.last_seq;
        }
        Ok(())
    }

    /// Follows the chain past `row` (headers only, a bounded number of rows)
    /// looking for a row whose `flushed_seq` covers `row`.
    fn later_row_proves_flushed(&self, head: HeadId, row: &FoundRow, seg: u32, off: u32) -> bool {
        const LOOK_AHEAD_ROWS: usize = 4096;
        let geometry = &self.shape.geometry;
        let (mut seg, mut off) = (seg, off + row.geom.height as u32);
        let (mut prev_crc, mut next) = (row.crc, row.header.next_segment);
        for _ in 0..LOOK_AHEAD_ROWS {
            if off + geometry.chunk_blocks > geometry.segment_blocks {
                (seg, off) = (next, 0);
            }
            if seg == NO_SEGMENT || seg >= geometry.segment_count() {
                return false;
            }
            let accept = |n: &FoundRow| n.header.head == head && n.header.prev_crc == prev_crc;
            let Some((n, at)) = self.find_chain_row(seg, off, next, accept) else {
                return false;
            };
            (seg, off) = at;
            if n.header.flushed_seq >= row.header.seq {
                return true;
            }
            prev_crc = n.crc;
            next = n.header.next_segment;
            off += n.geom.height as u32;
        }
        false
    }

    /// The next row of a chain: at (segment, offset), or, if nothing there
    /// continues it, at offset 0 of `next` (a head leaves a segment early
    /// when the member set changes, `member_set_changed`, even one it has
    /// written nothing in). With where it was.
    fn find_chain_row(
        &self,
        seg: u32,
        off: u32,
        next: u32,
        accept: impl Fn(&FoundRow) -> bool,
    ) -> Option<(FoundRow, (u32, u32))> {
        if let Some(row) = self.find_row(seg, off, &accept) {
            return Some((row, (seg, off)));
        }
        let count = self.shape.geometry.segment_count();
        (next != seg && next != NO_SEGMENT && next < count)
            .then(|| self.find_row(next, 0, &accept).map(|r| (r, (next, 0))))
            .flatten()
    }

    /// The row header at (segment, offset) that `accept` takes, trying each
    /// shape the segment may have been written with (`segment_shapes`).
    fn find_row(&self, s: u32, off: u32, accept: impl Fn(&FoundRow) -> bool) -> Option<FoundRow> {
        let try_shape =
            |(mask, parity): (u32, u8)| self.load_row_header(s, off, mask, parity, &accept);
        // The likely shape first (every row of a chain but the last is
        // found with it); the whole list only when that fails.
        let likely = self.likely_shape(s);
        try_shape(likely).or_else(|| {
            self.segment_shapes(s)
                .into_iter()
                .filter(|&shape| shape != likely)
                .find_map(try_shape)
        })
    }

    /// The shape the checkpoint records for segment `s`, or for a segment
    /// taken after it, the members the superblock records as active.
    fn likely_shape(&self, s: u32) -> (u32, u8) {
        let ledger = self.ledger.lock();
        match ledger.segments.get(s as usize) {
            Some(seg) if seg.state != SegState::Free => (seg.members_mask, seg.parity),
            _ => {
                let active = recorded_in(&self.shape, MemberState::Active);
                let mask = self.shape.geometry.segment_members(s, active);
                (mask, self.shape.segment_parity(mask))
            }
        }
    }

    /// Members and parity rows in segment `s` may have been written with,
    /// most likely first: as recorded in the checkpoint; for a segment taken
    /// after it, see `segment_mask_candidates`.
    fn segment_shapes(&self, s: u32) -> Vec<(u32, u8)> {
        let ledger = self.ledger.lock();
        // The shape the checkpoint records first; then every shape the
        // segment may have been given since (a segment only reserved then,
        // or emptied and taken again, got its shape after the checkpoint,
        // when the member set or parity may have changed).
        let mut shapes: Vec<(u32, u8)> = Vec::new();
        if let Some(seg) = ledger
            .segments
            .get(s as usize)
            .filter(|seg| seg.state != SegState::Free)
        {
            shapes.push((seg.members_mask, seg.parity));
        }
        let masks: Vec<u32> = segment_mask_candidates(&self.shape)
            .into_iter()
            .map(|eligible| self.shape.geometry.segment_members(s, eligible))
            .collect();
        let mut push = |shape: (u32, u8)| {
            if !shapes.contains(&shape) {
                shapes.push(shape);
            }
        };
        // The recorded parity first; then any other (the parity may have
        // been changed after the checkpoint, `Pool::set_parity`).
        for &mask in &masks {
            push((mask, self.shape.segment_parity(mask)));
        }
        for &mask in &masks {
            for parity in 0..=crate::format::MAX_PARITY as u8 {
                if (parity as u32) < mask.count_ones() {
                    push((mask, parity));
                }
            }
        }
        shapes
    }

    /// Follows each head's chain from its checkpointed position, then applies
    /// the rows found in global sequence order. Returns (rows, blocks).
    pub(crate) fn roll_forward(&self, read_only: bool) -> Result<(u64, u64)> {
        let mut found: Vec<(HeadId, FoundRow)> = Vec::new();
        for head in HeadId::DATA {
            found.extend(
                self.follow_chain(head, read_only)
                    .into_iter()
                    .map(|r| (head, r)),
            );
        }
        found.sort_by_key(|(_, r)| r.header.seq);
        let mut blocks = 0u64;
        let rows = found.len() as u64;
        let mut ledger = self.ledger.lock();
        let mut last_seq = 0;
        for (head, row) in found {
            // Unique, except when a row an earlier recovery could not read
            // (and so did not count) is readable again: its number was
            // handed out again since. Both are replayed, in head order.
            if row.header.seq == last_seq {
                tracing::warn!(
                    "recovery: two rows carry sequence number {last_seq}; \
                     replaying both, {head:?} second"
                );
            }
            last_seq = row.header.seq;
            blocks += row.header.slots as u64;
            self.apply_row(&mut ledger, head, row)?;
        }
        self.settle_after_replay(&mut ledger);
        Ok((rows, blocks))
    }

    /// The rows of `head`'s chain written after the checkpoint, in order, up
    /// to the first one that is missing, does not continue the chain, or is
    /// torn (incomplete and not proved flushed by a later row). With
    /// `!read_only`, what parity can repair in them is rewritten.
    fn follow_chain(&self, head: HeadId, read_only: bool) -> Vec<FoundRow> {
        let geometry = &self.shape.geometry;
        let (mut seg, mut off, mut last_crc, mut last_seq, mut next) = {
            let ledger = self.ledger.lock();
            let h = &ledger.heads[head.index()];
            (h.segment, h.offset, h.last_crc, h.last_seq, h.next_segment)
        };
        let mut found = Vec::new();
        while seg != NO_SEGMENT {
            if off + geometry.chunk_blocks > geometry.segment_blocks {
                (seg, off) = (next, 0);
                if seg == NO_SEGMENT || seg >= geometry.segment_count() {
                    break;
                }
            }
            let accept = |row: &FoundRow| {
                let h = &row.header;
                h.head == head
                    && h.kind == RowKind::Data
                    && h.prev_crc == last_crc
                    && h.seq > last_seq
            };
            let Some((row, at)) = self.find_chain_row(seg, off, next, accept) else {
                break;
            };
            (seg, off) = at;
            if !self.row_belongs_to_the_log(head, &row, seg, off, read_only) {
                break;
            }
            last_crc = row.crc;
            last_seq = row.header.seq;
            next = row.header.next_segment;
            off += row.geom.height as u32;
            found.push(row);
        }
        found
    }

    /// Before a writable opening writes anything: zeroes, on every member
    /// holding the segment, the first block of each place a data head
    /// writes its next row (its segment past its last row, and offset 0 of
    /// its reserved next segment); past the log's end, so nothing there is
    /// live. The opening syncs the members next. Whatever a discarded run
    /// left there (a torn row that ended the log, or a header recovery
    /// could not read) would otherwise still chain onto the head's last
    /// row: if a power cut then kept some of the new row's columns but not
    /// its header's, the old header would verify again wherever the new
    /// columns hold the same blocks (the cleaner moving the same blocks
    /// again after a cut does that), and a row that run never finished,
    /// naming the segment it had reserved, would be taken into the log.
    pub(crate) fn clear_next_row_places(&self) -> Result<()> {
        let geometry = &self.shape.geometry;
        let places: Vec<(u32, u32)> = {
            let ledger = self.ledger.lock();
            HeadId::DATA
                .iter()
                .map(|h| &ledger.heads[h.index()])
                .flat_map(|h| {
                    debug_assert!(
                        h.segment == NO_SEGMENT
                            || ledger.segments[h.segment as usize].state == SegState::Open(h.id)
                    );
                    debug_assert!(
                        h.next_segment == NO_SEGMENT
                            || ledger.segments[h.next_segment as usize].state
                                == SegState::Reserved(h.id)
                    );
                    let room = h.segment != NO_SEGMENT
                        && h.offset + geometry.chunk_blocks <= geometry.segment_blocks;
                    let here = room.then_some((h.segment, h.offset));
                    let next = (h.next_segment != NO_SEGMENT).then_some((h.next_segment, 0));
                    here.into_iter().chain(next)
                })
                .collect()
        };
        let zero = crate::device::AlignedBuf::zeroed(crate::format::BLOCK_SIZE);
        for (m, dev) in self.open_devices() {
            for &(segment, offset) in &places {
                if segment >= geometry.member_segments(m.0) {
                    continue;
                }
                let block = geometry.segment_base(segment) + offset as u64;
                let written =
                    super::faults::with_retries(|| dev.write_at(&zero, block * BLOCK_BYTES));
                if let Err(e) = written {
                    self.fault_member(m, "clearing where the log goes on", e)?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Whether a row found on the chain is part of the log: complete (what
    /// parity can repair is repaired), or damaged beyond parity but proved
    /// flushed by a later row of the chain (then kept, and reads of its
    /// damaged blocks fail loudly). A torn row (its columns did not all
    /// reach the members before a crash no flush covered) ends the log.
    fn row_belongs_to_the_log(
        &self,
        head: HeadId,
        row: &FoundRow,
        seg: u32,
        off: u32,
        read_only: bool,
    ) -> bool {
        if self.check_row(row, !read_only).unrepairable.is_empty() {
            return true;
        }
        let seq = row.header.seq;
        if !self.later_row_proves_flushed(head, row, seg, off) {
            tracing::info!(
                "recovery: row {seq} at segment {seg} offset {off} is torn; the log ends there"
            );
            return false;
        }
        tracing::error!(
            "recovery: row {seq} at segment {seg} offset {off} is damaged beyond parity; \
             its unreadable blocks will fail reads"
        );
        true
    }

    /// After the rows are applied: the heads' reserved next segments, the
    /// free list, the next sequence number, and what counts as flushed.
    fn settle_after_replay(&self, ledger: &mut Ledger) {
        // A head's reserved next segment may have been freed and reserved
        // after the checkpoint; replay has emptied it by now. If not, the
        // head is left without one: the opening reserves another and
        // checkpoints (`rechain_heads`), so the chain never leads nowhere.
        for head in HeadId::DATA {
            let n = ledger.heads[head.index()].next_segment;
            if n == NO_SEGMENT || n as usize >= ledger.segments.len() {
                ledger.heads[head.index()].next_segment = NO_SEGMENT;
                continue;
            }
            // The image records the checkpoint's own segments as free; no
            // row written after it can name one (they were not free then).
            let named_checkpoint = ledger.checkpoint_segments.contains(&n);
            debug_assert!(
                !named_checkpoint,
                "recovery: head {head:?} names the checkpoint's segment {n} as its next"
            );
            if named_checkpoint {
                tracing::error!(
                    "recovery: head {head:?} names the checkpoint's segment {n} as its next; \
                     another is reserved"
                );
                ledger.heads[head.index()].next_segment = NO_SEGMENT;
                continue;
            }
            let seg = &mut ledger.segments[n as usize];
            match seg.state {
                SegState::Reserved(h) if h == head => {}
                SegState::Free | SegState::PendingFree { .. } | SegState::Sealed
                    if seg.live_blocks == 0 =>
                {
                    seg.state = SegState::Reserved(head);
                    seg.rows.clear();
                    seg.fill_blocks = 0;
                }
                _ => ledger.heads[head.index()].next_segment = NO_SEGMENT,
            }
        }
        self.rebuild_free_list(ledger);
        ledger.log_blocks_since_checkpoint = 0;
        for h in HeadId::DATA {
            let seq = ledger.heads[h.index()].last_seq;
            ledger.next_seq = ledger.next_seq.max(seq + 1);
        }
        // Everything replayed is made durable before the pool is used: the
        // opening syncs every member before anything is sealed, so no row
        // carries this value before that sync.
        ledger.flushed_seq = ledger.next_seq - 1;
    }

    /// Free segments the members can hold with full parity go to the free
    /// list; the checkpoint's own segments are marked and kept out of it
    /// (whatever heads reserved is not free).
    fn rebuild_free_list(&self, ledger: &mut Ledger) {
        let mut free = VecDeque::new();
        for s in 0..ledger.segments.len() {
            let mask = self
                .shape
                .geometry
                .segment_members(s as u32, ledger.active_mask);
            if ledger.segments[s].state == SegState::Free
                && self.shape.segment_usable(mask, ledger.active_mask)
            {
                ledger.segments[s].rows.clear();
                free.push_back(s as u32);
            }
            if ledger.checkpoint_segments.contains(&(s as u32)) {
                ledger.segments[s].state = SegState::Checkpoint;
            }
        }
        free.retain(|s| !ledger.checkpoint_segments.contains(s));
        ledger.free = free;
    }

    /// Applies one row of `head` found on its chain: the head enters its
    /// segment, the row's entries change the maps, and the head moves past it.
    fn apply_row(&self, ledger: &mut Ledger, head: HeadId, row: FoundRow) -> Result<()> {
        let FoundRow { header, crc, geom } = row;
        // Chosen because it continues its head's chain (`roll_forward`):
        // the chain and the order hold where the row is applied too.
        let last = &ledger.heads[head.index()];
        assert_eq!(
            header.head, head,
            "replay: row {} is not of head {head:?}",
            header.seq
        );
        assert!(
            header.seq > last.last_seq && header.prev_crc == last.last_crc,
            "replay: row {} does not continue head {head:?} (after row {})",
            header.seq,
            last.last_seq
        );
        assert_eq!(header.seq, geom.seq, "replay: row geometry of another row");
        self.enter_row_segment(ledger, head, &header, &geom)?;
        let mut slot = 0u32;
        for e in &header.entries {
            if e.kind.owns_slot() {
                let pba = geom.slot_pba(&self.shape.geometry, slot);
                slot += 1;
                self.replay_block(ledger, e, pba, geom.segment_index());
            } else {
                self.replay_range(ledger, e);
            }
        }
        let h = &mut ledger.heads[head.index()];
        h.segment = geom.segment;
        h.offset = geom.offset + geom.height as u32;
        h.last_crc = crc;
        h.last_seq = header.seq;
        h.next_segment = header.next_segment;
        let next = header.next_segment as usize;
        if next < ledger.segments.len() && ledger.segments[next].state == SegState::Free {
            ledger.segments[next].state = SegState::Reserved(head);
            ledger.segments[next].members_mask = self
                .shape
                .geometry
                .segment_members(next as u32, ledger.active_mask);
        }
        ledger.next_seq = ledger.next_seq.max(header.seq + 1);
        Ok(())
    }

    /// The row's segment as its head writes it: if the head moved on to a
    /// new segment here, the one it left is sealed and this one opened
    /// (refused if it still holds live blocks: reused too early).
    fn enter_row_segment(
        &self,
        ledger: &mut Ledger,
        head: HeadId,
        header: &RowHeader,
        geom: &RowGeom,
    ) -> Result<()> {
        let s = geom.segment as usize;
        if ledger.segments[s].state != SegState::Open(head) {
            let prev = ledger.heads[head.index()].segment;
            if prev != NO_SEGMENT && prev as usize != s {
                ledger.seal_segment(SegmentIndex(prev), header.seq);
            }
            let seg = &mut ledger.segments[s];
            if seg.live_blocks != 0 {
                return Err(Error::Corrupt(format!(
                    "segment {s} was reused while it still held {} live blocks",
                    seg.live_blocks
                )));
            }
            seg.rows.clear();
            seg.state = SegState::Open(head);
            seg.members_mask = header.members_mask;
            seg.parity = header.parity;
        }
        let seg = &mut ledger.segments[s];
        seg.rows.push(*geom);
        seg.fill_blocks = geom.offset + geom.height as u32;
        Ok(())
    }

    /// A block entry: its volume's map points at `pba` (in segment `s`),
    /// unless the volume is gone, the block is past its end, it is a
    /// checkpoint payload, or it is a relocation whose source the map no
    /// longer points at (a write replaced it after the cleaner read it).
    fn replay_block(&self, ledger: &mut Ledger, e: &Entry, pba: Pba, s: SegmentIndex) {
        let Some(vol) = ledger.volumes.get_mut(&e.volume) else {
            return;
        };
        if e.lba
            .checked_mul(BLOCK_BYTES)
            .is_none_or(|b| b >= vol.size_bytes)
            || e.kind == EntryKind::Payload
        {
            return;
        }
        if e.kind == EntryKind::Relocated
            && vol.map().get(e.lba).0 != Loc::Disk(Pba::decode(e.source))
        {
            return;
        }
        let (old, _) = vol.map_mut().set(e.lba, Loc::Disk(pba), e.crc);
        ledger.release_loc(old, &self.shape);
        ledger.segment_mut(s).live_blocks += 1;
    }

    /// A trim (mapped blocks become holes) or zero record (every block of
    /// the range becomes a zero record), within the volume's end.
    fn replay_range(&self, ledger: &mut Ledger, e: &Entry) {
        let Some(vol) = ledger.volumes.get_mut(&e.volume) else {
            return;
        };
        let vol_blocks = vol.size_bytes / BLOCK_BYTES;
        let end = e.lba.saturating_add(e.count as u64).min(vol_blocks);
        let new = if e.kind == EntryKind::Zero {
            Loc::Zero
        } else {
            Loc::Unmapped
        };
        let blocks: Vec<u64> = if e.kind == EntryKind::Zero {
            (e.lba.min(end)..end).collect()
        } else {
            vol.map().iter_range(e.lba..end).map(|x| x.0).collect()
        };
        let view = ledger
            .volumes
            .get(&e.volume)
            .expect("the volume looked up above")
            .view
            .clone();
        let mut map = view.map_mut();
        for b in blocks {
            let (old, _) = map.set(b, new, 0);
            ledger.release_loc(old, &self.shape);
        }
    }
}

/// The members (masks) a segment taken after the checkpoint may have been
/// laid over, most likely first. The superblock records the member table as
/// it was when it was written; since then, members may have failed (up to
/// `parity` of them, taken out of new segments at once), and members it
/// records as joining or being removed may or may not have been used yet
/// (they enter and leave new segments only after a superblock that says so
/// is durable). A member it records as faulted may have been active when
/// the segment was taken: a fault is recorded by the next superblock,
/// which still points at a checkpoint made before it (or at one whose
/// rows were laid out before it). Recovery accepts a row under a mask only
/// if it continues its chain, so a wrong guess is never taken for a row.
pub(crate) fn segment_mask_candidates(shape: &Shape) -> Vec<u32> {
    let in_state = |state: MemberState| recorded_in(shape, state);
    let active = in_state(MemberState::Active);
    let optional = in_state(MemberState::Joining)
        | in_state(MemberState::Removing)
        | in_state(MemberState::Faulted);
    let mut out: Vec<u32> = Vec::new();
    for extra in submasks(optional) {
        let base = active | extra;
        for failed in submasks_up_to(base, shape.parity() as u32) {
            if !out.contains(&(base & !failed)) {
                out.push(base & !failed);
            }
        }
    }
    // Fewest failures first, then the recorded table.
    out.sort_by_key(|&m| ((m ^ active).count_ones(), m));
    out
}

/// Sequence numbers a checkpoint may record: its rows' and data heads'
/// below its next one, which leaves room to count on (a forged or damaged
/// checkpoint must not make the log's numbers run over).
fn check_sequence_numbers(image: &CheckpointImage) -> Result<()> {
    const MAX_NEXT_SEQ: u64 = 1 << 62;
    let rows = image
        .segments
        .iter()
        .flat_map(|s| s.rows.iter().map(|r| r.seq));
    let heads = HeadId::DATA
        .iter()
        .filter_map(|h| image.heads.get(h.index()))
        .map(|h| h.last_seq);
    let newest = rows.chain(heads).max().unwrap_or(0);
    let stale = newest != 0 && newest >= image.next_seq;
    if image.next_seq > MAX_NEXT_SEQ || stale {
        return Err(Error::Corrupt(format!(
            "checkpoint's next sequence number {} is not past its newest row's {newest} \
             or is out of range",
            image.next_seq
        )));
    }
    Ok(())
}

/// Volume records a checkpoint may hold: each id below its next one, and
/// each id and name once.
fn check_volume_records(image: &CheckpointImage) -> Result<()> {
    let mut ids = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    for v in &image.volumes {
        if v.id >= image.next_volume_id || !ids.insert(v.id) {
            return Err(Error::Corrupt(format!(
                "checkpoint records volume id {} twice or at or past the next id {}",
                v.id, image.next_volume_id
            )));
        }
        if !names.insert(v.name.as_str()) {
            return Err(Error::Corrupt(format!(
                "checkpoint records two volumes named '{}'",
                v.name
            )));
        }
    }
    Ok(())
}

/// Members (mask) the superblock this pool was opened from records in `state`.
fn recorded_in(shape: &Shape, state: MemberState) -> u32 {
    shape
        .recorded_members
        .iter()
        .enumerate()
        .filter(|(_, r)| r.state == state)
        .fold(0u32, |m, (i, _)| m | 1 << i)
}

/// Every subset of `mask`, the empty one first.
fn submasks(mask: u32) -> Vec<u32> {
    submasks_up_to(mask, u32::BITS)
}

/// Every subset of `mask` with at most `bits` members, smallest first.
fn submasks_up_to(mask: u32, bits: u32) -> Vec<u32> {
    let mut out = vec![0u32];
    let mut frontier = vec![0u32];
    for _ in 0..bits.min(mask.count_ones()) {
        let mut next = Vec::new();
        for &sub in &frontier {
            // Extend by members above the highest one taken, so each subset
            // is produced once.
            let above = if sub == 0 {
                mask
            } else {
                mask & !(((2u64 << (31 - sub.leading_zeros())) - 1) as u32)
            };
            let mut rest = above;
            while rest != 0 {
                let bit = rest & rest.wrapping_neg();
                next.push(sub | bit);
                rest &= rest - 1;
            }
        }
        out.extend(&next);
        frontier = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::device::{Member, SimMember};
    use crate::format::row::HeadId;
    use crate::format::BLOCK_SIZE;
    use crate::pool::api::open_members;
    use crate::pool::ledger::{SegState, NO_SEGMENT};
    use crate::pool::test_pool::{crash_images, power_cut, power_cut_keeping};
    use std::sync::Arc;

    /// After a power cut, volume `v` reads `expected` from its start (else
    /// fails with `what` and the first bad byte) and the bookkeeping holds.
    fn reads_back_after_a_power_cut(
        pool: crate::pool::Pool,
        sims: &[Arc<SimMember>],
        options: crate::pool::PoolOptions,
        expected: &[u8],
        what: &str,
    ) {
        let (pool, _) = power_cut(pool, sims, options);
        let mut got = vec![0u8; expected.len()];
        pool.volume("v").unwrap().read(0, &mut got).unwrap();
        let first_bad = got.iter().zip(expected).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "{what} (first bad byte)");
        pool.check_invariants().unwrap();
    }

    /// Leaves the user head without its reserved next segment (freed), as
    /// recovery does when the segment its last row names is gone; `full`:
    /// with no room left in its segment either.
    fn take_the_user_heads_next_segment(pool: &crate::pool::Pool, full: bool) {
        let mut ledger = pool.engine.ledger.lock();
        let segment_blocks = pool.engine.shape.geometry.segment_blocks;
        let h = &mut ledger.heads[HeadId::User.index()];
        let next = std::mem::replace(&mut h.next_segment, NO_SEGMENT);
        if full {
            h.offset = segment_blocks;
        }
        assert_ne!(next, NO_SEGMENT, "setup: the head had a next segment");
        ledger.segments[next as usize].state = SegState::Free;
        ledger.free.push_front(next);
    }

    /// The user head in a segment with no next one reserved (what recovery
    /// leaves when the segment a head's last row names is gone): the head
    /// must not move on to a segment no row and no checkpoint names, or a
    /// power cut loses what was flushed there. With the head's segment
    /// `full` or with room left; `recovered`: the state comes from a
    /// checkpoint and a recovery (which reserves a next segment), else the
    /// running pool meets it (rows name a next segment reserved late, or
    /// the head waits for a checkpoint to record the one it reserved).
    fn flushed_writes_survive_a_head_without_its_next_segment(full: bool, recovered: bool) {
        let (pool, _vol, sims) = crate::pool::test_pool::sim_pool();
        let options = crate::pool::test_pool::options();
        take_the_user_heads_next_segment(&pool, full);
        let (pool, sims) = if recovered {
            pool.engine.checkpoint_log().unwrap();
            power_cut(pool, &sims, options.clone())
        } else {
            (pool, sims)
        };
        let vol = pool.volume("v").unwrap();
        let blocks = vol.size_bytes() as usize / BLOCK_SIZE;
        let data: Vec<u8> = (0..blocks * BLOCK_SIZE)
            .map(|i| (i / BLOCK_SIZE * 7 + i % 251) as u8)
            .collect();
        let checkpoint_id = || pool.engine.ledger.lock().checkpoint.checkpoint_id;
        let before = checkpoint_id();
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        if recovered || !full {
            // Recovery reserved the next segment, or the rows written in
            // the head's segment named it: no checkpoint was needed.
            assert_eq!(
                checkpoint_id(),
                before,
                "the chain held without a checkpoint"
            );
        } else {
            assert!(
                checkpoint_id() > before,
                "a checkpoint recorded the next segment"
            );
        }
        drop(vol);
        reads_back_after_a_power_cut(pool, &sims, options, &data, "flushed data lost");
    }

    /// A head that leaves the segment the checkpoint records it at, at
    /// offset 0 (nothing written there), for its reserved next segment
    /// (as `member_set_changed` makes it): recovery looks for its rows
    /// there.
    #[test]
    fn flushed_writes_survive_a_head_that_left_an_empty_segment_early() {
        let (pool, vol, sims) = crate::pool::test_pool::sim_pool();
        let options = crate::pool::test_pool::options();
        {
            let mut ledger = pool.engine.ledger.lock();
            let h = &mut ledger.heads[HeadId::User.index()];
            assert_eq!(
                h.offset, 0,
                "setup: nothing written in the user head's segment"
            );
            assert_ne!(h.next_segment, NO_SEGMENT, "setup: a next segment reserved");
            h.offset = pool.engine.shape.geometry.segment_blocks;
        }
        let data = vec![0x5au8; 8 * BLOCK_SIZE];
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        drop(vol);
        reads_back_after_a_power_cut(pool, &sims, options, &data, "flushed data lost");
    }

    #[test]
    fn flushed_writes_survive_a_full_head_recovered_without_its_next_segment() {
        flushed_writes_survive_a_head_without_its_next_segment(true, true);
    }

    #[test]
    fn flushed_writes_survive_a_head_with_room_recovered_without_its_next_segment() {
        flushed_writes_survive_a_head_without_its_next_segment(false, true);
    }

    #[test]
    fn flushed_writes_survive_a_full_head_running_without_its_next_segment() {
        flushed_writes_survive_a_head_without_its_next_segment(true, false);
    }

    #[test]
    fn flushed_writes_survive_a_head_with_room_running_without_its_next_segment() {
        flushed_writes_survive_a_head_without_its_next_segment(false, false);
    }

    /// A trim recorded by the user head while it waits, in a full segment,
    /// for a checkpoint to record the next one it reserved (what recovery
    /// leaves when it could not reserve one): the trim's record takes that
    /// checkpoint, and a power cut after its flush keeps the trim and the
    /// data around it.
    #[test]
    fn a_trim_while_the_head_waits_for_its_next_segment_is_recorded_and_survives() {
        let (pool, vol, sims) = crate::pool::test_pool::sim_pool();
        let options = crate::pool::test_pool::options();
        let data: Vec<u8> = (0..16 * BLOCK_SIZE).map(|i| (i % 249 + 1) as u8).collect();
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        assert!(
            pool.engine.ledger.lock().heads[HeadId::User.index()]
                .open
                .is_none(),
            "setup: no open row"
        );
        take_the_user_heads_next_segment(&pool, true);
        let checkpoint_id = || pool.engine.ledger.lock().checkpoint.checkpoint_id;
        let before = checkpoint_id();
        vol.trim(4 * BLOCK_SIZE as u64, 4 * BLOCK_SIZE as u64)
            .unwrap();
        assert!(
            checkpoint_id() > before,
            "the trim's record took a checkpoint recording the head's next segment"
        );
        vol.flush().unwrap();
        drop(vol);
        let mut expected = data.clone();
        expected[4 * BLOCK_SIZE..8 * BLOCK_SIZE].fill(0);
        reads_back_after_a_power_cut(pool, &sims, options, &expected, "trim or data lost");
    }

    /// A torn row (only its header's column reached the members) ends the
    /// log at the next opening, which writes a row with the same blocks in
    /// the same place; a power cut then keeps that row's columns but its
    /// header's. Recovery must find the new row there (its header rebuilt
    /// from parity), never the torn one completed by the new columns: that
    /// row was discarded, and its header names what the old run had
    /// reserved (the cleaner, moving the same blocks again after a cut,
    /// does exactly this).
    #[test]
    fn a_torn_row_is_not_taken_back_when_a_later_row_in_its_place_holds_its_blocks() {
        let (pool, vol, sims) = crate::pool::test_pool::sim_pool();
        let options = crate::pool::test_pool::options();
        let data: Vec<u8> = (0..7 * BLOCK_SIZE).map(|i| (i % 253) as u8).collect();
        let write_row = |pool: &crate::pool::Pool| {
            let vol = pool.volume("v").unwrap();
            vol.write(0, &data).unwrap();
            // The row's columns reach the members on the I/O threads.
            let written = || pool.engine.ledger.lock().inflight.is_empty();
            let waited = std::time::Instant::now();
            while !written() {
                assert!(waited.elapsed().as_secs() < 10, "the row was never written");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let ledger = pool.engine.ledger.lock();
            let h = &ledger.heads[HeadId::User.index()];
            let geom = ledger.segments[h.segment as usize].rows.last().unwrap();
            assert_eq!(
                h.open.as_ref().map(|r| r.slots()),
                None,
                "setup: one full row"
            );
            (geom, h.last_crc)
        };
        vol.flush().unwrap();
        drop(vol);
        let (torn, _) = write_row(&pool);
        let header_member = torn.column_member(0) as usize;
        // Each member keeps all or none of its unflushed writes.
        let cut =
            |pool: crate::pool::Pool, sims: &[Arc<SimMember>], keep: &dyn Fn(usize) -> bool| {
                for s in sims {
                    assert_eq!(
                        s.pending_writes(),
                        1,
                        "setup: only the row's column unflushed"
                    );
                }
                power_cut_keeping(pool, sims, options.clone(), keep)
            };
        let (pool, sims) = cut(pool, &sims, &|m| m == header_member);
        let (again, crc) = write_row(&pool);
        assert_eq!(
            (again.segment, again.offset, again.members_mask),
            (torn.segment, torn.offset, torn.members_mask),
            "setup: the new row in the torn one's place"
        );
        let (pool, _) = cut(pool, &sims, &|m| m != header_member);
        let ledger = pool.engine.ledger.lock();
        let h = &ledger.heads[HeadId::User.index()];
        assert_eq!(
            (h.last_seq, h.last_crc),
            (again.seq, crc),
            "recovery took the torn row back"
        );
        drop(ledger);
        pool.check_invariants().unwrap();
    }

    /// A writable opening with more members lost than the parity (one
    /// recorded faulted, one missing) opens read-only: the last flushed row
    /// looks torn to it, and it must leave it as it is, so that the opening
    /// after it, with the missing member back, reads what was flushed.
    #[test]
    fn an_opening_that_ends_read_only_leaves_a_row_that_looks_torn_as_it_is() {
        use crate::layout::MemberIndex;
        let (pool, vol, sims) = crate::pool::test_pool::sim_pool_of(4);
        let options = crate::pool::test_pool::options();
        let data: Vec<u8> = (0..11 * BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        drop(vol);
        let geom = {
            let ledger = pool.engine.ledger.lock();
            let h = &ledger.heads[HeadId::User.index()];
            ledger.segments[h.segment as usize].rows.last().unwrap()
        };
        assert_eq!(geom.data_columns, 3, "setup: a row over every data column");
        let faulted = geom.column_member(1) as usize;
        let missing = geom.column_member(2) as usize;
        pool.engine
            .fault_member(
                MemberIndex(faulted),
                "a test",
                std::io::Error::other("test"),
            )
            .unwrap();
        pool.engine.record_faults().unwrap();
        let sims = crash_images(&sims, &|_| false);
        drop(pool);
        let open = |present: &dyn Fn(usize) -> bool| {
            let members = (0..sims.len())
                .filter(|&i| present(i))
                .map(|i| sims[i].clone() as Arc<dyn Member>)
                .collect();
            open_members(members, options.clone(), false).unwrap()
        };
        let degraded = open(&|i| i != missing);
        assert!(
            degraded.status().read_only,
            "setup: more members lost than the parity"
        );
        drop(degraded);
        let pool = open(&|_| true);
        let mut got = vec![0u8; data.len()];
        let read = pool.volume("v").unwrap().read(0, &mut got);
        assert!(
            read.is_ok() && got == data,
            "flushed data lost once member {missing} came back: {read:?}"
        );
    }
}
