//! Real filesystems on a volume attached with `lograid attach` (nbdfuse + a
//! direct-I/O loop device, or the server's own FUSE file from `serve --fuse`
//! and `attach --file`): made, filled with files of known sha256, checked
//! clean; the server stopped with SIGTERM and restarted; then SIGKILLed while
//! writing and restarted: every file synced before the kill must be intact
//! and the filesystem must check clean. Needs root, /dev/fuse and loop
//! devices (fails without them unless LOGRAID_SKIP_EXTERNAL=1).

// Loop devices, FUSE and ext4/xfs: Linux only.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    fn tools(self) -> &'static [&'static str] {
        match self {
            Fs::Ext4 => &["mkfs.ext4", "fsck.ext4"],
            Fs::Xfs => &["mkfs.xfs", "xfs_repair"],
        }
    }

    fn mkfs(self, device: &Path) {
        match self {
            Fs::Ext4 => run(tool("mkfs.ext4").args(["-q", "-F"]).arg(device)),
            Fs::Xfs => run(tool("mkfs.xfs").args(["-q", "-f"]).arg(device)),
        };
    }

    /// A read-only full check; panics unless it finds the filesystem clean.
    fn check_clean(self, device: &Path) {
        match self {
            Fs::Ext4 => run(tool("fsck.ext4").args(["-f", "-n"]).arg(device)),
            Fs::Xfs => run(tool("xfs_repair").arg("-n").arg(device)),
        };
    }
}

/// How the volume becomes a loop device.
#[derive(Clone, Copy)]
enum Via {
    /// `lograid attach --server ...`: nbdfuse over NBD.
    Nbdfuse,
    /// `lograid serve --fuse DIR` and `lograid attach --file DIR/vol0`.
    ServerFuse,
}

impl Via {
    fn serve(self, pool: &TestPool) -> Server {
        match self {
            Via::Nbdfuse => pool.serve(),
            Via::ServerFuse => {
                let files = pool.path("files");
                pool.serve_with(&["--fuse", files.to_str().unwrap()])
            }
        }
    }

    fn attach(self, pool: &TestPool, server: &Server, state: &Path) -> Attachment {
        match self {
            Via::Nbdfuse => Attachment::attach(server, "vol0", state),
            Via::ServerFuse => Attachment::attach_file(&pool.path("files").join("vol0"), state),
        }
    }
}

/// Files written so far: path relative to the mount → sha256.
type Manifest = BTreeMap<PathBuf, String>;

/// Writes `count` files of random sizes (empty to 1.5 MiB, mostly small) in a few directories.
fn write_files(root: &Path, prefix: &str, count: usize, rng: &mut Rng, manifest: &mut Manifest) {
    for i in 0..count {
        let dir = PathBuf::from(format!("{prefix}-{}", i % 7));
        std::fs::create_dir_all(root.join(&dir)).unwrap();
        let size = match rng.below(10) {
            0 => 0,
            1..=5 => rng.below(16 * 1024),
            6..=8 => rng.below(256 * 1024),
            _ => rng.below(1536 * 1024),
        } as usize;
        let data = rng.bytes(size);
        let rel = dir.join(format!("f{i:03}.bin"));
        write_file(&root.join(&rel), &data);
        manifest.insert(rel, sha256_hex(&data));
    }
}

fn try_write_files(
    root: &Path,
    prefix: &str,
    count: usize,
    rng: &mut Rng,
    manifest: &mut Manifest,
) -> std::io::Result<()> {
    use std::io::Write;
    for i in 0..count {
        let size = rng.below(64 * 1024) as usize;
        let data = rng.bytes(size);
        let rel = PathBuf::from(format!("{prefix}-{i:02}.bin"));
        std::fs::File::create(root.join(&rel))?.write_all(&data)?;
        manifest.insert(rel, sha256_hex(&data));
    }
    Ok(())
}

fn verify_files(root: &Path, manifest: &Manifest) {
    let mut bad = Vec::new();
    for (rel, sha) in manifest {
        match std::fs::read(root.join(rel)) {
            Ok(data) if &sha256_hex(&data) == sha => {}
            Ok(data) => bad.push(format!(
                "{}: content differs ({} bytes)",
                rel.display(),
                data.len()
            )),
            Err(e) => bad.push(format!("{}: {e}", rel.display())),
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} files are wrong: {bad:?}",
        bad.len(),
        manifest.len()
    );
}

