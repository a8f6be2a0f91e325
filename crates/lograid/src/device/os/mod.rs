//! The system calls behind `FileMember` that differ between Linux and macOS,
//! one function per call, with the same names and meanings on both sides
//! (`linux.rs`, `macos.rs`). What to call when, and how to read the answers
//! (which file types are members, what a disk's geometry means, which errors
//! refuse a drive or are harmless, which mounts sit on a disk), is decided
//! in `file.rs`, shared by both systems and tested on Linux.
//!
//! | call | Linux | macOS |
//! | --- | --- | --- |
//! | `open` | O_DIRECT (buffered where refused); O_EXCL on a block device opened for writing | F_NOCACHE after opening; O_EXLOCK (O_SHLOCK read-only) on a disk: exclusive use of the disk, refused while mounted or held |
//! | `read_wait` | tmpfs (fstatfs): never waits; no O_DIRECT: waits unless cached; else always | always (F_NOCACHE) |
//! | `read_cached` | preadv2(RWF_NOWAIT): the read only if the page cache holds it | never called |
//! | `disk_geometry` | BLKSSZGET, BLKGETSIZE64 | DKIOCGETBLOCKSIZE, DKIOCGETBLOCKCOUNT |
//! | `disk_read_only` | BLKROGET | DKIOCISWRITABLE |
//! | `flush` | fdatasync (also flushes the drive's cache) | F_FULLFSYNC on a file; DKIOCSYNCHRONIZE on a raw disk; fsync and DKIOCSYNCHRONIZE on a buffered disk |
//! | `punch_hole` | fallocate(PUNCH_HOLE, KEEP_SIZE) | F_PUNCHHOLE |
//! | `discard_disk` | BLKDISCARD | DKIOCUNMAP |
//! | `mounts` | /proc/self/mountinfo | getfsstat, and stat of each mount's source |
//!
//! Must never: decide policy (refuse a drive, ignore an error); that is
//! `file.rs`'s. Must never be reached on other systems: the build stops.

use std::path::PathBuf;

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod sys;
#[cfg(target_os = "macos")]
#[path = "macos.rs"]
mod sys;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!("lograid's members are implemented for Linux and macOS only");

pub(crate) use sys::{
    discard_disk, disk_geometry, disk_read_only, flush, mounts, open, punch_hole, read_cached,
    read_wait, CHARACTER_DEVICES_ARE_DISKS, NO_MEDIUM,
};

/// What a member is, as far as the calls made on it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file.
    File,
    /// A block device, through the system's buffer cache unless caching is
    /// turned off (Linux /dev/sdX, /dev/nvmeXnY, /dev/loopN; macOS /dev/diskN).
    BlockDevice,
    /// A character device that is a disk, with no buffer cache in between
    /// (macOS /dev/rdiskN).
    RawDisk,
}

impl Kind {
    pub(crate) fn is_disk(self) -> bool {
        self != Kind::File
    }
}

/// Whether a read of a member can wait for a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// macOS opens every member uncached: its reads always wait.
#[cfg_attr(target_os = "macos", allow(dead_code))]
pub(crate) enum ReadWait {
    /// The file is memory (tmpfs): a read is a copy.
    Never,
    /// Read through the system's cache: no wait if the cache holds it.
    UnlessCached,
    /// Every read goes to the drive (direct I/O).
    Always,
}

/// How the member is opened: for writing (exclusively), for reading (shared
/// with other readers), or to peek without taking any lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    ReadOnly,
    Peek,
}

/// A disk's logical block size and count, as the system reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskGeometry {
    pub block_bytes: u64,
    pub block_count: u64,
}

/// A mounted filesystem: its source's device number when the source is a
/// device node, the source as the mount table names it, and where it is
/// mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    pub device: Option<u64>,
    pub source: PathBuf,
    pub target: PathBuf,
}
