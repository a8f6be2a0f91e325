//! Live status of served pools. A pool is open in one process at a time (its
//! drives are locked), so `lograid serve` publishes its pool's status as JSON
//! in the run directory once a second (`pool-<uuid>.json`, written to a
//! temporary file and renamed), and removes it when it stops; `lograid
//! status` reads it when the drives are held by that server.
//!
//! The run directory is `$LOGRAID_RUN_DIR`, else the system's
//! (`crate::os::RUN_DIR`: /run/lograid on Linux, /var/run/lograid on macOS;
//! made if missing), else a folder in the temporary directory.

use anyhow::{Context, Result};
use lograid::{Pool, PoolStatus};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Serialize, Deserialize)]
pub struct Published {
    pub pid: u32,
    pub updated_unix: f64,
    pub status: PoolStatus,
    /// The server's scrub, running or last finished.
    #[serde(default)]
    pub scrub: Option<ScrubProgress>,
}

/// A scrub run by the server (`lograid scrub` on a served pool, or
/// `serve --scrub-every`).
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct ScrubProgress {
    /// running, paused, finished, cancelled or failed.
    pub state: String,
    pub repair: bool,
    pub rows_done: u64,
    pub rows_total: u64,
    pub started_unix: f64,
    pub seconds: f64,
    /// Set when it ended.
    pub report: Option<lograid::ScrubReport>,
    pub error: Option<String>,
}

