//! Scrub: reads every row the pool holds (data, headers and parity columns),
//! checks every block against its row header's checksums and the parity
//! against the data, rewrites what it can rebuild, and reports by volume
//! and offset the live blocks it cannot (rows being rebuilt in place are
//! left to that rebuild, which checks them). Rows are immutable once written,
//! so a row's parity covers its dead blocks too and a clean pool scrubs
//! with nothing to report.

use super::ledger::SegState;
use super::stripe::FoundRow;
use super::Engine;
use crate::error::Result;
use crate::format::BLOCK_BYTES;
use crate::layout::RowGeom;
use crate::map::Loc;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A live block a scrub could not repair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostBlock {
    pub volume: String,
    /// Byte offset in the volume (of a 4 KiB block).
    pub offset: u64,
}

/// What a scrub did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScrubReport {
    pub rows_checked: u64,
    pub bytes_read: u64,
    /// Blocks (data, header or parity) found wrong and rewritten.
    pub repaired_blocks: u64,
    /// Live blocks that could not be rebuilt (more bad columns than parity).
    pub lost_blocks: Vec<LostBlock>,
    /// Rows whose header could not be read or rebuilt.
    pub unreadable_rows: u64,
    /// Blocks whose member could not be read (rebuilt from parity and
    /// written back when repairing; a member that keeps failing reads is
    /// faulted), not counted as repaired.
    #[serde(default)]
    pub unreadable_blocks: u64,
    pub duration: Duration,
    /// Whether the scrub ran to the end (false: stopped by the caller).
    pub complete: bool,
}

impl ScrubReport {
    pub fn is_clean(&self) -> bool {
        self.repaired_blocks == 0 && self.lost_blocks.is_empty() && self.unreadable_rows == 0
    }
}

/// Rows checked at once.
const SCRUB_THREADS: usize = 4;

