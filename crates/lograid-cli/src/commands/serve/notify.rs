//! `lograid serve` as a systemd `Type=notify` service: the sd_notify(3)
//! protocol and the watchdog.
//!
//! Owns: reading `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`, sending
//! state lines (`READY=1`, `STATUS=`, `STOPPING=1`, `WATCHDOG=1`) as one
//! datagram each to the manager's socket (a path, or an abstract socket
//! named `@...`), and the thread that pets the watchdog only while a probe
//! of the engine returns. Must never: send anything when `NOTIFY_SOCKET` is
//! unset, or stop the server because the manager does not listen (a failed
//! send is logged once and otherwise ignored).
//!
//! Written on std's `UnixDatagram` rather than the `sd-notify` crate: its
//! 0.5 connects to `NOTIFY_SOCKET` as a path, so an abstract `@name` (which
//! sd_notify(3) accepts) fails there.

use lograid::{Pool, PoolStatus};
use lograid_nbd::ListenAddr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// How long one send may block (the manager reads its socket at once; a
/// full queue must not hold up the shutdown that sends `STOPPING=1`).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The manager's notification socket, or nothing outside a `Type=notify` service.
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    /// Where it points, for messages.
    shown: String,
    warned: AtomicBool,
    stopping: AtomicBool,
}

impl Notifier {
    /// From `NOTIFY_SOCKET` (unset or empty: a notifier that sends nothing).
    /// A value that cannot be used is said on stderr, and nothing is sent.
    pub fn from_env() -> Notifier {
        let value = std::env::var_os("NOTIFY_SOCKET").unwrap_or_default();
        let shown = value.to_string_lossy().into_owned();
        let target = match socket_addr(value.as_bytes()) {
            Ok(None) => None,
            Ok(Some(addr)) => match UnixDatagram::unbound()
                .and_then(|s| s.set_write_timeout(Some(SEND_TIMEOUT)).map(|()| s))
            {
                Ok(socket) => Some((socket, addr)),
                Err(e) => {
                    eprintln!("lograid: warning: NOTIFY_SOCKET={shown}: cannot make a socket: {e}; systemd will not be told this server is ready");
                    None
                }
            },
            Err(e) => {
                eprintln!("lograid: warning: NOTIFY_SOCKET={shown}: {e}; systemd will not be told this server is ready");
                None
            }
        };
        Notifier {
            target,
            shown,
            warned: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// Sends `lines` (e.g. "READY=1", "STATUS=...") as one datagram; nothing
    /// without a socket. The first failure is logged, later ones are not.
    pub fn send(&self, lines: &[&str]) {
        let Some((socket, addr)) = &self.target else {
            return;
        };
        let mut message = String::new();
        for line in lines {
            // A newline would start another assignment: keep each on its line.
            message.push_str(&line.replace('\n', " "));
            message.push('\n');
        }
        if let Err(e) = socket.send_to_addr(message.as_bytes(), addr) {
            if !self.warned.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    "sending {:?} to systemd (NOTIFY_SOCKET={}) failed: {e} (further failures are not logged)",
                    lines.first().copied().unwrap_or_default(),
                    self.shown
                );
            }
        }
    }

    /// `READY=1` with the pool's status line: the pool is open (recovery
    /// done) and every listener is bound.
    pub fn ready(&self, status: &str) {
        self.send(&["READY=1", &format!("STATUS={status}")]);
    }

    /// `STOPPING=1` (once, however often called): the clean close has begun.
    pub fn stopping(&self, status: &str) {
        if !self.stopping.swap(true, Ordering::SeqCst) {
            self.send(&["STOPPING=1", &format!("STATUS={status}")]);
        }
    }
}

/// Where `NOTIFY_SOCKET` points: None when empty, an abstract socket for
/// `@name` (Linux only), else an absolute path. Other forms (a relative path, systemd
/// 254's `vsock:`) are refused.
fn socket_addr(value: &[u8]) -> io::Result<Option<SocketAddr>> {
    match value {
        [] => Ok(None),
        [b'@', name @ ..] => crate::os::abstract_socket(name).map(Some),
        [b'/', ..] => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(value)).map(Some),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute path or an abstract socket (@name)",
        )),
    }
}

