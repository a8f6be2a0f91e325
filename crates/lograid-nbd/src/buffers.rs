//! Request buffers, reused within one connection, under one server-wide limit.
//!
//! Owns: the buffers a connection reads WRITE payloads into and encodes READ replies in, and
//! the few it keeps between requests. A fresh allocation per request cost the server more than
//! the data it carried: glibc serves a buffer of 128 KiB or more with a fresh mapping (faulted
//! in page by page, about 0.7 s of CPU per GB written), or, once its adaptive threshold has
//! risen past the request size, from per-thread arenas that the payload's reader thread and
//! the engine's thread each grow and do not give back (a server held 0.5-0.7 GB after 1-32 MiB
//! writes, against a bound of about 0.2 GB). Buffers come in size classes (a power of two from
//! 4 KiB, plus `HEADROOM_BYTES` for a reply's headers), so a buffer kept for one request size
//! serves every later request of that class, WRITE or READ.
//!
//! Must never: keep more idle bytes than the connection's limit or, over all connections, the
//! server's (`KeptBudget`; both counted without the headroom, 64 bytes a buffer); hand out a
//! buffer with bytes in it (every buffer is handed out empty); free a buffer while holding
//! the connection's lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The smallest size class, less its headroom.
const CLASS_MIN_BYTES: usize = 4096;
/// Room in every class beyond its power of two: a READ of 2^k bytes and its reply headers (a
/// simple reply's 16 bytes, or one structured data chunk's 28) fit the class of 2^k.
const HEADROOM_BYTES: usize = 64;

/// Idle bytes kept over all connections of one server.
pub(crate) struct KeptBudget {
    bytes: AtomicUsize,
    max: usize,
}

