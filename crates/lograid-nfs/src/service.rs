//! Answers one RPC record: routes the call to NFSv3 or MOUNT, parses its arguments, runs it
//! against the [`Namespace`] (and through it the volumes' exports) and encodes the reply.
//!
//! Owns: what every procedure means for this export (a root directory with one fixed-size file
//! per volume): the durability of WRITE (UNSTABLE is the export's write, acknowledged from
//! memory until a COMMIT, which is the export's flush; DATA_SYNC and FILE_SYNC are writes with
//! FUA), the refusal of anything that would change a file's size or the directory, and the
//! mapping of export errors to NFS status codes. Runs on a blocking thread. Must never:
//! acknowledge a write the export did not take, answer a COMMIT before the flush returned,
//! act on a call whose arguments did not parse, or panic on any record.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use lograid_nbd::sectors;

use crate::files::{now_secs, Namespace, VolumeFile, NAME_MAX};
use crate::handle::{self, HandleError, Node};
use crate::mount;
use crate::nfs3::*;
use crate::rpc::{self, CallError, ReplyBuf};
use crate::xdr::{XdrError, XdrReader, XdrWriter};

/// What became of a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this (a complete record, mark included).
    Reply(Vec<u8>),
    /// Not an RPC call: nothing can be answered; close the connection.
    Close(String),
}

/// Request counters of a server (all connections).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    pub calls: AtomicU64,
    /// Calls answered with an NFS error status, or refused at the RPC level.
    pub errors: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub commits: AtomicU64,
    /// Calls by NFSv3 procedure (indexed by its number), whatever their outcome.
    pub nfs_calls: [AtomicU64; NFS_PROCEDURES],
    /// Calls by MOUNT v3 procedure.
    pub mount_calls: [AtomicU64; MOUNT_PROCEDURES],
    /// Calls to programs, versions or procedures not served (NFSACL, NLM, the portmapper).
    pub unserved_calls: AtomicU64,
}

/// How many procedures NFSv3 and MOUNT v3 have.
pub const NFS_PROCEDURES: usize = crate::nfs3::PROCEDURE_NAMES.len();
pub const MOUNT_PROCEDURES: usize = mount::PROCEDURE_NAMES.len();

/// Largest READ and WRITE served (`rtmax`, `wtmax`).
pub const MAX_IO_BYTES: u32 = 1 << 20;

/// The procedures of one export.
pub struct Service {
    pub namespace: Namespace,
    pub counters: ServiceCounters,
}

/// An NFS status and the attributes to send with it, or success.
type NfsResult<T> = Result<T, u32>;

/// Maps an export's error to an NFS status.
pub fn status_of(error: &io::Error) -> u32 {
    if let Some(code) = error.raw_os_error() {
        return match code {
            libc::EROFS | libc::EPERM | libc::EACCES => NFS3ERR_ROFS,
            libc::ENOSPC | libc::EDQUOT => NFS3ERR_NOSPC,
            libc::EFBIG => NFS3ERR_FBIG,
            libc::EINVAL => NFS3ERR_INVAL,
            _ => NFS3ERR_IO,
        };
    }
    match error.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => NFS3ERR_ROFS,
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => NFS3ERR_NOSPC,
        io::ErrorKind::FileTooLarge => NFS3ERR_FBIG,
        io::ErrorKind::InvalidInput => NFS3ERR_INVAL,
        _ => NFS3ERR_IO,
    }
}

impl Service {
    pub fn new(namespace: Namespace) -> Service {
        Service {
            namespace,
            counters: ServiceCounters::default(),
        }
    }

    /// Answers one complete record (the fragments joined, marks removed).
    pub fn handle_record(&self, record: &[u8]) -> Outcome {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let call = match rpc::parse_call(record) {
            Ok(call) => call,
            Err(CallError::Refused { xid, reason, reply }) => {
                tracing::info!(xid, %reason, "call refused");
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Outcome::Reply(reply);
            }
            Err(error) => return Outcome::Close(error.to_string()),
        };
        let reply = catch_unwind(AssertUnwindSafe(|| self.route(&call))).unwrap_or_else(|_| {
            tracing::error!(
                xid = call.xid,
                procedure = call.procedure,
                "NFS call panicked"
            );
            rpc::accepted(call.xid, rpc::SYSTEM_ERR)
        });
        Outcome::Reply(reply.finish())
    }

