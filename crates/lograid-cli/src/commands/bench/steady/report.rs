//! The JSON report (the schema bench/steady_report.py reads, shared with
//! the peers' script) and the steady figures of a run: the means over the
//! windows that met the convergence rule.

use super::converge::Rule;
use super::latency::Histogram;
use super::load::{Outcome, Stop};
use lograid::CleanerPolicy;
use serde::Serialize;

/// The empty-volume baseline.
#[derive(Serialize, Clone, Copy, Default)]
pub struct Latency {
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// One window: a fixed amount of user data written.
#[derive(Serialize, Clone, Debug)]
pub struct Window {
    pub index: usize,
    /// Seconds since the overwrite began.
    pub t_start: f64,
    pub t_end: f64,
    /// User bytes the writers had written since the overwrite began, at
    /// the window's start and end.
    pub start_bytes: u64,
    pub end_bytes: u64,
    /// The pool's counters over the window.
    pub user_bytes: u64,
    pub member_bytes: u64,
    pub wa: f64,
    pub iops: f64,
    pub mb_per_s: f64,
    /// Free segments at the window's end.
    pub free_segments: usize,
    /// Segments emptied at the window's end that wait for a flush or a
    /// checkpoint before they are free.
    pub pending_free_segments: usize,
    pub segments_cleaned: u64,
    pub relocated_bytes: u64,
    /// Relocated by writers out of room, who waited for it (the rest was
    /// relocated in the background).
    pub foreground_relocated_bytes: u64,
    /// Relocated from segments the cleaner's own head had written: cold
    /// data moved again (blocks relocated before, and user writes the
    /// engine judged long-lived).
    pub relocated_again_bytes: u64,
    /// Those two over `relocated_bytes` (null with nothing relocated). The
    /// engine counts them per segment cleaned and `relocated_bytes` per
    /// block moved: a window shorter than a cleaning pass may show more
    /// than 1.
    pub foreground_share: Option<f64>,
    pub relocated_again_share: Option<f64>,
    /// User bytes written to the cleaner's head, judged long-lived.
    pub long_lived_written_bytes: u64,
    pub write_stall_seconds: f64,
    /// Client flushes per second and member flushes per client flush (sync:N).
    pub flushes_per_s: Option<f64>,
    pub member_flushes_per_flush: Option<f64>,
    /// After the warm-up (`--steady-warmup` overwrites): counts towards
    /// steady state.
    pub eligible: bool,
    /// One of the windows the steady figures are taken from.
    pub steady: bool,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// The longest write that ended in the window.
    pub max_us: f64,
}

impl Window {
    /// The progress line on stderr.
    pub fn line(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
        let mut s = format!(
            "  window {:>3} {:>6.1}-{:>6.1} s: WA {:.2}, {:>7.0} IOPS, {:>6.1} MB/s, {:>4} free segments ({} pending), {} MiB relocated (foreground {}, again {}){}",
            self.index,
            self.t_start,
            self.t_end,
            self.wa,
            self.iops,
            self.mb_per_s,
            self.free_segments,
            self.pending_free_segments,
            self.relocated_bytes >> 20,
            pct(self.foreground_share),
            pct(self.relocated_again_share),
            if self.eligible { "" } else { " [warm-up]" },
        );
        if let Some(f) = self.flushes_per_s {
            s += &format!(", {f:.0} flushes/s");
        }
        s
    }
}

#[derive(Serialize)]
pub struct SteadyRun {
    /// Null for sync:N (an empty volume).
    pub fill: Option<f64>,
    pub pattern: String,
    pub volume_bytes: u64,
    pub window_bytes: u64,
    pub warmup_bytes: u64,
    /// Steady state reached before a limit.
    pub converged: bool,
    /// What ended the run: steady, time_limit (--steady-max-seconds) or
    /// byte_limit (sync:N: an eighth of the capacity written).
    pub stopped_by: Stop,
    /// The windows the steady figures are the mean of: the converged ones,
    /// else the last three.
    pub steady_windows: Vec<usize>,
    pub wa_steady: Option<f64>,
    pub iops_steady: Option<f64>,
    pub mb_per_s_steady: Option<f64>,
    /// Latency percentiles and the longest write over the steady windows
    /// (each write counted in the window where it ended).
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// The longest write that ended after the last window (in flight when
    /// the run stopped, or in the dropped partial window).
    pub max_us_after_windows: f64,
    /// Shares of the relocated bytes over the steady windows.
    pub foreground_share: Option<f64>,
    pub relocated_again_share: Option<f64>,
    pub free_segments_steady: Option<f64>,
    /// sync:N only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flush_every: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flushes_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member_flushes_per_flush: Option<f64>,
    /// The whole overwrite, up to the end of the flush and checkpoint after it.
    pub seconds: f64,
    pub user_bytes: u64,
    pub member_bytes: u64,
    pub wa: f64,
    pub iops: f64,
    pub relocated_bytes: u64,
    pub segments_cleaned: u64,
    pub write_stalls: u64,
    pub map_bytes_per_block_sequential: Option<f64>,
    pub map_bytes_per_block_random: f64,
    pub windows: Vec<Window>,
}

/// The steady figures of an outcome, filled into `run`.
pub fn steady_figures(run: &mut SteadyRun, outcome: &mut Outcome, rule: Rule) {
    let was: Vec<f64> = outcome.windows.iter().map(|w| w.wa).collect();
    let (converged, range) = rule.reported(&was, outcome.first_eligible);
    run.converged = converged;
    run.steady_windows = range.clone().collect();
    let steady = &mut outcome.windows[range.clone()];
    for w in steady.iter_mut() {
        w.steady = true;
    }
    let steady = &outcome.windows[range.clone()];
    if steady.is_empty() {
        return;
    }
    let mean = |f: &dyn Fn(&Window) -> f64| steady.iter().map(f).sum::<f64>() / steady.len() as f64;
    run.wa_steady = Some(mean(&|w| w.wa));
    run.iops_steady = Some(mean(&|w| w.iops));
    run.mb_per_s_steady = Some(mean(&|w| w.mb_per_s));
    run.free_segments_steady = Some(mean(&|w| w.free_segments as f64));
    let relocated: u64 = steady.iter().map(|w| w.relocated_bytes).sum();
    let share = |part: &dyn Fn(&Window) -> u64| {
        let parts: u64 = steady.iter().map(part).sum();
        (relocated > 0).then(|| parts as f64 / relocated as f64)
    };
    run.foreground_share = share(&|w| w.foreground_relocated_bytes);
    run.relocated_again_share = share(&|w| w.relocated_again_bytes);
    if run.flush_every.is_some() {
        run.flushes_per_s = Some(mean(&|w| w.flushes_per_s.unwrap_or(0.0)));
        run.member_flushes_per_flush = Some(mean(&|w| w.member_flushes_per_flush.unwrap_or(0.0)));
    }
    let mut lat = Histogram::default();
    for h in outcome.latencies.get(range).unwrap_or_default() {
        lat.add(h);
    }
    run.p50_us = lat.percentile_us(0.5);
    run.p99_us = lat.percentile_us(0.99);
    run.p999_us = lat.percentile_us(0.999);
    run.max_us = lat.max_us();
}

/// The longest write that ended after the last whole window.
pub fn max_after_windows(outcome: &Outcome) -> f64 {
    outcome
        .latencies
        .iter()
        .skip(outcome.windows.len())
        .map(Histogram::max_us)
        .fold(0.0, f64::max)
}

/// How windows are cut and when a run is steady.
#[derive(Serialize)]
pub struct Setup {
    /// A window is this share of the volume's size written.
    pub window_fraction: f64,
    /// sync:N: windows of a 64th of the capacity, at most this many
    /// bytes; the run stops after an eighth of the capacity written.
    pub sync_window_bytes: u64,
    pub windows_needed: usize,
    pub tolerance: f64,
    /// Volume overwrites before windows count (none for sync:N).
    pub warmup_overwrites: f64,
    pub max_seconds: f64,
    pub block_size: u64,
}

#[derive(Serialize)]
pub struct SteadyReport {
    pub stack: String,
    pub policy: CleanerPolicy,
    pub date: String,
    pub machine: String,
    pub members: usize,
    pub parity: u8,
    pub member_size: u64,
    pub capacity_bytes: u64,
    pub queue_depth: usize,
    pub setup: Setup,
    pub empty: Latency,
    pub runs: Vec<SteadyRun>,
}

#[cfg(test)]
mod tests {
    use super::super::converge::RULE;
    use super::*;
    use std::time::Duration;

