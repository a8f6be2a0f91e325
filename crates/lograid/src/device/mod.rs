//! Members: the drives a pool is made of. This module owns the `Member`
//! trait (positioned block I/O plus flush and discard), its implementations
//! (`FileMember` for files and disks, bypassing the system's cache, over the
//! system calls of `os` (Linux's or macOS's); `SimMember`, an
//! in-memory drive with a volatile write cache that can be crashed, for
//! tests; `RecordingMember`, a wrapper that logs every write, flush and
//! discard, for crash-replay tests), 4 KiB-aligned buffers, per-member
//! counters, which completed writes may still sit in a member's volatile
//! cache and the flushes that cover them (`write_cache`, behind
//! `Device::sync`), the map of segments a member does not hold yet
//! (`StaleSegments`), per-member latency histograms (`MemberLatency`, of
//! the `lograid-latency` crate's histogram; `SLOW_IO`) and the I/O worker
//! pool that writes a row's columns in parallel (or, for files and block
//! devices on Linux, one io_uring submission per row: `uring`).
//! It never interprets the bytes.

mod aligned;
mod file;
mod io_pool;
mod os;
mod record;
mod sim;
// Row writes through io_uring are Linux's; elsewhere the module says the
// ring is unavailable and every row goes through the I/O pool.
#[cfg_attr(not(target_os = "linux"), path = "uring_elsewhere.rs")]
pub mod uring;
mod write_cache;

