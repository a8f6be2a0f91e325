//! macOS's side of the member calls (see `mod.rs` for the table). The disk
//! ioctls and their structures are those of xnu's <sys/disk.h>.

use super::{Access, DiskGeometry, Kind, Mount, ReadWait};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// /dev/rdiskN, a disk without the buffer cache, is a character device.
pub(crate) const CHARACTER_DEVICES_ARE_DISKS: bool = true;

/// macOS has no error of its own for a drive with no medium (ENXIO or
/// ENODEV say it).
pub(crate) const NO_MEDIUM: Option<libc::c_int> = None;

/// `dk_synchronize_t`: a range to flush (0, 0: the whole disk) and options
/// (0: a full flush of the drive's cache, not a mere barrier).
#[repr(C)]
struct DkSynchronize {
    offset: u64,
    length: u64,
    options: u32,
    reserved: [u8; 4],
}

/// `dk_extent_t`: a byte range.
#[repr(C)]
struct DkExtent {
    offset: u64,
    length: u64,
}

/// `dk_unmap_t` (64-bit layout).
#[repr(C)]
struct DkUnmap {
    extents: *mut DkExtent,
    extents_count: u32,
    options: u32,
}

/// BSD ioctl numbers: direction, parameter length, group 'd' and number.
const fn disk_ioctl(direction: u32, number: u32, parameter_bytes: usize) -> libc::c_ulong {
    (direction | ((parameter_bytes as u32 & 0x1fff) << 16) | ((b'd' as u32) << 8) | number)
        as libc::c_ulong
}
const OUT: u32 = 0x4000_0000;
const IN: u32 = 0x8000_0000;
const DKIOCSYNCHRONIZE: libc::c_ulong = disk_ioctl(IN, 22, size_of::<DkSynchronize>());
const DKIOCGETBLOCKSIZE: libc::c_ulong = disk_ioctl(OUT, 24, size_of::<u32>());
const DKIOCGETBLOCKCOUNT: libc::c_ulong = disk_ioctl(OUT, 25, size_of::<u64>());
const DKIOCISWRITABLE: libc::c_ulong = disk_ioctl(OUT, 29, size_of::<u32>());
const DKIOCUNMAP: libc::c_ulong = disk_ioctl(IN, 31, size_of::<DkUnmap>());
// The values <sys/disk.h> gives on 64-bit macOS.
const _: () = assert!(DKIOCSYNCHRONIZE == 0x8018_6416);
const _: () = assert!(DKIOCGETBLOCKSIZE == 0x4004_6418);
const _: () = assert!(DKIOCGETBLOCKCOUNT == 0x4008_6419);
const _: () = assert!(DKIOCISWRITABLE == 0x4004_641d);
const _: () = assert!(DKIOCUNMAP == 0x8010_641f);

