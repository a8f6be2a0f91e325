//! Request latencies in log-linear buckets: 32 buckets per power of two
//! (about 3% wide), so that percentiles of runs of any length cost a few
//! KiB per window and writer instead of a stored value per request.

use std::time::Duration;

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// Up to 2^40 ns (18 minutes); longer lands in the last bucket.
const BUCKETS: usize = (40 - SUB_BITS as usize + 1) * SUB;

#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u32>,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            max_ns: 0,
        }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (exp - SUB_BITS)) as usize & (SUB - 1);
    (((exp - SUB_BITS + 1) as usize) * SUB + sub).min(BUCKETS - 1)
}

/// The middle of a bucket, in ns.
fn value(b: usize) -> f64 {
    if b < SUB {
        return b as f64;
    }
    let exp = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    let lo = (1u64 << exp) + (sub << (exp - SUB_BITS));
    lo as f64 + (1u64 << (exp - SUB_BITS)) as f64 / 2.0
}

impl Histogram {
    pub fn record(&mut self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let c = &mut self.counts[bucket(ns)];
        *c = c.saturating_add(1);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn add(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// The longest, exactly, in µs.
    pub fn max_us(&self) -> f64 {
        self.max_ns as f64 / 1000.0
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| c as u64).sum()
    }

    /// The p-quantile (0..=1) in µs; 0 when empty.
    pub fn percentile_us(&self, p: f64) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        let rank = ((n - 1) as f64 * p).round() as u64;
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen > rank {
                return value(b) / 1000.0;
            }
        }
        value(BUCKETS - 1) / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_the_bucket_width() {
        let mut h = Histogram::default();
        // 1..=10000 µs, one each.
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count(), 10_000);
        for (p, expect) in [(0.5, 5_000.0), (0.99, 9_900.0), (0.999, 9_990.0)] {
            let got = h.percentile_us(p);
            assert!(
                (got / expect - 1.0).abs() < 0.035,
                "p{p}: {got} vs {expect}"
            );
        }
        let mut other = Histogram::default();
        other.record(Duration::from_secs(3600));
        h.add(&other);
        assert_eq!(h.count(), 10_001);
        assert_eq!(h.max_us(), 3600e6);
        assert!(h.percentile_us(1.0) > 1e9, "{}", h.percentile_us(1.0));
        assert_eq!(Histogram::default().percentile_us(0.5), 0.0);
        // Small values are exact.
        let mut tiny = Histogram::default();
        tiny.record(Duration::from_nanos(7));
        assert_eq!(tiny.percentile_us(0.5), 0.007);
    }

    #[test]
    fn buckets_are_ordered_and_values_inside_them() {
        let mut last = 0;
        for ns in (0..5_000_000u64).step_by(997) {
            let b = bucket(ns);
            assert!(b >= last);
            last = b;
            let v = value(b);
            assert!(
                (v - ns as f64).abs() <= ns as f64 / 32.0 + 1.0,
                "{ns} -> {v}"
            );
        }
    }
}
