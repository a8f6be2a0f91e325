//! Steady-state runs (`--workloads steady`): for each cleaner policy, fill
//! and pattern, a fresh pool whose one volume is filled sequentially to a
//! share of the usable capacity, then overwritten (`pattern.rs`) until the
//! write amplification at the members settles: windows of a fixed amount of
//! user data (a share of the volume's size), steady once three successive
//! windows after a warm-up (one whole overwrite by default) agree within 5%
//! (`converge.rs`), or
//! stopped at `--steady-max-seconds`. Reports per window WA, IOPS, free
//! segments and the cleaner's work, and the steady figures as the means of
//! the converged windows (`report.rs`); `sync:N` runs once per policy on an
//! empty volume. One JSON file per policy, in the schema that
//! bench/steady_report.py reads (shared with the peer stacks' script).

mod converge;
mod latency;
mod load;
mod pattern;
mod report;
mod trace;
mod zipf;

use super::{chrono_like_now, filled, machine, BenchArgs, BenchPool};
use anyhow::{anyhow, bail, Context, Result};
use converge::RULE;
use load::Stop;
use lograid::{CleanerPolicy, PoolOptions};
use pattern::{Generator, Pattern};
use report::{Latency, Setup, SteadyReport, SteadyRun};
use std::path::Path;
use std::sync::Arc;
use trace::Trace;

/// sync:N writes into an empty volume and should measure flushes, not the
/// cleaner: its windows are a 64th of the usable capacity, at most this
/// many bytes, and it stops after an eighth of the capacity written (with
/// a WA up to 6 the log does not wrap).
const SYNC_WINDOW_BYTES: u64 = 256 << 20;

/// The empty baseline writes a quarter of the usable capacity (the log does
/// not wrap) or for this long, whichever ends first.
const EMPTY_MAX_SECONDS: f64 = 30.0;

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// The checked steady-state options, traces loaded.
pub struct Options {
    fills: Vec<f64>,
    patterns: Vec<Pattern>,
    /// Loaded traces, by pattern index.
    traces: Vec<Option<Arc<Trace>>>,
    policies: Vec<CleanerPolicy>,
}

