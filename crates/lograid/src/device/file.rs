//! Files and block devices as members: O_DIRECT positioned I/O, fdatasync,
//! hole punching or BLKDISCARD, and an exclusive lock so that two lograid
//! processes can never write one drive.

use super::Member;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
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
    is_block_device: bool,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKROGET: libc::c_ulong = 0x125e;

impl FileMember {
    /// Opens `path` with O_DIRECT (falling back to buffered I/O plus
    /// fdatasync where the filesystem refuses O_DIRECT) and takes an exclusive
    /// lock. Fails with `WouldBlock` when another process holds the drive.
    pub fn open(path: &Path, mode: OpenMode) -> io::Result<FileMember> {
        let meta = std::fs::metadata(path)?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(mode == OpenMode::ReadWrite);
            let mut flags = 0;
            if direct {
                flags |= libc::O_DIRECT;
            }
            if is_block_device && mode == OpenMode::ReadWrite {
                // The kernel refuses O_EXCL on a block device that is mounted or held.
                flags |= libc::O_EXCL;
            }
            o.custom_flags(flags);
            o.open(path)
        };
        let file = match open(true) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false)?,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "block device is in use (mounted or held)",
                ))
            }
            Err(e) => return Err(e),
        };
        if is_block_device && mode == OpenMode::ReadWrite {
            let mut ro: libc::c_int = 0;
            // SAFETY: BLKROGET writes an int into `ro`.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKROGET, &mut ro) } == 0 && ro != 0 {
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
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "drive is open by another lograid process (locked)",
                ));
            }
            return Err(e);
        }
        let size_bytes = if is_block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes a u64 into `size`.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
                return Err(io::Error::last_os_error());
            }
            size
        } else {
            meta.len()
        };
        Ok(FileMember {
            path: path.to_path_buf(),
            file,
            size_bytes,
            is_block_device,
        })
    }

    /// Creates a sparse file of `size_bytes` (refuses to overwrite).
    pub fn create_sparse(path: &Path, size_bytes: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        f.set_len(size_bytes)
    }
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
    fn gone(&self) -> Option<String> {
        if self.is_block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes a u64 into `size`.
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut size) };
            return (r != 0 || size == 0).then(|| "the block device went away".to_string());
        }
        use std::os::unix::fs::MetadataExt;
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
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        let rc = if self.is_block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s.
            unsafe { libc::ioctl(fd, BLKDISCARD, &range) }
        } else {
            // SAFETY: plain fallocate on an owned fd.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)
            ) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }
}

/// Names the filesystem, partition table or volume signature found at the
/// start of a drive, if any (so `create` can refuse to overwrite it).
pub fn probe_signature(path: &Path) -> io::Result<Option<String>> {
    let f = File::open(path)?;
    let mut head = vec![0u8; 128 * 1024];
    let mut got = 0;
    while got < head.len() {
        let n = f.read_at(&mut head[got..], got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    head.truncate(got);
    Ok(signature_in(&head).map(str::to_string))
}

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
    } else if at(512, b"EFI PART") {
        Some("a GPT partition table")
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

/// Is `path` (a block device) or a device backed by it mounted? Checks
/// /proc/self/mountinfo by device number.
pub fn is_mounted(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    if !meta.file_type().is_block_device() {
        return false;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let want = format!("{major}:{minor}");
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| {
            s.lines()
                .any(|l| l.split_whitespace().nth(2) == Some(want.as_str()))
        })
        .unwrap_or(false)
}
