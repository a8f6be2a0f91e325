//! Files and disks as members: positioned I/O that bypasses the system's
//! cache, flushes that reach stable storage (the drive's own cache
//! included), discards, and exclusive access, so that two lograid processes
//! can never write one drive. The system calls differ between Linux and
//! macOS (`super::os`); what is called when, and how the answers are read,
//! is decided here, for both: which file types are members, what a disk's
//! reported geometry means, which errors refuse a drive and which are
//! harmless, and (below) which signatures and mounts refuse one.
//!
//! Must never: take a member whose size it cannot vouch for, or report a
//! flush done that the system did not confirm.

use super::os::{self, Access, DiskGeometry, Kind, ReadWait};
use super::{AlignedBuf, Member};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    ReadWrite,
    ReadOnly,
    /// Read-only without taking the shared lock: for reading the superblock
    /// of a drive that a running server holds (to find its live status).
    Peek,
}

pub struct FileMember {
    path: PathBuf,
    file: File,
    size_bytes: u64,
    kind: Kind,
    /// Whether a read can wait for a drive (`try_read_at`).
    read_wait: ReadWait,
}

/// The largest logical block a disk may have: the engine reads and writes
/// 4 KiB blocks at 4 KiB-aligned offsets.
const MAX_DISK_BLOCK_BYTES: u64 = 4096;

impl FileMember {
    /// Opens `path` with the system's cache bypassed where it allows (see
    /// `os::open`) and takes an exclusive lock (a shared one read-only).
    /// Fails with `WouldBlock` when another process holds the drive, and
    /// with `ResourceBusy` when the system says it is in use (mounted).
    pub fn open(path: &Path, mode: OpenMode) -> io::Result<FileMember> {
        let meta = std::fs::metadata(path)?;
        let kind = member_kind(meta.file_type(), os::CHARACTER_DEVICES_ARE_DISKS)?;
        let access = match mode {
            OpenMode::ReadWrite => Access::ReadWrite,
            OpenMode::ReadOnly => Access::ReadOnly,
            OpenMode::Peek => Access::Peek,
        };
        let file = os::open(path, kind, access).map_err(open_error)?;
        if kind.is_disk() && mode == OpenMode::ReadWrite {
            // A system that cannot say lets the first write fail instead.
            if let Ok(true) = os::disk_read_only(&file) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the block device is read-only",
                ));
            }
        }
        let lock = match mode {
            OpenMode::ReadWrite => libc::LOCK_EX,
            OpenMode::ReadOnly => libc::LOCK_SH,
            OpenMode::Peek => 0,
        };
        // SAFETY: valid fd owned by `file`.
        if lock != 0 && unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } != 0 {
            return Err(open_error(io::Error::last_os_error()));
        }
        let size_bytes = if kind.is_disk() {
            disk_size_bytes(os::disk_geometry(&file)?)?
        } else {
            meta.len()
        };
        Ok(FileMember {
            path: path.to_path_buf(),
            read_wait: os::read_wait(&file),
            file,
            size_bytes,
            kind,
        })
    }

    /// Creates a sparse file of `size_bytes` (refuses to overwrite).
    pub fn create_sparse(path: &Path, size_bytes: u64) -> io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len(size_bytes)
    }
}

/// Which kind of member a file type is, if any: regular files and block
/// devices everywhere, character devices where the system's raw disks are
/// character devices (macOS /dev/rdiskN).
fn member_kind(file_type: std::fs::FileType, character_disks: bool) -> io::Result<Kind> {
    if file_type.is_file() {
        Ok(Kind::File)
    } else if file_type.is_block_device() {
        Ok(Kind::BlockDevice)
    } else if file_type.is_char_device() && character_disks {
        Ok(Kind::RawDisk)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            if character_disks {
                "not a regular file or disk"
            } else {
                "not a regular file or block device"
            },
        ))
    }
}

/// What an error from opening or locking a member means to the user: busy
/// (mounted, or held by something else), or held by another lograid.
fn open_error(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EBUSY) => io::Error::new(
            io::ErrorKind::ResourceBusy,
            "block device is in use (mounted or held)",
        ),
        Some(libc::EWOULDBLOCK) => io::Error::new(
            io::ErrorKind::WouldBlock,
            "drive is open by another lograid process (locked)",
        ),
        _ => e,
    }
}

