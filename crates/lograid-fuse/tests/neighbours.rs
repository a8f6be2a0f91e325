//! Servers side by side, each mount made by a process of its own (this test binary started
//! again as a child), mounted, aborted and unmounted round after round on a few directories at
//! once, with FUSE mounts lograid did not make among them: a small filesystem of this test's own
//! (made with fuser, named "neighbour") and other lograid servers' mounts. A server may only ever
//! end its own mount: every other mount keeps answering reads and writes, stays on its
//! directory, and unmounts cleanly when its own server stops it.
//!
//! The rounds, on each lane (a directory of its own), in turn: a clean stop; a stop while a file
//! is held (the server's own connection is aborted); and three where the server's mount is
//! detached from under it (as `umount -l` by an administrator) and another mount takes the
//! directory before the server stops: its mount still in use and the newcomer's too; its mount
//! unused (gone, its connection number free for the newcomer) and the newcomer's in use; its
//! mount in use and the newcomer's unused. Bystanders, a neighbour and a lograid server on
//! directories of their own, are read and written after every round.
//!
//! A mount whose server does not answer (stopped) is refused without waiting for it.
//!
//! LOGRAID_NEIGHBOUR_ROUNDS sets the rounds per lane (default 50), LOGRAID_NEIGHBOUR_LANES the
//! lanes (default 3). Needs root and /dev/fuse (fails without them unless
//! LOGRAID_SKIP_EXTERNAL=1).

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should
#![cfg(target_os = "linux")] // FUSE through the kernel: the crate is Linux-only

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, WriteFlags,
};
use lograid_fuse::{connection_of, is_mount_point, mount, FuseOptions};
use lograid_nbd::mem_export::MemExport;
use lograid_nbd::Export;

/// Each file's size, a lograid volume's or the neighbour's.
const SIZE: u64 = 1 << 20;
const BLOCK: usize = 4096;

/// Set in a child process: what it serves ("lograid" or "neighbour"), where, and the seed of
/// its file's contents.
const CHILD_ROLE: &str = "LOGRAID_NEIGHBOURS_ROLE";
const CHILD_DIR: &str = "LOGRAID_NEIGHBOURS_DIR";
const CHILD_SEED: &str = "LOGRAID_NEIGHBOURS_SEED";

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

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// The contents a file of seed `seed` starts with.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed as u8)
                .wrapping_add((i >> 12) as u8)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The child processes.

/// Not a test of its own: a child process serving one mount (this test binary, running only
/// this function), told what to do on stdin: "unmount" (it answers "unmounted RESULT"), "exit".
#[test]
fn child_serves_until_told() {
    let (Some(role), Some(dir), Some(seed)) = (
        std::env::var_os(CHILD_ROLE),
        std::env::var_os(CHILD_DIR),
        std::env::var(CHILD_SEED).ok(),
    ) else {
        return;
    };
    let seed: u64 = seed.parse().unwrap();
    let dir = PathBuf::from(dir);
    let mut unmount: Box<dyn FnMut() -> String> = if role == "lograid" {
        let vol = Arc::new(MemExport::new("vol0", SIZE));
        vol.fill(0, &pattern(SIZE as usize, seed));
        let mut m =
            Some(mount(&dir, vec![vol as Arc<dyn Export>], &FuseOptions::default()).unwrap());
        Box::new(move || match m.take().map(|m| m.unmount()) {
            Some(Ok(ended)) => format!("{ended:?}"),
            Some(Err(e)) => format!("Err: {e}"),
            None => "Err: unmounted twice".into(),
        })
    } else {
        let fs = Neighbour {
            data: Mutex::new(pattern(SIZE as usize, seed)),
            at: SystemTime::now(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![MountOption::FSName("neighbour".into())];
        let session = fuser::Session::new(fs, &dir, &config).unwrap();
        let mut bg = Some(session.spawn().unwrap());
        Box::new(move || match bg.take().map(|bg| bg.umount_and_join()) {
            Some(Ok(())) => "Clean".into(),
            Some(Err(e)) => format!("Err: {e}"),
            None => "Err: unmounted twice".into(),
        })
    };
    println!("mounted");
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "unmount" => println!("unmounted {}", unmount()),
            _ => break,
        }
    }
    // Without unmounting what is still mounted, as a server that is killed.
    std::process::exit(0);
}

/// A FUSE filesystem that is not lograid's: a root directory holding one file, "data", kept
/// in memory.
struct Neighbour {
    data: Mutex<Vec<u8>>,
    at: SystemTime,
}

const NEIGHBOUR_FILE: &str = "data";
const TTL: Duration = Duration::from_secs(1);

