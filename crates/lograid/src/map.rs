//! The volume map: for every logical 4 KiB block of a volume, where its
//! current contents live and their CRC-32C. Thin: pages of 512 entries are
//! allocated on first write and freed when emptied. Locations are packed in a
//! u64 (`Loc`): unmapped (a hole), zero (allocated, reads zero), a slot of a
//! head's open row (not yet on disk), or a physical block address. A page
//! holds a 6-byte code and the CRC side by side per entry (10 bytes, read
//! in one cache miss) or, for data written in order, a few runs of
//! consecutive addresses (about 4 bytes per entry).

use crate::format::row::HeadId;
use crate::layout::Pba;

/// Entries per map page.
pub const PAGE_ENTRIES: usize = 512;

/// A block's location, packed into a u64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Loc {
    Unmapped,
    Zero,
    Open { head: HeadId, slot: u32 },
    Disk(Pba),
}

const ZERO_CODE: u64 = u64::MAX;
const OPEN_TAG: u64 = 1 << 62;

impl Loc {
    pub fn encode(self) -> u64 {
        match self {
            Loc::Unmapped => 0,
            Loc::Zero => ZERO_CODE,
            Loc::Open { head, slot } => OPEN_TAG | ((head as u64) << 32) | slot as u64,
            Loc::Disk(p) => p.encode(),
        }
    }
    pub fn decode(v: u64) -> Loc {
        if v == 0 {
            Loc::Unmapped
        } else if v == ZERO_CODE {
            Loc::Zero
        } else if v & OPEN_TAG != 0 {
            let head = HeadId::from_code(((v >> 32) & 0xff) as u8).unwrap_or(HeadId::User);
            Loc::Open {
                head,
                slot: v as u32,
            }
        } else {
            Loc::Disk(Pba::decode(v))
        }
    }
    /// Does this block consume space (counts as live)?
    pub fn is_stored(self) -> bool {
        matches!(self, Loc::Open { .. } | Loc::Disk(_))
    }
}

/// Most runs a compact page holds before it turns dense.
const MAX_RUNS: usize = 24;

/// Entries `start..start+len` of a page whose location codes are
/// `base + step * (i - start)`: a stretch of consecutive blocks on one
/// member (step 1), or a hole or zeroes (step 0).
#[derive(Clone, Copy, Debug)]
struct Run {
    base: u64,
    start: u16,
    len: u16,
    step: u8,
}

impl Run {
    fn end(&self) -> usize {
        self.start as usize + self.len as usize
    }
    fn code_at(&self, i: usize) -> u64 {
        self.base + self.step as u64 * (i - self.start as usize) as u64
    }
    /// Can `code` at the entry right after this run extend it?
    fn extends_with(&self, code: u64) -> Option<u8> {
        let steppable = code != 0 && code != ZERO_CODE;
        match (self.len, self.step) {
            (1, _) if code == self.base => Some(0),
            (1, _) if steppable && code == self.base.wrapping_add(1) => Some(1),
            (_, step) if code == self.code_at(self.end() - 1) + step as u64 => Some(step),
            _ => None,
        }
    }
}

/// A location code in 6 bytes: 10 bytes per randomly written block with
/// its CRC. Tag in the top two bits: 00 unmapped (all zero), 01 open slot
/// (head, slot), 10 disk (member in 6 bits, block in 40), all ones zero.
#[derive(Clone, Copy)]
struct Packed([u8; 6]);

const PACKED_ZERO: u64 = (1 << 48) - 1;
const PACKED_OPEN: u64 = 1 << 46;
const PACKED_DISK: u64 = 2 << 46;
const PACKED_BLOCK_BITS: u32 = 40;
const _: () = {
    assert!(crate::format::MAX_MEMBER_BLOCKS <= 1 << PACKED_BLOCK_BITS);
    assert!(crate::format::MAX_MEMBERS <= 0x3f + 1);
};

