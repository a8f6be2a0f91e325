//! The engine's error type. Every error says what failed and where; each maps
//! to an errno so front ends (NBD) can answer with the protocol's code.

use crate::format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
    #[error("{context}: {cause}")]
    Format { context: String, cause: FormatError },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("request [{offset}, +{length}) is not aligned to 512 bytes")]
    Misaligned { offset: u64, length: u64 },
    #[error("request [{offset}, +{length}) is outside volume '{volume}' of {size} bytes")]
    OutOfRange {
        volume: String,
        offset: u64,
        length: u64,
        size: u64,
    },
    #[error("pool is full: no space for new blocks (trim or delete data, or add a drive)")]
    NoSpace,
    #[error("pool is read-only: {0}")]
    ReadOnly(String),
    #[error("volume '{volume}' offset {offset}: data is unreadable and cannot be rebuilt from parity ({detail})")]
    Unrecoverable {
        volume: String,
        offset: u64,
        detail: String,
    },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    Exists(String),
    #[error("{0}")]
    Refused(String),
    #[error("pool metadata is inconsistent: {0}")]
    Corrupt(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(context: impl Into<String>, cause: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            cause,
        }
    }
    pub fn format(context: impl Into<String>, cause: FormatError) -> Error {
        Error::Format {
            context: context.into(),
            cause,
        }
    }
    /// The errno a block-device front end should report.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { cause, .. } => cause.raw_os_error().unwrap_or(libc::EIO),
            Error::Format { .. } | Error::Unrecoverable { .. } | Error::Corrupt(_) => libc::EIO,
            Error::InvalidArgument(_) | Error::Misaligned { .. } => libc::EINVAL,
            Error::OutOfRange { .. } => libc::EINVAL,
            Error::NoSpace => libc::ENOSPC,
            Error::ReadOnly(_) => libc::EROFS,
            Error::NotFound(_) => libc::ENOENT,
            Error::Exists(_) => libc::EEXIST,
            Error::Refused(_) => libc::EBUSY,
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let errno = e.errno();
        std::io::Error::new(std::io::Error::from_raw_os_error(errno).kind(), e)
    }
}
