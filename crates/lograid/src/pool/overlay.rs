//! Sub-block writes held in memory ("overlays") and merged into their
//! blocks later ("resolving"), so that a write covering a 4 KiB block only
//! partly does not wait for a read of the old block.
//!
//! Owns: the overlay table (in `Ledger`, under the lock the volume maps
//! are changed under, so a locked reader's map lookup and overlay copies
//! are one snapshot; a read without that lock goes ahead only while its
//! volume holds no overlay: `read_index`), its
//! bound (`PoolOptions::max_overlays`) and space accounting, resolving
//! overlays (read the base outside the lock, merge, append with a
//! compare-and-write that the overlay is still the one merged), the
//! background resolver thread, and `flush_acknowledged`, the flush that makes every
//! acknowledged write durable (overlays first, then the log).
//!
//! Rules the rest of the pool keeps: whatever replaces a block (a whole-block
//! write, a trim or zero record, deleting the volume) drops its overlay in
//! the same lock section that changes the map, after the map changed (a
//! deletion withdraws the volume's size first); reads apply the overlays
//! copied with their map lookup; an overlay is either in the table or its
//! bytes are in the log (it leaves the table in the lock section of the
//! append that carries it), so a flush that resolved every overlay older
//! than itself and then flushed the log has made them all durable.

use super::ledger::check_writable;
use super::overlay_table::Written;
use super::overlay_table::{Cond, Pick};
use super::read::gone;
use super::Engine;
use crate::error::{Error, Refusal, Result};
use crate::format::BLOCK_BYTES;
use crate::format::BLOCK_SIZE;
use crate::sync::{thread, Mutex, MutexGuard};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Attempts of an optimistic sub-block write before giving up.
const PARTIAL_WRITE_ATTEMPTS: usize = 1000;

/// Overlays resolved at once, and threads reading their bases in parallel.
const RESOLVE_BATCH: usize = 128;

const RESOLVE_THREADS: usize = 8;

/// Attempts to resolve one overlay while other writes keep replacing its
/// base, before giving up with an error.
const RESOLVE_ATTEMPTS: usize = 1000;

impl Engine {
    /// Makes every write acknowledged before the call durable: merges every
    /// overlay holding such a write into its block, then flushes the log.
    /// An overlay that cannot be merged (no space, the pool stopped writing,
    /// its old block unreadable) stays, and the flush fails with the reason.
    pub(crate) fn flush_acknowledged(&self) -> Result<()> {
        let resolved = self.resolve_acknowledged();
        let flushed = self.flush_log().and_then(|()| self.checkpoint_log_if_due());
        resolved.and(flushed)
    }

    /// Merges every overlay holding a write acknowledged before the call,
    /// in parallel batches. One that fails is left (and the others merged):
    /// the first error is returned.
    pub(crate) fn resolve_acknowledged(&self) -> Result<()> {
        let t = {
            let ledger = self.ledger.lock();
            if ledger.overlays.len() == 0 {
                return Ok(());
            }
            ledger.overlays.tick
        };
        let mut failed = HashSet::new();
        let mut first_error = None;
        loop {
            let _r = self.resolving.lock();
            let keys = self
                .ledger
                .lock()
                .overlays
                .pick(Pick::BornBy(t), RESOLVE_BATCH, &failed);
            if keys.is_empty() {
                return first_error.map_or(Ok(()), Err);
            }
            for (key, e) in self.resolve_keys(&keys).1 {
                failed.insert(key);
                first_error.get_or_insert(e);
            }
        }
    }

    /// A writer found the table full: merges a batch of the oldest overlays
    /// (unless another thread made room meanwhile; fails only if nothing
    /// could be merged), or returns None at once if another thread is
    /// merging a batch already (the caller does not wait for it).
    pub(crate) fn try_make_overlay_room(&self) -> Option<Result<()>> {
        let r = self.resolving.try_lock()?;
        Some(self.make_overlay_room_locked(r))
    }

    fn make_overlay_room_locked(&self, _r: MutexGuard<'_, ()>) -> Result<()> {
        let keys = {
            let ledger = self.ledger.lock();
            if ledger.overlays.len() < ledger.overlays.limit {
                return Ok(());
            }
            ledger
                .overlays
                .pick(Pick::Oldest, RESOLVE_BATCH, &HashSet::new())
        };
        match self.resolve_keys(&keys) {
            (0, mut errors) if !errors.is_empty() => Err(errors.swap_remove(0).1),
            _ => Ok(()),
        }
    }

