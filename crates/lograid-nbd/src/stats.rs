//! Per-export request counters and latency histograms, for metrics.
//!
//! Owns: what the server counts per export (requests, bytes and failures of reads, writes,
//! flushes, trims and write-zeroes; how long reads, writes and flushes took) and the registry
//! that holds them by export name. `dispatch::execute` records every request it runs; a metrics
//! endpoint reads [`ExportStatsRegistry::values`]. Must never: lock, allocate or fail on the
//! request path once an export has been seen (recording is a read lock, a lookup and a few
//! relaxed atomic additions).
//!
//! The registry is one per process ([`ExportStatsRegistry::global`]): the request path reaches
//! it with nothing but the export's name, and a process serves an export name once. Counters
//! start at zero when the process starts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use crate::proto::{Command, NBD_SIMPLE_REPLY_MAGIC, NBD_STRUCTURED_REPLY_MAGIC};

pub use lograid_latency::{LatencyHistogram, LatencyValues, LATENCY_BUCKETS_US};

/// What one export has served since the process started.
#[derive(Debug, Default)]
pub struct ExportStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    trimmed_bytes: AtomicU64,
    write_zeroes: AtomicU64,
    zeroed_bytes: AtomicU64,
    /// Requests answered with an error (of any command).
    errors: AtomicU64,
    read_latency: LatencyHistogram,
    write_latency: LatencyHistogram,
    flush_latency: LatencyHistogram,
}

/// A copy of an [`ExportStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStatsValues {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub trimmed_bytes: u64,
    pub write_zeroes: u64,
    pub zeroed_bytes: u64,
    pub errors: u64,
    pub read_latency: LatencyValues,
    pub write_latency: LatencyValues,
    pub flush_latency: LatencyValues,
}

impl ExportStats {
    /// Counts one request that was answered with `reply` after `took`. Bytes are those asked
    /// for (of a failed request too); block-status and cache requests count only if they fail.
    pub fn record(&self, command: &Command, took: Duration, reply: &[u8]) {
        let add = |counter: &AtomicU64, n: u64| {
            counter.fetch_add(n, Ordering::Relaxed);
        };
        match *command {
            Command::Read { length, .. } => {
                add(&self.reads, 1);
                add(&self.read_bytes, u64::from(length));
                self.read_latency.record(took);
            }
            Command::Write { length, .. } => {
                add(&self.writes, 1);
                add(&self.written_bytes, u64::from(length));
                self.write_latency.record(took);
            }
            Command::Flush => {
                add(&self.flushes, 1);
                self.flush_latency.record(took);
            }
            Command::Trim { length, .. } => {
                add(&self.trims, 1);
                add(&self.trimmed_bytes, u64::from(length));
            }
            Command::WriteZeroes { length, .. } => {
                add(&self.write_zeroes, 1);
                add(&self.zeroed_bytes, u64::from(length));
            }
            _ => {}
        }
        if is_error_reply(reply) {
            add(&self.errors, 1);
        }
    }

    pub fn values(&self) -> ExportStatsValues {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ExportStatsValues {
            reads: load(&self.reads),
            read_bytes: load(&self.read_bytes),
            writes: load(&self.writes),
            written_bytes: load(&self.written_bytes),
            flushes: load(&self.flushes),
            trims: load(&self.trims),
            trimmed_bytes: load(&self.trimmed_bytes),
            write_zeroes: load(&self.write_zeroes),
            zeroed_bytes: load(&self.zeroed_bytes),
            errors: load(&self.errors),
            read_latency: self.read_latency.values(),
            write_latency: self.write_latency.values(),
            flush_latency: self.flush_latency.values(),
        }
    }
}

/// Whether an encoded reply reports an error: a simple reply with a nonzero error, or a
/// structured chunk of an error type (the same test as the connection's error counter).
fn is_error_reply(reply: &[u8]) -> bool {
    match reply.get(0..4) {
        Some(magic) if magic == NBD_SIMPLE_REPLY_MAGIC.to_be_bytes() => {
            reply.get(4..8).is_some_and(|e| e != [0, 0, 0, 0])
        }
        Some(magic) if magic == NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes() => reply
            .get(6..8)
            .is_some_and(|t| u16::from_be_bytes([t[0], t[1]]) & 0x8000 != 0),
        _ => false,
    }
}

/// The [`ExportStats`] of every export served, by name.
#[derive(Debug, Default)]
pub struct ExportStatsRegistry {
    by_name: RwLock<HashMap<String, Arc<ExportStats>>>,
}

impl ExportStatsRegistry {
    /// The process's registry, which the server records into.
    pub fn global() -> &'static ExportStatsRegistry {
        static GLOBAL: OnceLock<ExportStatsRegistry> = OnceLock::new();
        GLOBAL.get_or_init(ExportStatsRegistry::default)
    }

    /// The stats of `export`, made (all zero) if it has none yet.
    pub fn get(&self, export: &str) -> Arc<ExportStats> {
        // A panic elsewhere while holding the lock leaves the map as it was: use it anyway.
        if let Some(stats) = self
            .by_name
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(export)
        {
            return stats.clone();
        }
        self.by_name
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(export.to_string())
            .or_default()
            .clone()
    }

    /// Counts a request to `export` (see [`ExportStats::record`]).
    pub fn record(&self, export: &str, command: &Command, took: Duration, reply: &[u8]) {
        {
            let map = self
                .by_name
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(stats) = map.get(export) {
                stats.record(command, took, reply);
                return;
            }
        }
        self.get(export).record(command, took, reply);
    }

    /// A copy of every export's stats, by name.
    pub fn values(&self) -> Vec<(String, ExportStatsValues)> {
        let map = self
            .by_name
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut out: Vec<(String, ExportStatsValues)> = map
            .iter()
            .map(|(name, stats)| (name.clone(), stats.values()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{put_error_chunk, put_simple_reply};

    #[test]
    fn requests_are_counted_by_kind_with_failures() {
        let registry = ExportStatsRegistry::default();
        let mut ok = Vec::new();
        put_simple_reply(&mut ok, 1, 0);
        let mut failed = Vec::new();
        put_simple_reply(&mut failed, 1, crate::proto::NBD_EIO);
        let mut failed_chunk = Vec::new();
        put_error_chunk(&mut failed_chunk, 1, crate::proto::NBD_EIO, "no");
        let ms = Duration::from_millis(1);
        let read = Command::Read {
            offset: 0,
            length: 4096,
            df: false,
        };
        let write = Command::Write {
            offset: 0,
            length: 8192,
            fua: false,
        };
        registry.record("a", &read, ms, &ok);
        registry.record("a", &read, ms, &failed_chunk);
        registry.record("a", &write, ms, &ok);
        registry.record("a", &Command::Flush, ms, &failed);
        registry.record("b", &Command::Flush, ms, &ok);
        let values = registry.values();
        assert_eq!(values.len(), 2);
        let (name, a) = &values[0];
        assert_eq!(name, "a");
        assert_eq!((a.reads, a.read_bytes), (2, 8192));
        assert_eq!((a.writes, a.written_bytes), (1, 8192));
        assert_eq!((a.flushes, a.errors), (1, 2));
        assert_eq!(a.read_latency.count(), 2);
        assert_eq!(a.write_latency.buckets[4], 1);
        assert_eq!(values[1].1.flushes, 1);
        assert_eq!(values[1].1.errors, 0);
    }
}
