//! Writing checkpoints: seal the heads, snapshot the bookkeeping, write the
//! snapshot as checkpoint rows into fresh segments, make everything durable,
//! then point the superblocks at it. Until the superblocks are durable the
//! previous checkpoint stays intact and is what recovery would use.

use super::ledger::check_writable;
use super::ledger::{Ledger, SegState, NO_SEGMENT};
use super::log::AppendError;
use super::Engine;
use crate::device::IoJob;
use crate::device::{AlignedBuf, Device};
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::checkpoint::{
    CheckpointWriter, HeadRecord, RebuildRecord, SegmentRecord, SegmentStateCode,
};
use crate::format::row::{Entry, EntryKind, HeadId, RowKind};
use crate::format::superblock::{CheckpointPointer, MemberRecord, MemberState, Superblock};
use crate::format::{crc32c, BLOCK_SIZE};
use crate::layout::{MemberIndex, SegmentIndex};
use std::sync::Arc;

/// Which member table superblocks record.
enum Table {
    /// The ledger's, as it is now (a checkpoint: its contents match it).
    Current,
    /// The one recorded last, with the faults made since.
    RecordedWithFaults,
}

impl Engine {
    /// Writes a checkpoint of the bookkeeping (the log up to now made
    /// durable). Sub-block writes held in memory are not merged: see
    /// `checkpoint_acknowledged`.
    pub(crate) fn checkpoint_log(&self) -> Result<()> {
        let _m = self.maintenance.lock();
        self.checkpoint_log_locked()
    }

    /// Writes a checkpoint; the caller holds `maintenance`.
    pub(crate) fn checkpoint_log_locked(&self) -> Result<()> {
        let (sealed, target_seq, gen, blob, checkpoint_id, unrecorded) = {
            let mut ledger = self.ledger.lock();
            check_writable(&ledger)?;
            ledger.checkpoint_wanted = false;
            ledger.flush_gen += 1;
            let gen = ledger.flush_gen;
            let sealed = self.seal_open_rows(&mut ledger);
            let checkpoint_id = ledger.checkpoint.checkpoint_id + 1;
            ledger.counters.checkpoints += 1;
            // Pages rewritten in order since the last checkpoint go back to
            // runs (the map's memory for sequential data).
            for v in ledger.volumes.values_mut() {
                v.map_mut().compact();
            }
            let blob = self.snapshot(&ledger, checkpoint_id);
            // Paired with `load_image`'s checks when it is read back.
            debug_assert!(
                crate::format::checkpoint::CheckpointImage::decode(&blob).is_ok_and(|image| {
                    image.checkpoint_id == checkpoint_id
                        && image.next_seq == ledger.next_seq
                        && image.volumes.len() == ledger.volumes.len()
                        && image.segments.len() == ledger.segments.len()
                }),
                "checkpoint {checkpoint_id} does not decode to what it records"
            );
            ledger.log_blocks_since_checkpoint = 0;
            // Next segments this checkpoint records for heads that wait for it.
            let unrecorded = ledger
                .heads
                .each_ref()
                .map(|h| h.next_unrecorded.then_some(h.next_segment));
            (
                sealed,
                ledger.next_seq,
                gen,
                blob,
                checkpoint_id,
                unrecorded,
            )
        };
        self.write_rows(sealed)?;
        let (pointer, visited) = self.write_checkpoint_rows(checkpoint_id, &blob)?;
        // The log up to the checkpoint (rows other threads write included)
        // and the checkpoint's own rows, before any superblock points at it.
        self.make_durable(target_seq)?;
        {
            // Until the ledger points at this checkpoint, no other superblock
            // may be written (it would point at the previous one, about to
            // be released).
            let _superblocks = self.superblocks.lock();
            let recorded = self.write_superblocks(pointer, Table::Current)?;
            self.members_recorded(&recorded);
            let mut ledger = self.ledger.lock();
            // The previous checkpoint's segments are no longer referenced.
            for s in std::mem::replace(&mut ledger.checkpoint_segments, visited) {
                ledger.release_segment(SegmentIndex(s), &self.shape);
            }
            ledger.checkpoint = pointer;
            ledger.checkpoint_next_seq = target_seq;
            for (h, recorded) in ledger.heads.iter_mut().zip(unrecorded) {
                if recorded == Some(h.next_segment) {
                    h.next_unrecorded = false;
                }
            }
        }
        self.after_checkpoint(gen);
        self.debug_check("checkpoint");
        Ok(())
    }

