//! The volumes' FUSE files against in-memory exports (`MemExport`), through the real kernel:
//! reads and writes (aligned and not), short writes at the end, fsync as flush, O_DSYNC as FUA,
//! punch-hole as trim and zero-range as write-zeroes, refusals (read-only export, truncate,
//! create), and unmounting with and without a file held open, and over a stale mount. Every
//! call the export receives must keep its contract. Needs root and /dev/fuse (fails without
//! them unless LOGRAID_SKIP_EXTERNAL=1).

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should
#![cfg(target_os = "linux")] // FUSE through the kernel: the crate is Linux-only

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use lograid_fuse::{connection_of, is_mount_point, mount, FuseOptions, Unmounted};
use lograid_nbd::mem_export::MemExport;
use lograid_nbd::{Allocation, Export};

const SIZE: u64 = 8 << 20;

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && Path::new("/dev/fuse").exists() {
        return true;
    }
    if std::env::var_os("LOGRAID_SKIP_EXTERNAL").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED (LOGRAID_SKIP_EXTERNAL=1): needs root and /dev/fuse");
        return false;
    }
    panic!("needs root and /dev/fuse (set LOGRAID_SKIP_EXTERNAL=1 to skip)");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn errno_of<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    result
        .expect_err("the call should fail")
        .raw_os_error()
        .expect("an OS error")
}

fn fallocate(file: &File, mode: i32, offset: u64, length: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a descriptor we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, length as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn volume_files_carry_every_call_to_the_export_within_its_contract() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let vol = Arc::new(MemExport::new("vol0", SIZE));
    let ro = Arc::new(MemExport::new("ro1", 1 << 20).with_read_only(true));
    ro.fill(0, &pattern(1 << 20, 9));
    let exports: Vec<Arc<dyn Export>> = vec![vol.clone(), ro.clone()];
    let m = mount(&files, exports, &FuseOptions::default()).unwrap();
    assert!(is_mount_point(&files));

    directory_lists_one_file_per_export(&files);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(files.join("vol0"))
        .unwrap();
    let a = reads_and_writes_reach_the_export(&file, &vol);
    fsync_punch_hole_and_zero_range_reach_the_export(&file, &vol, &a);
    growing_truncating_and_odd_modes_are_refused(&file);
    let sync_file = o_dsync_writes_are_fua_writes(&files, &vol);
    o_trunc_is_refused_and_cuts_nothing(&files, &vol, &file);
    let ro_file = read_only_export_is_readable_not_writable(&files);
    files_are_neither_created_nor_removed(&files);

    drop((file, sync_file, ro_file));
    assert_eq!(m.unmount().unwrap(), Unmounted::Clean);
    assert!(!is_mount_point(&files));
    assert_eq!(vol.contract_violations(), 0);
    assert_eq!(ro.contract_violations(), 0);
}