/// A disk's size from the geometry the system reports: the logical block
/// must be a power of two from 512 bytes to 4 KiB (a larger one cannot take
/// the engine's 4 KiB writes), the disk must not be empty, and the product
/// must not overflow.
fn disk_size_bytes(geometry: DiskGeometry) -> io::Result<u64> {
    let DiskGeometry {
        block_bytes,
        block_count,
    } = geometry;
    if !block_bytes.is_power_of_two() || !(512..=MAX_DISK_BLOCK_BYTES).contains(&block_bytes) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the disk's logical block is {block_bytes} bytes; lograid needs 512 to \
                 {MAX_DISK_BLOCK_BYTES} (a power of two)"
            ),
        ));
    }
    match block_count.checked_mul(block_bytes) {
        Some(0) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the disk reports no blocks (no medium?)",
        )),
        Some(size_bytes) => Ok(size_bytes),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the disk reports {block_count} blocks of {block_bytes} bytes: too many"),
        )),
    }
}

/// Whether opening a drive failed because it is not there: a deleted file,
/// a device that went away, a drive with no medium.
pub fn is_gone_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(errno) if errno == libc::ENXIO
            || errno == libc::ENODEV
            || os::NO_MEDIUM == Some(errno))
}

/// Whether a failed discard only means the drive or filesystem does not
/// discard: the range then simply stays allocated.
fn discard_unsupported(e: &io::Error) -> bool {
    // ENOTSUP and EOPNOTSUPP are one number on Linux, two on macOS.
    matches!(e.raw_os_error(), Some(errno) if errno == libc::EOPNOTSUPP
        || errno == libc::ENOTSUP
        || errno == libc::ENOTTY)
}

impl Member for FileMember {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> bool {
        match self.read_wait {
            ReadWait::Never => self.file.read_exact_at(buf, offset).is_ok(),
            ReadWait::UnlessCached => os::read_cached(&self.file, buf, offset),
            ReadWait::Always => false,
        }
    }
    fn gone(&self) -> Option<String> {
        if self.kind.is_disk() {
            let present = os::disk_geometry(&self.file).is_ok_and(|g| g.block_count > 0);
            return (!present).then(|| "the block device went away".to_string());
        }
        match self.file.metadata() {
            Ok(meta) if meta.nlink() == 0 => Some("its file was deleted".to_string()),
            Ok(_) => None,
            Err(e) => Some(format!("its file cannot be examined: {e}")),
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.as_raw_fd())
    }
    /// Everything written before, on stable storage: `os::flush` for this
    /// kind of member. Callers go through `Device::sync`, which shares one
    /// flush among concurrent callers and never retries a failed one.
    fn flush(&self) -> io::Result<()> {
        os::flush(&self.file, self.kind)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let result = if self.kind.is_disk() {
            os::discard_disk(&self.file, offset, len)
        } else {
            os::punch_hole(&self.file, offset, len)
        };
        match result {
            Err(e) if discard_unsupported(&e) => Ok(()),
            result => result,
        }
    }
}

/// Names the filesystem, partition table or volume signature found at the
/// start of a drive, if any (so `create` can refuse to overwrite it).
pub fn probe_signature(path: &Path) -> io::Result<Option<String>> {
    let f = File::open(path)?;
    // Aligned, in whole 4 KiB blocks: raw disks take nothing else.
    let mut head = AlignedBuf::zeroed(SIGNATURE_BYTES);
    let mut got = 0;
    while got < head.len() {
        let n = f.read_at(&mut head[got..], got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(signature_in(&head[..got]).map(str::to_string))
}

/// How much of a drive's start `signature_in` needs to see every signature.
const SIGNATURE_BYTES: usize = 128 * 1024;

/// What a lograid member's start is called by `signature_in`.
pub const LOGRAID_SIGNATURE: &str = "a lograid superblock";

/// Names the filesystem, partition table or volume signature in the first
/// bytes of a drive (at least 128 KiB for every signature to be seen).
pub fn signature_in(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| {
        head.len() >= off + magic.len() && &head[off..off + magic.len()] == magic
    };
    if at(0, crate::format::superblock::SUPERBLOCK_MAGIC.as_slice())
        || at(4096, crate::format::superblock::SUPERBLOCK_MAGIC.as_slice())
    {
        Some(LOGRAID_SIGNATURE)
    } else if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        Some("a GPT partition table")
    } else if at(0, b"ER") && at(512, b"PM") {
        Some("an Apple partition map")
    } else if at(32, b"NXSB") {
        Some("an APFS container")
    } else if at(1024, b"H+\0\x04") || at(1024, b"HX\0\x05") {
        Some("an HFS+ filesystem")
    } else if at(1080, &[0x53, 0xEF]) {
        Some("an ext2/3/4 filesystem")
    } else if at(0, b"XFSB") {
        Some("an XFS filesystem")
    } else if at(65536 + 64, b"_BHRfS_M") {
        Some("a btrfs filesystem")
    } else if at(0, b"LUKS\xba\xbe") {
        Some("a LUKS volume")
    } else if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        Some("swap space")
    } else if at(512, b"LABELONE") {
        Some("an LVM physical volume")
    } else if at(32769, b"CD001") {
        Some("an ISO 9660 image")
    } else if at(0, b"hsqs") {
        Some("a squashfs image")
    } else if at(3, b"EXFAT   ") {
        Some("an exFAT filesystem")
    } else if at(3, b"NTFS    ") {
        Some("an NTFS filesystem")
    } else if at(82, b"FAT32   ") || at(54, b"FAT16   ") || at(54, b"FAT12   ") {
        Some("a FAT filesystem")
    } else if at(510, &[0x55, 0xAA]) && head.len() >= 512 && head[446..510].iter().any(|&b| b != 0)
    {
        Some("an MBR partition table")
    } else {
        None
    }
}

