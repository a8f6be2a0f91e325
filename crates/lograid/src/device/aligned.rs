//! A heap buffer aligned to 4096 bytes, as O_DIRECT requires, and a few
//! small ones kept per thread for reuse (`scratch`, `recycle`): a degraded
//! read's column buffers, which would otherwise be allocated and cleared
//! for every block rebuilt.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of scratch buffers a thread keeps (a larger buffer is freed): a
/// 4 KiB rebuild in the widest rows, with room to spare. Bounds what
/// reuse adds to memory: this much per thread that rebuilds blocks.
pub const SCRATCH_KEEP_BYTES: usize = 128 << 10;

thread_local! {
    static SCRATCH: RefCell<Kept> = const { RefCell::new(Kept(Vec::new())) };
}

/// Bytes of scratch buffers the process's threads keep (`scratch_kept_bytes`).
static SCRATCH_KEPT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of scratch buffers the threads of this process keep for reuse.
pub fn scratch_kept_bytes() -> u64 {
    SCRATCH_KEPT_BYTES.load(Ordering::Relaxed)
}

/// One thread's kept buffers; freed (and uncounted) when the thread ends.
struct Kept(Vec<AlignedBuf>);

impl Kept {
    fn bytes(&self) -> usize {
        self.0.iter().map(|b| b.len).sum()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        SCRATCH_KEPT_BYTES.fetch_sub(self.bytes() as u64, Ordering::Relaxed);
    }
}

pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

const ALIGN: usize = 4096;

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes (rounded allocation, exact length).
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf {
                ptr: std::ptr::null_mut(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len.next_multiple_of(ALIGN), ALIGN).expect("layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    /// A buffer of `len` bytes that this thread recycled, holding what it
    /// held then, or a new zeroed one: for callers that overwrite it whole
    /// before anything reads it.
    pub fn scratch(len: usize) -> AlignedBuf {
        let kept = SCRATCH.with(|kept| {
            let kept = &mut kept.borrow_mut().0;
            let i = kept.iter().position(|b| b.len == len)?;
            SCRATCH_KEPT_BYTES.fetch_sub(len as u64, Ordering::Relaxed);
            Some(kept.swap_remove(i))
        });
        kept.unwrap_or_else(|| AlignedBuf::zeroed(len))
    }

    /// Keeps this buffer for `scratch` on this thread if it fits within
    /// `SCRATCH_KEEP_BYTES` with those kept already; else frees it.
    pub fn recycle(self) {
        if self.len == 0 || self.len > SCRATCH_KEEP_BYTES {
            return;
        }
        SCRATCH.with(|kept| {
            let mut kept = kept.borrow_mut();
            if kept.bytes() + self.len <= SCRATCH_KEEP_BYTES {
                SCRATCH_KEPT_BYTES.fetch_add(self.len as u64, Ordering::Relaxed);
                kept.0.push(self);
            }
        });
    }
}

/// Whether `bytes` starts where direct I/O may read into it.
pub fn is_aligned(bytes: &[u8]) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(ALIGN)
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout =
                Layout::from_size_align(self.len.next_multiple_of(ALIGN), ALIGN).expect("layout");
            // SAFETY: allocated with this layout in `zeroed`.
            unsafe { dealloc(self.ptr, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_buffers_are_reused_within_the_limit() {
        let mut a = AlignedBuf::scratch(4096);
        assert!(a.iter().all(|&b| b == 0), "a new scratch buffer is zeroed");
        a.fill(7);
        let at = a.as_ptr();
        a.recycle();
        let b = AlignedBuf::scratch(4096);
        assert_eq!(b.as_ptr(), at, "the recycled buffer is handed out again");
        assert!(b.iter().all(|&x| x == 7), "as it was left");
        assert!(is_aligned(&b));
        // Another length gets its own buffer.
        let c = AlignedBuf::scratch(8192);
        assert_ne!(c.as_ptr(), at);
        // Beyond the limit, buffers are freed, not kept.
        let big = AlignedBuf::scratch(SCRATCH_KEEP_BYTES + 4096);
        big.recycle();
        let n = SCRATCH_KEEP_BYTES / 4096;
        let many: Vec<AlignedBuf> = (0..n + 4).map(|_| AlignedBuf::scratch(4096)).collect();
        many.into_iter().for_each(AlignedBuf::recycle);
        let kept = SCRATCH.with(|k| k.borrow().bytes());
        assert_eq!(kept, SCRATCH_KEEP_BYTES, "kept up to the limit");
        // (The count is the process's: other threads may keep some too.)
        assert!(scratch_kept_bytes() >= kept as u64, "counted");
    }
}
