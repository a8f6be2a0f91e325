//! `lograid bench --workloads rebuild`: what a drive failure costs. For each
//! fill (a quarter and most of the pool): sequential read healthy and with
//! P members missing; scrub rate; the rebuild after replacing a missing
//! member (time, rate of live data); and a user's sequential reads while a
//! rebuild runs in the background at the default share, against the same
//! reads on the healthy pool. Rates are compared with the raw sequential
//! read rate of one member file on the same disk.

use super::{drive, filled, member_bytes_read, BenchArgs, BenchPool, RawFile};
use crate::size::human;
use anyhow::Result;
use lograid::device::{AlignedBuf, Member};
use lograid::PoolOptions;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize, Debug)]
pub struct RebuildRun {
    pub fill: f64,
    pub stored_bytes: u64,
    pub healthy_read_mb_s: f64,
    pub degraded_read_mb_s: f64,
    /// Bytes the members read per byte of the degraded read (1 would be a
    /// healthy read's; each lost column costs its row's other columns).
    pub degraded_read_member_bytes_per_byte: f64,
    pub scrub_mb_s: f64,
    pub rebuild_seconds: f64,
    /// Live bytes moved per second.
    pub rebuild_mb_s: f64,
    /// Bytes the members read and wrote during the rebuild, per live byte
    /// rebuilt (a rebuild in place at P=1 on 3 members: about 1 and 0.5).
    pub rebuild_read_per_live_byte: f64,
    pub rebuild_written_per_live_byte: f64,
    /// Sequential reads of the volume by a user, idle and during a
    /// background rebuild at the default share.
    pub user_read_mb_s_idle: f64,
    pub user_read_mb_s_during_rebuild: f64,
}

#[derive(Serialize, Debug)]
pub struct RebuildReport {
    pub raw_seq_read_mb_s: f64,
    pub runs: Vec<RebuildRun>,
}

const MIB: usize = 1 << 20;

pub fn run(a: &BenchArgs, dir: &Path) -> Result<RebuildReport> {
    let raw_seq_read_mb_s = raw_read(a, dir)?;
    eprintln!("  raw      seq-read-1M of one member file: {raw_seq_read_mb_s:.0} MB/s");
    let mut runs = Vec::new();
    for fill in [0.25, 0.9] {
        let r = one(a, dir, fill)?;
        eprintln!(
            "  rebuild  fill {:.0}%: {} stored; read {:.0} MB/s healthy, {:.0} degraded ({:.2}x, members read {:.2} bytes per byte); scrub {:.0} MB/s; \
             rebuild {:.1} s ({:.0} MB/s live; members read {:.2} and wrote {:.2} bytes per live byte); user reads {:.0} MB/s idle, {:.0} during rebuild ({:.2}x)",
            fill * 100.0,
            human(r.stored_bytes),
            r.healthy_read_mb_s,
            r.degraded_read_mb_s,
            r.degraded_read_mb_s / r.healthy_read_mb_s,
            r.degraded_read_member_bytes_per_byte,
            r.scrub_mb_s,
            r.rebuild_seconds,
            r.rebuild_mb_s,
            r.rebuild_read_per_live_byte,
            r.rebuild_written_per_live_byte,
            r.user_read_mb_s_idle,
            r.user_read_mb_s_during_rebuild,
            r.user_read_mb_s_during_rebuild / r.user_read_mb_s_idle.max(1.0)
        );
        runs.push(r);
    }
    if let [quarter, full] = &runs[..] {
        eprintln!(
            "  rebuild  time at 25% / at 90%: {:.2} (live data {:.2}); rebuild {:.2}x and scrub {:.2}x the raw read rate",
            quarter.rebuild_seconds / full.rebuild_seconds.max(1e-9),
            quarter.stored_bytes as f64 / full.stored_bytes as f64,
            full.rebuild_mb_s / raw_seq_read_mb_s,
            full.scrub_mb_s / raw_seq_read_mb_s
        );
    }
    Ok(RebuildReport {
        raw_seq_read_mb_s,
        runs,
    })
}

/// Sequential 1 MiB reads of a member-sized file written first (what one drive gives).
fn raw_read(a: &BenchArgs, dir: &Path) -> Result<f64> {
    let raw = RawFile::new(a, dir)?;
    let data = filled(MIB, 3);
    let blocks = a.member_size / MIB as u64;
    for i in 0..blocks {
        raw.member.write_at(&data, i * MIB as u64)?;
    }
    raw.member.flush()?;
    drop_caches();
    let start = Instant::now();
    let mut buf = AlignedBuf::zeroed(MIB);
    for i in 0..blocks {
        raw.member.read_at(&mut buf, i * MIB as u64)?;
    }
    Ok(a.member_size as f64 / start.elapsed().as_secs_f64() / 1e6)
}

