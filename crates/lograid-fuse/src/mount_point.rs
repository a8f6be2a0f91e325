//! What is mounted on a directory: the directory's resolved path, the mount
//! /proc/self/mountinfo lists there, whether that mount is one this crate makes, and whether its
//! server is dead.
//!
//! Owns: resolving a mount directory (also when it is a dead mount point, where every access
//! fails), parsing mountinfo (paths compared as bytes, with its octal escapes), the probe of a
//! lograid mount's server, and the public [`is_mount_point`] and [`connection_of`]. Nothing here
//! says whose a mount is beyond its type and name (see `connection`). Must never: create, mount
//! or unmount anything, or block longer than [`PROBE_TIMEOUT`] on a mount whose server does not
//! answer.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::connection::DevNumber;

/// How long the check of an existing lograid mount at the directory may take: a live but wedged
/// server's mount is not answering, and counts as live.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The filesystem type our mounts show in /proc/self/mountinfo when made by fusermount3.
const FSTYPE: &str = "fuse.lograid";

/// How many symlinks [`resolve`] follows in the last part of a path before giving up (ELOOP),
/// as the kernel does.
const MAX_SYMLINKS: usize = 40;

/// Whether the lograid mount on `dir` is dead (its server gone: "Transport endpoint is not
/// connected"). Opening the directory asks the server (attributes may come from the kernel's
/// cache); a server that does not answer within [`PROBE_TIMEOUT`] counts as alive. `dir` may
/// be `/proc/self/fd/PIN` for a pinned mount.
pub(crate) fn is_dead(dir: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = dir.to_owned();
    let spawned = std::thread::Builder::new()
        .name("lograid-fuse-probe".into())
        .spawn(move || {
            let dead =
                matches!(fs::read_dir(&probe), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
            let _ = tx.send(dead);
        });
    spawned.is_ok() && rx.recv_timeout(PROBE_TIMEOUT).unwrap_or(false)
}

/// `dir` made absolute with symlinks and `..` resolved. When `dir` cannot be resolved whole
/// (it does not exist yet, or it is a dead mount point, where every access fails), its parent is
/// resolved and a symlink in its last part followed with `readlink` (which does not enter it).
/// Creates nothing, and sends no request to a mount on `dir` (a trailing slash would make
/// realpath(3) check that the mount's root is a directory, asking its server).
pub(crate) fn resolve(dir: &Path) -> io::Result<PathBuf> {
    let mut path: PathBuf = std::path::absolute(dir)?.components().collect();
    match path.canonicalize() {
        Ok(resolved) => return Ok(resolved),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ENOENT)) => {}
        Err(e) => return Err(e),
    }
    for _ in 0..MAX_SYMLINKS {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(path);
        };
        let parent = parent.canonicalize().unwrap_or_else(|_| parent.to_owned());
        let joined = parent.join(name);
        match fs::read_link(&joined) {
            Ok(target) => path = parent.join(target),
            Err(_) => return Ok(joined),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// A mount as /proc/self/mountinfo lists it.
pub(crate) struct MountEntry {
    pub(crate) fstype: String,
    source: String,
    /// The mount's device number (for FUSE, the connection's number, which says nothing of
    /// whose it is: see `connection`).
    pub(crate) dev: DevNumber,
}

impl MountEntry {
    /// Whether this is a mount this crate makes: FUSE, named "lograid" (the type shows as
    /// `fuse` when mounted directly by root, `fuse.lograid` through fusermount3).
    pub(crate) fn is_ours(&self) -> bool {
        (self.fstype == "fuse" || self.fstype == FSTYPE) && self.source == "lograid"
    }
}

/// The mount on `dir` (an absolute, resolved path), the last one listed if several are stacked.
/// Compared as bytes: paths need not be UTF-8.
pub(crate) fn mount_at(dir: &Path) -> Option<MountEntry> {
    let want = escape_mount_path(dir.as_os_str().as_bytes());
    let info = fs::read("/proc/self/mountinfo").ok()?;
    info.split(|&b| b == b'\n')
        .rev()
        .find_map(|line| parse_mount_line(line, &want))
}

/// The entry of one mountinfo line if its mount point (the fifth field) is `want`, escaped as
/// mountinfo writes it. The fields after the "-" separator are the type and the source.
fn parse_mount_line(line: &[u8], want: &[u8]) -> Option<MountEntry> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if fields.get(4) != Some(&want) {
        return None;
    }
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    let device = text(fields.get(2)?);
    let (major, minor) = device.split_once(':')?;
    let dev = DevNumber {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    };
    let dash = fields.iter().position(|f| *f == b"-")?;
    Some(MountEntry {
        fstype: text(fields.get(dash + 1)?),
        source: text(fields.get(dash + 2)?),
        dev,
    })
}

/// How /proc/self/mountinfo writes a path: space, tab, newline and backslash as octal escapes.
fn escape_mount_path(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for &b in path {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

/// The FUSE connection number of the lograid mount on `dir`, if there is one, as mountinfo
/// lists it (the name of its directory under /sys/fs/fuse/connections). A lograid mount's, not
/// necessarily this process's.
pub fn connection_of(dir: &Path) -> Option<u32> {
    mount_at(&resolve(dir).ok()?)
        .filter(MountEntry::is_ours)
        .map(|m| m.dev.connection_name())
}

/// Whether `dir` is a mount point (of any filesystem).
pub fn is_mount_point(dir: &Path) -> bool {
    resolve(dir).ok().and_then(|d| mount_at(&d)).is_some()
}
