//! The data path: user writes into the log, sealed rows out to the members
//! (parity computed once per row, columns written in parallel), flush, and
//! reads that verify every block's checksum and rebuild a bad or unreadable
//! block from the rest of its row.

use super::space::SpaceStalls;
use super::log::AppendError;
use super::overlay::{Cond, Written};
use super::ledger::{Ledger, SealedRow, SegState};
use super::{check_writable, Allocation, Engine};
use crate::device::IoJob;
use crate::device::{uring, AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::row::{Entry, EntryKind, HeadId};
use crate::format::superblock::MemberState;
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::{Pba, RowGeom};
use crate::map::Loc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Blocks one trim or zero record covers at most (bounds the time the ledger
/// lock is held for one record).
const MAX_RANGE_RECORD_BLOCKS: u64 = 1 << 16;

/// What a range operation does to the whole blocks it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    /// Unmap (a hint; reads return zeroes).
    Trim,
    /// Read as zero, unmapped (a hole).
    ZeroUnmapped,
    /// Read as zero, reported allocated (NBD NO_HOLE).
    ZeroAllocated,
}

/// Attempts of an optimistic sub-block write before giving up.
const PARTIAL_WRITE_ATTEMPTS: usize = 1000;

thread_local! {
    /// The parity buffer `write_row` used last on this thread (see there).
    static PARITY_BUFFER: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl Engine {
    /// Writes `data` at byte `offset` of volume `id` (512-byte aligned,
    /// range already checked). Sub-block pieces merge into their block.
    pub(crate) fn write(&self, id: u32, name: &str, offset: u64, data: &[u8]) -> Result<()> {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let within = (pos % BLOCK_BYTES) as usize;
            if within != 0 || rest.len() < BLOCK_SIZE {
                let n = (BLOCK_SIZE - within).min(rest.len());
                self.write_partial(id, name, pos / BLOCK_BYTES, within, &rest[..n])?;
                pos += n as u64;
                rest = &rest[n..];
                continue;
            }
            let n = rest.len() / BLOCK_SIZE * BLOCK_SIZE;
            self.write_blocks(id, pos / BLOCK_BYTES, &rest[..n], None)?;
            pos += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// A write covering block `lba` only partly: held as an overlay (see
    /// `overlay`), merged into the block later; no read here. One that
    /// completes its overlay's block is written as a whole block.
    fn write_partial(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        within: usize,
        bytes: &[u8],
    ) -> Result<()> {
        for _ in 0..PARTIAL_WRITE_ATTEMPTS {
            let written = {
                let mut ledger = self.ledger.lock();
                check_writable(&ledger)?;
                let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
                let base_stored = vol.map.get(lba).0.is_stored();
                let (stored, usable) = (ledger.stored_blocks, ledger.usable_blocks);
                ledger.overlays
                    .write(id, lba, within, bytes, base_stored, stored, usable)?
            };
            match written {
                Written::Held { wake } => {
                    if wake {
                        self.overlay_wake.notify_one();
                    }
                    return Ok(());
                }
                Written::Full(block, cond) => {
                    if self.write_blocks(id, lba, &block, Some(cond))? {
                        return Ok(());
                    }
                }
                // The table is full. Merge a batch of it, unless another
                // thread is doing that already: then merge this write with
                // its block here (read, merge, conditional write), in
                // parallel with the other writers, instead of queueing
                // behind the batch (at high queue depths the table fills
                // faster than one batch at a time empties it).
                Written::TableFull => match self.try_make_overlay_room() {
                    Some(made) => made?,
                    None => {
                        if self.merge_beside_table(id, name, lba, within, bytes)? {
                            return Ok(());
                        }
                    }
                },
            }
        }
        Err(Error::Refused(format!(
            "volume '{name}' block {lba}: sub-block write kept racing with other writes"
        )))
    }

    /// Writes `bytes` at byte `within` of block `lba` by reading the block,
    /// merging and writing it whole, on condition that the block did not
    /// change since it was read (false if it did: try again). The map entry
    /// the condition compares is taken in the lock section of the read's map
    /// lookup: taken apart from it, the block could change A to B to A
    /// in between, and the merge, built on B, would be written over the
    /// later A (a lost write). The block's overlays, if any, are applied,
    /// and the write requires that there be none by then.
    pub(crate) fn merge_beside_table(
        &self,
        id: u32,
        name: &str,
        lba: u64,
        within: usize,
        bytes: &[u8],
    ) -> Result<bool> {
        let mut block = vec![0u8; BLOCK_SIZE];
        let (entry, overlays) = self.read_base(id, name, lba, &mut block, |ledger| {
            let entry = ledger.volume(id).map(|v| v.map.get(lba));
            (entry, ledger.overlays.copies(id, lba, 1))
        })?;
        let entry = entry.ok_or_else(|| gone(name))?;
        for (_, o) in overlays {
            o.apply(&mut block);
        }
        block[within..within + bytes.len()].copy_from_slice(bytes);
        let cond = Cond {
            entry: Some(entry),
            overlay: None,
        };
        self.write_blocks(id, lba, &block, Some(cond))
    }

    /// Appends whole blocks to the user head, dropping their overlays. With
    /// `cond` (a single block carrying an overlay), writes only if the
    /// overlay is still the one merged and the block's map entry (if given)
    /// still equals the one read, then settles the overlay; returns whether
    /// it wrote.
    pub(crate) fn write_blocks(
        &self,
        id: u32,
        lba: u64,
        data: &[u8],
        cond: Option<Cond>,
    ) -> Result<bool> {
        let n = data.len() / BLOCK_SIZE;
        let crcs: Vec<u32> = data.chunks_exact(BLOCK_SIZE).map(crc32c).collect();
        let mut i = 0;
        let mut stalls = SpaceStalls::default();
        while i < n {
            let mut sealed = Vec::new();
            let mut outcome: Result<()> = Ok(());
            let mut need_segment = false;
            {
                let mut ledger = self.ledger.lock();
                self.wait_for_inflight_room(&mut ledger);
                check_writable(&ledger)?;
                let vol = ledger
                    .volume(id)
                    .ok_or_else(|| Error::NotFound(format!("volume {id} was deleted")))?;
                if let Some(c) = &cond {
                    debug_assert_eq!(n, 1);
                    if !ledger.overlays.admits(id, lba, c) {
                        return Ok(false);
                    }
                }
                if let Some(exp) = cond.and_then(|c| c.entry) {
                    // Changed since it was read? A block the cleaner moved
                    // meanwhile holds the same bytes (same checksum): not a
                    // change (in a full pool the cleaner may move it every
                    // time, and the write would never get through).
                    let now = vol.map.get(lba);
                    let stored = |l: Loc| matches!(l, Loc::Disk(_) | Loc::Open { .. });
                    if now != exp && !(now.1 == exp.1 && stored(now.0) && stored(exp.0)) {
                        return Ok(false);
                    }
                }
                while i < n {
                    let b = lba + i as u64;
                    let (old, _) = ledger.volume(id).expect("volume").map.get(b);
                    // A new block: room for it beyond the blocks reserved
                    // for overlays (its own overlay's reservation is its).
                    // An overlay merged into its block had its room
                    // reserved when it was acknowledged: it is written even
                    // if the pool holds less since (a member failed).
                    let reserved = || {
                        cond.is_some_and(|c| c.overlay.is_some()) && ledger.overlays.reserves(id, b)
                    };
                    if !old.is_stored()
                        && !reserved()
                        && ledger.stored_blocks + ledger.overlays.unstored_except(id, b)
                            >= ledger.usable_blocks
                    {
                        outcome = Err(Error::NoSpace);
                        break;
                    }
                    let entry = Entry {
                        kind: EntryKind::Data,
                        volume: id,
                        lba: b,
                        crc: crcs[i],
                        count: 1,
                        source: 0,
                    };
                    match ledger.append_block(
                        HeadId::User,
                        entry,
                        &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE],
                        &self.shape,
                    ) {
                        Ok(Some(row)) => sealed.push(row),
                        Ok(None) => {}
                        Err(AppendError::NeedSegment) => {
                            need_segment = true;
                            break;
                        }
                    }
                    ledger.overlays.appended(id, b, cond.and_then(|c| c.overlay));
                    ledger.counters.user_bytes_written += BLOCK_BYTES;
                    i += 1;
                }
            }
            self.submit_rows(sealed)?;
            outcome?;
            if need_segment {
                stalls.check(self.ledger.lock().user_appends)?;
                self.make_space()?;
            }
        }
        Ok(true)
    }

    /// Blocks while too many rows are in flight (bounds memory). Returns at
    /// once in a pool that stopped writing: its rows may never complete,
    /// and the caller's `check_writable` refuses.
    fn wait_for_inflight_room(&self, ledger: &mut crate::sync::MutexGuard<'_, Ledger>) {
        while ledger.read_only_reason.is_none()
            && (ledger.inflight.len() >= self.options.max_inflight_rows
                || ledger.inflight.iter().map(|r| r.buf.len()).sum::<usize>()
                    >= self.options.max_inflight_bytes)
        {
            self.progress.wait(ledger);
        }
    }

    /// Trims or zeroes the whole blocks of a range (see `RangeOp`); the
    /// zeroing ops also overwrite partial blocks at the edges with zeroes.
    pub(crate) fn range_op(
        &self,
        id: u32,
        name: &str,
        offset: u64,
        length: u64,
        op: RangeOp,
    ) -> Result<()> {
        let end = offset + length;
        let first = offset.div_ceil(BLOCK_BYTES);
        let last = end / BLOCK_BYTES;
        if op != RangeOp::Trim {
            let zeros = vec![0u8; BLOCK_SIZE];
            if first > last {
                return self.write(id, name, offset, &zeros[..length as usize]);
            }
            if offset < first * BLOCK_BYTES {
                self.write(
                    id,
                    name,
                    offset,
                    &zeros[..(first * BLOCK_BYTES - offset) as usize],
                )?;
            }
            if end > last * BLOCK_BYTES {
                self.write(
                    id,
                    name,
                    last * BLOCK_BYTES,
                    &zeros[..(end - last * BLOCK_BYTES) as usize],
                )?;
            }
        }
        let mut lba = first;
        // Trims and zeroes free room: if the cleaner cannot make any for
        // their records (a pool holding more than it may, after a member
        // failed), they may use the cleaner's reserve.
        let mut relief = false;
        let mut stalls = SpaceStalls::default();
        while lba < last {
            let mut sealed = Vec::new();
            let mut need_segment = false;
            {
                let mut ledger = self.ledger.lock();
                self.wait_for_inflight_room(&mut ledger);
                check_writable(&ledger)?;
                let vol = ledger.volume(id).ok_or_else(|| gone(name))?;
                let (start, run_end, kind) = if op == RangeOp::ZeroAllocated {
                    // Every block becomes a zero record, in bounded steps.
                    (
                        lba,
                        (lba + MAX_RANGE_RECORD_BLOCKS).min(last),
                        EntryKind::Zero,
                    )
                } else {
                    // Only mapped blocks need a record: the next run of them.
                    let Some((next, _, _)) = vol.map.iter_from(lba).next().filter(|e| e.0 < last)
                    else {
                        // The rest is unmapped: only overlays to drop.
                        ledger.overlays.remove_range(id, lba, last);
                        break;
                    };
                    let mut run_end = next;
                    for (b, _, _) in vol.map.iter_from(next) {
                        if b != run_end || b >= last || run_end - next >= MAX_RANGE_RECORD_BLOCKS {
                            break;
                        }
                        run_end += 1;
                    }
                    (next, run_end, EntryKind::Trim)
                };
                match ledger.append_range_record(
                    id,
                    start,
                    (run_end - start) as u32,
                    kind,
                    relief,
                    &self.shape,
                ) {
                    Ok(row) => {
                        sealed.extend(row);
                        // Blocks skipped before the run were unmapped.
                        ledger.overlays.remove_range(id, lba, run_end);
                        lba = run_end;
                    }
                    Err(AppendError::NeedSegment) => need_segment = true,
                }
            }
            self.write_rows(sealed)?;
            if need_segment {
                if relief {
                    return Err(Error::NoSpace);
                }
                // The cleaner at a fixed point: the records may use its reserve.
                if stalls.check(self.ledger.lock().user_appends).is_err() {
                    relief = true;
                    continue;
                }
                match self.make_space() {
                    Ok(()) => {}
                    Err(Error::NoSpace) => relief = true,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
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

    /// Seals the user and cleaner heads' open rows (for a flush or checkpoint).
    pub(crate) fn seal_open_rows(&self, ledger: &mut Ledger) -> Vec<Arc<SealedRow>> {
        [HeadId::User, HeadId::Cleaner]
            .iter()
            .filter_map(|&h| ledger.seal(h, &self.shape))
            .collect()
    }

    /// Writes sealed rows (each row's columns in parallel).
    pub(crate) fn write_rows(&self, rows: Vec<Arc<SealedRow>>) -> Result<()> {
        let mut first_error = None;
        for row in rows {
            if let Err(e) = self.write_row(&row) {
                first_error.get_or_insert(e);
            }
            // The buffer serves the next row unless a reader still holds it.
            if let Ok(row) = Arc::try_unwrap(row) {
                self.ledger.lock().recycle(row.buf);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write_row(&self, row: &Arc<SealedRow>) -> Result<()> {
        let g = row.geom;
        let column_bytes = g.height as usize * BLOCK_SIZE;
        let parity_bytes = g.parity as usize * column_bytes;
        // Each writing thread keeps its last parity buffer: a fresh one per
        // row was a zeroed allocation large enough to be mapped and faulted
        // in every time.
        let mut parity = PARITY_BUFFER
            .with(|b| b.borrow_mut().take())
            .filter(|b| b.len() == parity_bytes)
            .unwrap_or_else(|| AlignedBuf::zeroed(parity_bytes));
        if g.parity > 0 {
            let data: Vec<&[u8]> = (0..g.data_columns as usize)
                .map(|c| row.column(c))
                .collect();
            let mut out: Vec<&mut [u8]> = parity.chunks_mut(column_bytes).collect();
            lograid_parity::encode(&data, &mut out);
        }
        let columns =
            (0..g.data_columns as usize).chain((0..g.parity as usize).map(|p| g.parity_column(p)));
        let targets: Vec<(usize, Pba, Arc<Device>)> = columns
            .filter_map(|col| {
                let pba = g.pba(&self.shape.geometry, col, 0);
                self.device(pba.member as usize).map(|dev| (col, pba, dev))
            })
            .collect();
        if uring::enabled() {
            if let Some(results) = self.write_by_ring(row, &parity, &targets) {
                PARITY_BUFFER.with(|b| *b.borrow_mut() = Some(parity));
                return self.finish_row_write(row, results);
            }
        }
        let parity = Arc::new(parity);
        let mut jobs: Vec<IoJob<(u8, std::io::Result<()>)>> = Vec::new();
        for (col, pba, dev) in targets {
            let row = row.clone();
            let parity = parity.clone();
            jobs.push(Box::new(move || {
                let bytes = column_of(&row, &parity, col);
                (
                    pba.member,
                    with_retries(|| dev.write_at(bytes, pba.byte_offset())),
                )
            }));
        }
        let results = self.io.run_all(jobs);
        // Every job has finished with its copy of the buffer.
        if let Ok(buf) = Arc::try_unwrap(parity) {
            PARITY_BUFFER.with(|b| *b.borrow_mut() = Some(buf));
        }
        self.finish_row_write(row, results)
    }

    /// Writes a row's columns in one io_uring submission (`LOGRAID_IO_URING=1`);
    /// a column the ring did not write whole is written again the usual way
    /// (retries, then the member is faulted). `None` if the ring cannot take
    /// this row (nothing was written).
    fn write_by_ring(
        &self,
        row: &SealedRow,
        parity: &[u8],
        targets: &[(usize, Pba, Arc<Device>)],
    ) -> Option<Vec<(u8, std::io::Result<()>)>> {
        let batch: Vec<uring::ColumnWrite<'_>> = targets
            .iter()
            .map(|(col, pba, dev)| uring::ColumnWrite {
                device: dev,
                bytes: column_of(row, parity, *col),
                offset: pba.byte_offset(),
            })
            .collect();
        let first = uring::write_columns(&batch)?;
        Some(
            targets
                .iter()
                .zip(first)
                .map(|((col, pba, dev), r)| {
                    let r = r.or_else(|e| {
                        tracing::warn!(
                            "member write through io_uring failed ({e}); writing it again"
                        );
                        with_retries(|| {
                            dev.write_at(column_of(row, parity, *col), pba.byte_offset())
                        })
                    });
                    (pba.member, r)
                })
                .collect(),
        )
    }

    /// Records the outcome of a row's column writes: members that failed
    /// are faulted (the row stays readable without their columns, from its
    /// parity), or the pool stops writing; the row leaves the in-flight
    /// list. (Each member counts its completed writes itself, for `sync`.)
    fn finish_row_write(
        &self,
        row: &Arc<SealedRow>,
        results: Vec<(u8, std::io::Result<()>)>,
    ) -> Result<()> {
        let mut error = None;
        for (member, r) in results {
            if let Err(e) = r {
                if let Err(e) = self.fault_member(member as usize, "a write", e) {
                    error.get_or_insert(e);
                }
            }
        }
        let mut ledger = self.ledger.lock();
        let i = ledger
            .inflight
            .iter()
            .position(|r| Arc::ptr_eq(r, row))
            .expect("row in flight");
        ledger.inflight.swap_remove(i);
        self.progress.notify_all();
        error.map_or(Ok(()), Err)
    }

    /// Makes every block the log took before the call durable on every
    /// member: seals the open rows, then `make_durable`; only then may the
    /// segments emptied before the call be reused (`finish_flush`).
    /// Sub-block writes still held as overlays are not merged here (the
    /// cleaner and members call this holding `maintenance`, which merging
    /// may need): `flush_all` makes every acknowledged write durable.
    pub(crate) fn flush(&self) -> Result<()> {
        let (sealed, target_seq, gen) = {
            let mut ledger = self.ledger.lock();
            ledger.flush_gen += 1;
            let gen = ledger.flush_gen;
            let sealed = self.seal_open_rows(&mut ledger);
            (sealed, ledger.next_seq, gen)
        };
        self.write_rows(sealed)?;
        self.make_durable(target_seq)?;
        self.finish_flush(gen);
        self.debug_check("flush");
        let due = {
            let ledger = self.ledger.lock();
            ledger.checkpoint_wanted
                || ledger.log_blocks_since_checkpoint >= self.options.checkpoint_interval_blocks
        };
        if due {
            if let Some(_m) = self.maintenance.try_lock() {
                self.checkpoint_locked()?;
            }
        }
        Ok(())
    }

    /// Makes every row with a sequence number below `target_seq` durable:
    /// waits until each is written (whichever thread writes it), syncs
    /// every member, and only then records them flushed (`flushed_seq`,
    /// which later rows carry and recovery trusts).
    pub(crate) fn make_durable(&self, target_seq: u64) -> Result<()> {
        {
            let mut ledger = self.ledger.lock();
            // A pool that stopped writing (a row write failed beyond the
            // parity, or panicked) may never complete its rows.
            while ledger.read_only_reason.is_none()
                && ledger.inflight.iter().any(|r| r.geom.seq < target_seq)
            {
                self.progress.wait(&mut ledger);
            }
            check_writable(&ledger)?;
        }
        self.sync_members()?;
        let mut ledger = self.ledger.lock();
        ledger.flushed_seq = ledger.flushed_seq.max(target_seq - 1);
        Ok(())
    }

    /// Makes every write completed on the members before the call durable
    /// (`Device::sync`, which shares a flush with concurrent callers and
    /// waits for one already running). A member whose flush fails is
    /// faulted, never flushed again; past the parity the pool stops
    /// writing and this fails.
    pub(crate) fn sync_members(&self) -> Result<()> {
        let dirty: Vec<(usize, Arc<Device>)> = self
            .open_devices()
            .into_iter()
            .filter(|(_, d)| d.dirty())
            .collect();
        let results: Vec<(usize, Arc<Device>, std::io::Result<()>)> = if dirty.len() <= 1 {
            dirty
                .into_iter()
                .map(|(m, d)| {
                    let r = d.sync();
                    (m, d, r)
                })
                .collect()
        } else {
            let jobs = dirty
                .into_iter()
                .map(|(m, d)| {
                    Box::new(move || {
                        let r = d.sync();
                        (m, d, r)
                    }) as IoJob<_>
                })
                .collect();
            self.io.run_all(jobs)
        };
        for (m, dev, r) in results {
            // Faulted only if the slot still holds that drive (a member
            // replaced meanwhile is not blamed for the old one's error).
            let current = self.device_any(m).is_some_and(|d| Arc::ptr_eq(&d, &dev));
            if let (Err(e), true) = (r, current) {
                self.fault_member(m, "a flush", e)?;
            }
        }
        Ok(())
    }

    /// A member failed `what` after its retries: fault it (new rows go to
    /// the others with full parity; reads rebuild its columns), or, if that
    /// would leave more members lost than the pool has parity, stop writing.
    pub(crate) fn fault_member(&self, m: usize, what: &str, e: std::io::Error) -> Result<()> {
        let name = self
            .device(m)
            .map(|d| d.member.describe())
            .unwrap_or_else(|| "-".into());
        let mut ledger = self.ledger.lock();
        let state = ledger.members.get(m).map(|r| r.state);
        if !matches!(
            state,
            Some(MemberState::Active | MemberState::Joining | MemberState::Removing)
        ) || (state == Some(MemberState::Removing) && self.device(m).is_none())
        {
            return Ok(()); // already faulted: its columns are not counted on
        }
        // (A member rebuilt in place may count as lost already.)
        let lost = self.lost_members(&ledger) + u32::from(!self.is_lost(&ledger, m));
        if lost > self.shape.parity() as u32 {
            let msg = format!(
                "member {m} ({name}) failed {what} ({e}) with {} member(s) already lost and parity {}: \
                 the pool stopped writing; what it holds stays readable where parity allows",
                lost - 1,
                self.shape.parity()
            );
            tracing::error!("{msg}");
            ledger.read_only_reason.get_or_insert(msg.clone());
            return Err(Error::io(msg, e));
        }
        tracing::error!(
            "member {m} ({name}) failed {what} ({e}): faulted; \
             the pool goes on degraded, new rows use the other members with full parity"
        );
        if state != Some(MemberState::Removing) {
            ledger.members[m].state = MemberState::Faulted;
        }
        // Not read or written any more: its columns are rebuilt from parity.
        if let Some(dev) = self.device(m) {
            dev.retired.store(true, Ordering::Relaxed);
        }
        self.event(format!("member {m} ({name}) faulted: {what} failed: {e}"));
        ledger.active_mask &= !(1 << m);
        ledger.member_set_changed(&self.shape);
        // New rows are narrower: the pool holds less (writes of new blocks
        // get NoSpace once it is full at the new width).
        ledger.update_capacity(&self.shape);
        ledger.checkpoint_wanted = true;
        Ok(())
    }

    /// Faults members whose reads keep failing (or are too slow):
    /// `BAD_READS_TO_FAULT` in a row. Their blocks were rebuilt from parity
    /// each time; from now on they are not read at all.
    pub(crate) fn check_read_health(&self) {
        for (m, dev) in self.open_devices() {
            let bad = dev.bad_reads_in_a_row();
            if bad >= BAD_READS_TO_FAULT {
                let e = std::io::Error::other(format!("{bad} reads in a row failed or timed out"));
                if let Err(e) = self.fault_member(m, "reads", e) {
                    tracing::error!("{e}");
                }
            }
        }
    }

    fn is_lost(&self, ledger: &Ledger, m: usize) -> bool {
        let r = &ledger.members[m];
        r.state == MemberState::Faulted
            || (r.state.may_hold_rows()
                && (self.device(m).is_none() || self.shape.stale[m].count() > 0))
    }

    /// Members that may hold rows but cannot be read (all of them): faulted,
    /// gone, or taking a failed member's place with rows not yet rebuilt
    /// onto it.
    pub(crate) fn lost_members(&self, ledger: &Ledger) -> u32 {
        (0..ledger.members.len())
            .filter(|&m| self.is_lost(ledger, m))
            .count() as u32
    }

    /// After flush `gen` completed: segments emptied before it started become
    /// free, except those holding rows written since the durable checkpoint
    /// (recovery follows the log through them) and those emptied since a
    /// change only a checkpoint records (`Ledger::unlogged_changes`): they
    /// wait for the next checkpoint (`after_checkpoint`).
    pub(crate) fn finish_flush(&self, gen: u64) {
        self.release_pending(|ledger, seg, flush_gen| {
            flush_gen < gen
                && ledger.unlogged_since_gen.is_none_or(|u| flush_gen < u)
                && seg
                    .rows
                    .last()
                    .is_none_or(|r| r.seq < ledger.checkpoint_next_seq)
        });
    }

    /// After a checkpoint is durable (it started with flush `gen`): it
    /// records every change made before it started, and every segment
    /// emptied before it started becomes free.
    pub(crate) fn after_checkpoint(&self, gen: u64) {
        {
            let mut ledger = self.ledger.lock();
            if let Some(since) = ledger.unlogged_since_gen {
                assert!(
                    since < gen,
                    "a change only a checkpoint records, made during one"
                );
                ledger.unlogged_since_gen = None;
            }
        }
        self.release_pending(|_, _, flush_gen| flush_gen < gen);
    }

    fn release_pending(&self, ready: impl Fn(&Ledger, &super::ledger::Segment, u64) -> bool) {
        let is_ready = |ledger: &Ledger, s: usize| match ledger.segments[s].state {
            SegState::PendingFree { flush_gen } => ready(ledger, &ledger.segments[s], flush_gen),
            _ => false,
        };
        {
            let ledger = self.ledger.lock();
            if !(0..ledger.segments.len()).any(|s| is_ready(&ledger, s)) {
                return;
            }
        }
        // Wait for readers that may still read the old contents.
        let _w = self.reuse.write();
        if self.options.discard {
            let ready: Vec<(u32, u32)> = {
                let ledger = self.ledger.lock();
                (0..ledger.segments.len())
                    .filter(|&s| is_ready(&ledger, s))
                    .map(|s| (s as u32, ledger.segments[s].members_mask))
                    .collect()
            };
            // Still pending (so never handed out) while their blocks are
            // discarded; `reuse` keeps other releases out meanwhile.
            for (s, mask) in ready {
                self.discard_segment(s, mask);
            }
        }
        let mut ledger = self.ledger.lock();
        for s in 0..ledger.segments.len() {
            if is_ready(&ledger, s) {
                assert_eq!(
                    ledger.segments[s].live_blocks, 0,
                    "freeing segment {s} with live blocks"
                );
                ledger.release_segment(s as u32, &self.shape);
            }
        }
        self.progress.notify_all();
        drop(ledger);
        self.debug_check("releasing segments");
    }

    /// Tells the members that segment `s` no longer holds anything. Advisory:
    /// a member that fails it is logged and the segment is freed anyway.
    fn discard_segment(&self, s: u32, members_mask: u32) {
        let g = &self.shape.geometry;
        let offset = g.segment_base(s) * BLOCK_BYTES;
        let len = g.segment_blocks as u64 * BLOCK_BYTES;
        for (m, dev) in self.open_devices() {
            if members_mask & (1 << m) == 0 {
                continue;
            }
            match dev.discard(offset, len) {
                Ok(()) => {
                    self.stats.lock().discarded_bytes += len;
                }
                Err(e) => tracing::warn!(
                    "discard of segment {s} on member {m} ({}): {e}",
                    dev.member.describe()
                ),
            }
        }
    }

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
                .map_err(|detail| Error::Unrecoverable {
                    volume: name.to_string(),
                    offset: (lba + i as u64) * BLOCK_BYTES,
                    detail,
                })?;
            dest.copy_from_slice(&fixed);
            self.rewrite_block(pba, &fixed);
        }
        Ok(())
    }

    /// Rebuilds the leading blocks of `run` (consecutive blocks of one
    /// member) that lie in one row, from the same block range of the
    /// row's other columns: one read per column instead of one per block.
    /// Writes them to the front of `out`; returns how many (0: could not).
    /// `have(pba, n)`: blocks already read on that member that overlap
    /// those (the first one's block number, and the bytes).
    fn rebuild_run<'a>(
        &self,
        run: &[(usize, Pba, u32)],
        out: &mut [u8],
        have: &dyn Fn(Pba, usize) -> Option<(u64, &'a [u8])>,
    ) -> usize {
        let geometry = &self.shape.geometry;
        let Some(geom) = self.row_of(run[0].1) else {
            return 0;
        };
        let Some((col, blk)) = geom.locate(geometry, run[0].1) else {
            return 0;
        };
        let n = run
            .iter()
            .enumerate()
            .take_while(|(j, r)| geom.locate(geometry, r.1) == Some((col, blk + j)))
            .count();
        match self.rebuild_column_range(&geom, col, blk, n, have) {
            Some(bytes) => {
                out[..n * BLOCK_SIZE].copy_from_slice(&bytes);
                n
            }
            None => 0,
        }
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
        // than it gains, since readers run many at once anyway.
        let mut columns: Vec<Option<AlignedBuf>> = (0..geom.width())
            .map(|c| {
                if c == col || !geom.column_used(c) {
                    return None;
                }
                let pba = geom.pba(&self.shape.geometry, c, blk);
                let mut buf = AlignedBuf::zeroed(n * BLOCK_SIZE);
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
                let dev = self.device(pba.member as usize);
                for (a, b) in [(0, lo), (hi, n as u64)] {
                    if a < b {
                        let part = &mut buf[a as usize * BLOCK_SIZE..b as usize * BLOCK_SIZE];
                        dev.as_ref()?
                            .read_at(part, (pba.block + a) * BLOCK_BYTES)
                            .ok()?;
                    }
                }
                Some(buf)
            })
            .collect();
        rebuild_missing_columns(geom, &mut columns, n * BLOCK_SIZE)
            .then(|| columns[col].take())
            .flatten()
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

    /// One data block of a known row, checked against `crc`: from memory if
    /// its row is still being written, else from its member, else rebuilt
    /// from the rest of the row.
    pub(crate) fn read_data_block(
        &self,
        geom: &RowGeom,
        pba: Pba,
        crc: u32,
    ) -> Result<Vec<u8>, String> {
        if let Some(src) = self.ledger.lock().inflight_block(&self.shape.geometry, pba) {
            return Ok(src.to_vec());
        }
        if let Some(dev) = self.device(pba.member as usize) {
            let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
            if dev.read_at(&mut buf, pba.byte_offset()).is_ok() && crc32c(&buf) == crc {
                return Ok(buf.to_vec());
            }
        }
        let (col, blk) = geom
            .locate(&self.shape.geometry, pba)
            .ok_or("block outside its row")?;
        let stripe = self.read_row_stripe(geom, blk);
        rebuild_from_stripe(geom, stripe, col, |b| crc32c(b) == crc)
    }

    /// The row that holds `pba`.
    pub(crate) fn row_of(&self, pba: Pba) -> Option<RowGeom> {
        let (s, off) = self.shape.geometry.segment_of(pba.block)?;
        let ledger = self.ledger.lock();
        ledger.segments.get(s as usize)?.row_at(off).copied()
    }

    /// Rebuilds the block at `pba` (expected checksum `crc`) from the other
    /// columns of its row. Tries the plain erasure first, then additionally
    /// erases up to P-1 other columns (a second bad column) until the
    /// result matches the checksum.
    pub(crate) fn rebuild_block(&self, pba: Pba, crc: u32) -> Result<Vec<u8>, String> {
        let geom = self.row_of(pba).ok_or("no row record for this block")?;
        let (col, blk) = geom
            .locate(&self.shape.geometry, pba)
            .ok_or("block outside its row")?;
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
                let dev = self.device(pba.member as usize)?;
                let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
                dev.read_at(&mut buf, pba.byte_offset()).ok()?;
                Some(buf.to_vec())
            })
            .collect()
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
    // Unused data columns read as zero; erased ones are outputs.
    for c in columns.iter_mut().filter(|c| c.is_none()) {
        *c = Some(AlignedBuf::zeroed(len));
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
) -> Result<Vec<u8>, String> {
    let k = geom.data_capacity_columns();
    let p = geom.parity as usize;
    let width = geom.width();
    let mut missing: Vec<usize> = (0..width)
        .filter(|&c| c == target || columns[c].is_none())
        .collect();
    if missing.len() > p {
        return Err(format!(
            "{} of {} columns unreadable with {} parity",
            missing.len(),
            width,
            p
        ));
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
    Err(format!(
        "no combination of {p} parity columns reproduces the checksum"
    ))
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

fn gone(name: &str) -> Error {
    Error::NotFound(format!("volume '{name}' was deleted"))
}

/// Failed or too slow reads in a row before a member is faulted.
const BAD_READS_TO_FAULT: u64 = 8;

/// Attempts at a member write before the member is faulted (a flush gets
/// one: see `device::write_cache`).
const WRITE_ATTEMPTS: u32 = 3;

/// The bytes of column `col` of `row`: a data column from the row's buffer,
/// a parity column from `parity` (the row's parity columns, one after the
/// other).
fn column_of<'a>(row: &'a SealedRow, parity: &'a [u8], col: usize) -> &'a [u8] {
    let g = row.geom;
    let k = g.data_capacity_columns();
    if col < k {
        row.column(col)
    } else {
        let column_bytes = g.height as usize * BLOCK_SIZE;
        let p = col - k;
        &parity[p * column_bytes..(p + 1) * column_bytes]
    }
}

/// Runs a member write `op` up to `WRITE_ATTEMPTS` times, backing off a
/// little between attempts (a transient error: a bus reset, a timeout).
/// Never for a flush: a failed flush is final.
pub(crate) fn with_retries(mut op: impl FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
    let mut attempt = 1;
    loop {
        match op() {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= WRITE_ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::warn!("member I/O failed (attempt {attempt} of {WRITE_ATTEMPTS}): {e}");
                crate::sync::thread::sleep(std::time::Duration::from_millis(10 << attempt));
                attempt += 1;
            }
        }
    }
}