/// The directory lists one file per export, with the export's size; read-only is 0400.
fn directory_lists_one_file_per_export(files: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(files)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ro1", "vol0"]);
    let meta = std::fs::metadata(files.join("vol0")).unwrap();
    assert_eq!(meta.len(), SIZE);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(files.join("ro1"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o400
    );
    assert_eq!(
        errno_of(std::fs::metadata(files.join("nothing"))),
        libc::ENOENT
    );
}

/// Writes and reads, aligned and not, and at the end of the file, reach the export; returns
/// the data written at 4096.
fn reads_and_writes_reach_the_export(file: &File, vol: &MemExport) -> Vec<u8> {
    // Aligned: straight through.
    let a = pattern(64 << 10, 1);
    file.write_all_at(&a, 4096).unwrap();
    assert_eq!(vol.contents(4096, a.len() as u64), a);
    // Unaligned write and read: widened to sectors here, merged with what is around.
    let b = pattern(100, 2);
    file.write_all_at(&b, 1000).unwrap();
    let mut expect = vec![0u8; 8192];
    expect[4096..].copy_from_slice(&a[..4096]);
    expect[1000..1100].copy_from_slice(&b);
    assert_eq!(vol.contents(0, 8192), expect);
    let mut back = vec![0u8; 3000];
    file.read_exact_at(&mut back, 777).unwrap();
    assert_eq!(back, expect[777..3777]);
    // At the end: a write past it is cut short, one at it has no room; a read there is empty.
    assert_eq!(file.write_at(&pattern(8192, 3), SIZE - 4096).unwrap(), 4096);
    assert_eq!(vol.contents(SIZE - 4096, 4096), pattern(4096, 3));
    assert_eq!(errno_of(file.write_at(&[1; 512], SIZE)), libc::ENOSPC);
    assert_eq!(file.read_at(&mut back, SIZE).unwrap(), 0);
    a
}

/// fsync is the export's flush; punching a hole is a trim (of `a`, written at 4096), zero
/// range a write-zeroes.
fn fsync_punch_hole_and_zero_range_reach_the_export(file: &File, vol: &MemExport, a: &[u8]) {
    // fsync is the export's flush.
    let flushes = vol.flush_count();
    file.sync_all().unwrap();
    assert!(vol.flush_count() > flushes);
    // Punching a hole trims whole sectors and zeroes the edges; the middle becomes a hole.
    fallocate(
        file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        4096 + 100,
        20_000,
    )
    .unwrap();
    let after = vol.contents(4096, a.len() as u64);
    assert_eq!(after[..100], a[..100]);
    assert!(after[100..20_100].iter().all(|&x| x == 0));
    assert_eq!(after[20_100..], a[20_100..]);
    assert_eq!(vol.allocation_at(8192), Allocation::Hole);
    // Zero range: zeroes that stay allocated.
    fallocate(file, libc::FALLOC_FL_ZERO_RANGE, 40_960, 8192).unwrap();
    assert!(vol.contents(40_960, 8192).iter().all(|&x| x == 0));
    assert_eq!(vol.allocation_at(40_960), Allocation::Zero);
}

/// Growing by allocation, truncating, and odd modes are refused; allocating what is there
/// (or past the end with KEEP_SIZE) is a no-op.
fn growing_truncating_and_odd_modes_are_refused(file: &File) {
    assert_eq!(errno_of(fallocate(file, 0, SIZE - 512, 4096)), libc::EFBIG);
    fallocate(file, 0, 0, 4096).unwrap();
    fallocate(file, libc::FALLOC_FL_KEEP_SIZE, SIZE - 512, 4096).unwrap();
    assert_eq!(errno_of(file.set_len(SIZE / 2)), libc::EINVAL);
    assert_eq!(
        errno_of(fallocate(file, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096)),
        libc::EOPNOTSUPP
    );
}

/// O_DSYNC writes are FUA writes; returns the O_DSYNC file.
fn o_dsync_writes_are_fua_writes(files: &Path, vol: &MemExport) -> File {
    let sync_file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(files.join("vol0"))
        .unwrap();
    let fua = vol.fua_write_count();
    sync_file.write_all_at(&pattern(4096, 4), 0).unwrap();
    assert!(vol.fua_write_count() > fua);
    sync_file
}

/// O_TRUNC is refused (a truncation), and cuts nothing (`file` still reads what was there).
fn o_trunc_is_refused_and_cuts_nothing(files: &Path, vol: &MemExport, file: &File) {
    let before = vol.contents(0, 8192);
    assert_eq!(
        errno_of(
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(files.join("vol0"))
        ),
        libc::EINVAL
    );
    assert_eq!(std::fs::metadata(files.join("vol0")).unwrap().len(), SIZE);
    assert_eq!(vol.contents(0, 8192), before);
    let mut back = vec![0u8; 512];
    file.read_exact_at(&mut back[..512], 0).unwrap();
    assert_eq!(back[..512], before[..512]);
}

/// A read-only export: readable, not writable; returns the file opened for reading.
fn read_only_export_is_readable_not_writable(files: &Path) -> File {
    assert_eq!(
        errno_of(OpenOptions::new().write(true).open(files.join("ro1"))),
        libc::EROFS
    );
    let ro_file = File::open(files.join("ro1")).unwrap();
    let mut first = vec![0u8; 4096];
    ro_file.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first, pattern(1 << 20, 9)[..4096]);
    ro_file
}

/// Files are neither created nor removed here.
fn files_are_neither_created_nor_removed(files: &Path) {
    assert_eq!(errno_of(File::create(files.join("new"))), libc::EPERM);
    assert_eq!(
        errno_of(std::fs::remove_file(files.join("vol0"))),
        libc::EPERM
    );
}

/// A mount point already in use is refused: another filesystem's, and a live lograid mount
/// (a second server given the same directory); the first mount is unharmed.
#[test]
fn mounts_it_did_not_make_are_refused() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(other.join("keep"), b"mine").unwrap();
    let vol = Arc::new(MemExport::new("vol0", SIZE));
    let refused = mount(
        &other,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    );
    let message = refused.err().expect("mounted over a tmpfs").to_string();
    assert!(
        message.contains("already a mount point (tmpfs"),
        "{message}"
    );
    assert_eq!(std::fs::read(other.join("keep")).unwrap(), b"mine");
    assert!(std::process::Command::new("umount")
        .arg(&other)
        .status()
        .unwrap()
        .success());

    let (_dir, files, vol, first) = mount_one_volume();
    let second = mount(
        &files,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    );
    let message = second.err().expect("mounted over a live mount").to_string();
    assert!(message.contains("served by a running lograid"), "{message}");
    // Also when the directory is named through a symlink to it.
    let link = files.with_file_name("link");
    std::os::unix::fs::symlink(&files, &link).unwrap();
    let third = mount(
        &link,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    );
    let message = third
        .err()
        .expect("mounted over a live mount through a symlink")
        .to_string();
    assert!(message.contains("served by a running lograid"), "{message}");
    assert_eq!(connection_of(&link), connection_of(&files));
    assert!(connection_of(&files).is_some());
    vol.fill(0, &pattern(4096, 8));
    let mut buf = vec![0u8; 4096];
    File::open(files.join("vol0"))
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();
    assert_eq!(buf, pattern(4096, 8));
    assert_eq!(first.unmount().unwrap(), Unmounted::Clean);
}

