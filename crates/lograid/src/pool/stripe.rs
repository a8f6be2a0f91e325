//! Rows as stripes: reading a row's columns (whole, or one block of each)
//! and rebuilding what is missing or wrong from parity (a data block
//! checked against its checksum, trying extra erasures while spare parity
//! remains). The one home of these steps: reads, recovery, scrub, rebuild
//! and the cleaner all use them, as do `row_header` (finding a header whose
//! own column is gone or stale) and `row_check` (checking a whole row).
//! Reads only: writing a rebuilt block back is the caller's (the read
//! path's `rewrite_block`, `row_check`, rebuild).

use super::engine::open_device;
use super::Engine;
use crate::device::AlignedBuf;
use crate::error::RepairError;
use crate::error::Result;
use crate::format::row::RowHeader;
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::{Pba, RowGeom};

impl Engine {
    /// One data block of a known row, checked against `crc`: from memory if
    /// its row is still being written, else from its member, else rebuilt
    /// from the rest of the row.
    pub(crate) fn read_data_block(
        &self,
        geom: &RowGeom,
        pba: Pba,
        crc: u32,
    ) -> Result<Vec<u8>, RepairError> {
        if let Some(src) = self.ledger.lock().inflight_block(&self.shape.geometry, pba) {
            return Ok(src.to_vec());
        }
        if let Some(dev) = self.device(pba.member_index()) {
            let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
            if dev.read_at(&mut buf, pba.byte_offset()).is_ok() && crc32c(&buf) == crc {
                return Ok(buf.to_vec());
            }
        }
        let (col, blk) = geom
            .locate(&self.shape.geometry, pba)
            .ok_or(RepairError::OutsideRow)?;
        let stripe = self.read_row_stripe(geom, blk);
        rebuild_from_stripe(geom, stripe, col, |b| crc32c(b) == crc)
    }

    /// The row that holds `pba`, looked up without the ledger lock (the
    /// caller holds `reuse`, or checks what it rebuilds against a checksum).
    pub(crate) fn row_of(&self, pba: Pba) -> Option<RowGeom> {
        let (s, off) = self.shape.geometry.segment_of(pba.block)?;
        self.read_index.row_at(s, off)
    }

    /// Rebuilds the block at `pba` (expected checksum `crc`) from the other
    /// columns of its row. Tries the plain erasure first, then additionally
    /// erases up to P-1 other columns (a second bad column) until the
    /// result matches the checksum.
    pub(crate) fn rebuild_block(&self, pba: Pba, crc: u32) -> Result<Vec<u8>, RepairError> {
        let geom = self.row_of(pba).ok_or(RepairError::NoRow)?;
        let (col, blk) = geom
            .locate(&self.shape.geometry, pba)
            .ok_or(RepairError::OutsideRow)?;
        let columns = self.read_row_stripe(&geom, blk);
        rebuild_from_stripe(&geom, columns, col, |b| crc32c(b) == crc)
    }

    /// Block `blk` of every column of a row (None where unreadable); unused
    /// data columns are zero.
    pub(crate) fn read_row_stripe(&self, geom: &RowGeom, blk: usize) -> Vec<Option<Vec<u8>>> {
        (0..geom.width())
            .map(|c| {
                if !geom.column_used(c) {
                    return Some(vec![0u8; BLOCK_SIZE]);
                }
                let pba = geom.pba(&self.shape.geometry, c, blk);
                let dev = self.device(pba.member_index())?;
                let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
                dev.read_at(&mut buf, pba.byte_offset()).ok()?;
                Some(buf.to_vec())
            })
            .collect()
    }

