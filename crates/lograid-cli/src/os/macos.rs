//! macOS's side of the command's system-specific parts (see `mod.rs`): no FUSE files, no loop
//! devices, no abstract sockets, each saying so; a volume's file from an NFS mount attached as
//! a disk image (`mount_nfs`, `hdiutil`: their command lines and output in `macos_tools.rs`).

use super::macos_tools as tools;
use anyhow::{bail, Result};
use lograid_nbd::Export;
use std::io;
use std::net::SocketAddr;
use std::os::unix::net::SocketAddr as UnixSocketAddr;
use std::path::{Path, PathBuf};
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
        "attaching an NBD export or a FUSE file is Linux-only (nbdfuse, loop devices); on macOS, \
         serve the volumes with `lograid serve --nfs PORT` and attach one with \
         `lograid attach --nfs PORT --export VOLUME` (docs/MACOS.md)"
    )
}

pub const RUN_DIR: &str = "/var/run/lograid";

pub fn mount_nfs(server: SocketAddr, dir: &Path, extra: Option<&str>) -> Result<()> {
    tools::mount_nfs(server, dir, extra).run().map(drop)
}

pub fn unmount(dir: &Path) -> Result<()> {
    tools::umount(dir).run().map(drop)
}

/// The file as a disk (`hdiutil attach`), its filesystems mounted if `mount_volumes`.
pub fn attach_image(file: &Path, mount_volumes: bool) -> Result<PathBuf> {
    tools::attached_disk(&tools::hdiutil_attach(file, mount_volumes).run()?)
}

/// The image file behind disk `device` (`hdiutil info`), or None if no image has that disk.
pub fn image_backing(device: &Path) -> Result<Option<PathBuf>> {
    tools::image_of_device(&tools::hdiutil_info().run()?, device)
}

pub fn detach_image(device: &Path) -> Result<()> {
    tools::hdiutil_detach(device).run().map(drop)
}

pub fn format_hint(device: &Path) -> String {
    format!(
        "make an APFS volume on it (erases it): `diskutil eraseDisk APFS NAME GPT {}`",
        device.display()
    )
}

pub fn is_fuse_mount_point(_dir: &Path) -> bool {
    false
}

pub fn abstract_socket(_name: &[u8]) -> io::Result<UnixSocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract Unix sockets (@name) are Linux-only",
    ))
}

/// Nothing to set: macOS's allocator returns large blocks to the system by itself.
pub fn pin_allocator_thresholds() {}

/// Steal time: macOS does not report it.
pub fn stolen_seconds() -> Option<(f64, usize)> {
    None
}

pub fn run_on_first_cpus(_n: usize) -> Result<()> {
    bail!("macOS has no CPU affinity to set (thread affinity tags are only hints)")
}
