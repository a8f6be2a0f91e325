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

/// Writes the NFS attachment records of `state` (the format `lograid attach` keeps).
fn write_records(state: &Path, lines: &[String]) {
    let mut text = String::from("lograid-nfs-attachments-v1\n");
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(state.join("nfs-attachments"), text).unwrap();
}

/// Loop devices and mounts made by a test, undone when it ends (also when it fails).
#[derive(Default)]
struct Undo {
    loops: Vec<String>,
    mounts: Vec<std::path::PathBuf>,
}

impl Drop for Undo {
    fn drop(&mut self) {
        for device in &self.loops {
            let _ = tool("losetup").arg("--detach").arg(device).output();
        }
        for dir in self.mounts.iter().rev() {
            let _ = tool("umount").arg(dir).output();
        }
    }
}

impl Undo {
    fn tmpfs(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        run(tool("mount").args(["-t", "tmpfs", "lograid-test"]).arg(dir));
        self.mounts.push(dir.to_path_buf());
    }
}

/// A tmpfs on `dir` holding an 8 MiB file `vol0` (standing in for the NFS mount, which this
/// kernel cannot make), and a loop device on that file.
fn mounted_file_on_loop(undo: &mut Undo, dir: &Path) -> String {
    undo.tmpfs(dir);
    std::fs::File::create(dir.join("vol0"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let out = stdout_of(
        tool("losetup")
            .args(["--find", "--show"])
            .arg(dir.join("vol0")),
    );
    let device = out.trim().to_string();
    undo.loops.push(device.clone());
    device
}

/// Detach and the forgetting of dead records, on the Linux side: the disk and the mount of a
/// record are undone when the disk shows the record's file; a disk that shows another file
/// (its number reused) is left alone while the mount goes; a record whose disk and mount are
/// both gone is forgotten by the next attach. The NFS mount is a tmpfs here.
#[test]
fn detach_undoes_what_is_recorded_and_leaves_a_reused_disk_alone() {
    if !need_block_devices(&[]) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("lograid-attach-nfs-")
        .tempdir()
        .unwrap();
    let state = dir.path().canonicalize().unwrap().join("state");
    std::fs::create_dir(&state).unwrap();
    let mut undo = Undo::default();
    let ours = state.join("nfs-20490-1");
    let device = mounted_file_on_loop(&mut undo, &ours);
    let other = state.join("other");
    let reused = mounted_file_on_loop(&mut undo, &other);
    let stale = state.join("nfs-20490-2");
    undo.tmpfs(&stale);
    write_records(
        &state,
        &[
            format!("{device}\t{}\t127.0.0.1:20490\tvol0", ours.display()),
            format!("{reused}\t{}\t127.0.0.1:20490\tvol1", stale.display()),
            format!(
                "/dev/loop251\t{}\t127.0.0.1:20490\tvol2",
                state.join("nfs-20490-3").display()
            ),
        ],
    );
    assert_eq!(listed(&state).lines().count(), 3);

    // Ours: detached and unmounted.
    run(lograid()
        .arg("detach")
        .arg(&device)
        .arg("--state-dir")
        .arg(&state));
    assert!(!mounts_under(&state).contains(&ours.display().to_string()));
    let backing = tool("losetup")
        .args(["--noheadings", "--output", "BACK-FILE"])
        .arg(&device)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&backing.stdout).contains("nfs-20490-1"));

    // A reused number: the disk is left as it is, the record's mount goes.
    let out = lograid()
        .arg("detach")
        .arg(&reused)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("left attached (the record was stale)"),
        "{err}"
    );
    let backing = stdout_of(
        tool("losetup")
            .args(["--noheadings", "--output", "BACK-FILE"])
            .arg(&reused),
    );
    assert!(backing.contains("/other/vol0"), "{backing}");
    assert!(!mounts_under(&state).contains(&stale.display().to_string()));

    // The dead one (no disk, no mount) is forgotten by the next attach, which then fails
    // (no NFS server here) leaving nothing.
    let out = lograid()
        .args([
            "attach",
            "--nfs",
            &free_port().to_string(),
            "--export",
            "vol2",
            "--state-dir",
        ])
        .arg(&state)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("forgetting the attachment of nfs://127.0.0.1:20490/vol2"),
        "{err}"
    );
    assert!(!out.status.success());
    assert!(listed(&state).is_empty(), "{}", listed(&state));
}
