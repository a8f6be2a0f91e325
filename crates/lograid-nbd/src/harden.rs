//! Keeping a server that backs a local block device out of the memory-reclaim deadlock.
//!
//! When the kernel writes back dirty pages of a device that this very process serves (nbdfuse +
//! loop, or a kernel NBD client on the same host), reclaim can wait on us while we wait on reclaim.
//! Owns: marking the process as an I/O flusher (`PR_SET_IO_FLUSHER`, so its allocations do not
//! recurse into filesystem or block I/O) and locking its memory (`mlockall`). Must never: abort
//! the process when the kernel refuses; it reports warnings instead.

/// Calls `prctl(PR_SET_IO_FLUSHER, 1)` and `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`
/// (falling back to `MCL_CURRENT | MCL_FUTURE` on kernels without `MCL_ONFAULT`). Returns one
/// warning per step that failed (empty when both succeeded). Call it early in a server process,
/// before large allocations; it affects the whole process.
///
/// `MCL_ONFAULT` locks pages as they are touched instead of faulting in every mapping at once, so
/// reserved-but-unused address space (thread stacks, allocator arenas) does not become resident.
/// `PR_SET_IO_FLUSHER` from linux/prctl.h (Linux 5.6); not exported by every libc crate version.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

pub fn harden_process_for_block_backing() -> Vec<String> {
    let mut warnings = Vec::new();
    // SAFETY: prctl with PR_SET_IO_FLUSHER takes plain integer arguments and touches no memory.
    let result = unsafe {
        libc::prctl(
            PR_SET_IO_FLUSHER,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        warnings.push(format!(
            "prctl(PR_SET_IO_FLUSHER) failed: {error} (needs CAP_SYS_RESOURCE and Linux >= 5.6); \
             under memory pressure, writeback to a device served by this process may deadlock"
        ));
    }
    // SAFETY: mlockall takes a flag word and touches no memory of ours.
    let mut result =
        unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if result != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        result = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    }
    if result != 0 {
        let error = std::io::Error::last_os_error();
        warnings.push(format!(
            "mlockall failed: {error} (needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK); \
             pages of this process may be swapped out while it serves a block device"
        ));
    }
    warnings
}
