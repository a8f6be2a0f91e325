//! The threads that run requests on a device's export: the engine's calls block, so the queue
//! threads (which must stay free to talk to the driver) hand each request to this pool.
//!
//! A worker copies a write's data out of the kernel's request (`pread` on /dev/ublkcN at the
//! request's user-copy position, `UBLK_F_USER_COPY`), calls the export, copies a read's data
//! into the request (`pwrite`), and hands the result back: to the queue, or on a write-through
//! device for a modifying request, to the group commit. Each worker owns one buffer of at most
//! [`MAX_IO_BYTES`], so a device's request data in memory is bounded by its worker count.
//!
//! Owns: the job queue (bounded by the queues' depth: a tag is queued at most once), the
//! workers, the data copies, and the device's counters. Must never: complete a request before
//! the export returned, or touch a request's data after handing its result on.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use lograid_nbd::Export;

use crate::completion::{lock, Completions, GroupCommit};
use crate::error::UblkError;
use crate::params::MAX_IO_BYTES;
use crate::request::{execute, Request};
use crate::uapi;

/// One request for a worker.
pub struct Job {
    pub q_id: u16,
    pub tag: u16,
    pub request: Request,
    pub completions: Arc<Completions>,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    closed: bool,
}

/// The jobs of one device, shared by its queue threads (producers) and workers (consumers).
#[derive(Default)]
pub struct JobQueue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
}

impl JobQueue {
    pub fn push(&self, job: Job) {
        lock(&self.jobs).queue.push_back(job);
        self.ready.notify_one();
    }

    /// The next job, or `None` once closed and empty.
    fn pop(&self) -> Option<Job> {
        let mut jobs = lock(&self.jobs);
        loop {
            if let Some(job) = jobs.queue.pop_front() {
                return Some(job);
            }
            if jobs.closed {
                return None;
            }
            jobs = self
                .ready
                .wait(jobs)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn close(&self) {
        lock(&self.jobs).closed = true;
        self.ready.notify_all();
    }
}

/// What a device has served, for its log line at stop.
#[derive(Default, Debug)]
pub struct DeviceStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub zeroes: AtomicU64,
    pub errors: AtomicU64,
}

impl DeviceStats {
    fn count(&self, request: &Request, result: i32) {
        let add = |counter: &AtomicU64, n: u64| {
            counter.fetch_add(n, Ordering::Relaxed);
        };
        if result < 0 {
            add(&self.errors, 1);
            return;
        }
        match request {
            Request::Read { length, .. } => {
                add(&self.reads, 1);
                add(&self.read_bytes, u64::from(*length));
            }
            Request::Write { length, .. } => {
                add(&self.writes, 1);
                add(&self.written_bytes, u64::from(*length));
            }
            Request::Flush => add(&self.flushes, 1),
            Request::Discard { .. } => add(&self.discards, 1),
            Request::WriteZeroes { .. } => add(&self.zeroes, 1),
            Request::Refuse(_) => add(&self.errors, 1),
        }
    }
}

/// What every worker of a device shares.
pub struct WorkerContext {
    pub export: Arc<dyn Export>,
    /// /dev/ublkcN, for the data copies.
    pub char_device: Arc<File>,
    /// Write-through devices only.
    pub group_commit: Option<Arc<GroupCommit>>,
    pub stats: Arc<DeviceStats>,
}

/// A device's workers.
pub struct Workers {
    jobs: Arc<JobQueue>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn start(
        count: usize,
        name: &str,
        context: Arc<WorkerContext>,
    ) -> Result<Workers, UblkError> {
        let jobs = Arc::new(JobQueue::default());
        let mut workers = Workers {
            jobs: jobs.clone(),
            threads: Vec::with_capacity(count),
        };
        for index in 0..count {
            let (jobs, context) = (jobs.clone(), context.clone());
            let thread = std::thread::Builder::new()
                .name(format!("ublk-io-{name}-{index}"))
                .spawn(move || work(&jobs, &context))
                .map_err(|e| UblkError::io("starting a ublk worker thread", e))?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    pub fn jobs(&self) -> Arc<JobQueue> {
        self.jobs.clone()
    }

    /// Finishes the queued jobs and ends the threads.
    pub fn stop(&mut self) {
        self.jobs.close();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(jobs: &JobQueue, context: &WorkerContext) {
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(job) = jobs.pop() {
        // A panic in an export call fails its request instead of leaving the tag (and the
        // device, and its stop) waiting for ever.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve(context, &job, &mut buffer)
        }));
        let result = served.unwrap_or_else(|_| {
            tracing::error!(
                q_id = job.q_id,
                tag = job.tag,
                "a request panicked; it fails with EIO"
            );
            buffer = Vec::new();
            -libc::EIO
        });
        context.stats.count(&job.request, result);
        match &context.group_commit {
            Some(commit) if job.request.modifies() && result >= 0 => {
                commit.hold(job.completions, job.tag, result)
            }
            _ => job.completions.push(job.tag, result),
        }
    }
}

/// Runs one job, data copies included; the driver's result.
fn serve(context: &WorkerContext, job: &Job, buffer: &mut Vec<u8>) -> i32 {
    let length = job.request.data_bytes();
    debug_assert!(
        length <= MAX_IO_BYTES as usize,
        "request longer than the device's limit"
    );
    if buffer.len() < length {
        buffer.resize(length, 0);
    }
    let data = &mut buffer[..length];
    let position = user_copy_position(job.q_id, job.tag);
    if let Request::Write { .. } = job.request {
        if let Err(e) = read_exact_at(&context.char_device, data, position) {
            tracing::warn!(
                q_id = job.q_id,
                tag = job.tag,
                "copying a write's data from the kernel: {e}"
            );
            return -libc::EIO;
        }
    }
    let result = execute(context.export.as_ref(), job.request, data);
    if let (Request::Read { .. }, true) = (job.request, result > 0) {
        if let Err(e) = context.char_device.write_all_at(data, position) {
            tracing::warn!(
                q_id = job.q_id,
                tag = job.tag,
                "copying a read's data to the kernel: {e}"
            );
            return -libc::EIO;
        }
    }
    result
}

/// `pread` until `data` is full; a short copy (the request went away) is an error.
fn read_exact_at(file: &File, data: &mut [u8], position: u64) -> std::io::Result<()> {
    file.read_exact_at(data, position)
}

/// Where request (`q_id`, `tag`)'s data is on /dev/ublkcN.
pub fn user_copy_position(q_id: u16, tag: u16) -> u64 {
    uapi::IO_BUF_OFFSET
        + (u64::from(q_id) << uapi::QUEUE_OFFSET_BITS)
        + (u64::from(tag) << uapi::TAG_OFFSET_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_copy_positions() {
        assert_eq!(user_copy_position(0, 0), 0x8000_0000);
        assert_eq!(user_copy_position(0, 1), 0x8000_0000 + (1 << 25));
        assert_eq!(user_copy_position(1, 0), 0x8000_0000 + (1 << 41));
        assert_eq!(
            user_copy_position(4095, 4095),
            0x8000_0000 + (4095 << 41) + (4095 << 25)
        );
    }
}