/// Is `path` a disk that is mounted, or one with a partition that is? A
/// mount's source counts when it is the disk's own block device (by device
/// number), or when its name is the disk's or one of its partitions' (see
/// `names_disk_or_partition`; a raw disk /dev/rdiskN goes by its block
/// device's name, diskN). Regular files are never mounted. A mount table
/// that cannot be read counts as nothing mounted: opening the disk
/// exclusively still refuses one in use.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(kind) = member_kind(meta.file_type(), os::CHARACTER_DEVICES_ARE_DISKS) else {
        return false;
    };
    if !kind.is_disk() {
        return false;
    }
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let Some(name) = canonical.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let disk = match kind {
        Kind::RawDisk => name.strip_prefix('r').unwrap_or(name),
        _ => name,
    };
    let mounts = os::mounts().unwrap_or_default();
    mounts.iter().any(|mount| {
        (kind == Kind::BlockDevice && mount.device == Some(meta.rdev()))
            || mount
                .source
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|source| names_disk_or_partition(disk, source))
    })
}

/// Whether something is mounted on `dir`, named exactly as the mount table
/// names its mount point (an absolute path with no symbolic links). The
/// table is read without asking any mounted filesystem anything, so a mount
/// whose server does not answer is seen without waiting for it.
pub fn is_mount_point(dir: &Path) -> io::Result<bool> {
    Ok(os::mounts()?.iter().any(|mount| mount.target == dir))
}

