//! Linux's side of the member calls (see `mod.rs` for the table).

use super::{Access, DiskGeometry, Kind, Mount, ReadWait};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Disks are block devices on Linux; a character device is never one.
pub(crate) const CHARACTER_DEVICES_ARE_DISKS: bool = false;

/// The error of a drive with no medium in it.
pub(crate) const NO_MEDIUM: Option<libc::c_int> = Some(libc::ENOMEDIUM);

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKROGET: libc::c_ulong = 0x125e;

/// Opens with O_DIRECT, or buffered where the filesystem refuses O_DIRECT
/// (EINVAL; every flush is an fdatasync either way). A block device opened
/// for writing gets O_EXCL: the kernel refuses it (EBUSY) while it is
/// mounted or held by another exclusive opener.
pub(crate) fn open(path: &Path, kind: Kind, access: Access) -> io::Result<File> {
    let open = |direct: bool| {
        let mut options = OpenOptions::new();
        options.read(true).write(access == Access::ReadWrite);
        let mut flags = 0;
        if direct {
            flags |= libc::O_DIRECT;
        }
        if kind == Kind::BlockDevice && access == Access::ReadWrite {
            flags |= libc::O_EXCL;
        }
        options.custom_flags(flags);
        options.open(path)
    };
    match open(true) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false),
        result => result,
    }
}

/// Whether a read of `file` can wait for a drive (see `ReadWait`): files
/// on tmpfs are memory; a file opened without O_DIRECT is read
/// through the page cache; any other read waits for its drive.
pub(crate) fn read_wait(file: &File) -> ReadWait {
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills `stat` for a valid descriptor; read only on 0.
    let in_memory = unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) } == 0 && {
        // SAFETY: fstatfs returned 0, so `stat` is filled.
        let kind = unsafe { stat.assume_init() }.f_type;
        kind == libc::TMPFS_MAGIC
    };
    // SAFETY: F_GETFL reads the descriptor's status flags.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if in_memory {
        ReadWait::Never
    } else if flags >= 0 && flags & libc::O_DIRECT == 0 {
        ReadWait::UnlessCached
    } else {
        ReadWait::Always
    }
}

/// Reads all of `buf` at `offset` only if the page cache holds it
/// (preadv2 with RWF_NOWAIT: no wait for the drive). False if it does not
/// hold all of it, or on any error (the caller reads it the usual way).
/// Only for a file `read_wait` says is `UnlessCached`: with O_DIRECT the
/// flag does not keep the call from waiting for the drive.
pub(crate) fn read_cached(file: &File, buf: &mut [u8], offset: u64) -> bool {
    let Ok(offset) = libc::off_t::try_from(offset) else {
        return false;
    };
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `iov` describes `buf`, valid and writable for its length.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    usize::try_from(n).is_ok_and(|n| n == buf.len())
}

pub(crate) fn disk_geometry(file: &File) -> io::Result<DiskGeometry> {
    let fd = file.as_raw_fd();
    let mut block_bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes an int into `block_bytes`.
    if unsafe { libc::ioctl(fd, BLKSSZGET, &mut block_bytes) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes a u64 into `size_bytes`.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size_bytes) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let block_bytes = u64::try_from(block_bytes).unwrap_or(0);
    Ok(DiskGeometry {
        block_bytes,
        block_count: size_bytes.checked_div(block_bytes).unwrap_or(0),
    })
}

pub(crate) fn disk_read_only(file: &File) -> io::Result<bool> {
    let mut read_only: libc::c_int = 0;
    // SAFETY: BLKROGET writes an int into `read_only`.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKROGET, &mut read_only) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(read_only != 0)
}

/// fdatasync: the file's (or device's) written data and what is needed to
/// read it back, through the drive's volatile cache (the kernel sends the
/// drive a cache flush), for files and block devices alike.
pub(crate) fn flush(file: &File, _kind: Kind) -> io::Result<()> {
    file.sync_data()
}

pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (off_t(offset)?, off_t(len)?);
    // SAFETY: plain fallocate on an owned fd.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn discard_disk(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads two u64s.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD, &range) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every mount of this process's mount namespace (/proc/self/mountinfo:
/// field 3 is the source's device number, field 5 the mount point, the
/// field after " - " and the filesystem type is the source).
pub(crate) fn mounts() -> io::Result<Vec<Mount>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(table
        .lines()
        .map(|line| {
            let target = line
                .split_whitespace()
                .nth(4)
                .map(|field| PathBuf::from(OsString::from_vec(unescape_octal(field))))
                .unwrap_or_default();
            let device = line
                .split_whitespace()
                .nth(2)
                .and_then(|numbers| numbers.split_once(':'))
                .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
                .map(|(major, minor)| libc::makedev(major, minor));
            let source = line
                .split_once(" - ")
                .and_then(|(_, tail)| tail.split_whitespace().nth(1))
                .map(PathBuf::from)
                .unwrap_or_default();
            Mount {
                device,
                source,
                target,
            }
        })
        .collect())
}

/// A mountinfo field with its octal escapes (`\040` for a space, `\011`,
/// `\012`, `\134`) turned back into bytes.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match code {
            Some(byte) if bytes[i] == b'\\' => {
                out.push(byte);
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn off_t(n: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_become_the_bytes_they_stand_for() {
        assert_eq!(unescape_octal(r"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape_octal(r"/x\011\012\134y"), b"/x\t\n\\y");
        // Not an escape: kept as it is.
        assert_eq!(unescape_octal(r"/a\9b\04"), br"/a\9b\04");
        assert_eq!(unescape_octal("/plain"), b"/plain");
    }

    fn file_in(dir: &str, direct: bool) -> (tempfile::TempDir, File) {
        let dir = tempfile::Builder::new().tempdir_in(dir).unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn tmpfs_is_memory_direct_io_always_waits_and_buffered_files_wait_unless_cached() {
        assert_eq!(read_wait(&file_in("/dev/shm", false).1), ReadWait::Never);
        assert_eq!(read_wait(&file_in("/dev/shm", true).1), ReadWait::Never);
        assert_eq!(read_wait(&file_in("/var/tmp", true).1), ReadWait::Always);
        assert_eq!(
            read_wait(&file_in("/var/tmp", false).1),
            ReadWait::UnlessCached
        );
    }

    #[test]
    fn a_cached_read_is_done_only_while_the_page_cache_holds_it() {
        let (_dir, file) = file_in("/var/tmp", false);
        let mut buf = vec![0u8; 8192];
        // Just written: in the page cache.
        assert!(read_cached(&file, &mut buf, 4096));
        assert!(buf.iter().all(|&b| b == 7));
        // Past the end: not all of it.
        assert!(!read_cached(&file, &mut buf, (1 << 20) - 4096));
        // Written back and dropped from the cache: the read would wait.
        file.sync_all().unwrap();
        // SAFETY: advice on a valid descriptor.
        let dropped =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(dropped, 0);
        assert!(!read_cached(&file, &mut buf, 4096));
    }
}