impl KeptBudget {
    pub(crate) fn new(max: usize) -> Arc<KeptBudget> {
        Arc::new(KeptBudget {
            bytes: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes `bytes` from the budget, or says no.
    fn reserve(&self, bytes: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(bytes).filter(|&total| total <= self.max)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Idle bytes kept over all connections now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// The idle buffers of one connection.
pub(crate) struct PayloadBuffers {
    kept: Mutex<Kept>,
    kept_bytes_max: usize,
    server: Arc<KeptBudget>,
}

#[derive(Default)]
struct Kept {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

/// The capacity a buffer of `length` bytes gets.
pub(crate) fn class_bytes(length: usize) -> usize {
    length
        .saturating_sub(HEADROOM_BYTES)
        .max(CLASS_MIN_BYTES)
        .next_power_of_two()
        + HEADROOM_BYTES
}

/// The bytes a kept buffer of `class` counts against the limits: its power of two (so a
/// buffer for the largest request that fits a limit is kept).
fn counted(class: usize) -> usize {
    class - HEADROOM_BYTES
}

/// Whether `capacity` is a size class (a buffer from `take`).
fn is_class(capacity: usize) -> bool {
    capacity
        .checked_sub(HEADROOM_BYTES)
        .is_some_and(|bytes| bytes >= CLASS_MIN_BYTES && bytes.is_power_of_two())
}

impl PayloadBuffers {
    /// Keeps at most `kept_bytes_max` bytes of idle buffers, and only while `server` allows.
    pub(crate) fn new(kept_bytes_max: usize, server: Arc<KeptBudget>) -> PayloadBuffers {
        PayloadBuffers {
            kept: Mutex::new(Kept::default()),
            kept_bytes_max,
            server,
        }
    }

    /// An empty buffer whose capacity holds `length` bytes: a kept one of the size class, or
    /// a new one.
    pub(crate) fn take(&self, length: usize) -> Vec<u8> {
        let class = class_bytes(length);
        let mut kept = self.lock();
        if let Some(at) = kept.buffers.iter().position(|b| b.capacity() == class) {
            let buffer = kept.buffers.swap_remove(at);
            kept.bytes -= counted(class);
            drop(kept);
            self.server.release(counted(class));
            debug_assert!(buffer.is_empty());
            return buffer;
        }
        drop(kept);
        Vec::with_capacity(class)
    }

    /// Takes `buffer` back for later requests, or frees it. When the connection's limit is
    /// reached, kept buffers of smaller classes make room (a connection whose requests grow
    /// keeps buffers of its current size; a small buffer never pushes out a larger one); the
    /// server's limit only ever refuses.
    pub(crate) fn give_back(&self, mut buffer: Vec<u8>) {
        let class = buffer.capacity();
        if !is_class(class) || counted(class) > self.kept_bytes_max {
            return;
        }
        buffer.clear();
        let mut evicted = Vec::new();
        let mut kept = self.lock();
        let smaller: usize = kept
            .buffers
            .iter()
            .filter(|b| b.capacity() < class)
            .map(|b| counted(b.capacity()))
            .sum();
        if kept.bytes - smaller + counted(class) > self.kept_bytes_max {
            return; // even without the smaller ones it would not fit: `buffer` is freed
        }
        while kept.bytes + counted(class) > self.kept_bytes_max {
            let Some(at) = kept.buffers.iter().position(|b| b.capacity() < class) else {
                break; // unreachable: the smaller ones were enough
            };
            let out = kept.buffers.swap_remove(at);
            kept.bytes -= counted(out.capacity());
            evicted.push(out);
        }
        let freed: usize = evicted.iter().map(|b| counted(b.capacity())).sum();
        self.server.release(freed);
        if kept.bytes + counted(class) <= self.kept_bytes_max && self.server.reserve(counted(class))
        {
            kept.bytes += counted(class);
            kept.buffers.push(buffer);
        }
        drop(kept);
        drop(evicted); // freed outside the lock
    }

    /// Bytes of idle buffers kept now (without their headroom).
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while holding the lock leaves the list consistent (every change is one
        // step), so a poisoned lock is still usable.
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for PayloadBuffers {
    /// A closed connection's idle buffers are freed and leave the server's budget.
    fn drop(&mut self) {
        let bytes = self.lock().bytes;
        self.server.release(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(kept_bytes_max: usize) -> PayloadBuffers {
        PayloadBuffers::new(kept_bytes_max, KeptBudget::new(usize::MAX))
    }

    #[test]
    fn a_returned_buffer_serves_the_next_request_of_its_class() {
        let buffers = pool(1 << 20);
        let mut first = buffers.take(5000);
        assert_eq!(first.capacity(), 8192 + HEADROOM_BYTES);
        first.extend_from_slice(&[0xAA; 5000]);
        let address = first.as_ptr();
        buffers.give_back(first);
        assert_eq!(buffers.kept_bytes(), 8192);
        // A READ reply of 8 KiB and a structured chunk's header fits the same class.
        let mut again = buffers.take(8192 + 28);
        assert_eq!(again.as_ptr(), address, "the kept buffer is reused");
        assert!(again.is_empty(), "handed out empty");
        again.resize(8192, 0);
        assert!(
            again.iter().all(|&b| b == 0),
            "no byte of the earlier request shows"
        );
        assert_eq!(buffers.kept_bytes(), 0);
        // Another class gets a new buffer.
        assert_eq!(
            buffers.take(100).capacity(),
            CLASS_MIN_BYTES + HEADROOM_BYTES
        );
    }

    #[test]
    fn idle_buffers_stay_within_the_limit() {
        let buffers = pool(64 * 1024);
        let taken: Vec<Vec<u8>> = (0..10).map(|_| buffers.take(16 * 1024)).collect();
        for buffer in taken {
            buffers.give_back(buffer);
            assert!(buffers.kept_bytes() <= 64 * 1024);
        }
        assert_eq!(buffers.kept_bytes(), 64 * 1024);
        // A buffer larger than the limit is never kept.
        buffers.give_back(Vec::with_capacity(class_bytes(1 << 20)));
        assert_eq!(buffers.kept_bytes(), 64 * 1024);
        // A buffer that is not of a size class (not from `take`) is not kept.
        buffers.give_back(Vec::with_capacity(5000));
        assert_eq!(buffers.kept_bytes(), 64 * 1024);
    }

    #[test]
    fn a_buffer_of_the_whole_limit_is_kept() {
        let buffers = pool(32 << 20);
        buffers.give_back(buffers.take(32 << 20));
        assert_eq!(buffers.kept_bytes(), 32 << 20);
    }

    #[test]
    fn a_larger_request_size_evicts_smaller_classes_never_the_reverse() {
        let buffers = pool(64 * 1024);
        for buffer in (0..4).map(|_| buffers.take(16 * 1024)).collect::<Vec<_>>() {
            buffers.give_back(buffer);
        }
        buffers.give_back(buffers.take(32 * 1024));
        assert_eq!(buffers.kept_bytes(), 64 * 1024, "two small ones made room");
        // Full again with 32 + 16 + 16 KiB: a 4 KiB buffer does not push out a larger one.
        buffers.give_back(buffers.take(4096));
        assert_eq!(buffers.kept_bytes(), 64 * 1024);
        assert_eq!(
            buffers.take(32 * 1024).capacity(),
            class_bytes(32 * 1024),
            "the large one is still kept"
        );
        assert_eq!(buffers.kept_bytes(), 32 * 1024, "two 16 KiB buffers remain");
    }

    #[test]
    fn the_server_budget_caps_every_connection_together() {
        let server = KeptBudget::new(64 * 1024);
        let one = PayloadBuffers::new(64 * 1024, server.clone());
        let two = PayloadBuffers::new(64 * 1024, server.clone());
        for buffer in (0..3).map(|_| one.take(16 * 1024)).collect::<Vec<_>>() {
            one.give_back(buffer);
        }
        for buffer in (0..3).map(|_| two.take(16 * 1024)).collect::<Vec<_>>() {
            two.give_back(buffer);
        }
        assert_eq!(one.kept_bytes(), 48 * 1024);
        assert_eq!(
            two.kept_bytes(),
            16 * 1024,
            "the server's limit refused the rest"
        );
        assert_eq!(server.kept_bytes(), 64 * 1024);
        // Taking one out gives its bytes back to the server; a closed connection gives all.
        let taken = one.take(16 * 1024);
        assert_eq!(server.kept_bytes(), 48 * 1024);
        drop(one);
        assert_eq!(server.kept_bytes(), 16 * 1024);
        drop(taken);
        drop(two);
        assert_eq!(server.kept_bytes(), 0);
    }

    #[test]
    fn classes_hold_a_read_and_its_reply_header() {
        for bytes in [4096usize, 65536, 1 << 20, 32 << 20] {
            let class = class_bytes(bytes + 28);
            assert_eq!(class, bytes + HEADROOM_BYTES, "{bytes}");
            assert!(is_class(class));
            assert_eq!(class_bytes(bytes), class, "a WRITE of {bytes} shares it");
        }
        assert!(!is_class(4096));
        assert!(!is_class(0));
    }
}
