//! How long calls took, in fixed buckets: the one histogram every part of
//! lograid keeps (the engine per member read, write and flush; the NBD
//! server per export request) and the metrics endpoint exports; and the
//! per-CPU stripes (`stripe`) that keep it, and other counters added to on
//! every request, off cache lines the other cores write.
//!
//! Owns: the bucket bounds (`LATENCY_BUCKETS_US`), [`LatencyHistogram`]
//! and its copy [`LatencyValues`]. Must never: lock, allocate or fail when
//! recording (two relaxed atomic additions to this CPU's stripe), nor lose
//! a call (a call longer than the largest bound lands in one more bucket;
//! a sum that would overflow saturates at `u64::MAX` nanoseconds per call).

pub mod stripe;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use stripe::Striped;

/// Upper bounds of the buckets, in microseconds: 50 us to 1 s. One bucket
/// more counts what took longer.
pub const LATENCY_BUCKETS_US: [u64; 13] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Buckets of a histogram: one per bound, and one past the last.
pub const LATENCY_BUCKETS: usize = LATENCY_BUCKETS_US.len() + 1;

const LATENCY_BOUNDS_NS: [u64; LATENCY_BUCKETS_US.len()] = {
    let mut ns = [0; LATENCY_BUCKETS_US.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = LATENCY_BUCKETS_US[i] * 1000;
        i += 1;
    }
    ns
};

/// How long calls took, in fixed buckets (`LATENCY_BUCKETS_US`), kept per
/// CPU stripe (a stripe's cells fit its 128 bytes).
#[derive(Default, Debug)]
pub struct LatencyHistogram(Striped<Cells>);

#[derive(Default, Debug)]
struct Cells {
    /// Calls per bucket (not cumulative); the last one is past 1 s.
    buckets: [AtomicU64; LATENCY_BUCKETS],
    /// Total time in nanoseconds (microseconds would round a fast drive's
    /// calls of a few microseconds down by up to a third).
    sum_ns: AtomicU64,
}
const _: () = assert!(std::mem::size_of::<Cells>() <= 128);

/// A copy of a [`LatencyHistogram`].
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyValues {
    /// Calls per bucket (not cumulative): `buckets[i]` took at most
    /// `LATENCY_BUCKETS_US[i]` (and more than the bound before); the last
    /// one took more than the largest bound.
    pub buckets: [u64; LATENCY_BUCKETS],
    pub sum_ns: u64,
}

impl LatencyValues {
    /// Calls recorded (the sum of the buckets).
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Calls that took longer than the largest bound (1 s).
    pub fn beyond_last_bound(&self) -> u64 {
        self.buckets[LATENCY_BUCKETS - 1]
    }
}

impl LatencyHistogram {
    pub fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound is not below `took`.
        let bucket = LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns);
        let cells = self.0.local();
        cells.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        cells.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A copy (each counter read once; calls recorded meanwhile may be in
    /// some counters and not yet in others).
    pub fn values(&self) -> LatencyValues {
        let mut values = LatencyValues::default();
        for cells in self.0.all() {
            for (sum, cell) in values.buckets.iter_mut().zip(&cells.buckets) {
                *sum += cell.load(Ordering::Relaxed);
            }
            values.sum_ns = values
                .sum_ns
                .wrapping_add(cells.sum_ns.load(Ordering::Relaxed));
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_their_upper_bound_and_sum_in_nanoseconds() {
        let h = LatencyHistogram::default();
        for us in [0, 50, 51, 1_000, 1_000_000, 1_000_001, 7_000_000] {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_nanos(50_001));
        let v = h.values();
        let mut expect = [0u64; LATENCY_BUCKETS];
        expect[0] = 2; // 0 and 50 us
        expect[1] = 2; // 51 us and 50.001 us
        expect[4] = 1; // 1 ms
        expect[12] = 1; // 1 s
        expect[13] = 2; // past 1 s
        assert_eq!(v.buckets, expect);
        assert_eq!(v.count(), 8);
        assert_eq!(v.beyond_last_bound(), 2);
        assert_eq!(
            v.sum_ns,
            (50 + 51 + 1_000 + 1_000_000 + 1_000_001 + 7_000_000) * 1000 + 50_001
        );
    }

    #[test]
    fn a_call_too_long_to_count_in_nanoseconds_still_counts() {
        let h = LatencyHistogram::default();
        h.record(Duration::MAX);
        let v = h.values();
        assert_eq!(
            (v.count(), v.beyond_last_bound(), v.sum_ns),
            (1, 1, u64::MAX)
        );
    }
}