impl Options {
    pub fn from_args(a: &BenchArgs) -> Result<Options> {
        let fills: Vec<f64> = list(&a.fills)
            .iter()
            .map(|f| f.parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| anyhow!("--fills: {e}"))?;
        if fills.iter().any(|&f| !(0.05..=0.98).contains(&f)) {
            bail!("--fills: each fill must be between 0.05 and 0.98 of the pool's capacity");
        }
        let patterns =
            pattern::parse_patterns(&a.patterns).map_err(|e| anyhow!("--patterns: {e}"))?;
        if patterns.iter().any(|p| p.flush_every().is_none()) && fills.is_empty() {
            bail!("--fills: no fill given for the overwrite patterns");
        }
        let traces = patterns
            .iter()
            .map(|p| match p {
                Pattern::Trace { path } => Trace::load(path)
                    .map(|t| Some(Arc::new(t)))
                    .map_err(|e| anyhow!("--patterns: {e}")),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let policies: Vec<CleanerPolicy> = list(&a.policies)
            .iter()
            .map(|p| p.parse::<CleanerPolicy>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| anyhow!("--policies: {e}"))?;
        if !(a.steady_max_seconds.is_finite() && a.steady_max_seconds > 0.0) {
            bail!("--steady-max-seconds: must be a number of seconds above 0");
        }
        if !(a.steady_window > 0.0 && a.steady_window <= 1.0) {
            bail!("--steady-window: must be a share of the volume's size above 0 and at most 1");
        }
        if !(a.steady_warmup.is_finite() && a.steady_warmup >= 0.0) {
            bail!("--steady-warmup: must be a number of volume overwrites, 0 or more");
        }
        Ok(Options {
            fills,
            patterns,
            traces,
            policies,
        })
    }
}

pub fn run(a: &BenchArgs, dir: &Path, o: &Options) -> Result<()> {
    for (p, t) in o.patterns.iter().zip(&o.traces) {
        if let Some(t) = t {
            eprintln!(
                "{}: {} writes ({} reads skipped), replayed in a loop",
                p.name(),
                t.writes(),
                t.reads_skipped
            );
        }
    }
    let overwrites = o.patterns.iter().filter(|p| p.flush_every().is_none());
    let syncs = o.patterns.len() - overwrites.clone().count();
    let per_policy = 1 + o.fills.len() * overwrites.count() + syncs;
    let total = o.policies.len() * per_policy;
    let mut done = 0;
    for &policy in &o.policies {
        let options = PoolOptions {
            cleaner_policy: policy,
            ..Default::default()
        };
        let stack = format!("lograid-p{}-{}", a.parity, policy.name());
        done += 1;
        eprintln!("[{done}/{total}] {stack}: empty volume, random 4K writes");
        let (empty, capacity) = empty_run(a, dir, &options)?;
        eprintln!(
            "  empty: {:.0} IOPS, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, longest {:.0} ms",
            empty.iops,
            empty.p50_us,
            empty.p99_us,
            empty.p999_us,
            empty.max_us / 1000.0
        );
        let mut report = SteadyReport {
            stack: stack.clone(),
            policy,
            date: chrono_like_now(),
            machine: machine(),
            members: a.members,
            parity: a.parity,
            member_size: a.member_size,
            capacity_bytes: capacity,
            queue_depth: a.queue_depth,
            setup: Setup {
                window_fraction: a.steady_window,
                sync_window_bytes: SYNC_WINDOW_BYTES,
                windows_needed: RULE.windows,
                tolerance: RULE.tolerance,
                warmup_overwrites: a.steady_warmup,
                max_seconds: a.steady_max_seconds,
                block_size: 4096,
            },
            empty,
            runs: Vec::new(),
        };
        let mut points: Vec<(Option<f64>, usize)> = Vec::new();
        for &fill in &o.fills {
            for (i, p) in o.patterns.iter().enumerate() {
                if p.flush_every().is_none() {
                    points.push((Some(fill), i));
                }
            }
        }
        for (i, p) in o.patterns.iter().enumerate() {
            if p.flush_every().is_some() {
                points.push((None, i));
            }
        }
        for (fill, i) in points {
            let pattern = &o.patterns[i];
            done += 1;
            let what = match fill {
                Some(f) => format!("fill {f}, {} overwrite", pattern.name()),
                None => format!("empty volume, {}", pattern.name()),
            };
            eprintln!("[{done}/{total}] {stack}: {what}");
            let run = steady_run(a, dir, &options, fill, pattern, o.traces[i].clone())
                .with_context(|| format!("{stack}: {what}"))?;
            summary(&run, &empty, a.steady_max_seconds);
            report.runs.push(run);
            save(a, &report)?; // keep what we have if a later run dies
        }
        if let Some(out) = &a.steady_out {
            eprintln!("  wrote {}", out.join(format!("{stack}.json")).display());
        }
    }
    Ok(())
}

fn save(a: &BenchArgs, report: &SteadyReport) -> Result<()> {
    if let Some(out) = &a.steady_out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join(format!("{}.json", report.stack));
        std::fs::write(&path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The run's result on stderr.
fn summary(run: &SteadyRun, empty: &Latency, max_seconds: f64) {
    let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
    let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
    if !run.converged {
        let limit = match run.stopped_by {
            Stop::ByteLimit => "an eighth of the capacity written, the limit of sync:N".to_string(),
            _ => format!("{max_seconds} s (--steady-max-seconds)"),
        };
        eprintln!(
            "  not converged: no {} successive windows within {:.0}% after the warm-up in {limit}; the figures below are the last {} windows",
            RULE.windows,
            RULE.tolerance * 100.0,
            run.steady_windows.len()
        );
    }
    let flushes = run
        .flushes_per_s
        .map(|v| {
            format!(
                ", {v:.0} flushes/s ({:.2} member flushes each)",
                run.member_flushes_per_flush.unwrap_or(0.0)
            )
        })
        .unwrap_or_default();
    eprintln!(
        "  steady (windows {:?}): WA {}, {} IOPS = {} x empty, p99.9 {:.0} us = {:.1} x empty, longest write {:.0} ms (after the windows {:.0} ms), foreground {}, relocated again {}{flushes}; whole run {:.1} s, WA {:.2}, map {:.1} B/block",
        run.steady_windows,
        f(run.wa_steady, 2),
        f(run.iops_steady, 0),
        f(run.iops_steady.map(|i| i / empty.iops.max(1.0)), 2),
        run.p999_us,
        run.p999_us / empty.p999_us.max(1.0),
        run.max_us / 1000.0,
        run.max_us_after_windows / 1000.0,
        pct(run.foreground_share),
        pct(run.relocated_again_share),
        run.seconds,
        run.wa,
        run.map_bytes_per_block_random,
    );
}

/// Random 4 KiB writes into an empty volume as large as the 75% fill's.
/// Returns the baseline and the pool's usable capacity.
fn empty_run(a: &BenchArgs, dir: &Path, options: &PoolOptions) -> Result<(Latency, u64)> {
    let bp = BenchPool::with(a, dir, 0.75, options.clone())?;
    let capacity = bp.pool.status().usable_bytes;
    let g = Arc::new(Generator::new(
        &Pattern::Uniform,
        bp.volume.size_bytes(),
        None,
    ));
    let limit = capacity / 4;
    let plan = load::Plan {
        window_bytes: limit,
        warmup_bytes: 0,
        max_seconds: EMPTY_MAX_SECONDS.min(a.steady_max_seconds),
        byte_limit: Some(limit),
        rule: None,
        verbose: false,
    };
    let outcome = load::run(&bp.pool, &bp.volume, g, a.queue_depth, None, plan)?;
    bp.volume.flush()?;
    let lat = outcome.all_latencies();
    Ok((
        Latency {
            iops: outcome.ops as f64 / outcome.seconds.max(1e-9),
            p50_us: lat.percentile_us(0.5),
            p99_us: lat.percentile_us(0.99),
            p999_us: lat.percentile_us(0.999),
            max_us: lat.max_us(),
        },
        capacity,
    ))
}

/// One fill and pattern: a fresh pool, its volume filled sequentially (not
/// for sync:N, which writes into an empty volume of 0.75 of the capacity),
/// then the pattern's writes until steady state or the time limit.
fn steady_run(
    a: &BenchArgs,
    dir: &Path,
    options: &PoolOptions,
    fill: Option<f64>,
    pattern: &Pattern,
    trace: Option<Arc<Trace>>,
) -> Result<SteadyRun> {
    let bp = BenchPool::with(a, dir, fill.unwrap_or(0.75), options.clone())?;
    let volume_bytes = bp.volume.size_bytes();
    let mut map_seq = None;
    if fill.is_some() {
        fill_sequentially(a, &bp)?;
        // A checkpoint (one runs every 1 GiB of log) stores in-order pages as runs.
        bp.pool.checkpoint()?;
        map_seq = Some(bp.pool.status().map_bytes_per_stored_block);
    }
    let usable = bp.pool.status().usable_bytes;
    let (window_bytes, warmup_bytes, byte_limit) = match fill {
        Some(_) => (
            ((volume_bytes as f64 * a.steady_window) as u64).max(4096),
            (volume_bytes as f64 * a.steady_warmup) as u64,
            None,
        ),
        None => (
            (usable / 64).clamp(4096, SYNC_WINDOW_BYTES),
            0,
            Some(usable / 8),
        ),
    };
    let st0 = bp.pool.status();
    let generator = Arc::new(Generator::new(pattern, volume_bytes, trace));
    let plan = load::Plan {
        window_bytes,
        warmup_bytes,
        max_seconds: a.steady_max_seconds,
        byte_limit,
        rule: Some(RULE),
        verbose: true,
    };
    let flush_every = pattern.flush_every();
    let mut outcome = load::run(
        &bp.pool,
        &bp.volume,
        generator,
        a.queue_depth,
        flush_every,
        plan,
    )?;
    bp.volume.flush()?;
    bp.pool.checkpoint()?;
    let seconds = outcome.seconds;
    let st = bp.pool.status();
    let user = st.counters.user_bytes_written - st0.counters.user_bytes_written;
    let member = st.member_bytes_written - st0.member_bytes_written;
    let mut run = SteadyRun {
        fill,
        pattern: pattern.name(),
        volume_bytes,
        window_bytes,
        warmup_bytes,
        converged: false,
        stopped_by: outcome.stopped_by,
        steady_windows: Vec::new(),
        wa_steady: None,
        iops_steady: None,
        mb_per_s_steady: None,
        p50_us: 0.0,
        p99_us: 0.0,
        p999_us: 0.0,
        max_us: 0.0,
        max_us_after_windows: report::max_after_windows(&outcome),
        foreground_share: None,
        relocated_again_share: None,
        free_segments_steady: None,
        flush_every,
        flushes_per_s: None,
        member_flushes_per_flush: None,
        seconds,
        user_bytes: user,
        member_bytes: member,
        wa: member as f64 / user.max(1) as f64,
        iops: outcome.ops as f64 / seconds.max(1e-9),
        relocated_bytes: st.cleaner.relocated_bytes - st0.cleaner.relocated_bytes,
        segments_cleaned: st.cleaner.segments_cleaned - st0.cleaner.segments_cleaned,
        write_stalls: st.cleaner.write_stalls - st0.cleaner.write_stalls,
        map_bytes_per_block_sequential: map_seq,
        map_bytes_per_block_random: st.map_bytes_per_stored_block,
        windows: Vec::new(),
    };
    report::steady_figures(&mut run, &mut outcome, RULE);
    run.windows = outcome.windows;
    Ok(run)
}

/// Fills the whole volume with sequential 1 MiB writes, then flushes.
fn fill_sequentially(a: &BenchArgs, bp: &BenchPool) -> Result<()> {
    let mib = 1u64 << 20;
    let data = Arc::new(filled(mib as usize, 4));
    let v = bp.volume.clone();
    let size = v.size_bytes();
    super::drive(
        a.queue_depth,
        1e7,
        size.div_ceil(mib),
        Arc::new(move |i| {
            let len = mib.min(size - i * mib) as usize;
            v.write(i * mib, &data[..len]).map_err(Into::into)
        }),
    )?;
    bp.volume.flush()?;
    Ok(())
}
