//! lograid-fuse: the volumes a server exports, as files in a FUSE mount served by the server
//! itself, so that `losetup --direct-io=on DIR/VOLUME` makes a kernel block device of a volume on
//! hosts without the nbd driver, with no NBD client process in between (the other route is
//! `nbdfuse` over NBD, see `lograid_nbd::attach`).
//!
//! Owns: the FUSE mount (one directory, one regular file per [`Export`], named after it), the
//! translation of the kernel's file requests into export calls (read, write, fsync as flush,
//! `fallocate` punch-hole as zeroes that may be unmapped and zero-range as zeroes that stay
//! allocated, `O_SYNC`/`O_DSYNC` writes as FUA), and unmounting, also when a loop device still
//! holds a file. Must never: pass the export a call outside the export's contract (offsets and
//! lengths are multiples of 512 and within the size; unaligned requests are widened here), call
//! an export after the mount ended, grow or shrink a file, take over a mount it did not make,
//! or answer a request after the export refused it.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use lograid_nbd::Export;
use parking_lot::Mutex;

mod detach;
mod error;
mod gate;
mod mount_point;
mod stats;

use detach::{abort_connection, lazy_unmount};
pub use error::FuseError;
use gate::Gate;
pub use mount_point::{connection_of, is_mount_point};
use mount_point::{is_dead, mount_at, resolve, MountEntry};
use stats::Stats;

/// The export contract's unit: offsets and lengths passed to an [`Export`] are multiples of it.
const SECTOR: u64 = 512;
/// Largest request the kernel sends (read or write); the default 128 KiB would split every
/// 512 KiB-1 MiB write of the loop device into 4-8 requests.
const MAX_REQUEST: u32 = 1 << 20;
/// Requests the kernel keeps in flight towards us (asynchronous direct I/O from the loop device
/// counts as background requests; the kernel's default is 12).
const MAX_BACKGROUND: u16 = 64;
/// How long the kernel may cache names and attributes. Sizes do not change while mounted.
const TTL: Duration = Duration::from_secs(60);
/// The root directory's inode; files are `FIRST_FILE + index`.
const ROOT: u64 = 1;
const FIRST_FILE: u64 = 2;

/// How a mount is made.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Threads that take requests from the kernel (each blocks in the export while its request
    /// runs, so this bounds the requests served at once).
    pub threads: usize,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions { threads: 16 }
    }
}

/// A live mount. [`FuseMount::unmount`] ends it; dropping it unmounts too (without reporting).
pub struct FuseMount {
    dir: PathBuf,
    /// The thread running fuser's session (it starts and joins the request threads).
    session: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// Unmounts through fuser's own handle, so that fuser does not unmount the path again later
    /// (by then it may be someone else's mount).
    unmounter: Option<fuser::SessionUnmounter>,
    /// The FUSE connection's number (the mount's device minor), for aborting it.
    connection: Option<u32>,
    stats: Arc<Stats>,
    gate: Arc<Gate>,
}

/// Mounts `exports` as files `dir/NAME` (creating `dir` if needed). A lograid FUSE mount left
/// there by a server that died is unmounted first; any other mount on `dir` (a live server's, or
/// another filesystem) is refused. Needs /dev/fuse and, unless running as root, `fusermount3`.
pub fn mount(
    dir: &Path,
    exports: Vec<Arc<dyn Export>>,
    options: &FuseOptions,
) -> Result<FuseMount, FuseError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(FuseError::NoFuse);
    }
    // Fails on a dead mount point (it exists); resolved and created again below.
    let _ = fs::create_dir_all(dir);
    let dir = &resolve(dir).map_err(|source| FuseError::Mount {
        dir: dir.to_owned(),
        source,
    })?;
    let mount_error = |source: io::Error| FuseError::Mount {
        dir: dir.to_owned(),
        source,
    };
    if let Some(existing) = mount_at(dir) {
        if !existing.is_ours() || !is_dead(dir) {
            return Err(mount_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "the directory is already a mount point ({}{}); give an empty directory",
                    existing.fstype,
                    if existing.is_ours() {
                        ", served by a running lograid"
                    } else {
                        ""
                    }
                ),
            )));
        }
        // What a killed server leaves: "Transport endpoint is not connected".
        tracing::warn!(dir = %dir.display(), "a FUSE mount left by a server that died is on the directory; unmounting it (lazily)");
        lazy_unmount(dir).map_err(|detail| FuseError::Unmount {
            dir: dir.to_owned(),
            detail,
        })?;
    }
    fs::create_dir_all(dir).map_err(mount_error)?;
    let files = VolumeFiles::new(exports);
    let (stats, gate) = (files.stats.clone(), files.gate.clone());
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("lograid".into()),
        MountOption::Subtype("lograid".into()),
        MountOption::DefaultPermissions,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoExec,
    ];
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let mut session = fuser::Session::new(files, dir, &config).map_err(mount_error)?;
    let unmounter = session.unmount_callable();
    let connection = mount_at(dir).filter(MountEntry::is_ours).map(|m| m.minor);
    let session = std::thread::Builder::new()
        .name("lograid-fuse".into())
        .spawn(move || session.run())
        .map_err(mount_error)?;
    tracing::info!(dir = %dir.display(), "volumes mounted as FUSE files");
    Ok(FuseMount {
        dir: dir.to_owned(),
        session: Some(session),
        unmounter: Some(unmounter),
        connection,
        stats,
        gate,
    })
}

