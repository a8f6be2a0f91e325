//! Turning an NBD export into a kernel block device on hosts without the nbd driver:
//! `nbdfuse` exposes the export as a FUSE file, and a loop device with direct I/O sits on it.
//! A file that already exists (a volume's file in the FUSE mount of `lograid serve --fuse DIR`)
//! gets only the loop device ([`attach_file`]); its record has no nbdfuse (pid 0).
//!
//! Owns: starting and stopping that stack (nbdfuse, losetup, fusermount3) and a small state file
//! in the work directory that records each attachment, so that another process (`lograid detach
//! /dev/loopN`) can undo it. Must never: kill nbdfuse (unmounting makes it exit cleanly), or touch
//! a loop device or mount it did not record.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long nbdfuse may take to connect and mount.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long unmounting (and nbdfuse's exit) may take.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);
/// Name of the state file (and its lock) inside the work directory.
const STATE_FILE: &str = "attachments";
const LOCK_FILE: &str = "attachments.lock";
const STATE_VERSION: &str = "lograid-attachments-v1";

/// Errors of attaching and detaching.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("`{tool}` not found in PATH; install the Debian package `{package}`")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("/dev/fuse is missing: the kernel has no FUSE support (or it is not available in this container)")]
    NoFuse,
    #[error("bad NBD URI {0:?}: {1}")]
    Uri(String, &'static str),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{0}")]
    Timeout(String),
    #[error("no attachment of {0} is recorded in this work directory")]
    NotAttached(PathBuf),
    #[error("state file {path}: {problem}")]
    State { path: PathBuf, problem: String },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> AttachError {
    let what = what.into();
    move |source| AttachError::Io { what, source }
}

/// One recorded attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachmentRecord {
    /// `/dev/loopN`.
    pub loop_device: PathBuf,
    /// Where nbdfuse is mounted; the FUSE file is `mount_dir/nbd`. For [`attach_file`]: the
    /// file's directory (mounted by someone else).
    pub mount_dir: PathBuf,
    /// 0 for [`attach_file`]: no nbdfuse of ours.
    pub nbdfuse_pid: u32,
    /// The full NBD URI nbdfuse connected to (export name included), or the attached file.
    pub uri: String,
}

impl AttachmentRecord {
    pub fn fuse_file(&self) -> PathBuf {
        if self.owns_mount() {
            self.mount_dir.join("nbd")
        } else {
            PathBuf::from(&self.uri)
        }
    }

    /// Whether the FUSE mount is ours (nbdfuse's), to unmount on detach.
    pub fn owns_mount(&self) -> bool {
        self.nbdfuse_pid != 0
    }
}

/// A live attachment made by this process. Dropping it leaves the device attached; call
/// [`Attached::detach`] (or [`detach`] from any process) to undo it.
#[derive(Debug)]
pub struct Attached {
    pub record: AttachmentRecord,
    pub work_dir: PathBuf,
    nbdfuse: Option<Child>,
}

impl Attached {
    pub fn loop_device(&self) -> &Path {
        &self.record.loop_device
    }

    /// Undoes this attachment: `losetup -d`, `fusermount3 -u`, waits for nbdfuse to exit.
    pub fn detach(mut self) -> Result<(), AttachError> {
        let child = self.nbdfuse.take();
        detach_record(&self.work_dir, &self.record.loop_device, child)
    }
}

/// Which tool is in which Debian package.
const TOOLS: [(&str, &str); 3] = [
    ("nbdfuse", "libnbd-bin"),
    ("losetup", "mount"),
    ("fusermount3", "fuse3"),
];