impl Neighbour {
    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, size, perm, nlink) = if ino == 1 {
            (FileType::Directory, 0, 0o755, 2)
        } else {
            (FileType::RegularFile, SIZE, 0o600, 1)
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size / 512,
            atime: self.at,
            mtime: self.at,
            ctime: self.at,
            crtime: self.at,
            kind,
            perm,
            nlink,
            // SAFETY: plain getters.
            uid: unsafe { libc::geteuid() },
            gid: unsafe { libc::getegid() },
            rdev: 0,
            flags: 0,
            blksize: BLOCK as u32,
        }
    }
}

impl Filesystem for Neighbour {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if u64::from(parent) == 1 && name == NEIGHBOUR_FILE {
            reply.entry(&TTL, &self.attr(2), Generation(0))
        } else {
            reply.error(Errno::ENOENT)
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &self.attr(u64::from(ino)))
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO)
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = self.data.lock().unwrap();
        let start = (offset as usize).min(data.len());
        let end = (start + size as usize).min(data.len());
        reply.data(&data[start..end])
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        written: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut data = self.data.lock().unwrap();
        let start = (offset as usize).min(data.len());
        let end = (start + written.len()).min(data.len());
        data[start..end].copy_from_slice(&written[..end - start]);
        reply.written((end - start) as u32)
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if offset == 0 {
            let _ = reply.add(INodeNo(2), 1, FileType::RegularFile, NEIGHBOUR_FILE);
        }
        reply.ok()
    }
}

// ---------------------------------------------------------------------------------------------
// The parent's side.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Lograid,
    Neighbour,
}

/// How long a child may take to answer (to mount, or to unmount): a server that waits for
/// its own connection to end after unmounting something else hangs, and fails the test here.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// Taken (shared) while a child process is started, until it says it mounted, and (exclusive)
/// while a server is told to unmount: a process being started holds copies of this process's
/// descriptors (files held on other lanes' mounts) until it has run the test binary for a
/// while (they are closed on exec, and let go of when the exec returns), which would make those
/// mounts busy meanwhile.
static SPAWNING: RwLock<()> = RwLock::new(());

/// A child process serving one mount; killed if dropped before [`Server::exit`].
struct Server {
    /// Which round started it, for messages.
    label: String,
    kind: Kind,
    dir: PathBuf,
    seed: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    /// What the child writes, line by line (read by a thread of its own).
    lines: Mutex<mpsc::Receiver<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    /// Starts a child serving a mount of `kind` on `dir` and waits until it is mounted.
    fn start(kind: Kind, dir: &Path, seed: u64, label: &str) -> Server {
        let spawning = SPAWNING.read().unwrap_or_else(|e| e.into_inner());
        let mut child = {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_serves_until_told", "--nocapture"])
                .env(
                    CHILD_ROLE,
                    if kind == Kind::Lograid {
                        "lograid"
                    } else {
                        "neighbour"
                    },
                )
                .env(CHILD_DIR, dir)
                .env(CHILD_SEED, seed.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            label: label.to_owned(),
            kind,
            dir: dir.to_owned(),
            seed,
            child,
            stdin,
            lines: Mutex::new(lines),
        };
        server.wait_for("mounted");
        drop(spawning);
        server
    }

    /// The rest of the first line the child writes that starts with `prefix`.
    fn wait_for(&mut self, prefix: &str) -> String {
        self.wait_for_or(prefix, &|| {})
    }

    /// [`Server::wait_for`], running `before_failing` (checks that may say better what went
    /// wrong) if no answer comes.
    fn wait_for_or(&mut self, prefix: &str, before_failing: &dyn Fn()) -> String {
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            let line = self
                .lines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|e| {
                    before_failing();
                    panic!(
                        "{}: the {:?} server on {} did not say {prefix:?} ({e}: exited, or no answer within {ANSWER_WAIT:?})",
                        self.label,
                        self.kind,
                        self.dir.display()
                    )
                });
            if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    /// Tells the server to unmount; returns how it says the mount ended.
    fn unmount(&mut self) -> String {
        self.unmount_checking(&|| {})
    }

    /// [`Server::unmount`], running `before_failing` if the server does not answer.
    fn unmount_checking(&mut self, before_failing: &dyn Fn()) -> String {
        let _no_spawning = SPAWNING.write().unwrap_or_else(|e| e.into_inner());
        writeln!(self.stdin.as_mut().unwrap(), "unmount").unwrap();
        self.wait_for_or("unmounted", before_failing)
    }

    /// Lets the process end (without unmounting what it still has mounted).
    fn exit(mut self) {
        let _ = writeln!(self.stdin.as_mut().unwrap(), "exit");
        self.stdin = None;
        assert!(self.child.wait().unwrap().success());
    }

    fn file(&self) -> PathBuf {
        self.dir.join(match self.kind {
            Kind::Lograid => "vol0",
            Kind::Neighbour => NEIGHBOUR_FILE,
        })
    }

    /// Opens the mount's file for reading and writing (as a loop device holds it).
    fn hold(&self) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.file())
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.file().display()))
    }
}

