//! Helpers for the tests that run the real `lograid` binary with real NBD
//! clients: pools on sparse files in a temporary directory, a server process
//! on a free loopback port, attachments and mounts, each behind a guard that
//! cleans up on drop (also when the test panics).
//!
//! Tools that are missing (or root, /dev/fuse, loop devices) make a test
//! fail, unless LOGRAID_SKIP_EXTERNAL=1, which makes it pass without running.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_lograid");

/// Where an executable is, looking in PATH and the sbin directories.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// A command for an external tool, by its full path when found (non-root PATHs often lack sbin).
pub fn tool(name: &str) -> Command {
    Command::new(find_tool(name).unwrap_or_else(|| PathBuf::from(name)))
}

fn skip_external() -> bool {
    std::env::var("LOGRAID_SKIP_EXTERNAL").is_ok_and(|v| v == "1")
}

/// True when every tool is installed. A missing tool fails the test unless
/// LOGRAID_SKIP_EXTERNAL=1 (then the test returns early).
pub fn need_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| find_tool(t).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    if skip_external() {
        eprintln!("SKIPPED (LOGRAID_SKIP_EXTERNAL=1): missing {missing:?}");
        return false;
    }
    panic!(
        "missing tools {missing:?}: install them (scripts/test-all.sh does: libnbd-bin, qemu-utils, fio, fuse3, \
         e2fsprogs, xfsprogs) or set LOGRAID_SKIP_EXTERNAL=1 to skip the tests that need them"
    );
}

/// True when this process can make kernel block devices (root, /dev/fuse,
/// loop devices) and has the tools for it.
pub fn need_block_devices(extra_tools: &[&str]) -> bool {
    let mut problems = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        problems.push("not root".to_string());
    }
    if !Path::new("/dev/fuse").exists() {
        problems.push("no /dev/fuse".to_string());
    }
    if !Path::new("/dev/loop-control").exists() {
        problems.push("no /dev/loop-control".to_string());
    }
    for t in ["nbdfuse", "losetup", "fusermount3", "mount", "umount"]
        .iter()
        .chain(extra_tools)
    {
        if find_tool(t).is_none() {
            problems.push(format!("no {t}"));
        }
    }
    if problems.is_empty() {
        return true;
    }
    if skip_external() {
        eprintln!("SKIPPED (LOGRAID_SKIP_EXTERNAL=1): {problems:?}");
        return false;
    }
    panic!("cannot attach block devices here: {problems:?} (set LOGRAID_SKIP_EXTERNAL=1 to skip these tests)");
}

