//! The cleaner: picks a sealed segment with little live data, moves its live
//! blocks to the cleaner's own log head (so relocated, colder data stays
//! apart from fresh writes, with the user blocks expected to live long:
//! `lifetime`), and frees the segment once the move is durable. A
//! background thread keeps a reserve of free segments ahead of writers;
//! writers that find no free segment clean in the foreground, choosing
//! victims by the same policy.

use super::ledger::SealedRow;
use super::ledger::SegState;
use super::log::AppendError;
use super::stats::CleanerState;
use super::{CleanerPolicy, Engine};
use crate::device::AlignedBuf;
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::row::RowHeader;
use crate::format::row::{Entry, EntryKind, HeadId};
use crate::format::{crc32c, BLOCK_SIZE};
use crate::layout::MemberIndex;
use crate::layout::{Pba, RowGeom};
use crate::map::Loc;
use crate::sync::{channel, thread};
use std::borrow::Cow;
use std::sync::Arc;

/// A live block to relocate: volume, LBA, where it is, its CRC, its bytes.
type LiveBlock<'a> = (u32, u64, Pba, u32, Cow<'a, [u8]>);

/// What a cleaning pass did: segments cleaned, and why it stopped.
struct Cleaned {
    cleaned: usize,
    stop: PassEnd,
}

/// Why a cleaning pass stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassEnd {
    /// It did what it was asked (or writers had room).
    Done,
    /// No segment gains anything by being emptied.
    NoVictim,
    /// The cleaner's head had no free segment to move blocks to (emptied
    /// segments waiting for a checkpoint; the pass writes it).
    NoRoom,
}

/// A segment chosen to be emptied, the rows emptying it gains, and the head
/// its blocks go to.
struct Victim {
    segment: u32,
    gain_rows: u64,
    head: HeadId,
}

/// What emptying a segment moved: blocks, and of those, blocks the
/// cleaner's head had written (data that had lived long already).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Moved {
    pub blocks: u64,
    pub again: u64,
}

impl Engine {
    /// Cleans up to `want` segments by the pool's policy in the background
    /// (writers out of room use `clean_for_room`), then, if space is short
    /// and an emptied segment waits for a checkpoint before it may be
    /// reused, writes one. Returns how many segments were cleaned.
    pub(crate) fn clean_segments(&self, want: usize) -> Result<usize> {
        Ok(self
            .clean_until(false, |cleaned, _| cleaned >= want)?
            .cleaned)
    }

    /// Cleans for a writer out of room until the victims' gains (the rows
    /// each frees less the rows its live blocks take at the cleaner's head)
    /// add up to `segments` whole segments, or nothing more can be gained.
    /// Stops as soon as writers have room, and a segment to spare: writers
    /// queue here (one pass at a time), and one that finds the room
    /// another made goes on at once instead of cleaning a pass of its own
    /// (which kept writers waiting for seconds behind each other's passes).
    fn clean_for_room(&self, segments: usize) -> Result<Cleaned> {
        let rows = self.shape.geometry.segment_blocks / self.shape.geometry.chunk_blocks;
        let want_rows = segments as u64 * u64::from(rows);
        self.clean_until(true, |_, gained_rows| {
            gained_rows >= want_rows || self.space_shortfall_with(1) == 0
        })
    }

    /// Cleans victim after victim until `done(victims, rows gained)`
    /// (`urgent`: for a writer out of room, counted as foreground); see
    /// `clean_segments`.
    fn clean_until(&self, urgent: bool, done: impl Fn(usize, u64) -> bool) -> Result<Cleaned> {
        let _m = self.maintenance.lock();
        let (mut cleaned, mut gained) = (0, 0u64);
        let mut stop = PassEnd::Done;
        while !done(cleaned, gained) {
            let Some(victim) = self.pick_victim() else {
                stop = PassEnd::NoVictim;
                break;
            };
            match self.relocate_segment(victim.segment, victim.head) {
                Ok(moved) => self.count_cleaned(moved, urgent),
                // The cleaner's head found no free segment: segments
                // emptied earlier may only wait for the checkpoint below.
                Err(Error::NoSpace) => {
                    stop = PassEnd::NoRoom;
                    break;
                }
                Err(e) => return Err(e),
            }
            cleaned += 1;
            gained += victim.gain_rows;
        }
        // Segments emptied since the last checkpoint are reusable only
        // after the next one; write it early only if space is short.
        let short_and_waiting = {
            let ledger = self.ledger.lock();
            ledger.free.len() <= self.shape.user_floor_segments(&ledger) + 1
                && ledger
                    .segments
                    .iter()
                    .any(|s| matches!(s.state, SegState::PendingFree { .. }))
        };
        if short_and_waiting || self.ledger.lock().heads_wait_for_checkpoint() {
            self.checkpoint_log_locked()?;
        }
        Ok(Cleaned { cleaned, stop })
    }

