//! NFSv3 (RFC 1813) on the wire: program, procedure and status numbers, the arguments of the
//! procedures this server serves, and the encoding of attributes and weak cache consistency
//! data.
//!
//! Owns: turning argument bytes into typed arguments (every length checked, every variable
//! part bounded) and typed results into bytes. Must never: do I/O, or panic on any input.

use crate::handle::MAX_HANDLE_BYTES;
use crate::xdr::{XdrError, XdrReader, XdrWriter};

pub const PROGRAM: u32 = 100_003;
pub const VERSION: u32 = 3;

pub const PROC_NULL: u32 = 0;
pub const PROC_GETATTR: u32 = 1;
pub const PROC_SETATTR: u32 = 2;
pub const PROC_LOOKUP: u32 = 3;
pub const PROC_ACCESS: u32 = 4;
pub const PROC_READLINK: u32 = 5;
pub const PROC_READ: u32 = 6;
pub const PROC_WRITE: u32 = 7;
pub const PROC_CREATE: u32 = 8;
pub const PROC_MKDIR: u32 = 9;
pub const PROC_SYMLINK: u32 = 10;
pub const PROC_MKNOD: u32 = 11;
pub const PROC_REMOVE: u32 = 12;
pub const PROC_RMDIR: u32 = 13;
pub const PROC_RENAME: u32 = 14;
pub const PROC_LINK: u32 = 15;
pub const PROC_READDIR: u32 = 16;
pub const PROC_READDIRPLUS: u32 = 17;
pub const PROC_FSSTAT: u32 = 18;
pub const PROC_FSINFO: u32 = 19;
pub const PROC_PATHCONF: u32 = 20;
pub const PROC_COMMIT: u32 = 21;

/// The procedures' names, by number (for counters and logs).
pub const PROCEDURE_NAMES: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

/// `nfsstat3` values this server sends.
pub const NFS3_OK: u32 = 0;
pub const NFS3ERR_PERM: u32 = 1;
pub const NFS3ERR_NOENT: u32 = 2;
pub const NFS3ERR_IO: u32 = 5;
pub const NFS3ERR_ACCES: u32 = 13;
pub const NFS3ERR_NOTDIR: u32 = 20;
pub const NFS3ERR_ISDIR: u32 = 21;
pub const NFS3ERR_INVAL: u32 = 22;
pub const NFS3ERR_FBIG: u32 = 27;
pub const NFS3ERR_NOSPC: u32 = 28;
pub const NFS3ERR_ROFS: u32 = 30;
pub const NFS3ERR_NAMETOOLONG: u32 = 63;
pub const NFS3ERR_STALE: u32 = 70;
pub const NFS3ERR_BADHANDLE: u32 = 10001;
pub const NFS3ERR_NOT_SYNC: u32 = 10002;
pub const NFS3ERR_TOOSMALL: u32 = 10005;
pub const NFS3ERR_SERVERFAULT: u32 = 10006;

/// `ftype3`.
pub const NF3REG: u32 = 1;
pub const NF3DIR: u32 = 2;

/// `stable_how`.
pub const UNSTABLE: u32 = 0;
pub const DATA_SYNC: u32 = 1;
pub const FILE_SYNC: u32 = 2;

/// ACCESS bits.
pub const ACCESS_READ: u32 = 0x01;
pub const ACCESS_LOOKUP: u32 = 0x02;
pub const ACCESS_MODIFY: u32 = 0x04;
pub const ACCESS_EXTEND: u32 = 0x08;
pub const ACCESS_DELETE: u32 = 0x10;
pub const ACCESS_EXECUTE: u32 = 0x20;

/// FSINFO properties.
pub const FSF3_HOMOGENEOUS: u32 = 0x08;
pub const FSF3_CANSETTIME: u32 = 0x10;

/// Longest name a LOOKUP may carry before it is garbage rather than too long a name.
const MAX_NAME_WIRE_BYTES: u32 = 1024;

/// The attributes of a file or directory (`fattr3`), times in whole seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fattr {
    pub file_type: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub used: u64,
    pub fsid: u64,
    pub file_id: u64,
    pub atime: u32,
    pub mtime: u32,
    pub ctime: u32,
}

