//! Steady-state runs (`--workloads steady`): a volume filled sequentially to
//! a share of the pool's usable capacity, then overwritten with random 4 KiB
//! writes (uniform, or 90% of the writes on 10% of the blocks) while the
//! cleaner works. Reports write amplification at the members (parity and
//! checkpoints included) over the whole overwrite and its last third,
//! throughput over time, latency percentiles of the last third, and the
//! map's memory per stored block after the sequential fill and after the
//! random overwrite. One JSON file per cleaner policy, in the schema that
//! bench/steady_report.py reads (shared with the peer stacks' script).

use super::{
    chrono_like_now, drive, filled, join_latencies, machine, mix, percentile, BenchArgs, BenchPool,
};
use anyhow::{bail, Result};
use lograid::{CleanerPolicy, PoolOptions};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Serialize, Clone, Copy, Default)]
pub struct Latency {
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

#[derive(Serialize)]
pub struct Sample {
    pub t: f64,
    pub iops: f64,
    pub wa: f64,
    pub free_segments: usize,
}

#[derive(Serialize)]
pub struct SteadyRun {
    pub fill: f64,
    pub pattern: String,
    pub seconds: f64,
    pub user_bytes: u64,
    pub member_bytes: u64,
    pub wa: f64,
    pub wa_last_third: f64,
    pub iops: f64,
    pub iops_last_third: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub relocated_bytes: u64,
    pub segments_cleaned: u64,
    pub write_stalls: u64,
    pub map_bytes_per_block_sequential: f64,
    pub map_bytes_per_block_random: f64,
    pub timeline: Vec<Sample>,
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
    pub empty: Latency,
    pub runs: Vec<SteadyRun>,
}

/// Which block the i-th write of a pattern goes to.
fn pick(pattern: &str, i: u64, blocks: u64) -> u64 {
    let r = mix(i ^ 0x5eed);
    if pattern == "skewed" {
        let hot = (blocks / 10).max(1);
        if r % 100 < 90 {
            return mix(r) % hot;
        }
        return hot + mix(r) % (blocks - hot).max(1);
    }
    r % blocks
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

pub fn run(a: &BenchArgs, dir: &Path) -> Result<()> {
    let fills: Vec<f64> = list(&a.fills)
        .iter()
        .map(|f| f.parse::<f64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--fills: {e}"))?;
    if fills.iter().any(|&f| !(0.05..=0.98).contains(&f)) {
        bail!("--fills: each fill must be between 0.05 and 0.98 of the pool's capacity");
    }
    let patterns = list(&a.patterns);
    if let Some(p) = patterns
        .iter()
        .find(|p| !matches!(p.as_str(), "uniform" | "skewed"))
    {
        bail!("--patterns: unknown pattern '{p}' (uniform, skewed)");
    }
    let policies: Vec<CleanerPolicy> = list(&a.policies)
        .iter()
        .map(|p| p.parse::<CleanerPolicy>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--policies: {e}"))?;
    let total = policies.len() * (1 + fills.len() * patterns.len());
    let mut done = 0;
    for policy in policies {
        let options = PoolOptions {
            cleaner_policy: policy,
            ..Default::default()
        };
        let stack = format!("lograid-p{}-{}", a.parity, policy.name());
        done += 1;
        eprintln!("[{done}/{total}] {stack}: empty volume, random 4K writes");
        let empty = empty_run(a, dir, &options)?;
        eprintln!(
            "  empty: {:.0} IOPS, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us",
            empty.iops, empty.p50_us, empty.p99_us, empty.p999_us
        );
        let mut report = SteadyReport {
            stack: stack.clone(),
            policy,
            date: chrono_like_now(),
            machine: machine(),
            members: a.members,
            parity: a.parity,
            member_size: a.member_size,
            capacity_bytes: 0,
            queue_depth: a.queue_depth,
            empty,
            runs: Vec::new(),
        };
        for &fill in &fills {
            for pattern in &patterns {
                done += 1;
                eprintln!("[{done}/{total}] {stack}: fill {fill}, {pattern} overwrite");
                let (run, capacity) = steady_run(a, dir, &options, fill, pattern)?;
                report.capacity_bytes = capacity;
                eprintln!(
                    "  WA {:.2} (last third {:.2}), {:.0} IOPS (last third {:.0} = {:.2} x empty), p99.9 {:.0} us = {:.1} x empty, map {:.1} B/block random, {:.1} sequential",
                    run.wa,
                    run.wa_last_third,
                    run.iops,
                    run.iops_last_third,
                    run.iops_last_third / empty.iops.max(1.0),
                    run.p999_us,
                    run.p999_us / empty.p999_us.max(1.0),
                    run.map_bytes_per_block_random,
                    run.map_bytes_per_block_sequential,
                );
                report.runs.push(run);
            }
        }
        if let Some(out) = &a.steady_out {
            std::fs::create_dir_all(out)?;
            let path = out.join(format!("{stack}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            eprintln!("  wrote {}", path.display());
        }
    }
    Ok(())
}

/// Random 4 KiB writes into an empty volume as large as the 75% fill's.
fn empty_run(a: &BenchArgs, dir: &Path, options: &PoolOptions) -> Result<Latency> {
    let bp = BenchPool::with(a, dir, 0.75, options.clone())?;
    let v = bp.volume.clone();
    let blocks = v.size_bytes() / 4096;
    let b = Arc::new(filled(4096, 3));
    let secs = (a.steady_seconds / 4.0).max(5.0);
    let start = Instant::now();
    let (ops, _, lat, _) = drive(
        a.queue_depth,
        secs,
        u64::MAX,
        Arc::new(move |i| v.write((mix(i) % blocks) * 4096, &b).map_err(Into::into)),
    )?;
    bp.volume.flush()?;
    let t = start.elapsed().as_secs_f64();
    Ok(Latency {
        iops: ops as f64 / t,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        p999_us: percentile(&lat, 0.999),
    })
}

/// One fill and pattern: a fresh pool filled to `fill` sequentially, then
/// overwritten at random for `steady_seconds`. Returns the run and the
/// pool's usable capacity.
fn steady_run(
    a: &BenchArgs,
    dir: &Path,
    options: &PoolOptions,
    fill: f64,
    pattern: &str,
) -> Result<(SteadyRun, u64)> {
    let bp = BenchPool::with(a, dir, fill, options.clone())?;
    let capacity = bp.pool.status().usable_bytes;
    fill_sequentially(a, &bp)?;
    // A checkpoint (one runs every 1 GiB of log) stores in-order pages as runs.
    bp.pool.checkpoint()?;
    let map_seq = bp.pool.status().map_bytes_per_stored_block;

    // Overwrite: `qd` threads, latencies of the last third kept.
    let st0 = bp.pool.status();
    let (user0, member0, reloc0) = (
        st0.counters.user_bytes_written,
        st0.member_bytes_written,
        st0.counters.relocated_blocks,
    );
    let cleaned0 = st0.cleaner.segments_cleaned;
    let stalls0 = st0.cleaner.write_stalls;
    let secs = a.steady_seconds;
    let ops = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let keep_after = Duration::from_secs_f64(secs * 2.0 / 3.0);
    let workers = spawn_overwriters(
        a.queue_depth,
        &bp.volume,
        pattern,
        &ops,
        &stop,
        start,
        keep_after,
    );
    let (timeline, third) = sample_timeline(&bp.pool, &ops, start, secs, (user0, member0));
    stop.store(true, Ordering::Relaxed);
    let lat = join_latencies(workers)?;
    let elapsed = start.elapsed().as_secs_f64();
    let total_ops = ops.load(Ordering::Relaxed);
    bp.volume.flush()?;
    bp.pool.checkpoint()?;
    let st = bp.pool.status();
    let (user, member) = (st.counters.user_bytes_written, st.member_bytes_written);
    let (n3, user3, member3, t3) = third.unwrap_or((0, user0, member0, 0.0));
    let run = SteadyRun {
        fill,
        pattern: pattern.to_string(),
        seconds: elapsed,
        user_bytes: user - user0,
        member_bytes: member - member0,
        wa: (member - member0) as f64 / (user - user0).max(1) as f64,
        wa_last_third: (member - member3) as f64 / (user - user3).max(1) as f64,
        iops: total_ops as f64 / elapsed,
        iops_last_third: total_ops.saturating_sub(n3) as f64 / (elapsed - t3).max(1e-9),
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        p999_us: percentile(&lat, 0.999),
        relocated_bytes: (st.counters.relocated_blocks - reloc0) * 4096,
        segments_cleaned: st.cleaner.segments_cleaned - cleaned0,
        write_stalls: st.cleaner.write_stalls - stalls0,
        map_bytes_per_block_sequential: map_seq,
        map_bytes_per_block_random: st.map_bytes_per_stored_block,
        timeline,
    };
    Ok((run, capacity))
}

/// Fills the whole volume with sequential 1 MiB writes, then flushes.
fn fill_sequentially(a: &BenchArgs, bp: &BenchPool) -> Result<()> {
    let mib = 1u64 << 20;
    let data = Arc::new(filled(mib as usize, 4));
    let v = bp.volume.clone();
    drive(
        a.queue_depth,
        1e7,
        v.size_bytes() / mib,
        Arc::new(move |i| v.write(i * mib, &data).map_err(Into::into)),
    )?;
    bp.volume.flush()?;
    Ok(())
}

/// Starts the random 4 KiB overwrite on `volume`: `threads` writers that
/// write until `stop`, counting in `ops`, each returning the latencies (ns)
/// of its writes after `keep_after` from `start`.
fn spawn_overwriters(
    threads: usize,
    volume: &lograid::Volume,
    pattern: &str,
    ops: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
    start: Instant,
    keep_after: Duration,
) -> Vec<std::thread::JoinHandle<lograid::Result<Vec<u64>>>> {
    let blocks = volume.size_bytes() / 4096;
    let block = Arc::new(filled(4096, 5));
    (0..threads)
        .map(|_| {
            let (v, ops, stop, block) = (volume.clone(), ops.clone(), stop.clone(), block.clone());
            let pattern = pattern.to_string();
            std::thread::spawn(move || -> lograid::Result<Vec<u64>> {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = ops.fetch_add(1, Ordering::Relaxed);
                    let t = Instant::now();
                    v.write(pick(&pattern, i, blocks) * 4096, &block)?;
                    if start.elapsed() >= keep_after {
                        lat.push(t.elapsed().as_nanos() as u64);
                    }
                }
                Ok(lat)
            })
        })
        .collect()
}

/// Writes done, user bytes written, member bytes written and seconds since
/// the start, at one moment of the overwrite.
type Mark = (u64, u64, u64, f64);

/// Samples throughput, write amplification and free segments every few
/// seconds until `secs` have passed since `start`. `(user0, member0)` are
/// the byte counters when the overwrite began. Returns the timeline and the
/// mark when the last third began.
fn sample_timeline(
    pool: &lograid::Pool,
    ops: &AtomicU64,
    start: Instant,
    secs: f64,
    (user0, member0): (u64, u64),
) -> (Vec<Sample>, Option<Mark>) {
    let mut timeline = Vec::new();
    let interval = (secs / 24.0).clamp(1.0, 5.0);
    let (mut last_ops, mut last_user, mut last_member) = (0u64, user0, member0);
    let mut third: Option<Mark> = None;
    let mut tick = 1;
    while start.elapsed().as_secs_f64() < secs {
        let next = interval * tick as f64;
        let now = start.elapsed().as_secs_f64();
        if next > now {
            std::thread::sleep(Duration::from_secs_f64((next - now).min(secs - now)));
        }
        tick += 1;
        let t = start.elapsed().as_secs_f64();
        let st = pool.status();
        let n = ops.load(Ordering::Relaxed);
        let (user, member) = (st.counters.user_bytes_written, st.member_bytes_written);
        let wa = (member - last_member) as f64 / (user - last_user).max(1) as f64;
        timeline.push(Sample {
            t,
            iops: (n - last_ops) as f64 / interval,
            wa,
            free_segments: st.segments_free,
        });
        (last_ops, last_user, last_member) = (n, user, member);
        if third.is_none() && t >= secs * 2.0 / 3.0 {
            third = Some((n, user, member, t));
        }
    }
    (timeline, third)
}
