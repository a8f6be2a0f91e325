//! The writers and the window sampler: `threads` writers write what a
//! pattern's generator says (flushing every N writes for `sync:N`) while
//! this thread cuts the run into windows of a fixed number of user bytes,
//! reads the pool's counters at each window's end, and stops at steady state
//! (the convergence rule), at a byte limit or at the time limit.

use super::converge::Rule;
use super::latency::Histogram;
use super::pattern::{Generator, Position, Rng};
use super::report::Window;
use anyhow::{anyhow, Result};
use lograid::{Pool, PoolStatus, Volume};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a load is cut into windows and when it stops.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// User bytes per window.
    pub window_bytes: u64,
    /// Windows count towards steady state only from this many user bytes
    /// on (`--steady-warmup` overwrites of the volume, one by default).
    pub warmup_bytes: u64,
    pub max_seconds: f64,
    /// Stop once this many bytes are written (the empty baseline, sync:N).
    pub byte_limit: Option<u64>,
    /// None: no convergence check (run to a limit).
    pub rule: Option<Rule>,
    /// Print a line per window on stderr.
    pub verbose: bool,
}

/// Why a load stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    Steady,
    TimeLimit,
    ByteLimit,
    /// A writer failed (the run returns its error).
    Failed,
}

/// What the writers share with the sampler.
struct Progress {
    bytes: AtomicU64,
    ops: AtomicU64,
    flushes: AtomicU64,
    window: AtomicUsize,
    stop: AtomicBool,
    start: Instant,
}

/// The pool's counters and the writers' at one moment.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    seconds: f64,
    issued: u64,
    ops: u64,
    flushes: u64,
    user: u64,
    member: u64,
    member_flushes: u64,
    relocated: u64,
    foreground: u64,
    again: u64,
    long_lived: u64,
    free_segments: usize,
    pending_free_segments: usize,
    segments_cleaned: u64,
    write_stall_seconds: f64,
}

impl Snapshot {
    fn take(status: &PoolStatus, p: &Progress) -> Snapshot {
        Snapshot {
            seconds: p.start.elapsed().as_secs_f64(),
            issued: p.bytes.load(Ordering::Relaxed),
            ops: p.ops.load(Ordering::Relaxed),
            flushes: p.flushes.load(Ordering::Relaxed),
            user: status.counters.user_bytes_written,
            member: status.member_bytes_written,
            member_flushes: status.members.iter().map(|m| m.counters.flushes).sum(),
            relocated: status.cleaner.relocated_bytes,
            foreground: status.cleaner.foreground_relocated_bytes,
            again: status.cleaner.relocated_again_bytes,
            long_lived: status.cleaner.long_lived_written_bytes,
            free_segments: status.segments_free,
            pending_free_segments: status.segments_pending_free,
            segments_cleaned: status.cleaner.segments_cleaned,
            write_stall_seconds: status.cleaner.write_stall_seconds,
        }
    }
}

/// A finished load: its windows (the last, partial one dropped) and its
/// totals.
pub struct Outcome {
    pub stopped_by: Stop,
    pub windows: Vec<Window>,
    /// Index of the first window that counts towards steady state.
    pub first_eligible: usize,
    pub seconds: f64,
    pub ops: u64,
    /// Latencies per window (the last one: after the last full window).
    pub latencies: Vec<Histogram>,
}

impl Outcome {
    pub fn all_latencies(&self) -> Histogram {
        let mut all = Histogram::default();
        for h in &self.latencies {
            all.add(h);
        }
        all
    }
}

