//! The read path: a volume's blocks looked up in its map (without the
//! ledger lock where `read_index` allows, else under it; the range checked
//! against the size as of the lookup), read from the members (consecutive
//! blocks of one member in one read, straight into the caller's buffer
//! where it is 4 KiB-aligned), every block checked in place against its
//! checksum, and a bad or unreadable one rebuilt from the rest of its row
//! (`stripe`), returned and rewritten. Blocks still in memory (open rows, rows in
//! flight) are copied from there. Never returns bytes it could not verify.

use super::engine::open_device;
use super::ledger::Ledger;
use super::read_index::{ReadIndex, VolumeView};
use super::Engine;
use crate::device::{is_aligned, AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::Pba;
use crate::map::Loc;
use smallvec::SmallVec;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Engine {
    /// Reads whole blocks from `lba` into `out`, verifying every checksum,
    /// with their overlays applied. `asked` (the caller's request: byte
    /// offset and length, within the blocks) is checked against the
    /// volume's size as of the map lookup. Looked up without the ledger
    /// lock where `look_up_unlocked` can, under it otherwise.
    pub(crate) fn read_blocks(
        &self,
        vol: ReadTarget<'_>,
        lba: u64,
        out: &mut [u8],
        asked: (u64, u64),
    ) -> Result<()> {
        let ReadTarget { id, name, view } = vol;
        let (n, bytes) = ((out.len() / BLOCK_SIZE) as u64, asked.1);
        {
            let _guard = self.reuse.read();
            let mut blocks = PlanBlocks::new();
            if self.look_up_unlocked(view, (lba, asked), out, &mut blocks, true) {
                self.user_bytes_read_now.add(bytes);
                self.reads_without_ledger_lock.add(1);
                return self.read_plan(&ReadPlan::new(name, lba, blocks), out);
            }
        }
        let overlays = self.read_base(id, name, lba, out, |ledger| {
            let size = ledger.volume(id).ok_or_else(|| gone(name))?.size_bytes;
            within_size(name, asked, size)?;
            ledger.counters.user_bytes_read += bytes;
            Ok(ledger.overlays.copies(id, lba, n))
        })?;
        for (i, o) in overlays {
            o.apply(&mut out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
        }
        Ok(())
    }

    /// Looks the blocks of `out` up without the ledger lock, if that
    /// settles them, checking in the order `read_index` publishes: no
    /// overlay held in the volume, `asked` within the size the view
    /// publishes, every block a hole, zeroes, or on a member (in one hold
    /// of the map's lock), no row in flight over those, and the size still
    /// there (a deletion empties the map after it withdraws the size).
    /// Fills holes and zeroes in `out` and lists the others in `to_read`;
    /// `false` if the ledger must be asked (`to_read` then holds nothing
    /// to use). The caller holds `reuse` from before the call until the
    /// member reads are done. With `wait` false, a map a writer holds (or
    /// waits for) is not waited for: `false`.
    fn look_up_unlocked(
        &self,
        view: &VolumeView,
        (lba, asked): (u64, (u64, u64)),
        out: &mut [u8],
        to_read: &mut PlanBlocks,
        wait: bool,
    ) -> bool {
        use crate::sync::schedule_point;
        if view.overlays_held() {
            return false;
        }
        schedule_point();
        if !fits(asked, view.readable_bytes()) {
            return false;
        }
        schedule_point();
        let mut zeroes: SmallVec<[usize; 8]> = SmallVec::new();
        {
            let map = if wait {
                Some(view.map())
            } else {
                view.try_map()
            };
            let Some(map) = map else {
                return false;
            };
            for i in 0..out.len() / BLOCK_SIZE {
                match map.get(lba + i as u64) {
                    (Loc::Unmapped | Loc::Zero, _) => zeroes.push(i),
                    (Loc::Disk(pba), crc) => to_read.push((i, pba, crc)),
                    (Loc::Open { .. }, _) => return false,
                }
            }
        }
        schedule_point();
        if !to_read.is_empty() {
            let rows = self.read_index.rows_in_flight();
            let geometry = &self.shape.geometry;
            if to_read
                .iter()
                .any(|&(_, pba, _)| ReadIndex::in_flight(&rows, geometry, pba))
            {
                return false;
            }
            schedule_point();
        }
        if !fits(asked, view.readable_bytes()) {
            return false;
        }
        for i in zeroes {
            out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE].fill(0);
        }
        true
    }

    /// Reads whole blocks from `lba` into `out` as stored (no overlays),
    /// verifying every checksum. `snapshot` runs under the lock section of
    /// the map lookup, before it; its result is returned (its error fails
    /// the read before anything is put in `out`).
    pub(crate) fn read_base<T>(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        out: &mut [u8],
        snapshot: impl FnOnce(&mut Ledger) -> Result<T>,
    ) -> Result<T> {
        let _guard = self.reuse.read();
        let mut blocks = PlanBlocks::new();
        let snap = {
            let mut ledger = self.ledger.lock();
            let snap = snapshot(&mut ledger)?;
            self.look_up_blocks(&ledger, id, name, lba, out, &mut blocks)?;
            snap
        };
        self.read_plan(&ReadPlan::new(name, lba, blocks), out)?;
        Ok(snap)
    }

    /// Reads the member blocks of `plan` into `out`: each run read and
    /// settled at once, the runs of a member that is gone or failing
    /// rebuilt after. The caller holds `reuse`.
    fn read_plan(&self, plan: &ReadPlan, out: &mut [u8]) -> Result<()> {
        let read_ok = self.read_runs(plan, out)?;
        if read_ok.iter().any(|ok| !ok) {
            self.check_read_health();
            self.rebuild_failed_runs(plan, &read_ok, out)?;
        }
        Ok(())
    }

    /// Reads whole blocks from `lba` into `out` at once, if that needs no
    /// wait: the locks free, every block in memory or on a member whose
    /// cache holds it (`Device::try_read_at`), every checksum right. `None`:
    /// not done and nothing counted (`out` may hold part of it); `read_blocks`
    /// then does it and deals with what this declines (a range or volume
    /// error, a read that waits, a repair).
    pub(crate) fn try_read_blocks_now(
        &self,
        vol: ReadTarget<'_>,
        lba: u64,
        out: &mut [u8],
        asked: (u64, u64),
    ) -> Option<()> {
        let ReadTarget { id, name, view } = vol;
        let _guard = self.reuse.try_read()?;
        let mut blocks = PlanBlocks::new();
        let unlocked = self.look_up_unlocked(view, (lba, asked), out, &mut blocks, false);
        let overlays = if unlocked {
            Vec::new()
        } else {
            blocks.clear();
            let ledger = self.ledger.try_lock()?;
            within_size(name, asked, ledger.volume(id)?.size_bytes).ok()?;
            self.look_up_blocks(&ledger, id, name, lba, out, &mut blocks)
                .ok()?;
            ledger
                .overlays
                .copies(id, lba, (out.len() / BLOCK_SIZE) as u64)
        };
        let plan = ReadPlan::new(name, lba, blocks);
        let mut bounce = None;
        let devices = self.devices.load();
        // The member reads taken, counted only once the request is.
        let mut taken: SmallVec<[(&Arc<Device>, usize, Duration); 4]> = SmallVec::new();
        for run in &plan.runs {
            let first = plan.blocks[run.start].1;
            let dev = open_device(&devices, first.member_index())?;
            let dest = plan.run_bytes(run.clone(), out);
            let bytes = dest.len();
            let mut took = None;
            read_run(dest, &mut bounce, |buf| {
                took = dev.try_read_at(buf, first.byte_offset());
                took.is_some()
            });
            taken.push((dev, bytes, took?));
            let checked = plan.blocks[run.clone()]
                .iter()
                .all(|&(i, _, crc)| crc32c(&out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]) == crc);
            if !checked {
                return None;
            }
        }
        for (dev, bytes, took) in taken {
            dev.count_read(bytes, took);
        }
        for (i, o) in overlays {
            o.apply(&mut out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
        }
        self.user_bytes_read_now.add(asked.1);
        self.reads_without_ledger_lock.add(u64::from(unlocked));
        Some(())
    }

    /// Fills the blocks of `out` that need no member read (holes, zeroes,
    /// blocks still in memory) and lists the others in `to_read`.
    fn look_up_blocks(
        &self,
        ledger: &Ledger,
        id: u32,
        name: &str,
        lba: u64,
        out: &mut [u8],
        to_read: &mut PlanBlocks,
    ) -> Result<()> {
        let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
        let map = vol.map();
        for (i, block) in out.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            let (loc, crc) = map.get(lba + i as u64);
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
                    None => to_read.push((i, pba, crc)),
                },
            }
        }
        Ok(())
    }

    /// Reads each run of the plan with one member read and settles it into
    /// `out`; returns which runs their member returned. A run is read
    /// straight into `out` where `out` is aligned there as direct I/O needs
    /// (a 4 KiB read then costs no allocation and no copy), else through
    /// one buffer kept for the request.
    fn read_runs(&self, plan: &ReadPlan, out: &mut [u8]) -> Result<RunsOk> {
        let mut read_ok = RunsOk::from_elem(false, plan.runs.len());
        let mut bounce: Option<AlignedBuf> = None;
        for (r, run) in plan.runs.iter().enumerate() {
            let first = plan.blocks[run.start].1;
            let dest = plan.run_bytes(run.clone(), out);
            // The table as of this run (a member let go meanwhile closes
            // once the runs that looked it up are done).
            let devices = self.devices.load();
            read_ok[r] = open_device(&devices, first.member_index()).is_some_and(|dev| {
                read_run(dest, &mut bounce, |buf| {
                    dev.read_at(buf, first.byte_offset()).is_ok()
                })
            });
            if read_ok[r] {
                self.settle_run(plan, run.clone(), None, out)?;
            }
        }
        Ok(read_ok)
    }

    /// The runs whose member failed them, rebuilt a row at a time from the
    /// same range of the other columns, taking what the other runs put in
    /// `out` where they cover it (a sequential degraded read reads each
    /// surviving column once), then settled into `out`.
    fn rebuild_failed_runs(&self, plan: &ReadPlan, read_ok: &RunsOk, out: &mut [u8]) -> Result<()> {
        for (r, run) in plan.runs.iter().enumerate() {
            if read_ok[r] {
                continue;
            }
            let (buf, rebuilt) = self.rebuild_run_blocks(plan, run.clone(), read_ok, out);
            plan.run_bytes(run.clone(), out).copy_from_slice(&buf);
            buf.recycle();
            self.settle_run(plan, run.clone(), Some(&rebuilt), out)?;
        }
        Ok(())
    }

    /// The blocks of one run rebuilt from their rows, and which of them
    /// could be (`done`: the request's blocks settled so far).
    fn rebuild_run_blocks(
        &self,
        plan: &ReadPlan,
        run: Range<usize>,
        read_ok: &[bool],
        done: &[u8],
    ) -> (AlignedBuf, RunsOk) {
        let have = |pba: Pba, n: usize| plan.settled_overlapping(read_ok, done, pba, n);
        let blocks = &plan.blocks[run];
        let mut rebuilt = RunsOk::from_elem(false, blocks.len());
        // A run rebuilt in one piece (a block of a random read) is that
        // piece; else the pieces are put together.
        let mut piece = match self.rebuild_run(blocks, &have) {
            Some(whole) if whole.len() == blocks.len() * BLOCK_SIZE => {
                rebuilt.fill(true);
                return (whole, rebuilt);
            }
            first => first,
        };
        let mut buf = AlignedBuf::scratch(blocks.len() * BLOCK_SIZE);
        let mut j = 0;
        loop {
            let n = piece.as_ref().map_or(0, |p| p.len() / BLOCK_SIZE);
            match piece {
                Some(p) => {
                    buf[j * BLOCK_SIZE..(j + n) * BLOCK_SIZE].copy_from_slice(&p);
                    p.recycle();
                }
                // Not rebuilt: zeroes, not what the scratch buffer held.
                None => buf[j * BLOCK_SIZE..(j + 1) * BLOCK_SIZE].fill(0),
            }
            rebuilt[j..j + n.max(1)].fill(n > 0);
            j += n.max(1);
            if j >= blocks.len() {
                return (buf, rebuilt);
            }
            piece = self.rebuild_run(&blocks[j..], &have);
        }
    }

    /// Checks the blocks of a run, in place in `out` (as read, or as
    /// rebuilt where `rebuilt` says), against their checksums; a block that
    /// does not check out is rebuilt from its stripe (and rewritten), or
    /// the read fails.
    fn settle_run(
        &self,
        plan: &ReadPlan,
        run: Range<usize>,
        rebuilt: Option<&[bool]>,
        out: &mut [u8],
    ) -> Result<()> {
        for (j, &(i, pba, crc)) in plan.blocks[run].iter().enumerate() {
            let dest = &mut out[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            let usable = rebuilt.is_none_or(|r| r[j]);
            if usable && crc32c(dest) == crc {
                continue;
            }
            if rebuilt.is_none() {
                if let Some(dev) = self.device(pba.member_index()) {
                    dev.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let offset = (plan.lba + i as u64) * BLOCK_BYTES;
            let fixed = self.rebuild_block(pba, crc).map_err(|cause| {
                self.log_lost(format_args!(
                    "volume '{}' offset {offset}: block lost: {cause}",
                    plan.name
                ));
                Error::Unrecoverable {
                    volume: plan.name.to_string(),
                    offset,
                    cause,
                }
            })?;
            dest.copy_from_slice(&fixed);
            self.rewrite_block(pba, &fixed);
            self.log_repair(format_args!(
                "volume '{}' offset {offset}: member {} ({}) returned a bad block; \
                 repaired from parity",
                plan.name,
                pba.member,
                self.member_name(pba.member_index())
            ));
        }
        Ok(())
    }

    /// Writes a repaired block back where it belongs (its row's parity is
    /// unchanged, since the block is restored to what the parity covers).
    fn rewrite_block(&self, pba: Pba, block: &[u8]) {
        let Some(dev) = self.device(pba.member_index()) else {
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
        let map = vol.map();
        while pos < end {
            let lba = pos / BLOCK_BYTES;
            let next = ((lba + 1) * BLOCK_BYTES).min(end);
            let state = match map.get(lba).0 {
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

/// Reads one run into `dest` with `read`: straight into it where it is
/// aligned as direct I/O needs, else through `bounce` (kept for the
/// request, grown as needed). Returns what `read` returned.
fn read_run(
    dest: &mut [u8],
    bounce: &mut Option<AlignedBuf>,
    read: impl FnOnce(&mut [u8]) -> bool,
) -> bool {
    if is_aligned(dest) {
        return read(dest);
    }
    let buf = match bounce {
        Some(b) if b.len() >= dest.len() => b,
        _ => bounce.insert(AlignedBuf::zeroed(dest.len())),
    };
    let buf = &mut buf[..dest.len()];
    let ok = read(buf);
    if ok {
        dest.copy_from_slice(buf);
    }
    ok
}

/// A request's blocks to read from members (most requests are one run).
type PlanBlocks = SmallVec<[(usize, Pba, u32); 4]>;
/// Whether each run's member returned it.
type RunsOk = SmallVec<[bool; 4]>;

/// The member reads one request needs: each block not found in memory
/// (its place in the request, its address, its checksum), grouped into
/// runs of blocks consecutive both on one member and in the request.
struct ReadPlan<'a> {
    name: &'a str,
    lba: u64,
    blocks: PlanBlocks,
    runs: SmallVec<[Range<usize>; 4]>,
}

/// Blocks one member read covers at most.
const MAX_RUN_BLOCKS: usize = 256;

impl<'a> ReadPlan<'a> {
    fn new(name: &'a str, lba: u64, blocks: PlanBlocks) -> Self {
        let mut runs = SmallVec::new();
        let mut start = 0;
        while start < blocks.len() {
            let (i0, first, _) = blocks[start];
            let mut end = start + 1;
            while end < blocks.len()
                && blocks[end].1.member == first.member
                && blocks[end].1.block == first.block + (end - start) as u64
                && blocks[end].0 == i0 + (end - start)
                && end - start < MAX_RUN_BLOCKS
            {
                end += 1;
            }
            runs.push(start..end);
            start = end;
        }
        ReadPlan {
            name,
            lba,
            blocks,
            runs,
        }
    }

    /// The bytes of `out` a run fills (its blocks are consecutive in the
    /// request).
    fn run_bytes<'o>(&self, run: Range<usize>, out: &'o mut [u8]) -> &'o mut [u8] {
        let at = self.blocks[run.start].0 * BLOCK_SIZE;
        &mut out[at..at + run.len() * BLOCK_SIZE]
    }

    /// A run read whole from the same member that overlaps the `n` blocks
    /// from `pba`: its first block number and its checked bytes in `done`.
    fn settled_overlapping<'o>(
        &self,
        read_ok: &[bool],
        done: &'o [u8],
        pba: Pba,
        n: usize,
    ) -> Option<(u64, &'o [u8])> {
        self.runs.iter().zip(read_ok).find_map(|(run, ok)| {
            let (i, f, _) = self.blocks[run.start];
            let overlaps = f.member == pba.member
                && f.block < pba.block + n as u64
                && pba.block < f.block + run.len() as u64;
            (*ok && overlaps).then(|| {
                let at = i * BLOCK_SIZE;
                (f.block, &done[at..at + run.len() * BLOCK_SIZE])
            })
        })
    }
}

/// The volume a read is for: its id and name (looked up in the ledger, and
/// named in errors) and its view (looked up without the ledger lock).
pub(crate) struct ReadTarget<'a> {
    pub id: u32,
    pub name: &'a str,
    pub view: &'a VolumeView,
}

/// Whether a request (byte offset and length) lies within `size` bytes.
pub(crate) fn fits((offset, length): (u64, u64), size: u64) -> bool {
    offset.checked_add(length).is_some_and(|end| end <= size)
}

/// `fits`, or the error that says the request is out of the volume's range.
pub(crate) fn within_size(name: &str, asked: (u64, u64), size: u64) -> Result<()> {
    let (offset, length) = asked;
    if !fits(asked, size) {
        return Err(Error::OutOfRange {
            volume: name.to_string(),
            offset,
            length,
            size,
        });
    }
    Ok(())
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
