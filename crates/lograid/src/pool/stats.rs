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
    /// Blocks relocated by writers out of room (the rest: in the
    /// background), and blocks relocated from segments the cleaner's head
    /// had written (data that had lived long already).
    pub foreground_relocated_blocks: u64,
    pub relocated_again_blocks: u64,
    /// (seconds since open, user bytes, member bytes, relocated blocks),
    /// one per second at most, the last ~70 s.
    pub samples: std::collections::VecDeque<(f64, u64, u64, u64)>,
    pub opened: Option<std::time::Instant>,
    /// State changes (faults, replacements, repairs): (unix time, message).
    pub events: std::collections::VecDeque<(u64, String)>,
    /// When the background thread last looked at the members' presence
    /// and the free space (`Engine::watch`).
    pub last_watch: Option<std::time::Instant>,
    /// Free space is below `LOW_SPACE_PERCENT` of usable (warned once
    /// each time it gets there).
    pub low_space: bool,
    /// Per member index: slow calls already logged, and when the last
    /// line about them was (`Engine::check_slow_io`).
    pub slow_io_logged: Vec<(u64, Option<std::time::Instant>)>,
    /// Lines about repaired blocks allowed in the log (rate limit).
    pub repair_lines: LogBudget,
    /// Lines about writes refused for want of space (rate limit).
    pub no_space_lines: LogBudget,
    /// Blocks reads or scrubs found lost (more bad columns than parity)
    /// since the pool was opened.
    pub lost_blocks_seen: u64,
}

/// A rate limit for a kind of log line: `LINES_PER_WINDOW` lines per
/// `WINDOW`, then one line saying how many were left out.
#[derive(Debug, Default)]
pub struct LogBudget {
    window_start: Option<std::time::Instant>,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    const LINES_PER_WINDOW: u32 = 20;
    const WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

    /// Whether a line may be logged now (`Log`, with how many lines were
    /// left out since the last one that was), or not (`Quiet`; the first
    /// time in a window, `StartQuiet`, to say so).
    pub fn take(&mut self) -> LogTurn {
        let now = std::time::Instant::now();
        if self
            .window_start
            .is_none_or(|t| now.duration_since(t) >= Self::WINDOW)
        {
            self.window_start = Some(now);
            self.used = 0;
        }
        if self.used >= Self::LINES_PER_WINDOW {
            self.suppressed += 1;
            return if self.suppressed == 1 {
                LogTurn::StartQuiet
            } else {
                LogTurn::Quiet
            };
        }
        self.used += 1;
        LogTurn::Log {
            left_out: std::mem::take(&mut self.suppressed),
        }
    }
}

/// What `LogBudget::take` allows.
#[derive(Debug, PartialEq, Eq)]
pub enum LogTurn {
    Log { left_out: u64 },
    StartQuiet,
    Quiet,
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
    /// When progress was last logged.
    pub progress_logged: Option<Instant>,
}

/// What recovery did, printed on open.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RecoveryReport {
    pub checkpoint_id: u64,
    pub rows_replayed: u64,
    pub blocks_replayed: u64,
    pub duration: Duration,
    /// Of `duration`, the check of the bookkeeping recovery rebuilt
    /// (`Ledger::check_invariants`: every map entry in a data slot of a
    /// row, live counts, the free list, the heads, the overlays).
    #[serde(default)]
    pub checked: Duration,
    pub missing_members: Vec<usize>,
}
