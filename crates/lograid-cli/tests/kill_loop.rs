//! Kill loops: `lograid serve` SIGKILLed again and again at random instants
//! under load, restarted each time, and checked: what a flush (or FUA, or a
//! filesystem's syncfs) covered before the kill must be there afterwards.
//!
//! - `nbd_writes_survive_repeated_sigkill`: our own NBD writer puts tagged
//!   4 KiB blocks on the first 32 MiB of a volume (writes, FUA writes, trims,
//!   a flush every few requests) while fio's nbd engine writes at random on the
//!   rest (crc32c verify headers every 4 KiB, flushes every 32 writes). After
//!   each kill and restart: every block of the first region holds what was
//!   durable at the kill or one of the writes sent after it, byte for byte
//!   (and what was read back after a restart must not change at the next crash);
//!   every block of the fio region reads without error and is either never
//!   written or a whole, valid fio block for its own offset. After the loop:
//!   `lograid scrub --check` of the crashed pool, then of the cleanly stopped
//!   pool, reports nothing to repair and nothing lost.
//! - `ext4_survives_repeated_sigkill`: ext4 on the attached volume; a writer
//!   creates and deletes files and calls syncfs every few; the server is
//!   killed, the device detached, the server restarted, attached and mounted
//!   (the journal replays): every file a completed syncfs covered is intact
//!   (sha256), `fsck.ext4 -f -n` is clean; repeated.
//!
//! LOGRAID_KILLS sets the number of kills per test (default 3),
//! LOGRAID_KILL_SEED the seed (default: from the clock; printed either way).
//! Short mode: `cargo test --release -p lograid-cli --test kill_loop` (about 20 s).
//! Long mode: `LOGRAID_KILLS=50 cargo test --release -p lograid-cli --test kill_loop -- --nocapture --test-threads=1`
//! (about 5 min). Each kill prints a line; a failure names the kill, the blocks or files.
//! The seed fixes the data, the request mix and the kill delays; where the kill
//! lands among the requests still depends on timing.

// fio's nbd engine, loop devices, ext4 and syncfs: Linux only.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const BLOCK: usize = lograid::format::BLOCK_SIZE;

/// How many kills each test does (LOGRAID_KILLS, default 3).
fn kills() -> usize {
    match std::env::var("LOGRAID_KILLS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("LOGRAID_KILLS={v:?} is not a number")),
        Err(_) => 3,
    }
}

