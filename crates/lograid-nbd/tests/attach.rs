//! nbdfuse + loop device attach and detach against a MemExport (needs root, /dev/fuse, nbdfuse,
//! losetup, fusermount3; a missing tool fails the test unless LOGRAID_SKIP_EXTERNAL=1).

// nbdfuse, loop devices and fusermount3: Linux only.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lograid_nbd::attach::{attach, detach, list_attachments, AttachError};
use lograid_nbd::mem_export::MemExport;

fn tools_present() -> bool {
    require_tool("nbdfuse", "libnbd-bin")
        && require_tool("losetup", "mount")
        && require_tool("fusermount3", "fuse3")
}

fn loop_backing_file(device: &std::path::Path) -> String {
    let output = run_tool(
        Command::new("losetup")
            .args(["-n", "-O", "BACK-FILE"])
            .arg(device),
        Duration::from_secs(10),
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn attach_write_through_loop_device_and_detach() {
    if !tools_present() {
        return;
    }
    let export = Arc::new(MemExport::new("disk0", 64 * MIB));
    let server = TestServer::start(test_config(), vec![export.clone()]);
    let work = TempDir::new("attach");
    let data_file = work.path().join("data");
    let data = pattern(21, 8 * MIB as usize);
    std::fs::write(&data_file, &data).unwrap();

    // Attach, write with O_DIRECT through the loop device, detach in-process.
    let attached = attach(
        &format!("nbd://{}", server.addr),
        "disk0",
        &work.path().join("state"),
    )
    .expect("attach");
    let device = attached.loop_device().to_owned();
    assert!(
        device.to_string_lossy().starts_with("/dev/loop"),
        "{device:?}"
    );
    assert!(
        loop_backing_file(&device).contains("fuse-"),
        "loop device not on the FUSE file"
    );
    let records = list_attachments(&work.path().join("state")).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].loop_device, device);
    run_ok(
        Command::new("dd")
            .arg(format!("if={}", data_file.display()))
            .arg(format!("of={}", device.display()))
            .args([
                "bs=1M",
                "seek=4",
                "oflag=direct",
                "conv=fsync",
                "status=none",
            ]),
        Duration::from_secs(60),
    );
    assert!(
        export.contents(4 * MIB, 8 * MIB) == data,
        "data written through the loop device differs"
    );
    let back = work.path().join("back");
    run_ok(
        Command::new("dd")
            .arg(format!("if={}", device.display()))
            .arg(format!("of={}", back.display()))
            .args(["bs=1M", "skip=4", "count=8", "iflag=direct", "status=none"]),
        Duration::from_secs(60),
    );
    assert!(std::fs::read(&back).unwrap() == data);
    let mount_dir = records[0].mount_dir.clone();
    attached.detach().expect("detach");
    assert!(!mount_dir.exists(), "mount directory left behind");
    assert!(list_attachments(&work.path().join("state"))
        .unwrap()
        .is_empty());
    assert!(
        loop_backing_file(&device).is_empty()
            || !loop_backing_file(&device).contains(&*mount_dir.to_string_lossy())
    );

    // Attach again and detach by device name only, as a separate `lograid detach` would.
    let attached = attach(
        &format!("nbd://{}/disk0", server.addr),
        "",
        &work.path().join("state"),
    )
    .expect("attach");
    let device = attached.loop_device().to_owned();
    drop(attached);
    detach(&work.path().join("state"), &device).expect("detach by name");
    assert!(list_attachments(&work.path().join("state"))
        .unwrap()
        .is_empty());
    assert!(matches!(
        detach(&work.path().join("state"), &device),
        Err(AttachError::NotAttached(_))
    ));
    assert_eq!(export.contract_violations(), 0);
    server.stop().expect("clean shutdown");
}

#[test]
fn attach_to_nothing_fails_cleanly() {
    if !tools_present() {
        return;
    }
    // A port nobody listens on: bind one and close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let work = TempDir::new("attach-fail");
    let result = attach(&format!("nbd://127.0.0.1:{port}"), "disk0", work.path());
    assert!(result.is_err(), "attach to a closed port succeeded");
    assert!(list_attachments(work.path()).unwrap().is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .collect();
    assert!(
        leftovers.is_empty(),
        "mount directories left behind: {leftovers:?}"
    );
}
