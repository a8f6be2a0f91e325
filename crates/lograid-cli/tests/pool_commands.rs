//! The pool commands through the real `lograid` binary on sparse files and
//! loop devices: create (and every refusal), status, volume management.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lograid(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lograid"))
        .args(args)
        .output()
        .expect("run lograid")
}

fn ok(args: &[&str]) -> String {
    let out = lograid(args);
    assert!(
        out.status.success(),
        "lograid {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that must fail; returns its error output.
fn refused(args: &[&str]) -> String {
    let out = lograid(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "lograid {args:?} should have failed; stderr: {err}"
    );
    assert!(err.contains("error:"), "no clear error for {args:?}: {err}");
    assert!(!err.contains("panicked"), "panic for {args:?}: {err}");
    err
}

/// A loop device on a file (read-only with `read_only`), detached when dropped.
struct LoopDevice {
    path: String,
}

impl LoopDevice {
    fn attach(file: &Path, read_only: bool) -> LoopDevice {
        LoopDevice::attach_with(file, if read_only { &["-r"] } else { &[] })
    }

    /// With more `losetup` options (`--sector-size 4096`, `-P` to scan partitions).
    fn attach_with(file: &Path, options: &[&str]) -> LoopDevice {
        let mut cmd = Command::new("losetup");
        cmd.args(["-f", "--show"]).args(options);
        let out = cmd.arg(file).output().expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice {
            path: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.path]).status();
    }
}

fn drives(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| dir.join(format!("d{i}.img")).display().to_string())
        .collect()
}

fn args<'a>(head: &[&'a str], drives: &'a [String]) -> Vec<&'a str> {
    head.iter()
        .copied()
        .chain(drives.iter().map(String::as_str))
        .collect()
}

#[test]
fn create_status_and_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = drives(dir.path(), 3);
    let out = ok(&args(
        &[
            "create", "--parity", "1", "--size", "128M", "--volume", "vol0:64M",
        ],
        &d,
    ));
    assert!(out.contains("created pool"), "{out}");
    let json = ok(&args(&["status", "--json"], &d));
    let st: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(st["members_total"], 3);
    assert_eq!(st["parity"], 1);
    assert_eq!(st["state"], "online");
    assert_eq!(st["volumes"][0]["name"], "vol0");
    assert_eq!(st["volumes"][0]["size_bytes"], 64 << 20);
    assert!(st["usable_bytes"].as_u64().unwrap() > 128 << 20);
    let human = ok(&args(&["status"], &d));
    assert!(
        human.contains("write amplification") && human.contains("CKSUM"),
        "{human}"
    );

    ok(&args(&["volume", "create", "--size", "32M", "vol1"], &d));
    let list = ok(&args(&["volume", "list"], &d));
    assert!(list.contains("vol0") && list.contains("vol1"), "{list}");
    ok(&args(&["volume", "resize", "--size", "96M", "vol1"], &d));
    let err = refused(&args(&["volume", "resize", "--size", "16M", "vol1"], &d));
    assert!(err.contains("shrinking"), "{err}");
    let err = refused(&args(&["volume", "create", "--size", "32M", "vol1"], &d));
    assert!(err.contains("already exists"), "{err}");
    ok(&args(&["volume", "delete", "vol1"], &d));
    let list = ok(&args(&["volume", "list", "--json"], &d));
    assert!(!list.contains("vol1"), "{list}");
    let err = refused(&args(&["volume", "delete", "nope"], &d));
    assert!(err.contains("not found"), "{err}");
    // Members in any order, and as a directory.
    let rev: Vec<String> = d.iter().rev().cloned().collect();
    ok(&args(&["status"], &rev));
    ok(&["status", dir.path().to_str().unwrap()]);
}