/// LOGRAID_KILL_SEED (decimal or 0x-hex), else one from the clock.
fn seed() -> u64 {
    match std::env::var("LOGRAID_KILL_SEED") {
        Ok(v) => {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            }
            .unwrap_or_else(|_| panic!("LOGRAID_KILL_SEED={v:?} is not a number"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
        }
    }
}

/// `lograid serve` on the pool's drives, with its run directory (status file, control
/// socket) inside the pool's temporary directory, so killed servers leave nothing behind.
fn serve(pool: &TestPool) -> Server {
    serve_with(pool, &[])
}

/// As [`serve`], with more arguments.
fn serve_with(pool: &TestPool, extra: &[&str]) -> Server {
    let mut args: Vec<String> = vec!["serve".into()];
    args.extend(pool.drives.iter().map(|d| d.display().to_string()));
    args.extend(extra.iter().map(|a| a.to_string()));
    let run_dir = pool.path("run");
    Server::start_prepared(Path::new(BIN), args, pool.dir.path(), None, |c| {
        c.env("LOGRAID_RUN_DIR", &run_dir);
    })
}

/// The recovery lines a server printed at start (how long the replay took).
fn recovery_note(server: &Server) -> String {
    let text = format!("{}\n{}", server.stdout(), server.stderr());
    text.lines()
        .filter(|l| l.contains("recover") || l.contains("replay"))
        .map(|l| l.trim().to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `lograid scrub --check --json` on a pool no server holds: nothing lost,
/// and nothing to repair unless `crashed`. (A pool killed while a row was
/// being written may hold that row with a column not written: its data
/// checks out, so recovery keeps it, and the missing column is rebuilt by
/// the next writable open; a read-only check only reports it.)
fn scrub_check_clean(pool: &TestPool, when: &str, crashed: bool) -> String {
    let out = lograid()
        .env("LOGRAID_RUN_DIR", pool.path("run"))
        .args(["scrub", "--check", "--json"])
        .args(&pool.drives)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scrub --check {when} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("scrub --check {when}: {e}: {stdout}"));
    assert_eq!(report["complete"], true, "scrub --check {when}: {report:#}");
    if !crashed {
        assert_eq!(
            report["repaired_blocks"], 0,
            "scrub --check {when}: {report:#}"
        );
    }
    assert_eq!(
        report["unreadable_rows"], 0,
        "scrub --check {when}: {report:#}"
    );
    assert_eq!(
        report["lost_blocks"].as_array().map(|a| a.len()),
        Some(0),
        "scrub --check {when}: {report:#}"
    );
    format!(
        "{} rows checked, {} blocks to repair",
        report["rows_checked"], report["repaired_blocks"]
    )
}

// ---------------------------------------------------------------------------
// 1. NBD: our tagged writer beside fio, killed again and again.
// ---------------------------------------------------------------------------

/// The writer's region: the first 32 MiB of the volume. fio writes the rest.
const A_BLOCKS: usize = (32 * MIB) as usize / BLOCK;
const VOLUME: u64 = 96 * MIB;

/// The contents of block `block` as written by the write tagged `tag` (0: zeros, i.e.
/// never written or trimmed). The tag and the block number lead the block, so a block
/// read back names the write it came from (and a block written to the wrong place shows).
fn block_contents(tag: u64, block: usize) -> Vec<u8> {
    if tag == 0 {
        return vec![0; BLOCK];
    }
    let mut b = Rng::new(tag ^ (block as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).bytes(BLOCK);
    b[0..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&(block as u64).to_le_bytes());
    b
}

fn tag_name(tag: u64) -> String {
    if tag == 0 {
        "zeros".into()
    } else {
        format!("kill {} write {}", tag >> 32, tag & 0xffff_ffff)
    }
}

/// What each block of the writer's region may hold after a crash.
struct Model {
    /// The tag made durable by an acknowledged flush or FUA write, or read back after a restart.
    durable: Vec<u64>,
    /// Whether `durable` came from a flush/FUA (true) or from reading back after a restart.
    flushed: Vec<bool>,
    /// Writes (and trims, tag 0) sent since: any of them may or may not have survived.
    pending: Vec<Vec<u64>>,
}

impl Model {
    fn new() -> Model {
        Model {
            durable: vec![0; A_BLOCKS],
            flushed: vec![false; A_BLOCKS],
            pending: vec![Vec::new(); A_BLOCKS],
        }
    }

    /// A flush was acknowledged: every write acknowledged before it was sent is durable.
    /// (The writer has one request in flight at a time, so that is every pending one.)
    fn flushed_all(&mut self) {
        for b in 0..A_BLOCKS {
            if let Some(&last) = self.pending[b].last() {
                self.durable[b] = last;
                self.flushed[b] = true;
                self.pending[b].clear();
            }
        }
    }
}

#[derive(Default, Debug)]
struct WriterStats {
    writes: u64,
    fua_writes: u64,
    trims: u64,
    flushes: u64,
    /// Why it stopped: the connection broke (expected at the kill) or an NBD error.
    end: String,
    /// An NBD error reply while the server was (presumably) alive.
    nbd_error: Option<String>,
}

/// Sends tagged writes, FUA writes, trims and flushes on one connection until told to
/// stop or the connection breaks, keeping `model` up to date.
fn tagged_writer(
    mut client: NbdClient,
    model: Arc<Mutex<Model>>,
    round: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> WriterStats {
    let mut rng = Rng::new(seed);
    let mut stats = WriterStats::default();
    let mut seq: u64 = 0;
    let mut until_flush = 1 + rng.below(12);
    while !stop.load(Ordering::Relaxed) {
        if until_flush == 0 {
            until_flush = 1 + rng.below(12);
            if send_flush(&mut client, &model, &mut stats).is_break() {
                break;
            }
            continue;
        }
        until_flush -= 1;
        let start = rng.below(A_BLOCKS as u64) as usize;
        let len = (1 + rng.below(16) as usize).min(A_BLOCKS - start);
        let kind = rng.below(20);
        let sent = if kind == 0 {
            send_trim(&mut client, &model, start, len, &mut stats)
        } else {
            seq += 1;
            let tag = (round << 32) | seq;
            let fua = kind == 1;
            send_write(&mut client, &model, tag, start, len, fua, &mut stats)
        };
        if sent.is_break() {
            break;
        }
    }
    if stats.end.is_empty() && stats.nbd_error.is_none() {
        stats.end = "stopped".into();
    }
    stats
}

/// One flush; on success every pending write is durable. Breaks (saying why in `stats`) when
/// the writer must stop.
fn send_flush(
    client: &mut NbdClient,
    model: &Mutex<Model>,
    stats: &mut WriterStats,
) -> ControlFlow<()> {
    match client.try_request(NBD_CMD_FLUSH, 0, 0, 0, &[]) {
        Ok((0, _)) => {
            stats.flushes += 1;
            model.lock().unwrap().flushed_all();
        }
        Ok((e, _)) => {
            stats.nbd_error = Some(format!("flush: NBD error {e}"));
            return ControlFlow::Break(());
        }
        Err(e) => {
            stats.end = format!("flush: {e}");
            return ControlFlow::Break(());
        }
    }
    ControlFlow::Continue(())
}

/// A TRIM of `len` blocks from `start`: the blocks read as zeros afterwards (if it survives).
fn send_trim(
    client: &mut NbdClient,
    model: &Mutex<Model>,
    start: usize,
    len: usize,
    stats: &mut WriterStats,
) -> ControlFlow<()> {
    let offset = (start * BLOCK) as u64;
    {
        let mut m = model.lock().unwrap();
        for b in start..start + len {
            m.pending[b].push(0);
        }
    }
    match client.try_request(NBD_CMD_TRIM, 0, offset, (len * BLOCK) as u32, &[]) {
        Ok((0, _)) => stats.trims += 1,
        Ok((e, _)) => {
            stats.nbd_error = Some(format!("trim at {offset}: NBD error {e}"));
            return ControlFlow::Break(());
        }
        Err(e) => {
            stats.end = format!("trim: {e}");
            return ControlFlow::Break(());
        }
    }
    ControlFlow::Continue(())
}

/// A write of `len` blocks from `start` tagged `tag` (FUA if `fua`).
fn send_write(
    client: &mut NbdClient,
    model: &Mutex<Model>,
    tag: u64,
    start: usize,
    len: usize,
    fua: bool,
    stats: &mut WriterStats,
) -> ControlFlow<()> {
    let offset = (start * BLOCK) as u64;
    let mut payload = Vec::with_capacity(len * BLOCK);
    for b in start..start + len {
        payload.extend_from_slice(&block_contents(tag, b));
    }
    {
        // Recorded before it is sent: a write whose reply never came may have landed.
        let mut m = model.lock().unwrap();
        for b in start..start + len {
            m.pending[b].push(tag);
        }
    }
    let flags = if fua { NBD_CMD_FLAG_FUA } else { 0 };
    match client.try_request(NBD_CMD_WRITE, flags, offset, payload.len() as u32, &payload) {
        Ok((0, _)) => {
            stats.writes += 1;
            if fua {
                stats.fua_writes += 1;
                // This write is durable; it supersedes every earlier write to its blocks.
                let mut m = model.lock().unwrap();
                for b in start..start + len {
                    m.durable[b] = tag;
                    m.flushed[b] = true;
                    m.pending[b].clear();
                }
            }
        }
        Ok((e, _)) => {
            stats.nbd_error = Some(format!("write at {offset}: NBD error {e}"));
            return ControlFlow::Break(());
        }
        Err(e) => {
            stats.end = format!("write: {e}");
            return ControlFlow::Break(());
        }
    }
    ControlFlow::Continue(())
}

/// Reads `[offset, offset + len)` in 1 MiB requests; panics on an NBD error.
fn read_range(client: &mut NbdClient, offset: u64, len: u64, what: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(len as usize);
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(MIB) as u32;
        let (e, d) = client.request(NBD_CMD_READ, 0, at, n, &[]);
        assert_eq!(
            e, 0,
            "{what}: reading {n} bytes at {at} failed with NBD error {e}"
        );
        data.extend_from_slice(&d);
        at += n as u64;
    }
    data
}

/// Checks every block of the writer's region against the model, then makes what was
/// read the new durable state (a recovered state must not change at the next crash).
/// Returns (blocks holding the durable value, blocks holding a write sent after it).
fn verify_tagged_region(client: &mut NbdClient, model: &mut Model, kill: usize) -> (usize, usize) {
    let data = read_range(client, 0, (A_BLOCKS * BLOCK) as u64, "tagged region");
    let (mut as_durable, mut as_pending) = (0, 0);
    let mut bad = Vec::new();
    let mut bad_count = 0;
    for b in 0..A_BLOCKS {
        let got = &data[b * BLOCK..(b + 1) * BLOCK];
        let tag = if got.iter().all(|&x| x == 0) {
            0
        } else {
            u64::from_le_bytes(got[0..8].try_into().unwrap())
        };
        let problem = if tag != 0 && got != &block_contents(tag, b)[..] {
            Some(format!(
                "block {b} (offset {}): garbage, neither zeros nor a block we wrote (leading tag {tag:#x}, block field {})",
                b * BLOCK,
                u64::from_le_bytes(got[8..16].try_into().unwrap())
            ))
        } else if tag == model.durable[b] {
            as_durable += 1;
            None
        } else if model.pending[b].contains(&tag) {
            as_pending += 1;
            None
        } else {
            Some(format!(
                "block {b} (offset {}): holds {} but {} {} (pending after it: {:?})",
                b * BLOCK,
                tag_name(tag),
                tag_name(model.durable[b]),
                if model.flushed[b] {
                    "was made durable by a flush/FUA before the kill"
                } else {
                    "was read back after the previous restart (recovered state changed at the next crash)"
                },
                model.pending[b]
                    .iter()
                    .map(|t| tag_name(*t))
                    .collect::<Vec<_>>()
            ))
        };
        if let Some(p) = problem {
            bad_count += 1;
            if bad.len() < 12 {
                bad.push(p);
            }
        }
        model.durable[b] = tag;
        model.flushed[b] = false;
        model.pending[b].clear();
    }
    assert!(
        bad_count == 0,
        "after kill {kill}: {bad_count} of {A_BLOCKS} blocks of the flushed region are wrong; first ones:\n  {}",
        bad.join("\n  ")
    );
    (as_durable, as_pending)
}

/// crc32c as fio computes it (initial value !0, no final inversion).
fn fio_crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// Why a 4 KiB block of the fio region is not a valid fio block for `offset`, if it is not.
/// Layout (fio 3.x, --verify=crc32c --verify_interval=4k): a 40-byte header (magic
/// 0xacca, type, len, seed, offset, time, thread, numberio, crc32c of its first 36
/// bytes), the crc32c of the data after it, then the data.
fn fio_block_problem(block: &[u8], offset: u64) -> Option<String> {
    let u16_at = |i: usize| u16::from_le_bytes(block[i..i + 2].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(block[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(block[i..i + 8].try_into().unwrap());
    if u16_at(0) != 0xacca {
        return Some(format!("no fio header (starts {:02x?})", &block[..16]));
    }
    if u32_at(4) as usize != BLOCK {
        return Some(format!("header length {}", u32_at(4)));
    }
    if fio_crc32c(&block[..36]) != u32_at(36) {
        return Some("header crc32c mismatch".into());
    }
    if u64_at(16) != offset {
        return Some(format!(
            "header for offset {} (a block written elsewhere)",
            u64_at(16)
        ));
    }
    if fio_crc32c(&block[44..]) != u32_at(40) {
        return Some("data crc32c mismatch (torn or mixed block)".into());
    }
    None
}

/// Reads the fio region: no read may fail, and every block is zeros (never written) or a
/// whole fio block for its own offset. Returns how many blocks fio had written.
fn verify_fio_region(client: &mut NbdClient, kill: usize) -> usize {
    let start = (A_BLOCKS * BLOCK) as u64;
    let data = read_range(client, start, VOLUME - start, "fio region");
    let mut written = 0;
    let mut bad = Vec::new();
    let mut bad_count = 0;
    for (i, block) in data.chunks(BLOCK).enumerate() {
        let offset = start + (i * BLOCK) as u64;
        if block.iter().all(|&x| x == 0) {
            continue;
        }
        written += 1;
        if let Some(p) = fio_block_problem(block, offset) {
            bad_count += 1;
            if bad.len() < 12 {
                bad.push(format!("offset {offset}: {p}"));
            }
        }
    }
    assert!(
        bad_count == 0,
        "after kill {kill}: {bad_count} blocks of the fio region are not whole fio blocks; first ones:\n  {}",
        bad.join("\n  ")
    );
    // The check itself catches damage: a flipped bit, a torn block, a block for another offset.
    let mut fio_blocks = data
        .chunks(BLOCK)
        .enumerate()
        .filter(|(_, b)| b.iter().any(|&x| x != 0));
    if let (Some((i, one)), Some((_, other))) = (fio_blocks.next(), fio_blocks.next()) {
        let offset = start + (i * BLOCK) as u64;
        let mut flipped = one.to_vec();
        flipped[1000] ^= 0x10;
        let mut torn = one.to_vec();
        torn[2048..].copy_from_slice(&other[2048..]);
        assert!(fio_block_problem(&flipped, offset).is_some());
        assert!(fio_block_problem(&torn, offset).is_some());
        assert!(fio_block_problem(one, offset + BLOCK as u64).is_some());
    }
    written
}

/// fio's nbd engine writing at random over the fio region until killed.
fn start_fio(pool: &TestPool, server: &Server, kill: usize, rng: &mut Rng) -> (Child, PathBuf) {
    let out = pool.path(&format!("fio-{kill}.out"));
    let iodepth = [1, 4, 16, 32][rng.below(4) as usize];
    let child = tool("fio")
        .current_dir(pool.dir.path())
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri("vol0")),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            &format!("--iodepth={iodepth}"),
            &format!("--offset={}", A_BLOCKS * BLOCK),
            &format!("--size={}", VOLUME - (A_BLOCKS * BLOCK) as u64),
            "--verify=crc32c",
            "--verify_interval=4k",
            "--do_verify=0",
            "--fsync=32",
            "--time_based",
            "--runtime=60",
            &format!("--randseed={}", rng.next_u64() >> 1),
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(&out).unwrap(),
        ))
        .spawn()
        .expect("starting fio");
    (child, out)
}

/// A child process killed (and reaped) on drop unless waited for.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Waits up to `timeout` for it to exit; kills it after that.
    fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.0.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.0 = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.0 = None;
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.as_mut()?.try_wait().unwrap()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn nbd_writes_survive_repeated_sigkill() {
    if !need_tools(&["fio"]) {
        return;
    }
    let (n, seed) = (kills(), seed());
    eprintln!("kill loop over NBD: {n} kills, seed {seed} (LOGRAID_KILLS={n} LOGRAID_KILL_SEED={seed} to repeat)");
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let pool = TestPool::create("256M", &format!("vol0:{}M", VOLUME / MIB));
    let model = Arc::new(Mutex::new(Model::new()));
    let mut server = serve(&pool);
    let (mut flushes, mut writes, mut fio_blocks, mut from_pending) = (0, 0, 0, 0);
    for kill in 1..=n {
        let stop = Arc::new(AtomicBool::new(false));
        let client = NbdClient::connect(server.port, "vol0");
        let writer = {
            let (model, stop, wseed) = (model.clone(), stop.clone(), rng.next_u64());
            let round = kill as u64;
            std::thread::spawn(move || tagged_writer(client, model, round, wseed, stop))
        };
        let (fio, fio_out) = start_fio(&pool, &server, kill, &mut rng);
        let mut fio = ChildGuard(Some(fio));
        let delay = Duration::from_millis(150 + rng.below(1350));
        std::thread::sleep(delay);
        // Both loads must still be running: an error while the server is alive is a defect.
        if let Some(status) = fio.exited() {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "kill {kill}: fio exited before the kill ({status}):\n{}\nserver:\n{}",
                std::fs::read_to_string(&fio_out).unwrap_or_default(),
                server.stderr()
            );
        }
        if writer.is_finished() {
            panic!(
                "kill {kill}: the writer stopped before the kill: {:?}\nserver:\n{}",
                writer.join(),
                server.stderr()
            );
        }
        server.kill();
        stop.store(true, Ordering::Relaxed);
        let stats = writer.join().expect("writer thread panicked");
        assert!(
            stats.nbd_error.is_none(),
            "kill {kill}: the server answered a request with an error before the kill: {stats:?}"
        );
        if fio.wait_timeout(Duration::from_secs(30)).is_none() {
            eprintln!("kill {kill}: fio did not exit within 30 s of the kill; killed it");
        }
        if kill == n {
            // The crashed pool, opened read-only by a scrub: nothing lost.
            let note = scrub_check_clean(&pool, &format!("after kill {kill} (crashed pool)"), true);
            eprintln!("scrub --check of the crashed pool: {note}");
        }
        let restart = Instant::now();
        server = serve(&pool);
        let restart = restart.elapsed();
        let mut c = NbdClient::connect(server.port, "vol0");
        let (d, p) = verify_tagged_region(&mut c, &mut model.lock().unwrap(), kill);
        let fio_written = verify_fio_region(&mut c, kill);
        c.disconnect();
        eprintln!(
            "kill {kill}/{n} after {} ms: {} writes ({} FUA), {} trims, {} flushes acknowledged ({}); \
             restart {:.2} s; tagged region: {d} blocks as durable, {p} from later writes; fio region: {fio_written} blocks written, all whole",
            delay.as_millis(),
            stats.writes,
            stats.fua_writes,
            stats.trims,
            stats.flushes,
            stats.end,
            restart.as_secs_f64(),
        );
        flushes += stats.flushes;
        writes += stats.writes;
        fio_blocks += fio_written;
        from_pending += p;
    }
    let server_log = recovery_note(&server);
    server.terminate();
    let note = scrub_check_clean(&pool, "after the clean stop", false);
    eprintln!("scrub --check after the clean stop: {note}; last start: {server_log}");
    eprintln!(
        "kill loop over NBD: {n} kills done (seed {seed}): {writes} tagged writes and {flushes} flushes \
         acknowledged before kills, {from_pending} block reads from unflushed writes, fio region {fio_blocks} block checks; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// 2. ext4 on the attached volume, killed again and again.
// ---------------------------------------------------------------------------

/// Files: path relative to the mount → sha256.
type Manifest = BTreeMap<PathBuf, String>;

fn sync_fs(root: &Path) -> std::io::Result<()> {
    let dir = std::fs::File::open(root)?;
    // SAFETY: syncfs on a valid descriptor we own.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[derive(Default)]
struct FsRound {
    /// Files every completed syncfs covered: must be intact after the kill.
    synced: Manifest,
    /// Created since the last completed syncfs: may be missing or incomplete.
    created: Manifest,
    /// Synced files removed since the last completed syncfs: intact or gone.
    deleted: Manifest,
    syncs: u64,
    files_created: u64,
    files_deleted: u64,
    end: String,
}

/// Creates files (mostly small, a few up to 1 MiB), deletes old ones so the volume does not
/// fill, and calls syncfs every few; until told to stop or an error (the device died).
fn fs_writer(
    root: PathBuf,
    mut st: FsRound,
    kill: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> FsRound {
    let mut rng = Rng::new(seed);
    let mut n = 0u64;
    let mut until_sync = 1 + rng.below(8);
    let result = (|| -> std::io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            if until_sync == 0 {
                sync_fs(&root)?;
                st.syncs += 1;
                st.synced.append(&mut st.created);
                for rel in std::mem::take(&mut st.deleted).keys() {
                    st.synced.remove(rel);
                }
                until_sync = 1 + rng.below(8);
                continue;
            }
            until_sync -= 1;
            // Keep about 600 files: delete more often the more there are.
            let live = (st.synced.len() - st.deleted.len()) as u64;
            let deletes = if live >= 600 {
                1 + rng.below(2)
            } else {
                u64::from(rng.below(600) < live)
            };
            for _ in 0..deletes {
                let candidates: Vec<&PathBuf> = st
                    .synced
                    .keys()
                    .filter(|k| !st.deleted.contains_key(*k))
                    .collect();
                if !candidates.is_empty() {
                    let rel = candidates[rng.below(candidates.len() as u64) as usize].clone();
                    std::fs::remove_file(root.join(&rel))?;
                    let sha = st.synced[&rel].clone();
                    st.deleted.insert(rel, sha);
                    st.files_deleted += 1;
                }
            }
            let size = match rng.below(20) {
                0 => 0,
                1..=15 => rng.below(64 * 1024),
                _ => rng.below(1024 * 1024),
            } as usize;
            let data = rng.bytes(size);
            n += 1;
            let dir = PathBuf::from(format!("d{}", rng.below(8)));
            std::fs::create_dir_all(root.join(&dir))?;
            let rel = dir.join(format!("k{kill:03}-{n:05}.bin"));
            std::fs::File::create(root.join(&rel))?.write_all(&data)?;
            st.created.insert(rel, sha256_hex(&data));
            st.files_created += 1;
        }
        Ok(())
    })();
    st.end = match result {
        Ok(()) => "stopped".into(),
        Err(e) => e.to_string(),
    };
    st
}

/// After a restart: every synced file is intact; files removed before the kill but not
/// synced are intact or gone. Then the state is made exact again: what is not in the
/// manifest is removed and a syncfs covers that.
fn verify_and_settle(root: &Path, st: &mut FsRound, kill: usize) -> usize {
    let mut bad = Vec::new();
    for (rel, sha) in &st.synced {
        let deleted = st.deleted.contains_key(rel);
        match std::fs::read(root.join(rel)) {
            Ok(data) if &sha256_hex(&data) == sha => {}
            Err(e) if deleted && e.kind() == std::io::ErrorKind::NotFound => {}
            Ok(data) => bad.push(format!(
                "{}: content differs ({} bytes){}",
                rel.display(),
                data.len(),
                if deleted {
                    " (removed, not synced)"
                } else {
                    ""
                }
            )),
            Err(e) => bad.push(format!("{}: {e}", rel.display())),
        }
    }
    assert!(
        bad.is_empty(),
        "after kill {kill}: {} of {} synced files are wrong: {bad:?}",
        bad.len(),
        st.synced.len()
    );
    // Settle: the deleted ones go for good, unsynced new files are dropped.
    for rel in std::mem::take(&mut st.deleted).keys() {
        st.synced.remove(rel);
    }
    st.created.clear();
    let keep: BTreeSet<PathBuf> = st.synced.keys().cloned().collect();
    let mut extra = 0;
    for d in std::fs::read_dir(root).unwrap() {
        let d = d.unwrap();
        if !d.file_type().unwrap().is_dir() || d.file_name() == "lost+found" {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let rel = PathBuf::from(d.file_name()).join(f.file_name());
            if !keep.contains(&rel) {
                std::fs::remove_file(f.path()).unwrap();
                extra += 1;
            }
        }
    }
    sync_fs(root).unwrap();
    extra
}

#[test]
fn ext4_survives_repeated_sigkill() {
    ext4_kill_loop(false);
}

/// The same through the server's own FUSE file (`serve --fuse`, `attach --file`): a killed
/// server leaves its mount behind, and the next one replaces it.
#[test]
fn ext4_on_the_servers_fuse_file_survives_repeated_sigkill() {
    ext4_kill_loop(true);
}

fn ext4_kill_loop(server_fuse: bool) {
    if !need_block_devices(&["mkfs.ext4", "fsck.ext4"]) {
        return;
    }
    let (n, seed) = (kills(), seed());
    let how = if server_fuse {
        "the server's FUSE file"
    } else {
        "nbdfuse"
    };
    eprintln!(
        "kill loop on ext4 through {how}: {n} kills, seed {seed} (LOGRAID_KILLS={n} LOGRAID_KILL_SEED={seed} to repeat)"
    );
    let started = Instant::now();
    let mut rng = Rng::new(seed ^ 0xE4E4_E4E4);
    let pool = TestPool::create("512M", "vol0:400M");
    let (state, mnt, files) = (pool.path("state"), pool.path("mnt"), pool.path("files"));
    let fuse_args = ["--fuse", files.to_str().unwrap()];
    let serve = |pool: &TestPool| serve_with(pool, if server_fuse { &fuse_args } else { &[] });
    let attach = |server: &Server| {
        if server_fuse {
            Attachment::attach_file(&files.join("vol0"), &state)
        } else {
            Attachment::attach(server, "vol0", &state)
        }
    };
    let mut server = serve(&pool);
    let mut att = attach(&server);
    run(tool("mkfs.ext4").args(["-q", "-F"]).arg(&att.device));
    let mut m = Mount::at(&att.device, &mnt);
    let mut st = FsRound::default();
    let (mut total_syncs, mut total_created) = (0, 0);
    for kill in 1..=n {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (root, stop, wseed) = (m.dir.clone(), stop.clone(), rng.next_u64());
            let st = std::mem::take(&mut st);
            std::thread::spawn(move || fs_writer(root, st, kill, wseed, stop))
        };
        let delay = Duration::from_millis(200 + rng.below(1300));
        std::thread::sleep(delay);
        if writer.is_finished() {
            stop.store(true, Ordering::Relaxed);
            let r = writer.join().expect("writer thread panicked");
            panic!("kill {kill}: the writer stopped before the kill: {}", r.end);
        }
        server.kill();
        stop.store(true, Ordering::Relaxed);
        st = writer.join().expect("writer thread panicked");
        // The device is dead: unmounting reports write errors; that is expected.
        drop(m);
        att.detach();

        let restart = Instant::now();
        server = serve(&pool);
        let restart = restart.elapsed();
        att = attach(&server);
        m = Mount::at(&att.device, &mnt);
        let checked = st.synced.len() - st.deleted.len();
        let extra = verify_and_settle(&m.dir, &mut st, kill);
        m.unmount();
        run(tool("fsck.ext4").args(["-f", "-n"]).arg(&att.device));
        eprintln!(
            "kill {kill}/{n} after {} ms: {} files created, {} deleted, {} syncfs completed ({}); \
             restart {:.2} s; {checked} synced files intact, {extra} unsynced leftovers removed; fsck clean",
            delay.as_millis(),
            st.files_created,
            st.files_deleted,
            st.syncs,
            st.end,
            restart.as_secs_f64()
        );
        total_syncs += st.syncs;
        total_created += st.files_created;
        st.syncs = 0;
        st.files_created = 0;
        st.files_deleted = 0;
        m = Mount::at(&att.device, &mnt);
    }
    m.unmount();
    att.detach();
    server.terminate();
    let note = scrub_check_clean(&pool, "after the clean stop", false);
    eprintln!(
        "kill loop on ext4 through {how}: {n} kills done (seed {seed}): {total_created} files created, {total_syncs} syncfs \
         completed before kills, {} files at the end; scrub --check: {note}; {:.1} s",
        st.synced.len(),
        started.elapsed().as_secs_f64()
    );
}