/// Opens the member. A disk is opened with O_EXLOCK for writing (O_SHLOCK
/// for reading): the disk driver then grants this process exclusive (or
/// shared) use of the whole disk, and refuses it (EBUSY) while a filesystem
/// on the disk or on one of its partitions is mounted or another process
/// holds it; O_NONBLOCK makes a lock held by another lograid fail at once
/// (EWOULDBLOCK) instead of waiting. Files and buffered disks get
/// F_NOCACHE: reads and writes bypass the buffer cache (raw disks have
/// none). F_NOCACHE is a hint: where it is refused the member is cached,
/// and every flush is still an F_FULLFSYNC.
pub(crate) fn open(path: &Path, kind: Kind, access: Access) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(access == Access::ReadWrite);
    let lock = match access {
        Access::ReadWrite => libc::O_EXLOCK,
        Access::ReadOnly => libc::O_SHLOCK,
        Access::Peek => 0,
    };
    if kind.is_disk() && lock != 0 {
        options.custom_flags(lock | libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let fd = file.as_raw_fd();
    if kind.is_disk() && lock != 0 {
        // SAFETY: fcntl on an fd we own, with plain integer arguments.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if kind != Kind::RawDisk {
        // SAFETY: as above. A refusal leaves the member cached (see above).
        let _ = unsafe { libc::fcntl(fd, libc::F_NOCACHE, 1) };
    }
    Ok(file)
}

/// Members are opened with F_NOCACHE, so every read waits for its drive
/// (a RAM disk is not told apart).
pub(crate) fn read_wait(_file: &File) -> ReadWait {
    ReadWait::Always
}

/// Never called (`read_wait` is never `UnlessCached`); reads nothing.
pub(crate) fn read_cached(_file: &File, _buf: &mut [u8], _offset: u64) -> bool {
    false
}

pub(crate) fn disk_geometry(file: &File) -> io::Result<DiskGeometry> {
    let fd = file.as_raw_fd();
    let mut block_bytes: u32 = 0;
    // SAFETY: DKIOCGETBLOCKSIZE writes a u32 into `block_bytes`.
    if unsafe { libc::ioctl(fd, DKIOCGETBLOCKSIZE, &mut block_bytes) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut block_count: u64 = 0;
    // SAFETY: DKIOCGETBLOCKCOUNT writes a u64 into `block_count`.
    if unsafe { libc::ioctl(fd, DKIOCGETBLOCKCOUNT, &mut block_count) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(DiskGeometry {
        block_bytes: u64::from(block_bytes),
        block_count,
    })
}

pub(crate) fn disk_read_only(file: &File) -> io::Result<bool> {
    let mut writable: u32 = 0;
    // SAFETY: DKIOCISWRITABLE writes a u32 into `writable`.
    if unsafe { libc::ioctl(file.as_raw_fd(), DKIOCISWRITABLE, &mut writable) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(writable == 0)
}

/// A file: F_FULLFSYNC (its data and metadata written, then the drive asked
/// to flush its volatile cache; plain fsync on macOS leaves the data in the
/// drive's cache). A raw disk: DKIOCSYNCHRONIZE (the drive's cache flushed;
/// writes to a raw disk pass no cache of the system's). A buffered disk:
/// fsync (the buffer cache written out), then DKIOCSYNCHRONIZE.
pub(crate) fn flush(file: &File, kind: Kind) -> io::Result<()> {
    let fd = file.as_raw_fd();
    match kind {
        Kind::File => {
            // SAFETY: fcntl on an fd we own, no pointer arguments.
            if unsafe { libc::fcntl(fd, libc::F_FULLFSYNC) } != 0 {
                return Err(failed("F_FULLFSYNC"));
            }
        }
        Kind::BlockDevice => {
            file.sync_all()?;
            synchronize(fd)?;
        }
        Kind::RawDisk => synchronize(fd)?,
    }
    Ok(())
}

fn synchronize(fd: libc::c_int) -> io::Result<()> {
    let mut whole_disk = DkSynchronize {
        offset: 0,
        length: 0,
        options: 0,
        reserved: [0; 4],
    };
    // SAFETY: DKIOCSYNCHRONIZE reads one dk_synchronize_t.
    if unsafe { libc::ioctl(fd, DKIOCSYNCHRONIZE, &mut whole_disk) } != 0 {
        return Err(failed("DKIOCSYNCHRONIZE"));
    }
    Ok(())
}

pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let hole = libc::fpunchhole_t {
        fp_flags: 0,
        reserved: 0,
        fp_offset: off_t(offset)?,
        fp_length: off_t(len)?,
    };
    // SAFETY: F_PUNCHHOLE reads one fpunchhole_t.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_PUNCHHOLE, &hole) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn discard_disk(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let mut extent = DkExtent {
        offset,
        length: len,
    };
    let mut unmap = DkUnmap {
        extents: &mut extent,
        extents_count: 1,
        options: 0,
    };
    // SAFETY: DKIOCUNMAP reads one dk_unmap_t, whose pointer names one live extent.
    if unsafe { libc::ioctl(file.as_raw_fd(), DKIOCUNMAP, &mut unmap) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every mounted filesystem (getfsstat, without asking any filesystem for
/// fresh numbers), with the device number of its source when that is a
/// block device.
pub(crate) fn mounts() -> io::Result<Vec<Mount>> {
    // SAFETY: a null buffer asks for the number of mounts only.
    let count = unsafe { libc::getfsstat(std::ptr::null_mut(), 0, libc::MNT_NOWAIT) };
    let count = usize::try_from(count).map_err(|_| io::Error::last_os_error())?;
    // Room for a few mounts made in between.
    let mut table: Vec<libc::statfs> = Vec::with_capacity(count + 8);
    let bytes = libc::c_int::try_from(table.capacity() * size_of::<libc::statfs>())
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: the buffer has room for `bytes` bytes of statfs records.
    let got = unsafe { libc::getfsstat(table.as_mut_ptr(), bytes, libc::MNT_NOWAIT) };
    let got = usize::try_from(got).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: getfsstat filled `got` records, at most the capacity.
    unsafe { table.set_len(got.min(table.capacity())) };
    Ok(table
        .iter()
        .map(|fs| {
            let source = c_path(&fs.f_mntfromname);
            let device = std::fs::metadata(&source)
                .ok()
                .filter(|m| m.file_type().is_block_device())
                .map(|m| m.rdev());
            Mount {
                device,
                source,
                target: c_path(&fs.f_mntonname),
            }
        })
        .collect())
}

/// A NUL-terminated path in a fixed-size field.
fn c_path(field: &[libc::c_char]) -> PathBuf {
    let name: Vec<u8> = field
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    PathBuf::from(OsString::from_vec(name))
}

fn failed(call: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

fn off_t(n: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}