/// Reads block `block` of `file` (written with `seed` and by [`write_and_check`]); panics with
/// `what` unless it holds what it should.
fn check_block(file: &File, block: u64, seed: u64, what: &str) {
    let mut buf = vec![0u8; BLOCK];
    file.read_exact_at(&mut buf, block * BLOCK as u64)
        .unwrap_or_else(|e| panic!("{what}: reading block {block}: {e}"));
    let start = block as usize * BLOCK;
    assert!(
        buf == pattern(SIZE as usize, seed)[start..start + BLOCK],
        "{what}: block {block} changed"
    );
}

/// Writes block `block` of `file` with what it held at the start, and reads it back.
fn write_and_check(file: &File, block: u64, seed: u64, what: &str) {
    let start = block as usize * BLOCK;
    file.write_all_at(
        &pattern(SIZE as usize, seed)[start..start + BLOCK],
        block * BLOCK as u64,
    )
    .unwrap_or_else(|e| panic!("{what}: writing block {block}: {e}"));
    check_block(file, block, seed, what);
}

/// `server`'s mount is on its directory, with device `dev`, and answers reads and writes, also
/// through `held` (a descriptor opened before).
fn assert_unharmed(server: &Server, dev: u64, held: Option<&File>, block: u64, what: &str) {
    let meta = std::fs::metadata(&server.dir)
        .unwrap_or_else(|e| panic!("{what}: {}: {e}", server.dir.display()));
    assert_eq!(
        meta.dev(),
        dev,
        "{what}: the {:?} mount on {} is gone from its directory",
        server.kind,
        server.dir.display()
    );
    let file = File::options()
        .read(true)
        .write(true)
        .open(server.file())
        .unwrap_or_else(|e| panic!("{what}: opening {}: {e}", server.file().display()));
    write_and_check(&file, block, server.seed, what);
    if let Some(held) = held {
        write_and_check(held, block + 1, server.seed, &format!("{what} (held file)"));
    }
}

/// Unmounts `server` (its files all closed), which must end cleanly, and lets it exit.
fn stop_cleanly(mut server: Server, what: &str) {
    let ended = server.unmount();
    assert_eq!(
        ended, "Clean",
        "{what}: the {:?} server's unmount",
        server.kind
    );
    assert!(
        !is_mount_point(&server.dir),
        "{what}: the {:?} mount is still on {}",
        server.kind,
        server.dir.display()
    );
    server.exit();
}

/// Detaches the mount on `dir` lazily, as `umount -l` by an administrator would.
fn detach(dir: &Path) {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: umount2 on a NUL-terminated path.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    assert_eq!(
        rc,
        0,
        "umount -l {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
}

/// The device number of the (live) mount on `dir`.
fn dev_of(dir: &Path) -> u64 {
    std::fs::metadata(dir).unwrap().dev()
}

/// Waits until FUSE connection `number` is gone (its mount ended and its last user let go).
fn wait_connection_gone(number: u32) {
    let path = Path::new("/sys/fs/fuse/connections").join(number.to_string());
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "connection {number} still there after 10 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The long-lived mounts beside the lanes, checked after every round.
struct Bystanders {
    neighbour: Server,
    lograid: Server,
    devs: (u64, u64),
}

impl Bystanders {
    fn check(&self, lane: u64, what: &str) {
        // Each lane writes blocks of its own.
        let block = 16 + 4 * lane;
        assert_unharmed(
            &self.neighbour,
            self.devs.0,
            None,
            block,
            &format!("{what}: bystander neighbour"),
        );
        assert_unharmed(
            &self.lograid,
            self.devs.1,
            None,
            block,
            &format!("{what}: bystander lograid server"),
        );
    }
}

/// Detaches, when dropped, every mount left under its directory (by a failed round, whose
/// servers were killed).
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for point in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if Path::new(point).starts_with(&self.0) {
                detach(Path::new(point));
            }
        }
    }
}