/// syncfs(2) on the filesystem mounted at `root`.
fn sync_fs(root: &Path) {
    let dir = std::fs::File::open(root).unwrap();
    // SAFETY: syncfs on a valid descriptor we own.
    assert_eq!(
        unsafe { libc::syncfs(dir.as_raw_fd()) },
        0,
        "syncfs: {}",
        std::io::Error::last_os_error()
    );
}

fn filesystem_survives_restart_and_kill(fs: Fs, via: Via, seed: u64) {
    if !need_block_devices(fs.tools()) {
        return;
    }
    let started = Instant::now();
    let pool = TestPool::create("512M", "vol0:400M");
    let state = pool.path("state");
    let mnt = pool.path("mnt");
    let mut rng = Rng::new(seed);
    let mut synced = Manifest::new();

    // Make, fill, check.
    let server = via.serve(&pool);
    let att = via.attach(&pool, &server, &state);
    fs.mkfs(&att.device);
    let m = Mount::at(&att.device, &mnt);
    write_files(&m.dir, "a", 100, &mut rng, &mut synced);
    let big = rng.bytes(24 << 20);
    write_file(&m.dir.join("big.bin"), &big);
    synced.insert(PathBuf::from("big.bin"), sha256_hex(&big));
    sync_fs(&m.dir);
    verify_files(&m.dir, &synced);
    m.unmount();
    fs.check_clean(&att.device);
    att.detach();
    server.terminate();

    // Clean restart: everything is there.
    let server = via.serve(&pool);
    let att = via.attach(&pool, &server, &state);
    let m = Mount::at(&att.device, &mnt);
    verify_files(&m.dir, &synced);
    write_files(&m.dir, "b", 40, &mut rng, &mut synced);
    sync_fs(&m.dir);
    // Kill the server while a writer keeps creating files and syncing every few: the files a
    // syncfs() covered before the kill must survive; the rest may or may not.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (root, stop, seed) = (m.dir.clone(), stop.clone(), rng.next_u64());
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed);
            let (mut synced, mut pending) = (Manifest::new(), Manifest::new());
            let mut batch = 0;
            while !stop.load(Ordering::Relaxed) {
                if try_write_files(&root, &format!("c{batch}"), 5, &mut rng, &mut pending).is_err()
                {
                    break;
                }
                let dir = std::fs::File::open(&root).unwrap();
                // SAFETY: syncfs on a valid descriptor we own.
                if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
                    break;
                }
                synced.append(&mut pending);
                batch += 1;
            }
            synced
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200 + rng.below(600)));
    server.kill();
    stop.store(true, Ordering::Relaxed);
    let synced_while_killed = writer.join().unwrap();
    eprintln!(
        "{} files synced by the writer before the kill",
        synced_while_killed.len()
    );
    synced.extend(synced_while_killed);
    // The device is dead now: unmounting reports write errors; that is expected.
    drop(m);
    att.detach();

    // Restart after SIGKILL: the filesystem mounts (its journal replays) and every synced file is intact.
    let server = via.serve(&pool);
    let att = via.attach(&pool, &server, &state);
    let m = Mount::at(&att.device, &mnt);
    verify_files(&m.dir, &synced);
    m.unmount();
    fs.check_clean(&att.device);
    att.detach();
    server.terminate();
    elapsed_note("filesystem", started);
}

#[test]
fn ext4_survives_restart_and_sigkill() {
    filesystem_survives_restart_and_kill(Fs::Ext4, Via::Nbdfuse, 101);
}

#[test]
fn ext4_on_the_servers_own_fuse_file_survives_restart_and_sigkill() {
    filesystem_survives_restart_and_kill(Fs::Ext4, Via::ServerFuse, 303);
}

#[test]
fn xfs_survives_restart_and_sigkill() {
    filesystem_survives_restart_and_kill(Fs::Xfs, Via::Nbdfuse, 202);
}

#[test]
fn xfs_on_the_servers_own_fuse_file_survives_restart_and_sigkill() {
    filesystem_survives_restart_and_kill(Fs::Xfs, Via::ServerFuse, 404);
}

