//! Which FUSE connection is ours, proved each time before it is aborted or its mount unmounted.
//!
//! The kernel names a FUSE connection (in `/sys/fs/fuse/connections/N`) after the device number
//! of the mount made with it, and hands out the lowest free number: once a mount is gone, the
//! next FUSE mount anywhere on the machine (another server's, someone's sshfs) very likely gets
//! the same number, and may sit on the same directory. A number, a directory and a name read from
//! mountinfo therefore never prove that a connection is ours.
//!
//! What does: (1) at mount time, the number is taken from the directory's mount only after a
//! lookup of a name made up for this mount, sent through that mount, reached our own filesystem
//! (so that mount is served by our /dev/fuse descriptor); (2) each time after, the directory is
//! opened (`O_PATH`: a pin, which keeps the mount it names and its number alive while open), and
//! it is ours only if the pinned mount has our number while our own /dev/fuse descriptor still
//! reports the connection live (not `POLLERR`). A live connection means our mount has not been
//! torn down, and the kernel frees a mount's number only after tearing it down; two live mounts
//! never share a number; so the pinned mount is ours, and stays ours until the pin is closed.
//! The abort (`fusectl`) and the lazy detach (through `/proc/self/fd/PIN`, not the directory's
//! path) are done while the pin is held. The clean unmount is the one step that names the
//! directory (an unmount fails while anything holds the mount, a pin included): it runs right
//! after the proof, with the pin let go of, and if our connection does not end with it, the mount
//! is taken as busy. Without root, `fusermount3` names the directory too (for the lazy detach as
//! well); the proof just before is all that guards it.
//!
//! Owns: [`Connection`] (a duplicate of our /dev/fuse descriptor and our mount's number),
//! [`Probe`] (the made-up name our filesystem watches for), [`Pinned`], and the pinned detach of
//! a dead server's mount ([`detach_dead`]). Must never: abort a connection not proved ours as
//! above, detach a mount other than ours so proved or a dead lograid mount checked through its
//! pin, or block without bound on a mount that is not ours (the identifying lookup waits at
//! most [`PROBE_TIMEOUT`]).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::detach::{abort_connection, detach_pinned};
use crate::device::c_path;
use crate::error::UnmountError;
use crate::mount_point::is_dead;

/// How long the lookup that identifies our mount may take (one that another server does not
/// answer means the directory's mount is not ours).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A device number as the kernel splits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevNumber {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

impl DevNumber {
    /// The connection's name under `/sys/fs/fuse/connections`: the kernel's own encoding of the
    /// device number (major in the bits above the 20 of the minor).
    pub(crate) fn connection_name(self) -> u32 {
        (self.major << 20) | (self.minor & 0xf_ffff)
    }
}

/// A name our filesystem watches lookups for: a lookup of it that reaches us went through a mount
/// served by our descriptor.
pub(crate) struct Probe {
    name: OsString,
    seen: AtomicBool,
}

impl Probe {
    /// A name no one else uses (hidden, with the process, a counter and the time in it).
    pub(crate) fn new() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Probe {
            name: format!(
                ".lograid-connection-probe-{}-{}-{nanos}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            )
            .into(),
            seen: AtomicBool::new(false),
        }
    }

    /// Called by the filesystem for each lookup: whether `name` is the probe (answered "no such
    /// file"); notes that it came.
    pub(crate) fn is_probe(&self, name: &OsStr) -> bool {
        let hit = name == self.name;
        if hit {
            self.seen.store(true, Ordering::SeqCst);
        }
        hit
    }
}

/// Our connection: how to tell it is live, and our mount's number once proved.
pub(crate) struct Connection {
    /// A duplicate of the /dev/fuse descriptor the mount was made with (the connection lives at
    /// least as long as it is open, and reports `POLLERR` once ended).
    device: OwnedFd,
    /// Our mount's device number (= the connection's), `None` if it could not be proved.
    number: Option<DevNumber>,
}

