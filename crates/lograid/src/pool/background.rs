//! A pool's background threads and what each does every round: the
//! cleaner thread (keeps free segments ahead of writers, writes due
//! checkpoints, steps a rebuild or rebalance, samples rates, faults members
//! whose reads keep failing) and the resolver thread (keeps the table of
//! sub-block writes below its low watermark).
//!
//! Owns: starting a named thread on a loop given a weak reference to the
//! pool (so the thread never keeps a dropped pool alive) and a stop signal
//! whose pauses end at once when it is given, and stopping it: signal,
//! then join, on `stop` (the pool's close) or drop. A pool closes without
//! waiting out a background thread's pause.

use super::stats::CleanerState;
use super::Engine;
use crate::sync::{thread, Condvar, Mutex};
use std::sync::atomic::Ordering;
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
        engine: &Arc<Engine>,
        enabled: bool,
        name: &str,
        body: BackgroundLoop,
    ) -> Arc<BackgroundThread> {
        let stop = Arc::new(Stop::default());
        let thread = enabled.then(|| {
            let weak = Arc::downgrade(engine);
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

/// The background thread (`lograid-cleaner`) that keeps free segments ahead of writers and
/// writes checkpoints when enough log has accumulated.
pub(crate) fn cleaner_loop(weak: Weak<Engine>, stop: Arc<Stop>) {
    while !stop.is_set() {
        let Some(engine) = weak.upgrade() else { return };
        if engine.closed.load(Ordering::SeqCst) || engine.ledger.lock().read_only_reason.is_some() {
            drop(engine);
            stop.pause(Duration::from_millis(50));
            continue;
        }
        engine.check_read_health();
        engine.watch();
        let free = engine.ledger.lock().free.len();
        let watermark = engine.clean_watermark();
        if free < watermark {
            set_state(&engine, CleanerState::Background);
            match engine.guarded("cleaning", || engine.clean_segments(1)) {
                Ok(1) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("background cleaner: {e}");
                    stop.pause(Duration::from_millis(500));
                }
            }
        } else {
            set_state(&engine, CleanerState::Idle);
            if !engine.reshape_paused.load(Ordering::SeqCst) && reshape_and_throttle(&engine, &stop)
            {
                continue;
            }
        }
        let due = {
            let ledger = engine.ledger.lock();
            ledger.checkpoint_wanted
                || ledger.log_blocks_since_checkpoint >= engine.options.checkpoint_interval_blocks
        };
        if due {
            if let Err(e) = engine.guarded("checkpoint", || engine.checkpoint_log()) {
                tracing::warn!("background checkpoint: {e}");
            }
        }
        sample(&engine);
        drop(engine);
        stop.pause(Duration::from_millis(20));
    }
}

/// One reshape step (rebuild or rebalance) if there is one to do; while
/// users are doing I/O, then sleeps so that it takes at most
/// `reshape_share` of the time. True if it moved something.
fn reshape_and_throttle(engine: &Engine, stop: &Stop) -> bool {
    let user_io = |engine: &Engine| {
        let counters = engine.counters(&engine.ledger.lock());
        counters.user_bytes_written + counters.user_bytes_read
    };
    let before = user_io(engine);
    let started = std::time::Instant::now();
    match engine.guarded("reshape", || engine.reshape_step()) {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            tracing::warn!("rebuild/rebalance: {e}");
            stop.pause(Duration::from_millis(500));
            return false;
        }
    }
    let busy = user_io(engine) != before;
    engine.reshape.lock().users_busy = busy;
    log_reshape_progress(engine);
    if busy {
        let share = engine.options.reshape_share.clamp(0.05, 1.0);
        let pause = started.elapsed().mul_f64((1.0 - share) / share);
        stop.pause(pause);
    }
    true
}

/// How often a running rebuild or rebalance logs its progress.
const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Logs the progress of a rebuild or rebalance every
/// `PROGRESS_LOG_INTERVAL` (its start and end are events of their own).
fn log_reshape_progress(engine: &Engine) {
    {
        let mut r = engine.reshape.lock();
        let now = std::time::Instant::now();
        let due = r
            .progress_logged
            .is_none_or(|t| now.duration_since(t) >= PROGRESS_LOG_INTERVAL);
        if !due {
            return;
        }
        r.progress_logged = Some(now);
    }
    if let Some(s) = engine.reshape_status() {
        tracing::info!(
            "{} of pool '{}': {} segments ({} MiB) done, {} segments ({} MiB) left{}",
            s.kind,
            engine.shape.pool_name,
            s.segments_done,
            s.bytes_moved >> 20,
            s.segments_left,
            s.bytes_left >> 20,
            s.eta_seconds
                .map(|eta| format!(", about {eta:.0} s to go"))
                .unwrap_or_default()
        );
    }
}

/// The background state; a foreground (urgent) pass sets and clears its own.
fn set_state(engine: &Engine, state: CleanerState) {
    let mut stats = engine.stats.lock();
    if stats.cleaner_state != CleanerState::Urgent {
        stats.cleaner_state = state;
    }
}

/// Samples the write counters for the last-minute write amplification.
fn sample(engine: &Engine) {
    let (user, relocated) = {
        let ledger = engine.ledger.lock();
        (
            ledger.counters.user_bytes_written,
            ledger.counters.relocated_blocks,
        )
    };
    let member: u64 = engine
        .open_devices()
        .iter()
        .map(|(_, d)| d.counters.bytes_written.get())
        .sum();
    engine.stats.lock().sample(user, member, relocated);
}

/// The background thread (`lograid-resolver`) that keeps the overlay table below its low watermark, so
/// that writers rarely find it full and flushes have little to merge.
pub(crate) fn resolver_loop(weak: Weak<Engine>, stop: Arc<Stop>) {
    while !stop.is_set() {
        let Some(engine) = weak.upgrade() else { return };
        {
            let mut ledger = engine.ledger.lock();
            if ledger.overlays.len() <= ledger.overlays.low_watermark() {
                engine
                    .overlay_wake
                    .wait_for(&mut ledger, Duration::from_millis(20));
            }
            if engine.closed.load(Ordering::SeqCst) || ledger.read_only_reason.is_some() {
                drop(ledger);
                drop(engine);
                stop.pause(Duration::from_millis(50));
                continue;
            }
        }
        match engine.guarded("merging sub-block writes", || engine.resolve_background()) {
            Ok(_) => {}
            Err(e) => {
                // The overlays stay; the next flush reports the error.
                tracing::warn!("background merge of sub-block writes: {e}");
                drop(engine);
                stop.pause(Duration::from_millis(500));
            }
        }
    }
}