#[test]
fn detach_all_and_attach_list() {
    if !need_block_devices(&[]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    pool.add_volume("vol1", "64M");
    let state = pool.path("state");
    let server = pool.serve();
    let a = Attachment::attach(&server, "vol0", &state);
    let b = Attachment::attach(&server, "vol1", &state);
    assert_ne!(a.device, b.device);
    let list = stdout_of(
        lograid()
            .args(["attach", "--list", "--state-dir"])
            .arg(&state),
    );
    assert!(
        list.contains(a.device.to_str().unwrap()) && list.contains(b.device.to_str().unwrap()),
        "{list}"
    );
    assert!(list.contains("/vol0") && list.contains("/vol1"), "{list}");
    // Direct I/O through the loop device reaches the right volume.
    let mut rng = Rng::new(5);
    let block = rng.bytes(1 << 20);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&b.device)
            .unwrap();
        dev.seek(SeekFrom::Start(4 << 20)).unwrap();
        dev.write_all(&block).unwrap();
        dev.sync_all().unwrap();
    }
    let mut c = NbdClient::connect(server.port, "vol1");
    assert!(c.read(4 << 20, 1 << 20) == block);
    c.disconnect();
    run(lograid()
        .args(["detach", "--all", "--state-dir"])
        .arg(&state));
    assert_no_fuse_mounts_under(&state);
    let list = stdout_of(
        lograid()
            .args(["attach", "--list", "--state-dir"])
            .arg(&state),
    );
    assert!(list.trim().is_empty(), "{list}");
    a.forget();
    b.forget();
    server.terminate();
}

