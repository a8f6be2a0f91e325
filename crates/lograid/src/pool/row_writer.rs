//! A bounded queue of sealed rows and the threads that write them in the
//! background, so that the request whose append filled a row is
//! acknowledged without waiting for the row's member writes (a 1.5 MiB row
//! written in the request's own time is most of the latency tail at queue
//! depth 1). Knows nothing of how a row is written: it runs the function it
//! was started with (`Engine::start_row_writer`). Bounded: at most
//! `QUEUE_ROWS` rows wait here; beyond that `offer` gives the rows back and
//! the caller writes them itself (back-pressure). A caller that must not
//! write (`queue`, from an event loop) may go past it: rows in flight are
//! bounded by the engine's limits all the same. Must never drop a row it
//! took: the threads write every queued batch before they stop.

use super::ledger::SealedRow;
use crate::sync::{channel, thread, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Threads writing rows.
const THREADS: usize = 2;
/// Rows waiting to be written, at most.
const QUEUE_ROWS: usize = 1;

pub(crate) type Batch = Vec<Arc<SealedRow>>;

/// What the threads do with a batch (write it; a failure is recorded by it).
pub(crate) type WriteBatch = Arc<dyn Fn(Batch) + Send + Sync>;

pub(crate) struct RowWriter {
    sender: Mutex<Option<channel::Sender<Batch>>>,
    queued: Arc<AtomicUsize>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl RowWriter {
    /// A writer with no threads yet (`offer` gives every batch back).
    pub fn inline() -> RowWriter {
        RowWriter {
            sender: Mutex::new(None),
            queued: Arc::new(AtomicUsize::new(0)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Starts the threads, each running `write` on the batches it takes.
    pub fn start(&self, write: WriteBatch) {
        let (sender, receiver) = channel::unbounded::<Batch>();
        let mut threads = Vec::new();
        for i in 0..THREADS {
            let receiver = receiver.clone();
            let queued = self.queued.clone();
            let write = write.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("lograid-rows-{i}"))
                    .spawn(move || {
                        while let Ok(rows) = receiver.recv() {
                            let n = rows.len();
                            write(rows);
                            queued.fetch_sub(n, Ordering::SeqCst);
                        }
                    })
                    .expect("spawn row writer"),
            );
        }
        *self.sender.lock() = Some(sender);
        *self.threads.lock() = threads;
    }

    /// Queues `rows` for the threads, or gives them back if the queue is
    /// full or the writer is stopped (the caller writes them itself).
    pub fn offer(&self, rows: Batch) -> Option<Batch> {
        let n = rows.len();
        let reserved = self
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q + n <= QUEUE_ROWS).then_some(q + n)
            })
            .is_ok();
        if !reserved {
            return Some(rows);
        }
        self.send_counted(rows)
    }

    /// Queues `rows` for the threads even past the queue's bound, for a
    /// caller that must not write rows itself (on an event loop): rows in
    /// flight are bounded by the engine's limits all the same. Gives them
    /// back only if the writer is stopped.
    pub fn queue(&self, rows: Batch) -> Option<Batch> {
        self.queued.fetch_add(rows.len(), Ordering::SeqCst);
        self.send_counted(rows)
    }

    /// Sends `rows`, already counted in `queued`, to the threads; if the
    /// writer is stopped, takes them out of the count and gives them back.
    fn send_counted(&self, rows: Batch) -> Option<Batch> {
        let n = rows.len();
        let rows = match self.sender.lock().as_ref() {
            Some(sender) => match sender.send(rows) {
                Ok(()) => return None,
                Err(channel::SendError(rows)) => rows,
            },
            None => rows,
        };
        self.queued.fetch_sub(n, Ordering::SeqCst);
        Some(rows)
    }

    /// Whether the threads take rows (started, not stopped).
    pub fn running(&self) -> bool {
        self.sender.lock().is_some()
    }

    /// Stops taking rows and waits until those queued are written.
    pub fn stop(&self) {
        self.sender.lock().take();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}
