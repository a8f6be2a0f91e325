//! Ending a mount the clean unmount could not end: aborting its FUSE connection and detaching it
//! lazily.
//!
//! Owns: the `fusectl` abort of a connection (mounting `fusectl` first if nothing has) and the
//! lazy unmount (umount2 with MNT_DETACH, else `fusermount3 -uz`). Must never: decide whose mount
//! or connection it is given (callers check that the mount on the directory is ours and still
//! holds that connection number), or unmount anything but the directory it is given.

use std::fs;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

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

/// Detaches the mount on `dir` lazily: it leaves the directory now, and ends once its last user
/// lets go.
pub(crate) fn lazy_unmount(dir: &Path) -> Result<(), UnmountError> {
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| UnmountError::NulInPath)?;
    // SAFETY: umount2 on a NUL-terminated path we own.
    if unsafe { libc::umount2(c_dir.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    fusermount_lazily(dir)
}

/// `fusermount3 -uz dir`: the lazy unmount of a FUSE mount by the setuid helper, for when
/// umount2 is not allowed (not running as root).
fn fusermount_lazily(dir: &Path) -> Result<(), UnmountError> {
    let output = Command::new("fusermount3")
        .arg("-uz")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(UnmountError::RunFusermount)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(UnmountError::Fusermount {
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