impl FuseMount {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Unmounts and waits for the request threads. If a loop device (or anything else) still
    /// holds a file, the mount is detached lazily and its connection aborted, so that the
    /// server can stop: the holder's later requests fail with an I/O error, as they would
    /// with the server gone. Once this returns no request reaches an export (unless one was
    /// stuck in an export call for [`gate::GATE_WAIT`]: it is not waited for longer). Returns how the
    /// mount ended.
    pub fn unmount(mut self) -> Result<Unmounted, FuseError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<Unmounted, FuseError> {
        let Some(session) = self.session.take() else {
            return Ok(Unmounted::Clean);
        };
        let dir = self.dir.clone();
        let unmounted = match self.unmounter.take() {
            Some(mut unmounter) => unmounter.unmount().map_err(|e| e.to_string()),
            None => Err("no unmount handle".to_string()),
        };
        let ended = match unmounted {
            Ok(()) => Unmounted::Clean,
            Err(detail) => {
                tracing::warn!(dir = %dir.display(), "unmounting: {detail}; detaching the mount lazily and aborting its connection");
                // From here on requests get EIO from us, whatever happens to the connection.
                self.gate.close();
                // Abort first, while the mount still holds its connection number: once the mount
                // is detached and its last user gone, the number is free, and the next FUSE mount
                // on the machine (another server's) may get it.
                let ours = mount_at(&dir).filter(MountEntry::is_ours);
                let aborted = match (self.connection, &ours) {
                    (Some(connection), Some(m)) if m.minor == connection => {
                        abort_connection(connection)
                    }
                    (Some(_), _) => Err("the mount is no longer on its directory".into()),
                    (None, _) => Err("the mount's connection number is unknown".into()),
                };
                if ours.is_some() {
                    if let Err(detail) = lazy_unmount(&dir) {
                        tracing::warn!(dir = %dir.display(), "{detail}");
                    }
                }
                if let Err(detail) = aborted {
                    // Joining would wait for the holder to let go. The request threads answer
                    // EIO until the process exits and its /dev/fuse descriptors close.
                    tracing::warn!(
                        "cannot abort the FUSE connection of {}: {detail}",
                        dir.display()
                    );
                    return Ok(Unmounted::Refusing);
                }
                Unmounted::Aborted
            }
        };
        self.gate.close();
        // The kernel ends the session (ENODEV to every request thread) once unmounted or aborted.
        let joined = match session.join() {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err("the FUSE session thread panicked".to_string()),
        };
        joined.map_err(|detail| FuseError::Unmount {
            dir: dir.clone(),
            detail,
        })?;
        tracing::info!(dir = %dir.display(), "FUSE files unmounted: {}", self.stats.summary());
        Ok(ended)
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("{e}");
        }
    }
}

/// How a mount ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    Clean,
    /// A file was still in use (e.g. by a loop device); its connection was aborted, so its
    /// holder now gets I/O errors from the kernel.
    Aborted,
    /// A file was still in use and the connection could not be aborted: the holder's requests
    /// get I/O errors from this process until it exits (then from the kernel).
    Refusing,
}

