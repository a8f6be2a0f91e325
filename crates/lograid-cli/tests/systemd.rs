//! `lograid serve` as a systemd `Type=notify` service, without systemd: the
//! test plays the manager. It binds the notification socket (a path, or an
//! abstract `@name`), starts the real binary with `NOTIFY_SOCKET` and
//! `WATCHDOG_USEC` set, and checks what arrives: `READY=1` only once
//! recovery is done and the NBD port answers, `WATCHDOG=1` at about half the
//! interval, `STOPPING=1` on SIGTERM before a clean exit. Without
//! `NOTIFY_SOCKET`, or with nobody listening on it, the server runs as before.

// systemd and its abstract notification sockets: Linux only.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// The manager's side: a bound datagram socket and what arrived on it, when.
struct Manager {
    socket: UnixDatagram,
    /// What `NOTIFY_SOCKET` is set to.
    env: String,
    got: Vec<(Instant, String)>,
}

impl Manager {
    fn at_path(path: &Path) -> Manager {
        let socket = UnixDatagram::bind(path).unwrap();
        Self::with(socket, path.display().to_string())
    }

    fn abstract_named(name: &str) -> Manager {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        Self::with(UnixDatagram::bind_addr(&addr).unwrap(), format!("@{name}"))
    }

    fn with(socket: UnixDatagram, env: String) -> Manager {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Manager {
            socket,
            env,
            got: Vec::new(),
        }
    }

    /// Receives until a message holds `line` (returns its index in `got`),
    /// the service exits, or `timeout` runs out (both None).
    fn until(&mut self, line: &str, service: &mut Service, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(i) = self.receive_one() {
                if self.got[i].1.lines().any(|l| l == line) {
                    return Some(i);
                }
                continue;
            }
            if service.exited().is_some() {
                // Whatever was sent before the exit is queued: read it all.
                while let Some(i) = self.receive_one() {
                    if self.got[i].1.lines().any(|l| l == line) {
                        return Some(i);
                    }
                }
                return None;
            }
        }
        None
    }

    /// Everything that arrives within `time`.
    fn listen_for(&mut self, time: Duration) {
        let end = Instant::now() + time;
        while Instant::now() < end {
            self.receive_one();
        }
    }

    fn receive_one(&mut self) -> Option<usize> {
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8(buf[..n].to_vec()).unwrap();
                self.got.push((Instant::now(), text));
                Some(self.got.len() - 1)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("receiving on the notify socket: {e}"),
        }
    }

    fn messages_with(&self, line: &str) -> Vec<Instant> {
        self.got
            .iter()
            .filter(|(_, m)| m.lines().any(|l| l == line))
            .map(|(t, _)| *t)
            .collect()
    }

    fn shown(&self) -> String {
        format!("{:#?}", self.got.iter().map(|(_, m)| m).collect::<Vec<_>>())
    }
}

/// `lograid serve` started as systemd would: exec'd with its environment.
struct Service {
    child: Option<Child>,
    status: Option<ExitStatus>,
    port: u16,
    stderr_path: PathBuf,
}

/// How the service is given `WATCHDOG_PID`.
#[derive(Clone, Copy)]
enum WatchdogPid {
    Unset,
    /// Its own pid (set by a shell that then execs lograid, keeping the pid).
    Ours,
    Other,
}

impl Service {
    fn start(
        drives: &[PathBuf],
        log_dir: &Path,
        env: &[(&str, &str)],
        pid: WatchdogPid,
    ) -> Service {
        for attempt in 0..3 {
            let port = free_port();
            let stderr_path = log_dir.join(format!("systemd-serve-{port}-{attempt}.err"));
            let mut cmd = Command::new("/bin/sh");
            let script = match pid {
                WatchdogPid::Ours => r#"WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$0" "$@""#,
                WatchdogPid::Other => r#"WATCHDOG_PID=1; export WATCHDOG_PID; exec "$0" "$@""#,
                WatchdogPid::Unset => r#"unset WATCHDOG_PID; exec "$0" "$@""#,
            };
            cmd.args(["-c", script, BIN, "serve"])
                .args(drives)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .env("RUST_LOG", "info")
                .env_remove("NOTIFY_SOCKET")
                .env_remove("WATCHDOG_USEC")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr_path).unwrap());
            for (k, v) in env {
                cmd.env(k, v);
            }
            let mut service = Service {
                child: Some(cmd.spawn().unwrap()),
                status: None,
                port,
                stderr_path,
            };
            // A port taken meanwhile fails the bind at once, before any READY.
            std::thread::sleep(Duration::from_millis(100));
            if service.exited().is_some() && service.stderr().contains("Address already in use") {
                continue;
            }
            return service;
        }
        panic!("no free port for lograid serve");
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if let Some(child) = &mut self.child {
            if let Some(status) = child.try_wait().unwrap() {
                self.status = Some(status);
                self.child = None;
            }
        }
        self.status
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "lograid serve still running {timeout:?} later:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sigterm(&self) {
        // SAFETY: kill on the pid of our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn pattern(seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(MIB)
}

