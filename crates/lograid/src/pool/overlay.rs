//! Sub-block writes held in memory ("overlays") and merged into their
//! blocks later ("resolving"), so that a write covering a 4 KiB block only
//! partly does not wait for a read of the old block.
//!
//! Owns: the overlay table (in `Ledger`, under the same lock as the volume
//! maps, so a reader's map lookup and overlay copies are one snapshot), its
//! bound (`PoolOptions::max_overlays`) and space accounting, resolving
//! overlays (read the base outside the lock, merge, append with a
//! compare-and-write that the overlay is still the one merged), the
//! background resolver thread, and `flush_all`, the flush that makes every
//! acknowledged write durable (overlays first, then the log).
//!
//! Rules the rest of the pool keeps: whatever replaces a block (a whole-block
//! write, a trim or zero record, deleting the volume) drops its overlay in
//! the same lock section that changes the map; reads apply the overlays
//! copied with their map lookup; an overlay is either in the table or its
//! bytes are in the log (it leaves the table in the lock section of the
//! append that carries it), so a flush that resolved every overlay older
//! than itself and then flushed the log has made them all durable.

use super::ledger::Ledger;
use super::Engine;
use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE;
use crate::map::Loc;
use crate::sync::{thread, Mutex, MutexGuard};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// 512-byte sectors in a block: one bit each in a mask.
const SECTOR_BYTES: usize = 512;
const SECTORS: usize = BLOCK_SIZE / SECTOR_BYTES;
const FULL: u8 = ((1u16 << SECTORS) - 1) as u8;

/// Overlays resolved at once, and threads reading their bases in parallel.
const RESOLVE_BATCH: usize = 128;
const RESOLVE_THREADS: usize = 8;

/// Attempts to resolve one overlay while other writes keep replacing its
/// base, before giving up with an error.
const RESOLVE_ATTEMPTS: usize = 1000;

/// One block's pending sub-block writes.
struct Overlay {
    /// Sectors written (never empty, never full: a full one is a block write).
    mask: u8,
    bytes: Box<[u8]>,
    /// Tick of the write that created it: tells this overlay from one
    /// created later for the same block after this one was dropped.
    created: u64,
    /// Tick of the latest write merged in.
    version: u64,
    /// Every write merged in with a tick below this one is in the base
    /// already (a resolve that raced with a newer write); a flush needs
    /// the overlay resolved only if `born` is not after the flush began.
    born: u64,
    /// Its block was not stored when it was created: merging it will store
    /// a new block, which is reserved (`OverlayTable::unstored`).
    unstored: bool,
}

impl Overlay {
    fn carried(&self) -> Carried {
        Carried {
            created: self.created,
            version: self.version,
        }
    }
}

/// A copy of an overlay taken with a map lookup.
#[derive(Clone)]
pub struct OverlayCopy {
    mask: u8,
    bytes: Box<[u8]>,
    created: u64,
    version: u64,
}

impl OverlayCopy {
    fn carried(&self) -> Carried {
        Carried {
            created: self.created,
            version: self.version,
        }
    }

    /// Lays the overlay's sectors over `block` (the base).
    pub fn apply(&self, block: &mut [u8]) {
        for s in 0..SECTORS {
            if self.mask & (1 << s) != 0 {
                let r = s * SECTOR_BYTES..(s + 1) * SECTOR_BYTES;
                block[r.clone()].copy_from_slice(&self.bytes[r]);
            }
        }
    }
}

/// The condition of a conditional block write. With an overlay carried:
/// the overlay is still the one merged (`Carried::created`) and, when
/// resolving, the base is still the one read (`entry`); after the append the
/// overlay is dropped if no write was merged into it meanwhile
/// (`Carried::version`), else kept: its sectors are a superset of those
/// merged, so it still lies correctly over the new block. Without one (a
/// read-merge-write done beside the table): the base is still `entry` and
/// the block has no overlay.
#[derive(Debug, Clone, Copy)]
pub struct Cond {
    pub entry: Option<(Loc, u32)>,
    pub overlay: Option<Carried>,
}

/// Which overlay a conditional write carries.
#[derive(Debug, Clone, Copy)]
pub struct Carried {
    created: u64,
    version: u64,
}