/// The filesystem: a root directory holding one file per export.
struct VolumeFiles {
    exports: Vec<Arc<dyn Export>>,
    /// Each export's size and read-only flag, taken at mount: attributes are answered without
    /// calling an export (also after the mount ended).
    shapes: Vec<(u64, bool)>,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
    /// Serialises the read-modify-write of partly covered 512-byte sectors (unaligned writes and
    /// punched ranges come from tools writing the file directly, never from a loop device).
    edges: Mutex<()>,
    stats: Arc<Stats>,
    gate: Arc<Gate>,
}

thread_local! {
    /// Each request thread's read buffer, reused from request to request.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn errno(error: &io::Error) -> Errno {
    match error.raw_os_error() {
        Some(code) if code > 0 => Errno::from_i32(code),
        _ => Errno::from(error.kind()),
    }
}

fn round_down(x: u64) -> u64 {
    x / SECTOR * SECTOR
}

fn round_up(x: u64) -> u64 {
    x.div_ceil(SECTOR) * SECTOR
}

impl VolumeFiles {
    fn new(exports: Vec<Arc<dyn Export>>) -> Self {
        // SAFETY: plain getters without side effects.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        VolumeFiles {
            shapes: exports
                .iter()
                .map(|e| (e.size_bytes(), e.read_only()))
                .collect(),
            exports,
            mounted_at: SystemTime::now(),
            uid,
            gid,
            edges: Mutex::new(()),
            stats: Arc::default(),
            gate: Arc::default(),
        }
    }

    fn export(&self, ino: INodeNo) -> Result<&Arc<dyn Export>, Errno> {
        let ino = u64::from(ino);
        if ino == ROOT {
            return Err(Errno::EISDIR);
        }
        ino.checked_sub(FIRST_FILE)
            .and_then(|i| self.exports.get(i as usize))
            .ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o755, 2)
        } else {
            let &(size, read_only) = self.shapes.get(ino.checked_sub(FIRST_FILE)? as usize)?;
            let perm = if read_only { 0o400 } else { 0o600 };
            (FileType::RegularFile, size, perm, 1)
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size / SECTOR,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    /// Reads `[offset, end)` (end within the size) through `buffer`, widening to whole sectors;
    /// returns where in `buffer` the bytes asked for are. The buffer only grows: it is not
    /// cleared or zeroed per request (the export overwrites what it reads into).
    fn read_range(
        &self,
        export: &dyn Export,
        offset: u64,
        end: u64,
        buffer: &mut Vec<u8>,
    ) -> io::Result<std::ops::Range<usize>> {
        let start = round_down(offset);
        let stop = round_up(end).min(round_down(export.size_bytes()).max(start));
        let len = (stop - start) as usize;
        if buffer.len() < len {
            buffer.resize(len, 0);
        }
        export.read(start, &mut buffer[..len])?;
        let head = (offset - start) as usize;
        Ok(head..head + (end - offset) as usize)
    }

    /// Writes `data` at `offset` (within the size). Unaligned edges are read, merged and written
    /// back whole under `edges`.
    fn write_range(
        &self,
        export: &dyn Export,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(SECTOR) && end.is_multiple_of(SECTOR) {
            return export.write(offset, data, fua);
        }
        let _edges = self.edges.lock();
        let start = round_down(offset);
        let stop = round_up(end);
        if stop > export.size_bytes() {
            // The last sector is not whole: nothing can write it under the contract.
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut merged = vec![0u8; (stop - start) as usize];
        export.read(start, &mut merged)?;
        merged[(offset - start) as usize..(end - start) as usize].copy_from_slice(data);
        export.write(start, &merged, fua)
    }

    /// Zeroes `[offset, end)`: whole sectors by `whole` (trim or write-zeroes), edges by writing
    /// zero bytes.
    fn zero_range(
        &self,
        export: &dyn Export,
        offset: u64,
        end: u64,
        whole: impl FnOnce(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let first = round_up(offset).min(end);
        let last = round_down(end).max(first);
        if offset < first {
            self.write_range(export, offset, &vec![0; (first - offset) as usize], false)?;
        }
        if last < end {
            self.write_range(export, last, &vec![0; (end - last) as usize], false)?;
        }
        if first < last {
            whole(first, last - first)?;
        }
        Ok(())
    }
}

impl Filesystem for VolumeFiles {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Asynchronous direct I/O: the loop device's requests reach us all at once, not one
        // after the other (without it each waits for the previous one's reply).
        if config
            .add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO)
            .is_err()
        {
            tracing::warn!("the kernel's FUSE has no asynchronous direct I/O: requests are served one at a time");
        }
        if let Err(max) = config.set_max_write(MAX_REQUEST) {
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_readahead(MAX_REQUEST);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if u64::from(parent) != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let found = self
            .exports
            .iter()
            .position(|e| OsStr::new(e.name()) == name)
            .and_then(|i| self.attr(FIRST_FILE + i as u64));
        match found {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(u64::from(ino)) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr(u64::from(ino)) else {
            return reply.error(Errno::ENOENT);
        };
        // A volume's size is set with `lograid volume resize`, not by truncating its file;
        // owners and modes are fixed. Times are accepted and not kept (as on a block device).
        if size.is_some_and(|s| s != attr.size) {
            return reply.error(Errno::EINVAL);
        }
        if mode.is_some_and(|m| m & 0o7777 != u32::from(attr.perm))
            || uid.is_some_and(|u| u != attr.uid)
            || gid.is_some_and(|g| g != attr.gid)
        {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &attr)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let export = match self.export(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        // O_TRUNC reaches `setattr` as a truncation, and is refused there: honouring it as
        // nothing would let the kernel believe the file empty (its reads end at size 0).
        let writes = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        if writes && export.read_only() {
            return reply.error(Errno::EROFS);
        }
        // Direct I/O: no page cache in front of the volume (NBD clients may write it too), and
        // writes of one file run in parallel instead of one at a time under the inode lock.
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        )
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let export = match self.export(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let end = offset
            .saturating_add(u64::from(size))
            .min(export.size_bytes());
        if offset >= end {
            return reply.data(&[]);
        }
        READ_BUFFER.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            match self
                .gate
                .pass(|| self.read_range(export.as_ref(), offset, end, &mut buffer))
            {
                Ok(range) => {
                    Stats::count(&self.stats.reads, &self.stats.read_bytes, range.len());
                    reply.data(&buffer[range])
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let export = match self.export(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        if export.read_only() {
            return reply.error(Errno::EROFS);
        }
        let size = export.size_bytes();
        if offset >= size {
            return reply.error(if data.is_empty() {
                Errno::EINVAL
            } else {
                Errno::ENOSPC
            });
        }
        // A write running past the end writes what fits (a short write, as on a block device).
        let fits = (size - offset).min(data.len() as u64) as usize;
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        match self
            .gate
            .pass(|| self.write_range(export.as_ref(), offset, &data[..fits], fua))
        {
            Ok(()) => {
                Stats::count(&self.stats.writes, &self.stats.write_bytes, fits);
                reply.written(fits as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(): like a block device, closing flushes nothing; fsync does.
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let export = match self.export(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        match self.gate.pass(|| export.flush()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let export = match self.export(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let size = export.size_bytes();
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EINVAL);
        };
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let op = mode & !libc::FALLOC_FL_KEEP_SIZE;
        if end > size && !keep_size {
            // Allocating past the end would grow the file (with KEEP_SIZE it would not).
            return reply.error(Errno::EFBIG);
        }
        let end = end.min(size);
        if op != 0 && export.read_only() {
            return reply.error(Errno::EROFS);
        }
        let result = self.gate.pass(|| match op {
            // Plain allocation: every byte of a volume is already backed.
            0 => Ok(()),
            // Not a trim: a trim may leave partly covered blocks as they were, and a punched
            // hole must read back as zeroes. Zeroes that may be unmapped are exactly that.
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => {
                self.zero_range(export.as_ref(), offset, end, |o, l| {
                    export.write_zeroes(o, l, false, false)
                })
            }
            libc::FALLOC_FL_ZERO_RANGE => self.zero_range(export.as_ref(), offset, end, |o, l| {
                export.write_zeroes(o, l, true, false)
            }),
            _ => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if u64::from(ino) == ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty())
        } else {
            reply.error(Errno::ENOTDIR)
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if u64::from(ino) != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
        ]
        .into_iter()
        .chain(
            self.exports
                .iter()
                .enumerate()
                .map(|(i, e)| (FIRST_FILE + i as u64, FileType::RegularFile, e.name())),
        );
        for (i, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        let sectors: u64 = self.shapes.iter().map(|(size, _)| size / SECTOR).sum();
        reply.statfs(
            sectors,
            0,
            0,
            self.exports.len() as u64 + 1,
            0,
            SECTOR as u32,
            255,
            SECTOR as u32,
        );
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        // Volumes are made with `lograid volume create`.
        reply.error(Errno::EPERM)
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM)
    }
}
