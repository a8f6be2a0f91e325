//! Linux's side of what the server asks of the system (see `mod.rs`).

/// The TCP option for the idle time before the first keepalive probe.
pub(crate) const TCP_KEEPALIVE_IDLE: libc::c_int = libc::TCP_KEEPIDLE;

/// `PR_SET_IO_FLUSHER` from linux/prctl.h (Linux 5.6); not exported by every libc crate version.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// `prctl(PR_SET_IO_FLUSHER, 1)` and `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`
/// (falling back to `MCL_CURRENT | MCL_FUTURE` on kernels without `MCL_ONFAULT`); one warning
/// per step that failed.
///
/// `MCL_ONFAULT` locks pages as they are touched instead of faulting in every mapping at once, so
/// reserved-but-unused address space (thread stacks, allocator arenas) does not become resident.
pub(crate) fn harden_process() -> Vec<String> {
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
    if let Some(warning) = memlock_limit_too_small() {
        warnings.push(warning);
        return warnings;
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

/// Locked address space a server may need (thread stacks of the I/O and
/// request pools count in full, even with MCL_ONFAULT).
const MEMLOCK_NEEDED_BYTES: u64 = 4 << 30;
const CAP_IPC_LOCK: u32 = 14;

/// `mlockall(MCL_FUTURE)` succeeds for an unprivileged user, but then every
/// mapping past RLIMIT_MEMLOCK (8 MiB by default) fails and the next thread
/// spawn aborts the process. Without CAP_IPC_LOCK and with a limit below
/// what a server needs, memory is not locked, and this says why.
fn memlock_limit_too_small() -> Option<String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur == libc::RLIM_INFINITY || limit.rlim_cur >= MEMLOCK_NEEDED_BYTES {
        return None;
    }
    let has_ipc_lock = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
    if has_ipc_lock {
        return None;
    }
    Some(format!(
        "memory not locked: RLIMIT_MEMLOCK is {} KiB and this process lacks CAP_IPC_LOCK (locking would make \
         allocations fail); pages of this process may be swapped out while it serves a block device \
         (raise the limit, e.g. `ulimit -l unlimited` or systemd LimitMEMLOCK=infinity, or run as root)",
        limit.rlim_cur / 1024
    ))
}
