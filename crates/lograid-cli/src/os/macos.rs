//! macOS's side of the command's system-specific parts (see `mod.rs`): no FUSE files, no loop
//! devices, no abstract sockets; each says so.

use anyhow::{bail, Result};
use lograid_nbd::Export;
use std::io;
use std::os::unix::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// No FUSE mount can be made here, so none exists.
pub enum FilesMount {}

impl FilesMount {
    /// The directory the volumes' files are in.
    pub fn dir(&self) -> &Path {
        match *self {}
    }
}

pub fn mount_files(_dir: &Path, _exports: Vec<Arc<dyn Export>>) -> Result<FilesMount> {
    bail!(
        "--fuse: FUSE files are Linux-only; on macOS, serve the volumes over NFS instead \
         (`lograid serve --nfs`, see docs/MACOS.md)"
    )
}

pub fn unmount_files(mount: FilesMount) {
    match mount {}
}

pub fn attach_supported() -> Result<()> {
    bail!(
        "FUSE and loop-device attach is Linux-only; on macOS, serve the volumes over NFS instead \
         (`lograid serve --nfs`, see docs/MACOS.md)"
    )
}

pub fn is_fuse_mount_point(_dir: &Path) -> bool {
    false
}

pub fn abstract_socket(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix sockets (@name) are Linux-only",
    ))
}

pub fn run_on_first_cpus(_n: usize) -> Result<()> {
    bail!("macOS has no CPU affinity to set (thread affinity tags are only hints)")
}