/// One lane: `rounds` rounds on a directory of its own.
fn run_lane(lane: u64, rounds: usize, root: &Path, bystanders: &Bystanders) {
    let dir = root.join(format!("lane{lane}"));
    std::fs::create_dir(&dir).unwrap();
    for round in 0..rounds {
        let seed = lane * 1_000_003 + round as u64;
        let what = format!("lane {lane} round {round}");
        // The newcomer of the displacing rounds: another lograid server or a neighbour.
        let newcomer = if (round / 5) % 2 == 0 {
            Kind::Neighbour
        } else {
            Kind::Lograid
        };
        match round % 5 {
            0 => {
                let server = Server::start(Kind::Lograid, &dir, seed, &what);
                let dev = dev_of(&dir);
                assert_unharmed(&server, dev, None, 0, &what);
                stop_cleanly(server, &what);
            }
            1 => {
                let mut server = Server::start(Kind::Lograid, &dir, seed, &what);
                let held = server.hold();
                check_block(&held, 3, seed, &what);
                assert_eq!(
                    server.unmount(),
                    "Aborted",
                    "{what}: a stop with a file held"
                );
                assert!(
                    held.read_at(&mut [0u8; 512], 0).is_err(),
                    "{what}: the held file still reads"
                );
                server.exit();
            }
            variant => {
                // Our server's mount leaves the directory, held (2, 4) or not (3); another
                // takes the directory, held (2, 3) or not (4); then our server stops.
                let mut ours = Server::start(Kind::Lograid, &dir, seed, &what);
                let number = connection_of(&dir).unwrap();
                let ours_held = (variant != 3).then(|| ours.hold());
                detach(&dir);
                if ours_held.is_none() {
                    // Its number is free now, and the next FUSE mount on the machine may get it.
                    wait_connection_gone(number);
                }
                let other = Server::start(newcomer, &dir, seed ^ 0x5a5a, &what);
                let other_dev = dev_of(&dir);
                let other_held = (variant != 4).then(|| other.hold());
                let what = format!(
                    "{what} ({newcomer:?} on the directory, ours {} and theirs {})",
                    if ours_held.is_some() { "held" } else { "gone" },
                    if other_held.is_some() {
                        "held"
                    } else {
                        "unused"
                    },
                );
                // A server that ended the newcomer's mount waits for its own connection to end,
                // and never answers: the newcomer is checked first then, to say so.
                let ended = ours.unmount_checking(&|| {
                    let what = format!("{what}: while our server stops (it does not answer)");
                    assert_unharmed(&other, other_dev, other_held.as_ref(), 4, &what);
                });
                assert_unharmed(
                    &other,
                    other_dev,
                    other_held.as_ref(),
                    4,
                    &format!("{what}: after our server's stop ({ended})"),
                );
                match &ours_held {
                    // Not ours on the directory: nothing there may be touched, and our
                    // connection can't be aborted without it; its requests fail.
                    Some(held) => {
                        assert_eq!(ended, "Refusing", "{what}");
                        assert!(
                            held.read_at(&mut [0u8; 512], 0).is_err(),
                            "{what}: our held file still reads"
                        );
                    }
                    None => assert_eq!(ended, "Clean", "{what}"),
                }
                ours.exit();
                drop(ours_held);
                assert_unharmed(
                    &other,
                    other_dev,
                    other_held.as_ref(),
                    8,
                    &format!("{what}: after our server exited"),
                );
                drop(other_held);
                stop_cleanly(other, &what);
            }
        }
        assert!(
            !is_mount_point(&dir),
            "{what}: something left on {}",
            dir.display()
        );
        bystanders.check(lane, &what);
    }
}

/// Mounting on a directory whose mount's server does not answer (stopped, as a wedged server
/// is) is refused without waiting for that server beyond the 3 s probe: a lograid server's
/// mount (the directory named also with a trailing slash) counts as live, a neighbour's is not
/// ours; each is unharmed once its server runs again.
#[test]
fn a_mount_whose_server_does_not_answer_is_refused_without_waiting_for_it() {
    if !can_mount() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(root.path().to_owned());
    for (kind, seed, refusal) in [
        (Kind::Lograid, 11, "served by a running lograid"),
        (Kind::Neighbour, 12, "already a mount point (fuse"),
    ] {
        let dir = root.path().join(format!("{kind:?}"));
        std::fs::create_dir(&dir).unwrap();
        let server = Server::start(kind, &dir, seed, "stopped");
        // Not `stat`: that would put the root's attributes in the kernel's cache, and a later
        // `stat` of the directory would not reach the server.
        let dev = dev_listed(&dir);
        // SAFETY: kill on our own child, not reaped yet.
        assert_eq!(
            unsafe { libc::kill(server.child.id() as i32, libc::SIGSTOP) },
            0
        );
        let slashed = PathBuf::from(format!("{}/", dir.display()));
        let answers: Vec<_> = [&dir, &slashed]
            .into_iter()
            .map(|d| (d.clone(), mount_within(d, Duration::from_secs(15))))
            .collect();
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::kill(server.child.id() as i32, libc::SIGCONT) },
            0
        );
        for (d, answer) in answers {
            let (message, took) = answer.unwrap_or_else(|| {
                panic!(
                    "mounting on {} (the {kind:?} server stopped) waited for that server for 15 s",
                    d.display()
                )
            });
            assert!(message.contains(refusal), "{}: {message}", d.display());
            eprintln!("{kind:?}, {}: refused in {took:?}", d.display());
        }
        // The refused mounts' probes (threads of this process) were blocked in the stopped
        // server: each holds the mount until its answer comes; a clean unmount needs them gone.
        wait_for_probes_to_end();
        assert_unharmed(
            &server,
            dev,
            None,
            0,
            &format!("{kind:?} after the refusals"),
        );
        stop_cleanly(server, &format!("the {kind:?} server"));
    }
}