/// Finds an executable in PATH (and the sbin directories, where losetup lives).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| {
            fs::metadata(candidate)
                .map(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Checks that nbdfuse, losetup and fusermount3 are installed and that /dev/fuse exists.
pub fn check_attach_tools() -> Result<(), AttachError> {
    for (tool, package) in TOOLS {
        if find_tool(tool).is_none() {
            return Err(AttachError::MissingTool { tool, package });
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(AttachError::NoFuse);
    }
    Ok(())
}

fn tool(name: &'static str) -> Result<PathBuf, AttachError> {
    find_tool(name).ok_or_else(|| AttachError::MissingTool {
        tool: name,
        package: TOOLS
            .iter()
            .find(|(tool, _)| *tool == name)
            .map_or("?", |(_, package)| package),
    })
}

/// Percent-encodes an export name for the path of an NBD URI.
fn encode_export_name(name: &str) -> String {
    let mut out = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Puts `export_name` into the path of an NBD URI (`nbd://host:port`, `nbd+unix:///?socket=...`).
/// A URI that already names an export is kept if `export_name` is empty or the same.
pub fn export_uri(uri: &str, export_name: &str) -> Result<String, AttachError> {
    let bad = |problem| AttachError::Uri(uri.to_owned(), problem);
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if !matches!(scheme, "nbd" | "nbd+unix" | "nbds" | "nbds+unix") {
        return Err(bad("scheme must be nbd, nbd+unix, nbds or nbds+unix"));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(index) => (&before_query[..index], &before_query[index + 1..]),
        None => (before_query, ""),
    };
    let encoded = encode_export_name(export_name);
    let path = if path.is_empty() {
        encoded
    } else if export_name.is_empty() || path == encoded {
        path.to_owned()
    } else {
        return Err(bad("the URI already names a different export"));
    };
    let mut out = format!("{scheme}://{authority}/{path}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Ok(out)
}

/// Holds the exclusive lock on the state file of a work directory.
struct StateLock {
    _file: File,
}

fn lock_state(work_dir: &Path) -> Result<StateLock, AttachError> {
    let path = work_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error(format!("opening {}", path.display())))?;
    // SAFETY: flock on a file descriptor we own; it is released when the file is closed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io_error(format!("locking {}", path.display()))(
            io::Error::last_os_error(),
        ));
    }
    Ok(StateLock { _file: file })
}

fn read_records(work_dir: &Path) -> Result<Vec<AttachmentRecord>, AttachError> {
    let path = work_dir.join(STATE_FILE);
    let mut text = String::new();
    match File::open(&path) {
        Ok(mut file) => {
            file.read_to_string(&mut text)
                .map_err(io_error(format!("reading {}", path.display())))?;
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error(format!("opening {}", path.display()))(error)),
    }
    parse_records(&text).map_err(|problem| AttachError::State { path, problem })
}

/// Parses the state file's text (a version line, then one record per line, fields separated
/// by tabs: loop device, nbdfuse pid, mount directory, URI or file).
pub(crate) fn parse_records(text: &str) -> Result<Vec<AttachmentRecord>, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(STATE_VERSION) | None => {}
        Some(other) => return Err(format!("unknown header {other:?}")),
    }
    let mut records = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        if line.contains('\r') {
            // Never written (paths with tabs, newlines or carriage returns are refused).
            return Err(format!("malformed line {line:?}"));
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [loop_device, pid, mount_dir, uri] = fields[..] else {
            return Err(format!("malformed line {line:?}"));
        };
        let nbdfuse_pid = pid.parse().map_err(|_| format!("bad pid in {line:?}"))?;
        records.push(AttachmentRecord {
            loop_device: PathBuf::from(loop_device),
            mount_dir: PathBuf::from(mount_dir),
            nbdfuse_pid,
            uri: uri.to_owned(),
        });
    }
    Ok(records)
}

/// The state file's text for `records` (what [`parse_records`] reads).
pub(crate) fn format_records(records: &[AttachmentRecord]) -> String {
    let mut text = format!("{STATE_VERSION}\n");
    for record in records {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            record.loop_device.display(),
            record.nbdfuse_pid,
            record.mount_dir.display(),
            record.uri
        ));
    }
    text
}

fn write_records(work_dir: &Path, records: &[AttachmentRecord]) -> Result<(), AttachError> {
    let path = work_dir.join(STATE_FILE);
    let temporary = work_dir.join(format!("{STATE_FILE}.tmp"));
    let text = format_records(records);
    let mut file =
        File::create(&temporary).map_err(io_error(format!("creating {}", temporary.display())))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error(format!("writing {}", temporary.display())))?;
    fs::rename(&temporary, &path).map_err(io_error(format!("replacing {}", path.display())))
}

/// Recorded attachments of a work directory.
pub fn list_attachments(work_dir: &Path) -> Result<Vec<AttachmentRecord>, AttachError> {
    if !work_dir.exists() {
        return Ok(Vec::new());
    }
    let _lock = lock_state(work_dir)?;
    read_records(work_dir)
}

