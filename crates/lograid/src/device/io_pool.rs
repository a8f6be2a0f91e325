//! The I/O worker pool: a fixed set of threads that run member I/O jobs, so
//! that the columns of a row (and several rows) go to the members in
//! parallel. A caller hands its jobs over and waits for all of them; it
//! runs the last one itself. Waiting, on either side, parks the thread at
//! once (a lock and a condition variable) rather than spinning and yielding
//! first: a hand-off here comes once per row (up to a MiB), where a few
//! microseconds of wake-up cost nothing, while threads spinning on a
//! machine with every core busy took the cores from the work (a sixth of
//! the NBD server's context switches under 4 KiB writes).
//!
//! Owns: the queue of jobs, the workers, and the order of results. Must
//! never: lose a job, return before every job of a call has answered, or
//! let a panicking job take a worker down (the panic is resumed in its
//! caller once the call's other jobs have answered).

use crate::sync::{thread, Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A job for `IoPool::run_all`.
pub type IoJob<T> = Box<dyn FnOnce() -> T + Send + 'static>;

/// Jobs waiting for a worker, and whether the pool is closing.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closing: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the pool closes.
    queued: Condvar,
}

/// The answers of one `run_all` call, as they arrive.
struct Answers<T> {
    results: Vec<Option<std::thread::Result<T>>>,
    missing: usize,
}

/// A fixed pool of threads that run I/O jobs. Bounded: at most `threads`
/// jobs run at once on it; callers wait for their own jobs.
pub struct IoPool {
    shared: Arc<Shared>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl IoPool {
    pub fn new(threads: usize) -> IoPool {
        let shared = Arc::new(Shared::default());
        let workers = (0..threads)
            .map(|i| {
                let shared = shared.clone();
                thread::Builder::new()
                    .name(format!("lograid-io-{i}"))
                    .spawn(move || work(&shared))
                    .expect("spawn I/O thread")
            })
            .collect();
        IoPool { shared, workers }
    }

    /// Runs every job and waits for all; results in job order. The last
    /// job runs on the calling thread, the others on the pool (a row of
    /// three columns costs two hand-offs, and its caller works instead of
    /// waiting idle). A job that panics does not take its worker down: the
    /// panic is resumed in the caller once every job has answered.
    pub fn run_all<T: Send + 'static>(&self, mut jobs: Vec<IoJob<T>>) -> Vec<T> {
        let n = jobs.len();
        let Some(last) = jobs.pop() else {
            return Vec::new();
        };
        let answers = Arc::new((
            Mutex::new(Answers {
                results: (0..n).map(|_| None).collect(),
                missing: n,
            }),
            Condvar::new(),
        ));
        if !jobs.is_empty() {
            let mut queue = self.shared.queue.lock();
            for (i, job) in jobs.into_iter().enumerate() {
                let answers = answers.clone();
                queue.jobs.push_back(Box::new(move || {
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    answer(&answers, i, result);
                }));
            }
            drop(queue);
            // One worker per job queued (a worker that finds the queue empty waits again).
            for _ in 0..n - 1 {
                self.shared.queued.notify_one();
            }
        }
        let here = std::panic::catch_unwind(std::panic::AssertUnwindSafe(last));
        answer(&answers, n - 1, here);
        let (lock, answered) = &*answers;
        let mut got = lock.lock();
        while got.missing > 0 {
            answered.wait(&mut got);
        }
        let mut out = Vec::with_capacity(n);
        let mut panic = None;
        for result in got.results.drain(..) {
            match result.expect("every job answered") {
                Ok(v) => out.push(v),
                Err(p) => panic = Some(p),
            }
        }
        drop(got);
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
        out
    }
}

/// Records job `i`'s result; wakes the caller when it was the last.
fn answer<T>(answers: &(Mutex<Answers<T>>, Condvar), i: usize, result: std::thread::Result<T>) {
    let (lock, answered) = answers;
    let mut got = lock.lock();
    got.results[i] = Some(result);
    got.missing -= 1;
    if got.missing == 0 {
        answered.notify_one();
    }
}

/// A worker: runs queued jobs until the pool closes and the queue is empty.
fn work(shared: &Shared) {
    loop {
        let job = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if queue.closing {
                    return;
                }
                shared.queued.wait(&mut queue);
            }
        };
        job();
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.queued.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(n: usize, panics_at: Option<usize>) -> Vec<IoJob<usize>> {
        (0..n)
            .map(|i| -> IoJob<usize> {
                Box::new(move || {
                    assert!(Some(i) != panics_at, "job {i} panics");
                    i * 10
                })
            })
            .collect()
    }

    #[test]
    fn every_job_runs_once_in_order_and_a_panic_is_resumed_after_all_answer() {
        let pool = IoPool::new(2);
        assert_eq!(pool.run_all(jobs(0, None)), Vec::<usize>::new());
        assert_eq!(pool.run_all(jobs(1, None)), vec![0]);
        assert_eq!(pool.run_all(jobs(5, None)), vec![0, 10, 20, 30, 40]);
        // A panic on a worker or on the caller (the last job) reaches the
        // caller; the pool's workers keep serving.
        for at in [0, 4] {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run_all(jobs(5, Some(at)))
            }));
            assert!(caught.is_err());
        }
        assert_eq!(pool.run_all(jobs(3, None)), vec![0, 10, 20]);
    }

    #[test]
    fn callers_on_many_threads_each_get_their_own_answers() {
        let pool = Arc::new(IoPool::new(3));
        let callers: Vec<_> = (0..8)
            .map(|c| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for round in 0..200 {
                        let jobs: Vec<IoJob<usize>> = (0..4)
                            .map(|i| -> IoJob<usize> { Box::new(move || c * 1000 + round + i) })
                            .collect();
                        let want: Vec<usize> = (0..4).map(|i| c * 1000 + round + i).collect();
                        assert_eq!(pool.run_all(jobs), want);
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    }
}