    /// Rebuilds the leading blocks of `run` (consecutive blocks of one
    /// member) that lie in one row, from the same block range of the
    /// row's other columns: one read per column instead of one per block.
    /// Returns them (how many: the length over `BLOCK_SIZE`), or None if
    /// they could not be. `have(pba, n)`: blocks already read on that
    /// member that overlap those (the first one's block number, and the
    /// bytes).
    pub(crate) fn rebuild_run<'a>(
        &self,
        run: &[(usize, Pba, u32)],
        have: &dyn Fn(Pba, usize) -> Option<(u64, &'a [u8])>,
    ) -> Option<AlignedBuf> {
        let geometry = &self.shape.geometry;
        let geom = self.row_of(run[0].1)?;
        let (col, blk) = geom.locate(geometry, run[0].1)?;
        let n = run
            .iter()
            .enumerate()
            .take_while(|(j, r)| geom.locate(geometry, r.1) == Some((col, blk + j)))
            .count();
        self.rebuild_column_range(&geom, col, blk, n, have)
    }

    /// Blocks `blk..blk+n` of column `col` of a row, rebuilt from the same
    /// range of its other columns (unreadable ones erased too, up to the
    /// parity). Not checked against checksums: the caller does that.
    fn rebuild_column_range<'a>(
        &self,
        geom: &RowGeom,
        col: usize,
        blk: usize,
        n: usize,
        have: &dyn Fn(Pba, usize) -> Option<(u64, &'a [u8])>,
    ) -> Option<AlignedBuf> {
        // Read in this thread, one column after the other: handing the
        // reads to the I/O pool costs more (thread hand-offs on few cores)
        // than it gains, since readers run many at once anyway. The member
        // table is loaded once (a member let go meanwhile closes once this
        // is done), and each column fills a scratch buffer whole.
        let devices = self.devices.load();
        let mut columns: Vec<Option<AlignedBuf>> = (0..geom.width())
            .map(|c| {
                if c == col || !geom.column_used(c) {
                    return None;
                }
                let pba = geom.pba(&self.shape.geometry, c, blk);
                let mut buf = AlignedBuf::scratch(n * BLOCK_SIZE);
                // Blocks `lo..hi` (of `pba.block..pba.block + n`) taken from
                // what was read already; the rest read now.
                let (lo, hi) = match have(pba, n) {
                    Some((first, bytes)) => {
                        let last = first + (bytes.len() / BLOCK_SIZE) as u64;
                        let lo = first.max(pba.block);
                        let hi = last.min(pba.block + n as u64);
                        let from = (lo - first) as usize * BLOCK_SIZE;
                        let to = (lo - pba.block) as usize * BLOCK_SIZE;
                        let len = (hi - lo) as usize * BLOCK_SIZE;
                        buf[to..to + len].copy_from_slice(&bytes[from..from + len]);
                        (lo - pba.block, hi - pba.block)
                    }
                    None => (0, 0), // nothing taken: all read below
                };
                let dev = open_device(&devices, pba.member_index());
                for (a, b) in [(0, lo), (hi, n as u64)] {
                    if a < b {
                        let part = &mut buf[a as usize * BLOCK_SIZE..b as usize * BLOCK_SIZE];
                        dev?.read_at(part, (pba.block + a) * BLOCK_BYTES).ok()?;
                    }
                }
                Some(buf)
            })
            .collect();
        let rebuilt = rebuild_missing_columns(geom, &mut columns, n * BLOCK_SIZE)
            .then(|| columns[col].take())
            .flatten();
        for buf in columns.into_iter().flatten() {
            buf.recycle();
        }
        rebuilt
    }

    /// Every column of a row read whole, those missing or unreadable rebuilt
    /// from parity where it covers them (None where it does not).
    pub(crate) fn read_row_rebuilt(&self, geom: &RowGeom) -> Vec<Option<AlignedBuf>> {
        let mut columns = self.read_row_columns(geom);
        rebuild_missing_columns(geom, &mut columns, geom.height as usize * BLOCK_SIZE);
        columns
    }

