//! Checking a whole row: every data block against its row header (the
//! header's own bytes, each slot's checksum, zeros past the last slot) and
//! every parity block against the data; what is wrong is rebuilt from the
//! rest of its stripe and, when asked, written back in place (a block
//! restored to what its parity already covers). Used by scrub, by rebuild
//! (rows being rebuilt in place) and by recovery (the log's last rows).

use super::stripe::{rebuild_from_stripe, FoundRow};
use super::Engine;
use crate::device::AlignedBuf;
use crate::format::{crc32c, zero_block_crc, BLOCK_SIZE};
use crate::layout::RowGeom;
use std::sync::atomic::Ordering;

/// What checking a whole row found (`check_row`).
#[derive(Debug, Default)]
pub(crate) struct RowCheck {
    /// Positions whose member could not be read (rebuilt, and written
    /// back if asked, but not bad blocks: the member's fault handling
    /// counts them).
    pub unreadable: Vec<Position>,
    /// Data positions (column, block) that could not be rebuilt.
    pub unrepairable: Vec<Position>,
    /// Positions (column, block; data, header or parity) that were read
    /// but wrong, and were rewritten (or would have been).
    pub wrong: Vec<Position>,
}

/// A block to write back: its column, and what it must hold.
type Repair = (usize, Vec<u8>);

/// A data position (column, block) in a row.
type Position = (usize, usize);

static ZERO_BLOCK: [u8; BLOCK_SIZE] = [0u8; BLOCK_SIZE];

/// What each data block of a row must hold, from its verified header.
struct Expected {
    geom: RowGeom,
    header_bytes: Vec<u8>,
    slot_crcs: Vec<u32>,
    zero_crc: u32,
}

impl Expected {
    fn new(row: &FoundRow) -> Self {
        let (header_bytes, _) = row.header.encode();
        let slot_crcs = row
            .header
            .entries
            .iter()
            .filter(|e| e.kind.owns_slot())
            .map(|e| e.crc)
            .collect();
        Expected {
            geom: row.geom,
            header_bytes,
            slot_crcs,
            zero_crc: zero_block_crc(),
        }
    }

    /// Whether `bytes` is what data column `col` holds at block `blk`.
    fn holds(&self, col: usize, blk: usize, bytes: &[u8]) -> bool {
        let i = col * self.geom.height as usize + blk;
        let header_blocks = self.geom.header_blocks as usize;
        if i < header_blocks {
            return self.header_bytes.get(i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE) == Some(bytes);
        }
        let want = self
            .slot_crcs
            .get(i - header_blocks)
            .copied()
            .unwrap_or(self.zero_crc);
        crc32c(bytes) == want
    }
}

/// Block `blk` of each column of a row read whole (`read_row_columns`).
struct Stripe<'a> {
    geom: &'a RowGeom,
    columns: &'a [Option<AlignedBuf>],
    blk: usize,
}