    /// Counts `call` under its procedure.
    fn count(&self, call: &rpc::Call<'_>) {
        let procedure = usize::try_from(call.procedure).unwrap_or(usize::MAX);
        let counter = match (call.program, call.version) {
            (PROGRAM, VERSION) => self.counters.nfs_calls.get(procedure),
            (mount::PROGRAM, mount::VERSION) => self.counters.mount_calls.get(procedure),
            _ => None,
        };
        counter
            .unwrap_or(&self.counters.unserved_calls)
            .fetch_add(1, Ordering::Relaxed);
    }

    fn route(&self, call: &rpc::Call<'_>) -> ReplyBuf {
        self.count(call);
        let xid = call.xid;
        match (call.program, call.version) {
            (PROGRAM, VERSION) if call.procedure <= PROC_COMMIT => {
                let capacity = reply_capacity(call);
                let id = (xid, call.program, call.procedure);
                self.answer(id, capacity, call.args, |args, out| {
                    self.nfs(call.procedure, args, out)
                })
            }
            (mount::PROGRAM, mount::VERSION) if mount::known(call.procedure) => {
                let id = (xid, call.program, call.procedure);
                self.answer(id, 256, call.args, |args, out| {
                    mount::serve(&self.namespace, call.procedure, args, out)
                })
            }
            (PROGRAM, VERSION) | (mount::PROGRAM, mount::VERSION) => {
                self.refuse(call, rpc::PROC_UNAVAIL)
            }
            (PROGRAM, _) => rpc::prog_mismatch(xid, VERSION, VERSION),
            (mount::PROGRAM, _) => rpc::prog_mismatch(xid, mount::VERSION, mount::VERSION),
            // NFSACL, NLM, the portmapper and the rest are not served.
            _ => self.refuse(call, rpc::PROG_UNAVAIL),
        }
    }

