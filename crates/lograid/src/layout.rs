//! Where things are: the pool's geometry (which member holds which segment
//! slice), physical block addresses, and a row's shape (which member holds
//! which column, where parity goes, where each data block lands). Pure
//! arithmetic, no I/O; docs/FORMAT.md, "Data area, segments and rows".

use crate::format::{BLOCK_BYTES, MAX_MEMBERS, TAIL_BLOCKS};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A member's index in the pool: its bit in a members mask, its entry in
/// the engine's device table and in the superblock's member list
/// (0..MAX_MEMBERS). On disk it is a byte (`Pba::member`, row headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberIndex(pub usize);

impl MemberIndex {
    /// Its bit in a members mask.
    pub fn bit(self) -> u32 {
        1 << self.0
    }
    /// The members of `mask`, lowest index first.
    pub fn all_in(mask: u32) -> impl Iterator<Item = MemberIndex> {
        (0..MAX_MEMBERS)
            .filter(move |m| mask & (1 << m) != 0)
            .map(MemberIndex)
    }
}

impl fmt::Display for MemberIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A segment's number in the data area: its entry in the ledger's segment
/// table and its place on each member (`Geometry::segment_base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentIndex(pub u32);

impl SegmentIndex {
    /// Its entry in a table indexed by segment.
    pub fn slot(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SegmentIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A physical block address: member index and absolute block on that member.
/// Encoded in a u64 as `member << 48 | block`; never 0 for a data block
/// because the data area starts after the superblocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pba {
    pub member: u8,
    pub block: u64,
}

impl Pba {
    pub const BLOCK_BITS: u32 = 48;
    pub fn encode(self) -> u64 {
        debug_assert!(self.block < (1 << Self::BLOCK_BITS));
        ((self.member as u64) << Self::BLOCK_BITS) | self.block
    }
    pub fn decode(v: u64) -> Pba {
        Pba {
            member: (v >> Self::BLOCK_BITS) as u8,
            block: v & ((1 << Self::BLOCK_BITS) - 1),
        }
    }
    pub fn byte_offset(self) -> u64 {
        self.block * BLOCK_BYTES
    }
    /// The member holding the block.
    pub fn member_index(self) -> MemberIndex {
        MemberIndex(self.member as usize)
    }
}

/// Sizes of the pool's members, by index, in blocks (0: no member at that
/// index). Shared by every clone of a `Geometry`: a member added to an open
/// pool gets its size here before any segment is laid over it, and sizes
/// never change otherwise.
#[derive(Debug, Clone, Default)]
pub struct MemberSizes(Arc<[AtomicU64; MAX_MEMBERS]>);

impl MemberSizes {
    pub fn new(sizes: &[u64]) -> MemberSizes {
        assert!(
            sizes.len() <= MAX_MEMBERS,
            "more than {MAX_MEMBERS} members"
        );
        let t = MemberSizes::default();
        for (m, &b) in sizes.iter().enumerate() {
            t.set(m, b);
        }
        t
    }
    pub fn get(&self, m: usize) -> u64 {
        self.0.get(m).map_or(0, |a| a.load(Ordering::Acquire))
    }
    pub fn set(&self, m: usize, blocks: u64) {
        self.0[m].store(blocks, Ordering::Release);
    }
}

/// Sizes fixed when the pool is created (members may differ in size; a
/// member added later brings its own).
#[derive(Debug, Clone)]
pub struct Geometry {
    pub member_blocks: MemberSizes,
    pub data_start_block: u64,
    pub segment_blocks: u32,
    pub chunk_blocks: u32,
}

impl Geometry {
    /// Segments the largest member can hold.
    pub fn segment_count(&self) -> u32 {
        (0..MAX_MEMBERS)
            .map(|m| self.member_segments(m))
            .max()
            .unwrap_or(0)
    }
    /// Segments member `m` holds (its data area divided into slices).
    pub fn member_segments(&self, m: usize) -> u32 {
        let end = self.member_blocks.get(m).saturating_sub(TAIL_BLOCKS);
        (end.saturating_sub(self.data_start_block) / self.segment_blocks as u64) as u32
    }
    /// First block of segment `s` on every member that holds it.
    pub fn segment_base(&self, s: u32) -> u64 {
        self.data_start_block + s as u64 * self.segment_blocks as u64
    }
    /// Members (bit mask) that hold segment `s`, among `eligible`.
    pub fn segment_members(&self, s: u32, eligible: u32) -> u32 {
        let mut mask = 0;
        for m in 0..MAX_MEMBERS {
            if eligible & (1 << m) != 0 && s < self.member_segments(m) {
                mask |= 1 << m;
            }
        }
        mask
    }
    /// Segment holding an absolute member block, if in the data area.
    pub fn segment_of(&self, block: u64) -> Option<(u32, u32)> {
        if block < self.data_start_block {
            return None;
        }
        let rel = block - self.data_start_block;
        Some((
            (rel / self.segment_blocks as u64) as u32,
            (rel % self.segment_blocks as u64) as u32,
        ))
    }
}

/// The shape and place of one row. Columns are the segment's members in
/// ascending order rotated by `rotation(offset, width)`; the last `parity` columns
/// hold parity, the first `data_columns` hold data (the first
/// `header_blocks` data blocks are the row header), the rest of the data
/// columns are unused and read as zero. Data block i sits in column
/// `i / height` at block `i % height` (column-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowGeom {
    pub segment: u32,
    pub offset: u32,
    pub height: u16,
    pub data_columns: u8,
    pub header_blocks: u16,
    pub slots: u32,
    pub members_mask: u32,
    pub parity: u8,
    pub seq: u64,
}

