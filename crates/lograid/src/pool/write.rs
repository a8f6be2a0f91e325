//! The write path for whole blocks: appended to a log head under the ledger
//! lock (the user head, or the cleaner's for blocks expected to live long:
//! `lifetime`; the map points at the open row at once; reads see the write),
//! sealed rows handed to the row writer, room made by the cleaner when the
//! head needs a segment, and the space accounting that refuses a new block
//! a full pool cannot hold. A conditional form replaces a block only if it
//! did not change since it was read (for merges of sub-block writes).

use super::ledger::check_writable;
use super::ledger::Ledger;
use super::ledger::SealedRow;
use super::lifetime::LongLivedRoom;
use super::log::AppendError;
use super::overlay_table::Cond;
use super::space::SpaceStalls;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::row::{Entry, EntryKind};
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::map::Loc;
use smallvec::SmallVec;
use std::sync::Arc;

impl Engine {
    /// Appends whole blocks to the user head, dropping their overlays. With
    /// `cond` (a single block carrying an overlay), writes only if the
    /// overlay is still the one merged and the block's map entry (if given)
    /// still equals the one read, then settles the overlay; returns whether
    /// it wrote.
    pub(crate) fn write_blocks(
        &self,
        id: u32,
        lba: u64,
        data: &[u8],
        cond: Option<Cond>,
    ) -> Result<bool> {
        let n = data.len() / BLOCK_SIZE;
        // Checksums before the lock (no allocation for a request of a few blocks).
        let crcs: SmallVec<[u32; 8]> = data.chunks_exact(BLOCK_SIZE).map(crc32c).collect();
        let mut i = 0;
        let mut stalls = SpaceStalls::default();
        while i < n {
            let mut sealed = Vec::new();
            let mut outcome: Result<()> = Ok(());
            let mut need_segment = false;
            {
                let mut ledger = self.ledger.lock();
                self.wait_for_inflight_room(&mut ledger);
                check_writable(&ledger)?;
                let vol = ledger
                    .volume(id)
                    .ok_or_else(|| Error::NotFound(format!("volume {id} was deleted")))?;
                let mut room = LongLivedRoom::default();
                if let Some(c) = &cond {
                    debug_assert_eq!(n, 1);
                    if !ledger.overlays.admits(id, lba, c) {
                        return Ok(false);
                    }
                }
                if let Some(exp) = cond.and_then(|c| c.entry) {
                    // Changed since it was read? A block the cleaner moved
                    // meanwhile holds the same bytes (same checksum): not a
                    // change (in a full pool the cleaner may move it every
                    // time, and the write would never get through).
                    let now = vol.map().get(lba);
                    let stored = |l: Loc| matches!(l, Loc::Disk(_) | Loc::Open { .. });
                    if now != exp && !(now.1 == exp.1 && stored(now.0) && stored(exp.0)) {
                        return Ok(false);
                    }
                }
                while i < n {
                    let block = &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                    let b = lba + i as u64;
                    match self.append_user_block(
                        &mut ledger,
                        (id, b),
                        block,
                        crcs[i],
                        cond,
                        &mut room,
                    ) {
                        Ok(Appended::Row(row)) => sealed.extend(row),
                        Ok(Appended::NeedSegment) => {
                            need_segment = true;
                            break;
                        }
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                    i += 1;
                    // A row sealed to the in-flight limits: the rest of a large
                    // request waits for room (at the loop's top) like any other
                    // writer, so a request seals at most one row past them.
                    if !sealed.is_empty() && !self.inflight_room(&ledger) {
                        break;
                    }
                }
            }
            self.submit_rows(sealed)?;
            outcome?;
            if need_segment {
                stalls.check(self.ledger.lock().user_appends)?;
                self.make_space()?;
            }
        }
        Ok(true)
    }

    /// Appends user block `lba` of volume `id` (its `crc` computed) to the head
    /// its lifetime picks, dropping the block's overlay (or, with `cond`,
    /// settling the one merged). Refuses a new block a full pool cannot hold.
    fn append_user_block(
        &self,
        ledger: &mut Ledger,
        (id, lba): (u32, u64),
        block: &[u8],
        crc: u32,
        cond: Option<Cond>,
        room: &mut LongLivedRoom,
    ) -> Result<Appended> {
        let (old, _) = ledger
            .volume(id)
            .ok_or_else(|| Error::NotFound(format!("volume {id} was deleted")))?
            .map()
            .get(lba);
        // A new block: room for it beyond the blocks reserved for overlays
        // (its own overlay's reservation is its). An overlay merged into its
        // block had its room reserved when it was acknowledged: it is written
        // even if the pool holds less since (a member failed).
        let reserved =
            || cond.is_some_and(|c| c.overlay.is_some()) && ledger.overlays.reserves(id, lba);
        if !old.is_stored()
            && !reserved()
            && ledger.stored_blocks + ledger.overlays.unstored_except(id, lba)
                >= ledger.usable_blocks
        {
            return Err(Error::NoSpace);
        }
        let entry = Entry {
            kind: EntryKind::Data,
            volume: id,
            lba,
            crc,
            count: 1,
            source: 0,
        };
        let head = ledger.head_for_user_block(old, room, &self.shape);
        let row = match ledger.append_block(head, entry, old, block, &self.shape) {
            Ok(row) => row,
            Err(AppendError::NeedSegment) => return Ok(Appended::NeedSegment),
        };
        ledger
            .overlays
            .appended(id, lba, cond.and_then(|c| c.overlay));
        ledger.counters.user_bytes_written += BLOCK_BYTES;
        Ok(Appended::Row(row))
    }

    /// One whole-block write (`lba`, `block`) if it can be taken without
    /// waiting: the ledger is free, rows in flight leave room, the head it
    /// goes to has room without a new segment, and the row writer runs (a
    /// row it seals is queued for the writer's threads, past the queue's
    /// bound if need be). `None` if the caller would have to wait, or the
    /// write would be refused: nothing was written; the caller then calls
    /// `write_blocks`, from a thread that may wait, which says why. For
    /// callers on an event loop, where a thread hand-off per request costs
    /// more than the write. (Only a writer stopped between the check and the
    /// queueing, when the pool closes, makes it write the row itself.)
    pub(crate) fn try_write_block_now(
        &self,
        id: u32,
        lba: u64,
        block: &[u8],
    ) -> Option<Result<()>> {
        debug_assert_eq!(block.len(), BLOCK_SIZE);
        if !self.row_writer.running() {
            return None;
        }
        let crc = crc32c(block);
        let row = {
            let mut ledger = self.ledger.try_lock()?;
            let end = lba.checked_add(1).and_then(|b| b.checked_mul(BLOCK_BYTES));
            let in_range = ledger
                .volume(id)
                .zip(end)
                .is_some_and(|(v, end)| end <= v.size_bytes);
            if !in_range || check_writable(&ledger).is_err() || !self.inflight_room(&ledger) {
                return None;
            }
            let room = &mut LongLivedRoom::default();
            match self.append_user_block(&mut ledger, (id, lba), block, crc, None, room) {
                Ok(Appended::Row(row)) => row,
                Ok(Appended::NeedSegment) | Err(_) => return None,
            }
        };
        // A row the writer stopped before taking (the pool is closing) is
        // written here.
        match row.and_then(|row| self.row_writer.queue(vec![row])) {
            Some(rows) => Some(self.write_rows(rows)),
            None => Some(Ok(())),
        }
    }

    /// Blocks while too many rows are in flight (bounds memory). Returns at
    /// once in a pool that stopped writing: its rows may never complete,
    /// and the caller's `check_writable` refuses.
    pub(crate) fn wait_for_inflight_room(&self, ledger: &mut crate::sync::MutexGuard<'_, Ledger>) {
        while ledger.read_only_reason.is_none() && !self.inflight_room(ledger) {
            self.progress.wait(ledger);
        }
    }

    /// Whether another row may be sealed: rows in flight are below both limits.
    fn inflight_room(&self, ledger: &Ledger) -> bool {
        ledger.inflight.len() < self.options.max_inflight_rows
            && ledger.inflight_bytes < self.options.max_inflight_bytes
    }
}

/// What appending one user block did.
enum Appended {
    /// Appended; the row it sealed, if it filled one.
    Row(Option<Arc<SealedRow>>),
    /// The head needs a segment first (nothing appended).
    NeedSegment,
}