/// A temporary directory, its `files` mount point, and one in-memory volume "vol0" mounted there.
fn mount_one_volume() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Arc<MemExport>,
    lograid_fuse::FuseMount,
) {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let vol = Arc::new(MemExport::new("vol0", SIZE));
    let m = mount(
        &files,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    )
    .unwrap();
    (dir, files, vol, m)
}

#[test]
fn unmounting_with_a_file_in_use_aborts_its_connection() {
    if !can_mount() {
        return;
    }
    // Named with a trailing slash, as a shell completes it: the mount is still found to abort.
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let vol = Arc::new(MemExport::new("vol0", SIZE));
    let slashed = std::path::PathBuf::from(format!("{}/", files.display()));
    let m = mount(
        &slashed,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    )
    .unwrap();
    let held = OpenOptions::new()
        .read(true)
        .write(true)
        .open(files.join("vol0"))
        .unwrap();
    held.write_all_at(&pattern(4096, 5), 0).unwrap();
    // The server must be able to stop even so: the holder now gets errors, not hangs.
    assert_eq!(m.unmount().unwrap(), Unmounted::Aborted);
    assert!(!is_mount_point(&files));
    let writes = vol.write_count();
    let mut buf = vec![0u8; 4096];
    assert!(held.read_at(&mut buf, 0).is_err());
    assert!(held.write_at(&buf, 0).is_err());
    // Nothing reached the export after the unmount returned.
    assert_eq!(vol.write_count(), writes);
    assert_eq!(vol.contents(0, 4096), pattern(4096, 5));
}

/// Set in the child process of [`a_mount_left_by_a_dead_server_is_replaced`]: the directory to
/// mount on before waiting to be killed.
const CHILD_DIR: &str = "LOGRAID_FUSE_TEST_CHILD_DIR";

/// Not a test of its own: the "server" that the test below starts as a child process (this
/// test binary, running only this function) and kills with SIGKILL.
#[test]
fn child_mounts_and_waits_to_be_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let vol = Arc::new(MemExport::new("vol0", SIZE));
    let _m = mount(
        Path::new(&dir),
        vec![vol as Arc<dyn Export>],
        &FuseOptions::default(),
    )
    .unwrap();
    println!("mounted");
    std::thread::sleep(std::time::Duration::from_secs(60));
    panic!("not killed within 60 s");
}

/// A server killed with SIGKILL leaves its mount behind ("Transport endpoint is not
/// connected"); the next mount on the directory replaces it.
#[test]
fn a_mount_left_by_a_dead_server_is_replaced() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_mounts_and_waits_to_be_killed",
            "--nocapture",
        ])
        .env(CHILD_DIR, &files)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("mounted") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "the child exited without mounting"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(is_mount_point(&files));
    assert_eq!(errno_of(std::fs::read_dir(&files)), libc::ENOTCONN);

    let vol = Arc::new(MemExport::new("vol0", SIZE));
    vol.fill(0, &pattern(4096, 6));
    let second = mount(
        &files,
        vec![vol.clone() as Arc<dyn Export>],
        &FuseOptions::default(),
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    File::open(files.join("vol0"))
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();
    assert_eq!(buf, pattern(4096, 6));
    assert_eq!(second.unmount().unwrap(), Unmounted::Clean);
    assert!(!is_mount_point(&files));
}

/// A request thread that takes a request off the kernel's queue just as the connection is
/// aborted (or torn down by the unmount) is answered ECONNABORTED ("Software caused connection
/// abort"), and fuser ends the session with it: it is how the session ends, not a failed
/// unmount. Rounds of a stop while four threads read a held file without pause; each must end
/// Aborted, not with an error. The race is narrow (a few rounds in a thousand under load, on
/// the code that reported it as an error): LOGRAID_FUSE_ABORT_ROUNDS sets the rounds (default
/// 100).
#[test]
fn a_stop_while_requests_flow_ends_without_error() {
    if !can_mount() {
        return;
    }
    let rounds: usize = std::env::var("LOGRAID_FUSE_ABORT_ROUNDS")
        .map(|v| v.parse().expect("LOGRAID_FUSE_ABORT_ROUNDS: a number"))
        .unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    for round in 0..rounds {
        let vol = Arc::new(MemExport::new("vol0", SIZE));
        let m = mount(
            &files,
            vec![vol.clone() as Arc<dyn Export>],
            &FuseOptions::default(),
        )
        .unwrap();
        let held = Arc::new(File::open(files.join("vol0")).unwrap());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (held, stop) = (held.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    while !stop.load(std::sync::atomic::Ordering::Relaxed)
                        && held.read_exact_at(&mut buf, 0).is_ok()
                    {}
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let ended = m.unmount().map_err(|e| e.to_string());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        assert_eq!(ended, Ok(Unmounted::Aborted), "round {round}");
        assert!(!is_mount_point(&files));
    }
}
