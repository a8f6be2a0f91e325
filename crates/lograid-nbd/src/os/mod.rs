//! What the server asks of the system that differs between Linux and macOS, with the same
//! names on both sides (`linux.rs`, `macos.rs`):
//!
//! - `harden_process`: keeping a process that backs a local block device out of the
//!   memory-reclaim deadlock (`crate::harden`). Linux: `PR_SET_IO_FLUSHER` and `mlockall`.
//!   macOS: nothing it can do (`mlockall` is not implemented there, and there is no flag like
//!   `PR_SET_IO_FLUSHER`), so nothing is tried and nothing is reported.
//! - `TCP_KEEPALIVE_IDLE`: the TCP option for the idle time before the first keepalive probe
//!   (Linux `TCP_KEEPIDLE`, macOS `TCP_KEEPALIVE`); the probe interval and count options have
//!   the same names on both.
//!
//! Must never: abort the process when the system refuses; it reports warnings instead.

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod sys;
#[cfg(target_os = "macos")]
#[path = "macos.rs"]
mod sys;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!("lograid-nbd is implemented for Linux and macOS only");

pub(crate) use sys::{harden_process, TCP_KEEPALIVE_IDLE};
