//! The volume map: for every logical 4 KiB block of a volume, where its
//! current contents live and their CRC-32C. Thin: pages of 512 entries are
//! allocated on first write and freed when emptied. Locations are packed in a
//! u64 (`Loc`): unmapped (a hole), zero (allocated, reads zero), a slot of a
//! head's open row (not yet on disk), or a physical block address.

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

struct MapPage {
    locs: [u64; PAGE_ENTRIES],
    crcs: [u32; PAGE_ENTRIES],
    used: u16,
}

/// One volume's map.
#[derive(Default)]
pub struct VolumeMap {
    pages: Vec<Option<Box<MapPage>>>,
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
            Some(page) => (Loc::decode(page.locs[i]), page.crcs[i]),
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
            *slot = Some(Box::new(MapPage {
                locs: [0; PAGE_ENTRIES],
                crcs: [0; PAGE_ENTRIES],
                used: 0,
            }));
        }
        let page = slot.as_mut().expect("page present");
        let old = (Loc::decode(page.locs[i]), page.crcs[i]);
        page.locs[i] = loc.encode();
        page.crcs[i] = crc;
        let (was_mapped, is_mapped) = (old.0 != Loc::Unmapped, loc != Loc::Unmapped);
        match (was_mapped, is_mapped) {
            (false, true) => {
                page.used += 1;
                self.mapped += 1;
            }
            (true, false) => {
                page.used -= 1;
                self.mapped -= 1;
            }
            _ => {}
        }
        self.stored = self.stored + loc.is_stored() as u64 - old.0.is_stored() as u64;
        if page.used == 0 {
            *slot = None;
        }
        old
    }

    pub fn mapped_blocks(&self) -> u64 {
        self.mapped
    }
    pub fn stored_blocks(&self) -> u64 {
        self.stored
    }

    /// Bytes of memory the map uses.
    pub fn memory_bytes(&self) -> u64 {
        let pages = self.pages.iter().filter(|p| p.is_some()).count() as u64;
        pages * std::mem::size_of::<MapPage>() as u64 + self.pages.capacity() as u64 * 8
    }

    /// Mapped entries in LBA order from `start`: (lba, loc, crc).
    pub fn iter_from(&self, start: u64) -> impl Iterator<Item = (u64, Loc, u32)> + '_ {
        let first_page = (start / PAGE_ENTRIES as u64) as usize;
        self.pages
            .iter()
            .enumerate()
            .skip(first_page)
            .filter_map(|(p, page)| page.as_ref().map(|pg| (p, pg)))
            .flat_map(move |(p, page)| {
                (0..PAGE_ENTRIES).filter_map(move |i| {
                    let lba = (p * PAGE_ENTRIES + i) as u64;
                    (page.locs[i] != 0 && lba >= start)
                        .then(|| (lba, Loc::decode(page.locs[i]), page.crcs[i]))
                })
            })
    }
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
        assert_eq!(m.memory_bytes() / 8, m.pages.capacity() as u64);
    }
}