fn drop_caches() {
    // Members are opened with O_DIRECT; this only keeps the host quiet.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
}

fn seq_read(v: &lograid::Volume, bytes: u64) -> Result<f64> {
    let m = v.clone();
    let blocks = bytes / MIB as u64;
    let start = Instant::now();
    let (ops, ..) = drive(
        8,
        600.0,
        blocks,
        Arc::new(move |i| {
            let mut buf = vec![0u8; MIB];
            m.read(i * MIB as u64, &mut buf).map_err(Into::into)
        }),
    )?;
    Ok((ops * MIB as u64) as f64 / start.elapsed().as_secs_f64() / 1e6)
}

/// One fill: healthy and degraded reads, scrub, a timed rebuild and user
/// reads during a background one. The member files are removed at the end.
fn one(a: &BenchArgs, dir: &Path, fill: f64) -> Result<RebuildRun> {
    let options = PoolOptions {
        background_cleaner: false,
        ..Default::default()
    };
    let healthy = fill_and_scrub(a, dir, fill, &options)?;
    let fill_bytes = healthy.fill_bytes;

    // P members gone: read degraded.
    let p = a.parity as usize;
    let left: Vec<_> = healthy.paths[p..].to_vec();
    let (degraded_read_mb_s, degraded_read_member_bytes_per_byte) =
        degraded_read(&left, &options, fill_bytes)?;

    // Replace the first missing member and time the rebuild (foreground).
    let new = dir.join("replacement.img");
    let rebuild = timed_rebuild(a, &left, &new, &options)?;

    let new2 = dir.join("replacement2.img");
    let (user_read_mb_s_idle, user_read_mb_s_during_rebuild) =
        user_reads(a, &left, &new, &new2, fill_bytes)?;
    for p in healthy.paths.iter().chain([&new, &new2]) {
        let _ = std::fs::remove_file(p);
    }
    Ok(RebuildRun {
        fill,
        stored_bytes: healthy.stored_bytes,
        healthy_read_mb_s: healthy.healthy_read_mb_s,
        degraded_read_mb_s,
        degraded_read_member_bytes_per_byte,
        scrub_mb_s: healthy.scrub_mb_s,
        rebuild_seconds: rebuild.seconds,
        rebuild_mb_s: rebuild.mb_s,
        rebuild_read_per_live_byte: rebuild.read_per_live_byte,
        rebuild_written_per_live_byte: rebuild.written_per_live_byte,
        user_read_mb_s_idle,
        user_read_mb_s_during_rebuild,
    })
}

/// A healthy pool filled to `fill`, read back and scrubbed, then closed.
struct FilledPool {
    /// Its member files (kept: the later steps open them).
    paths: Vec<PathBuf>,
    /// Bytes of the volume written, from its start.
    fill_bytes: u64,
    stored_bytes: u64,
    healthy_read_mb_s: f64,
    scrub_mb_s: f64,
}

/// Fills a fresh pool's volume to `fill` with sequential 1 MiB writes, reads
/// it back, scrubs it and closes it, keeping the member files.
fn fill_and_scrub(
    a: &BenchArgs,
    dir: &Path,
    fill: f64,
    options: &PoolOptions,
) -> Result<FilledPool> {
    let mut bp = BenchPool::with(a, dir, 1.0, options.clone())?;
    let fill_bytes = (bp.volume.size_bytes() as f64 * fill) as u64 / MIB as u64 * MIB as u64;
    let data = Arc::new(filled(MIB, 5));
    {
        let v = bp.volume.clone();
        let d = data.clone();
        drive(
            8,
            3600.0,
            fill_bytes / MIB as u64,
            Arc::new(move |i| v.write(i * MIB as u64, &d).map_err(Into::into)),
        )?;
        bp.volume.flush()?;
    }
    let stored_bytes = bp.pool.status().stored_bytes;
    let healthy_read_mb_s = seq_read(&bp.volume, fill_bytes)?;
    let started = Instant::now();
    let report = bp.pool.scrub(false, |_, _| true)?;
    let scrub_mb_s = report.bytes_read as f64 / started.elapsed().as_secs_f64() / 1e6;
    bp.pool.close()?;
    // Keep the member files (BenchPool removes them when dropped).
    let paths = std::mem::take(&mut bp.paths);
    drop(bp);
    Ok(FilledPool {
        paths,
        fill_bytes,
        stored_bytes,
        healthy_read_mb_s,
        scrub_mb_s,
    })
}

