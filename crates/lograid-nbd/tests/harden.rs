//! `harden_process_for_block_backing` runs in a child process (it changes the whole process:
//! mlockall would also lock every other test's memory).

// PR_SET_IO_FLUSHER, mlockall and /proc: Linux only (macOS does no hardening).
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

use std::process::Command;

#[test]
fn harden_in_a_child_process() {
    if std::env::var("LOGRAID_HARDEN_CHILD").is_ok() {
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "harden_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOGRAID_HARDEN_CHILD", "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("HARDEN-RESULT"), "{stdout}");
}

#[test]
#[ignore = "run by harden_in_a_child_process in its own process"]
fn harden_child() {
    if std::env::var("LOGRAID_HARDEN_CHILD").is_err() {
        return;
    }
    let warnings = lograid_nbd::harden_process_for_block_backing();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let locked_line = status
        .lines()
        .find(|line| line.starts_with("VmLck:"))
        .unwrap_or("VmLck: ?")
        .to_owned();
    println!("HARDEN-RESULT warnings={warnings:?} {locked_line}");
    // Each call must succeed exactly when the process has the capability it needs; otherwise
    // it reports a warning (and never panics).
    let effective = status
        .lines()
        .find(|line| line.starts_with("CapEff:"))
        .and_then(|line| u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok())
        .unwrap_or(0);
    const CAP_IPC_LOCK: u64 = 14;
    const CAP_SYS_RESOURCE: u64 = 24;
    let prctl_warned = warnings
        .iter()
        .any(|warning| warning.contains("PR_SET_IO_FLUSHER"));
    let mlock_warned = warnings.iter().any(|warning| warning.contains("mlockall"));
    assert_eq!(
        prctl_warned,
        effective & (1 << CAP_SYS_RESOURCE) == 0,
        "{warnings:?}"
    );
    if effective & (1 << CAP_IPC_LOCK) != 0 {
        assert!(!mlock_warned, "{warnings:?}");
    }
    if !mlock_warned {
        // Memory is locked: touching a fresh allocation raises VmLck.
        let buffer = vec![1u8; 8 << 20];
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let locked_kib: u64 = status
            .lines()
            .find(|line| line.starts_with("VmLck:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0);
        assert!(
            locked_kib >= 8 * 1024,
            "VmLck {locked_kib} KiB after touching 8 MiB"
        );
        drop(buffer);
    }
}
