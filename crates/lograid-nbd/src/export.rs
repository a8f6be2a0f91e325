//! The contract between the NBD server and whatever stores the bytes: the [`Export`] trait, and
//! the mapping of the errors it returns to NBD error values.
//!
//! Owns: what the server promises an export (aligned, in-bounds calls; concurrent calls from a
//! blocking thread pool, and `try_write_now` from its event loop) and what it expects back.
//! Must never: know anything about the engine (this crate has no dependency on it) or about
//! the wire format beyond error numbers.

use std::io;

use crate::proto::{
    NBD_EINVAL, NBD_EIO, NBD_ENOSPC, NBD_ENOTSUP, NBD_EOVERFLOW, NBD_EPERM, NBD_ESHUTDOWN,
};

/// One block device that the server exposes as an NBD export. Implemented by the lograid CLI over
/// an engine volume; all methods are blocking and may be called from many threads at once.
pub trait Export: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn description(&self) -> &str {
        ""
    }
    fn size_bytes(&self) -> u64;
    fn read_only(&self) -> bool {
        false
    }
    /// offset and buf.len() are multiples of 512 and within size (the server checks before calling)
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// fua: the data must be on stable storage before returning
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// A write (no FUA; offset and data.len() are multiples of 512 and within size) taken at
    /// once without blocking the calling thread: no wait for a lock held long, for I/O or for
    /// room. `None` if it would block or be refused: nothing was written, and the server calls
    /// `write` on its blocking pool instead (which says why). `Some(Err)`: taken, then failed.
    /// The server calls this on its event loop, which saves a thread hand-off per request. By
    /// default no write is taken this way.
    fn try_write_now(&self, _offset: u64, _data: &[u8]) -> Option<io::Result<()>> {
        None
    }
    /// A read (offset and buf.len() multiples of 512, within size) done at once without
    /// blocking the calling thread: no wait for a lock held long or for a drive. `None` if it
    /// would block: the server calls `read` on its blocking pool instead (`buf` may hold part
    /// of the data meanwhile). `Some(Err)`: tried, and failed. The server calls this on its
    /// event loop for short reads, which saves a thread hand-off per request. By default no
    /// read is done this way.
    fn try_read_now(&self, _offset: u64, _buf: &mut [u8]) -> Option<io::Result<()>> {
        None
    }
    /// every write that returned before flush() was called is on stable storage when it returns
    fn flush(&self) -> io::Result<()>;
    fn trim(&self, offset: u64, length: u64, fua: bool) -> io::Result<()>;
    /// no_hole: keep the range allocated (zeroes, not a hole)
    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fua: bool) -> io::Result<()>;
    /// Allocation status of [offset, offset+length): a list of (length, Allocation) covering the range
    /// from offset in order (may stop early, at least one extent).
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<(u64, Allocation)>>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    Data,
    /// allocated, reads zero
    Zero,
    /// unallocated, reads zero
    Hole,
}

impl Allocation {
    /// The `base:allocation` status flags of this state.
    pub fn nbd_flags(self) -> u32 {
        use crate::proto::{NBD_STATE_HOLE, NBD_STATE_ZERO};
        match self {
            Allocation::Data => 0,
            Allocation::Zero => NBD_STATE_ZERO,
            Allocation::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
        }
    }
}

/// Maps an error from an export to the NBD error value sent to the client.
///
/// OS error numbers take precedence over the kind; `ENOTSUP` is only passed on for a
/// `WRITE_ZEROES` with `FAST_ZERO` (`allow_enotsup`), the one place the spec allows it, and is
/// `EINVAL` elsewhere. Anything unrecognised is `EIO`.
pub fn nbd_error_from_io(error: &io::Error, allow_enotsup: bool) -> u32 {
    let enotsup = if allow_enotsup {
        NBD_ENOTSUP
    } else {
        NBD_EINVAL
    };
    if let Some(code) = error.raw_os_error() {
        return match code {
            libc::EPERM | libc::EACCES | libc::EROFS => NBD_EPERM,
            libc::EIO => NBD_EIO,
            libc::EINVAL => NBD_EINVAL,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => NBD_ENOSPC,
            libc::EOVERFLOW => NBD_EOVERFLOW,
            libc::ESHUTDOWN => NBD_ESHUTDOWN,
            libc::EOPNOTSUPP => enotsup,
            // ENOMEM is defined by NBD, but the spec asks servers to avoid it.
            _ => NBD_EIO,
        };
    }
    match error.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => NBD_EPERM,
        io::ErrorKind::InvalidInput => NBD_EINVAL,
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge => {
            NBD_ENOSPC
        }
        io::ErrorKind::Unsupported => enotsup,
        _ => NBD_EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_mapping() {
        let os = |code| io::Error::from_raw_os_error(code);
        assert_eq!(nbd_error_from_io(&os(libc::EIO), false), NBD_EIO);
        assert_eq!(nbd_error_from_io(&os(libc::EFBIG), false), NBD_ENOSPC);
        assert_eq!(nbd_error_from_io(&os(libc::EDQUOT), false), NBD_ENOSPC);
        assert_eq!(nbd_error_from_io(&os(libc::EROFS), false), NBD_EPERM);
        assert_eq!(
            nbd_error_from_io(&os(libc::EOVERFLOW), false),
            NBD_EOVERFLOW
        );
        assert_eq!(
            nbd_error_from_io(&os(libc::ESHUTDOWN), false),
            NBD_ESHUTDOWN
        );
        assert_eq!(nbd_error_from_io(&os(libc::EOPNOTSUPP), true), NBD_ENOTSUP);
        assert_eq!(nbd_error_from_io(&os(libc::EOPNOTSUPP), false), NBD_EINVAL);
        assert_eq!(nbd_error_from_io(&os(libc::ENOMEM), false), NBD_EIO);
        assert_eq!(nbd_error_from_io(&io::Error::other("x"), false), NBD_EIO);
        assert_eq!(
            nbd_error_from_io(&io::ErrorKind::StorageFull.into(), false),
            NBD_ENOSPC
        );
        assert_eq!(
            nbd_error_from_io(&io::ErrorKind::InvalidInput.into(), false),
            NBD_EINVAL
        );
        assert_eq!(
            nbd_error_from_io(&io::ErrorKind::PermissionDenied.into(), false),
            NBD_EPERM
        );
    }
}