/// Waits (at most 10 s) until no probe thread of the crate runs in this process (their names,
/// as /proc shows them cut to 15 bytes: `lograid-fuse-pr`, `lograid-fuse-id`).
fn wait_for_probes_to_end() {
    let probing = || {
        std::fs::read_dir("/proc/self/task").unwrap().any(|t| {
            let comm = std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap_or_default();
            comm.starts_with("lograid-fuse-pr") || comm.starts_with("lograid-fuse-id")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while probing() {
        assert!(
            Instant::now() < deadline,
            "the crate's probe threads still run after 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The device number of the mount on `dir` as /proc/self/mountinfo lists it (no request to its
/// server).
fn dev_listed(dir: &Path) -> u64 {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*dir.to_string_lossy()))
        .unwrap_or_else(|| panic!("nothing mounted on {}", dir.display()));
    let (major, minor) = line.split(' ').nth(2).unwrap().split_once(':').unwrap();
    libc::makedev(major.parse().unwrap(), minor.parse().unwrap())
}

/// What `mount` on `dir` answers (its error's text, or "mounted" after unmounting again) and
/// how long it took; `None` if it had not answered within `timeout`.
fn mount_within(dir: &Path, timeout: Duration) -> Option<(String, Duration)> {
    let (tx, rx) = mpsc::channel();
    let dir = dir.to_owned();
    let started = Instant::now();
    std::thread::spawn(move || {
        let vol = Arc::new(MemExport::new("vol0", SIZE));
        let answer = match mount(&dir, vec![vol as Arc<dyn Export>], &FuseOptions::default()) {
            Ok(m) => format!("mounted, then {:?}", m.unmount()),
            Err(e) => e.to_string(),
        };
        let _ = tx.send((answer, started.elapsed()));
    });
    rx.recv_timeout(timeout).ok()
}

/// Many servers' mounts, made and ended side by side in processes of their own, with
/// neighbours that are not lograid's: a server aborts and detaches only its own mount's
/// connection, never another mount on its directory or elsewhere.
#[test]
fn servers_side_by_side_end_only_their_own_mounts() {
    if !can_mount() {
        return;
    }
    let rounds = env_number("LOGRAID_NEIGHBOUR_ROUNDS", 50);
    let lanes = env_number("LOGRAID_NEIGHBOUR_LANES", 3);
    let root = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(root.path().to_owned());
    let (n_dir, l_dir) = (root.path().join("neighbour"), root.path().join("bystander"));
    std::fs::create_dir(&n_dir).unwrap();
    let neighbour = Server::start(Kind::Neighbour, &n_dir, 7, "bystander");
    let lograid = Server::start(Kind::Lograid, &l_dir, 8, "bystander");
    let devs = (dev_of(&n_dir), dev_of(&l_dir));
    let bystanders = Bystanders {
        neighbour,
        lograid,
        devs,
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        let lanes: Vec<_> = (0..lanes as u64)
            .map(|lane| {
                let (root, bystanders) = (root.path(), &bystanders);
                s.spawn(move || run_lane(lane, rounds, root, bystanders))
            })
            .collect();
        for lane in lanes {
            if let Err(panic) = lane.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    eprintln!(
        "{lanes} lanes x {rounds} rounds in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    bystanders.check(0, "at the end");
    let Bystanders {
        neighbour, lograid, ..
    } = bystanders;
    stop_cleanly(neighbour, "bystander neighbour");
    stop_cleanly(lograid, "bystander lograid server");
    assert!(!is_mount_point(&n_dir));
    assert!(!is_mount_point(&l_dir));
}