    /// Serializes the bookkeeping as of now (open rows already sealed).
    fn snapshot(&self, ledger: &Ledger, checkpoint_id: u64) -> Vec<u8> {
        let member_counters: Vec<_> = self
            .devices
            .load()
            .iter()
            .map(|d| d.as_ref().map(|d| d.counters.values()).unwrap_or_default())
            .collect();
        let mut w = CheckpointWriter::new(
            checkpoint_id,
            ledger.next_seq,
            ledger.next_volume_id,
            &self.counters(ledger),
            &member_counters,
            ledger.volumes.len(),
        );
        // At most 24 bytes a mapped block (each its own run); pages never written stay
        // unmapped, so the room costs memory only as far as it is used.
        w.reserve(
            ledger
                .volumes
                .values()
                .map(|v| 64 + v.name.len() + 24 * v.map().mapped_blocks() as usize)
                .sum(),
        );
        for v in ledger.volumes.values() {
            w.volume(
                v.id,
                &v.name,
                v.recording_size_bytes.unwrap_or(v.size_bytes),
                v.created_unix,
                v.map().iter_from(0).map(|(lba, loc, crc)| {
                    debug_assert!(
                        !matches!(loc, crate::map::Loc::Open { .. }),
                        "open slot in a checkpoint"
                    );
                    (lba, loc.encode(), crc)
                }),
            );
        }
        let records: Vec<SegmentRecord> = ledger
            .segments
            .iter()
            .map(|s| {
                let state = match s.state {
                    SegState::Free | SegState::PendingFree { .. } | SegState::Checkpoint => {
                        SegmentStateCode::Free
                    }
                    SegState::Open(HeadId::User) => SegmentStateCode::OpenUser,
                    SegState::Open(HeadId::Cold) => SegmentStateCode::OpenCold,
                    SegState::Open(_) => SegmentStateCode::OpenCleaner,
                    SegState::Reserved(HeadId::User) => SegmentStateCode::ReservedUser,
                    SegState::Reserved(HeadId::Cold) => SegmentStateCode::ReservedCold,
                    SegState::Reserved(_) => SegmentStateCode::ReservedCleaner,
                    SegState::Sealed => SegmentStateCode::Sealed,
                };
                let free = state == SegmentStateCode::Free;
                SegmentRecord {
                    state,
                    members_mask: s.members_mask,
                    parity: s.parity,
                    live_blocks: if free { 0 } else { s.live_blocks },
                    fill_blocks: if free { 0 } else { s.fill_blocks },
                    sealed_seq: s.sealed_seq,
                    rows: if free { Vec::new() } else { s.rows.to_vec() },
                }
            })
            .collect();
        w.segments(&records);
        let heads: Vec<HeadRecord> = ledger
            .heads
            .iter()
            .map(|h| HeadRecord {
                segment: h.segment,
                offset: h.offset,
                next_segment: h.next_segment,
                last_crc: h.last_crc,
                last_seq: h.last_seq,
            })
            .collect();
        let rebuilds: Vec<RebuildRecord> = (0..ledger.members.len())
            .filter(|&m| ledger.members[m].state.may_hold_rows() && self.shape.stale[m].count() > 0)
            .map(|m| RebuildRecord {
                member: m as u8,
                since_seq: self.shape.stale[m].since_seq(),
                segments: self.shape.stale[m].list(),
            })
            .collect();
        w.finish(&heads, &rebuilds)
    }

    /// Writes `blob` as checkpoint rows starting in a fresh segment; returns
    /// the pointer to it and the segments it occupies. On failure the
    /// segments it took are released.
    fn write_checkpoint_rows(
        &self,
        checkpoint_id: u64,
        blob: &[u8],
    ) -> Result<(CheckpointPointer, Vec<u32>)> {
        let mut visited: Vec<u32> = Vec::new();
        let result = self.write_checkpoint_chain(checkpoint_id, blob, &mut visited);
        let mut ledger = self.ledger.lock();
        let h = &mut ledger.heads[HeadId::Checkpoint.index()];
        let (current, next) = (h.segment, h.next_segment);
        h.segment = NO_SEGMENT;
        h.next_segment = NO_SEGMENT;
        h.open = None;
        if current != NO_SEGMENT && !visited.contains(&current) {
            visited.push(current);
        }
        for s in [next].into_iter().chain(if result.is_err() {
            visited.clone()
        } else {
            vec![]
        }) {
            if s != NO_SEGMENT {
                let seg = &mut ledger.segments[s as usize];
                seg.state = SegState::Free;
                seg.rows.clear();
                ledger.free.push_front(s);
            }
        }
        if result.is_ok() {
            for &s in &visited {
                ledger.segments[s as usize].state = SegState::Checkpoint;
            }
        }
        result.map(|p| (p, visited))
    }