/// SIGTERM; asserts `STOPPING=1` arrives, then a clean exit with the close logged.
fn stop_cleanly(manager: &mut Manager, service: &mut Service) -> String {
    service.sigterm();
    let i = manager
        .until("STOPPING=1", service, Duration::from_secs(60))
        .unwrap_or_else(|| {
            panic!(
                "no STOPPING=1 after SIGTERM; got {}\n{}",
                manager.shown(),
                service.stderr()
            )
        });
    assert!(
        manager.got[i].1.contains(
            "STATUS=SIGTERM: finishing requests in flight, flushing, writing a checkpoint"
        ),
        "{}",
        manager.got[i].1
    );
    let status = service.wait(Duration::from_secs(60));
    let log = service.stderr();
    assert!(status.success(), "exit {status} after SIGTERM:\n{log}");
    assert!(log.contains("SIGTERM: shutting down"), "{log}");
    assert!(
        log.contains("closed cleanly (final checkpoint written)"),
        "{log}"
    );
    log
}

#[test]
fn ready_after_recovery_and_the_listener_then_the_watchdog_then_stopping() {
    let pool = TestPool::create("256M", "vol0:64M");
    // Leave a log to replay: flushed writes, then SIGKILL (no final checkpoint).
    let data = pattern(1);
    {
        let server = pool.serve();
        let mut client = NbdClient::connect(server.port, "vol0");
        client.write(0, &data);
        client.flush();
        server.kill();
    }

    let mut manager = Manager::at_path(&pool.path("notify.sock"));
    let mut service = Service::start(
        &pool.drives,
        pool.dir.path(),
        &[
            ("NOTIFY_SOCKET", manager.env.clone().as_str()),
            ("WATCHDOG_USEC", "2000000"),
        ],
        WatchdogPid::Ours,
    );
    let ready = manager
        .until("READY=1", &mut service, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no READY=1; got {}\n{}", manager.shown(), service.stderr()));
    // At READY=1 the port answers at the first try, and recovery has run.
    let addr = format!("127.0.0.1:{}", service.port).parse().unwrap();
    TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("READY=1 sent but {addr} does not answer: {e}"));
    let log = service.stderr();
    let recovery = log
        .lines()
        .find(|l| l.starts_with("lograid: opened pool"))
        .unwrap_or_else(|| panic!("READY=1 before the recovery line:\n{log}"));
    assert!(
        !recovery.contains(", 0 rows"),
        "recovery replayed nothing: {recovery}"
    );
    assert_eq!(ready, 0, "something before READY=1: {}", manager.shown());
    let message = &manager.got[ready].1;
    assert!(
        message.contains(&format!(
            "STATUS=serving pool 'lograid': 1 volume on nbd://127.0.0.1:{}",
            service.port
        )),
        "{message}"
    );
    // And it serves what recovery brought back.
    let mut client = NbdClient::connect(service.port, "vol0");
    assert!(client.read(0, MIB as u32) == data, "data lost in recovery");
    client.disconnect();

    // WATCHDOG_USEC=2 s: a WATCHDOG=1 about every second, never 2 s apart.
    manager.listen_for(Duration::from_millis(5500));
    let ready_at = manager.got[ready].0;
    let pets = manager.messages_with("WATCHDOG=1");
    assert!(
        (4..=7).contains(&pets.len()),
        "{} WATCHDOG=1 in 5.5 s: {}",
        pets.len(),
        manager.shown()
    );
    let mut last = ready_at;
    for t in &pets {
        let gap = t.duration_since(last);
        assert!(
            gap < Duration::from_millis(1900),
            "WATCHDOG=1 {gap:?} apart"
        );
        last = *t;
    }

    stop_cleanly(&mut manager, &mut service);
    // The final checkpoint was written: the next open replays nothing.
    let json = status_json(&pool.drives);
    assert_eq!(json["recovery"]["rows_replayed"], 0, "{json}");
}

