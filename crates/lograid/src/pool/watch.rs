//! What the background thread looks at about once a second: members whose
//! drive is gone (faulted at once, `check_members_present`), members whose
//! calls are slow (a warning per member at most every `SLOW_IO_LOG_EVERY`,
//! with what was slow since the last one) and free space running low (a
//! warning each time it gets low, with how much can still be written, and a
//! line when it recovers). Owns the low-space threshold.

use super::ledger::Ledger;
use super::Engine;
use crate::device::SLOW_IO;
use crate::format::BLOCK_BYTES;
use std::time::{Duration, Instant};

/// Free space below this share of the usable space is "low" (status says
/// so, `status -x` exits 1, the log warns).
pub const LOW_SPACE_PERCENT: u64 = 10;

/// How often the background thread watches.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Lines about one member's slow calls, at most one per this long.
const SLOW_IO_LOG_EVERY: Duration = Duration::from_secs(10);

impl Ledger {
    /// Blocks that can still be written: usable, less what is stored and
    /// what held sub-block writes have reserved.
    pub fn free_blocks(&self) -> u64 {
        self.usable_blocks
            .saturating_sub(self.stored_blocks + self.overlays.unstored())
    }

    /// Whether free space is below `LOW_SPACE_PERCENT` of usable.
    pub fn space_is_low(&self) -> bool {
        self.free_blocks() * 100 < self.usable_blocks * LOW_SPACE_PERCENT
    }
}

impl Engine {
    /// Runs the watches if a second has passed since the last time.
    pub(crate) fn watch(&self) {
        {
            let mut stats = self.stats.lock();
            let now = Instant::now();
            if stats.last_watch.is_some_and(|t| now - t < WATCH_INTERVAL) {
                return;
            }
            stats.last_watch = Some(now);
        }
        self.check_members_present();
        self.check_slow_io();
        self.check_space();
    }

    /// Logs members whose calls took longer than `SLOW_IO` since the last
    /// line about them (at most one line per member per `SLOW_IO_LOG_EVERY`;
    /// what is held back is in the next line).
    fn check_slow_io(&self) {
        let now = Instant::now();
        for (m, dev) in self.open_devices() {
            let v = dev.latency.values();
            let slow = v.slow();
            let mut stats = self.stats.lock();
            if stats.slow_io_logged.len() <= m.0 {
                stats.slow_io_logged.resize(m.0 + 1, (0, None));
            }
            let (logged, last) = stats.slow_io_logged[m.0];
            if slow <= logged || last.is_some_and(|t| now - t < SLOW_IO_LOG_EVERY) {
                continue;
            }
            stats.slow_io_logged[m.0] = (slow, Some(now));
            drop(stats);
            tracing::warn!(
                "member {m} ({}): {} calls took over {} s (slow I/O; {} since the pool was \
                 opened: {} reads, {} writes, {} flushes); a drive that keeps doing this is \
                 failing, overloaded or on a path that keeps retrying",
                dev.member.describe(),
                slow - logged,
                SLOW_IO.as_secs_f64(),
                slow,
                v.reads.beyond_last_bound(),
                v.writes.beyond_last_bound(),
                v.flushes.beyond_last_bound()
            );
        }
    }

    /// Logs free space getting low (once each time) and recovering.
    fn check_space(&self) {
        let (low, free_bytes, usable_bytes) = {
            let ledger = self.ledger.lock();
            (
                ledger.space_is_low(),
                ledger.free_blocks() * BLOCK_BYTES,
                ledger.usable_blocks * BLOCK_BYTES,
            )
        };
        let was_low = std::mem::replace(&mut self.stats.lock().low_space, low);
        match (was_low, low) {
            (false, true) => self.event(format!(
                "pool '{}' is low on space: {} MiB can still be written ({} MiB usable{}); \
                 writes of new blocks fail with ENOSPC when it runs out: trim or delete data, \
                 or add or replace members",
                self.shape.pool_name,
                free_bytes >> 20,
                usable_bytes >> 20,
                if self.lost_members(&self.ledger.lock()) > 0 {
                    " while degraded"
                } else {
                    ""
                }
            )),
            (true, false) => tracing::info!(
                "pool '{}': free space recovered: {} MiB can be written",
                self.shape.pool_name,
                free_bytes >> 20
            ),
            _ => {}
        }
    }
}