/// Sequential reads of the pool on the `left` members (P are missing):
/// MB/s, and the bytes the members read per byte read.
fn degraded_read(left: &[PathBuf], options: &PoolOptions, fill_bytes: u64) -> Result<(f64, f64)> {
    let pool = lograid::open_paths(left, options.clone(), false)?;
    let v = pool.volume("bench")?;
    let before = member_bytes_read(&pool);
    let degraded_read_mb_s = seq_read(&v, fill_bytes)?;
    let degraded_read_member_bytes_per_byte =
        (member_bytes_read(&pool) - before) as f64 / fill_bytes.max(1) as f64;
    pool.close()?;
    drop((v, pool));
    Ok((degraded_read_mb_s, degraded_read_member_bytes_per_byte))
}

/// What a foreground rebuild took.
struct RebuildCost {
    seconds: f64,
    /// Live bytes moved per second, in MB/s.
    mb_s: f64,
    read_per_live_byte: f64,
    written_per_live_byte: f64,
}

/// Replaces member 0 of the pool on the `left` members by a new file `new`
/// and rebuilds it in the foreground.
fn timed_rebuild(
    a: &BenchArgs,
    left: &[PathBuf],
    new: &Path,
    options: &PoolOptions,
) -> Result<RebuildCost> {
    let _ = std::fs::remove_file(new);
    let pool = lograid::open_paths(left, options.clone(), false)?;
    let member = lograid::open_new_members(&[new.to_path_buf()], Some(a.member_size), true)?
        .pop()
        .expect("one member");
    let io = |pool: &lograid::Pool| {
        pool.status()
            .members
            .iter()
            .fold((0u64, 0u64), |(r, w), m| {
                (r + m.counters.bytes_read, w + m.counters.bytes_written)
            })
    };
    let io_before = io(&pool);
    let started = Instant::now();
    pool.replace_member(0, member)?;
    let moved_before = pool.status().reshape.map(|r| r.bytes_left).unwrap_or(0);
    pool.reshape(|_, _| true)?;
    let seconds = started.elapsed().as_secs_f64();
    let mb_s = moved_before as f64 / seconds / 1e6;
    let io_after = io(&pool);
    let live = moved_before.max(1) as f64;
    let read_per_live_byte = (io_after.0 - io_before.0) as f64 / live;
    let written_per_live_byte = (io_after.1 - io_before.1) as f64 / live;
    pool.close()?;
    drop(pool);
    Ok(RebuildCost {
        seconds,
        mb_s,
        read_per_live_byte,
        written_per_live_byte,
    })
}

/// User reads on the healthy pool (`left` and `new`), idle; then the rebuilt
/// member goes missing and is replaced (in place) by `new2`, and the same
/// reads run while that rebuild goes on in the background at the default
/// share. Returns both rates in MB/s.
fn user_reads(
    a: &BenchArgs,
    left: &[PathBuf],
    new: &Path,
    new2: &Path,
    fill_bytes: u64,
) -> Result<(f64, f64)> {
    let mut now: Vec<_> = left.to_vec();
    now.push(new.to_path_buf());
    let _ = std::fs::remove_file(new2);
    let pool = lograid::open_paths(&now, PoolOptions::default(), false)?;
    let v = pool.volume("bench")?;
    let user_read_mb_s_idle = seq_read(&v, fill_bytes)?;
    pool.close()?;
    drop((v, pool));
    let pool = lograid::open_paths(left, PoolOptions::default(), false)?;
    let v = pool.volume("bench")?;
    let member = lograid::open_new_members(&[new2.to_path_buf()], Some(a.member_size), true)?
        .pop()
        .expect("one member");
    let index = pool
        .status()
        .members
        .iter()
        .find(|m| m.state == "missing")
        .map(|m| m.index)
        .unwrap_or(0);
    pool.replace_member(index, member)?;
    let user_read_mb_s_during_rebuild = seq_read(&v, fill_bytes)?;
    let still = pool.status().reshape.is_some();
    if !still {
        eprintln!(
            "  (the rebuild finished before the user reads did: the figure is an upper bound)"
        );
    }
    pool.close()?;
    drop((v, pool));
    Ok((user_read_mb_s_idle, user_read_mb_s_during_rebuild))
}
