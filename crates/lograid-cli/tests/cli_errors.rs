//! Error messages of the `lograid` binary read well: one line, each cause once.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;

#[test]
fn io_errors_name_their_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let out = lograid().arg("status").arg(&missing).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn serve_refuses_a_pool_with_no_volumes_and_bad_listen_addresses() {
    let pool = TestPool::create("256M", "vol0:64M");
    run(lograid()
        .args(["volume", "delete", "vol0"])
        .args(&pool.drives));
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("has no volumes to serve") && err.contains("lograid volume create"),
        "{err}"
    );
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--listen", "not an address"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--listen"), "{err}");
}