    /// One background pass: a batch if the table is above its low
    /// watermark. Returns whether there was anything to do.
    pub(crate) fn resolve_background(&self) -> Result<bool> {
        let _r = self.resolving.lock();
        let keys = {
            let ledger = self.ledger.lock();
            if ledger.overlays.len() <= ledger.overlays.low_watermark() {
                return Ok(false);
            }
            ledger
                .overlays
                .pick(Pick::Oldest, RESOLVE_BATCH, &HashSet::new())
        };
        match self.resolve_keys(&keys) {
            (_, mut errors) if !errors.is_empty() => Err(errors.swap_remove(0).1),
            _ => Ok(true),
        }
    }

    /// Resolves `keys`, `RESOLVE_THREADS` at a time (their base reads
    /// overlap). Returns how many were merged (or found gone) and the
    /// errors of the others.
    #[allow(clippy::type_complexity)]
    fn resolve_keys(&self, keys: &[(u32, u64)]) -> (usize, Vec<((u32, u64), Error)>) {
        let threads = RESOLVE_THREADS.min(keys.len());
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let errors: Mutex<Vec<((u32, u64), Error)>> = Mutex::new(Vec::new());
        let work = || loop {
            let Some(&(vol, lba)) = keys.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return;
            };
            match self.resolve_one(vol, lba) {
                Ok(()) => {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => errors.lock().push(((vol, lba), e)),
            }
        };
        if threads <= 1 {
            work();
        } else {
            thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(work);
                }
            });
        }
        (done.into_inner(), errors.into_inner())
    }

    /// Merges the overlay of one block into it: snapshot (map entry and
    /// overlay) with the base read, merge, append if neither changed.
    fn resolve_one(&self, vol: u32, lba: u64) -> Result<()> {
        let mut name = String::new();
        for _ in 0..RESOLVE_ATTEMPTS {
            name = {
                let ledger = self.ledger.lock();
                let Some(v) = ledger.volume(vol) else {
                    // Deleting a volume drops its overlays in the same lock section.
                    assert!(
                        !ledger.overlays.contains(vol, lba),
                        "overlay of deleted volume {vol} block {lba}"
                    );
                    return Ok(());
                };
                v.name.clone()
            };
            let mut block = vec![0u8; BLOCK_SIZE];
            let snapshot = self.read_base(vol, &name, lba, &mut block, |ledger| {
                let entry = ledger.volume(vol).map(|v| v.map().get(lba));
                Ok(entry.zip(ledger.overlays.copy(vol, lba)))
            });
            let (entry, overlay) = match snapshot {
                Ok(Some(s)) => s,
                Ok(None) => return Ok(()), // replaced, or merged by another writer
                Err(Error::NotFound(_)) if self.ledger.lock().volume(vol).is_none() => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            };
            overlay.apply(&mut block);
            let cond = Cond {
                entry: Some(entry),
                overlay: Some(overlay.carried()),
            };
            if self.write_blocks(vol, lba, &block, Some(cond))? {
                return Ok(());
            }
        }
        Err(Error::Refused(Refusal::KeptRacing {
            volume: name,
            block: lba,
            what: "merging a sub-block write",
        }))
    }

    /// Writes `data` at byte `offset` of volume `id` (512-byte aligned,
    /// range already checked). Sub-block pieces merge into their block.
    pub(crate) fn write(&self, id: u32, name: &str, offset: u64, data: &[u8]) -> Result<()> {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let within = (pos % BLOCK_BYTES) as usize;
            if within != 0 || rest.len() < BLOCK_SIZE {
                let n = (BLOCK_SIZE - within).min(rest.len());
                self.write_partial(id, name, pos / BLOCK_BYTES, within, &rest[..n])?;
                pos += n as u64;
                rest = &rest[n..];
                continue;
            }
            let n = rest.len() / BLOCK_SIZE * BLOCK_SIZE;
            self.write_blocks(id, pos / BLOCK_BYTES, &rest[..n], None)?;
            pos += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A write covering block `lba` only partly: held as an overlay (see
    /// `overlay`), merged into the block later; no read here. One that
    /// completes its overlay's block is written as a whole block.
    fn write_partial(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        within: usize,
        bytes: &[u8],
    ) -> Result<()> {
        for _ in 0..PARTIAL_WRITE_ATTEMPTS {
            let written = {
                let mut ledger = self.ledger.lock();
                check_writable(&ledger)?;
                let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
                let base_stored = vol.map().get(lba).0.is_stored();
                let (stored, usable) = (ledger.stored_blocks, ledger.usable_blocks);
                ledger
                    .overlays
                    .write(id, lba, within, bytes, base_stored, stored, usable)?
            };
            match written {
                Written::Held { wake } => {
                    if wake {
                        self.overlay_wake.notify_one();
                    }
                    return Ok(());
                }
                Written::Full(block, cond) => {
                    if self.write_blocks(id, lba, &block, Some(cond))? {
                        return Ok(());
                    }
                }
                // The table is full. Merge a batch of it, unless another
                // thread is doing that already: then merge this write with
                // its block here (read, merge, conditional write), in
                // parallel with the other writers, instead of queueing
                // behind the batch (at high queue depths the table fills
                // faster than one batch at a time empties it).
                Written::TableFull => match self.try_make_overlay_room() {
                    Some(made) => made?,
                    None => {
                        if self.merge_beside_table(id, name, lba, within, bytes)? {
                            return Ok(());
                        }
                    }
                },
            }
        }
        Err(Error::Refused(Refusal::KeptRacing {
            volume: name.to_string(),
            block: lba,
            what: "sub-block write",
        }))
    }

    /// Writes `bytes` at byte `within` of block `lba` by reading the block,
    /// merging and writing it whole, on condition that the block did not
    /// change since it was read (false if it did: try again). The map entry
    /// the condition compares is taken in the lock section of the read's map
    /// lookup: taken apart from it, the block could change A to B to A
    /// in between, and the merge, built on B, would be written over the
    /// later A (a lost write). The block's overlays, if any, are applied,
    /// and the write requires that there be none by then.
    pub(crate) fn merge_beside_table(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        within: usize,
        bytes: &[u8],
    ) -> Result<bool> {
        let mut block = vec![0u8; BLOCK_SIZE];
        let (entry, overlays) = self.read_base(id, name, lba, &mut block, |ledger| {
            let entry = ledger.volume(id).map(|v| v.map().get(lba));
            Ok((entry, ledger.overlays.copies(id, lba, 1)))
        })?;
        let entry = entry.ok_or_else(|| gone(name))?;
        for (_, o) in overlays {
            o.apply(&mut block);
        }
        block[within..within + bytes.len()].copy_from_slice(bytes);
        let cond = Cond {
            entry: Some(entry),
            overlay: None,
        };
        self.write_blocks(id, lba, &block, Some(cond))
    }

    /// Makes every acknowledged write durable (sub-block writes held in
    /// memory merged first) and writes a checkpoint. If a merge fails, the
    /// checkpoint is still written and the merge's error returned.
    pub(crate) fn checkpoint_acknowledged(&self) -> Result<()> {
        let resolved = self.resolve_acknowledged();
        self.checkpoint_log()?;
        resolved
    }
}

/// The races of sub-block writes, played in a fixed order through the
/// internal steps (a writer completing a block, a resolve) with other
/// writes in between.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::overlay_table::{Written, SECTORS, SECTOR_BYTES};
    use crate::pool::{Pool, Volume};

    fn pool() -> (Pool, Volume) {
        let (pool, vol, _) = crate::pool::test_pool::sim_pool();
        (pool, vol)
    }

    fn sectors(fill: &[u8; SECTORS]) -> Vec<u8> {
        fill.iter()
            .flat_map(|&b| std::iter::repeat_n(b, SECTOR_BYTES))
            .collect()
    }

    fn read(vol: &Volume) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK_SIZE];
        vol.read(0, &mut buf).unwrap();
        buf
    }

    fn held(pool: &Pool) -> usize {
        pool.engine.ledger.lock().overlays.len()
    }

    /// A sub-block write held in one volume sends only that volume's reads
    /// to the ledger (which applies it); another volume's reads still look
    /// their blocks up without the ledger lock.
    #[test]
    fn an_overlay_held_in_one_volume_leaves_the_others_reads_unlocked() {
        let (pool, a) = pool();
        let b = pool.create_volume("b", 1 << 20).unwrap();
        b.write(0, &[0x22; BLOCK_SIZE]).unwrap();
        b.flush().unwrap();
        let unlocked = || pool.status().reads_without_ledger_lock;
        a.write(0, &sectors(&[0x33, 0, 0, 0, 0, 0, 0, 0])[..SECTOR_BYTES])
            .unwrap();
        assert_eq!(held(&pool), 1);

        let before = unlocked();
        assert_eq!(read(&b), vec![0x22; BLOCK_SIZE]);
        assert_eq!(unlocked(), before + 1, "b's read went through the ledger");

        let got = read(&a);
        assert_eq!(
            unlocked(),
            before + 1,
            "a's read skipped its overlay's lock"
        );
        assert_eq!(got[..SECTOR_BYTES], [0x33; SECTOR_BYTES]);
        assert!(got[SECTOR_BYTES..].iter().all(|&x| x == 0));
        pool.check_invariants().unwrap();
    }

    /// A write that completes its block is appended with the overlay it
    /// merged; another sector written in between stays, over the new block.
    #[test]
    fn completing_write_keeps_a_write_merged_meanwhile() {
        let (pool, vol) = pool();
        vol.write(0, &[0x11; BLOCK_SIZE]).unwrap();
        vol.write(0, &[0x22; 7 * SECTOR_BYTES]).unwrap();
        // Sector 7 completes the block: what the writer would append.
        let written = {
            let mut ledger = pool.engine.ledger.lock();
            ledger
                .overlays
                .write(
                    vol.id(),
                    0,
                    7 * SECTOR_BYTES,
                    &[0x33; SECTOR_BYTES],
                    true,
                    1,
                    100,
                )
                .unwrap()
        };
        let Written::Full(block, cond) = written else {
            panic!("the block was not complete");
        };
        // Meanwhile another writer writes sector 3.
        vol.write(3 * SECTOR_BYTES as u64, &[0x44; SECTOR_BYTES])
            .unwrap();
        assert!(pool
            .engine
            .write_blocks(vol.id(), 0, &block, Some(cond))
            .unwrap());
        let want = sectors(&[0x22, 0x22, 0x22, 0x44, 0x22, 0x22, 0x22, 0x33]);
        assert_eq!(read(&vol), want);
        assert_eq!(held(&pool), 1, "the newer overlay stays");
        vol.flush().unwrap();
        assert_eq!(held(&pool), 0);
        assert_eq!(read(&vol), want);
        pool.check_invariants().unwrap();
    }

    /// A resolve whose overlay was dropped (the block trimmed) and created
    /// again by a newer write does not append the old merge, even though
    /// the block's map entry (unmapped) is the same as when it read it.
    #[test]
    fn resolve_of_a_replaced_overlay_writes_nothing() {
        let (pool, vol) = pool();
        vol.write(SECTOR_BYTES as u64, &[0x55; 2 * SECTOR_BYTES])
            .unwrap();
        let (entry, copy) = {
            let ledger = pool.engine.ledger.lock();
            let entry = ledger.volume(vol.id()).unwrap().map().get(0);
            (entry, ledger.overlays.copy(vol.id(), 0).unwrap())
        };
        let mut merged = vec![0u8; BLOCK_SIZE];
        copy.apply(&mut merged);
        // Meanwhile: trimmed, then a new sub-block write.
        vol.trim(0, BLOCK_SIZE as u64).unwrap();
        vol.write(5 * SECTOR_BYTES as u64, &[0x66; SECTOR_BYTES])
            .unwrap();
        let cond = Cond {
            entry: Some(entry),
            overlay: Some(copy.carried()),
        };
        assert!(!pool
            .engine
            .write_blocks(vol.id(), 0, &merged, Some(cond))
            .unwrap());
        let want = sectors(&[0, 0, 0, 0, 0, 0x66, 0, 0]);
        assert_eq!(read(&vol), want);
        vol.flush().unwrap();
        assert_eq!(read(&vol), want);
        pool.check_invariants().unwrap();
    }

    /// A resolve that raced with a newer write to the same overlay appends
    /// what it merged and keeps the overlay; a flush resolves it again.
    #[test]
    fn resolve_racing_a_newer_write_keeps_the_overlay() {
        let (pool, vol) = pool();
        vol.write(0, &[0x11; BLOCK_SIZE]).unwrap();
        vol.write(0, &[0x22; SECTOR_BYTES]).unwrap();
        let (entry, copy) = {
            let ledger = pool.engine.ledger.lock();
            let entry = ledger.volume(vol.id()).unwrap().map().get(0);
            (entry, ledger.overlays.copy(vol.id(), 0).unwrap())
        };
        let mut merged = vec![0x11u8; BLOCK_SIZE];
        copy.apply(&mut merged);
        vol.write(SECTOR_BYTES as u64, &[0x33; SECTOR_BYTES])
            .unwrap();
        let cond = Cond {
            entry: Some(entry),
            overlay: Some(copy.carried()),
        };
        assert!(pool
            .engine
            .write_blocks(vol.id(), 0, &merged, Some(cond))
            .unwrap());
        assert_eq!(held(&pool), 1);
        let want = sectors(&[0x22, 0x33, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11]);
        assert_eq!(read(&vol), want);
        // The kept overlay holds a write newer than the resolve: a flush
        // that began now must take it.
        pool.engine.resolve_acknowledged().unwrap();
        assert_eq!(held(&pool), 0);
        assert_eq!(read(&vol), want);
        pool.check_invariants().unwrap();
    }
}
