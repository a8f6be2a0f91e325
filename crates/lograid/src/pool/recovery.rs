//! Opening a pool: find the members by their superblocks, load the newest
//! checkpoint, and roll the log forward along each head's chain of rows
//! written after it. The work grows with what was written since the
//! checkpoint, not with the size of the pool. Rows are located and verified
//! even with members missing: a header on a missing or corrupt member is
//! rebuilt from the other columns of its row.

use super::engine::new_inner;
use super::stats::RecoveryReport;
use super::ledger::{Ledger, SegState, VolumeState, NO_SEGMENT};
use super::{random_u64, Pool, Engine, PoolOptions, Shape};
use crate::device::{AlignedBuf, Device, Member};
use crate::error::{Error, Result};
use crate::format::checkpoint::{CheckpointImage, SegmentStateCode};
use crate::format::row::{EntryKind, HeadId, RowHeader, RowKind};
use crate::format::superblock::{MemberState, Superblock};
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::{Geometry, MemberSizes, Pba, RowGeom};
use crate::map::{Loc, VolumeMap};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

static ZERO_BLOCK: [u8; BLOCK_SIZE] = [0u8; BLOCK_SIZE];

/// Why a pool opened for inspection refuses writes (not a fault).
pub const OPENED_READ_ONLY: &str = "opened read-only";

/// The newest valid superblock on a member (of its four slots).
pub fn read_superblock(member: &dyn Member) -> Result<Superblock> {
    let size_blocks = member.size_bytes() / BLOCK_BYTES;
    if size_blocks < crate::format::DATA_START_BLOCK + 4 {
        return Err(Error::Refused(format!(
            "{} is too small to be a lograid member",
            member.describe()
        )));
    }
    let mut best: Option<Superblock> = None;
    let mut first_error = None;
    let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
    for g in 0..2 {
        for b in Superblock::slot_blocks(size_blocks, g) {
            if let Err(e) = member.read_at(&mut buf, b * BLOCK_BYTES) {
                first_error.get_or_insert(Error::io(
                    format!("reading superblock of {}", member.describe()),
                    e,
                ));
                continue;
            }
            match Superblock::decode(&buf) {
                Ok(sb) if best.as_ref().is_none_or(|x| sb.generation > x.generation) => {
                    best = Some(sb)
                }
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(Error::format(
                        format!("superblock of {}", member.describe()),
                        e,
                    ));
                }
            }
        }
    }
    best.ok_or_else(|| {
        first_error.unwrap_or_else(|| {
            Error::Refused(format!("{} is not a lograid member", member.describe()))
        })
    })
}

/// Refuses a drive whose start now holds something else (e.g. a filesystem
/// made over a former member whose tail superblocks survived).
fn refuse_foreign_contents(member: &dyn Member) -> Result<()> {
    let mut head = AlignedBuf::zeroed(128 * 1024);
    let len = head
        .len()
        .min(member.size_bytes() as usize / BLOCK_SIZE * BLOCK_SIZE);
    if member.read_at(&mut head[..len], 0).is_err() {
        return Ok(());
    }
    match crate::device::signature_in(&head[..len]) {
        Some(what) if what != crate::device::LOGRAID_SIGNATURE => Err(Error::Refused(format!(
            "{} is not a lograid member: it now holds {what}",
            member.describe()
        ))),
        _ => Ok(()),
    }
}

