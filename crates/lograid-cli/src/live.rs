//! Live status of served pools. A pool is open in one process at a time (its
//! drives are locked), so `lograid serve` publishes its pool's status as JSON
//! in the run directory once a second (`pool-<uuid>.json`, written to a
//! temporary file and renamed), and removes it when it stops; `lograid
//! status` reads it when the drives are held by that server.
//!
//! The run directory is `$LOGRAID_RUN_DIR`, else /run/lograid (made if
//! missing), else a folder in the temporary directory.

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
}

pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LOGRAID_RUN_DIR") {
        return PathBuf::from(d);
    }
    let system = PathBuf::from("/run/lograid");
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
    pub fn start(pool: Pool) -> Result<Publisher> {
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
