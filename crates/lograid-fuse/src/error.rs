//! The errors of mounting and unmounting.
//!
//! Owns: [`FuseError`], the error the crate's callers see. Must never: change its variants or
//! their fields (callers match on them), or drop the underlying error's text from its message.

use std::io;
use std::path::PathBuf;

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
