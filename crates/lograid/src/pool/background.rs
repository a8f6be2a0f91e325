//! A pool's background threads (the cleaner, the overlay resolver).
//!
//! Owns: starting a named thread on a loop given a weak reference to the
//! pool (so the thread never keeps a dropped pool alive) and a stop signal
//! whose pauses end at once when it is given, and stopping it: signal,
//! then join, on `stop` (the pool's close) or drop. A pool closes without
//! waiting out a background thread's pause.

use super::Engine;
use crate::sync::{thread, Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The loop a background thread runs until stopped or the pool is gone.
pub(crate) type BackgroundLoop = fn(Weak<Engine>, Arc<Stop>);

/// A background thread's stop signal.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: Mutex<bool>,
    signal: Condvar,
}

impl Stop {
    pub fn is_set(&self) -> bool {
        *self.stopped.lock()
    }

    /// Pauses for `pause`, or less if stopped meanwhile; returns whether
    /// it is stopped.
    pub fn pause(&self, pause: Duration) -> bool {
        let mut stopped = self.stopped.lock();
        if !*stopped {
            self.signal.wait_for(&mut stopped, pause);
        }
        *stopped
    }

    fn set(&self) {
        *self.stopped.lock() = true;
        self.signal.notify_all();
    }
}

pub(crate) struct BackgroundThread {
    stop: Arc<Stop>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl BackgroundThread {
    /// Starts `body` on a thread named `name`, if `enabled`.
    pub fn start(
        inner: &Arc<Engine>,
        enabled: bool,
        name: &str,
        body: BackgroundLoop,
    ) -> Arc<BackgroundThread> {
        let stop = Arc::new(Stop::default());
        let thread = enabled.then(|| {
            let weak = Arc::downgrade(inner);
            let stop = stop.clone();
            thread::Builder::new()
                .name(name.into())
                .spawn(move || body(weak, stop))
                .unwrap_or_else(|e| panic!("spawning {name}: {e}"))
        });
        Arc::new(BackgroundThread {
            stop,
            thread: Mutex::new(thread),
        })
    }

    /// Signals the thread to stop and waits for it to end.
    pub fn stop(&self) {
        self.stop.set();
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
