//! Counting from many threads without sharing a cache line: each counter
//! is kept in `STRIPES` copies, each on cache lines of its own, a thread
//! adds to the copy of the CPU it runs on (`stripe`), and a reader sums
//! them. An atomic addition to a line another core wrote last waits for
//! that line to move (about 100 ns between the cores of this kind of
//! machine): per request, on every core, that was a large part of what a
//! 4 KiB read cost beside the member's own copy.
//!
//! Owns: the stripe count, the CPU to stripe rule, and [`Striped`].
//! Must never: lose an addition (a thread that moves to another CPU
//! mid-call adds to a stripe that is not its CPU's: right, only slower).

use std::sync::atomic::{AtomicU64, Ordering};

/// Copies of each striped counter: CPUs beyond it share stripes.
pub const STRIPES: usize = 16;

/// `T` alone on its cache lines (two lines: Intel's prefetcher pulls lines
/// in pairs).
#[derive(Default, Debug)]
#[repr(align(128))]
pub struct CacheLines<T>(pub T);

/// The stripe of the CPU this thread runs on now.
pub fn stripe() -> usize {
    os::cpu() % STRIPES
}

#[cfg(target_os = "linux")]
mod os {
    /// The CPU this thread runs on (glibc reads it from the thread's rseq
    /// area: no system call); 0 if the system cannot say.
    pub(super) fn cpu() -> usize {
        // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
        usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0)
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// macOS does not say which CPU a thread runs on: threads get stripes
    /// in turn, kept for their life.
    pub(super) fn cpu() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        MINE.with(|m| *m)
    }
}

/// `STRIPES` copies of `T`, one per stripe.
#[derive(Debug)]
pub struct Striped<T> {
    stripes: Box<[CacheLines<T>; STRIPES]>,
}

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Striped {
            stripes: Box::new(std::array::from_fn(|_| CacheLines::default())),
        }
    }
}

impl<T> Striped<T> {
    /// The copy to add to from this thread now.
    pub fn local(&self) -> &T {
        &self.stripes[stripe()].0
    }
    /// Every copy (to sum them).
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.stripes.iter().map(|s| &s.0)
    }
    /// `f` of each copy, in stripe order.
    pub fn each<'a, R>(&'a self, mut f: impl FnMut(&'a T) -> R) -> [R; STRIPES] {
        std::array::from_fn(|i| f(&self.stripes[i].0))
    }
}

/// A u64 counter added to from many threads.
#[derive(Default, Debug)]
pub struct StripedCounter(Striped<AtomicU64>);

impl StripedCounter {
    pub fn add(&self, n: u64) {
        self.0.local().fetch_add(n, Ordering::Relaxed);
    }
    /// The sum (additions made meanwhile may or may not be in it).
    pub fn get(&self) -> u64 {
        self.0
            .all()
            .fold(0u64, |sum, c| sum.wrapping_add(c.load(Ordering::Relaxed)))
    }
    /// Sets the sum to `n` (not while others add: their additions may be lost).
    pub fn set(&self, n: u64) {
        for (i, c) in self.0.all().enumerate() {
            c.store(if i == 0 { n } else { 0 }, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn additions_from_many_threads_all_count() {
        let counter = Arc::new(StripedCounter::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        counter.add(3);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.get(), 240_000);
        counter.set(7);
        assert_eq!(counter.get(), 7);
        assert!(stripe() < STRIPES);
    }

    #[test]
    fn stripes_sit_on_lines_of_their_own() {
        let s = Striped::<AtomicU64>::default();
        let addresses: Vec<usize> = s.all().map(|c| c as *const _ as usize).collect();
        for pair in addresses.windows(2) {
            assert!(pair[1] - pair[0] >= 128);
        }
        assert_eq!(addresses[0] % 128, 0);
    }
}