/// The server's background jobs that clients control.
#[derive(Default)]
pub struct Jobs {
    pub scrub: parking_lot::Mutex<Option<ScrubProgress>>,
    pause: AtomicBool,
    cancel: AtomicBool,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Jobs {
    /// Starts a scrub in the background, unless one is running.
    pub fn start_scrub(self: &Arc<Self>, pool: &Pool, repair: bool) -> Result<String> {
        let mut thread = self.thread.lock();
        if thread.as_ref().is_some_and(|t| !t.is_finished()) {
            anyhow::bail!("a scrub is already running (pause, resume or cancel it)");
        }
        self.pause.store(false, Ordering::SeqCst);
        self.cancel.store(false, Ordering::SeqCst);
        let started = std::time::Instant::now();
        *self.scrub.lock() = Some(ScrubProgress {
            state: "running".into(),
            repair,
            started_unix: now_unix(),
            ..Default::default()
        });
        let (jobs, pool) = (self.clone(), pool.clone());
        *thread = Some(
            std::thread::Builder::new()
                .name("lograid-scrub".into())
                .spawn(move || {
                    let result = pool.scrub(repair, |done, total| {
                        while jobs.pause.load(Ordering::SeqCst)
                            && !jobs.cancel.load(Ordering::SeqCst)
                        {
                            if let Some(p) = jobs.scrub.lock().as_mut() {
                                p.state = "paused".into();
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        if let Some(p) = jobs.scrub.lock().as_mut() {
                            p.state = "running".into();
                            p.rows_done = done;
                            p.rows_total = total;
                            p.seconds = started.elapsed().as_secs_f64();
                        }
                        !jobs.cancel.load(Ordering::SeqCst)
                    });
                    let mut guard = jobs.scrub.lock();
                    let p = guard.get_or_insert_with(Default::default);
                    p.seconds = started.elapsed().as_secs_f64();
                    match result {
                        Ok(report) => {
                            p.state = if report.complete {
                                "finished"
                            } else {
                                "cancelled"
                            }
                            .into();
                            tracing::info!(
                                "scrub {}: {} rows, {} repaired, {} lost",
                                p.state,
                                report.rows_checked,
                                report.repaired_blocks,
                                report.lost_blocks.len()
                            );
                            p.report = Some(report);
                        }
                        Err(e) => {
                            p.state = "failed".into();
                            p.error = Some(e.to_string());
                        }
                    }
                })?,
        );
        Ok(format!(
            "scrub started ({})",
            if repair { "repairing" } else { "check only" }
        ))
    }
}

pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LOGRAID_RUN_DIR") {
        return PathBuf::from(d);
    }
    let system = PathBuf::from(crate::os::RUN_DIR);
    if std::fs::create_dir_all(&system).is_ok() {
        return system;
    }
    // SAFETY: getuid has no failure mode.
    std::env::temp_dir().join(format!("lograid-{}", unsafe { libc::getuid() }))
}

fn status_path(uuid: &str) -> PathBuf {
    run_dir().join(format!("pool-{uuid}.json"))
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Publishes a pool's status every second until dropped.
pub struct Publisher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl Publisher {
    pub fn start(pool: Pool, jobs: Arc<Jobs>) -> Result<Publisher> {
        let dir = run_dir();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the run directory {}", dir.display()))?;
        let path = status_path(&pool.status().uuid);
        let stop = Arc::new(AtomicBool::new(false));
        let publish = {
            let path = path.clone();
            move |pool: &Pool| -> std::io::Result<()> {
                let doc = Published {
                    pid: std::process::id(),
                    updated_unix: now_unix(),
                    status: pool.status(),
                    scrub: jobs.scrub.lock().clone(),
                };
                let tmp = path.with_extension("json.tmp");
                std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)?;
                std::fs::rename(&tmp, &path)
            }
        };
        publish(&pool).with_context(|| format!("writing {}", path.display()))?;
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("lograid-status".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        for _ in 0..10 {
                            if stop.load(Ordering::SeqCst) {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        if let Err(e) = publish(&pool) {
                            tracing::warn!("publishing the pool's status: {e}");
                        }
                    }
                })?
        };
        Ok(Publisher {
            stop,
            thread: Some(thread),
            path,
        })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The status a live server published for the pool `uuid`, if its process
/// is still running.
pub fn read(uuid: &str) -> Option<(Published, f64)> {
    let text = std::fs::read(status_path(uuid)).ok()?;
    let doc: Published = serde_json::from_slice(&text).ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(doc.pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    let age = now_unix() - doc.updated_unix;
    alive.then_some((doc, age))
}

/// A request to a running server over its control socket
/// (`pool-<uuid>.sock` in the run directory, owner-only): one JSON line in,
/// one JSON line out.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Request {
    /// Replace member `old` (index) by the drive at `new` (created sparse
    /// with `size` bytes if it does not exist).
    Replace {
        old: usize,
        new: PathBuf,
        size: Option<u64>,
        force: bool,
    },
    /// Add drives.
    Add {
        drives: Vec<PathBuf>,
        size: Option<u64>,
        force: bool,
    },
    /// Remove member `old` (index) without a replacement: its rows move to
    /// the other members.
    Remove {
        old: usize,
    },
    /// Pause (true) or resume (false) the rebuild or rebalance.
    PauseReshape(bool),
    /// Change the parity count of new and (by a rebalance) old rows.
    SetParity(u8),
    /// Start a scrub (repairing unless `repair` is false).
    Scrub {
        repair: bool,
    },
    /// Pause (true) or resume (false) the scrub.
    PauseScrub(bool),
    CancelScrub,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Reply {
    pub ok: bool,
    pub message: String,
}

fn control_path(uuid: &str) -> PathBuf {
    run_dir().join(format!("pool-{uuid}.sock"))
}

/// Carries out `req` on an open pool (in the server, or in the command
/// itself when the pool is not served).
pub fn apply(pool: &Pool, jobs: &Arc<Jobs>, req: &Request) -> Result<String> {
    match req {
        Request::Scrub { repair } => jobs.start_scrub(pool, *repair),
        Request::PauseScrub(pause) => {
            if !jobs.running() {
                anyhow::bail!("no scrub is running");
            }
            jobs.pause.store(*pause, Ordering::SeqCst);
            Ok(if *pause {
                "scrub paused"
            } else {
                "scrub resumed"
            }
            .into())
        }
        Request::CancelScrub => {
            if !jobs.running() {
                anyhow::bail!("no scrub is running");
            }
            jobs.cancel.store(true, Ordering::SeqCst);
            Ok("scrub cancelled".into())
        }
        Request::Replace {
            old,
            new,
            size,
            force,
        } => replace(pool, *old, new, *size, *force),
        Request::Add {
            drives,
            size,
            force,
        } => {
            let members = lograid::open_new_members(drives, *size, *force)?;
            let added = pool.add_members(members)?;
            Ok(format!(
                "added member(s) {added:?}; rebalancing old rows to the new width in the background"
            ))
        }
        Request::Remove { old } => {
            pool.remove_member(*old)?;
            Ok(format!(
                "member {old} is being removed; its rows are moved to the other members in the background"
            ))
        }
        Request::SetParity(parity) => {
            pool.set_parity(*parity)?;
            Ok(format!(
                "parity is now {parity} for new rows; older rows are moved to it in the background"
            ))
        }
        Request::PauseReshape(pause) => {
            pool.set_reshape_paused(*pause);
            Ok(if *pause { "paused" } else { "resumed" }.into())
        }
    }
}

/// Replaces member `old` by the drive at `new` (see [`Request::Replace`]).
fn replace(
    pool: &Pool,
    old: usize,
    new: &std::path::Path,
    size: Option<u64>,
    force: bool,
) -> Result<String> {
    // The old drive back again: close it first (it holds its lock).
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    let same = pool.status().members.iter().any(|m| {
        m.index == old && canon(std::path::Path::new(&m.path)) == canon(new) && canon(new).is_some()
    });
    if same && !pool.release_faulted_member(old) {
        anyhow::bail!(
            "{} is member {old} and has not failed; give a different drive to replace it",
            new.display()
        );
    }
    // A drive of this very pool (a member that came back) is taken
    // without --force: the engine checks it is the one replaced.
    let ours = lograid::device::FileMember::open(new, lograid::device::OpenMode::Peek)
        .ok()
        .and_then(|m| lograid::read_superblock(&m).ok())
        .is_some_and(|sb| sb.pool_uuid == pool.uuid());
    let member = lograid::open_new_members(&[new.to_path_buf()], size, force || ours)?
        .pop()
        .context("no drive opened")?;
    let index = pool.replace_member(old, member)?;
    Ok(if index == old {
        format!(
            "{} takes the place of member {old}; rebuilding its columns in place in the background",
            new.display()
        )
    } else {
        format!(
            "member {old} is being replaced by {} (member {index}); rebuilding in the background",
            new.display()
        )
    })
}

/// Serves control requests for `pool` until dropped.
pub struct Control {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Control {
    pub fn start(pool: Pool, jobs: Arc<Jobs>) -> Result<Control> {
        use std::io::{BufRead, Write};
        use std::os::unix::fs::PermissionsExt;
        let path = control_path(&pool.status().uuid);
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("lograid-control".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let stream = match listener.accept() {
                            Ok((s, _)) => s,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!("control socket: {e}");
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                        };
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut line = String::new();
                        // Bounded: a request is a short JSON line.
                        let mut reader =
                            std::io::BufReader::new(std::io::Read::take(&stream, 64 << 10));
                        let reply = match reader.read_line(&mut line) {
                            Ok(_) => match serde_json::from_str::<Request>(&line) {
                                Ok(req) => match apply(&pool, &jobs, &req) {
                                    Ok(message) => Reply { ok: true, message },
                                    Err(e) => Reply {
                                        ok: false,
                                        message: format!("{e:#}"),
                                    },
                                },
                                Err(e) => Reply {
                                    ok: false,
                                    message: format!("malformed request: {e}"),
                                },
                            },
                            Err(e) => Reply {
                                ok: false,
                                message: format!("reading the request: {e}"),
                            },
                        };
                        let mut out = &stream;
                        if let Ok(text) = serde_json::to_string(&reply) {
                            let _ = writeln!(out, "{text}");
                        }
                    }
                })?
        };
        Ok(Control {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Sends `req` to the server of pool `uuid`.
pub fn send(uuid: &str, req: &Request) -> Result<Reply> {
    use std::io::{BufRead, Write};
    let path = control_path(uuid);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "connecting to the server's control socket {}",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(600)))?;
    writeln!(stream, "{}", serde_json::to_string(req)?)?;
    let mut line = String::new();
    std::io::BufReader::new(&stream).read_line(&mut line)?;
    serde_json::from_str(&line).context("the server's reply")
}

impl Jobs {
    /// Is a scrub running (or paused)?
    fn running(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Cancels a running scrub and waits for it (server shutdown).
    pub fn stop(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Starts a repairing scrub every `every` until dropped (skipped while one runs).
pub struct Scheduler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn schedule_scrubs(pool: Pool, jobs: Arc<Jobs>, every: Duration) -> Scheduler {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("lograid-scrub-timer".into())
            .spawn(move || {
                let mut next = std::time::Instant::now() + every;
                while !stop.load(Ordering::SeqCst) {
                    if std::time::Instant::now() >= next {
                        match jobs.start_scrub(&pool, true) {
                            Ok(_) => tracing::info!("scheduled scrub started"),
                            Err(e) => tracing::info!("scheduled scrub skipped: {e:#}"),
                        }
                        next += every;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .ok()
    };
    Scheduler { stop, thread }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
