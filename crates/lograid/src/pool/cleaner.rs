//! The cleaner: picks a sealed segment with little live data, moves its live
//! blocks to the cleaner's own log head (so relocated, colder data stays
//! apart from fresh writes), and frees the segment once the move is durable.
//! A background thread keeps a reserve of free segments ahead of writers;
//! writers that find no free segment clean in the foreground.

use super::log::AppendError;
use super::state::SegState;
use super::PoolInner;
use crate::error::{Error, Result};
use crate::format::row::{Entry, EntryKind, HeadId};
use crate::format::{crc32c, BLOCK_SIZE};
use crate::layout::RowGeom;
use crate::map::Loc;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

impl PoolInner {
    /// Cleans up to `want` segments, then, if any emptied segment waits for
    /// a checkpoint before it may be reused, writes one. Returns how many
    /// segments were cleaned.
    pub(crate) fn clean_segments(&self, want: usize) -> Result<usize> {
        let _m = self.maintenance.lock();
        let mut cleaned = 0;
        while cleaned < want {
            if !self.clean_one()? {
                break;
            }
            cleaned += 1;
        }
        let waiting = self
            .core
            .lock()
            .segments
            .iter()
            .any(|s| matches!(s.state, SegState::PendingFree { .. }));
        if waiting {
            self.checkpoint_locked()?;
        }
        Ok(cleaned)
    }

    /// Free segments below which cleaning starts in the background.
    fn clean_watermark(&self) -> usize {
        let core = self.core.lock();
        self.shape.user_floor_segments(&core) + (core.segments.len() / 10).max(2)
    }

    /// Called by a writer that found no free segment: flush (which releases
    /// emptied segments) or clean, or report the pool full.
    pub(crate) fn make_space(&self) -> Result<()> {
        let shortfall = |inner: &PoolInner| {
            let core = inner.core.lock();
            (inner.shape.user_floor_segments(&core) + 1).saturating_sub(core.free.len())
        };
        if shortfall(self) == 0 {
            return Ok(());
        }
        // Emptied segments wait for a flush (and, if the log since the last
        // checkpoint runs through them, for a checkpoint).
        self.flush()?;
        if shortfall(self) == 0 {
            return Ok(());
        }
        let want = shortfall(self) + 2;
        let cleaned = self.clean_segments(want)?;
        if shortfall(self) == 0 {
            return Ok(());
        }
        if cleaned == 0 {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Picks the sealed segment with the fewest live blocks (greedy).
    fn pick_victim(&self) -> Option<u32> {
        let core = self.core.lock();
        core.segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SegState::Sealed)
            .filter(|(_, s)| {
                (s.live_blocks as u64) < self.shape.segment_capacity(s.members_mask, s.parity)
            })
            .min_by_key(|(_, s)| s.live_blocks)
            .map(|(i, _)| i as u32)
    }

    /// Moves one victim's live blocks; false if there was nothing to clean.
    fn clean_one(&self) -> Result<bool> {
        let Some(victim) = self.pick_victim() else {
            return Ok(false);
        };
        let rows: Vec<RowGeom> = self.core.lock().segments[victim as usize].rows.clone();
        let mut moved = 0u64;
        for geom in rows {
            let Some(found) = self.load_row_header_pub(&geom) else {
                tracing::warn!(
                    "cleaner: row header at segment {} offset {} unreadable",
                    geom.segment,
                    geom.offset
                );
                continue;
            };
            // Live slots: the map still points at them.
            let mut live = Vec::new();
            {
                let core = self.core.lock();
                let mut slot = 0u32;
                for e in &found.entries {
                    if !e.kind.owns_slot() {
                        continue;
                    }
                    let pba = geom.slot_pba(&self.shape.geometry, slot);
                    slot += 1;
                    if let Some(v) = core.volume(e.volume) {
                        let (loc, crc) = v.map.get(e.lba);
                        if loc == Loc::Disk(pba) {
                            live.push((e.volume, e.lba, pba, crc));
                        }
                    }
                }
            }
            // One read per column for the whole row; single blocks are
            // reread (or rebuilt) only where a checksum does not match.
            let columns = if live.is_empty() {
                Vec::new()
            } else {
                let _r = self.reuse.read();
                self.read_row_columns(&geom)
            };
            for (volume, lba, pba, crc) in live {
                let from_columns = geom
                    .locate(&self.shape.geometry, pba)
                    .and_then(|(col, blk)| {
                        let column = columns.get(col)?.as_ref()?;
                        let bytes = &column[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE];
                        (crc32c(bytes) == crc).then(|| bytes.to_vec())
                    });
                let block = match from_columns {
                    Some(b) => b,
                    None => match self.read_data_block(&geom, pba, crc) {
                        Ok(b) => b,
                        Err(detail) => {
                            tracing::error!(
                                "cleaner: volume {volume} block {lba} unreadable: {detail}"
                            );
                            continue;
                        }
                    },
                };
                let sealed = {
                    let mut core = self.core.lock();
                    let still = core
                        .volume(volume)
                        .is_some_and(|v| v.map.get(lba).0 == Loc::Disk(pba));
                    if !still {
                        continue;
                    }
                    let entry = Entry {
                        kind: EntryKind::Relocated,
                        volume,
                        lba,
                        crc,
                        count: 1,
                        source: pba.encode(),
                    };
                    match core.append_block(HeadId::Cleaner, entry, &block, &self.shape) {
                        Ok(row) => {
                            core.counters.relocated_blocks += 1;
                            row
                        }
                        Err(AppendError::NeedSegment) => return Err(Error::NoSpace),
                    }
                };
                moved += 1;
                self.write_rows(sealed.into_iter().collect())?;
            }
        }
        tracing::debug!("cleaner: segment {victim}: moved {moved} blocks");
        self.flush()?;
        self.debug_check("cleaning");
        Ok(true)
    }
}

/// The background thread that keeps free segments ahead of writers and
/// writes checkpoints when enough log has accumulated.
pub(crate) struct BackgroundCleaner {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl BackgroundCleaner {
    pub fn start(inner: &Arc<PoolInner>) -> Arc<BackgroundCleaner> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = if inner.options.background_cleaner {
            let weak: Weak<PoolInner> = Arc::downgrade(inner);
            let stop = stop.clone();
            Some(
                std::thread::Builder::new()
                    .name("lograid-cleaner".into())
                    .spawn(move || background_loop(weak, stop))
                    .expect("spawn cleaner"),
            )
        } else {
            None
        };
        Arc::new(BackgroundCleaner {
            stop,
            thread: Mutex::new(thread),
        })
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for BackgroundCleaner {
    fn drop(&mut self) {
        self.stop();
    }
}

fn background_loop(weak: Weak<PoolInner>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        let Some(inner) = weak.upgrade() else { return };
        if inner.closed.load(Ordering::SeqCst) || inner.core.lock().read_only_reason.is_some() {
            continue;
        }
        let free = inner.core.lock().free.len();
        let watermark = inner.clean_watermark();
        if free < watermark {
            if let Err(e) = inner.guarded("cleaning", || inner.clean_segments(watermark - free)) {
                tracing::warn!("background cleaner: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            continue;
        }
        let due = inner.core.lock().log_blocks_since_checkpoint
            >= inner.options.checkpoint_interval_blocks;
        if due {
            if let Err(e) = inner.guarded("checkpoint", || inner.checkpoint()) {
                tracing::warn!("background checkpoint: {e}");
            }
        }
    }
}