/// The watchdog interval systemd asks this process for: `WATCHDOG_USEC`
/// when it is a positive number and `WATCHDOG_PID` is unset or our pid.
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_of(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

fn watchdog_interval_of(usec: Option<&str>, pid: Option<&str>, our_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    match pid {
        None => {}
        Some(p) if p.trim().parse::<u32>().ok() == Some(our_pid) => {}
        Some(_) => return None,
    }
    Some(Duration::from_micros(usec))
}

/// A thread that sends `WATCHDOG=1` every half interval, each time after a
/// probe of the engine returned (and a new `STATUS=` when the probe's line
/// changed). A probe that blocks (a deadlocked engine) stops the petting,
/// and systemd then kills and restarts the server. Stopped on drop.
pub struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(
        notifier: Arc<Notifier>,
        interval: Duration,
        mut probe: impl FnMut() -> String + Send + 'static,
        mut status: String,
    ) -> io::Result<Watchdog> {
        let (stop, stopped) = mpsc::channel::<()>();
        let every = interval / 2;
        let thread = std::thread::Builder::new()
            .name("lograid-watchdog".into())
            .spawn(move || loop {
                match stopped.recv_timeout(every) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let now = probe();
                if now != status {
                    notifier.send(&["WATCHDOG=1", &format!("STATUS={now}")]);
                    status = now;
                } else {
                    notifier.send(&["WATCHDOG=1"]);
                }
            })?;
        Ok(Watchdog {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Tells systemd the server is ready (the pool is open, `addrs` are bound)
/// and starts the watchdog if systemd asks for one. Nothing without
/// `NOTIFY_SOCKET`.
pub fn announce_ready(
    notifier: &Arc<Notifier>,
    pool: &Pool,
    addrs: &[ListenAddr],
) -> Option<Watchdog> {
    notifier.target.as_ref()?;
    let addrs = addrs.to_vec();
    let status = status_line(&pool.status(), &addrs);
    notifier.ready(&status);
    let interval = watchdog_interval()?;
    let pool = pool.clone();
    // `Pool::status` takes the engine's ledger lock (held only for
    // bookkeeping, never across member I/O): a cheap proof of life.
    let probe = move || status_line(&pool.status(), &addrs);
    match Watchdog::start(notifier.clone(), interval, probe, status) {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("lograid: warning: cannot start the watchdog thread: {e}; systemd will restart this server when WatchdogSec runs out");
            None
        }
    }
}

/// One line for `systemctl status`: what is served where, and what is wrong.
pub fn status_line(status: &PoolStatus, addrs: &[ListenAddr]) -> String {
    let volumes = status.volumes.len();
    let mut line = format!(
        "serving pool '{}'{}: {volumes} volume{} on {}",
        status.name,
        if status.read_only { " read-only" } else { "" },
        if volumes == 1 { "" } else { "s" },
        addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    if status.state != "online" {
        line = format!("{}: {line}", status.state);
        let unwell: Vec<String> = status
            .members
            .iter()
            .filter(|m| m.state != "online")
            .map(|m| format!("member {} {}", m.index, m.state))
            .collect();
        if !unwell.is_empty() {
            line.push_str(&format!("; {}", unwell.join(", ")));
        }
    }
    if let Some(r) = &status.reshape {
        line.push_str(&format!(
            "; {}{}: {} segments left",
            r.kind,
            if r.paused { " (paused)" } else { "" },
            r.segments_left
        ));
    }
    // What the health adds beyond the state (lost data, low space).
    for why in status
        .health_reasons
        .iter()
        .filter(|w| w.contains("lost") || w.contains("low on space") || w.contains("stopped"))
    {
        line.push_str(&format!("; {why}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_forms() {
        assert!(socket_addr(b"").unwrap().is_none());
        let path = socket_addr(b"/run/systemd/notify").unwrap().unwrap();
        assert_eq!(
            path.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        // Where the system has abstract sockets, `@name` is one (`crate::os` checks its name).
        match crate::os::abstract_socket(b"lograid/notify") {
            Ok(_) => {
                let abs = socket_addr(b"@lograid/notify").unwrap().unwrap();
                assert!(abs.as_pathname().is_none() && !abs.is_unnamed());
            }
            Err(_) => assert!(socket_addr(b"@lograid/notify").is_err()),
        }
        assert!(socket_addr(b"relative/notify").is_err());
        assert!(socket_addr(b"vsock:2:1234").is_err());
    }

    #[test]
    fn watchdog_env() {
        let s = Some;
        assert_eq!(
            watchdog_interval_of(s("30000000"), None, 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            watchdog_interval_of(s("30000000"), s("7"), 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(watchdog_interval_of(s("30000000"), s("8"), 7), None);
        assert_eq!(watchdog_interval_of(s("30000000"), s("x"), 7), None);
        assert_eq!(watchdog_interval_of(s("0"), None, 7), None);
        assert_eq!(watchdog_interval_of(s("-1"), None, 7), None);
        assert_eq!(watchdog_interval_of(None, s("7"), 7), None);
    }

    #[test]
    fn unset_socket_sends_nothing() {
        let n = Notifier {
            target: None,
            shown: String::new(),
            warned: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        };
        n.ready("x");
        n.stopping("y");
        assert!(!n.warned.load(Ordering::SeqCst));
    }

    #[test]
    fn one_datagram_per_send() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let addr = SocketAddr::from_pathname(&path).unwrap();
        let n = Notifier {
            target: Some((UnixDatagram::unbound().unwrap(), addr)),
            shown: path.display().to_string(),
            warned: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        };
        n.ready("serving\nall");
        n.stopping("closing");
        n.stopping("again");
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving all\n");
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=closing\n");
        server.set_nonblocking(true).unwrap();
        assert!(server.recv(&mut buf).is_err(), "STOPPING=1 sent twice");
    }
}