impl Packed {
    fn pack(code: u64) -> Packed {
        let v = match code {
            0 => 0,
            ZERO_CODE => PACKED_ZERO,
            c if c & OPEN_TAG != 0 => PACKED_OPEN | (c & 0xff_ffff_ffff),
            c => {
                let (member, block) = (c >> 48, c & ((1 << 48) - 1));
                assert!(
                    member < 64 && block < 1 << PACKED_BLOCK_BITS,
                    "address {c:#x} out of the map's range"
                );
                PACKED_DISK | member << PACKED_BLOCK_BITS | block
            }
        };
        let b = v.to_le_bytes();
        Packed([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    fn unpack(self) -> u64 {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(&self.0);
        let v = u64::from_le_bytes(b);
        match v {
            0 => 0,
            PACKED_ZERO => ZERO_CODE,
            v if v >> 46 == 1 => OPEN_TAG | (v & 0xff_ffff_ffff),
            v => {
                let member = (v >> PACKED_BLOCK_BITS) & 0x3f;
                member << 48 | (v & ((1 << PACKED_BLOCK_BITS) - 1))
            }
        }
    }
}

/// A page of entries in any order: each entry's location code and CRC
/// side by side (10 bytes), in one allocation with the page's count, so a
/// lookup reads one cache line (two for the one entry in eight that
/// straddles a line) after the page table.
struct DensePage {
    entries: [DenseEntry; PAGE_ENTRIES],
    used: u16,
}

#[derive(Clone, Copy)]
struct DenseEntry {
    code: Packed,
    crc: [u8; 4],
}

const EMPTY_ENTRY: DenseEntry = DenseEntry {
    code: Packed([0; 6]),
    crc: [0; 4],
};

/// A page written in order: its location codes as runs (sequentially
/// written data costs about 4 bytes per block instead of 10: its CRC plus
/// a share of a few runs). Runs cover a prefix of the page; entries past
/// the last run are unmapped.
struct RunsPage {
    runs: Vec<Run>,
    crcs: [u32; PAGE_ENTRIES],
    used: u16,
}

/// A map page. A page is written as runs while writes append to it in
/// order; anything else makes it dense, and `compact` turns dense pages
/// with few runs back into runs (at checkpoints).
enum MapPage {
    Dense(Box<DensePage>),
    Runs(Box<RunsPage>),
}

impl MapPage {
    fn new() -> MapPage {
        MapPage::Runs(Box::new(RunsPage {
            runs: Vec::new(),
            crcs: [0; PAGE_ENTRIES],
            used: 0,
        }))
    }

    /// Entry `i`: its location code and CRC.
    fn get(&self, i: usize) -> (u64, u32) {
        match self {
            MapPage::Dense(d) => {
                let e = d.entries[i];
                (e.code.unpack(), u32::from_le_bytes(e.crc))
            }
            MapPage::Runs(r) => (runs_code(&r.runs, i), r.crcs[i]),
        }
    }

    fn used_mut(&mut self) -> &mut u16 {
        match self {
            MapPage::Dense(d) => &mut d.used,
            MapPage::Runs(r) => &mut r.used,
        }
    }

    /// Sets entry `i`, turning the page dense if its runs cannot take it.
    fn set(&mut self, i: usize, code: u64, crc: u32) {
        if let MapPage::Runs(r) = self {
            r.crcs[i] = crc;
            let end = r.runs.last().map_or(0, |r| r.end());
            if i >= end && (code == 0 || append_run(&mut r.runs, i, code)) {
                return;
            }
            self.make_dense();
        }
        if let MapPage::Dense(d) = self {
            d.entries[i] = DenseEntry {
                code: Packed::pack(code),
                crc: crc.to_le_bytes(),
            };
        }
    }

    fn make_dense(&mut self) {
        let MapPage::Runs(r) = self else { return };
        let mut d = Box::new(DensePage {
            entries: [EMPTY_ENTRY; PAGE_ENTRIES],
            used: r.used,
        });
        for (i, e) in d.entries.iter_mut().enumerate() {
            *e = DenseEntry {
                code: Packed::pack(runs_code(&r.runs, i)),
                crc: r.crcs[i].to_le_bytes(),
            };
        }
        *self = MapPage::Dense(d);
    }

    /// Turns a dense page that is a few runs into runs.
    fn compact(&mut self) {
        let MapPage::Dense(d) = self else { return };
        let last = d.entries.iter().rposition(|e| e.code.0 != [0; 6]);
        let mut runs = Vec::new();
        for (i, e) in d.entries.iter().enumerate().take(last.map_or(0, |l| l + 1)) {
            if !append_run(&mut runs, i, e.code.unpack()) {
                return;
            }
        }
        runs.shrink_to_fit();
        let mut crcs = [0; PAGE_ENTRIES];
        for (c, e) in crcs.iter_mut().zip(d.entries.iter()) {
            *c = u32::from_le_bytes(e.crc);
        }
        *self = MapPage::Runs(Box::new(RunsPage {
            runs,
            crcs,
            used: d.used,
        }));
    }

    fn memory_bytes(&self) -> u64 {
        let bytes = match self {
            MapPage::Dense(_) => std::mem::size_of::<DensePage>(),
            MapPage::Runs(r) => {
                std::mem::size_of::<RunsPage>() + r.runs.capacity() * std::mem::size_of::<Run>()
            }
        };
        bytes as u64
    }
}

/// The location code of entry `i` of a page written as `runs`.
fn runs_code(runs: &[Run], i: usize) -> u64 {
    let r = runs.partition_point(|r| r.start as usize <= i);
    match r.checked_sub(1).map(|r| &runs[r]) {
        Some(run) if i < run.end() => run.code_at(i),
        _ => 0,
    }
}

/// Appends `code` at entry `i` (at or past the end of `runs`), filling a gap
/// with a hole. False if that would take more than `MAX_RUNS` runs.
fn append_run(runs: &mut Vec<Run>, i: usize, code: u64) -> bool {
    let end = runs.last().map_or(0, |r| r.end());
    debug_assert!(i >= end);
    if i > end {
        match runs.last_mut() {
            Some(r) if r.base == 0 && r.step == 0 => r.len += (i - end) as u16,
            _ => {
                if runs.len() >= MAX_RUNS {
                    return false;
                }
                runs.push(Run {
                    base: 0,
                    start: end as u16,
                    len: (i - end) as u16,
                    step: 0,
                });
            }
        }
    }
    if let Some(r) = runs.last_mut() {
        if let Some(step) = r.extends_with(code) {
            r.step = step;
            r.len += 1;
            return true;
        }
    }
    if runs.len() >= MAX_RUNS {
        return false;
    }
    runs.push(Run {
        base: code,
        start: i as u16,
        len: 1,
        step: 0,
    });
    true
}

/// One volume's map.
#[derive(Default)]
pub struct VolumeMap {
    pages: Vec<Option<MapPage>>,
    /// Entries not Unmapped.
    mapped: u64,
    /// Entries stored on disk or in an open row.
    stored: u64,
}

impl VolumeMap {
    pub fn get(&self, lba: u64) -> (Loc, u32) {
        let (p, i) = (
            (lba / PAGE_ENTRIES as u64) as usize,
            (lba % PAGE_ENTRIES as u64) as usize,
        );
        match self.pages.get(p).and_then(|x| x.as_ref()) {
            Some(page) => {
                let (code, crc) = page.get(i);
                (Loc::decode(code), crc)
            }
            None => (Loc::Unmapped, 0),
        }
    }

    /// Sets an entry; returns the previous one.
    pub fn set(&mut self, lba: u64, loc: Loc, crc: u32) -> (Loc, u32) {
        let (p, i) = (
            (lba / PAGE_ENTRIES as u64) as usize,
            (lba % PAGE_ENTRIES as u64) as usize,
        );
        if p >= self.pages.len() {
            if loc == Loc::Unmapped {
                return (Loc::Unmapped, 0);
            }
            self.pages.resize_with(p + 1, || None);
        }
        let slot = &mut self.pages[p];
        if slot.is_none() {
            if loc == Loc::Unmapped {
                return (Loc::Unmapped, 0);
            }
            *slot = Some(MapPage::new());
        }
        let page = slot.as_mut().expect("page present");
        let (old_code, old_crc) = page.get(i);
        let old = (Loc::decode(old_code), old_crc);
        page.set(i, loc.encode(), crc);
        let (was_mapped, is_mapped) = (old.0 != Loc::Unmapped, loc != Loc::Unmapped);
        let used = page.used_mut();
        match (was_mapped, is_mapped) {
            (false, true) => {
                *used += 1;
                self.mapped += 1;
            }
            (true, false) => {
                *used -= 1;
                self.mapped -= 1;
            }
            _ => {}
        }
        self.stored = self.stored + loc.is_stored() as u64 - old.0.is_stored() as u64;
        if *used == 0 {
            *slot = None;
        }
        old
    }

    /// Stores pages that are a few runs of consecutive blocks as runs.
    pub fn compact(&mut self) {
        for page in self.pages.iter_mut().flatten() {
            page.compact();
        }
    }

    pub fn mapped_blocks(&self) -> u64 {
        self.mapped
    }
    pub fn stored_blocks(&self) -> u64 {
        self.stored
    }

    /// Bytes of memory the map uses.
    pub fn memory_bytes(&self) -> u64 {
        let pages: u64 = self.pages.iter().flatten().map(|p| p.memory_bytes()).sum();
        let slot = std::mem::size_of::<Option<MapPage>>() as u64;
        pages + self.pages.capacity() as u64 * slot
    }

    /// Mapped entries in LBA order from `start`: (lba, loc, crc).
    pub fn iter_from(&self, start: u64) -> impl Iterator<Item = (u64, Loc, u32)> + '_ {
        self.iter_range(start..u64::MAX)
    }

    /// Mapped entries of `blocks` in LBA order: (lba, loc, crc). Visits only
    /// the pages the range covers (an empty range past the last mapped
    /// block costs nothing, however large the volume).
    pub fn iter_range(
        &self,
        blocks: std::ops::Range<u64>,
    ) -> impl Iterator<Item = (u64, Loc, u32)> + '_ {
        let page_of = |lba: u64| usize::try_from(lba / PAGE_ENTRIES as u64).unwrap_or(usize::MAX);
        let first_page = page_of(blocks.start);
        let past_page = page_of(blocks.end.saturating_add(PAGE_ENTRIES as u64 - 1));
        let (start, end) = (blocks.start, blocks.end);
        self.pages
            .iter()
            .enumerate()
            .take(past_page)
            .skip(first_page)
            .filter_map(|(p, page)| page.as_ref().map(|pg| (p, pg)))
            .flat_map(move |(p, page)| {
                (0..PAGE_ENTRIES).filter_map(move |i| {
                    let lba = (p * PAGE_ENTRIES + i) as u64;
                    let (code, crc) = page.get(i);
                    (code != 0 && start <= lba && lba < end).then(|| (lba, Loc::decode(code), crc))
                })
            })
    }
}

/// Nanoseconds per lookup of a random block in a map of `blocks` blocks
/// (a power of two) written in random order, as random writes leave it
/// (every page dense), one after the other, on one thread, over about
/// `seconds`: what a read's lookup costs once the map is larger than the
/// caches (without the volume map's lock, which a read takes too). For
/// `lograid bench`.
pub fn bench_random_lookups(blocks: u64, seconds: f64) -> f64 {
    assert!(blocks.is_power_of_two(), "{blocks} blocks");
    let mut map = VolumeMap::default();
    // An odd multiplier permutes 0..blocks: every block written once, in an
    // order that fills no page in sequence.
    for i in 0..blocks {
        let lba = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & (blocks - 1);
        let pba = Pba {
            member: (i % 3) as u8,
            block: i + 1,
        };
        map.set(lba, Loc::Disk(pba), i as u32);
    }
    // Each block to look up depends on the last lookup's result, so that
    // lookups do not overlap (a read's lookup has a request's work around it).
    let (mut x, mut crc, mut lookups) = (1u64, 0u32, 0u64);
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..4096 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1 + u64::from(crc & 1));
            crc = map.get((x >> 20) & (blocks - 1)).1;
        }
        lookups += 4096;
    }
    std::hint::black_box(crc);
    start.elapsed().as_nanos() as f64 / lookups as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loc_round_trips() {
        for loc in [
            Loc::Unmapped,
            Loc::Zero,
            Loc::Open {
                head: HeadId::Cleaner,
                slot: 77,
            },
            Loc::Disk(Pba {
                member: 3,
                block: 1 << 40,
            }),
        ] {
            assert_eq!(Loc::decode(loc.encode()), loc);
        }
    }

    #[test]
    fn a_range_lists_its_own_entries_only() {
        let mut m = VolumeMap::default();
        let page = PAGE_ENTRIES as u64;
        let lbas = [0, 1, page - 1, page, 3 * page + 7, 40 * page];
        for &b in &lbas {
            m.set(b, Loc::Zero, 0);
        }
        let range = |r: std::ops::Range<u64>| m.iter_range(r).map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(range(0..u64::MAX), lbas);
        assert_eq!(range(1..page), vec![1, page - 1]);
        assert_eq!(range(page - 1..page + 1), vec![page - 1, page]);
        assert_eq!(range(page + 1..3 * page + 7), Vec::<u64>::new());
        assert_eq!(range(3 * page..3 * page + 8), vec![3 * page + 7]);
        assert_eq!(range(5..5), Vec::<u64>::new());
        assert_eq!(range(41 * page..u64::MAX), Vec::<u64>::new());
        // Every start and end around the page edges agrees with a filter of
        // the whole list.
        for start in [0, 1, page - 1, page, page + 1, 3 * page + 7, 3 * page + 8] {
            for end in [
                start,
                start + 1,
                page,
                2 * page,
                3 * page + 8,
                40 * page + 1,
            ] {
                let want: Vec<u64> = lbas
                    .iter()
                    .copied()
                    .filter(|b| (start..end).contains(b))
                    .collect();
                assert_eq!(range(start..end), want, "{start}..{end}");
            }
        }
    }

    #[test]
    fn counts_and_pages() {
        let mut m = VolumeMap::default();
        m.set(
            5,
            Loc::Disk(Pba {
                member: 0,
                block: 300,
            }),
            9,
        );
        m.set(100_000, Loc::Zero, 0);
        assert_eq!(m.mapped_blocks(), 2);
        assert_eq!(m.stored_blocks(), 1);
        assert_eq!(
            m.get(5),
            (
                Loc::Disk(Pba {
                    member: 0,
                    block: 300
                }),
                9
            )
        );
        let all: Vec<_> = m.iter_from(0).map(|e| e.0).collect();
        assert_eq!(all, vec![5, 100_000]);
        m.set(5, Loc::Unmapped, 0);
        m.set(100_000, Loc::Unmapped, 0);
        assert_eq!(m.mapped_blocks(), 0);
        let slot = std::mem::size_of::<Option<MapPage>>() as u64;
        assert_eq!(m.memory_bytes(), m.pages.capacity() as u64 * slot);
    }

    #[test]
    fn packed_codes_round_trip() {
        for loc in [
            Loc::Unmapped,
            Loc::Zero,
            Loc::Open {
                head: HeadId::Checkpoint,
                slot: u32::MAX,
            },
            Loc::Open {
                head: HeadId::User,
                slot: 0,
            },
            Loc::Disk(Pba {
                member: 23,
                block: crate::format::MAX_MEMBER_BLOCKS - 1,
            }),
            Loc::Disk(Pba {
                member: 0,
                block: 1,
            }),
        ] {
            assert_eq!(Loc::decode(Packed::pack(loc.encode()).unpack()), loc);
        }
    }

    fn disk(block: u64) -> Loc {
        Loc::Disk(Pba { member: 1, block })
    }

    #[test]
    fn sequential_pages_are_runs() {
        let mut m = VolumeMap::default();
        // Four columns of 128 blocks on different members, as a row lays them.
        for lba in 0..4096u64 {
            let member = ((lba / 128) % 3) as u8;
            let block = 1000 + (lba / 384) * 128 + lba % 128;
            m.set(lba, Loc::Disk(Pba { member, block }), lba as u32);
        }
        let per_block = m.memory_bytes() as f64 / 4096.0;
        assert!(per_block < 5.0, "{per_block} bytes per block");
        for lba in 0..4096u64 {
            let member = ((lba / 128) % 3) as u8;
            let block = 1000 + (lba / 384) * 128 + lba % 128;
            assert_eq!(m.get(lba), (Loc::Disk(Pba { member, block }), lba as u32));
        }
        // Overwriting in place makes a page dense; compact brings it back.
        m.set(10, disk(5), 1);
        let dense = m.memory_bytes();
        m.compact();
        assert!(m.memory_bytes() < dense);
        assert_eq!(m.get(10), (disk(5), 1));
        assert_eq!(
            m.get(11).0,
            Loc::Disk(Pba {
                member: 0,
                block: 1011
            })
        );
    }

    proptest::proptest! {
        /// Any sequence of sets and compactions reads back like a plain table.
        #[test]
        fn behaves_like_a_table(ops in proptest::collection::vec(
            (0u64..1200, 0u8..6, 0u64..40, proptest::bool::ANY), 1..400)) {
            let mut m = VolumeMap::default();
            let mut model = std::collections::BTreeMap::new();
            let mut next = 0u64;
            for (lba, kind, block, compact) in ops {
                // Mostly appends in order (runs), some random overwrites.
                let lba = if kind < 3 { next % 1200 } else { lba };
                next = lba + 1;
                let loc = match kind {
                    0 | 1 | 3 => disk(100 + lba + block % 2),
                    2 => Loc::Open { head: HeadId::User, slot: lba as u32 },
                    4 => Loc::Zero,
                    _ => Loc::Unmapped,
                };
                let crc = (lba as u32).wrapping_mul(7) + block as u32;
                let old = m.set(lba, loc, crc);
                let expect_old = model.get(&lba).copied().unwrap_or((Loc::Unmapped, 0));
                proptest::prop_assert_eq!(old.0, expect_old.0);
                if loc == Loc::Unmapped {
                    model.remove(&lba);
                } else {
                    model.insert(lba, (loc, crc));
                }
                if compact {
                    m.compact();
                }
            }
            for lba in 0..1300u64 {
                let want = model.get(&lba).copied().unwrap_or((Loc::Unmapped, 0));
                proptest::prop_assert_eq!(m.get(lba).0, want.0);
                if want.0 != Loc::Unmapped {
                    proptest::prop_assert_eq!(m.get(lba).1, want.1);
                }
            }
            let listed: Vec<_> = m.iter_from(0).map(|(l, loc, crc)| (l, (loc, crc))).collect();
            let expected: Vec<_> = model.into_iter().collect();
            proptest::prop_assert_eq!(m.mapped_blocks(), expected.len() as u64);
            proptest::prop_assert_eq!(listed, expected);
        }
    }
}