impl Stripe<'_> {
    /// Column `c`'s block as read (zeros for an unused data column).
    fn block(&self, c: usize) -> Option<&[u8]> {
        if !self.geom.column_used(c) {
            return Some(&ZERO_BLOCK[..]);
        }
        let range = self.blk * BLOCK_SIZE..(self.blk + 1) * BLOCK_SIZE;
        self.columns.get(c)?.as_deref()?.get(range)
    }

    /// Each column's block as read, owned (None where unreadable).
    fn owned(&self) -> Vec<Option<Vec<u8>>> {
        (0..self.geom.width())
            .map(|c| self.block(c).map(<[u8]>::to_vec))
            .collect()
    }

    /// The blocks of this stripe that are wrong, with what they should
    /// hold; Err: the data positions parity cannot restore. `parity`: one
    /// block per parity column, reused from stripe to stripe.
    fn repairs(
        &self,
        expected: &Expected,
        parity: &mut [Vec<u8>],
    ) -> Result<Vec<Repair>, Vec<Position>> {
        let mut repairs = self.rebuild_bad_data(expected)?;
        self.parity_into(&repairs, parity);
        let k = self.geom.data_capacity_columns();
        for (j, par) in parity.iter().enumerate() {
            if self.block(k + j) != Some(par.as_slice()) {
                repairs.push((k + j, par.clone()));
            }
        }
        Ok(repairs)
    }

    /// Data blocks that are unreadable or not what the header says,
    /// rebuilt with the others erased, accepting only results that are.
    fn rebuild_bad_data(&self, expected: &Expected) -> Result<Vec<Repair>, Vec<Position>> {
        let blk = self.blk;
        let bad: Vec<usize> = (0..self.geom.data_columns as usize)
            .filter(|&c| self.block(c).is_none_or(|b| !expected.holds(c, blk, b)))
            .collect();
        if bad.is_empty() {
            return Ok(Vec::new());
        }
        if bad.len() > self.geom.parity as usize {
            return Err(bad.iter().map(|&c| (c, blk)).collect());
        }
        let mut erased = self.owned();
        for &c in &bad {
            erased[c] = None;
        }
        let mut rebuilt = Vec::new();
        let mut lost = Vec::new();
        for &c in &bad {
            match rebuild_from_stripe(self.geom, erased.clone(), c, |b| expected.holds(c, blk, b)) {
                Ok(b) => rebuilt.push((c, b)),
                Err(_) => lost.push((c, blk)),
            }
        }
        if lost.is_empty() {
            Ok(rebuilt)
        } else {
            Err(lost)
        }
    }

    /// Encodes into `parity` the parity blocks the data (as read,
    /// `rebuilt` where it was wrong) must have.
    fn parity_into(&self, rebuilt: &[(usize, Vec<u8>)], parity: &mut [Vec<u8>]) {
        if parity.is_empty() {
            return;
        }
        let data: Vec<&[u8]> = (0..self.geom.data_capacity_columns())
            .map(|c| match rebuilt.iter().find(|(rc, _)| *rc == c) {
                Some((_, b)) => b.as_slice(),
                None => self.block(c).unwrap_or(&ZERO_BLOCK[..]),
            })
            .collect();
        let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
        lograid_parity::encode(&data, &mut out);
    }
}

impl Engine {
    /// Reads a whole row and checks it (see the module comment); with
    /// `repair`, writes back what it rebuilt. Stripes with more bad data
    /// blocks than parity are reported and left as they are.
    pub(crate) fn check_row(&self, row: &FoundRow, repair: bool) -> RowCheck {
        let mut report = RowCheck::default();
        let expected = Expected::new(row);
        let columns = self.read_row_columns(&row.geom);
        let mut parity = vec![vec![0u8; BLOCK_SIZE]; row.geom.parity as usize];
        for blk in 0..row.geom.height as usize {
            let stripe = Stripe {
                geom: &row.geom,
                columns: &columns,
                blk,
            };
            match stripe.repairs(&expected, &mut parity) {
                Err(lost) => report.unrepairable.extend(lost),
                Ok(repairs) => {
                    for (c, _) in &repairs {
                        match stripe.block(*c) {
                            None => report.unreadable.push((*c, blk)),
                            Some(_) => report.wrong.push((*c, blk)),
                        }
                    }
                    if repair {
                        self.write_repairs(&row.geom, blk, repairs);
                    }
                }
            }
        }
        self.column_buffers.give_back(columns);
        report
    }

    /// Writes rebuilt blocks of stripe `blk` back to their members; a
    /// failed write is left for the member's fault handling.
    fn write_repairs(&self, geom: &RowGeom, blk: usize, repairs: Vec<(usize, Vec<u8>)>) {
        for (c, bytes) in repairs {
            let pba = geom.pba(&self.shape.geometry, c, blk);
            let Some(dev) = self.device(pba.member_index()) else {
                continue;
            };
            let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
            buf.copy_from_slice(&bytes);
            if dev.write_at(&buf, pba.byte_offset()).is_ok() {
                dev.counters.repaired_blocks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