impl Connection {
    /// Identifies our mount on `dir`, whose filesystem (watching `probe`) is being served through
    /// `device` (a duplicate of the descriptor). The number stays unknown (and nothing is ever
    /// aborted or unmounted for this mount) if the lookup does not reach us.
    pub(crate) fn identify(device: OwnedFd, dir: &Path, probe: &Probe) -> Self {
        let mut connection = Connection {
            device,
            number: None,
        };
        let found = pin(dir).and_then(|pin| {
            let number = device_number(pin.as_fd())?;
            look_up_through(pin, &probe.name)?;
            Ok(number)
        });
        match found {
            Ok(number) if probe.seen.load(Ordering::SeqCst) && connection.is_live() => {
                connection.number = Some(number);
            }
            Ok(_) => {
                tracing::warn!(dir = %dir.display(), "the mount on the directory did not answer as ours; its connection will not be aborted, nor the directory unmounted by this server")
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "identifying our FUSE connection: {e}; it will not be aborted, nor the directory unmounted by this server")
            }
        }
        connection
    }

    /// Whether our connection is live: not aborted, its mount not torn down.
    pub(crate) fn is_live(&self) -> bool {
        poll_error(&self.device, 0).is_ok_and(|error| !error)
    }

    /// Waits at most `timeout` for our connection to end (as it does when its mount is torn
    /// down); whether it did.
    pub(crate) fn wait_ended(&self, timeout: Duration) -> bool {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        poll_error(&self.device, ms).unwrap_or(false)
    }

    /// Pins the mount on `dir` if it is ours (see the module comment): holding the result keeps
    /// it ours. [`UnmountError::ConnectionEnded`] if our connection already ended (then the
    /// directory's mount, whatever it is, is not ours to touch).
    pub(crate) fn pin<'a>(&self, dir: &'a Path) -> Result<Pinned<'a>, UnmountError> {
        let number = self.number.ok_or(UnmountError::ConnectionUnknown)?;
        let pinned = pin(dir).map_err(UnmountError::Pin)?;
        let found = device_number(pinned.as_fd()).map_err(UnmountError::Pin)?;
        // After pinning: live now means our mount, with our number, existed while the pin did.
        if !self.is_live() {
            return Err(UnmountError::ConnectionEnded);
        }
        if found != number {
            return Err(UnmountError::NotOnItsDirectory);
        }
        Ok(Pinned {
            fd: pinned,
            number,
            dir,
        })
    }
}

/// Our mount, pinned (see [`Connection::pin`]).
pub(crate) struct Pinned<'a> {
    fd: OwnedFd,
    number: DevNumber,
    dir: &'a Path,
}

impl Pinned<'_> {
    /// Aborts our connection (every request waiting on it, and every later one, fails at once).
    pub(crate) fn abort(&self) -> Result<(), UnmountError> {
        abort_connection(self.number.connection_name())
    }

    /// Detaches our mount lazily (it leaves the directory now and ends once its last user lets
    /// go), then lets go of the pin.
    pub(crate) fn detach(self) -> Result<(), UnmountError> {
        detach_pinned(self.fd.as_fd(), self.dir)
    }
}

/// Detaches lazily the dead lograid mount on `dir`, which mountinfo lists with device number
/// `dev`: pinned, checked to be that mount and still dead (its server gone, so its connection
/// has ended and no one's requests are served through it), and detached through the pin.
pub(crate) fn detach_dead(dir: &Path, dev: DevNumber) -> Result<(), UnmountError> {
    let pinned = pin(dir).map_err(UnmountError::Pin)?;
    if device_number(pinned.as_fd()).map_err(UnmountError::Pin)? != dev {
        return Err(UnmountError::NotOnItsDirectory);
    }
    let through_pin = PathBuf::from(format!("/proc/self/fd/{}", pinned.as_raw_fd()));
    if !is_dead(&through_pin) {
        return Err(UnmountError::NotOnItsDirectory);
    }
    detach_pinned(pinned.as_fd(), dir)
}

/// `dir` opened with `O_PATH` (no request to any filesystem), not following a symlink.
fn pin(dir: &Path) -> io::Result<OwnedFd> {
    let c_dir = c_path(dir)?;
    // SAFETY: open(2) of a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c_dir.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The device number of the filesystem `fd` is on, from the kernel's own record (no request to
/// the filesystem's server: `AT_STATX_DONT_SYNC`, no fields asked).
fn device_number(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<DevNumber> {
    // SAFETY: an all-zero statx is a valid buffer for statx(2) to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx on a descriptor we hold, an empty NUL-terminated path and a live buffer.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            0,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(DevNumber {
        major: stx.stx_dev_major,
        minor: stx.stx_dev_minor,
    })
}

/// Looks `name` up in the directory `pin` names (it does not exist: "no such file" is the
/// answer), waiting at most [`PROBE_TIMEOUT`] for the mount's server.
fn look_up_through(pin: OwnedFd, name: &OsStr) -> io::Result<()> {
    let c_name = c_path(&PathBuf::from(name))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("lograid-fuse-identify".into())
        .spawn(move || {
            // SAFETY: an all-zero stat is a valid buffer for fstatat to fill.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstatat on a descriptor this thread owns, with a NUL-terminated name.
            let rc = unsafe {
                libc::fstatat(
                    pin.as_raw_fd(),
                    c_name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            let error = io::Error::last_os_error();
            // Let go of the mount before answering: a pin left open would make the mount busy.
            drop(pin);
            let _ = tx.send((rc, error));
        })?;
    match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok((rc, error)) if rc != 0 && error.raw_os_error() != Some(libc::ENOENT) => Err(error),
        Ok(_) => Ok(()),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {PROBE_TIMEOUT:?} from the directory's mount"),
        )),
    }
}

/// Whether `device` reports `POLLERR` (its connection ended), waiting at most `timeout_ms`.
fn poll_error(device: &OwnedFd, timeout_ms: i32) -> io::Result<bool> {
    let mut fds = libc::pollfd {
        fd: device.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    loop {
        // SAFETY: poll on one pollfd that lives across the call.
        let n = unsafe { libc::poll(&mut fds, 1, timeout_ms) };
        if n >= 0 {
            return Ok(n > 0 && fds.revents & (libc::POLLERR | libc::POLLHUP) != 0);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}