    /// Counts a segment emptied, with what it moved.
    fn count_cleaned(&self, moved: Moved, urgent: bool) {
        let mut stats = self.stats.lock();
        stats.segments_cleaned += 1;
        stats.relocated_again_blocks += moved.again;
        if urgent {
            stats.foreground_relocated_blocks += moved.blocks;
        }
    }

    /// Free segments below which cleaning starts in the background: the
    /// user floor plus a few segments to absorb bursts. Kept small on
    /// purpose: segments held free are space the data cannot use, and
    /// write amplification grows steeply with the space in use (in
    /// simulation, greedy at 75% fill: 2.2 with a 3-segment reserve, 2.5
    /// with 5% of the segments, 3.1 with 10%).
    pub(crate) fn clean_watermark(&self) -> usize {
        let ledger = self.ledger.lock();
        self.shape.user_floor_segments(&ledger) + 3
    }

    /// Called by a writer that found no free segment: flush (which releases
    /// emptied segments) or clean in the foreground, by the pool's policy
    /// (see `pick_victim`), or report the pool full.
    pub(crate) fn make_space(&self) -> Result<()> {
        self.record_waiting_heads()?;
        if self.space_shortfall() == 0 {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let result = (|| {
            // Emptied segments wait for a flush (and, if the log since the
            // last checkpoint runs through them, for a checkpoint).
            self.flush_log()?;
            self.checkpoint_log_if_due()?;
            if self.space_shortfall() == 0 {
                return Ok(());
            }
            self.stats.lock().cleaner_state = CleanerState::Urgent;
            let pass = self.clean_for_room(self.space_shortfall() + 2)?;
            if self.space_shortfall() == 0 {
                return Ok(());
            }
            // Nothing left to clean: full. (A pass that found room another
            // writer made, taken again since, or whose moves waited for the
            // checkpoint it then wrote, is not: the writer retries, within
            // `SpaceStalls`.)
            if pass.cleaned == 0 && pass.stop == PassEnd::NoVictim {
                tracing::debug!("a writer found no free segment and nothing to clean");
                return Err(Error::NoSpace);
            }
            Ok(())
        })();
        let mut stats = self.stats.lock();
        stats.write_stalls += 1;
        stats.write_stall_ns += started.elapsed().as_nanos() as u64;
        if stats.cleaner_state == CleanerState::Urgent {
            stats.cleaner_state = CleanerState::Background;
        }
        result
    }

    /// A head recovery left in a full segment with no next one moves there
    /// once a checkpoint records the one it reserved (`chain_head_room`):
    /// writes that checkpoint if a head waits; whether it did. Without room
    /// for the checkpoint's own rows, cleaning comes first (its pass ends
    /// with one).
    pub(crate) fn record_waiting_heads(&self) -> Result<bool> {
        if !self.ledger.lock().heads_wait_for_checkpoint() {
            return Ok(false);
        }
        match self.checkpoint_log() {
            Ok(()) => Ok(true),
            Err(Error::NoSpace) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Free segments a writer lacks: a head that takes user data (the
    /// user's, and the cleaner's for long-lived blocks: `lifetime`) moves
    /// on with one free segment above the user floor, two if it has no
    /// next segment reserved (after recovery).
    fn space_shortfall(&self) -> usize {
        self.space_shortfall_with(0)
    }

    /// `space_shortfall` with `margin` more segments wanted (a pass that
    /// stops at the bare minimum leaves the next writer short again).
    fn space_shortfall_with(&self, margin: usize) -> usize {
        let ledger = self.ledger.lock();
        let fresh = [HeadId::User, HeadId::Cleaner]
            .iter()
            .any(|h| ledger.heads[h.index()].next_segment == super::ledger::NO_SEGMENT);
        (self.shape.user_floor_segments(&ledger) + 1 + usize::from(fresh) + margin)
            .saturating_sub(ledger.free.len())
    }

    /// Picks the sealed segment to empty next, and what emptying it gains;
    /// full segments are never picked (cleaning them gains nothing).
    /// Greedy: the emptiest. Cost-benefit: the best (free space × age) /
    /// live blocks among the segments that gain at least half what the
    /// emptiest would, so that cold segments are emptied while fuller than
    /// hot ones (which are left to empty further) and yet every pass makes
    /// progress: in a nearly full pool, where every segment gains little,
    /// the pick stays close to greedy. (Unbounded cost-benefit there spins:
    /// each pass gains less room than the checkpoint that releases it
    /// takes.) Writers out of room and the background pick alike.
    fn pick_victim(&self) -> Option<Victim> {
        let mut ledger = self.ledger.lock();
        let now = ledger.next_seq;
        // What a segment written now holds (in a degraded pool new rows
        // are narrower: moving a full segment of wide rows would take more
        // room than it frees).
        let active = ledger.segments.first().map_or(0, |_| {
            self.shape.geometry.segment_members(0, ledger.active_mask)
        });
        let destination = self
            .shape
            .segment_capacity(active, self.shape.segment_parity(active));
        // Moved blocks fill whole rows (and a short one when the move is
        // flushed), and a segment frees whole rows: a victim gains only
        // the rows its live blocks do not need. One whose blocks need all
        // the rows it frees gains nothing, however little it holds less
        // than full, and moving such victims over and over was a livelock.
        // A pool within its usable capacity has victims that gain (its
        // accounting keeps slack for that); one holding more than that (a
        // member failed and rows got narrower) may not, and there only
        // victims that gain a quarter of a segment are taken: when none is
        // left, writers needing room get NoSpace instead of a crawl.
        let rows = (self.shape.geometry.segment_blocks / self.shape.geometry.chunk_blocks) as u64;
        let row_slots = destination / rows.max(1);
        let min_gain = if ledger.stored_blocks > ledger.usable_blocks {
            (rows / 4).max(1)
        } else {
            1
        };
        let gain_rows = |live: u64| rows.saturating_sub(live.div_ceil(row_slots.max(1)));
        // The head a victim's blocks go to: the one `head_for_moved_block`
        // names if it has the room, else the cleaner's if that has it.
        let room = |head: HeadId| self.cleaner_room(&ledger, head, rows, row_slots, destination);
        let (room_cleaner, room_cold) = (room(HeadId::Cleaner), room(HeadId::Cold));
        let head_for = |s: u32, live: u64| match ledger.head_for_moved_block(s) {
            HeadId::Cold if live <= room_cold => Some(HeadId::Cold),
            _ => (live <= room_cleaner).then_some(HeadId::Cleaner),
        };
        // Sealed segments with something to gain: (index, live, capacity).
        let candidates: Vec<(u32, u64, u64, u64)> = ledger
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SegState::Sealed)
            .filter(|&(i, s)| head_for(i as u32, s.live_blocks as u64).is_some())
            .map(|(i, s)| {
                let capacity = self.shape.segment_capacity(s.members_mask, s.parity);
                (i as u32, s.live_blocks as u64, capacity, s.sealed_seq)
            })
            .filter(|&(_, live, capacity, _)| {
                live < capacity && row_slots > 0 && gain_rows(live) >= min_gain
            })
            .collect();
        let (emptiest, _, _, _) = *candidates.iter().min_by_key(|c| c.1)?;
        let victim = if self.options.cleaner_policy == CleanerPolicy::Greedy {
            emptiest
        } else {
            let best_gain = candidates.iter().map(|c| gain_rows(c.1)).max().unwrap_or(0);
            candidates
                .iter()
                .filter(|c| 2 * gain_rows(c.1) >= best_gain)
                .map(|&(i, live, capacity, sealed)| {
                    let age = now.saturating_sub(sealed) as f64 + 1.0;
                    (i, (capacity - live) as f64 * age / (live as f64 + 1.0))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(emptiest, |(i, _)| i)
        };
        let live = ledger.segments[victim as usize].live_blocks as u64;
        let head = head_for(victim, live)?;
        ledger.note_victim(victim);
        Some(Victim {
            segment: victim,
            gain_rows: gain_rows(live),
            head,
        })
    }

    /// The blocks `head` (the cleaner's or the cold one) can take now without going below its
    /// floor: what is left of its segment (less the row being filled,
    /// which user writes may fill too) and a segment for each free one
    /// above the floor (each lets the head move on once). A victim that
    /// does not fit is not taken: half moved, it would use the cleaner's
    /// reserve without freeing anything, and a few such moves left the
    /// cleaner's head full at its floor with nothing it could move (writers
    /// then got ENOSPC with a quarter of the pool free).
    fn cleaner_room(
        &self,
        ledger: &super::ledger::Ledger,
        head: HeadId,
        rows: u64,
        row_slots: u64,
        destination: u64,
    ) -> u64 {
        let head = &ledger.heads[head.index()];
        let chunk = u64::from(self.shape.geometry.chunk_blocks);
        let segment_blocks = u64::from(self.shape.geometry.segment_blocks);
        let left_rows = if head.segment == super::ledger::NO_SEGMENT {
            0
        } else {
            (segment_blocks.saturating_sub(u64::from(head.offset)) / chunk).saturating_sub(1)
        };
        let fresh = usize::from(head.next_segment == super::ledger::NO_SEGMENT);
        let spare = ledger
            .free
            .len()
            .saturating_sub(self.shape.cleaner_floor_segments(ledger) + fresh);
        left_rows.min(rows) * row_slots + spare as u64 * destination
    }

    /// Moves every live block of sealed segment `victim` to `head` (the
    /// cleaner's or the cold one: new rows over the current members) and
    /// flushes; the segment is then empty and becomes free after the next
    /// checkpoint. Returns the blocks moved. The caller holds `maintenance`.
    pub(crate) fn relocate_segment(&self, victim: u32, head: HeadId) -> Result<Moved> {
        let (rows, live_before, sealed_before, cold) = {
            let ledger = self.ledger.lock();
            let seg = &ledger.segments[victim as usize];
            let cold = matches!(seg.written_by, HeadId::Cleaner | HeadId::Cold);
            (seg.rows.to_vec(), seg.live_blocks, seg.sealed_seq, cold)
        };
        // Rows sealed here are written by a second thread, so that reading
        // the next row overlaps writing the last (a few rows in flight).
        let (tx, rx) = channel::bounded::<Vec<Arc<SealedRow>>>(2);
        let moved = thread::scope(|scope| -> Result<u64> {
            let writer = scope.spawn(move || -> Result<()> {
                let mut first_error = None;
                // Every row is written (or fails) so none stays in flight.
                for rows in rx {
                    if let Err(e) = self.write_rows(rows) {
                        first_error.get_or_insert(e);
                    }
                }
                first_error.map_or(Ok(()), Err)
            });
            let moved = self.relocate_rows(rows, head, &tx);
            drop(tx);
            let written = writer.join().expect("row writer thread");
            let moved = moved?;
            written?;
            Ok(moved)
        })?;
        tracing::debug!("cleaner: segment {victim}: moved {moved} blocks");
        {
            // Every block moved left the victim's live count; writes only
            // take more out (unless a flush freed it and it was taken anew:
            // then it was sealed again, later).
            let ledger = self.ledger.lock();
            let seg = &ledger.segments[victim as usize];
            let same_use = seg.sealed_seq == sealed_before;
            if same_use && matches!(seg.state, SegState::Sealed | SegState::PendingFree { .. }) {
                assert!(
                    seg.live_blocks as u64 + moved <= live_before as u64,
                    "cleaner: segment {victim} held {live_before} live blocks, {moved} moved, \
                     {} still live",
                    seg.live_blocks
                );
            }
        }
        self.flush_log()?;
        self.debug_check("cleaning");
        Ok(Moved {
            blocks: moved,
            again: if cold { moved } else { 0 },
        })
    }

    /// Appends the live blocks of `rows` to `head`; sealed rows go to
    /// `write`. Returns the blocks moved.
    fn relocate_rows(
        &self,
        rows: Vec<RowGeom>,
        head: HeadId,
        write: &channel::Sender<Vec<Arc<SealedRow>>>,
    ) -> Result<u64> {
        let mut moved = 0;
        for geom in rows {
            moved += self.relocate_row(&geom, head, write)?;
        }
        Ok(moved)
    }

    /// Moves the live blocks of one row; returns how many.
    fn relocate_row(
        &self,
        geom: &RowGeom,
        head: HeadId,
        write: &channel::Sender<Vec<Arc<SealedRow>>>,
    ) -> Result<u64> {
        let Some((header, whole)) = self.header_to_clean(geom) else {
            tracing::warn!(
                "cleaner: row header at segment {} offset {} unreadable",
                geom.segment,
                geom.offset
            );
            return Ok(0);
        };
        let live = self.live_slots(geom, &header);
        if live.is_empty() {
            self.column_buffers.give_back(whole.into_iter().flatten());
            return Ok(0);
        }
        // One read per column for the whole row; single blocks are reread
        // (or rebuilt) only where a checksum does not match.
        let columns = whole.unwrap_or_else(|| self.read_whole(geom));
        let blocks = self.live_block_bytes(geom, live, &columns);
        let moved = self.append_relocated(&blocks, head, write);
        drop(blocks);
        self.column_buffers.give_back(columns);
        moved
    }

    /// Every column of a row, read whole, lost ones rebuilt from parity
    /// (with `reuse` held, so the segment is not taken anew meanwhile).
    fn read_whole(&self, geom: &RowGeom) -> Vec<Option<AlignedBuf>> {
        let _r = self.reuse.read();
        self.read_row_rebuilt(geom)
    }

    /// The row's header, and its whole columns if they had to be read for
    /// it (its header column is on a member that is gone: a rebuild).
    fn header_to_clean(
        &self,
        geom: &RowGeom,
    ) -> Option<(RowHeader, Option<Vec<Option<AlignedBuf>>>)> {
        let header_member = MemberIndex(geom.column_member(0) as usize);
        if self.device(header_member).is_some() {
            return self.load_known_row(geom).map(|f| (f.header, None));
        }
        let columns = self.read_whole(geom);
        let header = self.header_from_columns(geom, &columns)?;
        Some((header, Some(columns)))
    }

    /// The row's slots the maps still point at: (volume, block, where, CRC).
    fn live_slots(&self, geom: &RowGeom, header: &RowHeader) -> Vec<(u32, u64, Pba, u32)> {
        let ledger = self.ledger.lock();
        let slots = header.entries.iter().filter(|e| e.kind.owns_slot());
        let mut live = Vec::new();
        for (slot, e) in slots.enumerate() {
            let pba = geom.slot_pba(&self.shape.geometry, slot as u32);
            if let Some(v) = ledger.volume(e.volume) {
                let (loc, crc) = v.map().get(e.lba);
                if loc == Loc::Disk(pba) {
                    live.push((e.volume, e.lba, pba, crc));
                }
            }
        }
        live
    }

    /// The live blocks' bytes: from the columns read, checked; else read
    /// (or rebuilt) one by one. A block that cannot be read is left where
    /// it is (and logged).
    fn live_block_bytes<'a>(
        &self,
        geom: &RowGeom,
        live: Vec<(u32, u64, Pba, u32)>,
        columns: &'a [Option<AlignedBuf>],
    ) -> Vec<LiveBlock<'a>> {
        let in_columns = |pba: Pba, crc: u32| -> Option<&'a [u8]> {
            let (col, blk) = geom.locate(&self.shape.geometry, pba)?;
            let column = columns.get(col)?.as_ref()?;
            let bytes = &column[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE];
            (crc32c(bytes) == crc).then_some(bytes)
        };
        let mut blocks: Vec<LiveBlock> = Vec::with_capacity(live.len());
        for (volume, lba, pba, crc) in live {
            if let Some(bytes) = in_columns(pba, crc) {
                blocks.push((volume, lba, pba, crc, Cow::Borrowed(bytes)));
                continue;
            }
            match self.read_data_block(geom, pba, crc) {
                Ok(b) => blocks.push((volume, lba, pba, crc, Cow::Owned(b))),
                Err(cause) => {
                    tracing::error!("cleaner: volume {volume} block {lba} unreadable: {cause}")
                }
            }
        }
        blocks
    }

    /// Appends `blocks` to `head` under one hold of the lock, each only if
    /// the map still points at it (a write may have replaced it meanwhile);
    /// sealed rows go to `write`. Returns the blocks moved.
    fn append_relocated(
        &self,
        blocks: &[LiveBlock],
        head: HeadId,
        write: &channel::Sender<Vec<Arc<SealedRow>>>,
    ) -> Result<u64> {
        let mut moved = 0;
        let mut sealed = Vec::new();
        {
            let mut ledger = self.ledger.lock();
            for (volume, lba, pba, crc, bytes) in blocks {
                let still = ledger
                    .volume(*volume)
                    .is_some_and(|v| v.map().get(*lba).0 == Loc::Disk(*pba));
                if !still {
                    continue;
                }
                let entry = Entry {
                    kind: EntryKind::Relocated,
                    volume: *volume,
                    lba: *lba,
                    crc: *crc,
                    count: 1,
                    source: pba.encode(),
                };
                match ledger.append_block(head, entry, Loc::Disk(*pba), bytes, &self.shape) {
                    Ok(row) => {
                        ledger.counters.relocated_blocks += 1;
                        sealed.extend(row);
                        moved += 1;
                    }
                    Err(AppendError::NeedSegment) => {
                        drop(ledger);
                        for row in sealed {
                            let _ = write.send(vec![row]);
                        }
                        return Err(Error::NoSpace);
                    }
                }
            }
        }
        if !sealed.is_empty() {
            write
                .send(sealed)
                .map_err(|_| Error::ReadOnly(ReadOnlyReason::RowWriterStopped))?;
        }
        Ok(moved)
    }
}
