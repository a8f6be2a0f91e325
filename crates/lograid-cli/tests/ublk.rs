//! `serve --ublk` where this host can check it without the ublk driver: its options, and the
//! clear error (before the pool is opened) when /dev/ublk-control is missing. Serving real
//! /dev/ublkbN devices runs in the guest: scripts/vm/tests/ublk.sh.

// ublk is Linux's; on macOS `--ublk` only says so.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;

fn serve_ublk(pool: &TestPool, extra: &[&str]) -> (bool, String) {
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--listen", "127.0.0.1:0", "--ublk"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ublk_options_out_of_range_are_refused_first() {
    let pool = TestPool::create("256M", "vol0:64M");
    for (flag, value, expected) in [
        ("--ublk-depth", "0", "--ublk-depth 0: from 1 to 4096"),
        ("--ublk-depth", "4097", "--ublk-depth 4097: from 1 to 4096"),
        ("--ublk-queues", "0", "--ublk-queues 0: from 1 to 64"),
    ] {
        let (ok, err) = serve_ublk(&pool, &[flag, value]);
        assert!(!ok, "{flag} {value}: {err}");
        assert!(err.contains(expected), "{flag} {value}: {err}");
        assert!(
            !err.contains("opened pool"),
            "checked before the pool opens: {err}"
        );
    }
}

#[test]
fn ublk_options_need_ublk() {
    let pool = TestPool::create("256M", "vol0:64M");
    for extra in [
        ["--ublk-depth", "8"],
        ["--ublk-queues", "2"],
        ["--ublk-id-base", "3"],
    ] {
        let out = lograid()
            .arg("serve")
            .args(&pool.drives)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--ublk"),
            "{extra:?}: {err}"
        );
    }
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .arg("--ublk-write-cache")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--ublk"), "{err}");
}

#[test]
fn a_missing_ublk_driver_is_named_with_the_fix() {
    if std::path::Path::new("/dev/ublk-control").exists() {
        eprintln!("SKIPPED: this host has the ublk driver (scripts/vm/tests/ublk.sh serves on it)");
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let (ok, err) = serve_ublk(&pool, &[]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("/dev/ublk-control is missing") && err.contains("modprobe ublk_drv"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "one error line: {err}");
    assert!(
        !err.contains("opened pool"),
        "fails before the pool opens: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
