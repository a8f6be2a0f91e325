//! Growing a pool through the CLI: data written over NBD; a drive added and
//! the parity raised from 1 to 2 (on a pool not served: in the foreground);
//! then served again with two of its four members gone, every byte intact.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;

/// Runs one qemu-io command against the server's vol0 (fails the test if it fails).
fn qemu_io(server: &Server, command: &str) {
    run(tool("qemu-io").args(["-f", "raw", "-c", command, &server.uri("vol0")]));
}

#[test]
fn add_a_drive_raise_the_parity_and_lose_two() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("128M", "vol0:64M");
    let server = pool.serve();
    qemu_io(&server, "write -P 0x3c 0 40M");
    server.terminate();

    let dir = pool.dir.path().display().to_string();
    let added = pool.path("m3.img");
    let out = run(lograid().args(["add", &dir]).arg(&added));
    assert!(String::from_utf8_lossy(&out.stderr).contains("done"));
    // Refused clearly: parity as large as the member count.
    let out = lograid().args(["parity", &dir, "4"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("less than"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run(lograid().args(["parity", &dir, "2"]));
    let mut all = pool.drives.clone();
    all.push(added.clone());
    let st = status_json(&all);
    assert_eq!(st["parity"], 2, "{st:#}");
    assert_eq!(st["members"].as_array().unwrap().len(), 4, "{st:#}");
    assert!(st["reshape"].is_null(), "{st:#}");

    // Two members gone: still all there.
    let left = vec![pool.drives[1].clone(), added];
    let server = Server::start(&left, &[], pool.dir.path());
    qemu_io(&server, "read -P 0x3c 0 40M");
    server.terminate();
}

/// A member missing when the server started comes back and is re-added
/// while served (`replace POOL OLD SAME-DRIVE`, no --force needed for a
/// drive of this pool): the pool is online again and every byte reads back,
/// also after a restart with all three drives.
#[test]
fn a_member_that_was_missing_is_re_added_while_served() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("128M", "vol0:64M");
    let away = pool.path("away.img");
    std::fs::rename(&pool.drives[1], &away).unwrap();
    let left = vec![pool.drives[0].clone(), pool.drives[2].clone()];
    let server = Server::start(&left, &[], pool.dir.path());
    qemu_io(&server, "write -P 0x5e 0 40M");
    std::fs::rename(&away, &pool.drives[1]).unwrap();
    let list = format!("{},{}", left[0].display(), left[1].display());
    run(lograid().args(["replace", &list, "1"]).arg(&pool.drives[1]));
    let st = status_json(&pool.drives);
    assert_eq!(st["state"], "online", "{st:#}");
    qemu_io(&server, "read -P 0x5e 0 40M");
    server.terminate();
    let server = pool.serve();
    qemu_io(&server, "read -P 0x5e 0 40M");
    server.terminate();
}

/// A member gone, and no drive to replace it: `lograid remove` while served
/// moves its rows to the other two (into their free space); the pool is
/// online again with two members, and every byte reads back, also after a
/// restart with those two alone. Removing another is refused (parity 1
/// needs two members).
#[test]
fn a_missing_member_is_removed_while_served() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("128M", "vol0:64M");
    std::fs::remove_file(&pool.drives[1]).unwrap();
    let left = vec![pool.drives[0].clone(), pool.drives[2].clone()];
    let server = Server::start(&left, &[], pool.dir.path());
    qemu_io(&server, "write -P 0x6d 0 24M");
    let list = format!("{},{}", left[0].display(), left[1].display());
    let out = run(lograid().args(["remove", &list, "1"]));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("being removed") && said.contains("done"),
        "{said}"
    );
    let st = status_json(&left);
    assert_eq!(st["state"], "online", "{st:#}");
    assert_eq!(st["members"].as_array().unwrap().len(), 2, "{st:#}");
    qemu_io(&server, "read -P 0x6d 0 24M");
    let out = lograid().args(["remove", &list, "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs at least"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.terminate();
    let server = Server::start(&left, &[], pool.dir.path());
    qemu_io(&server, "read -P 0x6d 0 24M");
    server.terminate();
}