/// What a sub-block write did to the table.
pub enum Written {
    /// Held in the table; `wake`: the table is above the low watermark.
    Held { wake: bool },
    /// It completes its block: write this block with this condition.
    Full(Vec<u8>, Cond),
    /// A new overlay is needed and the table is full.
    TableFull,
}

/// Which overlays a resolve pass takes.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// Up to a batch, least recently written first.
    Oldest,
    /// Every one holding a write older than this tick.
    BornBy(u64),
}

/// The overlays of the pool, by (volume, block).
pub struct OverlayTable {
    map: BTreeMap<(u32, u64), Overlay>,
    limit: usize,
    /// Counts writes merged in; stamps `created`, `version`, `born`.
    tick: u64,
    /// Overlays whose block is not stored (each will need a block).
    unstored: u64,
    /// Overlays merged into their blocks since the pool was opened.
    pub resolved: u64,
}

impl OverlayTable {
    pub fn new(limit: usize) -> OverlayTable {
        OverlayTable {
            map: BTreeMap::new(),
            limit: limit.max(1),
            tick: 0,
            unstored: 0,
            resolved: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Overlays whose blocks are not stored yet: blocks reserved.
    pub fn unstored(&self) -> u64 {
        self.unstored
    }

    /// Above this many overlays the background resolver works.
    fn low_watermark(&self) -> usize {
        self.limit / 4
    }

    /// Merges `bytes` at byte `within` of block `lba` of volume `vol`.
    /// `base_stored`: the block is stored now; `stored` and `usable`: the
    /// pool's blocks, to refuse a new overlay that would need a block the
    /// pool does not have (NoSpace now, not when it is merged).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        vol: u32,
        lba: u64,
        within: usize,
        bytes: &[u8],
        base_stored: bool,
        stored: u64,
        usable: u64,
    ) -> Result<Written> {
        assert!(
            within.is_multiple_of(SECTOR_BYTES)
                && bytes.len().is_multiple_of(SECTOR_BYTES)
                && !bytes.is_empty()
                && within + bytes.len() <= BLOCK_SIZE,
            "sub-block write of {} bytes at {within}",
            bytes.len()
        );
        let first = within / SECTOR_BYTES;
        let n = bytes.len() / SECTOR_BYTES;
        let mask = (((1u16 << n) - 1) << first) as u8;
        if let Some(o) = self.map.get_mut(&(vol, lba)) {
            if o.mask | mask == FULL {
                // The sectors this write shares with the overlay are newer
                // here: they go into the overlay too, so that an overlay kept
                // over the new block (a write merged into it meanwhile, see
                // `appended`) does not bring their older bytes back.
                let shared = o.mask & mask;
                if shared != 0 {
                    self.tick += 1;
                    for s in (0..SECTORS).filter(|s| shared & (1 << s) != 0) {
                        let r = s * SECTOR_BYTES..(s + 1) * SECTOR_BYTES;
                        let from = s * SECTOR_BYTES - within;
                        o.bytes[r].copy_from_slice(&bytes[from..from + SECTOR_BYTES]);
                    }
                    o.version = self.tick;
                }
                let mut block = o.bytes.to_vec();
                block[within..within + bytes.len()].copy_from_slice(bytes);
                let cond = Cond {
                    entry: None,
                    overlay: Some(o.carried()),
                };
                return Ok(Written::Full(block, cond));
            }
            self.tick += 1;
            o.mask |= mask;
            o.bytes[within..within + bytes.len()].copy_from_slice(bytes);
            o.version = self.tick;
            return Ok(Written::Held {
                wake: self.map.len() > self.low_watermark(),
            });
        }
        assert_ne!(mask, FULL, "a whole block written as a sub-block write");
        if self.map.len() >= self.limit {
            return Ok(Written::TableFull);
        }
        if !base_stored && stored + self.unstored >= usable {
            return Err(Error::NoSpace);
        }
        self.tick += 1;
        let mut block = vec![0u8; BLOCK_SIZE].into_boxed_slice();
        block[within..within + bytes.len()].copy_from_slice(bytes);
        self.map.insert(
            (vol, lba),
            Overlay {
                mask,
                bytes: block,
                created: self.tick,
                version: self.tick,
                born: self.tick,
                unstored: !base_stored,
            },
        );
        self.unstored += u64::from(!base_stored);
        assert!(self.map.len() <= self.limit, "overlay table over its limit");
        Ok(Written::Held {
            wake: self.map.len() > self.low_watermark(),
        })
    }

    pub fn contains(&self, vol: u32, lba: u64) -> bool {
        !self.map.is_empty() && self.map.contains_key(&(vol, lba))
    }

    pub fn copy(&self, vol: u32, lba: u64) -> Option<OverlayCopy> {
        self.map.get(&(vol, lba)).map(|o| OverlayCopy {
            mask: o.mask,
            bytes: o.bytes.clone(),
            created: o.created,
            version: o.version,
        })
    }

    /// Copies of the overlays of blocks `lba..lba+n`, with their index in
    /// the range.
    pub fn copies(&self, vol: u32, lba: u64, n: u64) -> Vec<(usize, OverlayCopy)> {
        if self.map.is_empty() {
            return Vec::new();
        }
        self.map
            .range((vol, lba)..(vol, lba + n))
            .map(|(&(_, b), o)| {
                (
                    (b - lba) as usize,
                    OverlayCopy {
                        mask: o.mask,
                        bytes: o.bytes.clone(),
                        created: o.created,
                        version: o.version,
                    },
                )
            })
            .collect()
    }

    /// Whether block `lba` holds an overlay with room reserved for it (a
    /// block not stored yet).
    pub fn reserves(&self, vol: u32, lba: u64) -> bool {
        self.map.get(&(vol, lba)).is_some_and(|o| o.unstored)
    }

    /// Blocks reserved for overlays other than that of block `lba` (a write
    /// storing that block takes over its reservation).
    pub fn unstored_except(&self, vol: u32, lba: u64) -> u64 {
        let own = self.map.get(&(vol, lba)).is_some_and(|o| o.unstored);
        self.unstored - u64::from(own)
    }

    /// Block `lba` was replaced as a whole (written, trimmed, zeroed).
    pub fn remove(&mut self, vol: u32, lba: u64) {
        if self.map.is_empty() {
            return;
        }
        if let Some(o) = self.map.remove(&(vol, lba)) {
            self.unstored -= u64::from(o.unstored);
        }
    }

    /// Blocks `lo..hi` were replaced as a whole.
    pub fn remove_range(&mut self, vol: u32, lo: u64, hi: u64) {
        if self.map.is_empty() || lo >= hi {
            return;
        }
        let keys: Vec<(u32, u64)> = self
            .map
            .range((vol, lo)..(vol, hi))
            .map(|(k, _)| *k)
            .collect();
        for (v, b) in keys {
            self.remove(v, b);
        }
    }

    /// The volume was deleted.
    pub fn remove_volume(&mut self, vol: u32) {
        self.remove_range(vol, 0, u64::MAX);
    }

    /// Whether a conditional write of block `lba` may go ahead, as far as
    /// overlays go: the overlay it carries is still there, or, carrying none,
    /// none has appeared.
    pub fn admits(&self, vol: u32, lba: u64, cond: &Cond) -> bool {
        match cond.overlay {
            Some(c) => self
                .map
                .get(&(vol, lba))
                .is_some_and(|o| o.created == c.created),
            None => !self.contains(vol, lba),
        }
    }

    /// Block `lba` was appended whole (in this lock section). Carrying an
    /// overlay: drop it if nothing was merged into it since, else keep it
    /// over the new block, which is stored now. Otherwise the block replaced
    /// any overlay.
    pub fn appended(&mut self, vol: u32, lba: u64, carried: Option<Carried>) {
        let Some(c) = carried else {
            self.remove(vol, lba);
            return;
        };
        let o = self
            .map
            .get_mut(&(vol, lba))
            .expect("the overlay a conditional write carried");
        assert_eq!(o.created, c.created, "overlay replaced under its write");
        self.resolved += 1;
        if o.version == c.version {
            self.remove(vol, lba);
            return;
        }
        if o.unstored {
            o.unstored = false;
            self.unstored -= 1;
        }
        o.born = o.born.max(c.version + 1);
    }

    /// Up to `max` overlays `pick` takes (but none in `skip`).
    fn pick(&self, pick: Pick, max: usize, skip: &HashSet<(u32, u64)>) -> Vec<(u32, u64)> {
        match pick {
            Pick::BornBy(t) => self
                .map
                .iter()
                .filter(|(k, o)| o.born <= t && !skip.contains(k))
                .take(max)
                .map(|(k, _)| *k)
                .collect(),
            Pick::Oldest => {
                let mut all: Vec<(u64, (u32, u64))> =
                    self.map.iter().map(|(k, o)| (o.version, *k)).collect();
                if all.len() > max {
                    all.select_nth_unstable(max);
                    all.truncate(max);
                }
                all.into_iter().map(|(_, k)| k).collect()
            }
        }
    }

    /// Checks the table against the maps (for `Ledger::check_invariants`).
    pub fn check(&self, ledger: &Ledger) -> std::result::Result<(), String> {
        if self.map.len() > self.limit {
            return Err(format!("{} overlays, limit {}", self.map.len(), self.limit));
        }
        let mut unstored = 0;
        for (&(vol, lba), o) in &self.map {
            if o.mask == 0 || o.mask == FULL {
                return Err(format!(
                    "overlay of volume {vol} block {lba} has mask {:#04x}",
                    o.mask
                ));
            }
            let Some(v) = ledger.volume(vol) else {
                return Err(format!("overlay of deleted volume {vol} block {lba}"));
            };
            if o.unstored == v.map.get(lba).0.is_stored() {
                return Err(format!(
                    "overlay of volume {vol} block {lba}: unstored {} but the map says {:?}",
                    o.unstored,
                    v.map.get(lba).0
                ));
            }
            unstored += u64::from(o.unstored);
        }
        if unstored != self.unstored {
            return Err(format!(
                "{unstored} overlays on unstored blocks, counted {}",
                self.unstored
            ));
        }
        Ok(())
    }
}

impl Engine {
    /// Makes every write acknowledged before the call durable: merges every
    /// overlay holding such a write into its block, then flushes the log.
    /// An overlay that cannot be merged (no space, the pool stopped writing,
    /// its old block unreadable) stays, and the flush fails with the reason.
    pub(crate) fn flush_all(&self) -> Result<()> {
        let resolved = self.resolve_acknowledged();
        let flushed = self.flush();
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
            ledger.overlays
                .pick(Pick::Oldest, RESOLVE_BATCH, &HashSet::new())
        };
        match self.resolve_keys(&keys) {
            (0, mut errors) if !errors.is_empty() => Err(errors.swap_remove(0).1),
            _ => Ok(()),
        }
    }

