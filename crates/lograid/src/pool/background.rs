//! A pool's background threads (the cleaner, the overlay resolver).
//!
//! Owns: starting a named thread on a loop given a weak reference to the
//! pool (so the thread never keeps a dropped pool alive) and a stop flag,
//! and stopping it: flag, then join, on `stop` (the pool's close) or drop.

use super::PoolInner;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// The loop a background thread runs until the flag is set or the pool is gone.
pub(crate) type BackgroundLoop = fn(Weak<PoolInner>, Arc<AtomicBool>);

pub(crate) struct BackgroundThread {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl BackgroundThread {
    /// Starts `body` on a thread named `name`, if `enabled`.
    pub fn start(
        inner: &Arc<PoolInner>,
        enabled: bool,
        name: &str,
        body: BackgroundLoop,
    ) -> Arc<BackgroundThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = enabled.then(|| {
            let weak = Arc::downgrade(inner);
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || body(weak, stop))
                .unwrap_or_else(|e| panic!("spawning {name}: {e}"))
        });
        Arc::new(BackgroundThread {
            stop,
            thread: Mutex::new(thread),
        })
    }

    /// Sets the stop flag and waits for the thread to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        self.stop();
    }
}