#[test]
fn create_refuses_what_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let d = drives(dir.path(), 3);
    // Bad shapes and flags.
    let err = refused(&args(&["create", "--parity", "3", "--size", "128M"], &d));
    assert!(err.contains("parity 3"), "{err}");
    let err = refused(&["create", "--size", "128M", &d[0]]);
    assert!(err.contains("2 to 24 drives"), "{err}");
    let err = refused(&args(&["create", "--chunk", "3000", "--size", "128M"], &d));
    assert!(err.contains("chunk size"), "{err}");
    let err = refused(&args(&["create", "--size", "banana"], &d));
    assert!(err.contains("not a size"), "{err}");
    let err = refused(&args(&["create"], &d));
    assert!(err.contains("does not exist"), "{err}");
    // Too small.
    let small: Vec<String> = drives(&dir.path().join("small"), 3);
    std::fs::create_dir(dir.path().join("small")).unwrap();
    let err = refused(&args(&["create", "--size", "2M"], &small));
    assert!(err.contains("too small"), "{err}");
    // Already a pool member: refused unless --force.
    ok(&args(&["create", "--size", "128M"], &d));
    let err = refused(&args(&["create"], &d));
    assert!(
        err.contains("lograid superblock") && err.contains("--force"),
        "{err}"
    );
    ok(&args(&["create", "--force"], &d));
    // In use by another process holding the drive.
    let held =
        lograid::device::FileMember::open(Path::new(&d[0]), lograid::device::OpenMode::ReadWrite)
            .unwrap();
    let err = refused(&args(&["create", "--force"], &d));
    assert!(err.contains("another lograid"), "{err}");
    let err = refused(&args(&["status"], &d));
    assert!(err.contains("another lograid"), "{err}");
    drop(held);
    // A filesystem on a drive.
    let fs: PathBuf = dir.path().join("fs.img");
    std::fs::write(&fs, vec![0u8; 64 << 20]).unwrap();
    let mk = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&fs)
        .output()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(mk.status.success());
    let mixed = vec![
        fs.display().to_string(),
        dir.path().join("e1.img").display().to_string(),
    ];
    let err = refused(&args(&["create", "--size", "128M"], &mixed));
    assert!(err.contains("ext2/3/4"), "{err}");
    // The same drive twice.
    let twice = vec![d[1].clone(), d[1].clone()];
    let err = refused(&args(&["create", "--force"], &twice));
    assert!(err.contains("twice"), "{err}");
}

#[test]
fn status_refuses_foreign_and_garbage_drives() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("garbage.img");
    let bytes: Vec<u8> = (0..(8u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&g, bytes).unwrap();
    let err = refused(&["status", g.to_str().unwrap()]);
    assert!(err.contains("not a lograid member"), "{err}");
    let z = dir.path().join("zero.img");
    std::fs::write(&z, vec![0u8; 8 << 20]).unwrap();
    let err = refused(&["status", z.to_str().unwrap()]);
    assert!(err.contains("not a lograid member"), "{err}");
    let err = refused(&["status", dir.path().join("missing.img").to_str().unwrap()]);
    assert!(err.contains("No such file"), "{err}");
    // Two pools mixed.
    let a = drives(&dir.path().join("a"), 2);
    let b = drives(&dir.path().join("b"), 2);
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    ok(&args(&["create", "--size", "64M", "--parity", "1"], &a));
    ok(&args(&["create", "--size", "64M", "--parity", "1"], &b));
    let err = refused(&["status", &a[0], &b[1]]);
    assert!(err.contains("another pool"), "{err}");
}

/// A mounted block device is refused (needs root and loop devices).
#[test]
fn create_refuses_a_mounted_device() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev.img");
    std::fs::write(&img, vec![0u8; 64 << 20]).unwrap();
    let device = LoopDevice::attach(&img, false);
    let dev = device.path.clone();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _unmount = Unmount(mnt.clone());
    assert!(Command::new("mkfs.ext4")
        .args(["-q", &dev])
        .status()
        .unwrap()
        .success());
    assert!(Command::new("mount")
        .arg(&dev)
        .arg(&mnt)
        .status()
        .unwrap()
        .success());
    let other = dir.path().join("o.img").display().to_string();
    let err = refused(&["create", "--force", "--size", "128M", &dev, &other]);
    assert!(err.contains("mounted"), "{err}");
}

