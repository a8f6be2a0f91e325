//! The gate between the kernel's requests and the exports.
//!
//! Owns: letting export calls through while the mount lives, counting the calls in progress, and
//! closing: once closed, every request is answered EIO without touching an export, and closing
//! waits (at most [`GATE_WAIT`]) for the calls already in progress. Must never: let a call
//! through once closed, let a panic in a call unwind into fuser's request thread (fuser does not
//! replace it), or wait without bound.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Lets requests through to the exports until the mount ends. Closing waits (a bounded time) for
/// the calls in progress; every later request is answered EIO without touching an export.
#[derive(Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
    in_progress: AtomicUsize,
}

/// How long closing the gate waits for calls in progress (an export call stuck on a dead drive
/// must not keep the server from stopping).
const GATE_WAIT: Duration = Duration::from_secs(30);

/// How often closing looks again at the calls in progress.
const GATE_POLL: Duration = Duration::from_millis(5);

impl Gate {
    /// Runs `call` unless the gate is closed, turning a panic into EIO (the request thread must
    /// live on: fuser does not replace it).
    pub(crate) fn pass<T>(&self, call: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        let result = if self.closed.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(libc::EIO))
        } else {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|_| {
                tracing::error!("a FUSE request panicked; answered EIO");
                Err(io::Error::from_raw_os_error(libc::EIO))
            })
        };
        self.in_progress.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Closes the gate and waits (at most [`GATE_WAIT`]) for the calls in progress.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) && self.in_progress.load(Ordering::SeqCst) == 0
        {
            return;
        }
        let deadline = Instant::now() + GATE_WAIT;
        while self.in_progress.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "FUSE requests still running after {GATE_WAIT:?}; not waiting for them"
                );
                return;
            }
            std::thread::sleep(GATE_POLL);
        }
    }
}
