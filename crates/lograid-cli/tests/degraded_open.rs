//! Opening a pool with members missing, as an administrator meets it: a
//! member file deleted, or overwritten by something else, named one by one
//! or by directory. `status` and `serve` open the pool degraded, say which
//! member is missing and how to replace it, and serve its data;
//! `--no-degraded` refuses; more members missing than the parity covers is
//! an error naming each of them.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Output;

fn lograid_out(args: &[String]) -> Output {
    lograid().args(args).output().expect("run lograid")
}

fn strings(head: &[&str], drives: &[PathBuf]) -> Vec<String> {
    head.iter()
        .map(|s| s.to_string())
        .chain(drives.iter().map(|d| d.display().to_string()))
        .collect()
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A 3-member P=1 pool with 1 MiB of a known pattern at offset 0 of vol0.
fn pool_with_data() -> TestPool {
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 0 1M",
        "-c",
        "flush",
        &server.uri("vol0"),
    ]));
    assert!(out.contains("wrote 1048576/1048576"), "{out}");
    server.terminate();
    pool
}

#[test]
fn a_deleted_member_file_opens_degraded_and_says_how_to_replace_it() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = pool_with_data();
    std::fs::remove_file(&pool.drives[2]).unwrap();

    let out = lograid_out(&strings(&["status"], &pool.drives));
    let err = stderr_of(&out);
    assert!(out.status.success(), "status failed: {err}");
    assert!(err.contains("m2.img: set aside: cannot be opened"), "{err}");
    assert!(err.contains("member 2 is missing"), "{err}");
    assert!(err.contains("lograid replace"), "{err}");
    let json = status_json(&pool.drives);
    let state = json["state"].as_str().unwrap_or_default();
    assert!(state.starts_with("degraded"), "{json}");
    assert_eq!(json["members"][2]["state"], "missing", "{json}");

    // Served degraded: the data reads back, rebuilt from parity.
    let server = pool.serve();
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x5a 0 1M",
        &server.uri("vol0"),
    ]));
    assert!(out.contains("read 1048576/1048576"), "{out}");
    let log = server.terminate();
    assert!(log.contains("member 2 is missing"), "{log}");
}

#[test]
fn no_degraded_refuses_and_changes_nothing() {
    let pool = TestPool::create("256M", "vol0:64M");
    std::fs::remove_file(&pool.drives[1]).unwrap();
    let before: Vec<Vec<u8>> = pool.drives[..1]
        .iter()
        .chain(&pool.drives[2..])
        .map(|d| std::fs::read(d).unwrap())
        .collect();
    for command in [
        &["status", "--no-degraded"][..],
        &["serve", "--no-degraded"][..],
    ] {
        let out = lograid_out(&strings(command, &pool.drives));
        let err = stderr_of(&out);
        assert!(!out.status.success(), "{command:?} should refuse: {err}");
        assert!(err.contains("error:"), "{err}");
        assert!(err.contains("--no-degraded"), "{err}");
        assert!(err.contains("member 1 is missing"), "{err}");
    }
    let after: Vec<Vec<u8>> = pool.drives[..1]
        .iter()
        .chain(&pool.drives[2..])
        .map(|d| std::fs::read(d).unwrap())
        .collect();
    assert!(before == after, "a refused open changed a member");
}

#[test]
fn a_member_overwritten_in_a_directory_is_set_aside() {
    let pool = TestPool::create("256M", "vol0:64M");
    // The file now holds something else: zeroes over its superblocks.
    let size = std::fs::metadata(&pool.drives[0]).unwrap().len();
    std::fs::write(&pool.drives[0], b"").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&pool.drives[0])
        .unwrap()
        .set_len(size)
        .unwrap();
    let dir = pool.dir.path().display().to_string();
    let out = lograid_out(&["status".to_string(), dir]);
    let err = stderr_of(&out);
    assert!(out.status.success(), "status failed: {err}");
    assert!(err.contains("m0.img: set aside"), "{err}");
    assert!(err.contains("not a lograid member"), "{err}");
    assert!(err.contains("member 0 is missing"), "{err}");
}

#[test]
fn more_members_missing_than_parity_names_each_one() {
    let pool = TestPool::create("256M", "vol0:64M");
    std::fs::remove_file(&pool.drives[0]).unwrap();
    std::fs::remove_file(&pool.drives[2]).unwrap();
    for command in [&["status"][..], &["serve"][..]] {
        let out = lograid_out(&strings(command, &pool.drives));
        let err = stderr_of(&out);
        assert!(!out.status.success(), "{command:?} should fail: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("needs at least 2 of its 3 members"), "{err}");
        assert!(err.contains("member 0, member 2"), "{err}");
        assert!(err.contains("m0.img (cannot be opened"), "{err}");
        assert!(err.contains("m2.img (cannot be opened"), "{err}");
    }
}

#[test]
fn status_x_exit_codes_say_healthy_degraded_or_lost() {
    let pool = TestPool::create("256M", "vol0:64M");
    let health = |drives: &[PathBuf]| {
        let out = lograid_out(&strings(&["status", "-x"], drives));
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.code(), line)
    };
    let (code, line) = health(&pool.drives);
    assert_eq!(code, Some(0), "{line}");
    assert_eq!(line, "pool 'lograid' is healthy");
    std::fs::remove_file(&pool.drives[1]).unwrap();
    let (code, line) = health(&pool.drives);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with("pool 'lograid' is degraded: 1 member(s) missing"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
    std::fs::remove_file(&pool.drives[0]).unwrap();
    let (code, line) = health(&pool.drives);
    assert_eq!(code, Some(2), "{line}");
    assert!(line.starts_with("pool cannot be opened: "), "{line}");
}
