//! The engine's error types. Every error says what failed and where; each
//! maps to an errno so front ends (NBD) can answer with the protocol's code.
//! Refusals (`Refusal`), the reasons a pool stops writing (`ReadOnlyReason`)
//! and why a block could not be rebuilt (`RepairError`) are enums, so that
//! callers and tests tell them apart by kind, not by message text.

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
    ReadOnly(ReadOnlyReason),
    #[error("volume '{volume}' offset {offset}: data is unreadable and cannot be rebuilt from parity ({cause})")]
    Unrecoverable {
        volume: String,
        offset: u64,
        cause: RepairError,
    },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    Exists(String),
    #[error("{0}")]
    Refused(Refusal),
    #[error("pool metadata is inconsistent: {0}")]
    Corrupt(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a pool stopped writing (it goes on serving what it can read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadOnlyReason {
    /// Opened for inspection (`status`, `scrub --check`): not a fault.
    #[error("opened read-only")]
    Opened,
    #[error("pool is closed")]
    Closed,
    /// A member failed beyond what the parity covers.
    #[error(
        "member {member} ({name}) failed {what} ({cause}) with {lost_before} member(s) already \
         lost and parity {parity}: the pool stopped writing; what it holds stays readable where \
         parity allows"
    )]
    MemberFailed {
        member: usize,
        name: String,
        what: String,
        cause: String,
        lost_before: u32,
        parity: u8,
    },
    /// Opened with more members missing or not yet rebuilt than the parity.
    #[error(
        "{lost} members are missing or not yet rebuilt, more than parity {parity}: \
         the pool stopped writing until a missing member is back"
    )]
    TooManyLost { lost: u32, parity: u8 },
    /// No member took a superblock write (each one that failed was faulted).
    #[error("no member took the superblock write: {cause}")]
    SuperblockWrite { cause: String },
    /// A broken invariant (a bug): nothing more is written, so that what is
    /// on disk stays what recovery can trust.
    #[error(
        "internal error during {during}: {message}; the pool stopped writing to protect its data \
         (reopening it replays the log up to the last flush)"
    )]
    Internal { during: String, message: String },
    #[error("the row writer stopped")]
    RowWriterStopped,
}

impl ReadOnlyReason {
    /// Whether this is a fault (not a pool opened read-only on purpose).
    pub fn is_fault(&self) -> bool {
        *self != ReadOnlyReason::Opened
    }
}

/// Why a block could not be rebuilt from the rest of its row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairError {
    #[error("{unreadable} of {width} columns unreadable with {parity} parity")]
    TooManyUnreadable {
        unreadable: usize,
        width: usize,
        parity: usize,
    },
    #[error("no combination of {parity} parity columns reproduces the checksum")]
    NoMatchingCombination { parity: usize },
    #[error("block outside its row")]
    OutsideRow,
    #[error("no row record for this block")]
    NoRow,
}

/// Why a command or a drive was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{drive} is too small to be a lograid member")]
    TooSmallForAMember { drive: String },
    #[error("{drive} is not a lograid member")]
    NotAMember { drive: String },
    #[error("{drive} is not a lograid member (no lograid superblock)")]
    NoSuperblock { drive: String },
    #[error("{drive} is not a lograid member: it now holds {holds}")]
    NowHolds { drive: String, holds: String },
    #[error("{drive} belongs to another pool ({found:032x}, not {expected:032x})")]
    AnotherPool {
        drive: String,
        found: u128,
        expected: u128,
    },
    #[error("{drive} was removed from pool '{pool}'")]
    RemovedMember { drive: String, pool: String },
    #[error("{drive} is not a current member of pool '{pool}'")]
    NotACurrentMember { drive: String, pool: String },
    #[error("{drive} is smaller than when it joined the pool")]
    ShrunkMember { drive: String },
    #[error("pool '{pool}' needs at least {needed} of its {members} members; missing: {}", missing_list(.missing))]
    TooFewMembers {
        pool: String,
        needed: usize,
        members: usize,
        missing: Vec<usize>,
    },
    #[error("{drive} is mounted; unmount it first")]
    Mounted { drive: String },
    #[error(
        "{drive} holds {holds}; refusing to overwrite it (use --force to destroy its contents)"
    )]
    HoldsData { drive: String, holds: String },
    #[error("{drive} is too small: {size_bytes} bytes, at least {needed_bytes} needed with these settings")]
    DriveTooSmall {
        drive: String,
        size_bytes: u64,
        needed_bytes: u64,
    },
    #[error("the drives are too small to hold any data after the reserve")]
    DrivesTooSmall,
    #[error("not enough segments")]
    TooFewSegments,
    #[error("{drive} is too small: {size_bytes} bytes, at least {needed_bytes} needed")]
    NewMemberTooSmall {
        drive: String,
        size_bytes: u64,
        needed_bytes: u64,
    },
    #[error("{drive} is too large for this pool's segment size")]
    NewMemberTooLarge { drive: String },
    #[error("{drive} is already a member of this pool")]
    AlreadyOpenMember { drive: String },
    #[error("{drive} is member {member} of this pool")]
    AlreadyMember { drive: String, member: usize },
    #[error("{drive} belongs to pool '{pool}' ({uuid:032x}); wipe it first to use it here")]
    OtherPoolsMember {
        drive: String,
        pool: String,
        uuid: u128,
    },
    #[error("the pool has {max} members, the most it can have")]
    TooManyMembers { max: usize },
    #[error("member {member} is already being replaced or removed")]
    MemberBusy { member: usize },
    #[error(
        "without member {member} the pool would have {left} working member(s); parity {parity} \
         needs at least {needed}"
    )]
    TooFewLeft {
        member: usize,
        left: usize,
        parity: usize,
        needed: usize,
    },
    #[error(
        "the pool holds {stored_bytes} bytes; without member {member} it could hold only \
         {usable_bytes} (free space or add a drive first)"
    )]
    WouldNotFitWithout {
        member: usize,
        stored_bytes: u64,
        usable_bytes: u64,
    },
    #[error("a member is faulted: replace it before changing the parity")]
    MemberFaulted,
    #[error(
        "the pool holds {stored_bytes} bytes; with parity {parity} it could hold only \
         {usable_bytes} (free space or add members first)"
    )]
    WouldNotFitWithParity {
        parity: u8,
        stored_bytes: u64,
        usable_bytes: u64,
    },
    #[error(
        "volume '{volume}' is {size_bytes} bytes; shrinking to {requested_bytes} would drop data"
    )]
    WouldShrink {
        volume: String,
        size_bytes: u64,
        requested_bytes: u64,
    },
    /// A write kept racing with other writes to the same block (bounded).
    #[error("volume '{volume}' block {block}: {what} kept racing with other writes")]
    KeptRacing {
        volume: String,
        block: u64,
        what: &'static str,
    },
}

fn missing_list(members: &[usize]) -> String {
    members
        .iter()
        .map(|i| format!("member {i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

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