#[test]
fn abstract_socket_degraded_status_and_a_watchdog_meant_for_another_process() {
    let pool = TestPool::create("256M", "vol0:64M");
    std::fs::remove_file(&pool.drives[2]).unwrap();
    let name = format!("lograid-test-notify-{}-{}", std::process::id(), free_port());
    let mut manager = Manager::abstract_named(&name);
    let mut service = Service::start(
        &pool.drives,
        pool.dir.path(),
        &[
            ("NOTIFY_SOCKET", manager.env.clone().as_str()),
            ("WATCHDOG_USEC", "1000000"),
        ],
        WatchdogPid::Other,
    );
    let ready = manager
        .until("READY=1", &mut service, Duration::from_secs(60))
        .unwrap_or_else(|| {
            panic!(
                "no READY=1 on @{name}; got {}\n{}",
                manager.shown(),
                service.stderr()
            )
        });
    let message = manager.got[ready].1.clone();
    assert!(message.contains("STATUS=degraded ("), "{message}");
    assert!(message.contains("serving pool 'lograid'"), "{message}");
    assert!(message.contains("member 2 missing"), "{message}");

    // WATCHDOG_PID names another process: the watchdog is not ours to pet.
    manager.listen_for(Duration::from_millis(2500));
    assert!(
        manager.messages_with("WATCHDOG=1").is_empty(),
        "{}",
        manager.shown()
    );

    stop_cleanly(&mut manager, &mut service);
}

#[test]
fn without_notify_socket_nothing_changes() {
    let pool = TestPool::create("256M", "vol0:64M");
    // WATCHDOG_USEC alone (no NOTIFY_SOCKET) must not matter either.
    let server = Server::start_prepared(
        Path::new(BIN),
        vec![
            "serve".into(),
            pool.drives[0].display().to_string(),
            pool.drives[1].display().to_string(),
            pool.drives[2].display().to_string(),
        ],
        pool.dir.path(),
        None,
        |c| {
            c.env_remove("NOTIFY_SOCKET")
                .env_remove("WATCHDOG_PID")
                .env("WATCHDOG_USEC", "1000000");
        },
    );
    let data = pattern(2);
    let mut client = NbdClient::connect(server.port, "vol0");
    client.write(0, &data);
    client.flush();
    assert!(client.read(0, MIB as u32) == data);
    client.disconnect();
    let log = server.terminate();
    assert!(!log.contains("NOTIFY_SOCKET"), "{log}");
}

#[test]
fn a_notify_socket_nobody_listens_on_is_logged_and_serving_goes_on() {
    let pool = TestPool::create("256M", "vol0:64M");
    let gone = pool.path("nobody-here.sock");
    let server = Server::start_prepared(
        Path::new(BIN),
        vec![
            "serve".into(),
            pool.drives[0].display().to_string(),
            pool.drives[1].display().to_string(),
            pool.drives[2].display().to_string(),
        ],
        pool.dir.path(),
        None,
        |c| {
            c.env("NOTIFY_SOCKET", &gone)
                .env_remove("WATCHDOG_PID")
                .env("WATCHDOG_USEC", "200000");
        },
    );
    // Watchdog sends fail too (every 100 ms); said once.
    std::thread::sleep(Duration::from_millis(600));
    let data = pattern(3);
    let mut client = NbdClient::connect(server.port, "vol0");
    client.write(0, &data);
    client.flush();
    assert!(client.read(0, MIB as u32) == data);
    client.disconnect();
    let log = server.terminate();
    assert_eq!(
        log.matches("to systemd (NOTIFY_SOCKET=").count(),
        1,
        "expected one warning about the socket:\n{log}"
    );
}

#[test]
fn no_ready_when_the_pool_cannot_be_opened() {
    let pool = TestPool::create("256M", "vol0:64M");
    // Another server holds the drives: this one must fail without READY=1.
    let holder = pool.serve();
    let mut manager = Manager::at_path(&pool.path("notify.sock"));
    let mut service = Service::start(
        &pool.drives,
        pool.dir.path(),
        &[
            ("NOTIFY_SOCKET", manager.env.clone().as_str()),
            ("WATCHDOG_USEC", "1000000"),
        ],
        WatchdogPid::Unset,
    );
    assert!(manager
        .until("READY=1", &mut service, Duration::from_secs(60))
        .is_none());
    let status = service.wait(Duration::from_secs(10));
    assert!(!status.success(), "{}", service.stderr());
    assert!(
        service.stderr().contains("already running"),
        "{}",
        service.stderr()
    );
    assert!(manager.got.is_empty(), "{}", manager.shown());
    holder.terminate();
}