fn run(command: &mut Command) -> Result<String, AttachError> {
    let rendered = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(io_error(format!("running {rendered}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(AttachError::Command {
            command: rendered,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn has_text(path: &Path) -> bool {
    fs::read_to_string(path)
        .map(|text| !text.trim().is_empty())
        .unwrap_or(false)
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|&index| text.is_char_boundary(index))
        .unwrap_or(text.len());
    text[start..].trim().to_owned()
}

/// Is `dir` a mount point (per /proc/self/mountinfo)?
fn is_mount_point(dir: &Path) -> bool {
    let want = dir.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .map(|s| {
            s.lines()
                .any(|l| l.split_whitespace().nth(4) == Some(want.as_ref()))
        })
        .unwrap_or(false)
}

fn unmount(mount_dir: &Path) -> Result<(), AttachError> {
    let fusermount = tool("fusermount3")?;
    let deadline = Instant::now() + UNMOUNT_TIMEOUT;
    loop {
        match run(Command::new(&fusermount).arg("-u").arg(mount_dir)) {
            Ok(_) => return Ok(()),
            // The loop device may release the file a moment after `losetup -d`.
            Err(error) if Instant::now() < deadline => {
                tracing::debug!(%error, "fusermount3 -u failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => return Err(error),
        }
    }
}

fn process_alive(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| cmdline.windows(7).any(|window| window == b"nbdfuse"))
        .unwrap_or(false)
        && !fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
}

fn wait_nbdfuse_exit(pid: u32, child: Option<Child>) -> Result<(), AttachError> {
    let deadline = Instant::now() + UNMOUNT_TIMEOUT;
    if let Some(mut child) = child {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => {
                    return Err(AttachError::Timeout(format!(
                        "nbdfuse (pid {pid}) did not exit after unmount"
                    )))
                }
                Err(error) => return Err(io_error("waiting for nbdfuse")(error)),
            }
        }
    }
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return Err(AttachError::Timeout(format!(
                "nbdfuse (pid {pid}) did not exit after unmount"
            )));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Exposes `export_name` of the NBD server at `uri` as a loop block device: runs `nbdfuse` to
/// mount the export as a FUSE file under `work_dir`, then `losetup -f --show --direct-io=on` on
/// that file, and records the attachment in `work_dir`. Needs root (losetup) and /dev/fuse.
pub fn attach(uri: &str, export_name: &str, work_dir: &Path) -> Result<Attached, AttachError> {
    check_attach_tools()?;
    let full_uri = export_uri(uri, export_name)?;
    if full_uri.contains(['\t', '\n', '\r']) {
        return Err(AttachError::Uri(full_uri, "contains a tab or newline"));
    }
    let work_dir = prepare_work_dir(work_dir)?;
    let nbdfuse = Nbdfuse::start(&full_uri, &work_dir)?.wait_serving(&full_uri)?;
    let fuse_file = nbdfuse.mount_dir.join("nbd");

    let _lock = lock_state(&work_dir)?;
    let loop_device = match loop_on(&fuse_file) {
        Ok(device) => device,
        Err(error) => {
            nbdfuse.clean_up();
            return Err(error);
        }
    };
    let record = AttachmentRecord {
        loop_device,
        mount_dir: nbdfuse.mount_dir.clone(),
        nbdfuse_pid: nbdfuse.pid,
        uri: full_uri,
    };
    if let Err(error) = add_record(&work_dir, &record) {
        if let Ok(losetup) = tool("losetup") {
            let _ = run(Command::new(losetup).arg("-d").arg(&record.loop_device));
        }
        nbdfuse.clean_up();
        return Err(error);
    }
    let _ = fs::remove_file(&nbdfuse.log_file);
    tracing::info!(device = %record.loop_device.display(), uri = %record.uri, "attached");
    Ok(Attached {
        record,
        work_dir,
        nbdfuse: Some(nbdfuse.child),
    })
}

/// An nbdfuse process started by [`attach`], and its files in the work directory.
struct Nbdfuse {
    child: Child,
    pid: u32,
    /// Where it mounts the export (as the file `nbd`).
    mount_dir: PathBuf,
    /// Written by nbdfuse once it serves.
    pid_file: PathBuf,
    /// Its stdout and stderr.
    log_file: PathBuf,
}

impl Nbdfuse {
    /// Makes a mount directory and a log file named after this process and the time under
    /// `work_dir`, and starts `nbdfuse` on `full_uri` there in its own process group.
    fn start(full_uri: &str, work_dir: &Path) -> Result<Nbdfuse, AttachError> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        let tag = format!("fuse-{}-{stamp}", std::process::id());
        let mount_dir = work_dir.join(&tag);
        let pid_file = work_dir.join(format!("{tag}.pid"));
        let log_file = work_dir.join(format!("{tag}.log"));
        fs::create_dir(&mount_dir)
            .map_err(io_error(format!("creating {}", mount_dir.display())))?;
        let log = File::create(&log_file)
            .map_err(io_error(format!("creating {}", log_file.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_error("duplicating the log file"))?;

        let child = Command::new(tool("nbdfuse")?)
            .arg("-P")
            .arg(&pid_file)
            .arg(&mount_dir)
            .arg(full_uri)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: a Ctrl-C meant for the caller must not kill the device.
            .process_group(0)
            .spawn()
            .map_err(io_error("starting nbdfuse"))?;
        let pid = child.id();
        Ok(Nbdfuse {
            child,
            pid,
            mount_dir,
            pid_file,
            log_file,
        })
    }

    /// Waits until nbdfuse reports it is serving (it writes its pid file), for at most
    /// [`MOUNT_TIMEOUT`].
    fn wait_serving(mut self, full_uri: &str) -> Result<Nbdfuse, AttachError> {
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if has_text(&self.pid_file) {
                return Ok(self);
            }
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let _ = fs::remove_dir(&self.mount_dir);
                    return Err(AttachError::Command {
                        command: format!("nbdfuse {} {full_uri}", self.mount_dir.display()),
                        status: status.to_string(),
                        stderr: log_tail(&self.log_file),
                    });
                }
                Ok(None) => {}
                Err(error) => return Err(io_error("waiting for nbdfuse")(error)),
            }
            if Instant::now() >= deadline {
                let log_file = self.log_file.clone();
                self.clean_up();
                return Err(AttachError::Timeout(format!(
                    "nbdfuse did not mount {full_uri} within {MOUNT_TIMEOUT:?}: {}",
                    log_tail(&log_file)
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Unmounts, waits for nbdfuse to exit, and removes the mount directory and pid file.
    fn clean_up(self) {
        let _ = unmount(&self.mount_dir);
        let _ = wait_nbdfuse_exit(self.pid, Some(self.child));
        let _ = fs::remove_dir(&self.mount_dir);
        let _ = fs::remove_file(&self.pid_file);
    }
}

/// Creates and resolves the directory attachments are recorded in. Its path goes into the
/// state file, whose lines are tab-separated.
fn prepare_work_dir(work_dir: &Path) -> Result<PathBuf, AttachError> {
    fs::create_dir_all(work_dir).map_err(io_error(format!("creating {}", work_dir.display())))?;
    let work_dir = work_dir
        .canonicalize()
        .map_err(io_error(format!("resolving {}", work_dir.display())))?;
    if work_dir.to_string_lossy().contains(['\t', '\n', '\r']) {
        return Err(AttachError::State {
            path: work_dir,
            problem: "work directory path contains a tab or newline".into(),
        });
    }
    Ok(work_dir)
}

/// A free loop device with direct I/O on `file` (`losetup -f --show --direct-io=on`).
fn loop_on(file: &Path) -> Result<PathBuf, AttachError> {
    match run(Command::new(tool("losetup")?)
        .args(["-f", "--show", "--direct-io=on"])
        .arg(file))?
    {
        device if device.starts_with("/dev/") => Ok(PathBuf::from(device)),
        other => Err(AttachError::Command {
            command: "losetup -f --show".into(),
            status: "unexpected output".into(),
            stderr: other,
        }),
    }
}

/// Adds `record` to the attachments recorded in `work_dir` (replacing one for the same loop
/// device). The caller holds the state lock.
fn add_record(work_dir: &Path, record: &AttachmentRecord) -> Result<(), AttachError> {
    let mut records = read_records(work_dir)?;
    records.retain(|other| other.loop_device != record.loop_device);
    records.push(record.clone());
    write_records(work_dir, &records)
}

/// Puts a loop device with direct I/O on an existing file (a volume's file in the FUSE mount of
/// `lograid serve --fuse DIR`) and records it in `work_dir`. Refuses a file some loop device
/// already uses.
pub fn attach_file(file: &Path, work_dir: &Path) -> Result<Attached, AttachError> {
    let losetup = tool("losetup")?;
    let file = file
        .canonicalize()
        .map_err(io_error(format!("resolving {}", file.display())))?;
    let metadata = fs::metadata(&file).map_err(io_error(format!("reading {}", file.display())))?;
    if !metadata.is_file() {
        return Err(AttachError::Io {
            what: format!("{}", file.display()),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        });
    }
    let text = file.to_string_lossy().into_owned();
    if text.contains(['\t', '\n', '\r']) {
        return Err(AttachError::Uri(text, "contains a tab or newline"));
    }
    let work_dir = prepare_work_dir(work_dir)?;
    let _lock = lock_state(&work_dir)?;
    let users = run(Command::new(&losetup).arg("-j").arg(&file))?;
    if let Some(user) = users.lines().next().and_then(|l| l.split(':').next()) {
        return Err(AttachError::Command {
            command: format!("losetup -j {}", file.display()),
            status: "already attached".into(),
            stderr: format!("{} is already attached as {user}", file.display()),
        });
    }
    let loop_device = loop_on(&file)?;
    let record = AttachmentRecord {
        loop_device,
        mount_dir: file.parent().map(Path::to_owned).unwrap_or_default(),
        nbdfuse_pid: 0,
        uri: text,
    };
    if let Err(error) = add_record(&work_dir, &record) {
        let _ = run(Command::new(&losetup).arg("-d").arg(&record.loop_device));
        return Err(error);
    }
    tracing::info!(device = %record.loop_device.display(), file = %record.uri, "attached");
    Ok(Attached {
        record,
        work_dir,
        nbdfuse: None,
    })
}

/// Undoes an attachment recorded in `work_dir` (possibly made by another process):
/// `losetup -d`, `fusermount3 -u`, then waits for nbdfuse to exit and forgets the record.
pub fn detach(work_dir: &Path, loop_device: &Path) -> Result<(), AttachError> {
    detach_record(work_dir, loop_device, None)
}

fn detach_record(
    work_dir: &Path,
    loop_device: &Path,
    child: Option<Child>,
) -> Result<(), AttachError> {
    let _lock = lock_state(work_dir)?;
    let mut records = read_records(work_dir)?;
    let Some(index) = records
        .iter()
        .position(|record| record.loop_device == loop_device)
    else {
        return Err(AttachError::NotAttached(loop_device.to_owned()));
    };
    let record = records[index].clone();
    // The loop device may already be gone (e.g. after a reboot of the stack); carry on then.
    if let Err(error) = run(Command::new(tool("losetup")?)
        .arg("-d")
        .arg(&record.loop_device))
    {
        let still_bound = run(Command::new(tool("losetup")?)
            .arg("-n")
            .arg("-O")
            .arg("BACK-FILE")
            .arg(&record.loop_device))
        .map(|backing| backing.contains(record.mount_dir.to_string_lossy().as_ref()))
        .unwrap_or(false);
        if still_bound {
            return Err(error);
        }
        tracing::warn!(%error, "losetup -d failed; the loop device no longer uses our file");
    }
    if !record.owns_mount() {
        // The file's mount belongs to the server that serves it.
    } else if process_alive(record.nbdfuse_pid) || child.is_some() {
        unmount(&record.mount_dir)?;
        wait_nbdfuse_exit(record.nbdfuse_pid, child)?;
    } else if is_mount_point(&record.mount_dir) {
        // nbdfuse died (its server went away) and left its FUSE mount behind.
        unmount(&record.mount_dir)?;
    }
    if record.owns_mount() {
        let _ = fs::remove_dir(&record.mount_dir);
        if let Some(name) = record.mount_dir.file_name() {
            let _ = fs::remove_file(work_dir.join(format!("{}.pid", name.to_string_lossy())));
        }
    }
    records.remove(index);
    write_records(work_dir, &records)?;
    tracing::info!(device = %loop_device.display(), "detached");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_building() {
        assert_eq!(
            export_uri("nbd://127.0.0.1:10809", "disk").unwrap(),
            "nbd://127.0.0.1:10809/disk"
        );
        assert_eq!(
            export_uri("nbd://127.0.0.1:10809/", "a b").unwrap(),
            "nbd://127.0.0.1:10809/a%20b"
        );
        assert_eq!(
            export_uri("nbd+unix:///?socket=/run/x.sock", "vol1").unwrap(),
            "nbd+unix:///vol1?socket=/run/x.sock"
        );
        assert_eq!(export_uri("nbd://h/disk", "").unwrap(), "nbd://h/disk");
        assert_eq!(export_uri("nbd://h/disk", "disk").unwrap(), "nbd://h/disk");
        assert!(export_uri("nbd://h/disk", "other").is_err());
        assert!(export_uri("http://h/", "x").is_err());
        assert!(export_uri("nbd-h", "x").is_err());
    }

    #[test]
    fn state_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("lograid-nbd-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let record = AttachmentRecord {
            loop_device: "/dev/loop7".into(),
            mount_dir: dir.join("fuse-1"),
            nbdfuse_pid: 1234,
            uri: "nbd://127.0.0.1:1/disk".into(),
        };
        write_records(&dir, std::slice::from_ref(&record)).unwrap();
        assert_eq!(list_attachments(&dir).unwrap(), vec![record]);
        assert!(matches!(
            detach(&dir, Path::new("/dev/loop99")),
            Err(AttachError::NotAttached(_)) | Err(AttachError::MissingTool { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
