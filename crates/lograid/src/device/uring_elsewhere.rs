//! io_uring is Linux's: on other systems no row goes through a ring, and
//! the columns of every row are written by the I/O pool (`IoPool`). The
//! same names as `uring.rs`, so the callers need no system of their own.

use super::Device;
use std::io;

/// One column to write: the device, the bytes and the byte offset.
pub struct ColumnWrite<'a> {
    pub device: &'a Device,
    pub bytes: &'a [u8],
    pub offset: u64,
}

/// Never for the ring here: `None`, nothing written.
pub fn write_columns(_columns: &[ColumnWrite<'_>]) -> Option<Vec<io::Result<()>>> {
    None
}

/// No ring on this system.
pub fn available() -> bool {
    false
}

/// No ring on this system.
pub fn enabled() -> bool {
    false
}
