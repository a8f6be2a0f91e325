//! What a member's volatile write cache may still hold: which of the writes
//! completed on the member are durable, and the flushes that make them so.
//!
//! Owns: a count of the member's completed writes (and discards), the count
//! a finished flush made durable, the one flush running at a time, and a
//! failed flush's error. `sync` returns once every write that completed
//! before it was called is durable: at once if a finished flush covered
//! them; after the running flush if that one covers them; otherwise after
//! a flush of its own, started when the running one ends, which also covers
//! everyone who arrived meanwhile (group commit: concurrent callers share
//! one flush per member instead of queueing one each).
//!
//! Must never: report writes durable that a flush started before they
//! completed (a flush covers only what completed before it began); retry a
//! failed flush. On Linux a failed fsync may drop the dirty pages it could
//! not write and clear the error, so a retry "succeeds" with the data gone
//! (PostgreSQL's fsync problem of 2018): once a flush failed, every later
//! `sync` fails too, and the pool faults the member.

use crate::sync::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct WriteCache {
    /// Writes completed on the member since it was opened, plus one for
    /// whatever an earlier process may have left in the member's cache (so
    /// the first `sync` always flushes).
    completed: AtomicU64,
    state: Mutex<SyncState>,
    /// Signalled when a flush ends.
    flushed: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// Every write counted up to here is durable.
    durable: u64,
    /// A flush is running that covers the writes counted up to this.
    running: Option<u64>,
    /// A flush failed with this error: nothing since can be trusted.
    failed: Option<(io::ErrorKind, String)>,
}

impl Default for WriteCache {
    fn default() -> Self {
        WriteCache {
            completed: AtomicU64::new(1),
            state: Mutex::new(SyncState::default()),
            flushed: Condvar::new(),
        }
    }
}

impl WriteCache {
    /// A write (or discard) completed on the member.
    pub fn wrote(&self) {
        self.completed.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether a completed write may not be durable yet.
    pub fn dirty(&self) -> bool {
        let s = self.state.lock();
        s.failed.is_some() || s.durable < self.completed.load(Ordering::SeqCst)
    }

    /// Returns once every write completed before the call is durable,
    /// calling `flush` (the member's) at most once; see the module comment.
    pub fn sync(&self, flush: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let target = self.completed.load(Ordering::SeqCst);
        let mut flush = Some(flush);
        let mut s = self.state.lock();
        loop {
            if let Some((kind, msg)) = &s.failed {
                return Err(io::Error::new(
                    *kind,
                    format!("an earlier flush of this member failed ({msg})"),
                ));
            }
            if s.durable >= target {
                return Ok(());
            }
            if s.running.is_some() {
                self.flushed.wait(&mut s);
                continue;
            }
            // Covers what completed up to now (the target and later ones).
            let covers = self.completed.load(Ordering::SeqCst);
            assert!(covers >= target, "completed writes went backwards");
            s.running = Some(covers);
            drop(s);
            // A flush that panics counts as failed (never as done), and
            // whoever waits for it is let go.
            let unwinding = PanicGuard(self);
            let result = flush.take().expect("one flush per call")();
            std::mem::forget(unwinding);
            s = self.state.lock();
            assert_eq!(s.running, Some(covers), "another flush ran beside this one");
            s.running = None;
            self.flushed.notify_all();
            match result {
                Ok(()) => {
                    assert!(s.durable <= covers, "durable count went backwards");
                    s.durable = covers;
                }
                Err(e) => {
                    s.failed = Some((e.kind(), e.to_string()));
                    return Err(e);
                }
            }
        }
    }
}

struct PanicGuard<'a>(&'a WriteCache);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.running = None;
        s.failed
            .get_or_insert((io::ErrorKind::Other, "the member's flush panicked".into()));
        self.0.flushed.notify_all();
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn a_sync_with_nothing_new_does_not_flush() {
        let cache = WriteCache::default();
        let flushes = AtomicUsize::new(0);
        let flush = || {
            flushes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        cache.sync(flush).unwrap();
        assert_eq!(flushes.load(Ordering::SeqCst), 1, "the first sync flushes");
        cache.sync(flush).unwrap();
        assert_eq!(flushes.load(Ordering::SeqCst), 1);
        assert!(!cache.dirty());
        cache.wrote();
        assert!(cache.dirty());
        cache.sync(flush).unwrap();
        assert_eq!(flushes.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_flush_is_final() {
        let cache = WriteCache::default();
        cache.wrote();
        let err = cache
            .sync(|| Err(io::Error::from_raw_os_error(libc::EIO)))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        let mut called = false;
        let again = cache.sync(|| {
            called = true;
            Ok(())
        });
        assert!(again.is_err() && !called, "a failed flush was retried");
        assert!(cache.dirty());
    }

    /// A sync that arrives while a flush runs waits for it, and then
    /// flushes again if the running flush began before its writes completed.
    #[test]
    fn a_sync_waits_for_the_running_flush_and_covers_its_own_writes() {
        let cache = Arc::new(WriteCache::default());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                cache.sync(|| {
                    entered_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    Ok(())
                })
            })
        };
        entered_rx.recv().unwrap();
        // A write completes while the first flush runs: not covered by it.
        cache.wrote();
        let flushed_again = Arc::new(AtomicUsize::new(0));
        let second = {
            let cache = cache.clone();
            let flushed_again = flushed_again.clone();
            std::thread::spawn(move || {
                cache.sync(|| {
                    flushed_again.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !second.is_finished(),
            "returned before the running flush ended"
        );
        go_tx.send(()).unwrap();
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(
            flushed_again.load(Ordering::SeqCst),
            1,
            "its write needed a flush of its own"
        );
        assert!(!cache.dirty());
    }
}
