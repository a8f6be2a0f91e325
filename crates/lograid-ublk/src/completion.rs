//! Getting a finished request back to its queue thread, and (on write-through devices) holding
//! writes back until a flush covers them.
//!
//! [`Completions`]: a queue's list of finished requests (tag, result) and the eventfd that
//! wakes its thread, the one thread allowed to tell the driver.
//!
//! [`GroupCommit`]: one thread per write-through device that takes every write, discard and
//! write-zeroes that returned from the export, calls the export's flush once for all of them,
//! and only then completes them (with EIO if the flush failed). Writes that return while a
//! flush runs wait for the next one. So a completed write is always on stable storage, and
//! many writes share one flush.
//!
//! Owns: both hand-offs, bounded by the queues' depth (a tag is in at most one list). Must
//! never: complete a modifying request on a write-through device before a flush that began
//! after it returned has succeeded.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use lograid_nbd::Export;

use crate::error::UblkError;
use crate::request::errno_of;

/// A mutex's contents even if a thread panicked holding it (the lists stay consistent: every
/// change is one push or one take).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A queue's finished requests, waiting for its thread to commit them.
pub struct Completions {
    done: Mutex<Vec<(u16, i32)>>,
    /// Non-blocking eventfd; the queue thread polls it through its ring.
    wake: File,
}

impl Completions {
    pub fn new() -> Result<Completions, UblkError> {
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(UblkError::io("eventfd", std::io::Error::last_os_error()));
        }
        Ok(Completions {
            done: Mutex::new(Vec::new()),
            // SAFETY: `fd` is a new descriptor owned by nothing else.
            wake: unsafe { File::from_raw_fd(fd) },
        })
    }

    /// Hands request `tag`'s `result` to the queue thread and wakes it.
    pub fn push(&self, tag: u16, result: i32) {
        lock(&self.done).push((tag, result));
        // An eventfd write fails only when its counter would overflow, and then it is set.
        let _ = (&self.wake).write(&1u64.to_ne_bytes());
    }

    /// The finished requests so far (the eventfd reset first, so a push after it wakes again).
    pub fn take(&self) -> Vec<(u16, i32)> {
        let mut counter = [0u8; 8];
        // EAGAIN when nothing was pushed since the last reset: nothing to do.
        let _ = std::io::Read::read(&mut &self.wake, &mut counter);
        std::mem::take(&mut *lock(&self.done))
    }

    pub fn wake_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }
}

/// A modifying request that returned from the export and waits for a flush.
struct Held {
    completions: Arc<Completions>,
    tag: u16,
    result: i32,
}

#[derive(Default)]
struct Pending {
    held: VecDeque<Held>,
    stopping: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
}

/// The group-commit thread of one write-through device.
pub struct GroupCommit {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GroupCommit {
    pub fn start(export: Arc<dyn Export>, name: String) -> Result<GroupCommit, UblkError> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ublk-commit-{name}"))
            .spawn(move || commit_loop(&worker, export.as_ref()))
            .map_err(|e| UblkError::io("starting the ublk group-commit thread", e))?;
        Ok(GroupCommit {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Completes `tag` with `result` once a flush started after this call has succeeded.
    pub fn hold(&self, completions: Arc<Completions>, tag: u16, result: i32) {
        lock(&self.shared.pending).held.push_back(Held {
            completions,
            tag,
            result,
        });
        self.shared.wake.notify_one();
    }

    /// Flushes and completes what is held, then ends the thread.
    pub fn stop(&self) {
        lock(&self.shared.pending).stopping = true;
        self.shared.wake.notify_one();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn commit_loop(shared: &Shared, export: &dyn Export) {
    loop {
        let batch: Vec<Held> = {
            let mut pending = lock(&shared.pending);
            while pending.held.is_empty() && !pending.stopping {
                pending = shared
                    .wake
                    .wait(pending)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if pending.held.is_empty() {
                return;
            }
            pending.held.drain(..).collect()
        };
        // Every write in `batch` returned before this flush began, so it covers them all. A
        // panic in it fails the batch instead of ending this thread, which would leave every
        // held tag (and the device's stop) waiting for ever.
        let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| export.flush()))
            .unwrap_or_else(|_| Err(std::io::Error::other("the flush panicked")));
        if let Err(e) = &flushed {
            tracing::warn!(
                export = export.name(),
                requests = batch.len(),
                "flush failed, writes fail: {e}"
            );
        }
        for held in batch {
            let result = match &flushed {
                Ok(()) => held.result,
                Err(e) => -errno_of(e),
            };
            held.completions.push(held.tag, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lograid_nbd::mem_export::MemExport;

    #[test]
    fn held_writes_complete_after_a_flush() {
        let export = Arc::new(MemExport::new("vol", 1 << 20));
        export.write(0, &[1u8; 4096], false).unwrap();
        let completions = Arc::new(Completions::new().unwrap());
        let commit = GroupCommit::start(export.clone(), "vol".into()).unwrap();
        commit.hold(completions.clone(), 3, 4096);
        commit.hold(completions.clone(), 4, 0);
        commit.stop();
        let mut done = completions.take();
        done.sort();
        assert_eq!(done, vec![(3, 4096), (4, 0)]);
        assert!(export.flush_count() >= 1);
        assert_eq!(export.unflushed_writes(), 0);
        assert!(completions.take().is_empty());
    }

    /// Panics in its first flush, then flushes `inner`.
    struct PanicsOnce {
        inner: MemExport,
        panicked: std::sync::atomic::AtomicBool,
    }

    impl Export for PanicsOnce {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> std::io::Result<()> {
            if !self
                .panicked
                .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                panic!("flush");
            }
            self.inner.flush()
        }
        fn trim(&self, offset: u64, length: u64, fua: bool) -> std::io::Result<()> {
            self.inner.trim(offset, length, fua)
        }
        fn write_zeroes(
            &self,
            offset: u64,
            length: u64,
            no_hole: bool,
            fua: bool,
        ) -> std::io::Result<()> {
            self.inner.write_zeroes(offset, length, no_hole, fua)
        }
        fn block_status(
            &self,
            offset: u64,
            length: u64,
        ) -> std::io::Result<Vec<(u64, lograid_nbd::export::Allocation)>> {
            self.inner.block_status(offset, length)
        }
    }

    #[test]
    fn a_panicking_flush_fails_its_batch_and_the_next_batch_is_served() {
        let export = Arc::new(PanicsOnce {
            inner: MemExport::new("vol", 1 << 20),
            panicked: false.into(),
        });
        let completions = Arc::new(Completions::new().unwrap());
        let commit = GroupCommit::start(export.clone(), "vol".into()).unwrap();
        commit.hold(completions.clone(), 1, 4096);
        let failed = wait_for_one(&completions);
        assert_eq!(failed, (1, -libc::EIO));
        commit.hold(completions.clone(), 2, 4096);
        commit.stop();
        assert_eq!(completions.take(), vec![(2, 4096)]);
        assert_eq!(export.inner.flush_count(), 1);
    }

    fn wait_for_one(completions: &Completions) -> (u16, i32) {
        for _ in 0..500 {
            if let Some(done) = completions.take().pop() {
                return done;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no completion within 5 s");
    }
}