impl Fattr {
    /// What weak cache consistency data carries of these attributes.
    pub fn wcc(&self) -> WccAttr {
        WccAttr {
            size: self.size,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }
}

/// `wcc_attr`: size and times before an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WccAttr {
    pub size: u64,
    pub mtime: u32,
    pub ctime: u32,
}

fn put_time(out: &mut Vec<u8>, secs: u32) {
    out.put_u32(secs);
    out.put_u32(0);
}

pub fn put_fattr(out: &mut Vec<u8>, attr: &Fattr) {
    out.put_u32(attr.file_type);
    out.put_u32(attr.mode);
    out.put_u32(attr.nlink);
    out.put_u32(attr.uid);
    out.put_u32(attr.gid);
    out.put_u64(attr.size);
    out.put_u64(attr.used);
    out.put_u32(0); // rdev: specdata1
    out.put_u32(0); // rdev: specdata2
    out.put_u64(attr.fsid);
    out.put_u64(attr.file_id);
    put_time(out, attr.atime);
    put_time(out, attr.mtime);
    put_time(out, attr.ctime);
}

/// `post_op_attr`.
pub fn put_post_op_attr(out: &mut Vec<u8>, attr: Option<&Fattr>) {
    out.put_bool(attr.is_some());
    if let Some(attr) = attr {
        put_fattr(out, attr);
    }
}

/// `wcc_data`: what the object was before and is after.
pub fn put_wcc(out: &mut Vec<u8>, before: Option<WccAttr>, after: Option<&Fattr>) {
    out.put_bool(before.is_some());
    if let Some(before) = before {
        out.put_u64(before.size);
        put_time(out, before.mtime);
        put_time(out, before.ctime);
    }
    put_post_op_attr(out, after);
}

/// `post_op_fh3` with a handle.
pub fn put_post_op_handle(out: &mut Vec<u8>, handle: &[u8]) {
    out.put_bool(true);
    out.put_opaque(handle);
}

/// An `nfs_fh3`.
pub fn handle<'a>(reader: &mut XdrReader<'a>) -> Result<&'a [u8], XdrError> {
    reader.opaque(MAX_HANDLE_BYTES)
}

/// How SETATTR sets a time (`set_atime`, `set_mtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    DontChange,
    ServerTime,
    ClientTime(u32),
}

/// Arguments of SETATTR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetattrArgs<'a> {
    pub handle: &'a [u8],
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
    /// `guard`: the ctime the client expects the object to have (seconds, nanoseconds).
    pub guard_ctime: Option<(u32, u32)>,
}

fn optional_u32(reader: &mut XdrReader<'_>) -> Result<Option<u32>, XdrError> {
    Ok(if reader.bool()? {
        Some(reader.u32()?)
    } else {
        None
    })
}

fn set_time(reader: &mut XdrReader<'_>) -> Result<SetTime, XdrError> {
    match reader.u32()? {
        0 => Ok(SetTime::DontChange),
        1 => Ok(SetTime::ServerTime),
        2 => {
            let secs = reader.u32()?;
            reader.u32()?;
            Ok(SetTime::ClientTime(secs))
        }
        other => Err(XdrError::BadEnum(other)),
    }
}

pub fn setattr_args<'a>(reader: &mut XdrReader<'a>) -> Result<SetattrArgs<'a>, XdrError> {
    let handle = handle(reader)?;
    let mode = optional_u32(reader)?;
    let uid = optional_u32(reader)?;
    let gid = optional_u32(reader)?;
    let size = if reader.bool()? {
        Some(reader.u64()?)
    } else {
        None
    };
    let atime = set_time(reader)?;
    let mtime = set_time(reader)?;
    let guard_ctime = if reader.bool()? {
        Some((reader.u32()?, reader.u32()?))
    } else {
        None
    };
    Ok(SetattrArgs {
        handle,
        mode,
        uid,
        gid,
        size,
        atime,
        mtime,
        guard_ctime,
    })
}