/// Runs `generator`'s writes on `volume` from `threads` writers until the
/// plan says stop.
pub fn run(
    pool: &Pool,
    volume: &Volume,
    generator: Arc<Generator>,
    threads: usize,
    flush_every: Option<u32>,
    plan: Plan,
) -> Result<Outcome> {
    let progress = Arc::new(Progress {
        bytes: AtomicU64::new(0),
        ops: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
        window: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        start: Instant::now(),
    });
    let mut prev = Snapshot::take(&pool.status(), &progress);
    let writers = spawn_writers(volume, &generator, threads, flush_every, &progress);
    let mut windows: Vec<Window> = Vec::new();
    let mut first_eligible: Option<usize> = None;
    let rule = plan.rule;
    let stopped_by = loop {
        std::thread::sleep(Duration::from_millis(20));
        if progress.stop.load(Ordering::Relaxed) {
            break Stop::Failed;
        }
        let issued = progress.bytes.load(Ordering::Relaxed);
        if plan.byte_limit.is_some_and(|l| issued >= l) {
            break Stop::ByteLimit;
        }
        if progress.start.elapsed().as_secs_f64() >= plan.max_seconds {
            break Stop::TimeLimit;
        }
        if issued - prev.issued < plan.window_bytes {
            continue;
        }
        let now = Snapshot::take(&pool.status(), &progress);
        progress.window.fetch_add(1, Ordering::Relaxed);
        let w = window(windows.len(), &prev, &now, prev.issued >= plan.warmup_bytes);
        if w.eligible && first_eligible.is_none() {
            first_eligible = Some(windows.len());
        }
        if plan.verbose {
            eprintln!("{}", w.line());
        }
        windows.push(w);
        prev = now;
        if let (Some(rule), Some(first)) = (rule, first_eligible) {
            let was: Vec<f64> = windows.iter().map(|w| w.wa).collect();
            if rule.steady(&was, first).is_some() {
                break Stop::Steady;
            }
        }
    };
    progress.stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Histogram> = Vec::new();
    let mut failure = None;
    for h in writers {
        match h.join() {
            Ok(Ok(hists)) => {
                if latencies.len() < hists.len() {
                    latencies.resize_with(hists.len(), Histogram::default);
                }
                for (all, h) in latencies.iter_mut().zip(&hists) {
                    all.add(h);
                }
            }
            Ok(Err(e)) => failure = failure.or(Some(anyhow!(e).context("a writer failed"))),
            Err(_) => failure = failure.or(Some(anyhow!("a writer thread panicked"))),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    for (w, h) in windows.iter_mut().zip(&latencies) {
        w.p50_us = h.percentile_us(0.5);
        w.p99_us = h.percentile_us(0.99);
        w.p999_us = h.percentile_us(0.999);
        w.max_us = h.max_us();
    }
    Ok(Outcome {
        stopped_by,
        first_eligible: first_eligible.unwrap_or(windows.len()),
        windows,
        seconds: progress.start.elapsed().as_secs_f64(),
        ops: progress.ops.load(Ordering::Relaxed),
        latencies,
    })
}

/// The window between two snapshots.
fn window(index: usize, a: &Snapshot, b: &Snapshot, eligible: bool) -> Window {
    let secs = (b.seconds - a.seconds).max(1e-9);
    let user = b.user.saturating_sub(a.user);
    let member = b.member.saturating_sub(a.member);
    let relocated = b.relocated.saturating_sub(a.relocated);
    let share = |part: u64| (relocated > 0).then(|| part as f64 / relocated as f64);
    let foreground = b.foreground.saturating_sub(a.foreground);
    let again = b.again.saturating_sub(a.again);
    let flushes = b.flushes - a.flushes;
    Window {
        index,
        t_start: a.seconds,
        t_end: b.seconds,
        start_bytes: a.issued,
        end_bytes: b.issued,
        user_bytes: user,
        member_bytes: member,
        wa: member as f64 / user.max(1) as f64,
        iops: (b.ops - a.ops) as f64 / secs,
        mb_per_s: user as f64 / secs / 1e6,
        free_segments: b.free_segments,
        pending_free_segments: b.pending_free_segments,
        segments_cleaned: b.segments_cleaned.saturating_sub(a.segments_cleaned),
        relocated_bytes: relocated,
        foreground_relocated_bytes: foreground,
        relocated_again_bytes: again,
        foreground_share: share(foreground),
        relocated_again_share: share(again),
        long_lived_written_bytes: b.long_lived.saturating_sub(a.long_lived),
        write_stall_seconds: (b.write_stall_seconds - a.write_stall_seconds).max(0.0),
        flushes_per_s: (flushes > 0).then(|| flushes as f64 / secs),
        member_flushes_per_flush: (flushes > 0)
            .then(|| b.member_flushes.saturating_sub(a.member_flushes) as f64 / flushes as f64),
        eligible,
        steady: false,
        p50_us: 0.0,
        p99_us: 0.0,
        p999_us: 0.0,
        max_us: 0.0,
    }
}

type Writer = std::thread::JoinHandle<lograid::Result<Vec<Histogram>>>;

fn spawn_writers(
    volume: &Volume,
    generator: &Arc<Generator>,
    threads: usize,
    flush_every: Option<u32>,
    progress: &Arc<Progress>,
) -> Vec<Writer> {
    let data = Arc::new(super::super::filled(generator.max_len() as usize, 5));
    (0..threads)
        .map(|t| {
            let (v, g, p, data) = (
                volume.clone(),
                generator.clone(),
                progress.clone(),
                data.clone(),
            );
            std::thread::spawn(move || {
                let result = write_until_stopped(&v, &g, &p, &data, t as u64, flush_every);
                if result.is_err() {
                    p.stop.store(true, Ordering::Relaxed);
                }
                result
            })
        })
        .collect()
}

/// One writer: its latencies per window, each counted in the window where
/// it ended. With `flush_every` N, every N-th write's latency includes the
/// flush after it.
fn write_until_stopped(
    v: &Volume,
    g: &Generator,
    p: &Progress,
    data: &[u8],
    thread: u64,
    flush_every: Option<u32>,
) -> lograid::Result<Vec<Histogram>> {
    let mut rng = Rng::new(super::super::mix(0x57ead ^ thread));
    let mut hists = vec![Histogram::default()];
    let mut n = 0u64;
    while !p.stop.load(Ordering::Relaxed) {
        let at = Position {
            bytes: p.bytes.load(Ordering::Relaxed),
            seconds: p.start.elapsed().as_secs_f64(),
        };
        let req = g.next(&mut rng, at);
        let t = Instant::now();
        v.write(req.offset, &data[..req.len as usize])?;
        n += 1;
        if flush_every.is_some_and(|every| n.is_multiple_of(every as u64)) {
            v.flush()?;
            p.flushes.fetch_add(1, Ordering::Relaxed);
        }
        let took = t.elapsed();
        let w = p.window.load(Ordering::Relaxed);
        if hists.len() <= w {
            hists.resize_with(w + 1, Histogram::default);
        }
        hists[w].record(took);
        p.ops.fetch_add(1, Ordering::Relaxed);
        p.bytes.fetch_add(req.len, Ordering::Relaxed);
    }
    Ok(hists)
}
