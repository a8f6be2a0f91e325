//! Test support for corruption tests: finds where things live on simulated
//! members by reading their images the way the format says (superblock, row
//! headers at segment offsets), and flips bits there.
//!
//! It relies only on the public format and layout API, never on the pool's
//! in-memory state, so what it finds is what is really on the members.
#![allow(dead_code)]

use lograid::device::{Member, SimMember};
use lograid::format::row::{EntryKind, RowHeader, RowKind};
use lograid::format::superblock::Superblock;
use lograid::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use lograid::layout::{Geometry, Pba, RowGeom};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A row header found on the members, with the row's geometry.
#[derive(Debug, Clone)]
pub struct DiskRow {
    pub header: RowHeader,
    pub crc: u32,
    pub geom: RowGeom,
}

impl DiskRow {
    /// Columns that hold bytes on a member: the used data columns, then parity.
    pub fn used_columns(&self) -> Vec<usize> {
        let k = self.geom.data_capacity_columns();
        (0..self.geom.data_columns as usize)
            .chain(k..self.geom.width())
            .collect()
    }
    pub fn parity_columns(&self) -> Vec<usize> {
        let k = self.geom.data_capacity_columns();
        (k..self.geom.width()).collect()
    }
    /// Where block `blk` of column `col` lives.
    pub fn pba(&self, geometry: &Geometry, col: usize, blk: usize) -> Pba {
        self.geom.pba(geometry, col, blk)
    }
    /// Where header block `i` lives.
    pub fn header_pba(&self, geometry: &Geometry, i: u32) -> Pba {
        self.geom.data_block_pba(geometry, i)
    }
}

/// Where the current contents of one volume block live.
#[derive(Debug, Clone)]
pub struct LiveBlock {
    pub lba: u64,
    pub pba: Pba,
    pub crc: u32,
    pub seq: u64,
    /// Index into `DiskView::rows`.
    pub row: usize,
}

/// A read-only picture of a pool's members, indexed by member number.
pub struct DiskView {
    pub superblock: Superblock,
    pub geometry: Geometry,
    pub images: Vec<Vec<u8>>,
    pub rows: Vec<DiskRow>,
}

impl DiskView {
    /// Reads the members' images (the `sims` in any order; the superblock
    /// tells each one's index).
    pub fn capture(sims: &[Arc<SimMember>]) -> DiskView {
        let mut by_index: Vec<Option<Vec<u8>>> = Vec::new();
        let mut newest: Option<Superblock> = None;
        for s in sims {
            let sb = lograid::read_superblock(s.as_ref() as &dyn Member)
                .expect("member has a superblock");
            let i = sb.member_index as usize;
            if by_index.len() <= i {
                by_index.resize(i + 1, None);
            }
            by_index[i] = Some(s.snapshot());
            if newest.as_ref().is_none_or(|n| sb.generation > n.generation) {
                newest = Some(sb);
            }
        }
        let superblock = newest.expect("at least one member");
        let images: Vec<Vec<u8>> = by_index
            .into_iter()
            .map(|i| i.unwrap_or_default())
            .collect();
        let geometry = Geometry {
            member_blocks: lograid::layout::MemberSizes::new(
                &superblock
                    .members
                    .iter()
                    .map(|m| m.size_blocks)
                    .collect::<Vec<_>>(),
            ),
            data_start_block: superblock.data_start_block,
            segment_blocks: superblock.segment_blocks,
            chunk_blocks: superblock.chunk_blocks,
        };
        let mut view = DiskView {
            superblock,
            geometry,
            images,
            rows: Vec::new(),
        };
        view.rows = view.scan_rows();
        view
    }

    /// The block at `pba` (zeroes for a member we have no image of).
    pub fn block(&self, pba: Pba) -> &[u8] {
        static ZERO: [u8; BLOCK_SIZE] = [0u8; BLOCK_SIZE];
        let img = &self.images[pba.member as usize];
        if img.is_empty() {
            return &ZERO;
        }
        let at = pba.byte_offset() as usize;
        &img[at..at + BLOCK_SIZE]
    }