    /// One background pass: a batch if the table is above its low
    /// watermark. Returns whether there was anything to do.
    fn resolve_background(&self) -> Result<bool> {
        let _r = self.resolving.lock();
        let keys = {
            let ledger = self.ledger.lock();
            if ledger.overlays.len() <= ledger.overlays.low_watermark() {
                return Ok(false);
            }
            ledger.overlays
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
        for _ in 0..RESOLVE_ATTEMPTS {
            let name = {
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
                let entry = ledger.volume(vol).map(|v| v.map.get(lba));
                entry.zip(ledger.overlays.copy(vol, lba))
            });
            let (entry, overlay) = match snapshot {
                Ok(Some(s)) => s,
                Ok(None) => return Ok(()), // replaced, or merged by another writer
                Err(Error::NotFound(_)) if self.ledger.lock().volume(vol).is_none() => return Ok(()),
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
        Err(Error::Refused(format!(
            "volume {vol} block {lba}: merging a sub-block write kept racing with other writes"
        )))
    }
}

/// The background thread (`lograid-resolver`) that keeps the overlay table below its low watermark, so
/// that writers rarely find it full and flushes have little to merge.
pub(crate) fn background_loop(weak: Weak<Engine>, stop: Arc<super::background::Stop>) {
    while !stop.is_set() {
        let Some(inner) = weak.upgrade() else { return };
        {
            let mut ledger = inner.ledger.lock();
            if ledger.overlays.len() <= ledger.overlays.low_watermark() {
                inner
                    .overlay_wake
                    .wait_for(&mut ledger, Duration::from_millis(20));
            }
            if inner.closed.load(Ordering::SeqCst) || ledger.read_only_reason.is_some() {
                drop(ledger);
                drop(inner);
                stop.pause(Duration::from_millis(50));
                continue;
            }
        }
        match inner.guarded("merging sub-block writes", || inner.resolve_background()) {
            Ok(_) => {}
            Err(e) => {
                // The overlays stay; the next flush reports the error.
                tracing::warn!("background merge of sub-block writes: {e}");
                drop(inner);
                stop.pause(Duration::from_millis(500));
            }
        }
    }
}

/// The races of sub-block writes, played in a fixed order through the
/// internal steps (a writer completing a block, a resolve) with other
/// writes in between.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Member, SimMember};
    use crate::pool::create::create_pool;
    use crate::pool::{CreateOptions, Pool, PoolOptions, Volume};

    fn pool() -> (Pool, Volume) {
        let members: Vec<Arc<dyn Member>> = (0..3)
            .map(|i| Arc::new(SimMember::new(&format!("sim{i}"), 8 << 20)) as Arc<dyn Member>)
            .collect();
        let opts = CreateOptions {
            name: "t".into(),
            parity: 1,
            chunk_bytes: 16 * 1024,
            segment_bytes: Some(64 * 1024),
            force: true,
            initial_volume: Some(("v".into(), 1 << 20)),
        };
        let options = PoolOptions {
            io_threads: 2,
            background_cleaner: false,
            background_resolver: false,
            ..Default::default()
        };
        let pool = create_pool(members, &opts, options).unwrap();
        let vol = pool.volume("v").unwrap();
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
        pool.inner.ledger.lock().overlays.len()
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
            let mut ledger = pool.inner.ledger.lock();
            ledger.overlays
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
            .inner
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
            let ledger = pool.inner.ledger.lock();
            let entry = ledger.volume(vol.id()).unwrap().map.get(0);
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
            .inner
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
            let ledger = pool.inner.ledger.lock();
            let entry = ledger.volume(vol.id()).unwrap().map.get(0);
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
            .inner
            .write_blocks(vol.id(), 0, &merged, Some(cond))
            .unwrap());
        assert_eq!(held(&pool), 1);
        let want = sectors(&[0x22, 0x33, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11]);
        assert_eq!(read(&vol), want);
        // The kept overlay holds a write newer than the resolve: a flush
        // that began now must take it.
        pool.inner.resolve_acknowledged().unwrap();
        assert_eq!(held(&pool), 0);
        assert_eq!(read(&vol), want);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn table_bound_and_masks() {
        let mut t = OverlayTable::new(2);
        let w = |t: &mut OverlayTable, lba, within, len| {
            t.write(1, lba, within, &vec![1u8; len], false, 0, 10)
                .unwrap()
        };
        assert!(matches!(w(&mut t, 0, 0, 512), Written::Held { .. }));
        assert!(matches!(w(&mut t, 1, 512, 1024), Written::Held { .. }));
        assert!(matches!(w(&mut t, 2, 0, 512), Written::TableFull));
        // Merging into an existing overlay needs no room.
        assert!(matches!(w(&mut t, 0, 512, 3072), Written::Held { .. }));
        assert!(matches!(w(&mut t, 0, 3584, 512), Written::Full(..)));
        assert_eq!(t.unstored(), 2);
        // No block left for a new overlay on an unstored block.
        let mut t = OverlayTable::new(8);
        assert!(matches!(
            t.write(1, 0, 0, &[0u8; 512], false, 9, 10),
            Ok(Written::Held { .. })
        ));
        assert!(matches!(
            t.write(1, 1, 0, &[0u8; 512], false, 9, 10),
            Err(Error::NoSpace)
        ));
        assert!(matches!(
            t.write(1, 2, 0, &[0u8; 512], true, 9, 10),
            Ok(Written::Held { .. })
        ));
    }
}