/// Runs a command, returning its output; panics with its stderr if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let rendered = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {rendered}: {e}"));
    if !out.status.success() {
        panic!(
            "{rendered} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// `lograid status --json DRIVES...`, parsed.
pub fn status_json(drives: &[PathBuf]) -> serde_json::Value {
    let out = stdout_of(lograid().args(["status", "--json"]).args(drives));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

pub fn lograid() -> Command {
    let mut c = Command::new(BIN);
    c.env("RUST_LOG", "warn,lograid_nbd=warn");
    c
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A small deterministic generator (xorshift64*), for test contents.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// A pool on sparse member files in its own temporary directory.
pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub drives: Vec<PathBuf>,
}

impl TestPool {
    /// `lograid create --size MEMBER --volume VOLUME DRIVES...` with 3 members, parity 1.
    pub fn create(member_size: &str, volume: &str) -> TestPool {
        Self::create_with(3, 1, member_size, volume)
    }

    pub fn create_with(members: usize, parity: u8, member_size: &str, volume: &str) -> TestPool {
        let dir = tempfile::Builder::new()
            .prefix("lograid-cli-test-")
            .tempdir()
            .unwrap();
        let drives: Vec<PathBuf> = (0..members)
            .map(|i| dir.path().join(format!("m{i}.img")))
            .collect();
        run(lograid()
            .args([
                "create",
                "--size",
                member_size,
                "--parity",
                &parity.to_string(),
                "--volume",
                volume,
            ])
            .args(&drives));
        TestPool { dir, drives }
    }

    pub fn add_volume(&self, name: &str, size: &str) {
        run(lograid()
            .args(["volume", "create", "--size", size, name])
            .args(&self.drives));
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn serve(&self) -> Server {
        Server::start(&self.drives, &[], self.dir.path())
    }

    pub fn serve_with(&self, extra: &[&str]) -> Server {
        Server::start(&self.drives, extra, self.dir.path())
    }
}

/// A running `lograid serve`; killed on drop if still running.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub log_dir: PathBuf,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
    pub args: Vec<String>,
}

static SERVER_SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Server {
    /// Starts `lograid serve DRIVES --listen 127.0.0.1:PORT EXTRA...` and waits until the port answers.
    pub fn start(drives: &[PathBuf], extra: &[&str], log_dir: &Path) -> Server {
        let mut args: Vec<String> = vec!["serve".into()];
        args.extend(drives.iter().map(|d| d.display().to_string()));
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start_args(args, log_dir, None)
    }

    /// Starts `lograid ARGS --listen 127.0.0.1:PORT` (in `cwd` if given); retries on a port clash.
    pub fn start_args(args: Vec<String>, log_dir: &Path, cwd: Option<&Path>) -> Server {
        Self::start_prepared(Path::new(BIN), args, log_dir, cwd, |_| {})
    }

    /// As [`Server::start_args`], running `program`, with a last say on the command (pre_exec, ...).
    pub fn start_prepared(
        program: &Path,
        args: Vec<String>,
        log_dir: &Path,
        cwd: Option<&Path>,
        prepare: impl Fn(&mut Command),
    ) -> Server {
        for _attempt in 0..3 {
            let port = free_port();
            let seq = SERVER_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let stdout_path = log_dir.join(format!("serve-{seq}.out"));
            let stderr_path = log_dir.join(format!("serve-{seq}.err"));
            let mut cmd = Command::new(program);
            cmd.args(&args)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&stdout_path).unwrap())
                .stderr(std::fs::File::create(&stderr_path).unwrap());
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            prepare(&mut cmd);
            let child = cmd.spawn().expect("starting lograid serve");
            let mut server = Server {
                child: Some(child),
                port,
                log_dir: log_dir.to_path_buf(),
                stdout_path,
                stderr_path,
                args: args.clone(),
            };
            match server.wait_ready(Duration::from_secs(60)) {
                Ok(()) => return server,
                Err(e) if server.stderr().contains("Address already in use") => {
                    eprintln!("port {port} was taken, retrying: {e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("could not start lograid serve on a free port");
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!(
                    "lograid serve exited early ({status}):\n{}\n{}",
                    self.stdout(),
                    self.stderr()
                ));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                // The port answers only once the files are mounted: a client that attaches
                // DIR/VOLUME as soon as it answers must find them (no waiting here).
                return match self.fuse_dir() {
                    Some(dir) => fuse_files_mounted(&dir).map_err(|e| {
                        format!(
                            "lograid serve answered on {addr} before its FUSE files were mounted: {e}\n{}",
                            self.stderr()
                        )
                    }),
                    None => Ok(()),
                };
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "lograid serve did not answer on {addr} within {timeout:?}:\n{}",
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The directory given with `--fuse`, if any.
    pub fn fuse_dir(&self) -> Option<PathBuf> {
        let at = self.args.iter().position(|a| a == "--fuse")?;
        self.args.get(at + 1).map(PathBuf::from)
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    pub fn base_uri(&self) -> String {
        format!("nbd://127.0.0.1:{}", self.port)
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    fn signal_and_wait(&mut self, signal: i32, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("server running");
        // SAFETY: kill on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "lograid serve did not exit within {timeout:?} of signal {signal}:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; asserts a clean exit (status 0, final checkpoint reported).
    pub fn terminate(mut self) -> String {
        let status = self.signal_and_wait(libc::SIGTERM, Duration::from_secs(60));
        let err = self.stderr();
        assert!(
            status.success(),
            "lograid serve exited with {status} after SIGTERM:\n{err}"
        );
        assert!(
            err.contains("closed cleanly"),
            "no clean close reported:\n{err}"
        );
        err
    }

    /// SIGKILL: no chance to flush or checkpoint.
    pub fn kill(mut self) {
        let status = self.signal_and_wait(libc::SIGKILL, Duration::from_secs(10));
        assert!(!status.success());
    }

    /// Starts the same server again (same drives and options, a new port).
    pub fn restart_args(&self) -> Vec<String> {
        self.args.clone()
    }
}

impl Drop for Server {
    /// Kills a server still running (a test failed), and detaches the dead mount its `--fuse`
    /// files leave, so that the failed test leaves nothing mounted.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(dir) = self.fuse_dir() {
                let dead = std::fs::read_dir(&dir)
                    .is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
                if dead {
                    let _ = tool("umount")
                        .arg("-l")
                        .arg(&dir)
                        .stdin(Stdio::null())
                        .status();
                }
            }
        }
    }
}

/// A device made by `lograid attach`; detached on drop.
pub struct Attachment {
    pub device: PathBuf,
    pub state_dir: PathBuf,
    /// Where the loop device's backing file lives (the state directory for nbdfuse's mounts).
    backing_dir: PathBuf,
    detached: bool,
}

impl Attachment {
    pub fn attach(server: &Server, export: &str, state_dir: &Path) -> Attachment {
        let out = stdout_of(
            lograid()
                .args([
                    "attach",
                    "--server",
                    &server.base_uri(),
                    "--export",
                    export,
                    "--state-dir",
                ])
                .arg(state_dir),
        );
        Self::from_output(&out, state_dir, state_dir)
    }

    /// `lograid attach --file FILE`: a volume's file from `serve --fuse DIR`.
    pub fn attach_file(file: &Path, state_dir: &Path) -> Attachment {
        let out = stdout_of(
            lograid()
                .arg("attach")
                .arg("--file")
                .arg(file)
                .arg("--state-dir")
                .arg(state_dir),
        );
        Self::from_output(&out, state_dir, file.parent().unwrap())
    }

    fn from_output(out: &str, state_dir: &Path, backing_dir: &Path) -> Attachment {
        let printed = out.trim();
        assert!(
            printed.starts_with("/dev/loop") && !printed.contains('\n'),
            "attach printed {out:?}"
        );
        Attachment {
            device: PathBuf::from(printed),
            state_dir: state_dir.to_path_buf(),
            backing_dir: backing_dir.to_path_buf(),
            detached: false,
        }
    }

    /// A guard for a device attached some other way: detached (and its leftovers unmounted) on drop.
    pub fn forget_on_drop(device: PathBuf, state_dir: &Path) -> Attachment {
        Attachment {
            device,
            state_dir: state_dir.to_path_buf(),
            backing_dir: state_dir.to_path_buf(),
            detached: false,
        }
    }

    /// Forgets a device that was detached some other way (e.g. `lograid detach --all`).
    pub fn forget(mut self) {
        self.detached = true;
    }

    pub fn detach(mut self) {
        self.detached = true;
        run(lograid()
            .arg("detach")
            .arg(&self.device)
            .arg("--state-dir")
            .arg(&self.state_dir));
        assert_no_fuse_mounts_under(&self.state_dir);
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if !self.detached {
            let _ = lograid()
                .arg("detach")
                .arg(&self.device)
                .arg("--state-dir")
                .arg(&self.state_dir)
                .stdin(Stdio::null())
                .output();
            // If the record was lost, still free a loop device that sits on our FUSE file.
            let backing = tool("losetup")
                .args(["-n", "-O", "BACK-FILE"])
                .arg(&self.device)
                .stdin(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if backing.contains(&*self.backing_dir.to_string_lossy()) {
                let _ = tool("losetup")
                    .arg("-d")
                    .arg(&self.device)
                    .stdin(Stdio::null())
                    .output();
            }
            unmount_fuse_leftovers(&self.state_dir);
        }
    }
}

/// Ok if the top mount on `dir` is a lograid FUSE mount that answers (lists its files).
pub fn fuse_files_mounted(dir: &Path) -> Result<(), String> {
    // mountinfo names the directory without a trailing slash.
    let dir: PathBuf = dir.components().collect();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let top = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*dir.to_string_lossy()))
        .ok_or_else(|| format!("nothing is mounted on {}", dir.display()))?;
    let after_dash: Vec<&str> = top.split(" - ").nth(1).unwrap_or("").split(' ').collect();
    if after_dash.get(1) != Some(&"lograid") {
        return Err(format!(
            "the mount on {} is not lograid's: {top}",
            dir.display()
        ));
    }
    std::fs::read_dir(&dir)
        .map(drop)
        .map_err(|e| format!("listing {}: {e}", dir.display()))
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

pub fn assert_no_fuse_mounts_under(dir: &Path) {
    let left = mounts_under(dir);
    if !left.is_empty() {
        unmount_fuse_leftovers(dir);
        panic!("mounts left under {} after detach: {left:?}", dir.display());
    }
}

/// Last-resort cleanup: lazily unmounts whatever is still mounted under `dir`.
pub fn unmount_fuse_leftovers(dir: &Path) {
    for m in mounts_under(dir) {
        let _ = tool("fusermount3")
            .args(["-u", "-z", &m])
            .stdin(Stdio::null())
            .output();
        let _ = tool("umount")
            .args(["-l", &m])
            .stdin(Stdio::null())
            .output();
    }
}

/// A mounted filesystem; unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn at(device: &Path, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        run(tool("mount").arg(device).arg(dir));
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    pub fn unmount(mut self) {
        self.mounted = false;
        run(tool("umount").arg(&self.dir));
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            for _ in 0..5 {
                if tool("umount")
                    .arg(&self.dir)
                    .stdin(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = tool("umount")
                .arg("-l")
                .arg(&self.dir)
                .stdin(Stdio::null())
                .status();
        }
    }
}

/// Writes `data` to a file and returns the path.
pub fn write_file(path: &Path, data: &[u8]) -> PathBuf {
    std::fs::File::create(path)
        .unwrap()
        .write_all(data)
        .unwrap();
    path.to_path_buf()
}

pub fn read_file(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    v
}

// ---------------------------------------------------------------------------
// A minimal NBD client (fixed newstyle, NBD_OPT_GO, simple replies) for what
// the standard tools cannot do: a flush on one connection covering writes
// made on another, and writes left unflushed on purpose.
// ---------------------------------------------------------------------------

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const NBD_OPT_GO: u32 = 7;
const NBD_REP_ACK: u32 = 1;
const NBD_REP_INFO: u32 = 3;
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_FLAG_FUA: u16 = 1;

pub struct NbdClient {
    stream: TcpStream,
    pub size: u64,
    pub flags: u16,
    cookie: u64,
}

impl NbdClient {
    pub fn connect(port: u16, export: &str) -> NbdClient {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut head = [0u8; 18];
        stream.read_exact(&mut head).unwrap();
        assert_eq!(u64::from_be_bytes(head[0..8].try_into().unwrap()), NBDMAGIC);
        assert_eq!(
            u64::from_be_bytes(head[8..16].try_into().unwrap()),
            IHAVEOPT
        );
        // FIXED_NEWSTYLE | NO_ZEROES
        stream.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = Vec::new();
        opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
        opt.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
        let payload_len = 4 + export.len() + 2;
        opt.extend_from_slice(&(payload_len as u32).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&opt).unwrap();
        let (mut size, mut flags) = (None, 0);
        loop {
            let mut rep = [0u8; 20];
            stream.read_exact(&mut rep).unwrap();
            assert_eq!(
                u64::from_be_bytes(rep[0..8].try_into().unwrap()),
                REPLY_MAGIC
            );
            let kind = u32::from_be_bytes(rep[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(rep[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0u8; len];
            stream.read_exact(&mut data).unwrap();
            match kind {
                NBD_REP_ACK => break,
                NBD_REP_INFO if u16::from_be_bytes([data[0], data[1]]) == 0 => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                other if other & 0x8000_0000 != 0 => {
                    panic!(
                        "NBD_OPT_GO for {export:?} refused: reply {other:#x} {}",
                        String::from_utf8_lossy(&data)
                    )
                }
                _ => {}
            }
        }
        NbdClient {
            stream,
            size: size.expect("NBD_INFO_EXPORT"),
            flags,
            cookie: 0,
        }
    }

    /// Sends one request and waits for its simple reply; returns the NBD error (0 = ok) and read data.
    pub fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> (u32, Vec<u8>) {
        self.try_request(command, flags, offset, length, payload)
            .expect("NBD connection failed")
    }

    /// As [`NbdClient::request`], but a dead connection is an error, not a panic.
    pub fn try_request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> std::io::Result<(u32, Vec<u8>)> {
        self.cookie += 1;
        let mut req = Vec::with_capacity(28 + payload.len());
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&flags.to_be_bytes());
        req.extend_from_slice(&command.to_be_bytes());
        req.extend_from_slice(&self.cookie.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&length.to_be_bytes());
        req.extend_from_slice(payload);
        self.stream.write_all(&req)?;
        let mut rep = [0u8; 16];
        self.stream.read_exact(&mut rep)?;
        assert_eq!(
            u32::from_be_bytes(rep[0..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        let error = u32::from_be_bytes(rep[4..8].try_into().unwrap());
        assert_eq!(
            u64::from_be_bytes(rep[8..16].try_into().unwrap()),
            self.cookie
        );
        let mut data = Vec::new();
        if command == NBD_CMD_READ && error == 0 {
            data = vec![0u8; length as usize];
            self.stream.read_exact(&mut data)?;
        }
        Ok((error, data))
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let (e, _) = self.request(NBD_CMD_WRITE, 0, offset, data.len() as u32, data);
        assert_eq!(e, 0, "write at {offset} failed");
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Vec<u8> {
        let (e, d) = self.request(NBD_CMD_READ, 0, offset, length, &[]);
        assert_eq!(e, 0, "read at {offset} failed");
        d
    }

    pub fn flush(&mut self) {
        let (e, _) = self.request(NBD_CMD_FLUSH, 0, 0, 0, &[]);
        assert_eq!(e, 0, "flush failed");
    }

    /// NBD_CMD_DISC: the server closes the connection after answering what is in flight.
    pub fn disconnect(mut self) {
        self.cookie += 1;
        let mut req = Vec::new();
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&NBD_CMD_DISC.to_be_bytes());
        req.extend_from_slice(&self.cookie.to_be_bytes());
        req.extend_from_slice(&[0u8; 12]);
        let _ = self.stream.write_all(&req);
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest);
    }
}

/// sha256 of bytes, as hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn elapsed_note(name: &str, started: Instant) {
    eprintln!("{name}: {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// A small NFS client (tests/nfs/nfs_probe.c, on libnfs's RPC layer)

/// Compiles the C client once per test process, into the build's directory for test files
/// (each process builds its own copy, then renames it over the one before: nothing is left
/// behind in /tmp, and a copy another test runs is not touched).
pub fn probe_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            assert!(need_tools(&["cc", "nfs-ls", "nfs-cat"]));
            assert!(
                Path::new("/usr/include/nfsc/libnfs-raw.h").exists(),
                "libnfs-dev is missing (scripts/test-all.sh installs it)"
            );
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
            let out = dir.join("nfs_probe");
            let building = dir.join(format!("nfs_probe.{}", std::process::id()));
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nfs/nfs_probe.c");
            run(Command::new("cc")
                .args(["-O2", "-Wall", "-o"])
                .arg(&building)
                .arg(&source)
                .arg("-lnfs"));
            std::fs::rename(&building, &out).unwrap();
            out
        })
        .clone()
}

/// Runs the probe's steps against the NFS server on `port`; its output lines.
pub fn probe(port: u16, steps: &[&str]) -> Vec<String> {
    let out = stdout_of(
        Command::new(probe_binary())
            .args(["127.0.0.1", &port.to_string()])
            .args(steps),
    );
    out.lines().map(str::to_string).collect()
}

/// The value of `key=` in a probe line.
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|part| part.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}