    /// Every row header that decodes at its own (segment, offset) on the
    /// member holding its column 0, for this pool. Rows of earlier
    /// incarnations of a segment are included (they have lower sequence
    /// numbers).
    fn scan_rows(&self) -> Vec<DiskRow> {
        let g = &self.geometry;
        let mut rows = Vec::new();
        for s in 0..g.segment_count() {
            let base = g.segment_base(s);
            for off in 0..g.segment_blocks {
                for m in 0..self.images.len() {
                    if self.images[m].is_empty() {
                        continue;
                    }
                    let first = self.block(Pba {
                        member: m as u8,
                        block: base + off as u64,
                    });
                    let Ok(peek) = RowHeader::peek_geometry(first) else {
                        continue;
                    };
                    if peek.segment != s || peek.offset_blocks != off || peek.members_mask == 0 {
                        continue;
                    }
                    if peek.width as u32 != peek.members_mask.count_ones()
                        || peek.parity as usize >= peek.width as usize
                        || peek.data_columns as usize + peek.parity as usize > peek.width as usize
                    {
                        continue;
                    }
                    let geom = RowGeom {
                        segment: s,
                        offset: off,
                        height: peek.height,
                        data_columns: peek.data_columns,
                        header_blocks: peek.header_blocks,
                        slots: 0,
                        members_mask: peek.members_mask,
                        parity: peek.parity,
                        seq: 0,
                    };
                    if geom.column_member(0) != m as u8 {
                        continue;
                    }
                    let mut bytes = Vec::with_capacity(peek.header_blocks as usize * BLOCK_SIZE);
                    for i in 0..peek.header_blocks as u32 {
                        bytes.extend_from_slice(self.block(geom.data_block_pba(g, i)));
                    }
                    let Ok((header, crc)) = RowHeader::decode(&bytes) else {
                        continue;
                    };
                    if header.pool_uuid != self.superblock.pool_uuid {
                        continue;
                    }
                    let geom = RowGeom {
                        slots: header.slots,
                        seq: header.seq,
                        ..geom
                    };
                    rows.push(DiskRow { header, crc, geom });
                }
            }
        }
        rows
    }

    /// Data rows only.
    pub fn data_rows(&self) -> impl Iterator<Item = (usize, &DiskRow)> {
        self.rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.header.kind == RowKind::Data)
    }

    /// For each LBA of `volume`, the newest record of it in the log: where
    /// its block lives and its checksum (trimmed or zeroed blocks are left
    /// out).
    pub fn live_blocks(&self, volume: u32) -> BTreeMap<u64, LiveBlock> {
        let mut newest: BTreeMap<u64, (u64, Option<LiveBlock>)> = BTreeMap::new();
        for (ri, row) in self.data_rows() {
            let mut slot = 0u32;
            for e in &row.header.entries {
                let owns = e.kind.owns_slot();
                let this_slot = slot;
                if owns {
                    slot += 1;
                }
                if e.volume != volume {
                    continue;
                }
                let seq = row.header.seq;
                match e.kind {
                    EntryKind::Data | EntryKind::Relocated => {
                        let pba = row.geom.slot_pba(&self.geometry, this_slot);
                        let live = LiveBlock {
                            lba: e.lba,
                            pba,
                            crc: e.crc,
                            seq,
                            row: ri,
                        };
                        let cur = newest.entry(e.lba).or_insert((0, None));
                        if seq >= cur.0 {
                            *cur = (seq, Some(live));
                        }
                    }
                    EntryKind::Trim | EntryKind::Zero => {
                        for lba in e.lba..e.lba + e.count as u64 {
                            let cur = newest.entry(lba).or_insert((0, None));
                            if seq >= cur.0 {
                                *cur = (seq, None);
                            }
                        }
                    }
                    EntryKind::Payload => {}
                }
            }
        }
        newest
            .into_iter()
            .filter_map(|(lba, (_, l))| l.map(|l| (lba, l)))
            .collect()
    }

    /// The rows of the checkpoint the superblock points at, in chain order.
    pub fn checkpoint_rows(&self) -> Vec<usize> {
        let ptr = self.superblock.checkpoint;
        let mut out: Vec<usize> = self
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.header.kind == RowKind::Checkpoint && r.header.checkpoint_id == ptr.checkpoint_id
            })
            .map(|(i, _)| i)
            .collect();
        out.sort_by_key(|&i| self.rows[i].header.checkpoint_offset);
        out
    }
}

/// Flips bits of `len` bytes at `within` inside the block at `pba`.
pub fn corrupt_bytes(sims: &[Arc<SimMember>], pba: Pba, within: usize, len: usize) {
    assert!(within + len <= BLOCK_SIZE);
    sims[pba.member as usize].corrupt(pba.byte_offset() + within as u64, len);
}

/// Flips bits of the whole block at `pba`.
pub fn corrupt_block(sims: &[Arc<SimMember>], pba: Pba) {
    corrupt_bytes(sims, pba, 0, BLOCK_SIZE);
}

/// The bytes of the block at `pba` as the member holds them now.
pub fn member_block(sims: &[Arc<SimMember>], pba: Pba) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK_SIZE];
    sims[pba.member as usize]
        .read_at(&mut buf, pba.block * BLOCK_BYTES)
        .expect("read member");
    buf
}

pub fn block_crc(bytes: &[u8]) -> u32 {
    crc32c(bytes)
}