    /// The header of the row `geom` names, decoded from the row's whole
    /// columns (`read_row_rebuilt`); None if it does not decode or names
    /// another row (another sequence number or pool).
    pub(crate) fn header_from_columns(
        &self,
        geom: &RowGeom,
        columns: &[Option<AlignedBuf>],
    ) -> Option<RowHeader> {
        let mut bytes = Vec::with_capacity(geom.header_blocks as usize * BLOCK_SIZE);
        for i in 0..geom.header_blocks as usize {
            bytes.extend_from_slice(row_data_block(geom, columns, i)?);
        }
        let (header, _) = RowHeader::decode(&bytes).ok()?;
        (header.seq == geom.seq && header.pool_uuid == self.shape.pool_uuid).then_some(header)
    }

    /// Every written column of a row, read whole and in parallel (None
    /// where unreadable; unused data columns are not read), into buffers
    /// from `column_buffers`: the caller gives them back when done.
    pub(crate) fn read_row_columns(&self, g: &RowGeom) -> Vec<Option<AlignedBuf>> {
        let bytes = g.height as usize * BLOCK_SIZE;
        type Read = (Option<AlignedBuf>, Option<AlignedBuf>);
        let jobs: Vec<crate::device::IoJob<Read>> = (0..g.width())
            .map(|c| {
                let pba = g.pba(&self.shape.geometry, c, 0);
                let dev = self.device(pba.member_index()).filter(|_| g.column_used(c));
                let buf = dev.as_ref().map(|_| self.column_buffers.take(bytes));
                Box::new(move || -> Read {
                    let (Some(dev), Some(mut buf)) = (dev, buf) else {
                        return (None, None);
                    };
                    match dev.read_at(&mut buf, pba.byte_offset()) {
                        Ok(()) => (Some(buf), None),
                        Err(_) => (None, Some(buf)),
                    }
                }) as crate::device::IoJob<Read>
            })
            .collect();
        let (columns, unread): (Vec<_>, Vec<_>) = self.io.run_all(jobs).into_iter().unzip();
        self.column_buffers.give_back(unread);
        columns
    }
}

/// Fills in, in place, the used columns of a row (or of the same block
/// range of each column, `len` bytes) that are None, from the others and
/// the parity. False if more are missing than the parity covers.
pub(crate) fn rebuild_missing_columns(
    geom: &RowGeom,
    columns: &mut [Option<AlignedBuf>],
    len: usize,
) -> bool {
    let erase: Vec<usize> = (0..columns.len())
        .filter(|&c| geom.column_used(c) && columns[c].is_none())
        .collect();
    if erase.is_empty() {
        return true;
    }
    if erase.len() > geom.parity as usize {
        return false;
    }
    // Unused data columns read as zero; erased ones are outputs, written
    // whole by the decoder.
    for (i, c) in columns.iter_mut().enumerate().filter(|(_, c)| c.is_none()) {
        let mut buf = AlignedBuf::scratch(len);
        if !geom.column_used(i) {
            buf.fill(0);
        }
        *c = Some(buf);
    }
    let mut refs: Vec<&mut [u8]> = columns
        .iter_mut()
        .map(|c| &mut c.as_mut().expect("filled above")[..len])
        .collect();
    if lograid_parity::reconstruct(geom.data_capacity_columns(), &mut refs, &erase).is_err() {
        for &c in &erase {
            columns[c] = None;
        }
        return false;
    }
    true
}