    fn window(index: usize, wa: f64, eligible: bool) -> Window {
        Window {
            index,
            t_start: index as f64,
            t_end: index as f64 + 1.0,
            start_bytes: index as u64 * 100,
            end_bytes: index as u64 * 100 + 100,
            user_bytes: 100,
            member_bytes: (wa * 100.0) as u64,
            wa,
            iops: 1000.0 * (index + 1) as f64,
            mb_per_s: 4.0,
            free_segments: 10,
            pending_free_segments: 1,
            segments_cleaned: 1,
            relocated_bytes: 100,
            foreground_relocated_bytes: 25,
            relocated_again_bytes: 0,
            foreground_share: Some(0.25),
            relocated_again_share: Some(0.0),
            long_lived_written_bytes: 0,
            write_stall_seconds: 0.0,
            flushes_per_s: None,
            member_flushes_per_flush: None,
            eligible,
            steady: false,
            p50_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
        }
    }

    fn empty_run() -> SteadyRun {
        SteadyRun {
            fill: Some(0.75),
            pattern: "uniform".into(),
            volume_bytes: 400,
            window_bytes: 100,
            warmup_bytes: 400,
            converged: false,
            stopped_by: Stop::TimeLimit,
            steady_windows: Vec::new(),
            wa_steady: None,
            iops_steady: None,
            mb_per_s_steady: None,
            p50_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
            max_us_after_windows: 0.0,
            foreground_share: None,
            relocated_again_share: None,
            free_segments_steady: None,
            flush_every: None,
            flushes_per_s: None,
            member_flushes_per_flush: None,
            seconds: 0.0,
            user_bytes: 0,
            member_bytes: 0,
            wa: 0.0,
            iops: 0.0,
            relocated_bytes: 0,
            segments_cleaned: 0,
            write_stalls: 0,
            map_bytes_per_block_sequential: None,
            map_bytes_per_block_random: 0.0,
            windows: Vec::new(),
        }
    }