/// Whether device name `candidate` is disk `disk` or one of its partitions:
/// BSD slices `disk2s1` (and nested, `disk3s1s1`); Linux partitions `sda1`,
/// and `nvme0n1p1` or `loop0p1` where the disk's name ends in a digit.
fn names_disk_or_partition(disk: &str, candidate: &str) -> bool {
    let Some(rest) = candidate.strip_prefix(disk) else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let disk_ends_in_digit = disk.bytes().last().is_some_and(|b| b.is_ascii_digit());
    rest.is_empty()
        || rest
            .strip_prefix('s')
            .is_some_and(|slices| slices.split('s').all(number))
        || (disk_ends_in_digit && rest.strip_prefix('p').is_some_and(number))
        || (!disk_ends_in_digit && number(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_table_names_mount_points_and_not_other_directories() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let spaced = dir.path().join("a dir");
        std::fs::create_dir(&spaced).unwrap();
        assert!(!is_mount_point(&spaced).unwrap());
        // Where this process may mount (root): a mount point whose name has a space.
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "lograid-test"])
            .arg(&spaced)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            let seen = is_mount_point(&spaced).unwrap();
            let unmounted = std::process::Command::new("umount").arg(&spaced).status();
            assert!(seen);
            assert!(unmounted.unwrap().success());
        }
    }

    #[test]
    fn a_disk_size_is_its_blocks_times_a_block_of_512_bytes_to_4_kib() {
        let size = |block_bytes, block_count| {
            disk_size_bytes(DiskGeometry {
                block_bytes,
                block_count,
            })
        };
        assert_eq!(size(512, 8).unwrap(), 4096);
        assert_eq!(size(4096, 1 << 28).unwrap(), 1 << 40);
        for bad_block in [0, 256, 1000, 2047, 8192, 65536] {
            let e = size(bad_block, 1024).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad_block}: {e}");
            assert!(e.to_string().contains("logical block"), "{e}");
        }
        let empty = size(512, 0).unwrap_err();
        assert!(empty.to_string().contains("no blocks"), "{empty}");
        let huge = size(4096, u64::MAX / 2).unwrap_err();
        assert_eq!(huge.kind(), io::ErrorKind::InvalidData, "{huge}");
    }

    #[test]
    fn partitions_are_named_after_their_disk() {
        for (disk, part) in [
            ("disk2", "disk2"),
            ("disk2", "disk2s1"),
            ("disk2", "disk2s12"),
            ("disk3", "disk3s1s1"),
            ("sda", "sda"),
            ("sda", "sda1"),
            ("nvme0n1", "nvme0n1p1"),
            ("loop0", "loop0p3"),
            ("md1", "md1p1"),
        ] {
            assert!(names_disk_or_partition(disk, part), "{part} is on {disk}");
        }
        for (disk, other) in [
            ("disk2", "disk20"),
            ("disk2", "disk20s1"),
            ("disk2", "disk2s"),
            ("disk2", "disk2sx"),
            ("disk1", "disk1s1x"),
            ("sda", "sdab"),
            ("sda", "sdb1"),
            ("nvme0n1", "nvme0n10"),
            ("nvme0n1", "nvme0n1p"),
            ("loop1", "loop10"),
            ("loop1", "loop1p1x"),
            ("sda", "sd"),
        ] {
            assert!(
                !names_disk_or_partition(disk, other),
                "{other} is not on {disk}"
            );
        }
    }

    #[test]
    fn only_files_and_disks_are_members() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.img");
        std::fs::write(&file, [0u8; 4096]).unwrap();
        let file_type = |p: &Path| std::fs::metadata(p).unwrap().file_type();
        assert_eq!(member_kind(file_type(&file), false).unwrap(), Kind::File);
        assert_eq!(member_kind(file_type(&file), true).unwrap(), Kind::File);
        // A character device is a raw disk only where the system says so.
        let null = Path::new("/dev/null");
        let e = member_kind(file_type(null), false).unwrap_err();
        assert!(e.to_string().contains("block device"), "{e}");
        assert_eq!(member_kind(file_type(null), true).unwrap(), Kind::RawDisk);
        assert!(member_kind(file_type(dir.path()), true).is_err());
    }

    #[test]
    fn open_errors_say_busy_or_locked_and_discard_tolerates_no_support() {
        let busy = open_error(io::Error::from_raw_os_error(libc::EBUSY));
        assert_eq!(busy.kind(), io::ErrorKind::ResourceBusy);
        let locked = open_error(io::Error::from_raw_os_error(libc::EWOULDBLOCK));
        assert_eq!(locked.kind(), io::ErrorKind::WouldBlock);
        assert!(locked.to_string().contains("another lograid"), "{locked}");
        let other = open_error(io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(other.raw_os_error(), Some(libc::EACCES));
        for errno in [libc::EOPNOTSUPP, libc::ENOTSUP, libc::ENOTTY] {
            assert!(discard_unsupported(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EIO, libc::EINVAL, libc::EBADF] {
            assert!(!discard_unsupported(&io::Error::from_raw_os_error(errno)));
        }
    }

    #[test]
    fn macos_volumes_and_partition_maps_are_recognised() {
        let with = |offset: usize, magic: &[u8]| {
            let mut head = vec![0u8; SIGNATURE_BYTES];
            head[offset..offset + magic.len()].copy_from_slice(magic);
            signature_in(&head)
        };
        assert_eq!(with(32, b"NXSB"), Some("an APFS container"));
        assert_eq!(with(1024, b"H+\0\x04"), Some("an HFS+ filesystem"));
        assert_eq!(with(1024, b"HX\0\x05"), Some("an HFS+ filesystem"));
        assert_eq!(with(3, b"EXFAT   "), Some("an exFAT filesystem"));
        // A GPT on a disk of 4 KiB sectors has its header at 4096.
        assert_eq!(with(4096, b"EFI PART"), Some("a GPT partition table"));
        let mut apm = vec![0u8; SIGNATURE_BYTES];
        apm[..2].copy_from_slice(b"ER");
        apm[512..514].copy_from_slice(b"PM");
        assert_eq!(signature_in(&apm), Some("an Apple partition map"));
        assert_eq!(
            with(0, b"ER"),
            None,
            "a block-0 signature alone is not a map"
        );
        assert_eq!(with(1024, b"H+\0\x09"), None);
    }
}