/// Reconstructs column `target` of a stripe (one block per column, data
/// columns first, then parity), accepting the first candidate that `check`
/// approves. Unreadable columns are erased; if spare parity remains, other
/// columns are erased too, one combination at a time, to get around a
/// second corrupt column.
pub(crate) fn rebuild_from_stripe(
    geom: &RowGeom,
    columns: Vec<Option<Vec<u8>>>,
    target: usize,
    check: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>, RepairError> {
    let k = geom.data_capacity_columns();
    let p = geom.parity as usize;
    let width = geom.width();
    let mut missing: Vec<usize> = (0..width)
        .filter(|&c| c == target || columns[c].is_none())
        .collect();
    if missing.len() > p {
        return Err(RepairError::TooManyUnreadable {
            unreadable: missing.len(),
            width,
            parity: p,
        });
    }
    missing.sort_unstable();
    let candidates: Vec<usize> = (0..width)
        .filter(|c| !missing.contains(c) && geom.column_used(*c))
        .collect();
    let spare = p - missing.len();
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for extra in 1..=spare {
        sets.extend(combinations(&candidates, extra));
    }
    let base: Vec<Vec<u8>> = columns
        .into_iter()
        .map(|c| c.unwrap_or_else(|| vec![0u8; BLOCK_SIZE]))
        .collect();
    for extra in sets {
        let mut erase = missing.clone();
        erase.extend(extra);
        erase.sort_unstable();
        let mut work = base.clone();
        let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|v| v.as_mut_slice()).collect();
        if lograid_parity::reconstruct(k, &mut refs, &erase).is_ok() && check(&work[target]) {
            return Ok(work.swap_remove(target));
        }
    }
    Err(RepairError::NoMatchingCombination { parity: p })
}

fn combinations(items: &[usize], n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for (i, &x) in items.iter().enumerate() {
        for mut rest in combinations(&items[i + 1..], n - 1) {
            rest.insert(0, x);
            out.push(rest);
        }
    }
    out
}

/// A row found while following a chain.
pub(crate) struct FoundRow {
    pub header: RowHeader,
    pub crc: u32,
    pub geom: RowGeom,
}

/// Data block `i` of a row (its header blocks first, then its slots) from
/// its whole columns: block `i % height` of column `i / height`.
pub(crate) fn row_data_block<'a>(
    geom: &RowGeom,
    columns: &'a [Option<AlignedBuf>],
    i: usize,
) -> Option<&'a [u8]> {
    let height = geom.height as usize;
    let column = columns.get(i / height)?.as_deref()?;
    column.get((i % height) * BLOCK_SIZE..(i % height + 1) * BLOCK_SIZE)
}

#[cfg(test)]
mod tests {
    use crate::format::BLOCK_SIZE;
    use crate::pool::test_pool::sim_pool;
    use std::time::Duration;

    /// Blocks rebuilt from their rows' other columns (their member gone,
    /// and recorded faulted by the first reads) are read while the ledger
    /// lock is held elsewhere: neither the lookup nor the rebuild waits for
    /// it.
    #[test]
    fn a_degraded_read_rebuilds_without_the_ledger_lock() {
        let (pool, vol, sims) = sim_pool();
        let blocks = 48u8;
        let data: Vec<u8> = (0..blocks).flat_map(|i| [i; BLOCK_SIZE]).collect();
        vol.write(0, &data).unwrap();
        vol.flush().unwrap();
        sims[0].set_dead(true);
        // Reads of it fail until it is recorded faulted (which takes the
        // ledger lock, once); then its blocks are rebuilt without reading it.
        let mut buf = vec![0u8; BLOCK_SIZE];
        for i in (0..blocks).cycle().take(10 * usize::from(blocks)) {
            vol.read(u64::from(i) * BLOCK_SIZE as u64, &mut buf)
                .unwrap();
            assert!(buf.iter().all(|&b| b == i), "block {i}");
            if pool.status().members[0].state == "faulted" {
                break;
            }
        }
        assert_eq!(pool.status().members[0].state, "faulted");
        let ledger = pool.engine.ledger.lock();
        let (done, finished) = std::sync::mpsc::channel();
        let reader = {
            let vol = vol.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; BLOCK_SIZE];
                for i in 0..blocks {
                    vol.read(u64::from(i) * BLOCK_SIZE as u64, &mut buf)
                        .unwrap();
                    assert!(buf.iter().all(|&b| b == i), "block {i}");
                }
                done.send(()).unwrap();
            })
        };
        let ended = finished.recv_timeout(Duration::from_secs(20));
        drop(ledger);
        reader.join().unwrap();
        // (Member 0's blocks, about a third, read back right: rebuilt.)
        assert!(
            ended.is_ok(),
            "the degraded reads waited for the ledger lock"
        );
    }
}
