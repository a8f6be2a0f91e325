//! What the background thread looks at about once a second: members whose
//! drive is gone (faulted at once, `check_members_present`) and free space
//! running low (a warning each time it gets low, with how much can still
//! be written, and a line when it recovers). Owns the low-space threshold.

use super::ledger::Ledger;
use super::Engine;
use crate::format::BLOCK_BYTES;
use std::time::{Duration, Instant};

/// Free space below this share of the usable space is "low" (status says
/// so, `status -x` exits 1, the log warns).
pub const LOW_SPACE_PERCENT: u64 = 10;

/// How often the background thread watches.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

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
        self.check_space();
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
