//! Finding and verifying a row header at a known place in a segment, even
//! when its own column is missing, corrupt or stale: the header's first
//! block is read as it is, and failing that rebuilt from the rest of its
//! stripe for each possible count of data columns; its later blocks are
//! read, or rebuilt where unreadable or where the whole does not verify.
//! A member that lost the write of a header (or whose failed flush dropped
//! it) may still hold the valid header of the row at the same place in the
//! segment's previous use: taken as it reads, it would end the log there,
//! so every candidate must pass the caller's `accept` too.

use super::stripe::{rebuild_from_stripe, FoundRow};
use super::Engine;
use crate::device::AlignedBuf;
use crate::format::row::{PeekedGeometry, RowHeader};
use crate::format::BLOCK_SIZE;
use crate::layout::RowGeom;
use std::cell::RefCell;

/// Where a header is looked for and what it must say about itself.
struct HeaderSearch<'a> {
    engine: &'a Engine,
    segment: u32,
    offset: u32,
    members_mask: u32,
    parity: u8,
}

impl Engine {
    /// Finds and verifies the row header at (segment, offset) of a segment
    /// laid over `mask` with `parity` parity columns that `accept` takes
    /// (see the module comment for the fallbacks).
    pub(crate) fn load_row_header(
        &self,
        segment: u32,
        offset: u32,
        mask: u32,
        parity: u8,
        accept: &dyn Fn(&FoundRow) -> bool,
    ) -> Option<FoundRow> {
        let geometry = &self.shape.geometry;
        if segment >= geometry.segment_count()
            || offset >= geometry.segment_blocks
            || mask.count_ones() <= parity as u32
        {
            return None;
        }
        let search = HeaderSearch {
            engine: self,
            segment,
            offset,
            members_mask: mask,
            parity,
        };
        let as_read = search
            .read_block(&search.probe(1), 0)
            .and_then(|first| search.verify(first, None))
            .filter(accept);
        if as_read.is_some() {
            return as_read;
        }
        (1..=search.data_capacity()).find_map(|d| search.rebuild_first_block(d, accept))
    }

    /// A known row with its verified header.
    pub(crate) fn load_known_row(&self, geom: &RowGeom) -> Option<FoundRow> {
        self.load_row_header(
            geom.segment,
            geom.offset,
            geom.members_mask,
            geom.parity,
            &|f| f.header.seq == geom.seq,
        )
    }
}

impl HeaderSearch<'_> {
    /// Data columns the segment offers.
    fn data_capacity(&self) -> u8 {
        self.members_mask.count_ones() as u8 - self.parity
    }

    /// A one-block row at the searched place with `data_columns` columns:
    /// enough to locate the header's first block and its stripe.
    fn probe(&self, data_columns: u8) -> RowGeom {
        RowGeom {
            segment: self.segment,
            offset: self.offset,
            height: 1,
            data_columns,
            header_blocks: 1,
            slots: 0,
            members_mask: self.members_mask,
            parity: self.parity,
            seq: 0,
        }
    }

    /// Data block `i` of the row `geom`, as its member returns it.
    fn read_block(&self, geom: &RowGeom, i: u32) -> Option<Vec<u8>> {
        let pba = geom.data_block_pba(&self.engine.shape.geometry, i);
        let dev = self.engine.device(pba.member_index())?;
        let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
        dev.read_at(&mut buf, pba.byte_offset()).ok()?;
        Some(buf.to_vec())
    }

    /// Data block `i` of the row `geom`, rebuilt from its stripe.
    fn rebuilt_block(&self, geom: &RowGeom, i: u32) -> Option<Vec<u8>> {
        let geometry = &self.engine.shape.geometry;
        let pba = geom.data_block_pba(geometry, i);
        let (col, blk) = geom.locate(geometry, pba)?;
        let stripe = self.engine.read_row_stripe(geom, blk);
        rebuild_from_stripe(geom, stripe, col, |_| true).ok()
    }

    /// Whether a header's first block places it here, and (when it was
    /// rebuilt assuming `rebuilt_with` data columns) says so itself.
    fn is_placed_here(&self, peek: &PeekedGeometry, rebuilt_with: Option<u8>) -> bool {
        peek.segment == self.segment
            && peek.offset_blocks == self.offset
            && peek.members_mask == self.members_mask
            && peek.parity == self.parity
            && rebuilt_with.is_none_or(|d| d == peek.data_columns)
            && peek.data_columns <= self.data_capacity()
    }

    /// The whole header from its first block: the later blocks as read
    /// (rebuilt where unreadable), then, if the whole does not verify, all
    /// rebuilt from their stripes (a later block rotted while staying
    /// readable). Checked against the pool and the first block's height.
    fn verify(&self, first: Vec<u8>, rebuilt_with: Option<u8>) -> Option<FoundRow> {
        let peek = RowHeader::peek_geometry(&first).ok()?;
        if !self.is_placed_here(&peek, rebuilt_with) {
            return None;
        }
        let geom = RowGeom {
            height: peek.height,
            data_columns: peek.data_columns,
            header_blocks: peek.header_blocks,
            ..self.probe(peek.data_columns)
        };
        let (header, crc) = self.assemble(&first, &geom, false).or_else(|| {
            (geom.header_blocks > 1)
                .then(|| self.assemble(&first, &geom, true))
                .flatten()
        })?;
        if header.pool_uuid != self.engine.shape.pool_uuid || header.height != peek.height {
            return None;
        }
        let geom = RowGeom {
            slots: header.slots,
            seq: header.seq,
            ..geom
        };
        Some(FoundRow { header, crc, geom })
    }

    /// The header's blocks after `first` appended and decoded: read, or
    /// with `rebuild_all` every one rebuilt from its stripe.
    fn assemble(
        &self,
        first: &[u8],
        geom: &RowGeom,
        rebuild_all: bool,
    ) -> Option<(RowHeader, u32)> {
        let mut bytes = first.to_vec();
        for i in 1..geom.header_blocks as u32 {
            let block = match (rebuild_all, self.read_block(geom, i)) {
                (false, Some(b)) => b,
                _ => self.rebuilt_block(geom, i)?,
            };
            bytes.extend_from_slice(&block);
        }
        RowHeader::decode(&bytes).ok()
    }

    /// The header's first block rebuilt from its stripe assuming `d` data
    /// columns. Every erasure combination is tried until one yields a
    /// header whose checksum verifies and that `accept` takes (a peek
    /// alone can be fooled).
    fn rebuild_first_block(&self, d: u8, accept: &dyn Fn(&FoundRow) -> bool) -> Option<FoundRow> {
        let geom = self.probe(d);
        let stripe = self.engine.read_row_stripe(&geom, 0);
        let found = RefCell::new(None);
        let _ = rebuild_from_stripe(&geom, stripe, 0, |b| {
            let plausible = RowHeader::peek_geometry(b).is_ok_and(|p| {
                p.segment == self.segment && p.offset_blocks == self.offset && p.data_columns == d
            });
            if !plausible {
                return false;
            }
            let f = self.verify(b.to_vec(), Some(d)).filter(accept);
            let ok = f.is_some();
            *found.borrow_mut() = f;
            ok
        });
        found.into_inner()
    }
}
