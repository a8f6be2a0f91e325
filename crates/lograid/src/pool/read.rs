//! The read path: a volume's blocks looked up in its map, read from the
//! members (consecutive blocks of one member in one read), every block
//! checked against its checksum, and a bad or unreadable one rebuilt from
//! the rest of its row (`stripe`), returned and rewritten. Blocks still in
//! memory (open rows, rows in flight) are copied from there. Never returns
//! bytes it could not verify.

use super::ledger::Ledger;
use super::Engine;
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::Pba;
use crate::map::Loc;
use std::sync::atomic::Ordering;

impl Engine {
    /// Reads whole blocks from `lba` into `out`, verifying every checksum,
    /// with their overlays applied.
    pub(crate) fn read_blocks(&self, id: u32, name: &str, lba: u64, out: &mut [u8]) -> Result<()> {
        let (n, bytes) = ((out.len() / BLOCK_SIZE) as u64, out.len() as u64);
        let overlays = self.read_base(id, name, lba, out, |ledger| {
            ledger.counters.user_bytes_read += bytes;
            ledger.overlays.copies(id, lba, n)
        })?;
        for (i, o) in overlays {
            o.apply(&mut out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
        }
        Ok(())
    }

    /// Reads whole blocks from `lba` into `out` as stored (no overlays),
    /// verifying every checksum. `snapshot` runs under the lock section of
    /// the map lookup; its result is returned.
    pub(crate) fn read_base<T>(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        out: &mut [u8],
        snapshot: impl FnOnce(&mut Ledger) -> T,
    ) -> Result<T> {
        let _guard = self.reuse.read();
        let mut plan: Vec<(usize, Pba, u32)> = Vec::new();
        let snap = {
            let mut ledger = self.ledger.lock();
            let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
            for (i, block) in out.chunks_exact_mut(BLOCK_SIZE).enumerate() {
                let (loc, crc) = vol.map.get(lba + i as u64);
                match loc {
                    Loc::Unmapped | Loc::Zero => block.fill(0),
                    Loc::Open { head, slot } => {
                        let row = ledger.heads[head.index()]
                            .open
                            .as_ref()
                            .expect("map points into an open row");
                        block.copy_from_slice(row.slot_bytes(slot));
                    }
                    Loc::Disk(pba) => match ledger.inflight_block(&self.shape.geometry, pba) {
                        Some(src) => block.copy_from_slice(src),
                        None => plan.push((i, pba, crc)),
                    },
                }
            }
            snapshot(&mut ledger)
        };
        // Coalesce runs of consecutive blocks on one member into one read.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut start = 0;
        while start < plan.len() {
            let mut end = start + 1;
            while end < plan.len()
                && plan[end].1.member == plan[start].1.member
                && plan[end].1.block == plan[start].1.block + (end - start) as u64
                && plan[end].0 == plan[start].0 + (end - start)
                && end - start < 256
            {
                end += 1;
            }
            runs.push((start, end));
            start = end;
        }
        // Each run is read and settled at once (a healthy read holds one
        // run's buffer at a time). The runs of a member that is gone or
        // failing are rebuilt after, a row at a time, from the same range of
        // the other columns, taking what the other runs put in `out` where
        // they cover it (a sequential degraded read reads each surviving
        // column once).
        let mut read_ok = vec![false; runs.len()];
        for (r, &(s, e)) in runs.iter().enumerate() {
            let mut buf = AlignedBuf::zeroed((e - s) * BLOCK_SIZE);
            let first = plan[s].1;
            read_ok[r] = self
                .device(first.member as usize)
                .is_some_and(|dev| dev.read_at(&mut buf, first.byte_offset()).is_ok());
            if read_ok[r] {
                self.settle_run(name, lba, &plan[s..e], &buf, true, &[], out)?;
            }
        }
        if read_ok.iter().any(|ok| !ok) {
            self.check_read_health();
        }
        for (r, &(s, e)) in runs.iter().enumerate() {
            if read_ok[r] {
                continue;
            }
            let mut buf = AlignedBuf::zeroed((e - s) * BLOCK_SIZE);
            let mut rebuilt = vec![false; e - s];
            {
                let done: &[u8] = out;
                // A run read from the same member that overlaps the range
                // (its blocks are in `out`, checked).
                let have = |pba: Pba, n: usize| -> Option<(u64, &[u8])> {
                    runs.iter().zip(&read_ok).find_map(|(&(s2, e2), ok)| {
                        let f = plan[s2].1;
                        (*ok && f.member == pba.member
                            && f.block < pba.block + n as u64
                            && pba.block < f.block + (e2 - s2) as u64)
                            .then(|| {
                                let at = plan[s2].0 * BLOCK_SIZE;
                                (f.block, &done[at..at + (e2 - s2) * BLOCK_SIZE])
                            })
                    })
                };
                let run = &plan[s..e];
                let mut j = 0;
                while j < run.len() {
                    let n = self.rebuild_run(&run[j..], &mut buf[j * BLOCK_SIZE..], &have);
                    rebuilt[j..j + n.max(1)].fill(n > 0);
                    j += n.max(1);
                }
            }
            self.settle_run(name, lba, &plan[s..e], &buf, false, &rebuilt, out)?;
        }
        Ok(snap)
    }

    /// Checks the blocks of a run (`buf`: as read, or as rebuilt where
    /// `rebuilt` says) against their checksums and puts them in `out`; a
    /// block that does not check out is rebuilt from its stripe (and
    /// rewritten), or the read fails.
    #[allow(clippy::too_many_arguments)]
    fn settle_run(
        &self,
        name: &str,
        lba: u64,
        run: &[(usize, Pba, u32)],
        buf: &[u8],
        read_ok: bool,
        rebuilt: &[bool],
        out: &mut [u8],
    ) -> Result<()> {
        for (j, &(i, pba, crc)) in run.iter().enumerate() {
            let got = &buf[j * BLOCK_SIZE..(j + 1) * BLOCK_SIZE];
            let dest = &mut out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            if (read_ok || rebuilt[j]) && crc32c(got) == crc {
                dest.copy_from_slice(got);
                continue;
            }
            if read_ok {
                if let Some(dev) = self.device(pba.member as usize) {
                    dev.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let fixed = self
                .rebuild_block(pba, crc)
                .map_err(|cause| Error::Unrecoverable {
                    volume: name.to_string(),
                    offset: (lba + i as u64) * BLOCK_BYTES,
                    cause,
                })?;
            dest.copy_from_slice(&fixed);
            self.rewrite_block(pba, &fixed);
        }
        Ok(())
    }

    /// Writes a repaired block back where it belongs (its row's parity is
    /// unchanged, since the block is restored to what the parity covers).
    fn rewrite_block(&self, pba: Pba, block: &[u8]) {
        let Some(dev) = self.device(pba.member as usize) else {
            return;
        };
        if self.ledger.lock().read_only_reason.is_some() {
            return;
        }
        let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
        buf.copy_from_slice(block);
        if dev.write_at(&buf, pba.byte_offset()).is_ok() {
            dev.counters.repaired_blocks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs of (length in bytes, allocation) covering the range.
    pub(crate) fn block_status(&self, id: u32, offset: u64, length: u64) -> Vec<(u64, Allocation)> {
        let ledger = self.ledger.lock();
        let Some(vol) = ledger.volume(id) else {
            return vec![(length, Allocation::Hole)];
        };
        let mut out: Vec<(u64, Allocation)> = Vec::new();
        let end = offset + length;
        let mut pos = offset;
        while pos < end {
            let lba = pos / BLOCK_BYTES;
            let next = ((lba + 1) * BLOCK_BYTES).min(end);
            let state = match vol.map.get(lba).0 {
                _ if ledger.overlays.contains(id, lba) => Allocation::Data,
                Loc::Unmapped => Allocation::Hole,
                Loc::Zero => Allocation::Zero,
                _ => Allocation::Data,
            };
            match out.last_mut() {
                Some((len, s)) if *s == state => *len += next - pos,
                _ => out.push((next - pos, state)),
            }
            pos = next;
        }
        out
    }
}

pub(crate) fn gone(name: &str) -> Error {
    Error::NotFound(format!("volume '{name}' was deleted"))
}

/// Allocation state of a range, as block status reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Allocation {
    Data,
    Zero,
    Hole,
}