pub use aligned::{is_aligned, scratch_kept_bytes, AlignedBuf, SCRATCH_KEEP_BYTES};
pub use file::{
    is_gone_error, is_mount_point, is_mounted, probe_signature, signature_in, FileMember, OpenMode,
    LOGRAID_SIGNATURE,
};
pub use io_pool::{IoJob, IoPool};
pub use record::{IoLog, Record, RecordingMember};
pub use sim::{CrashMode, Hold, PowerCut, SimMember, SimRng};

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A drive. All offsets and lengths are multiples of 4096 and buffers are
/// 4096-aligned (the engine guarantees it; implementations may rely on it).
pub trait Member: Send + Sync {
    /// A human name (the path).
    fn describe(&self) -> String;
    fn size_bytes(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads all of `buf` at `offset` only if that needs no wait for the
    /// drive (the member is memory, or the system's cache holds it); false
    /// if not, or on any error (nothing is counted against the drive:
    /// `read_at` then reads it and sees the error). By default no read is
    /// taken this way.
    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> bool {
        false
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// The file descriptor positioned writes may go to directly (through
    /// io_uring, `uring`), if this member is a plain file or block device.
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Tells the drive a range is no longer needed (hole punch, BLKDISCARD).
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Why the drive is no longer there (a member file deleted, a block
    /// device that went away), if it is not; checked about once a second.
    fn gone(&self) -> Option<String> {
        None
    }
}

/// Counters kept for every member since the pool was created; those added
/// to on every member read and write are kept per CPU (`StripedCounter`).
#[derive(Default, Debug)]
pub struct MemberCounters {
    pub bytes_read: StripedCounter,
    pub bytes_written: StripedCounter,
    pub reads: StripedCounter,
    pub writes: StripedCounter,
    pub flushes: AtomicU64,
    pub io_errors: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub repaired_blocks: AtomicU64,
}

/// A plain copy of `MemberCounters`.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterValues {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub io_errors: u64,
    pub checksum_errors: u64,
    pub repaired_blocks: u64,
}

impl MemberCounters {
    pub fn values(&self) -> CounterValues {
        CounterValues {
            bytes_read: self.bytes_read.get(),
            bytes_written: self.bytes_written.get(),
            reads: self.reads.get(),
            writes: self.writes.get(),
            flushes: self.flushes.load(Ordering::Relaxed),
            io_errors: self.io_errors.load(Ordering::Relaxed),
            checksum_errors: self.checksum_errors.load(Ordering::Relaxed),
            repaired_blocks: self.repaired_blocks.load(Ordering::Relaxed),
        }
    }
    pub fn restore(&self, v: &CounterValues) {
        self.bytes_read.set(v.bytes_read);
        self.bytes_written.set(v.bytes_written);
        self.reads.set(v.reads);
        self.writes.set(v.writes);
        self.flushes.store(v.flushes, Ordering::Relaxed);
        self.io_errors.store(v.io_errors, Ordering::Relaxed);
        self.checksum_errors
            .store(v.checksum_errors, Ordering::Relaxed);
        self.repaired_blocks
            .store(v.repaired_blocks, Ordering::Relaxed);
    }
}

pub use lograid_latency::stripe::StripedCounter;
pub use lograid_latency::{LatencyHistogram, LatencyValues, LATENCY_BUCKETS_US};

/// A member call that takes longer than this is slow: logged, and counted
/// in status (`slow_ios`). No healthy drive takes that long (a disk's
/// worst seek is tens of milliseconds, an SSD's rare stall well under it);
/// one that does is failing, overloaded or on a path that keeps retrying.
/// The latency histograms' last bucket counts exactly these calls.
pub const SLOW_IO: Duration = Duration::from_secs(1);
const _: () = assert!(LATENCY_BUCKETS_US[LATENCY_BUCKETS_US.len() - 1] == 1_000_000); // = SLOW_IO

/// How long a member's reads, writes and flushes took, since it was opened.
#[derive(Default, Debug)]
pub struct MemberLatency {
    pub reads: LatencyHistogram,
    pub writes: LatencyHistogram,
    pub flushes: LatencyHistogram,
}

/// A copy of a `MemberLatency`.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberLatencyValues {
    pub reads: LatencyValues,
    pub writes: LatencyValues,
    pub flushes: LatencyValues,
}

impl MemberLatencyValues {
    /// Reads, writes and flushes that took longer than `SLOW_IO`.
    pub fn slow(&self) -> u64 {
        self.reads.beyond_last_bound()
            + self.writes.beyond_last_bound()
            + self.flushes.beyond_last_bound()
    }
}

impl MemberLatency {
    pub fn values(&self) -> MemberLatencyValues {
        MemberLatencyValues {
            reads: self.reads.values(),
            writes: self.writes.values(),
            flushes: self.flushes.values(),
        }
    }
}

/// The segments whose contents a member does not hold yet: it took the place
/// of a failed member, and the rows laid over that place before are being
/// rebuilt onto it (docs/FORMAT.md, "Rebuild in place"). Reads that touch them fail
/// at once, without counting against the member, so that every reader
/// rebuilds those columns from parity as it would a missing member's.
/// Writes go through. Shared between the pool's bookkeeping (which clears a
/// segment when it is rebuilt or reused) and the member's `Device`.
pub struct StaleSegments {
    /// Byte offset of segment 0 and bytes per segment on the member.
    base: u64,
    unit: u64,
    bits: parking_lot::RwLock<Vec<u64>>,
    count: AtomicU64,
    /// Rows with a sequence number below this were written before the
    /// member took its place (only they can be stale).
    since_seq: AtomicU64,
}

impl StaleSegments {
    pub fn new(base: u64, unit: u64) -> StaleSegments {
        assert!(unit > 0, "segment size 0");
        StaleSegments {
            base,
            unit,
            bits: Default::default(),
            count: AtomicU64::new(0),
            since_seq: AtomicU64::new(0),
        }
    }
    /// Stale segments left.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
    pub fn since_seq(&self) -> u64 {
        self.since_seq.load(Ordering::SeqCst)
    }
    pub fn set_since_seq(&self, seq: u64) {
        self.since_seq.store(seq, Ordering::SeqCst);
    }
    /// Makes exactly `segments` stale (rows before `since_seq`).
    pub fn reset(&self, since_seq: u64, segments: impl IntoIterator<Item = u32>) {
        let mut bits = self.bits.write();
        bits.clear();
        let mut n = 0;
        for s in segments {
            let (w, b) = (s as usize / 64, s % 64);
            if bits.len() <= w {
                bits.resize(w + 1, 0);
            }
            if bits[w] & (1 << b) == 0 {
                bits[w] |= 1 << b;
                n += 1;
            }
        }
        self.since_seq.store(since_seq, Ordering::SeqCst);
        self.count.store(n, Ordering::SeqCst);
    }
    pub fn contains(&self, s: u32) -> bool {
        self.count() > 0
            && self
                .bits
                .read()
                .get(s as usize / 64)
                .is_some_and(|w| w & (1 << (s % 64)) != 0)
    }
    /// Segment `s` is rebuilt, or taken anew (nothing old is read in it).
    pub fn clear(&self, s: u32) {
        if self.count() == 0 {
            return;
        }
        let mut bits = self.bits.write();
        if let Some(w) = bits.get_mut(s as usize / 64) {
            if *w & (1 << (s % 64)) != 0 {
                *w &= !(1 << (s % 64));
                self.count.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    /// The stale segments, in order.
    pub fn list(&self) -> Vec<u32> {
        if self.count() == 0 {
            return Vec::new();
        }
        let bits = self.bits.read();
        let mut out = Vec::new();
        for (w, &word) in bits.iter().enumerate() {
            let mut x = word;
            while x != 0 {
                out.push((w * 64) as u32 + x.trailing_zeros());
                x &= x - 1;
            }
        }
        out
    }
    /// Does the byte range touch a stale segment?
    fn covers(&self, offset: u64, len: usize) -> bool {
        if self.count() == 0 || len == 0 || offset + len as u64 <= self.base {
            return false;
        }
        let first = offset.saturating_sub(self.base) / self.unit;
        let last = (offset + len as u64 - 1 - self.base) / self.unit;
        let bits = self.bits.read();
        (first..=last).any(|s| {
            bits.get(s as usize / 64)
                .is_some_and(|w| w & (1 << (s % 64)) != 0)
        })
    }
}

/// A member in a pool: the drive, its counters and latency histograms.
pub struct Device {
    pub member: Arc<dyn Member>,
    pub counters: MemberCounters,
    /// How long its calls took since it was opened (not kept across opens).
    pub latency: MemberLatency,
    bad_reads_in_a_row: AtomicU64,
    /// Faulted: no longer read or written (kept for its counters).
    pub retired: std::sync::atomic::AtomicBool,
    /// Segments it does not hold yet (see `StaleSegments`).
    pub stale: Arc<StaleSegments>,
    /// Which completed writes may still sit in the member's volatile cache.
    cache: write_cache::WriteCache,
}

/// A read slower than this counts as a failed one (a drive that hangs on
/// retries of a bad sector, a path that keeps timing out).
pub const SLOW_READ: Duration = Duration::from_secs(30);

impl Device {
    pub fn new(member: Arc<dyn Member>, stale: Arc<StaleSegments>) -> Device {
        Device {
            member,
            counters: MemberCounters::default(),
            latency: MemberLatency::default(),
            bad_reads_in_a_row: AtomicU64::new(0),
            retired: Default::default(),
            stale,
            cache: Default::default(),
        }
    }
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        debug_assert!(aligned::is_aligned(buf) && buf.len().is_multiple_of(4096));
        if self.stale.covers(offset, buf.len()) {
            return Err(io::Error::other("not rebuilt onto this member yet"));
        }
        self.counters.reads.add(1);
        self.counters.bytes_read.add(buf.len() as u64);
        let started = Instant::now();
        let result = self.member.read_at(buf, offset);
        let took = started.elapsed();
        self.latency.reads.record(took);
        // A read that fails, or takes longer than a drive should, counts
        // against the member; one that works quickly clears the count.
        if result.is_err() || took > SLOW_READ {
            self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            self.bad_reads_in_a_row.fetch_add(1, Ordering::Relaxed);
        } else if self.bad_reads_in_a_row.load(Ordering::Relaxed) != 0 {
            // Written only when it changes: a store to the line on every
            // read would move it between the cores that read.
            self.bad_reads_in_a_row.store(0, Ordering::Relaxed);
        }
        result
    }
    /// A read taken only if it needs no wait for the drive
    /// (`Member::try_read_at`); how long it took, if taken. Not counted: the
    /// caller counts it (`count_read`) once the request it is part of is
    /// taken whole, since a declined request is read again by `read_at`,
    /// which counts it.
    pub fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Duration> {
        debug_assert!(aligned::is_aligned(buf) && buf.len().is_multiple_of(4096));
        if self.stale.covers(offset, buf.len()) {
            return None;
        }
        let started = Instant::now();
        self.member
            .try_read_at(buf, offset)
            .then(|| started.elapsed())
    }
    /// Counts a read of `bytes` taken by `try_read_at` in `took`.
    pub fn count_read(&self, bytes: usize, took: Duration) {
        self.latency.reads.record(took);
        self.counters.reads.add(1);
        self.counters.bytes_read.add(bytes as u64);
    }
    /// Reads that failed or were too slow since the last good one.
    pub fn bad_reads_in_a_row(&self) -> u64 {
        self.bad_reads_in_a_row.load(Ordering::Relaxed)
    }
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.counters.writes.add(1);
        self.counters.bytes_written.add(buf.len() as u64);
        let started = Instant::now();
        let result = self.member.write_at(buf, offset);
        self.latency.writes.record(started.elapsed());
        self.completed(&result);
        result
    }
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let result = self.member.discard(offset, len);
        self.completed(&result);
        result
    }
    /// Accounts for a write or discard that went to the member (by any
    /// path: `write_at`, `discard`, a ring): a completed one may sit in its
    /// cache until the next `sync`.
    pub(crate) fn completed(&self, result: &io::Result<()>) {
        match result {
            Ok(()) => self.cache.wrote(),
            Err(_) => {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    /// Makes every write that completed on this member before the call
    /// durable: shares a flush with concurrent callers, never retries a
    /// failed one (after a failure every call fails). See `write_cache`.
    pub fn sync(&self) -> io::Result<()> {
        self.cache.sync(|| {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let result = self.member.flush();
            self.latency.flushes.record(started.elapsed());
            result.inspect_err(|_| {
                self.counters.io_errors.fetch_add(1, Ordering::Relaxed);
            })
        })
    }
    /// Whether a completed write may not be durable yet (`sync` would
    /// flush, or fail).
    pub fn dirty(&self) -> bool {
        self.cache.dirty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_calls_are_timed() {
        let member: Arc<dyn Member> = Arc::new(SimMember::new("m0", 1 << 20));
        let dev = Device::new(member, Arc::new(StaleSegments::new(0, 1 << 16)));
        let mut buf = AlignedBuf::zeroed(4096);
        dev.write_at(&buf, 0).unwrap();
        dev.write_at(&buf, 4096).unwrap();
        dev.read_at(&mut buf, 0).unwrap();
        dev.sync().unwrap();
        let v = dev.latency.values();
        assert_eq!(
            (v.reads.count(), v.writes.count(), v.flushes.count()),
            (1, 2, 1)
        );
        assert_eq!(v.writes.count(), dev.counters.values().writes);
    }
}
