//! The volumes as files: the fuser [`Filesystem`] that answers the kernel's requests on a root
//! directory holding one regular file per [`Export`], named after it.
//!
//! Owns: inode numbers and attributes (sizes and modes taken at mount), the settings asked of
//! the kernel (asynchronous direct I/O, 1 MiB requests, more requests in flight), and the
//! translation of each request into export calls: read, write (`O_SYNC`/`O_DSYNC` as FUA, a
//! write running past the end cut short), fsync as flush, `fallocate` punch-hole as zeroes that
//! may be unmapped and zero-range as zeroes that stay allocated; and the refusals (truncation,
//! `O_TRUNC` included, owner and mode changes, writes to a read-only export, create, unlink).
//! Must never: call an export except through the [`Gate`] (it keeps requests away from the pool
//! once unmounting starts), call one for attributes, grow or shrink a file, or answer a request
//! after the export refused it.

use std::ffi::OsStr;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use lograid_nbd::Export;

use crate::connection::Probe;
use crate::gate::Gate;
use crate::sectors::{read_range, Edges, SECTOR};
use crate::stats::Stats;

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

/// The filesystem: a root directory holding one file per export.
pub(crate) struct VolumeFiles {
    exports: Vec<Arc<dyn Export>>,
    /// Each export's size and read-only flag, taken at mount: attributes are answered without
    /// calling an export (also after the mount ended).
    shapes: Vec<(u64, bool)>,
    mounted_at: SystemTime,
    uid: u32,
    gid: u32,
    /// Serialises the read-modify-write of partly covered 512-byte sectors.
    edges: Edges,
    stats: Arc<Stats>,
    gate: Arc<Gate>,
    /// The name looked up to identify our mount (answered "no such file").
    probe: Arc<Probe>,
}

thread_local! {
    /// Each request thread's read buffer, reused from request to request.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The errno that answers `error`: its OS error code, else one for its kind.
fn errno(error: &io::Error) -> Errno {
    match error.raw_os_error() {
        Some(code) if code > 0 => Errno::from_i32(code),
        _ => Errno::from(error.kind()),
    }
}

impl VolumeFiles {
    /// The files of `exports`, passing their calls through `gate` and counting them in `stats`,
    /// noting lookups of `probe`.
    pub(crate) fn new(
        exports: Vec<Arc<dyn Export>>,
        gate: Arc<Gate>,
        stats: Arc<Stats>,
        probe: Arc<Probe>,
    ) -> Self {
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
            edges: Edges::default(),
            stats,
            gate,
            probe,
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
        if self.probe.is_probe(name) {
            return reply.error(Errno::ENOENT);
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
                .pass(|| read_range(export.as_ref(), offset, end, &mut buffer))
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
        match self.gate.pass(|| {
            self.edges
                .write_range(export.as_ref(), offset, &data[..fits], fua)
        }) {
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
                self.edges.zero_range(export.as_ref(), offset, end, |o, l| {
                    export.write_zeroes(o, l, false, false)
                })
            }
            libc::FALLOC_FL_ZERO_RANGE => {
                self.edges.zero_range(export.as_ref(), offset, end, |o, l| {
                    export.write_zeroes(o, l, true, false)
                })
            }
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
