//! packaging/macos: the LaunchDaemons are property lists (read by Python's plistlib, a strict
//! reader), with the keys that keep the server alive, stop it late enough and log to
//! /var/log/lograid.log; the server's command line in org.lograid.serve.plist, with the pool's
//! UUID, the ports and the disks' pattern put in for a test pool, serves that pool here, found
//! by its UUID; `lograid-attach` retries an attach that fails, holds an attachment, detaches
//! it when stopped, and exits at once when stopped while retrying.
//!
//! What only a Mac can show (launchd running them at boot and shutdown, /dev/rdisk*, hdiutil,
//! Full Disk Access) is listed in docs/MACOS.md.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn packaging(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/macos")
        .join(name)
}

/// The property list in `file`, as JSON (Python's plistlib).
fn read_plist(file: &Path) -> serde_json::Value {
    let script =
        "import json, plistlib, sys\nprint(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))";
    let out = stdout_of(Command::new("python3").args(["-c", script]).arg(file));
    serde_json::from_str(&out).unwrap()
}

#[test]
fn the_launch_daemons_keep_their_jobs_alive_stop_them_late_and_log() {
    for (name, label, program) in [
        (
            "org.lograid.serve.plist",
            "org.lograid.serve",
            "/usr/local/bin/lograid",
        ),
        (
            "org.lograid.attach.plist",
            "org.lograid.attach",
            "/usr/local/bin/lograid-attach",
        ),
    ] {
        let plist = read_plist(&packaging(name));
        assert_eq!(plist["Label"], label);
        assert_eq!(plist["ProgramArguments"][0], program);
        assert_eq!(plist["RunAtLoad"], true);
        assert_eq!(plist["KeepAlive"]["SuccessfulExit"], false, "{name}");
        assert_eq!(plist["StandardErrorPath"], "/var/log/lograid.log");
        assert_eq!(plist["StandardOutPath"], "/var/log/lograid.log");
    }
    let serve = read_plist(&packaging("org.lograid.serve.plist"));
    let args: Vec<&str> = serve["ProgramArguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    // The stop may take the NFS drain, 30 s of calls in flight, and the final checkpoint.
    let drain: u64 = after("--nfs-drain").parse().unwrap();
    assert!(serve["ExitTimeOut"].as_u64().unwrap() >= drain + 60);
    assert_eq!(*args.last().unwrap(), "/dev/rdisk*");
    // The attach daemon runs the script with the server's NFS port.
    let attach = read_plist(&packaging("org.lograid.attach.plist"));
    let port = after("--nfs").rsplit(':').next().unwrap();
    assert_eq!(attach["ProgramArguments"][1], port);
}

#[test]
fn the_servers_command_line_serves_a_pool_found_by_its_uuid() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let uuid = status_json(&pool.drives)["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let disks = pool.path("dev");
    std::fs::create_dir(&disks).unwrap();
    for (i, drive) in pool.drives.iter().enumerate() {
        std::fs::rename(drive, disks.join(format!("rdisk{}", 7 - i))).unwrap();
    }
    let nfs_port = free_port();
    let serve = read_plist(&packaging("org.lograid.serve.plist"));
    let plist_args: Vec<String> = serve["ProgramArguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    // Its arguments, with the test's pool, port and disks; --listen comes from Server.
    let mut args = Vec::new();
    let mut rest = plist_args[1..].iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "POOL-UUID" => args.push(uuid.clone()),
            "127.0.0.1:20490" => args.push(format!("127.0.0.1:{nfs_port}")),
            "/dev/rdisk*" => args.push(disks.join("rdisk*").display().to_string()),
            "--listen" => {
                rest.next();
            }
            _ => args.push(arg.clone()),
        }
    }
    let server = Server::start_args(args, pool.dir.path(), None);
    let lines = probe(nfs_port, &["mount", "lookup:vol0", "getattr"]);
    assert_eq!(field(&lines[1], "status"), "0", "{lines:?}");
    assert_eq!(field(&lines[2], "size"), (64u64 << 20).to_string());
    let err = server.terminate();
    assert!(
        err.contains(&format!("member 0 at {}", disks.join("rdisk7").display())),
        "{err}"
    );
}

/// Starts the attach script for `port` and `volume` with the real lograid and `state`.
fn start_script(port: u16, volume: &str, state: &Path, log: &Path) -> std::process::Child {
    Command::new("sh")
        .arg(packaging("lograid-attach"))
        .args([&port.to_string(), volume])
        .env("LOGRAID", BIN)
        .env("LOGRAID_STATE_DIR", state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn wait_for(log: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(text)
    {
        assert!(
            Instant::now() < deadline,
            "no {text:?}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM to `child`; its exit status (within 10 s).
fn stop(mut child: std::process::Child) -> std::process::ExitStatus {
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lograid-attach did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_attach_script_retries_and_stops_at_once_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("attach.log");
    let usage = Command::new("sh")
        .arg(packaging("lograid-attach"))
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    // No server on the port: the attach fails, and is tried again.
    let script = start_script(free_port(), "vol0", &dir.path().join("state"), &log);
    wait_for(&log, "attaching vol0 failed; trying again in 5 s");
    let started = Instant::now();
    assert!(stop(script).success());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!std::fs::read_to_string(&log).unwrap().contains("detaching"));
}

/// An attachment recorded for the volume (here a loop device on a file in a tmpfs standing in
/// for the NFS mount) is held, not made twice, and detached when the script is stopped.
#[cfg(target_os = "linux")]
#[test]
fn the_attach_script_holds_a_recorded_attachment_and_detaches_it_when_stopped() {
    /// Unmounts a directory when dropped (a test that failed).
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = tool("umount").arg(&self.0).output();
        }
    }
    if !need_block_devices(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().canonicalize().unwrap().join("state");
    let mount_dir = state.join("nfs-20490-1");
    std::fs::create_dir_all(&mount_dir).unwrap();
    run(tool("mount")
        .args(["-t", "tmpfs", "lograid-test"])
        .arg(&mount_dir));
    let unmount = Unmount(mount_dir.clone());
    std::fs::File::create(mount_dir.join("vol0"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let device = stdout_of(
        tool("losetup")
            .args(["--find", "--show"])
            .arg(mount_dir.join("vol0")),
    )
    .trim()
    .to_string();
    let guard = Attachment::forget_on_drop(device.clone().into(), &state);
    std::fs::write(
        state.join("nfs-attachments"),
        format!(
            "lograid-nfs-attachments-v1\n{device}\t{}\t127.0.0.1:20490\tvol0\n",
            mount_dir.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("attach.log");
    let script = start_script(20490, "vol0", &state, &log);
    wait_for(&log, "vol0 attached; detached when this stops");
    assert!(stop(script).success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&format!("detached {device}")), "{text}");
    guard.forget();
    let backing = tool("losetup")
        .args(["--noheadings", "--output", "BACK-FILE"])
        .arg(&device)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&backing.stdout).contains("nfs-20490-1"));
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(&mount_dir.display().to_string()));
    std::mem::forget(unmount);
}