    fn write_checkpoint_chain(
        &self,
        checkpoint_id: u64,
        blob: &[u8],
        visited: &mut Vec<u32>,
    ) -> Result<CheckpointPointer> {
        let mut first: Option<(u32, u32, u32)> = None;
        let mut offset = 0usize;
        let mut block = AlignedBuf::zeroed(BLOCK_SIZE);
        {
            let mut ledger = self.ledger.lock();
            let h = &mut ledger.heads[HeadId::Checkpoint.index()];
            h.segment = NO_SEGMENT;
            h.next_segment = NO_SEGMENT;
            h.last_crc = 0;
        }
        while offset < blob.len() || first.is_none() {
            let mut sealed = Vec::new();
            {
                let mut ledger = self.ledger.lock();
                while offset < blob.len() || first.is_none() {
                    let row = ledger
                        .open_row_mut(HeadId::Checkpoint, RowKind::Checkpoint, &self.shape)
                        .map_err(|AppendError::NeedSegment| Error::NoSpace)?;
                    if row.is_empty() {
                        row.checkpoint_id = checkpoint_id;
                        row.checkpoint_offset = offset as u64;
                    }
                    let n = (blob.len() - offset).min(BLOCK_SIZE);
                    block.fill(0);
                    block[..n].copy_from_slice(&blob[offset..offset + n]);
                    let slot = row.slots();
                    row.slot_bytes_mut(slot).copy_from_slice(&block);
                    row.slot_entry.push(row.entries.len() as u32);
                    row.entries.push(Entry {
                        kind: EntryKind::Payload,
                        volume: 0,
                        lba: 0,
                        crc: crc32c(&block),
                        count: 1,
                        source: 0,
                    });
                    row.payload_bytes += n as u32;
                    offset += n;
                    if row.is_full() || offset >= blob.len() {
                        let r = ledger
                            .seal(HeadId::Checkpoint, &self.shape)
                            .expect("non-empty row");
                        let crc = ledger.heads[HeadId::Checkpoint.index()].last_crc;
                        first.get_or_insert((r.geom.segment, r.geom.offset, crc));
                        if !visited.contains(&r.geom.segment) {
                            visited.push(r.geom.segment);
                        }
                        sealed.push(r);
                        if sealed.len() >= 4 {
                            break;
                        }
                    }
                }
            }
            self.write_rows(sealed)?;
        }
        let (segment, offset_blocks, first_row_crc) = first.expect("checkpoint has a first row");
        Ok(CheckpointPointer {
            checkpoint_id,
            segment,
            offset_blocks,
            first_row_crc,
            blob_bytes: blob.len() as u64,
            blob_crc: crc32c(blob),
        })
    }

    /// Makes every member fault made so far durable before a flush is
    /// acknowledged: writes superblocks recording them (pointing at the
    /// current checkpoint). A member faulted in memory only would be
    /// trusted again after a power cut, its lost writes counted on the
    /// parity the flush needed.
    pub(crate) fn record_faults(&self) -> Result<()> {
        if !self.ledger.lock().faults_unrecorded() {
            return Ok(());
        }
        let _superblocks = self.superblocks.lock();
        let pointer = {
            let ledger = self.ledger.lock();
            if !ledger.faults_unrecorded() {
                return Ok(()); // another flush or a checkpoint recorded them
            }
            check_writable(&ledger)?;
            ledger.checkpoint
        };
        self.write_superblocks(pointer, Table::RecordedWithFaults)?;
        Ok(())
    }

    /// Writes generation+1 of the superblock, pointing at `pointer` and
    /// recording the member `table`, to every member not faulted; the
    /// caller holds `superblocks`. A member whose superblock write or sync
    /// fails is faulted (past the parity the pool stops writing and this
    /// fails), and the fault recorded by one more generation on the others.
    /// Returns the member table recorded first.
    fn write_superblocks(
        &self,
        pointer: CheckpointPointer,
        table: Table,
    ) -> Result<Vec<MemberRecord>> {
        let recorded = self.write_superblock_generation(pointer, table)?;
        // Each pass faults at least one more member, or ends.
        for _ in 0..=crate::format::MAX_MEMBERS {
            if !self.ledger.lock().faults_unrecorded() {
                break;
            }
            self.write_superblock_generation(pointer, Table::RecordedWithFaults)?;
        }
        Ok(recorded)
    }