impl Engine {
    /// Scrubs every row; `progress(done, total)` is called every 20 ms or
    /// so and last with `done == total`, and stops the scrub when it
    /// returns false. With `repair` false,
    /// nothing is written (a check).
    pub(crate) fn scrub(
        &self,
        repair: bool,
        progress: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<ScrubReport> {
        let started = Instant::now();
        tracing::info!(
            "scrub of pool '{}' started ({})",
            self.shape.pool_name,
            if repair { "repairing" } else { "check only" }
        );
        if repair {
            // Rows still in memory reach the members first.
            self.flush_log()?;
            self.checkpoint_log_if_due()?;
        }
        let rows: Vec<RowGeom> = {
            let ledger = self.ledger.lock();
            ledger
                .segments
                .iter()
                .filter(|s| {
                    matches!(
                        s.state,
                        SegState::Sealed | SegState::Open(_) | SegState::Checkpoint
                    )
                })
                .flat_map(|s| s.rows.to_vec())
                .collect()
        };
        let total = rows.len() as u64;
        // Rows are checked by `SCRUB_THREADS` workers, so that one row's
        // reads overlap another's checking. This thread reports progress;
        // while `progress` runs (it may pause the scrub) the workers wait
        // between rows, holding no lock.
        let next = AtomicUsize::new(0);
        let done = AtomicU64::new(0);
        let (hold, stop) = (AtomicBool::new(false), AtomicBool::new(false));
        let mut report = crate::sync::thread::scope(|scope| {
            let workers: Vec<_> = (0..SCRUB_THREADS)
                .map(|_| {
                    let (rows, next, done, hold, stop) = (&rows, &next, &done, &hold, &stop);
                    scope.spawn(move || {
                        let mut report = ScrubReport::default();
                        loop {
                            while hold.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                                crate::sync::thread::sleep(Duration::from_millis(10));
                            }
                            if stop.load(Ordering::SeqCst) {
                                break;
                            }
                            let Some(geom) = rows.get(next.fetch_add(1, Ordering::SeqCst)) else {
                                break;
                            };
                            self.scrub_row_if_live(geom, repair, &mut report);
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        report
                    })
                })
                .collect();
            let mut logged = Instant::now();
            loop {
                let d = done.load(Ordering::SeqCst);
                if logged.elapsed() >= Duration::from_secs(10) {
                    logged = Instant::now();
                    tracing::info!(
                        "scrub of pool '{}': {d} of {total} rows checked",
                        self.shape.pool_name
                    );
                }
                hold.store(true, Ordering::SeqCst);
                let go_on = progress(d, total);
                hold.store(false, Ordering::SeqCst);
                if !go_on {
                    stop.store(true, Ordering::SeqCst);
                }
                if !go_on || d >= total {
                    break;
                }
                crate::sync::thread::sleep(Duration::from_millis(20));
            }
            let mut report = ScrubReport::default();
            for w in workers {
                let r = w.join().expect("scrub worker");
                report.rows_checked += r.rows_checked;
                report.bytes_read += r.bytes_read;
                report.repaired_blocks += r.repaired_blocks;
                report.lost_blocks.extend(r.lost_blocks);
                report.unreadable_rows += r.unreadable_rows;
                report.unreadable_blocks += r.unreadable_blocks;
            }
            report
        });
        if stop.load(Ordering::SeqCst) {
            report.duration = started.elapsed();
            return Ok(report);
        }
        if repair && report.repaired_blocks + report.unreadable_blocks > 0 {
            // Repairs are plain writes: make them durable.
            self.sync_members()?;
        }
        report.complete = true;
        report.duration = started.elapsed();
        let summary = format!(
            "scrub of pool '{}' finished in {:.1} s: {} rows ({} MiB) checked, {} blocks {}, \
             {} blocks unreadable, {} live blocks lost, {} unreadable rows",
            self.shape.pool_name,
            report.duration.as_secs_f64(),
            report.rows_checked,
            report.bytes_read >> 20,
            report.repaired_blocks,
            if repair { "repaired" } else { "wrong" },
            report.unreadable_blocks,
            report.lost_blocks.len(),
            report.unreadable_rows
        );
        if report.is_clean() {
            tracing::info!("{summary}");
        } else {
            self.event(summary);
        }
        self.stats.lock().lost_blocks_seen += report.lost_blocks.len() as u64;
        Ok(report)
    }

    /// Scrubs one row unless its segment was freed since the list was made,
    /// holding off segment reuse meanwhile.
    fn scrub_row_if_live(&self, geom: &RowGeom, repair: bool, report: &mut ScrubReport) {
        let _r = self.reuse.read();
        let (still_there, rebuilding) = {
            let ledger = self.ledger.lock();
            let seg = &ledger.segments[geom.segment as usize];
            (
                !matches!(seg.state, SegState::Free | SegState::PendingFree { .. })
                    && seg.rows.read().contains(geom),
                self.rebuilding_members(&ledger),
            )
        };
        // A row that a member rebuilt in place does not hold yet is checked
        // by that rebuild (every checksum, before its column is written).
        let stale =
            |m: usize| rebuilding & (1 << m) != 0 && self.shape.stale[m].contains(geom.segment);
        if still_there && !(0..self.shape.stale.len()).any(stale) {
            self.scrub_row(geom, repair, report);
        }
    }

    /// Counts each wrong block against its member (as a checksum error
    /// found) and logs it, naming the volume block it holds if it is live.
    fn note_scrub_repairs(&self, row: &FoundRow, wrong: &[(usize, usize)], repair: bool) {
        let geom = &row.geom;
        for &(col, blk) in wrong {
            let pba = geom.pba(&self.shape.geometry, col, blk);
            if let Some(dev) = self.device_any(pba.member_index()) {
                dev.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
            }
            let holds = self.live_block_at(row, col, blk).map_or_else(
                || "a header, parity or unused block".to_string(),
                |(volume, offset)| format!("volume '{volume}' offset {offset}"),
            );
            self.log_repair(format_args!(
                "scrub: member {} ({}) block {}: wrong ({holds}); {}",
                pba.member,
                self.member_name(pba.member_index()),
                pba.block,
                if repair {
                    "repaired from parity"
                } else {
                    "not repaired (check only)"
                }
            ));
        }
    }

    /// The volume and byte offset of the live block at (column, block) of
    /// a row, if that position holds one.
    fn live_block_at(&self, row: &FoundRow, col: usize, blk: usize) -> Option<(String, u64)> {
        let geom = &row.geom;
        let i = col * geom.height as usize + blk;
        let slot = i.checked_sub(geom.header_blocks as usize)?;
        let entry = row
            .header
            .entries
            .iter()
            .filter(|e| e.kind.owns_slot())
            .nth(slot)?;
        let pba = geom.pba(&self.shape.geometry, col, blk);
        let ledger = self.ledger.lock();
        let v = ledger.volume(entry.volume)?;
        let here = v.map().get(entry.lba).0 == Loc::Disk(pba);
        here.then(|| (v.name.clone(), entry.lba * BLOCK_BYTES))
    }

    fn scrub_row(&self, geom: &RowGeom, repair: bool, report: &mut ScrubReport) {
        report.rows_checked += 1;
        report.bytes_read += geom.written_blocks() * BLOCK_BYTES;
        let Some(row) = self.load_known_row(geom) else {
            tracing::error!(
                "scrub: row at segment {} offset {}: header unreadable",
                geom.segment,
                geom.offset
            );
            report.unreadable_rows += 1;
            return;
        };
        let check = self.check_row(&row, repair);
        report.repaired_blocks += check.wrong.len() as u64;
        report.unreadable_blocks += check.unreadable.len() as u64;
        self.note_scrub_repairs(&row, &check.wrong, repair);
        if check.unrepairable.is_empty() {
            return;
        }
        // Which of the lost positions hold live blocks, and of which volume?
        for (col, blk) in check.unrepairable {
            if let Some((volume, offset)) = self.live_block_at(&row, col, blk) {
                tracing::error!(
                    "scrub: volume '{volume}' offset {offset}: block lost (more bad columns than parity)"
                );
                report.lost_blocks.push(LostBlock { volume, offset });
            }
        }
    }
}
