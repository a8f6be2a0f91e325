//! The requests a mount served, logged at unmount (how the kernel split the work shows in the
//! averages).
//!
//! Owns: the counters of reads and writes (with their bytes) and of fsyncs, and their summary.
//! Must never: cost a request more than relaxed atomic adds, or change any request's answer.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests served, logged at unmount (how the kernel split the work shows in the averages).
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) reads: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
}

impl Stats {
    /// Counts one request of `bytes_len` bytes in `counter` and `bytes`.
    pub(crate) fn count(counter: &AtomicU64, bytes: &AtomicU64, bytes_len: usize) {
        counter.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(bytes_len as u64, Ordering::Relaxed);
    }

    pub(crate) fn summary(&self) -> String {
        let average = |n: &AtomicU64, b: &AtomicU64| {
            let n = n.load(Ordering::Relaxed);
            let b = b.load(Ordering::Relaxed);
            format!(
                "{n} ({} KiB each on average)",
                b.checked_div(n).unwrap_or(0) / 1024
            )
        };
        format!(
            "reads {}, writes {}, fsyncs {}",
            average(&self.reads, &self.read_bytes),
            average(&self.writes, &self.write_bytes),
            self.fsyncs.load(Ordering::Relaxed)
        )
    }
}