impl RowGeom {
    /// The segment the row lies in.
    pub fn segment_index(&self) -> SegmentIndex {
        SegmentIndex(self.segment)
    }
    pub fn width(&self) -> usize {
        self.members_mask.count_ones() as usize
    }
    /// Data columns the segment offers (width minus parity).
    pub fn data_capacity_columns(&self) -> usize {
        self.width() - self.parity as usize
    }
    /// Member holding column `col` (0..width).
    pub fn column_member(&self, col: usize) -> u8 {
        let w = self.width();
        let rot = rotation(self.offset, w);
        nth_member(self.members_mask, (rot + col) % w)
    }
    /// Column index of member `m` in this row, if it holds one.
    pub fn member_column(&self, m: u8) -> Option<usize> {
        if self.members_mask & (1 << m) == 0 {
            return None;
        }
        let w = self.width();
        let rank = (self.members_mask & ((1u32 << m) - 1)).count_ones() as usize;
        let rot = rotation(self.offset, w);
        Some((rank + w - rot) % w)
    }
    /// Whether column `col` is written: a data column in use or a parity
    /// column (the unused data columns of a short row read as zero).
    pub fn column_used(&self, col: usize) -> bool {
        col < self.data_columns as usize || col >= self.data_capacity_columns()
    }
    /// Column of parity `p` (0..parity).
    pub fn parity_column(&self, p: usize) -> usize {
        self.data_capacity_columns() + p
    }
    /// Absolute member block where column `col`, block `blk` of this row lives.
    pub fn pba(&self, geometry: &Geometry, col: usize, blk: usize) -> Pba {
        Pba {
            member: self.column_member(col),
            block: geometry.segment_base(self.segment) + self.offset as u64 + blk as u64,
        }
    }
    /// Where data block `i` (header blocks first) lives.
    pub fn data_block_pba(&self, geometry: &Geometry, i: u32) -> Pba {
        let h = self.height as u32;
        self.pba(geometry, (i / h) as usize, (i % h) as usize)
    }
    pub fn slot_pba(&self, geometry: &Geometry, slot: u32) -> Pba {
        self.data_block_pba(geometry, self.header_blocks as u32 + slot)
    }
    /// (column, block in column) of `pba` if it is inside this row.
    pub fn locate(&self, geometry: &Geometry, pba: Pba) -> Option<(usize, usize)> {
        let base = geometry.segment_base(self.segment) + self.offset as u64;
        if pba.block < base || pba.block >= base + self.height as u64 {
            return None;
        }
        let col = self.member_column(pba.member)?;
        Some((col, (pba.block - base) as usize))
    }
    /// The data slot `pba` holds in this row, if it is one (not a header
    /// block, a parity block, an unused column or outside the row).
    pub fn slot_of(&self, geometry: &Geometry, pba: Pba) -> Option<u32> {
        let (col, blk) = self.locate(geometry, pba)?;
        if col >= self.data_columns as usize {
            return None;
        }
        let i = (col * self.height as usize + blk) as u32;
        let slot = i.checked_sub(self.header_blocks as u32)?;
        (slot < self.slots).then_some(slot)
    }
    /// Data blocks in use (header plus slots).
    pub fn used_data_blocks(&self) -> u32 {
        self.header_blocks as u32 + self.slots
    }
    /// Member blocks this row occupies when written (data columns used plus parity).
    pub fn written_blocks(&self) -> u64 {
        (self.data_columns as u64 + self.parity as u64) * self.height as u64
    }
}

/// How far a row's columns are rotated: a multiplicative hash of its block
/// offset, so that parity moves from member to member for every pattern of
/// row offsets (full rows sit at multiples of the chunk height, which a plain
/// `offset % width` would map to one rotation whenever width divides it).
pub fn rotation(offset: u32, width: usize) -> usize {
    (((offset as u64).wrapping_mul(0x9E37_79B1) >> 16) % width as u64) as usize
}

/// The member index of the `n`-th set bit of `mask`.
pub fn nth_member(mask: u32, n: usize) -> u8 {
    let mut m = mask;
    for _ in 0..n {
        m &= m - 1;
    }
    m.trailing_zeros() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_rotate_and_invert() {
        let g = Geometry {
            member_blocks: MemberSizes::new(&[10_000; 5]),
            data_start_block: 256,
            segment_blocks: 64,
            chunk_blocks: 16,
        };
        for offset in 0..20 {
            let row = RowGeom {
                segment: 3,
                offset,
                height: 4,
                data_columns: 3,
                header_blocks: 1,
                slots: 10,
                members_mask: 0b11011,
                parity: 1,
                seq: 1,
            };
            let mut seen = 0u32;
            for col in 0..row.width() {
                let m = row.column_member(col);
                assert_eq!(row.member_column(m), Some(col));
                seen |= 1 << m;
                let pba = row.pba(&g, col, 2);
                assert_eq!(row.locate(&g, pba), Some((col, 2)));
            }
            assert_eq!(seen, 0b11011);
        }
    }

    #[test]
    fn pba_round_trips() {
        let p = Pba {
            member: 23,
            block: (1 << 47) + 5,
        };
        assert_eq!(Pba::decode(p.encode()), p);
    }
}
