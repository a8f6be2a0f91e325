//! macOS's side of what the server asks of the system (see `mod.rs`).

/// The TCP option for the idle time before the first keepalive probe.
pub(crate) const TCP_KEEPALIVE_IDLE: libc::c_int = libc::TCP_KEEPALIVE;

/// Nothing to do: macOS's kernel answers `mlockall` with ENOSYS, and has no per-process flag
/// that keeps its allocations out of filesystem writeback. No warnings: nothing was refused.
pub(crate) fn harden_process() -> Vec<String> {
    Vec::new()
}