/// `diropargs3`: a directory and a name in it.
pub fn dirop_args<'a>(reader: &mut XdrReader<'a>) -> Result<(&'a [u8], &'a [u8]), XdrError> {
    let dir = handle(reader)?;
    let name = reader.opaque(MAX_NAME_WIRE_BYTES)?;
    Ok((dir, name))
}

/// Arguments of READ and COMMIT: a file, an offset and a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeArgs<'a> {
    pub handle: &'a [u8],
    pub offset: u64,
    pub count: u32,
}

pub fn range_args<'a>(reader: &mut XdrReader<'a>) -> Result<RangeArgs<'a>, XdrError> {
    Ok(RangeArgs {
        handle: handle(reader)?,
        offset: reader.u64()?,
        count: reader.u32()?,
    })
}

/// Arguments of WRITE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteArgs<'a> {
    pub handle: &'a [u8],
    pub offset: u64,
    pub count: u32,
    pub stable: u32,
    pub data: &'a [u8],
}

pub fn write_args<'a>(reader: &mut XdrReader<'a>) -> Result<WriteArgs<'a>, XdrError> {
    Ok(WriteArgs {
        handle: handle(reader)?,
        offset: reader.u64()?,
        count: reader.u32()?,
        stable: reader.u32()?,
        data: reader.opaque(u32::MAX)?,
    })
}

/// Arguments of READDIR (`max_bytes` = `count`) and READDIRPLUS (`max_bytes` = `maxcount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaddirArgs<'a> {
    pub handle: &'a [u8],
    pub cookie: u64,
    pub max_bytes: u32,
}

pub fn readdir_args<'a>(
    reader: &mut XdrReader<'a>,
    plus: bool,
) -> Result<ReaddirArgs<'a>, XdrError> {
    let handle = handle(reader)?;
    let cookie = reader.u64()?;
    reader.opaque_fixed(8)?;
    let mut max_bytes = reader.u32()?;
    if plus {
        // dircount bounds the names and cookies only; maxcount bounds the whole reply.
        max_bytes = reader.u32()?;
    }
    Ok(ReaddirArgs {
        handle,
        cookie,
        max_bytes,
    })
}

/// Bytes of one directory entry in a READDIR(PLUS) reply.
pub fn entry_bytes(name: &str, plus: bool) -> usize {
    let base = 4 + 8 + 4 + name.len() + crate::xdr::padding(name.len()) + 8;
    if plus {
        // post_op_attr with attributes, post_op_fh3 with a handle.
        base + 4 + 84 + 4 + 4 + crate::handle::HANDLE_BYTES
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fattr_is_84_bytes_and_wcc_is_as_specified() {
        let attr = Fattr {
            file_type: NF3REG,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 4096,
            used: 4096,
            fsid: 1,
            file_id: 2,
            atime: 3,
            mtime: 4,
            ctime: 5,
        };
        let mut out = Vec::new();
        put_fattr(&mut out, &attr);
        assert_eq!(out.len(), 84);
        let mut wcc = Vec::new();
        put_wcc(&mut wcc, Some(attr.wcc()), Some(&attr));
        assert_eq!(wcc.len(), 4 + 24 + 4 + 84);
    }

    #[test]
    fn setattr_parses_every_field() {
        let mut out = Vec::new();
        out.put_opaque(&[7; 28]);
        for value in [1, 0o600, 0, 1, 5] {
            out.put_u32(value);
        }
        out.put_bool(true);
        out.put_u64(1 << 40);
        out.put_u32(1);
        out.put_u32(2);
        out.put_u32(99);
        out.put_u32(0);
        out.put_bool(true);
        out.put_u32(10);
        out.put_u32(11);
        let args = setattr_args(&mut XdrReader::new(&out)).unwrap();
        assert_eq!(args.mode, Some(0o600));
        assert_eq!(args.uid, None);
        assert_eq!(args.gid, Some(5));
        assert_eq!(args.size, Some(1 << 40));
        assert_eq!(args.atime, SetTime::ServerTime);
        assert_eq!(args.mtime, SetTime::ClientTime(99));
        assert_eq!(args.guard_ctime, Some((10, 11)));
        for cut in 0..out.len() {
            assert!(setattr_args(&mut XdrReader::new(&out[..cut])).is_err());
        }
    }
}
