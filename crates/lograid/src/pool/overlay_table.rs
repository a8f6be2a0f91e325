//! The table of sub-block writes held in memory ("overlays"): per block,
//! the sectors written and their bytes, bounded in number, with the blocks
//! they will need reserved, and the conditions under which a merged block
//! may replace them (`Cond`, `Carried`). Pure bookkeeping kept in the
//! ledger, under its lock; the paths that fill and merge it are in
//! `overlay`.

use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE;
use crate::map::Loc;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// 512-byte sectors in a block: one bit each in a mask.
pub(crate) const SECTOR_BYTES: usize = crate::format::SECTOR_BYTES as usize;
pub(crate) const SECTORS: usize = BLOCK_SIZE / SECTOR_BYTES;
const _: () = assert!(SECTORS * SECTOR_BYTES == BLOCK_SIZE && SECTORS <= 8);
const FULL: u8 = ((1u16 << SECTORS) - 1) as u8;

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
    pub(crate) fn carried(&self) -> Carried {
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
    pub(crate) fn carried(&self) -> Carried {
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
pub(crate) enum Pick {
    /// Up to a batch, least recently written first.
    Oldest,
    /// Every one holding a write older than this tick.
    BornBy(u64),
}

/// The overlays of the pool, by (volume, block).
pub struct OverlayTable {
    map: BTreeMap<(u32, u64), Overlay>,
    pub(crate) limit: usize,
    /// Counts writes merged in; stamps `created`, `version`, `born`.
    pub(crate) tick: u64,
    /// Overlays whose block is not stored (each will need a block).
    unstored: u64,
    /// Overlays merged into their blocks since the pool was opened.
    pub resolved: u64,
    /// Each volume's overlays held, published for reads without the ledger
    /// lock (`read_index::VolumeView`): raised when an overlay is inserted,
    /// lowered once it is removed. A volume's counter is given when the
    /// volume is added (`watch`) and dropped when it is deleted.
    published: HashMap<u32, Arc<AtomicUsize>>,
}

impl OverlayTable {
    pub fn new(limit: usize) -> OverlayTable {
        OverlayTable {
            map: BTreeMap::new(),
            limit: limit.max(1),
            tick: 0,
            unstored: 0,
            resolved: 0,
            published: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Publishes volume `vol`'s overlays to `counter` from now on (a volume
    /// added to the ledger; it holds none yet).
    pub fn watch(&mut self, vol: u32, counter: Arc<AtomicUsize>) {
        assert_eq!(self.count(vol), 0, "volume {vol} added with overlays");
        counter.store(0, Ordering::Release);
        self.published.insert(vol, counter);
    }

    /// Overlays held in volume `vol`.
    pub fn count(&self, vol: u32) -> usize {
        self.map.range((vol, 0)..=(vol, u64::MAX)).count()
    }

    /// Volume `vol`'s published count, which must exist.
    fn counter(&self, vol: u32) -> &AtomicUsize {
        self.published
            .get(&vol)
            .unwrap_or_else(|| panic!("overlay in volume {vol}, which reads are not told of"))
    }

    /// Overlays whose blocks are not stored yet: blocks reserved.
    pub fn unstored(&self) -> u64 {
        self.unstored
    }

    /// Above this many overlays the background resolver works.
    pub(crate) fn low_watermark(&self) -> usize {
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
        self.counter(vol).fetch_add(1, Ordering::Release);
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
            self.counter(vol).fetch_sub(1, Ordering::Release);
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

    /// The volume was deleted (or its creation failed): its overlays go,
    /// then its counter.
    pub fn remove_volume(&mut self, vol: u32) {
        self.remove_range(vol, 0, u64::MAX);
        self.published.remove(&vol);
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
    pub(crate) fn pick(
        &self,
        pick: Pick,
        max: usize,
        skip: &HashSet<(u32, u64)>,
    ) -> Vec<(u32, u64)> {
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
    /// `stored(vol, lba)`: whether the volume exists and stores the block
    /// now (None: no such volume).
    pub fn check(
        &self,
        stored: impl Fn(u32, u64) -> Option<bool>,
    ) -> std::result::Result<(), String> {
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
            let Some(is_stored) = stored(vol, lba) else {
                return Err(format!("overlay of deleted volume {vol} block {lba}"));
            };
            if o.unstored == is_stored {
                return Err(format!(
                    "overlay of volume {vol} block {lba}: unstored {} but the block is {}stored",
                    o.unstored,
                    if is_stored { "" } else { "not " }
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
        if let Some((vol, _)) = self
            .map
            .keys()
            .find(|(v, _)| !self.published.contains_key(v))
        {
            return Err(format!(
                "overlays of volume {vol}, whose count is not published"
            ));
        }
        for (&vol, counter) in &self.published {
            let (held, published) = (self.count(vol), counter.load(Ordering::Acquire));
            if held != published {
                return Err(format!(
                    "volume {vol} holds {held} overlays, published as {published}"
                ));
            }
        }
        Ok(())
    }

    /// Whether volume `vol`'s overlays are published to `counter`.
    pub fn publishes_to(&self, vol: u32, counter: &Arc<AtomicUsize>) -> bool {
        self.published
            .get(&vol)
            .is_some_and(|c| Arc::ptr_eq(c, counter))
    }

    /// Volumes whose overlays are published.
    pub fn published_volumes(&self) -> usize {
        self.published.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_bound_and_masks() {
        let mut t = OverlayTable::new(2);
        t.watch(1, Arc::default());
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
        t.watch(1, Arc::default());
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
