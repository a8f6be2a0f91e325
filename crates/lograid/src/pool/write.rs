//! The write path for whole blocks: appended to a log head under the ledger
//! lock (the user head, or the cleaner's for blocks expected to live long:
//! `lifetime`; the map points at the open row at once; reads see the write),
//! sealed rows handed to the row writer, room made by the cleaner when the
//! head needs a segment, and the space accounting that refuses a new block
//! a full pool cannot hold. A conditional form replaces a block only if it
//! did not change since it was read (for merges of sub-block writes).

use super::ledger::check_writable;
use super::ledger::Ledger;
use super::log::AppendError;
use super::overlay_table::Cond;
use super::space::SpaceStalls;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::row::{Entry, EntryKind};
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::map::Loc;

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
        let crcs: Vec<u32> = data.chunks_exact(BLOCK_SIZE).map(crc32c).collect();
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
                // Once per batch (it walks the segment table).
                let long_lived_head = ledger.long_lived_head_open(&self.shape);
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
                    let now = vol.map.get(lba);
                    let stored = |l: Loc| matches!(l, Loc::Disk(_) | Loc::Open { .. });
                    if now != exp && !(now.1 == exp.1 && stored(now.0) && stored(exp.0)) {
                        return Ok(false);
                    }
                }
                while i < n {
                    let b = lba + i as u64;
                    let (old, _) = ledger.volume(id).expect("volume").map.get(b);
                    // A new block: room for it beyond the blocks reserved
                    // for overlays (its own overlay's reservation is its).
                    // An overlay merged into its block had its room
                    // reserved when it was acknowledged: it is written even
                    // if the pool holds less since (a member failed).
                    let reserved = || {
                        cond.is_some_and(|c| c.overlay.is_some()) && ledger.overlays.reserves(id, b)
                    };
                    if !old.is_stored()
                        && !reserved()
                        && ledger.stored_blocks + ledger.overlays.unstored_except(id, b)
                            >= ledger.usable_blocks
                    {
                        outcome = Err(Error::NoSpace);
                        break;
                    }
                    let entry = Entry {
                        kind: EntryKind::Data,
                        volume: id,
                        lba: b,
                        crc: crcs[i],
                        count: 1,
                        source: 0,
                    };
                    let head = ledger.head_for_user_block(old, long_lived_head, &self.shape);
                    match ledger.append_block(
                        head,
                        entry,
                        &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE],
                        &self.shape,
                    ) {
                        Ok(Some(row)) => sealed.push(row),
                        Ok(None) => {}
                        Err(AppendError::NeedSegment) => {
                            need_segment = true;
                            break;
                        }
                    }
                    ledger
                        .overlays
                        .appended(id, b, cond.and_then(|c| c.overlay));
                    ledger.counters.user_bytes_written += BLOCK_BYTES;
                    i += 1;
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

    /// Blocks while too many rows are in flight (bounds memory). Returns at
    /// once in a pool that stopped writing: its rows may never complete,
    /// and the caller's `check_writable` refuses.
    pub(crate) fn wait_for_inflight_room(&self, ledger: &mut crate::sync::MutexGuard<'_, Ledger>) {
        while ledger.read_only_reason.is_none()
            && (ledger.inflight.len() >= self.options.max_inflight_rows
                || ledger.inflight.iter().map(|r| r.buf.len()).sum::<usize>()
                    >= self.options.max_inflight_bytes)
        {
            self.progress.wait(ledger);
        }
    }
}