/// Opens a pool from its members (any order; missing members are allowed up
/// to the parity count). `read_only` opens without writing anything.
pub fn open_members(
    members: Vec<Arc<dyn Member>>,
    options: PoolOptions,
    read_only: bool,
) -> Result<Pool> {
    let started = Instant::now();
    if members.is_empty() {
        return Err(Error::InvalidArgument("no drives given".into()));
    }
    let mut found: Vec<(Arc<dyn Member>, Superblock)> = Vec::new();
    for m in members {
        refuse_foreign_contents(m.as_ref())?;
        let sb = read_superblock(m.as_ref()).map_err(|e| match e {
            Error::Format {
                cause: crate::format::FormatError::BadMagic,
                ..
            } => Error::Refused(format!(
                "{} is not a lograid member (no lograid superblock)",
                m.describe()
            )),
            other => other,
        })?;
        found.push((m, sb));
    }
    let newest = found
        .iter()
        .max_by_key(|(_, sb)| sb.generation)
        .map(|(_, sb)| sb.clone())
        .expect("non-empty");
    let n = newest.members.len();
    let mut slots: Vec<Option<Arc<dyn Member>>> = vec![None; n];
    for (m, sb) in found {
        if sb.pool_uuid != newest.pool_uuid {
            return Err(Error::Refused(format!(
                "{} belongs to another pool ({:032x}, not {:032x})",
                m.describe(),
                sb.pool_uuid,
                newest.pool_uuid
            )));
        }
        let i = sb.member_index as usize;
        if i < n
            && newest.members[i].uuid == sb.member_uuid()
            && newest.members[i].state == MemberState::Removed
        {
            return Err(Error::Refused(format!(
                "{} was removed from pool '{}'",
                m.describe(),
                newest.pool_name
            )));
        }
        if i >= n || newest.members[i].uuid != sb.member_uuid() {
            return Err(Error::Refused(format!(
                "{} is not a current member of pool '{}'",
                m.describe(),
                newest.pool_name
            )));
        }
        if slots[i].is_some() {
            return Err(Error::InvalidArgument(format!(
                "{} given twice (member {i})",
                m.describe()
            )));
        }
        if m.size_bytes() / BLOCK_BYTES < newest.members[i].size_blocks {
            return Err(Error::Refused(format!(
                "{} is smaller than when it joined the pool",
                m.describe()
            )));
        }
        slots[i] = Some(m);
    }
    // Members that may hold rows and are not here.
    let missing: Vec<usize> = (0..n)
        .filter(|&i| slots[i].is_none() && newest.members[i].state.may_hold_rows())
        .collect();
    // A joining member that is here is active from now on (the checkpoint
    // recovery writes records it so).
    let mut members = newest.members.clone();
    for (i, r) in members.iter_mut().enumerate() {
        if r.state == MemberState::Joining && slots[i].is_some() {
            r.state = MemberState::Active;
        }
    }
    let active_mask = members
        .iter()
        .enumerate()
        .filter(|(i, r)| r.state == MemberState::Active && slots[*i].is_some())
        .fold(0u32, |m, (i, _)| m | 1 << i);
    if missing.len() > newest.parity as usize {
        return Err(Error::Refused(format!(
            "pool '{}' needs at least {} of its {} members; missing: {}",
            newest.pool_name,
            n - newest.parity as usize,
            n,
            missing
                .iter()
                .map(|i| format!("member {i}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let geometry = Geometry {
        member_blocks: MemberSizes::new(
            &newest
                .members
                .iter()
                .map(|r| {
                    if r.state.may_hold_rows() {
                        r.size_blocks
                    } else {
                        0
                    }
                })
                .collect::<Vec<_>>(),
        ),
        data_start_block: newest.data_start_block,
        segment_blocks: newest.segment_blocks,
        chunk_blocks: newest.chunk_blocks,
    };
    if geometry.segment_count() as u64 > crate::format::MAX_SEGMENTS {
        return Err(Error::Corrupt(format!(
            "superblock describes {} segments (at most {} supported)",
            geometry.segment_count(),
            crate::format::MAX_SEGMENTS
        )));
    }
    let stale = Shape::no_stale(&geometry);
    let shape = Shape {
        geometry,
        parity: newest.parity.into(),
        pool_uuid: newest.pool_uuid,
        pool_name: newest.pool_name.clone(),
        created_unix: newest.created_unix,
        nonce: random_u64(),
        recorded_members: newest.members.clone(),
        stale,
    };
    let devices: Vec<Option<Arc<Device>>> = slots
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.map(|m| shape.device(i, m)))
        .collect();
    let joining = newest
        .members
        .iter()
        .any(|r| r.state == MemberState::Joining);
    let inner = Arc::new(new_inner(
        shape,
        members,
        devices,
        options,
        active_mask,
        newest.generation,
    ));
    let report = inner.recover(&newest, started, missing, joining, read_only)?;
    tracing::info!(
        "pool '{}': checkpoint {} loaded, {} rows ({} blocks) replayed in {:.3} s",
        inner.shape.pool_name,
        report.checkpoint_id,
        report.rows_replayed,
        report.blocks_replayed,
        report.duration.as_secs_f64()
    );
    *inner.recovery_report.lock() = Some(report);
    if read_only {
        inner.ledger.lock().read_only_reason = Some(OPENED_READ_ONLY.into());
    }
    Ok(Pool::from_inner(inner))
}

impl Ledger {

}

/// The members (masks) a segment taken after the checkpoint may have been
/// laid over, most likely first. The superblock records the member table as
/// it was when it was written; since then, members may have failed (up to
/// `parity` of them, taken out of new segments at once), and members it
/// records as joining or being removed may or may not have been used yet
/// (they enter and leave new segments only after a superblock that says so
/// is durable). Recovery accepts a row under a mask only if it continues
/// its chain, so a wrong guess is never taken for a row.
pub(crate) fn segment_mask_candidates(shape: &Shape) -> Vec<u32> {
    let in_state = |state: MemberState| recorded_in(shape, state);
    let active = in_state(MemberState::Active);
    let optional = in_state(MemberState::Joining) | in_state(MemberState::Removing);
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

/// A row found while following a chain.
pub(crate) struct FoundRow {
    pub header: RowHeader,
    pub crc: u32,
    pub geom: RowGeom,
}

/// What checking a whole row found (`check_row`).
#[derive(Debug, Default)]
pub(crate) struct RowCheck {
    /// Blocks (data, header or parity) that were wrong and were rewritten
    /// (or would have been, when only checking).
    pub repaired: u64,
    /// Data positions (column, block) that could not be rebuilt.
    pub unrepairable: Vec<(usize, usize)>,
}

impl Engine {
    fn recover(
        &self,
        sb: &Superblock,
        started: Instant,
        missing: Vec<usize>,
        joining: bool,
        read_only: bool,
    ) -> Result<RecoveryReport> {
        let ptr = sb.checkpoint;
        let blob = self.read_checkpoint(sb)?;
        let mut image =
            CheckpointImage::decode(&blob).map_err(|e| Error::format("checkpoint", e))?;
        if image.checkpoint_id != ptr.checkpoint_id {
            return Err(Error::Corrupt(
                "checkpoint id does not match the superblock".into(),
            ));
        }
        // Rows after the checkpoint were all written after any member
        // rebuilt in place took its place, so they are whole on it: the
        // stale segments apply from the end of the roll forward on.
        let rebuilds = std::mem::take(&mut image.rebuilds);
        self.load_image(image)?;
        let (rows, blocks) = self.roll_forward(read_only)?;
        let mut read_only = read_only;
        {
            let mut ledger = self.ledger.lock();
            for r in &rebuilds {
                if r.segments
                    .iter()
                    .any(|&seg| seg as usize >= ledger.segments.len())
                {
                    return Err(Error::Corrupt(format!(
                        "checkpoint: rebuild of member {} lists a segment past the pool's {}",
                        r.member,
                        ledger.segments.len()
                    )));
                }
                self.shape.stale[r.member as usize].reset(r.since_seq, r.segments.iter().copied());
            }
            self.prune_stale(&ledger);
            // A member still being rebuilt counts as lost: with more lost
            // than the parity, rows may have lost more columns than it covers.
            let lost = self.lost_members(&ledger);
            if lost > self.shape.parity() as u32 && ledger.read_only_reason.is_none() {
                let msg = format!(
                    "{lost} members are missing or not yet rebuilt, more than parity {}: \
                     the pool stopped writing until a missing member is back",
                    self.shape.parity()
                );
                tracing::error!("{msg}");
                ledger.read_only_reason = Some(msg);
                read_only = true;
            }
            ledger.checkpoint = ptr;
            ledger.stored_blocks = ledger.volumes.values().map(|v| v.map.stored_blocks()).sum();
        }
        self.debug_check("roll forward");
        if !read_only {
            // What was replayed may sit in a volatile cache: make it durable
            // before any segment it emptied is reused, then checkpoint. (A
            // member just opened always counts as holding unsynced writes.)
            self.sync_members()?;
            let gen = {
                let mut ledger = self.ledger.lock();
                ledger.flush_gen += 1;
                ledger.flush_gen
            };
            self.finish_flush(gen);
            if !missing.is_empty() || joining {
                // New rows go only to the members present, with full parity.
                let mut ledger = self.ledger.lock();
                ledger.member_set_changed(&self.shape);
            }
            if rows > 0 || !missing.is_empty() || joining {
                self.checkpoint()?;
            }
        }
        Ok(RecoveryReport {
            checkpoint_id: ptr.checkpoint_id,
            rows_replayed: rows,
            blocks_replayed: blocks,
            duration: started.elapsed(),
            missing_members: missing,
        })
    }

    /// After the roll forward: a segment stays stale on a member rebuilt in
    /// place only while it holds rows written before the member took its
    /// place (segments reused since hold only rows written to it).
    fn prune_stale(&self, ledger: &Ledger) {
        for (m, stale) in self.shape.stale.iter().enumerate() {
            if stale.count() == 0 {
                continue;
            }
            let since = stale.since_seq();
            let keep: Vec<u32> = if ledger.members.get(m).is_some_and(|r| r.state.may_hold_rows()) {
                stale
                    .list()
                    .into_iter()
                    .filter(|&s| {
                        let seg = &ledger.segments[s as usize];
                        !matches!(seg.state, SegState::Free | SegState::Reserved(_))
                            && seg.members_mask & (1 << m) != 0
                            && seg.rows.iter().any(|r| r.seq < since)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            stale.reset(since, keep);
        }
    }

    /// Reads the checkpoint blob the superblock points at.
    fn read_checkpoint(&self, sb: &Superblock) -> Result<Vec<u8>> {
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

    /// Finds and verifies the row header at (segment, offset) of a segment
    /// laid over `mask` with `parity` parity columns that `accept` takes.
    /// Falls back to rebuilding the header from the other columns when its
    /// own column is missing or corrupt, or holds a header `accept` does not
    /// take, trying each possible count of data columns. (A member that lost
    /// the write of a header, or whose failed flush dropped it, may still
    /// hold the valid header of the row at the same place in the segment's
    /// previous use: taken as it reads, it would end the log there.)
    fn load_row_header(
        &self,
        segment: u32,
        offset: u32,
        mask: u32,
        parity: u8,
        accept: &dyn Fn(&FoundRow) -> bool,
    ) -> Option<FoundRow> {
        let geometry = &self.shape.geometry;
        if segment >= geometry.segment_count()
            || offset >= geometry.segment_blocks
            || mask.count_ones() <= parity as u32
        {
            return None;
        }
        let probe = |data_columns: u8| RowGeom {
            segment,
            offset,
            height: 1,
            data_columns,
            header_blocks: 1,
            slots: 0,
            members_mask: mask,
            parity,
            seq: 0,
        };
        let k = mask.count_ones() as u8 - parity;
        let read_at = |geom: &RowGeom, i: u32| -> Option<Vec<u8>> {
            let pba = geom.data_block_pba(geometry, i);
            let dev = self.device(pba.member as usize)?;
            let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
            dev.read_at(&mut buf, pba.byte_offset()).ok()?;
            Some(buf.to_vec())
        };
        let finish = |first: Vec<u8>, rebuild: Option<u8>| -> Option<FoundRow> {
            let peek = RowHeader::peek_geometry(&first).ok()?;
            if peek.segment != segment
                || peek.offset_blocks != offset
                || peek.members_mask != mask
                || peek.parity != parity
            {
                return None;
            }
            if rebuild.is_some_and(|d| d != peek.data_columns) || peek.data_columns > k {
                return None;
            }
            let geom = RowGeom {
                segment,
                offset,
                height: peek.height,
                data_columns: peek.data_columns,
                header_blocks: peek.header_blocks,
                slots: 0,
                members_mask: mask,
                parity,
                seq: 0,
            };
            // The header's later blocks as read (rebuilt where unreadable),
            // then, if the whole does not verify, all rebuilt from their
            // stripes (a later block rotted while staying readable).
            let rebuilt = |i: u32| -> Option<Vec<u8>> {
                let pba = geom.data_block_pba(geometry, i);
                let (col, blk) = geom.locate(geometry, pba)?;
                let stripe = self.read_row_stripe(&geom, blk);
                super::io::rebuild_from_stripe(&geom, stripe, col, |_| true).ok()
            };
            let assemble = |rebuild_all: bool| -> Option<(RowHeader, u32)> {
                let mut bytes = first.clone();
                for i in 1..peek.header_blocks as u32 {
                    let block = match (rebuild_all, read_at(&geom, i)) {
                        (false, Some(b)) => b,
                        _ => rebuilt(i)?,
                    };
                    bytes.extend_from_slice(&block);
                }
                RowHeader::decode(&bytes).ok()
            };
            let (header, crc) = assemble(false)
                .or_else(|| (peek.header_blocks > 1).then(|| assemble(true)).flatten())?;
            if header.pool_uuid != self.shape.pool_uuid || header.height != peek.height {
                return None;
            }
            let geom = RowGeom {
                slots: header.slots,
                seq: header.seq,
                ..geom
            };
            Some(FoundRow { header, crc, geom })
        };
        if let Some(found) = read_at(&probe(1), 0)
            .and_then(|b| finish(b, None))
            .filter(accept)
        {
            return Some(found);
        }
        // Rebuild block 0 of column 0 assuming each possible data column count.
        for d in 1..=k {
            let geom = probe(d);
            let stripe = self.read_row_stripe(&geom, 0);
            // Every erasure combination is tried until one yields a header
            // whose checksum verifies (a peek alone can be fooled).
            let found = std::cell::RefCell::new(None);
            let _ = super::io::rebuild_from_stripe(&geom, stripe, 0, |b| {
                let plausible = RowHeader::peek_geometry(b).is_ok_and(|p| {
                    p.segment == segment && p.offset_blocks == offset && p.data_columns == d
                });
                if !plausible {
                    return false;
                }
                let f = finish(b.to_vec(), Some(d)).filter(accept);
                let ok = f.is_some();
                *found.borrow_mut() = f;
                ok
            });
            if let Some(f) = found.into_inner() {
                return Some(f);
            }
        }
        None
    }

    /// The verified header (with entries) of a known row.
    pub(crate) fn load_row_header_pub(&self, geom: &RowGeom) -> Option<RowHeader> {
        self.load_known_row(geom).map(|f| f.header)
    }

    /// A known row with its verified header.
    pub(crate) fn load_known_row(&self, geom: &RowGeom) -> Option<FoundRow> {
        self.load_row_header(
            geom.segment,
            geom.offset,
            geom.members_mask,
            geom.parity,
            &|f| f.header.seq == geom.seq,
        )
    }

    /// Installs a decoded checkpoint into the (empty) ledger.
    fn load_image(&self, mut image: CheckpointImage) -> Result<()> {
        let geometry = &self.shape.geometry;
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
            if let Some(d) = self.device(i) {
                d.counters.restore(c);
            }
        }
        ledger.next_seq = image.next_seq;
        ledger.checkpoint_next_seq = image.next_seq;
        ledger.next_volume_id = image.next_volume_id;
        ledger.counters = image.counters;
        for (s, rec) in image.segments.into_iter().enumerate() {
            for r in &rec.rows {
                if r.offset as u64 + r.height as u64 > geometry.segment_blocks as u64
                    || r.data_columns as usize + r.parity as usize
                        > rec.members_mask.count_ones() as usize
                {
                    return Err(Error::Corrupt(format!(
                        "checkpoint row record out of bounds in segment {s}"
                    )));
                }
            }
            let seg = &mut ledger.segments[s];
            seg.state = match rec.state {
                SegmentStateCode::Free => SegState::Free,
                SegmentStateCode::OpenUser => SegState::Open(HeadId::User),
                SegmentStateCode::OpenCleaner => SegState::Open(HeadId::Cleaner),
                SegmentStateCode::ReservedUser => SegState::Reserved(HeadId::User),
                SegmentStateCode::ReservedCleaner => SegState::Reserved(HeadId::Cleaner),
                SegmentStateCode::Sealed => SegState::Sealed,
            };
            if rec.state != SegmentStateCode::Free {
                seg.members_mask = rec.members_mask;
                seg.parity = rec.parity;
            }
            seg.live_blocks = 0;
            seg.fill_blocks = rec.fill_blocks;
            seg.sealed_seq = rec.sealed_seq;
            seg.rows = rec.rows;
        }
        for v in image.volumes {
            let mut map = VolumeMap::default();
            for (lba, loc, crc) in v.entries {
                let loc = Loc::decode(loc);
                match loc {
                    Loc::Disk(pba) => {
                        let (s, _) = geometry
                            .segment_of(pba.block)
                            .filter(|(s, _)| {
                                (*s as usize) < ledger.segments.len()
                                    && (pba.member as usize) < self.devices.read().len()
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
            ledger.volumes.insert(
                v.id,
                VolumeState {
                    id: v.id,
                    name: v.name,
                    size_bytes: v.size_bytes,
                    recording_size_bytes: None,
                    being_created: false,
                    created_unix: v.created_unix,
                    map,
                },
            );
        }
        for (i, h) in image.heads.iter().enumerate().take(2) {
            let count = ledger.segments.len() as u32;
            let valid = |s: u32| s == NO_SEGMENT || s < count;
            if !valid(h.segment) || !valid(h.next_segment) || h.offset > geometry.segment_blocks {
                return Err(Error::Corrupt(format!(
                    "checkpoint log head {i} is out of range"
                )));
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
    /// when the member set changes, `member_set_changed`). With where it was.
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
        (off > 0 && next != NO_SEGMENT && next < count)
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
    fn roll_forward(&self, read_only: bool) -> Result<(u64, u64)> {
        let geometry = &self.shape.geometry;
        let mut found: Vec<(HeadId, FoundRow)> = Vec::new();
        for head in [HeadId::User, HeadId::Cleaner] {
            let (mut seg, mut off, mut last_crc, mut last_seq, mut next) = {
                let ledger = self.ledger.lock();
                let h = &ledger.heads[head.index()];
                (h.segment, h.offset, h.last_crc, h.last_seq, h.next_segment)
            };
            loop {
                if seg == NO_SEGMENT {
                    break;
                }
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
                let h = &row.header;
                // A row whose columns did not all reach the members (a crash
                // before any flush covered it) ends the chain.
                if !self.check_row(&row, !read_only).unrepairable.is_empty() {
                    // Torn (the log ends here) or rotted beyond parity? A
                    // later row of this chain that was sealed after a flush
                    // covering this one proves it was complete once: keep it,
                    // and let reads of its damaged blocks fail loudly.
                    if !self.later_row_proves_flushed(head, &row, seg, off) {
                        tracing::info!("recovery: row {} at segment {seg} offset {off} is torn; the log ends there", h.seq);
                        break;
                    }
                    tracing::error!(
                        "recovery: row {} at segment {seg} offset {off} is damaged beyond parity; its unreadable blocks will fail reads",
                        h.seq
                    );
                }
                last_crc = row.crc;
                last_seq = h.seq;
                next = h.next_segment;
                off += row.geom.height as u32;
                found.push((head, row));
            }
        }
        found.sort_by_key(|(_, r)| r.header.seq);
        let mut blocks = 0u64;
        let rows = found.len() as u64;
        let mut ledger = self.ledger.lock();
        for (head, row) in found {
            blocks += row.header.slots as u64;
            self.apply_row(&mut ledger, head, row)?;
        }
        // A head's reserved next segment may have been freed and reserved
        // after the checkpoint; replay has emptied it by now. If not, the
        // head reserves a fresh one when it gets there.
        for head in [HeadId::User, HeadId::Cleaner] {
            let n = ledger.heads[head.index()].next_segment;
            if n == NO_SEGMENT || n as usize >= ledger.segments.len() {
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
        // Whatever heads reserved must not be handed out again; the rest is free.
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
            let cp = ledger.checkpoint_segments.contains(&(s as u32));
            if cp {
                ledger.segments[s].state = SegState::Checkpoint;
            }
        }
        free.retain(|s| !ledger.checkpoint_segments.contains(s));
        ledger.free = free;
        ledger.log_blocks_since_checkpoint = 0;
        for h in [HeadId::User, HeadId::Cleaner] {
            let seq = ledger.heads[h.index()].last_seq;
            ledger.next_seq = ledger.next_seq.max(seq + 1);
        }
        // Everything replayed is made durable before the pool is used: the
        // opening syncs every member before anything is sealed, so no row
        // carries this value before that sync.
        ledger.flushed_seq = ledger.next_seq - 1;
        Ok((rows, blocks))
    }

    /// Reads a whole row and checks every data block against its checksum
    /// and every parity block against the data. Repairs what parity can
    /// repair (rewriting it unless `read_only`); false if the row is torn
    /// beyond repair.
    /// Reads a whole row and checks every block against the header (its
    /// own bytes, and each slot's CRC) and the parity against the data;
    /// rebuilds what is wrong from the rest of the stripe and, with
    /// `repair`, writes it back. Stripes with more bad data blocks than
    /// parity are reported and left as they are.
    pub(crate) fn check_row(&self, row: &FoundRow, repair: bool) -> RowCheck {
        let mut report = RowCheck::default();
        let g = row.geom;
        let geometry = &self.shape.geometry;
        let width = g.width();
        let k = g.data_capacity_columns();
        let p = g.parity as usize;
        let (header_bytes, _) = row.header.encode();
        let slot_crcs: Vec<u32> = row
            .header
            .entries
            .iter()
            .filter(|e| e.kind.owns_slot())
            .map(|e| e.crc)
            .collect();
        let zero_crc = crate::format::zero_block_crc();
        let columns = self.read_row_columns(&g);
        let mut parity = vec![vec![0u8; BLOCK_SIZE]; p];
        for blk in 0..g.height as usize {
            let block_of = |c: usize| -> Option<&[u8]> {
                if !g.column_used(c) {
                    return Some(&ZERO_BLOCK[..]);
                }
                columns[c]
                    .as_deref()
                    .map(|col| &col[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE])
            };
            // Which data blocks are wrong?
            let expected = |col: usize, bytes: &[u8]| -> bool {
                let i = col * g.height as usize + blk;
                if i < g.header_blocks as usize {
                    return bytes == &header_bytes[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                }
                let slot = i - g.header_blocks as usize;
                let want = slot_crcs.get(slot).copied().unwrap_or(zero_crc);
                crc32c(bytes) == want
            };
            let mut bad: Vec<usize> = (0..g.data_columns as usize)
                .filter(|&c| block_of(c).is_none_or(|b| !expected(c, b)))
                .collect();
            let stripe: Vec<Option<Vec<u8>>>;
            let mut fixed: Vec<Option<Vec<u8>>> = Vec::new();
            if !bad.is_empty() {
                if bad.len() > p {
                    report.unrepairable.extend(bad.iter().map(|&c| (c, blk)));
                    continue;
                }
                stripe = (0..width)
                    .map(|c| block_of(c).map(<[u8]>::to_vec))
                    .collect();
                fixed = stripe.clone();
                // Rebuild each bad block, accepting only checksum-true results.
                let mut erased = stripe.clone();
                for &c in &bad {
                    erased[c] = None;
                }
                let mut lost = Vec::new();
                for &c in &bad {
                    match super::io::rebuild_from_stripe(&g, erased.clone(), c, |b| expected(c, b))
                    {
                        Ok(b) => fixed[c] = Some(b),
                        Err(_) => lost.push((c, blk)),
                    }
                }
                if !lost.is_empty() {
                    report.unrepairable.extend(lost);
                    continue;
                }
            }
            // Parity must match the (now good) data.
            if p > 0 {
                let d: Vec<&[u8]> = (0..k)
                    .map(|c| match fixed.get(c) {
                        Some(Some(v)) => v.as_slice(),
                        _ => block_of(c).unwrap_or(&ZERO_BLOCK[..]),
                    })
                    .collect();
                let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
                lograid_parity::encode(&d, &mut out);
            }
            let mut repairs: Vec<(usize, Vec<u8>)> = bad
                .drain(..)
                .map(|c| (c, fixed[c].clone().expect("rebuilt")))
                .collect();
            for (j, par) in parity.iter().enumerate() {
                if block_of(k + j) != Some(par.as_slice()) {
                    repairs.push((k + j, par.clone()));
                }
            }
            report.repaired += repairs.len() as u64;
            if !repair {
                continue;
            }
            for (c, bytes) in repairs {
                let pba = g.pba(geometry, c, blk);
                if let Some(dev) = self.device(pba.member as usize) {
                    let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
                    buf.copy_from_slice(&bytes);
                    if dev.write_at(&buf, pba.byte_offset()).is_ok() {
                        dev.counters
                            .repaired_blocks
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }
        report
    }

    /// Every written column of a row, read whole and in parallel (None
    /// where unreadable; unused data columns are not read).
    pub(crate) fn read_row_columns(&self, g: &RowGeom) -> Vec<Option<AlignedBuf>> {
        let bytes = g.height as usize * BLOCK_SIZE;
        let jobs: Vec<crate::device::IoJob<Option<AlignedBuf>>> = (0..g.width())
            .map(|c| {
                let pba = g.pba(&self.shape.geometry, c, 0);
                let dev = self.device(pba.member as usize);
                let unused = !g.column_used(c);
                Box::new(move || {
                    let dev = dev.filter(|_| !unused)?;
                    let mut buf = AlignedBuf::zeroed(bytes);
                    dev.read_at(&mut buf, pba.byte_offset()).ok()?;
                    Some(buf)
                }) as crate::device::IoJob<Option<AlignedBuf>>
            })
            .collect();
        self.io.run_all(jobs)
    }

    fn apply_row(&self, ledger: &mut Ledger, head: HeadId, row: FoundRow) -> Result<()> {
        let FoundRow { header, crc, geom } = row;
        let s = geom.segment as usize;
        if ledger.segments[s].state != SegState::Open(head) {
            // The head moved on to a new segment here.
            let prev = ledger.heads[head.index()].segment;
            if prev != NO_SEGMENT && prev as usize != s {
                ledger.seal_segment(prev, header.seq);
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
        {
            let seg = &mut ledger.segments[s];
            seg.rows.push(geom);
            seg.fill_blocks = geom.offset + geom.height as u32;
        }
        let mut slot = 0u32;
        for e in &header.entries {
            match e.kind {
                EntryKind::Data | EntryKind::Relocated | EntryKind::Payload => {
                    let pba = geom.slot_pba(&self.shape.geometry, slot);
                    slot += 1;
                    let Some(vol) = ledger.volumes.get_mut(&e.volume) else {
                        continue;
                    };
                    if e.lba
                        .checked_mul(BLOCK_BYTES)
                        .is_none_or(|b| b >= vol.size_bytes)
                        || e.kind == EntryKind::Payload
                    {
                        continue;
                    }
                    if e.kind == EntryKind::Relocated
                        && vol.map.get(e.lba).0 != Loc::Disk(Pba::decode(e.source))
                    {
                        continue;
                    }
                    let (old, _) = vol.map.set(e.lba, Loc::Disk(pba), e.crc);
                    ledger.release_loc(old, &self.shape);
                    ledger.segments[s].live_blocks += 1;
                }
                EntryKind::Trim | EntryKind::Zero => {
                    let Some(vol) = ledger.volumes.get_mut(&e.volume) else {
                        continue;
                    };
                    let vol_blocks = vol.size_bytes / BLOCK_BYTES;
                    let end = e.lba.saturating_add(e.count as u64).min(vol_blocks);
                    let new = if e.kind == EntryKind::Zero {
                        Loc::Zero
                    } else {
                        Loc::Unmapped
                    };
                    // Trims touch mapped blocks only; zero records every block.
                    let blocks: Vec<u64> = if e.kind == EntryKind::Zero {
                        (e.lba.min(end)..end).collect()
                    } else {
                        vol.map
                            .iter_from(e.lba)
                            .map(|x| x.0)
                            .take_while(|&b| b < end)
                            .collect()
                    };
                    for b in blocks {
                        let (old, _) = ledger
                            .volumes
                            .get_mut(&e.volume)
                            .expect("volume")
                            .map
                            .set(b, new, 0);
                        ledger.release_loc(old, &self.shape);
                    }
                }
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
}
