//! Request buffers, reused within one connection.
//!
//! Owns: the buffers a connection reads WRITE payloads into and encodes READ replies in, and
//! the few it keeps between requests. A fresh allocation per payload cost the server more than the data it carried:
//! glibc serves a buffer of 128 KiB or more with a fresh mapping (faulted in page by page,
//! about 0.7 s of CPU per GB written), or, once its adaptive threshold has risen past the
//! request size, from per-thread arenas that the payload's reader thread and the engine's
//! thread each grow and do not give back (a server held 0.5-0.7 GB after 1-32 MiB writes,
//! against a bound of about 0.2 GB). Buffers come in size classes (a power of two from 4 KiB,
//! plus `HEADROOM_BYTES` for a reply's headers), so a buffer kept for one request size serves
//! every later request of that class, WRITE or READ.
//!
//! Must never: keep more than `kept_bytes_max` of idle buffers (counted without their
//! headroom, 64 bytes a buffer), or hand out a buffer with
//! bytes in it (every buffer is returned empty, its capacity of the size class).

use std::sync::Mutex;

/// The smallest size class, less its headroom.
const CLASS_MIN_BYTES: usize = 4096;
/// Room in every class beyond its power of two: a READ of 2^k bytes and its reply headers (a
/// simple reply's 16 bytes, or one structured data chunk's 20) fit the class of 2^k.
const HEADROOM_BYTES: usize = 64;

/// The idle buffers of one connection.
pub(crate) struct PayloadBuffers {
    kept: Mutex<Kept>,
    kept_bytes_max: usize,
}

#[derive(Default)]
struct Kept {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

/// The capacity a buffer of `length` bytes gets.
fn class_bytes(length: usize) -> usize {
    length
        .saturating_sub(HEADROOM_BYTES)
        .max(CLASS_MIN_BYTES)
        .next_power_of_two()
        + HEADROOM_BYTES
}

/// The bytes a kept buffer of `class` counts against the limit: its power of two (so a
/// buffer for the largest request that fits the limit is kept).
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
    /// Keeps at most `kept_bytes_max` bytes of idle buffers.
    pub(crate) fn new(kept_bytes_max: usize) -> PayloadBuffers {
        PayloadBuffers {
            kept: Mutex::new(Kept::default()),
            kept_bytes_max,
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
            debug_assert!(buffer.is_empty());
            return buffer;
        }
        drop(kept);
        Vec::with_capacity(class)
    }

    /// Takes `buffer` back for later requests, or frees it when the kept buffers are at their
    /// limit (then the oldest kept buffers of other classes make room first, so a connection
    /// whose request size changes keeps buffers of its current size).
    pub(crate) fn give_back(&self, mut buffer: Vec<u8>) {
        let class = buffer.capacity();
        if !is_class(class) || counted(class) > self.kept_bytes_max {
            return;
        }
        buffer.clear();
        let mut kept = self.lock();
        while kept.bytes + counted(class) > self.kept_bytes_max {
            let Some(at) = kept.buffers.iter().position(|b| b.capacity() != class) else {
                return; // full of this class already
            };
            let evicted = kept.buffers.remove(at);
            kept.bytes -= counted(evicted.capacity());
        }
        kept.bytes += counted(class);
        kept.buffers.push(buffer);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_serves_the_next_request_of_its_class() {
        let buffers = PayloadBuffers::new(1 << 20);
        let mut first = buffers.take(5000);
        assert_eq!(first.capacity(), 8192 + HEADROOM_BYTES);
        first.extend_from_slice(&[7u8; 5000]);
        let address = first.as_ptr();
        buffers.give_back(first);
        assert_eq!(buffers.kept_bytes(), 8192);
        // A READ reply of 8 KiB and its header fits the same class.
        let again = buffers.take(8192 + 16);
        assert_eq!(again.as_ptr(), address, "the kept buffer is reused");
        assert!(again.is_empty(), "handed out empty");
        assert_eq!(buffers.kept_bytes(), 0);
        // Another class gets a new buffer.
        assert_eq!(
            buffers.take(100).capacity(),
            CLASS_MIN_BYTES + HEADROOM_BYTES
        );
    }

    #[test]
    fn idle_buffers_stay_within_the_limit() {
        let buffers = PayloadBuffers::new(64 * 1024);
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
        let buffers = PayloadBuffers::new(32 << 20);
        buffers.give_back(buffers.take(32 << 20));
        assert_eq!(buffers.kept_bytes(), 32 << 20);
    }

    #[test]
    fn a_new_request_size_evicts_the_old_class() {
        let buffers = PayloadBuffers::new(64 * 1024);
        for buffer in (0..4).map(|_| buffers.take(16 * 1024)).collect::<Vec<_>>() {
            buffers.give_back(buffer);
        }
        buffers.give_back(buffers.take(32 * 1024));
        assert_eq!(buffers.kept_bytes(), 64 * 1024, "two small ones made room");
        assert_eq!(buffers.take(32 * 1024).capacity(), class_bytes(32 * 1024));
        assert_eq!(buffers.kept_bytes(), 32 * 1024, "two 16 KiB buffers remain");
    }

    #[test]
    fn classes_hold_a_read_and_its_reply_header() {
        for bytes in [4096usize, 65536, 1 << 20, 32 << 20] {
            let class = class_bytes(bytes + 20);
            assert_eq!(class, bytes + HEADROOM_BYTES, "{bytes}");
            assert!(is_class(class));
            assert_eq!(class_bytes(bytes), class, "a WRITE of {bytes} shares it");
        }
        assert!(!is_class(4096));
        assert!(!is_class(0));
    }
}
