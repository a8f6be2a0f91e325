//! The kernel calls that end a mount: the unmount of a directory, the `fusectl` abort of a
//! connection, and the lazy detach of a pinned mount.
//!
//! Owns: the `fusectl` abort (mounting `fusectl` first if nothing has), umount2 and the
//! `fusermount3` fallbacks for a process that may not unmount (not root). Must never: decide
//! whose mount or connection it is given (callers prove it ours first, see `connection`), or
//! unmount anything but the directory or the pinned mount it is given.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::device::c_path;
use crate::error::UnmountError;
use crate::mount_point::is_mount_point;

/// Where the kernel lists FUSE connections (the `fusectl` filesystem).
pub(crate) const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// Aborts FUSE connection `number`: every request waiting on it, and every later one, fails at
/// once (as when its server dies). Mounts `fusectl` on [`CONNECTIONS`] first if nothing has.
pub(crate) fn abort_connection(number: u32) -> Result<(), UnmountError> {
    let abort = Path::new(CONNECTIONS)
        .join(number.to_string())
        .join("abort");
    if !abort.exists() && !is_mount_point(Path::new(CONNECTIONS)) {
        // SAFETY: mount(2) with NUL-terminated constant strings and no data.
        let rc = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(UnmountError::MountFusectl(io::Error::last_os_error()));
        }
    }
    fs::write(&abort, b"1").map_err(|source| UnmountError::WriteAbort {
        path: abort.clone(),
        source,
    })
}

/// Unmounts the mount on `dir` (fails while it is in use, e.g. by a loop device).
pub(crate) fn unmount(dir: &Path) -> Result<(), UnmountError> {
    let c_dir = c_path(dir).map_err(|_| UnmountError::NulInPath)?;
    // SAFETY: umount2 on a NUL-terminated path we own.
    if unsafe { libc::umount2(c_dir.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EPERM) {
        return fusermount(dir, "-u");
    }
    Err(UnmountError::Unmount(error))
}

/// Detaches the mount `pin` holds (an `O_PATH` descriptor of its root) lazily: it leaves its
/// directory `dir` now, and ends once its last user lets go. Through `/proc/self/fd/PIN`, which
/// names that very mount whatever is on `dir` meanwhile; where umount2 is not allowed (not
/// root), `fusermount3 -uz dir`, which names the directory's mount.
pub(crate) fn detach_pinned(pin: BorrowedFd<'_>, dir: &Path) -> Result<(), UnmountError> {
    let c_pinned = c_path(Path::new(&format!("/proc/self/fd/{}", pin.as_raw_fd())))
        .map_err(|_| UnmountError::NulInPath)?;
    // SAFETY: umount2 on a NUL-terminated path we own.
    if unsafe { libc::umount2(c_pinned.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EPERM) {
        return fusermount(dir, "-uz");
    }
    Err(UnmountError::Unmount(error))
}

/// `fusermount3 FLAGS dir`: the setuid helper's unmount, for when umount2 is not allowed.
fn fusermount(dir: &Path, flags: &str) -> Result<(), UnmountError> {
    let output = Command::new("fusermount3")
        .arg(flags)
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(UnmountError::RunFusermount)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(UnmountError::Fusermount {
            flags: flags.to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
