//! Writing sealed user rows in the background.
//!
//! Owns: a small set of threads that write the rows a user write sealed, so
//! that the request whose append filled a row is acknowledged without
//! waiting for the row's parity and member writes (a 1.5 MiB row written in
//! the request's own time is most of the latency tail at queue depth 1).
//! Rows are in `Ledger::inflight` from the moment they are sealed, so reads
//! find their blocks in memory and a flush waits for them exactly as it
//! waits for rows other threads write. Bounded: at most `QUEUE_ROWS` rows
//! wait here; beyond that the writer writes its rows itself
//! (back-pressure), and the pool's in-flight limits still apply. Must
//! never: drop a row unwritten while the pool is open (a flush would wait
//! for it), or hide a write failure (failures fault the member, or stop the
//! pool writing, through the same `write_rows` every other path uses).

use super::ledger::SealedRow;
use super::Engine;
use crate::sync::{channel, thread, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Threads writing rows.
const THREADS: usize = 2;
/// Rows waiting to be written, at most.
const QUEUE_ROWS: usize = 1;

type Batch = Vec<Arc<SealedRow>>;

pub(crate) struct RowWriter {
    sender: Mutex<Option<channel::Sender<Batch>>>,
    queued: Arc<AtomicUsize>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl RowWriter {
    /// A writer with no threads yet (every submit writes in the caller).
    pub fn inline() -> RowWriter {
        RowWriter {
            sender: Mutex::new(None),
            queued: Arc::new(AtomicUsize::new(0)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Starts the threads of `inner.row_writer`.
    pub fn start(inner: &Arc<Engine>) {
        let (sender, receiver) = channel::unbounded::<Batch>();
        let mut threads = Vec::new();
        for i in 0..THREADS {
            let weak: Weak<Engine> = Arc::downgrade(inner);
            let receiver = receiver.clone();
            let queued = inner.row_writer.queued.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("lograid-rows-{i}"))
                    .spawn(move || {
                        while let Ok(rows) = receiver.recv() {
                            let n = rows.len();
                            if let Some(inner) = weak.upgrade() {
                                // A failure is recorded (the member faulted,
                                // or the pool read-only) and reported by the
                                // next flush and write.
                                let _ = inner.guarded("writing rows", || inner.write_rows(rows));
                            }
                            queued.fetch_sub(n, Ordering::SeqCst);
                        }
                    })
                    .expect("spawn row writer"),
            );
        }
        *inner.row_writer.sender.lock() = Some(sender);
        *inner.row_writer.threads.lock() = threads;
    }

    /// Stops taking rows and waits until those queued are written.
    pub fn stop(&self) {
        self.sender.lock().take();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Engine {
    /// Writes `rows` (just sealed by a user write) in the background, or
    /// here if the queue is full or stopped.
    pub(crate) fn submit_rows(&self, rows: Batch) -> crate::error::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let writer = &self.row_writer;
        let n = rows.len();
        // Take places in the queue, or write here if there are none.
        let reserved = writer
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q + n <= QUEUE_ROWS).then_some(q + n)
            })
            .is_ok();
        if !reserved {
            return self.write_rows(rows);
        }
        let rows = match writer.sender.lock().as_ref() {
            Some(sender) => match sender.send(rows) {
                Ok(()) => return Ok(()),
                Err(channel::SendError(rows)) => rows,
            },
            None => rows,
        };
        // Stopped: give the places back and write here.
        writer.queued.fetch_sub(n, Ordering::SeqCst);
        self.write_rows(rows)
    }
}