    fn outcome(was: &[(f64, bool)]) -> Outcome {
        let windows: Vec<Window> = was
            .iter()
            .enumerate()
            .map(|(i, &(wa, e))| window(i, wa, e))
            .collect();
        let latencies = (0..=windows.len())
            .map(|i| {
                let mut h = Histogram::default();
                h.record(Duration::from_micros(100 * (i as u64 + 1)));
                h
            })
            .collect();
        Outcome {
            stopped_by: Stop::Steady,
            first_eligible: was.iter().position(|w| w.1).unwrap_or(was.len()),
            windows,
            seconds: 9.0,
            ops: 0,
            latencies,
        }
    }

    #[test]
    fn steady_figures_are_the_means_of_the_converged_windows() {
        let mut o = outcome(&[
            (1.0, false),
            (2.0, false),
            (3.0, true),
            (3.1, true),
            (3.05, true),
        ]);
        let mut run = empty_run();
        steady_figures(&mut run, &mut o, RULE);
        assert!(run.converged);
        assert_eq!(run.steady_windows, [2, 3, 4]);
        assert!((run.wa_steady.unwrap() - 3.05).abs() < 1e-9);
        assert!((run.iops_steady.unwrap() - 4000.0).abs() < 1e-9);
        assert_eq!(run.foreground_share, Some(0.25));
        assert_eq!(run.relocated_again_share, Some(0.0));
        // Latencies of windows 2..5 only: 300, 400 and 500 µs.
        assert!((run.p50_us / 400.0 - 1.0).abs() < 0.04, "{}", run.p50_us);
        assert_eq!(run.max_us, 500.0);
        // The writes that ended after window 4: 600 µs.
        assert_eq!(max_after_windows(&o), 600.0);
        assert!(o
            .windows
            .iter()
            .map(|w| w.steady)
            .eq([false, false, true, true, true]));
    }

    #[test]
    fn without_steady_state_the_last_three_windows_are_reported() {
        let mut o = outcome(&[(1.0, true), (2.0, true), (3.0, true), (4.0, true)]);
        let mut run = empty_run();
        steady_figures(&mut run, &mut o, RULE);
        assert!(!run.converged);
        assert_eq!(run.steady_windows, [1, 2, 3]);
        assert!((run.wa_steady.unwrap() - 3.0).abs() < 1e-9);
        let mut none = outcome(&[]);
        let mut run = empty_run();
        steady_figures(&mut run, &mut none, RULE);
        assert!(!run.converged && run.wa_steady.is_none() && run.steady_windows.is_empty());
    }
}