    fn refuse(&self, call: &rpc::Call<'_>, accept_stat: u32) -> ReplyBuf {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            xid = call.xid,
            program = call.program,
            version = call.version,
            procedure = call.procedure,
            accept_stat,
            "call refused"
        );
        rpc::accepted(call.xid, accept_stat)
    }

    /// A SUCCESS reply with what `serve` appends, or GARBAGE_ARGS if the arguments did not
    /// parse (procedures parse all their arguments before they act).
    fn answer(
        &self,
        (xid, program, procedure): (u32, u32, u32),
        capacity: usize,
        args: &[u8],
        serve: impl FnOnce(&mut XdrReader<'_>, &mut Vec<u8>) -> Result<(), XdrError>,
    ) -> ReplyBuf {
        let mut reply = rpc::accepted_with_capacity(xid, rpc::SUCCESS, capacity);
        let results_start = reply.bytes.len();
        match serve(&mut XdrReader::new(args), &mut reply.bytes) {
            Ok(()) => {
                let status = reply.bytes.get(results_start..results_start + 4);
                if let Some(status) = status.filter(|status| *status != [0, 0, 0, 0]) {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    let status = u32::from_be_bytes([status[0], status[1], status[2], status[3]]);
                    tracing::debug!(
                        xid,
                        program,
                        procedure,
                        status,
                        "answered with an error status"
                    );
                }
                reply
            }
            Err(error) => {
                tracing::info!(xid, program, procedure, %error, "arguments do not parse");
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                rpc::accepted(xid, rpc::GARBAGE_ARGS)
            }
        }
    }

    fn nfs(
        &self,
        procedure: u32,
        args: &mut XdrReader<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), XdrError> {
        match procedure {
            PROC_NULL => Ok(()),
            PROC_GETATTR => self.getattr(handle(args)?, out),
            PROC_SETATTR => self.setattr(&setattr_args(args)?, out),
            PROC_LOOKUP => self.lookup(dirop_args(args)?, out),
            PROC_ACCESS => self.access(handle(args)?, args.u32()?, out),
            PROC_READ => self.read(range_args(args)?, out),
            PROC_WRITE => self.write(write_args(args)?, out),
            PROC_READDIR => self.readdir(readdir_args(args, false)?, false, out),
            PROC_READDIRPLUS => self.readdir(readdir_args(args, true)?, true, out),
            PROC_FSSTAT => self.fsstat(handle(args)?, out),
            PROC_FSINFO => self.fsinfo(handle(args)?, out),
            PROC_PATHCONF => self.pathconf(handle(args)?, out),
            PROC_COMMIT => self.commit(range_args(args)?, out),
            _ => {
                unchanging(procedure, out);
                Ok(())
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Handles and attributes
    // -----------------------------------------------------------------------------------------

    fn resolve(&self, raw: &[u8]) -> NfsResult<Node> {
        match handle::decode(self.namespace.pool_uuid(), raw) {
            Ok(Node::Root) => Ok(Node::Root),
            Ok(Node::Volume(id)) if self.namespace.file(id).is_some() => Ok(Node::Volume(id)),
            // A volume deleted (or not served) since the handle was given out.
            Ok(Node::Volume(_)) | Err(HandleError::OtherPool) => Err(NFS3ERR_STALE),
            Err(HandleError::Bad) => Err(NFS3ERR_BADHANDLE),
        }
    }

    /// The file a handle names, or the status to answer (ISDIR for the root).
    fn resolve_file(&self, raw: &[u8]) -> NfsResult<&VolumeFile> {
        match self.resolve(raw)? {
            Node::Root => Err(NFS3ERR_ISDIR),
            Node::Volume(id) => self.namespace.file(id).ok_or(NFS3ERR_STALE),
        }
    }

    /// The directory a handle names; otherwise writes the failure (NOTDIR with the file's
    /// attributes, or the handle's error) and returns `None`.
    fn resolve_dir(&self, raw: &[u8], out: &mut Vec<u8>) -> Option<Node> {
        match self.resolve(raw) {
            Ok(Node::Root) => Some(Node::Root),
            Ok(node) => {
                out.put_u32(NFS3ERR_NOTDIR);
                put_post_op_attr(out, Some(&self.attributes(node)));
                None
            }
            Err(status) => {
                out.put_u32(status);
                put_post_op_attr(out, None);
                None
            }
        }
    }

    fn attributes(&self, node: Node) -> Fattr {
        let (uid, gid) = self.namespace.owner();
        let mut attr = Fattr {
            file_type: NF3DIR,
            mode: 0o755,
            nlink: 2,
            uid,
            gid,
            size: 4096,
            used: 4096,
            fsid: self.namespace.fsid(),
            file_id: Namespace::file_id(node),
            atime: self.namespace.started_secs(),
            mtime: self.namespace.started_secs(),
            ctime: self.namespace.started_secs(),
        };
        if let Node::Volume(id) = node {
            if let Some(file) = self.namespace.file(id) {
                attr = self.file_attributes(file, attr);
            }
        }
        attr
    }

    fn file_attributes(&self, file: &VolumeFile, base: Fattr) -> Fattr {
        let modified = file.modified_secs();
        Fattr {
            file_type: NF3REG,
            mode: if file.read_only { 0o444 } else { 0o666 },
            nlink: 1,
            size: file.size_bytes(),
            used: file.size_bytes(),
            atime: modified,
            mtime: modified,
            ctime: modified,
            ..base
        }
    }

    fn file_attr(&self, file: &VolumeFile) -> Fattr {
        self.attributes(Node::Volume(file.volume_id))
    }

    // -----------------------------------------------------------------------------------------
    // Procedures
    // -----------------------------------------------------------------------------------------

    fn getattr(&self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), XdrError> {
        match self.resolve(raw) {
            Ok(node) => {
                out.put_u32(NFS3_OK);
                put_fattr(out, &self.attributes(node));
            }
            Err(status) => out.put_u32(status),
        }
        Ok(())
    }

    fn setattr(&self, args: &SetattrArgs<'_>, out: &mut Vec<u8>) -> Result<(), XdrError> {
        let node = match self.resolve(args.handle) {
            Ok(node) => node,
            Err(status) => {
                out.put_u32(status);
                put_wcc(out, None, None);
                return Ok(());
            }
        };
        let before = self.attributes(node);
        let status = match self.check_setattr(node, &before, args) {
            Ok(()) => {
                self.apply_times(node, args);
                NFS3_OK
            }
            Err(status) => status,
        };
        out.put_u32(status);
        put_wcc(out, Some(before.wcc()), Some(&self.attributes(node)));
        Ok(())
    }

    /// Whether SETATTR may do what it asks: no size change (files are fixed-size: larger is
    /// FBIG, smaller INVAL), no other mode or owner (PERM), nothing on a read-only file (ROFS),
    /// and the guard's ctime must match (NOT_SYNC).
    fn check_setattr(&self, node: Node, now: &Fattr, args: &SetattrArgs<'_>) -> NfsResult<()> {
        if let Some((secs, _)) = args.guard_ctime {
            if secs != now.ctime {
                return Err(NFS3ERR_NOT_SYNC);
            }
        }
        let changes_anything = args.size.is_some_and(|size| size != now.size)
            || args.mode.is_some_and(|mode| mode != now.mode)
            || args.uid.is_some_and(|uid| uid != now.uid)
            || args.gid.is_some_and(|gid| gid != now.gid)
            || args.mtime != SetTime::DontChange
            || args.atime != SetTime::DontChange;
        let read_only = match node {
            Node::Root => false,
            Node::Volume(id) => self.namespace.file(id).is_none_or(|file| file.read_only),
        };
        if read_only && changes_anything {
            return Err(NFS3ERR_ROFS);
        }
        if let Some(size) = args.size.filter(|&size| size != now.size) {
            return Err(match node {
                Node::Root => NFS3ERR_ISDIR,
                Node::Volume(_) if size > now.size => NFS3ERR_FBIG,
                Node::Volume(_) => NFS3ERR_INVAL,
            });
        }
        let owner_change = args.mode.is_some_and(|mode| mode != now.mode)
            || args.uid.is_some_and(|uid| uid != now.uid)
            || args.gid.is_some_and(|gid| gid != now.gid);
        if owner_change {
            return Err(NFS3ERR_PERM);
        }
        Ok(())
    }

    /// Sets a file's modification time as asked (the access time is not kept: it reads as
    /// the modification time). The root's times are the server's start.
    fn apply_times(&self, node: Node, args: &SetattrArgs<'_>) {
        let Node::Volume(id) = node else { return };
        let Some(file) = self.namespace.file(id) else {
            return;
        };
        match args.mtime {
            SetTime::DontChange => {}
            SetTime::ServerTime => file.set_modified(now_secs()),
            SetTime::ClientTime(secs) => file.set_modified(secs),
        }
    }

    fn lookup(&self, (dir, name): (&[u8], &[u8]), out: &mut Vec<u8>) -> Result<(), XdrError> {
        let Some(dir_node) = self.resolve_dir(dir, out) else {
            return Ok(());
        };
        let dir_attr = self.attributes(dir_node);
        let found = if name.len() > NAME_MAX as usize {
            Err(NFS3ERR_NAMETOOLONG)
        } else {
            self.namespace.lookup(name).ok_or(NFS3ERR_NOENT)
        };
        match found {
            Ok(node) => {
                out.put_u32(NFS3_OK);
                out.put_opaque(&self.namespace.handle_of(node));
                put_post_op_attr(out, Some(&self.attributes(node)));
                put_post_op_attr(out, Some(&dir_attr));
            }
            Err(status) => {
                out.put_u32(status);
                put_post_op_attr(out, Some(&dir_attr));
            }
        }
        Ok(())
    }

    fn access(&self, raw: &[u8], asked: u32, out: &mut Vec<u8>) -> Result<(), XdrError> {
        let node = match self.resolve(raw) {
            Ok(node) => node,
            Err(status) => {
                out.put_u32(status);
                put_post_op_attr(out, None);
                return Ok(());
            }
        };
        // No permission checks beyond what the object allows anyone: the server has no
        // authentication (credentials are whatever the client claims).
        let granted = match node {
            Node::Root => ACCESS_READ | ACCESS_LOOKUP | ACCESS_EXECUTE,
            Node::Volume(id) => match self.namespace.file(id) {
                Some(file) if !file.read_only => ACCESS_READ | ACCESS_MODIFY | ACCESS_EXTEND,
                _ => ACCESS_READ,
            },
        };
        out.put_u32(NFS3_OK);
        put_post_op_attr(out, Some(&self.attributes(node)));
        out.put_u32(asked & granted);
        Ok(())
    }

    fn read(&self, args: RangeArgs<'_>, out: &mut Vec<u8>) -> Result<(), XdrError> {
        let file = match self.resolve_file(args.handle) {
            Ok(file) => file,
            Err(status) => {
                out.put_u32(status);
                put_post_op_attr(out, None);
                return Ok(());
            }
        };
        let size = file.size_bytes();
        let start = args.offset.min(size);
        let count = u64::from(args.count.min(MAX_IO_BYTES)).min(size - start);
        // The attributes go first on the wire: encode them into place, then the data.
        let status_at = out.len();
        out.put_u32(NFS3_OK);
        put_post_op_attr(out, Some(&self.file_attr(file)));
        out.put_u32(count as u32);
        out.put_bool(start + count >= size);
        out.put_u32(count as u32);
        let data_at = out.len();
        out.resize(data_at + count as usize, 0);
        if let Err(error) = sectors::read(file.export.as_ref(), start, &mut out[data_at..]) {
            tracing::debug!(volume = file.name(), start, count, %error, "read failed");
            out.truncate(status_at);
            out.put_u32(status_of(&error));
            put_post_op_attr(out, Some(&self.file_attr(file)));
            return Ok(());
        }
        out.extend_from_slice(&[0u8; 3][..crate::xdr::padding(count as usize)]);
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(count, Ordering::Relaxed);
        Ok(())
    }

    fn write(&self, args: WriteArgs<'_>, out: &mut Vec<u8>) -> Result<(), XdrError> {
        let file = match self.resolve_file(args.handle) {
            Ok(file) => file,
            Err(status) => {
                out.put_u32(status);
                put_wcc(out, None, None);
                return Ok(());
            }
        };
        let before = self.file_attr(file);
        match self.write_file(file, &args) {
            Ok(committed) => {
                out.put_u32(NFS3_OK);
                put_wcc(out, Some(before.wcc()), Some(&self.file_attr(file)));
                out.put_u32(args.count);
                out.put_u32(committed);
                out.put_opaque_fixed(&self.namespace.verifier());
            }
            Err(status) => {
                out.put_u32(status);
                put_wcc(out, Some(before.wcc()), Some(&self.file_attr(file)));
            }
        }
        Ok(())
    }

    /// Writes inside the file; returns how it was committed (UNSTABLE, or FILE_SYNC after a
    /// write with FUA).
    fn write_file(&self, file: &VolumeFile, args: &WriteArgs<'_>) -> NfsResult<u32> {
        if file.read_only {
            return Err(NFS3ERR_ROFS);
        }
        if args.data.len() != args.count as usize || args.stable > FILE_SYNC {
            return Err(NFS3ERR_INVAL);
        }
        let end = args.offset.checked_add(u64::from(args.count));
        if end.is_none_or(|end| end > file.size_bytes()) {
            // The file's size is the volume's: nothing is written past it.
            return Err(NFS3ERR_FBIG);
        }
        let fua = args.stable != UNSTABLE;
        if !args.data.is_empty() {
            let written = sectors::write(
                file.export.as_ref(),
                &file.locks,
                args.offset,
                args.data,
                fua,
            );
            if let Err(error) = written {
                tracing::debug!(volume = file.name(), offset = args.offset, count = args.count, %error, "write failed");
                return Err(status_of(&error));
            }
            file.touch();
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .written_bytes
            .fetch_add(u64::from(args.count), Ordering::Relaxed);
        Ok(if fua { FILE_SYNC } else { UNSTABLE })
    }

    fn commit(&self, args: RangeArgs<'_>, out: &mut Vec<u8>) -> Result<(), XdrError> {
        let file = match self.resolve_file(args.handle) {
            Ok(file) => file,
            Err(status) => {
                out.put_u32(status);
                put_wcc(out, None, None);
                return Ok(());
            }
        };
        let before = self.file_attr(file).wcc();
        // Every write acknowledged before the flush was called is durable when it returns;
        // a read-only file has nothing to flush.
        let flushed = if file.read_only {
            Ok(())
        } else {
            file.export.flush()
        };
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        match flushed {
            Ok(()) => {
                out.put_u32(NFS3_OK);
                put_wcc(out, Some(before), Some(&self.file_attr(file)));
                out.put_opaque_fixed(&self.namespace.verifier());
            }
            Err(error) => {
                tracing::warn!(volume = file.name(), %error, "COMMIT: flush failed");
                out.put_u32(status_of(&error));
                put_wcc(out, Some(before), Some(&self.file_attr(file)));
            }
        }
        Ok(())
    }

    fn readdir(
        &self,
        args: ReaddirArgs<'_>,
        plus: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), XdrError> {
        let Some(node) = self.resolve_dir(args.handle, out) else {
            return Ok(());
        };
        let entries = self.directory_entries();
        let start = usize::try_from(args.cookie).unwrap_or(usize::MAX);
        // status, dir attributes, cookie verifier, end of list, eof.
        let mut budget = (args.max_bytes as usize).saturating_sub(4 + 88 + 8 + 4 + 4);
        let mut taken = Vec::new();
        for (index, (name, entry_node)) in entries.iter().enumerate().skip(start) {
            let cost = entry_bytes(name, plus);
            if cost > budget {
                break;
            }
            budget -= cost;
            taken.push((index, name, *entry_node));
        }
        let eof = start.saturating_add(taken.len()) >= entries.len();
        if taken.is_empty() && !eof {
            out.put_u32(NFS3ERR_TOOSMALL);
            put_post_op_attr(out, Some(&self.attributes(node)));
            return Ok(());
        }
        out.put_u32(NFS3_OK);
        put_post_op_attr(out, Some(&self.attributes(node)));
        out.put_opaque_fixed(&[0u8; 8]);
        for (index, name, entry_node) in taken {
            out.put_bool(true);
            out.put_u64(Namespace::file_id(entry_node));
            out.put_opaque(name.as_bytes());
            out.put_u64(index as u64 + 1);
            if plus {
                put_post_op_attr(out, Some(&self.attributes(entry_node)));
                put_post_op_handle(out, &self.namespace.handle_of(entry_node));
            }
        }
        out.put_bool(false);
        out.put_bool(eof);
        Ok(())
    }

    /// `.`, `..` and the files, in a fixed order (an entry's cookie is its index plus one).
    fn directory_entries(&self) -> Vec<(&str, Node)> {
        let mut entries = vec![(".", Node::Root), ("..", Node::Root)];
        entries.extend(
            self.namespace
                .files
                .iter()
                .map(|file| (file.name(), Node::Volume(file.volume_id))),
        );
        entries
    }

    /// Answers with the root's attributes, or with the handle's error and no attributes.
    fn with_object(
        &self,
        raw: &[u8],
        out: &mut Vec<u8>,
        results: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), XdrError> {
        match self.resolve(raw) {
            Ok(node) => {
                out.put_u32(NFS3_OK);
                put_post_op_attr(out, Some(&self.attributes(node)));
                results(out);
            }
            Err(status) => {
                out.put_u32(status);
                put_post_op_attr(out, None);
            }
        }
        Ok(())
    }

    fn fsstat(&self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), XdrError> {
        let space = self.namespace.space().unwrap_or_default();
        let files = self.namespace.files.len() as u64 + 1;
        self.with_object(raw, out, |out| {
            out.put_u64(space.total_bytes);
            out.put_u64(space.free_bytes);
            out.put_u64(space.free_bytes);
            out.put_u64(files);
            out.put_u64(0);
            out.put_u64(0);
            out.put_u32(0);
        })
    }

    fn fsinfo(&self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), XdrError> {
        let max_file_bytes = self.namespace.max_file_bytes();
        self.with_object(raw, out, |out| {
            for value in [
                MAX_IO_BYTES,
                MAX_IO_BYTES,
                4096,
                MAX_IO_BYTES,
                MAX_IO_BYTES,
                4096,
                4096,
            ] {
                out.put_u32(value);
            }
            out.put_u64(max_file_bytes);
            out.put_u32(1); // time_delta: whole seconds
            out.put_u32(0);
            out.put_u32(FSF3_HOMOGENEOUS | FSF3_CANSETTIME);
        })
    }

    fn pathconf(&self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), XdrError> {
        self.with_object(raw, out, |out| {
            out.put_u32(1); // linkmax
            out.put_u32(NAME_MAX);
            out.put_bool(true); // no_trunc
            out.put_bool(true); // chown_restricted
            out.put_bool(false); // case_insensitive
            out.put_bool(true); // case_preserving
        })
    }
}

/// Room for the results of `call`: a READ's data, a WRITE's weak cache data, or little.
fn reply_capacity(call: &rpc::Call<'_>) -> usize {
    if call.procedure != PROC_READ {
        return 512;
    }
    let count = range_args(&mut XdrReader::new(call.args)).map_or(0, |args| args.count);
    count.min(MAX_IO_BYTES) as usize + 256
}

/// The answer to a procedure that would change the directory or read a link: the export's
/// directory is fixed (ACCES) and holds no links (INVAL), with no attributes.
fn unchanging(procedure: u32, out: &mut Vec<u8>) {
    let (status, empty_words) = match procedure {
        PROC_READLINK => (NFS3ERR_INVAL, 1),
        PROC_RENAME => (NFS3ERR_ACCES, 4),
        PROC_LINK => (NFS3ERR_ACCES, 3),
        // CREATE, MKDIR, SYMLINK, MKNOD: a post_op_fh3-less failure is the directory's
        // wcc_data; REMOVE and RMDIR the same.
        _ => (NFS3ERR_ACCES, 2),
    };
    out.put_u32(status);
    for _ in 0..empty_words {
        out.put_bool(false);
    }
}

#[cfg(test)]
mod tests;
