//! Getting sealed rows onto the members: parity computed once per row, the
//! columns written in parallel (through the I/O pool, or one io_uring
//! submission), the member faulted if its column cannot be written, and
//! the row taken off the in-flight list (where reads and flushes find it
//! until then). Also the background row writer: the rows a user write
//! seals are written by its threads, so the request that filled a row is
//! acknowledged without waiting for the row's member writes. Must never drop
//! a row unwritten while the pool is open, nor hide a write failure.

use super::faults::with_retries;
use super::ledger::{Ledger, SealedRow};
use super::Engine;
use crate::device::{uring, AlignedBuf, Device, IoJob};
use crate::error::Result;
use crate::format::row::HeadId;
use crate::format::BLOCK_SIZE;
use crate::layout::{MemberIndex, Pba};
use std::sync::{Arc, Weak};

thread_local! {
    /// The parity buffer `write_row` used last on this thread (see there).
    static PARITY_BUFFER: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl Engine {
    /// Seals the data heads' open rows (for a flush or checkpoint).
    pub(crate) fn seal_open_rows(&self, ledger: &mut Ledger) -> Vec<Arc<SealedRow>> {
        HeadId::DATA
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
            // The buffer serves the next row unless a reader still holds it. Half the
            // in-flight limits are kept: a burst of sealed rows (one 32 MiB write seals 32 rows
            // of 1 MiB) then takes buffers kept from the last burst instead of allocating (a
            // fresh allocation this large is mapped and faulted in page by page).
            if let Ok(row) = Arc::try_unwrap(row) {
                self.ledger.lock().recycle(
                    row.buf,
                    self.options.max_inflight_rows / 2,
                    self.options.max_inflight_bytes / 2,
                );
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write_row(&self, row: &Arc<SealedRow>) -> Result<()> {
        let g = row.geom;
        // Paired with the header checks of `row_header::load_row_header` when
        // the row is read back: the header it carries names this row.
        debug_assert!(
            {
                let at = row.start_block * BLOCK_SIZE;
                let header = &row.buf[at..at + g.header_blocks as usize * BLOCK_SIZE];
                crate::format::row::RowHeader::decode(header).is_ok_and(|(h, _)| {
                    h.seq == g.seq
                        && h.segment == g.segment
                        && h.offset_blocks == g.offset
                        && h.height == g.height
                        && h.data_columns == g.data_columns
                        && h.slots == g.slots
                })
            },
            "row {} carries a header of another row",
            g.seq
        );
        assert!(
            (g.data_columns + g.parity) as u32 <= g.members_mask.count_ones()
                && g.height as u32 <= self.shape.geometry.chunk_blocks,
            "row {} does not fit its segment",
            g.seq
        );
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
                self.device(pba.member_index()).map(|dev| (col, pba, dev))
            })
            .collect();
        if uring::enabled() {
            if let Some(results) = self.write_by_ring(row, &parity, &targets) {
                PARITY_BUFFER.with(|b| *b.borrow_mut() = Some(parity));
                return self.finish_row_write(row, results);
            }
        }
        let parity = Arc::new(parity);
        let mut jobs: Vec<IoJob<(MemberIndex, std::io::Result<()>)>> = Vec::new();
        for (col, pba, dev) in targets {
            let row = row.clone();
            let parity = parity.clone();
            jobs.push(Box::new(move || {
                let bytes = column_of(&row, &parity, col);
                (
                    pba.member_index(),
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
    ) -> Option<Vec<(MemberIndex, std::io::Result<()>)>> {
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
                    (pba.member_index(), r)
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
        results: Vec<(MemberIndex, std::io::Result<()>)>,
    ) -> Result<()> {
        let mut error = None;
        for (member, r) in results {
            if let Err(e) = r {
                if let Err(e) = self.fault_member(member, "a write", e) {
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
        let done = ledger.inflight.swap_remove(i);
        ledger.inflight_bytes -= done.buf.len();
        ledger.publish_rows_in_flight(None);
        self.progress.notify_all();
        error.map_or(Ok(()), Err)
    }

    /// Starts the background row writer's threads: each writes the batches
    /// it takes with `write_rows` (a failure faults the member or stops the
    /// pool writing, and is reported by the next flush or write).
    pub(crate) fn start_row_writer(self: &Arc<Self>) {
        let weak: Weak<Engine> = Arc::downgrade(self);
        self.row_writer.start(Arc::new(move |rows| {
            if let Some(engine) = weak.upgrade() {
                let _ = engine.guarded("writing rows", || engine.write_rows(rows));
            }
        }));
    }

    /// Writes `rows` (just sealed by a user write) in the background, or
    /// here if the row writer's queue is full or stopped.
    pub(crate) fn submit_rows(&self, rows: Vec<Arc<SealedRow>>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        match self.row_writer.offer(rows) {
            None => Ok(()),
            Some(rows) => self.write_rows(rows),
        }
    }
}

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
