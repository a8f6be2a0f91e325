//! Keeping a server that backs a local block device out of the memory-reclaim deadlock.
//!
//! When the kernel writes back dirty pages of a device that this very process serves (nbdfuse +
//! loop, or a kernel NBD client on the same host), reclaim can wait on us while we wait on reclaim.
//! Owns: on Linux, marking the process as an I/O flusher (`PR_SET_IO_FLUSHER`, so its allocations
//! do not recurse into filesystem or block I/O) and locking its memory (`mlockall`); on macOS
//! there is nothing to do (see `crate::os`). Must never: abort the process when the kernel
//! refuses; it reports warnings instead.

/// On Linux, calls `prctl(PR_SET_IO_FLUSHER, 1)` and `mlockall(MCL_CURRENT | MCL_FUTURE |
/// MCL_ONFAULT)` (falling back to `MCL_CURRENT | MCL_FUTURE` on kernels without `MCL_ONFAULT`);
/// on macOS, nothing. Returns one warning per step that failed (empty when all succeeded). Call it
/// early in a server process, before large allocations; it affects the whole process.
pub fn harden_process_for_block_backing() -> Vec<String> {
    crate::os::harden_process()
}