    /// One generation of `write_superblocks`; members that failed it are
    /// faulted (not yet recorded).
    fn write_superblock_generation(
        &self,
        pointer: CheckpointPointer,
        table: Table,
    ) -> Result<Vec<MemberRecord>> {
        let (generation, members, now) = {
            let mut ledger = self.ledger.lock();
            ledger.superblock_generation += 1;
            let members = ledger.with_faults(match table {
                Table::Current => ledger.members.clone(),
                Table::RecordedWithFaults => ledger.recorded_members.clone(),
            });
            (
                ledger.superblock_generation,
                members,
                ledger.members.clone(),
            )
        };
        type Written = (MemberIndex, Arc<Device>, std::io::Result<()>);
        let mut jobs: Vec<IoJob<Written>> = Vec::new();
        for (m, dev) in self.open_devices() {
            // Only to the drive the table names there (a slot replaced in
            // place, or a member added, since the recorded table: not
            // written until a checkpoint records it).
            let named = |r: &&MemberRecord| now.get(m.0).is_some_and(|n| n.uuid == r.uuid);
            let Some(r) = members.get(m.0).filter(named) else {
                continue;
            };
            if !matches!(
                r.state,
                MemberState::Active | MemberState::Joining | MemberState::Removing
            ) {
                continue; // faulted: left as it is, recorded as faulted on the others
            }
            let size_blocks = r.size_blocks;
            let sb = self.superblock(m, generation, &members, pointer);
            jobs.push(Box::new(move || {
                let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
                buf.copy_from_slice(&sb.encode());
                let r = Superblock::slot_blocks(size_blocks, generation)
                    .iter()
                    .try_for_each(|&b| {
                        super::faults::with_retries(|| dev.write_at(&buf, b * BLOCK_SIZE as u64))
                    })
                    .and_then(|_| dev.sync());
                (m, dev, r)
            }));
        }
        let mut written = 0;
        for (m, dev, r) in self.io.run_all(jobs) {
            match r {
                Ok(()) => written += 1,
                // A member replaced meanwhile is not blamed for the old one.
                Err(e) if self.device_any(m).is_some_and(|d| Arc::ptr_eq(&d, &dev)) => {
                    self.fault_member(m, "a superblock write", e)?;
                }
                Err(_) => {}
            }
        }
        if written == 0 {
            // Nothing holds this generation (every member faulted within
            // the parity cannot happen; a pool with no member open can).
            let reason = ReadOnlyReason::SuperblockWrite {
                cause: format!("generation {generation}: no member open and working"),
            };
            self.ledger
                .lock()
                .read_only_reason
                .get_or_insert(reason.clone());
            return Err(Error::ReadOnly(reason));
        }
        self.ledger.lock().recorded_members = members.clone();
        Ok(members)
    }

    /// Member `m`'s superblock of `generation`.
    fn superblock(
        &self,
        m: MemberIndex,
        generation: u64,
        members: &[MemberRecord],
        pointer: CheckpointPointer,
    ) -> Superblock {
        Superblock {
            pool_uuid: self.shape.pool_uuid,
            pool_name: self.shape.pool_name.clone(),
            created_unix: self.shape.created_unix,
            member_index: m.0 as u8,
            generation,
            parity: self.shape.parity(),
            chunk_blocks: self.shape.geometry.chunk_blocks,
            segment_blocks: self.shape.geometry.segment_blocks,
            data_start_block: self.shape.geometry.data_start_block,
            members: members.to_vec(),
            checkpoint: pointer,
        }
    }

    /// After superblocks recording `recorded` are durable on every member:
    /// members recorded joining get new segments from now on, members
    /// recorded leaving no longer do.
    pub(crate) fn members_recorded(&self, recorded: &[MemberRecord]) {
        let mut ledger = self.ledger.lock();
        let before = ledger.active_mask;
        for (m, r) in recorded.iter().enumerate() {
            match (r.state, ledger.members[m].state) {
                (MemberState::Joining, MemberState::Joining) => {
                    ledger.members[m].state = MemberState::Active;
                    ledger.active_mask |= 1 << m;
                    ledger.checkpoint_wanted = true; // to record it active
                }
                (MemberState::Removing, MemberState::Removing) => ledger.active_mask &= !(1 << m),
                _ => {}
            }
        }
        if ledger.active_mask != before {
            ledger.member_set_changed(&self.shape);
            ledger.update_capacity(&self.shape);
        }
    }

    /// Whether a checkpoint is due: the log since the last one reached the
    /// interval, or something asked for one (a member's state changed).
    fn checkpoint_due(&self) -> bool {
        let ledger = self.ledger.lock();
        ledger.checkpoint_wanted
            || ledger.log_blocks_since_checkpoint >= self.options.checkpoint_interval_blocks
    }

    /// Writes a checkpoint if one is due and no other maintenance runs now
    /// (it will see to it otherwise: every maintenance pass ends with one).
    pub(crate) fn checkpoint_log_if_due(&self) -> Result<()> {
        if self.checkpoint_due() {
            if let Some(_m) = self.maintenance.try_lock() {
                self.checkpoint_log_locked()?;
            }
        }
        Ok(())
    }

    /// The reshape holds `maintenance`, so flushes cannot checkpoint
    /// meanwhile: it does, when one is due (bounds replay, releases emptied
    /// segments, records member changes and rebuild progress).
    pub(crate) fn checkpoint_log_if_due_locked(&self) -> Result<()> {
        if self.checkpoint_due() {
            self.checkpoint_log_locked()?;
        }
        Ok(())
    }
}
