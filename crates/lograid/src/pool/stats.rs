//! What the engine keeps about itself while a pool is open and does not
//! persist: run-time counters and rate samples, the cleaner's and the
//! reshape's state, the recent events an operator must know about, and what
//! recovery did on open. Written by the engine's paths, read by `status`.
//! Owns no pool data: losing it loses nothing but figures.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What the cleaner is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanerState {
    /// Enough free segments.
    #[default]
    Idle,
    /// Below the watermark: cleaning in the background.
    Background,
    /// A writer found no free segment and is cleaning in the foreground.
    Urgent,
}

impl CleanerState {
    pub fn name(self) -> &'static str {
        match self {
            CleanerState::Idle => "idle",
            CleanerState::Background => "background",
            CleanerState::Urgent => "urgent",
        }
    }
}

/// Counters kept while a pool is open, and samples for rates.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    pub cleaner_state: CleanerState,
    pub segments_cleaned: u64,
    pub discarded_bytes: u64,
    /// Writes that waited for the cleaner, and how long in total.
    pub write_stalls: u64,
    pub write_stall_ns: u64,
    /// (seconds since open, user bytes, member bytes, relocated blocks),
    /// one per second at most, the last ~70 s.
    pub samples: std::collections::VecDeque<(f64, u64, u64, u64)>,
    pub opened: Option<std::time::Instant>,
    /// State changes (faults, replacements, repairs): (unix time, message).
    pub events: std::collections::VecDeque<(u64, String)>,
}

impl RuntimeStats {
    /// Records a sample of the cumulative counters (at most one a second).
    pub fn sample(&mut self, user_bytes: u64, member_bytes: u64, relocated: u64) {
        let opened = *self.opened.get_or_insert_with(std::time::Instant::now);
        let t = opened.elapsed().as_secs_f64();
        if self.samples.back().is_some_and(|s| t - s.0 < 1.0) {
            return;
        }
        self.samples
            .push_back((t, user_bytes, member_bytes, relocated));
        while self.samples.len() > 2 && t - self.samples[1].0 >= 60.0 {
            self.samples.pop_front();
        }
    }
}

/// Reshape counters kept while the pool is open.
#[derive(Debug, Default)]
pub(crate) struct ReshapeStats {
    pub started: Option<Instant>,
    pub segments_done: u64,
    pub bytes_moved: u64,
    /// Time spent moving (not throttled).
    pub busy_seconds: f64,
    /// When removals were last tried while segments still used the member.
    pub last_finish_attempt: Option<Instant>,
    /// Segments whose live blocks could not all be read: not tried again.
    pub stuck: std::collections::BTreeSet<u32>,
    /// Users did I/O during the last background step: the next one keeps
    /// to one thread (a rebuild in place otherwise uses a few).
    pub users_busy: bool,
}

/// What recovery did, printed on open.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RecoveryReport {
    pub checkpoint_id: u64,
    pub rows_replayed: u64,
    pub blocks_replayed: u64,
    pub duration: Duration,
    pub missing_members: Vec<usize>,
}
