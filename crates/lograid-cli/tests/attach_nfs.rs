//! `lograid attach --nfs` and `detach` through the real binary on Linux, against a real
//! `lograid serve --nfs`. Where the kernel has an NFS client (a test VM): the export mounted,
//! a loop device with direct I/O on the volume's file, bytes written through the device read
//! back over NBD, `attach --list`, and `detach` undoing both. Where it has none (this build
//! machine's kernel): the mount fails, and the attach says so and leaves nothing behind (no
//! record, no directory, no mount). Either way, a device with no record is refused.
//!
//! macOS's side (`mount_nfs`, `hdiutil`) cannot run here; its command lines and output
//! parsers are unit-tested in `src/os/macos_tools.rs` (docs/MACOS.md says what is unverified).

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

fn kernel_has_nfs() -> bool {
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|table| {
        table
            .lines()
            .any(|l| l.split_whitespace().last() == Some("nfs"))
    })
}

/// What `attach --list` prints for `state`.
fn listed(state: &Path) -> String {
    stdout_of(
        lograid()
            .args(["attach", "--list", "--state-dir"])
            .arg(state),
    )
}

/// Mount points under `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|m| Path::new(m).starts_with(&dir))
        .collect()
}

#[test]
fn attach_from_nfs_gives_a_loop_device_or_fails_leaving_nothing() {
    if !need_block_devices(&[]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    pool.add_volume("other", "8M");
    let nfs_port = free_port();
    let server = pool.serve_with(&["--nfs", &format!("127.0.0.1:{nfs_port}")]);
    let state = pool.path("state");
    let out = lograid()
        .args(["attach", "--nfs", &nfs_port.to_string(), "--export", "vol0"])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        attached_through_the_kernel_client(&server, &state, &out.stdout, &stderr);
    } else {
        assert!(
            !kernel_has_nfs(),
            "attach failed with an NFS client in the kernel: {stderr}"
        );
        assert!(
            stderr.contains("mounting the NFS export of 127.0.0.1:"),
            "{stderr}"
        );
        assert!(
            stderr.contains("mount -t nfs -o vers=3,proto=tcp"),
            "{stderr}"
        );
        // Nothing left: no record, no mount directory, no mount.
        assert!(listed(&state).is_empty());
        let left: Vec<String> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("nfs-") && !name.starts_with("nfs-attachments"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(mounts_under(&state).is_empty());
    }
    // A device with no record: refused, and nothing touched.
    let out = lograid()
        .args(["detach", "/dev/loop250", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no attachment of /dev/loop250"), "{stderr}");
    server.terminate();
}

/// The full path, where the kernel has an NFS client.
fn attached_through_the_kernel_client(server: &Server, state: &Path, stdout: &[u8], stderr: &str) {
    let device = String::from_utf8_lossy(stdout).trim().to_string();
    assert!(device.starts_with("/dev/loop"), "{device:?} {stderr}");
    let guard = Attachment::forget_on_drop(device.clone().into(), state);
    assert!(stderr.contains("mkfs.ext4"), "{stderr}");
    assert!(listed(state).contains(&format!("{device}\tnfs://127.0.0.1:")));
    assert_eq!(mounts_under(state).len(), 1);

    let data = Rng::new(11).bytes(1 << 20);
    let mut disk = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&device)
        .unwrap();
    let mut aligned = vec![0u8; data.len() + 4096];
    let start = aligned.as_ptr().align_offset(4096);
    aligned[start..start + data.len()].copy_from_slice(&data);
    disk.seek(SeekFrom::Start(4 << 20)).unwrap();
    disk.write_all(&aligned[start..start + data.len()]).unwrap();
    disk.sync_all().unwrap();
    drop(disk);
    let mut nbd = NbdClient::connect(server.port, "vol0");
    assert_eq!(nbd.read(4 << 20, 1 << 20), data);
    nbd.disconnect();

    // Already attached: refused.
    let again = lograid()
        .args([
            "attach",
            "--nfs",
            &format!("127.0.0.1:{}", nfs_port_of(state)),
        ])
        .args(["--export", "vol0", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(!again.status.success());
    guard.forget();
    run(lograid()
        .arg("detach")
        .arg(&device)
        .arg("--state-dir")
        .arg(state));
    assert!(listed(state).is_empty());
    assert!(mounts_under(state).is_empty());
}

/// The port in the one NFS record of `state`.
fn nfs_port_of(state: &Path) -> u16 {
    let text = std::fs::read_to_string(state.join("nfs-attachments")).unwrap();
    let line = text.lines().nth(1).unwrap();
    let server = line.split('\t').nth(2).unwrap();
    server.rsplit(':').next().unwrap().parse().unwrap()
}