/// A whole disk one of whose partitions is mounted is refused as mounted
/// (the partition is found by its name, /dev/loopNp1), even with --force
/// (needs root and loop devices).
#[test]
fn create_refuses_a_disk_with_a_mounted_partition() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    // An MBR with one Linux partition from sector 2048 to the end (64 MiB).
    let mut disk = vec![0u8; 64 << 20];
    let sectors = (disk.len() / 512) as u32;
    let entry = &mut disk[446..462];
    entry[4] = 0x83;
    entry[8..12].copy_from_slice(&2048u32.to_le_bytes());
    entry[12..16].copy_from_slice(&(sectors - 2048).to_le_bytes());
    disk[510] = 0x55;
    disk[511] = 0xAA;
    std::fs::write(&img, disk).unwrap();
    let device = LoopDevice::attach_with(&img, &["-P"]);
    let partition = format!("{}p1", device.path);
    // The kernel scans the table itself where it reads MBRs; elsewhere
    // partx (util-linux) adds the partition it finds.
    std::thread::sleep(std::time::Duration::from_millis(500));
    if !Path::new(&partition).exists() {
        let added = Command::new("partx")
            .args(["-a", &device.path])
            .output()
            .expect("partx (util-linux)");
        assert!(
            added.status.success(),
            "partx -a: {}",
            String::from_utf8_lossy(&added.stderr)
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !Path::new(&partition).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{partition} did not appear"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    assert!(Command::new("mkfs.ext4")
        .args(["-q", &partition])
        .status()
        .unwrap()
        .success());
    assert!(Command::new("mount")
        .arg(&partition)
        .arg(&mnt)
        .status()
        .unwrap()
        .success());
    let _unmount = Unmount(mnt.clone());
    let other = dir.path().join("o.img").display().to_string();
    let err = refused(&["create", "--force", "--size", "128M", &device.path, &other]);
    assert!(
        err.contains(&format!("{} is mounted; unmount it first", device.path)),
        "{err}"
    );
}

/// Block devices as members, through the calls a disk gets: the size from
/// the disk's logical block size and count (512-byte and 4 KiB sectors),
/// writes that a flush makes reach the backing file, and a discard that
/// the loop device passes on as a hole (needs root and loop devices).
#[test]
fn block_device_members_take_the_disks_geometry_flush_and_discard() {
    use lograid::device::{AlignedBuf, FileMember, Member, OpenMode};
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    for sector in ["512", "4096"] {
        let img = dir.path().join(format!("disk-{sector}.img"));
        let size_bytes: u64 = 48 << 20;
        std::fs::File::create(&img)
            .unwrap()
            .set_len(size_bytes)
            .unwrap();
        let device = LoopDevice::attach_with(&img, &["--sector-size", sector]);
        let member = FileMember::open(Path::new(&device.path), OpenMode::ReadWrite).unwrap();
        assert_eq!(member.size_bytes(), size_bytes, "{sector}-byte sectors");
        // Held: a second writer is refused.
        let again = FileMember::open(Path::new(&device.path), OpenMode::ReadWrite);
        assert!(again.is_err(), "{sector}: opened twice for writing");
        let mut block = AlignedBuf::zeroed(1 << 20);
        block.fill(0x5a);
        member.write_at(&block, 8 << 20).unwrap();
        member.flush().unwrap();
        let on_file = std::fs::read(&img).unwrap();
        assert!(
            on_file[8 << 20..9 << 20].iter().all(|&b| b == 0x5a),
            "{sector}: flushed write not in the backing file"
        );
        let allocated = std::fs::metadata(&img).unwrap().blocks();
        member.discard(8 << 20, 1 << 20).unwrap();
        member.flush().unwrap();
        let after = std::fs::metadata(&img).unwrap().blocks();
        assert!(
            after + 2048 <= allocated,
            "{sector}: the discard freed {} sectors of the backing file, not 1 MiB",
            allocated.saturating_sub(after)
        );
        let mut back = AlignedBuf::zeroed(1 << 20);
        member.read_at(&mut back, 8 << 20).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "{sector}: discarded range not zero"
        );
        assert_eq!(member.gone(), None);
    }
}

/// A member on a read-only block device: commands that would write refuse
/// it clearly and change nothing; status and a check still work (needs root
/// and loop devices).
#[test]
fn a_read_only_member_is_refused_for_writing_and_left_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = drives(dir.path(), 3);
    ok(&args(
        &[
            "create", "--size", "64M", "--parity", "1", "--volume", "v:16M",
        ],
        &d,
    ));
    let before = std::fs::read(&d[2]).unwrap();
    let guard = LoopDevice::attach(Path::new(&d[2]), true);
    let dev = guard.path.clone();
    let set = [d[0].as_str(), d[1].as_str(), dev.as_str()];
    for cmd in [
        &["serve"][..],
        &["scrub"][..],
        &["volume", "create", "--size", "4M", "w"][..],
    ] {
        let mut a: Vec<&str> = cmd.to_vec();
        a.extend(set);
        let err = refused(&a);
        assert!(err.contains("read-only"), "{cmd:?}: {err}");
    }
    ok(&["status", set[0], set[1], set[2]]);
    ok(&["scrub", "--check", set[0], set[1], set[2]]);
    drop(guard);
    assert!(
        std::fs::read(&d[2]).unwrap() == before,
        "the read-only member changed"
    );
}
