//! The errors of mounting and unmounting.
//!
//! Owns: [`FuseError`], the error the crate's callers see; [`MountPointTaken`], the source of
//! [`FuseError::Mount`] when the directory is already a mount point; and [`UnmountError`], why a
//! step of ending a mount failed (logged, or carried as the detail of [`FuseError::Unmount`]).
//! Must never: change [`FuseError`]'s variants or their fields (callers match on them), or drop
//! the underlying error's text from a message.

use std::io;
use std::path::{Path, PathBuf};

use crate::detach::CONNECTIONS;

/// Errors of mounting and unmounting.
#[derive(Debug)]
pub enum FuseError {
    NoFuse,
    Mount { dir: PathBuf, source: io::Error },
    Unmount { dir: PathBuf, detail: String },
}

impl std::fmt::Display for FuseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FuseError::NoFuse => write!(
                f,
                "/dev/fuse is missing: the kernel has no FUSE support (or it is not available in this container)"
            ),
            FuseError::Mount { dir, source } => {
                write!(f, "mounting the volumes' FUSE files on {}: {source}", dir.display())
            }
            FuseError::Unmount { dir, detail } => {
                write!(f, "unmounting the FUSE files on {}: {detail}", dir.display())
            }
        }
    }
}

impl std::error::Error for FuseError {}

impl FuseError {
    /// Unmounting the mount on `dir` failed because of `error`.
    pub(crate) fn unmount(dir: &Path, error: UnmountError) -> Self {
        FuseError::Unmount {
            dir: dir.to_owned(),
            detail: error.to_string(),
        }
    }
}

/// Why a step of ending a mount failed.
#[derive(Debug)]
pub(crate) enum UnmountError {
    /// umount2 failed (EBUSY while a file is in use, e.g. by a loop device).
    Unmount(io::Error),
    /// The mount on the directory is not ours (ours left it, or something is mounted over it).
    NotOnItsDirectory,
    /// Our mount could not be identified when it was made (see `connection`).
    ConnectionUnknown,
    /// Our connection already ended (aborted, or its mount torn down) before we ended it.
    ConnectionEnded,
    /// The directory could not be opened or its device number read, to check whose mount it is.
    Pin(io::Error),
    /// `fusectl` could not be mounted on [`CONNECTIONS`].
    MountFusectl(io::Error),
    /// Writing the connection's `abort` file failed.
    WriteAbort { path: PathBuf, source: io::Error },
    /// The directory's path cannot be passed to umount2.
    NulInPath,
    /// `fusermount3` could not be run.
    RunFusermount(io::Error),
    /// `fusermount3` failed; its flags and what it wrote to stderr.
    Fusermount { flags: String, stderr: String },
    /// fuser's session ended with an error.
    Session(io::Error),
    /// The thread running fuser's session panicked.
    SessionPanicked,
}

impl std::fmt::Display for UnmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmountError::Unmount(e) | UnmountError::Session(e) => write!(f, "{e}"),
            UnmountError::NotOnItsDirectory => {
                write!(f, "the mount on the directory is not this server's")
            }
            UnmountError::ConnectionUnknown => {
                write!(f, "the mount's connection number is unknown")
            }
            UnmountError::ConnectionEnded => write!(f, "the mount's connection already ended"),
            UnmountError::Pin(e) => write!(f, "checking whose mount is on the directory: {e}"),
            UnmountError::MountFusectl(e) => write!(f, "mounting fusectl on {CONNECTIONS}: {e}"),
            UnmountError::WriteAbort { path, source } => {
                write!(f, "writing {}: {source}", path.display())
            }
            UnmountError::NulInPath => write!(f, "the path contains a NUL byte"),
            UnmountError::RunFusermount(e) => write!(f, "running fusermount3: {e}"),
            UnmountError::Fusermount { flags, stderr } => {
                write!(f, "fusermount3 {flags}: {stderr}")
            }
            UnmountError::SessionPanicked => write!(f, "the FUSE session thread panicked"),
        }
    }
}

impl std::error::Error for UnmountError {}

/// The directory is already a mount point, other than a dead lograid server's.
#[derive(Debug)]
pub(crate) struct MountPointTaken {
    /// The type of the mount there, as mountinfo lists it.
    pub(crate) fstype: String,
    /// Whether it is a lograid mount (then its server is alive, or not answering).
    pub(crate) lograid: bool,
}

impl std::fmt::Display for MountPointTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the directory is already a mount point ({}{}); give an empty directory",
            self.fstype,
            if self.lograid {
                ", served by a running lograid"
            } else {
                ""
            }
        )
    }
}

impl std::error::Error for MountPointTaken {}