/// Writes to the device of a dead server (buffered, 20 MiB, then fsync: what
/// a filesystem's writeback does), expecting errors; nbdfuse exits on them.
fn fail_io_on_dead_device(device: &Path) {
    use std::io::Write;
    if let Ok(mut dev) = std::fs::OpenOptions::new().write(true).open(device) {
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..20 {
            if dev.write_all(&chunk).is_err() {
                break;
            }
        }
        assert!(
            dev.sync_all().is_err(),
            "writes to a device whose server is dead were synced"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[test]
fn detach_after_the_server_died_leaves_nothing_mounted() {
    if !need_block_devices(&[]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let state = pool.path("state");
    let server = pool.serve();
    let att = Attachment::attach(&server, "vol0", &state);
    server.kill();
    // Writeback to the dead device fails, and nbdfuse exits on it (leaving its mount behind).
    fail_io_on_dead_device(&att.device);
    // The CLI also removes the FUSE mount nbdfuse leaves behind when its server dies.
    att.detach();
}

#[test]
fn nbd_crate_detach_after_server_death_unmounts() {
    if !need_block_devices(&[]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let state = pool.path("state");
    let server = pool.serve();
    let attached = lograid_nbd::attach(&server.base_uri(), "vol0", &state).unwrap();
    let device = attached.loop_device().to_path_buf();
    let _guard = Attachment::forget_on_drop(device.clone(), &state);
    server.kill();
    fail_io_on_dead_device(&device);
    lograid_nbd::detach(&state, &device).unwrap();
    drop(attached);
    assert_no_fuse_mounts_under(&state);
}

/// The drive-failure story end to end, through the CLI: files on ext4 over
/// an attached volume; a member's backing file deleted; the pool served
/// degraded and written to; `lograid replace` against the running server,
/// followed to the end; a scrub clean; every file verified and fsck clean.
#[test]
fn ext4_survives_losing_a_member_and_replacing_it() {
    if !need_block_devices(Fs::Ext4.tools()) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:200M");
    let (state, mnt) = (pool.path("state"), pool.path("mnt"));
    let mut rng = Rng::new(303);
    let mut files = Manifest::new();

    let server = pool.serve();
    let att = Attachment::attach(&server, "vol0", &state);
    Fs::Ext4.mkfs(&att.device);
    let m = Mount::at(&att.device, &mnt);
    write_files(&m.dir, "a", 60, &mut rng, &mut files);
    sync_fs(&m.dir);
    m.unmount();
    att.detach();
    server.terminate();

    // The drive dies: its file is gone. The pool serves degraded.
    std::fs::remove_file(&pool.drives[1]).unwrap();
    let left = vec![pool.drives[0].clone(), pool.drives[2].clone()];
    let server = Server::start(&left, &[], pool.dir.path());
    let att = Attachment::attach(&server, "vol0", &state);
    let m = Mount::at(&att.device, &mnt);
    verify_files(&m.dir, &files);
    write_files(&m.dir, "b", 40, &mut rng, &mut files);
    sync_fs(&m.dir);
    let status = stdout_of(lograid().args(["status", "--json"]).args(&left));
    assert!(status.contains("degraded"), "{status}");

    // Replace it while serving; the command follows the rebuild to the end.
    let new = pool.path("m3.img");
    let out = run(lograid()
        .args(["replace", &pool.dir.path().display().to_string(), "1"])
        .arg(&new));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("done"), "{said}");
    // The new drive took the missing member's place (rebuilt in place).
    assert!(said.contains("takes the place of member 1"), "{said}");
    let now = vec![pool.drives[0].clone(), pool.drives[2].clone(), new.clone()];
    let status = status_json(&now);
    assert_eq!(status["state"], "online", "{status:#}");
    assert!(status["reshape"].is_null(), "{status:#}");
    assert_eq!(
        status["members"][1]["path"],
        new.display().to_string(),
        "{status:#}"
    );
    assert!(std::fs::metadata(&new).unwrap().blocks() > 0);
    // Writes go on, and everything reads back.
    write_files(&m.dir, "c", 20, &mut rng, &mut files);
    sync_fs(&m.dir);
    verify_files(&m.dir, &files);
    m.unmount();
    Fs::Ext4.check_clean(&att.device);
    att.detach();
    server.terminate();

    // A scrub of the new member set is clean, and so is the data after a restart.
    let report: serde_json::Value =
        serde_json::from_str(&stdout_of(lograid().args(["scrub", "--json"]).args(&now))).unwrap();
    assert_eq!(report["repaired_blocks"], 0, "{report:#}");
    assert_eq!(
        report["lost_blocks"].as_array().map(|a| a.len()),
        Some(0),
        "{report:#}"
    );
    let server = Server::start(&now, &[], pool.dir.path());
    let att = Attachment::attach(&server, "vol0", &state);
    let m = Mount::at(&att.device, &mnt);
    verify_files(&m.dir, &files);
    m.unmount();
    att.detach();
    server.terminate();
}

/// `serve --fuse DIR` answers on its port only once its files are mounted on DIR, so that
/// `attach --file DIR/VOLUME` as soon as the port answers finds them. Checked where mounting
/// takes longest: DIR held by a live server that does not answer (stopped), which a second
/// server waits for (3 s) and then refuses: its port must never answer; and restarts after
/// SIGKILL, where the dead server's mount on DIR is replaced first: the harness checks DIR the
/// moment the port answers.
#[test]
fn serve_fuse_answers_on_its_port_only_once_its_files_are_mounted() {
    if !need_block_devices(&[]) {
        return;
    }
    let first = TestPool::create("64M", "vol0:16M");
    let files = first.path("files");
    let fuse = ["--fuse", files.to_str().unwrap()];
    let server = first.serve_with(&fuse);
    // SAFETY: kill on the pid of our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGSTOP) }, 0);

    let second = TestPool::create("64M", "vol0:16M");
    let port = free_port();
    let stderr_path = second.path("serve.err");
    let mut child = std::process::Command::new(BIN)
        .arg("serve")
        .args(&second.drives)
        .args(fuse)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    let mut answered_after = None;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if answered_after.is_none()
            && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
        {
            answered_after = Some(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the second server neither served nor exited within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: as above; the first server serves again.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGCONT) }, 0);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(
        answered_after, None,
        "the port of a server whose files were not (and would not be) mounted answered:\n{stderr}"
    );
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("served by a running lograid"), "{stderr}");
    // The first server's files are unharmed.
    assert_eq!(
        std::fs::metadata(files.join("vol0")).unwrap().len(),
        16 << 20
    );
    server.terminate();

    // Restarts after SIGKILL: each replaces the dead server's mount before its port answers.
    let mut server = first.serve_with(&fuse);
    for _ in 0..8 {
        server.kill();
        server = first.serve_with(&fuse);
        assert_eq!(
            std::fs::metadata(files.join("vol0")).unwrap().len(),
            16 << 20
        );
    }
    server.terminate();
    assert!(!lograid_fuse_mounted(&files));
}

/// `serve --fuse` and `attach --file`: a file attached twice, or a directory, is refused; the
/// list names the attachment; data written through the device is the volume's (read back over
/// NBD); and the server stops on SIGTERM while the device is still attached, saying so, after
/// which the device fails its I/O instead of hanging.
#[test]
fn the_servers_fuse_files_refusals_and_a_stop_while_attached() {
    if !need_block_devices(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let state = pool.path("state");
    let files = pool.path("files");
    // Named with a trailing slash, as a shell completes it.
    let server = pool.serve_with(&["--fuse", &format!("{}/", files.display())]);
    let att = Attachment::attach_file(&files.join("vol0"), &state);
    assert_attach_file_refusals(&files, &state, &att);

    // Through the device, O_DIRECT, then read back over NBD.
    write_direct(&att.device);
    qemu_io_reads(&server, &["read -P 0x6c 3M 1M", "read -P 0 0 3M"]);
    // A punched hole reads back as zeroes, also where it covers 4 KiB blocks only in part
    // (512-byte steps, as the loop device's discard and zero-out send them).
    punch_holes(&files.join("vol0"));
    qemu_io_reads(
        &server,
        &[
            "read -P 0x6c 3145728 512",
            "read -P 0 3146240 3584",
            "read -P 0x6c 3149824 16384",
            "read -P 0 3166208 10240",
            "read -P 0x6c 3176448 1017856",
        ],
    );

    let stderr = server.terminate();
    assert!(stderr.contains("still in use"), "{stderr}");
    assert!(stderr.contains("connection was aborted"), "{stderr}");
    assert!(!lograid_fuse_mounted(&files));
    fail_io_on_dead_device(&att.device);
    att.detach();
    let list = stdout_of(
        lograid()
            .args(["attach", "--list", "--state-dir"])
            .arg(&state),
    );
    assert!(list.trim().is_empty(), "{list}");
}

/// `attach --file` refuses the file attached as `att` and a directory; the list names `att`.
fn assert_attach_file_refusals(files: &Path, state: &Path, att: &Attachment) {
    let again = lograid()
        .arg("attach")
        .arg("--file")
        .arg(files.join("vol0"))
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    assert!(
        stderr.contains("already attached as") && stderr.contains(&*att.device.to_string_lossy()),
        "{stderr}"
    );
    let dir = lograid()
        .args(["attach", "--file"])
        .arg(files)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(!dir.status.success());
    assert!(
        String::from_utf8_lossy(&dir.stderr).contains("not a regular file"),
        "{}",
        String::from_utf8_lossy(&dir.stderr)
    );
    let list = stdout_of(
        lograid()
            .args(["attach", "--list", "--state-dir"])
            .arg(state),
    );
    assert!(list.contains("(lograid serve --fuse)"), "{list}");
}

/// Writes 1 MiB of 0x6c at 3 MiB to `device` with O_DIRECT.
fn write_direct(device: &Path) {
    use std::io::{Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut dev = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: an aligned allocation of the layout's size, freed below.
    let ptr = unsafe { std::alloc::alloc(layout) };
    assert!(!ptr.is_null());
    // SAFETY: ptr is valid for 1 MiB.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 1 << 20) };
    buf.fill(0x6c);
    dev.seek(std::io::SeekFrom::Start(3 << 20)).unwrap();
    dev.write_all(buf).unwrap();
    dev.sync_all().unwrap();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
}

/// Punches holes in `file` that cover 4 KiB blocks only in part (512-byte steps, as the loop
/// device's discard and zero-out send them).
fn punch_holes(file: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    for (offset, length) in [((3 << 20) + 512, 3584), ((3 << 20) + 20480, 10240)] {
        // SAFETY: fallocate on a descriptor we own.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), punch, offset, length) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}

/// Runs qemu-io read-only on vol0 over NBD with `commands` (each `read -P` checks a pattern);
/// panics if any fails.
fn qemu_io_reads(server: &Server, commands: &[&str]) {
    let mut cmd = tool("qemu-io");
    cmd.args(["-f", "raw", "-r"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = stdout_of(cmd.arg(server.uri("vol0")));
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("failed"),
        "{out}"
    );
}

fn lograid_fuse_mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(&*dir.to_string_lossy()))
}
