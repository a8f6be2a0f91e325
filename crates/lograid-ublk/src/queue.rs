//! One hardware queue of a device: the thread the driver talks to.
//!
//! The thread maps the queue's request descriptors from /dev/ublkcN, sends one FETCH_REQ per
//! tag through its own io_uring (the driver serves a queue's commands from the one task that
//! fetched them), and then loops: a fetch completing means a request is there (its descriptor
//! is decoded and handed to the workers); its eventfd firing means workers finished requests
//! (each is committed with COMMIT_AND_FETCH_REQ, which also fetches the tag's next request).
//! A command completing with ABORT means the queue is going away; once every tag has, the
//! thread ends (its ring and mapping go with it).
//!
//! Owns: the ring, the descriptor mapping, and the protocol order (fetch, serve, commit).
//! Must never: block on the export (workers do), commit a tag twice, or send commands from any
//! other thread.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring};

use crate::completion::Completions;
use crate::error::UblkError;
use crate::request::decode;
use crate::uapi::{self, IoCmd, IoDesc};
use crate::workers::{Job, JobQueue};

/// `user_data` of the eventfd poll (tags are below 4096).
const WAKE: u64 = u64::MAX;

/// What a queue thread serves.
#[derive(Clone, Copy, Debug)]
pub struct QueueSpec {
    pub dev_id: u32,
    pub q_id: u16,
    pub depth: u16,
    pub size_bytes: u64,
    pub read_only: bool,
}

/// The queue's request descriptors, mapped read-only from /dev/ublkcN.
struct Descriptors {
    base: *const IoDesc,
    count: usize,
    mapped_bytes: usize,
}

impl Descriptors {
    fn map(char_device: &File, q_id: u16, depth: u16) -> Result<Descriptors, UblkError> {
        // SAFETY: sysconf has no memory arguments.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let round = |bytes: usize| bytes.div_ceil(page) * page;
        let desc_bytes = std::mem::size_of::<IoDesc>();
        let stride = round(usize::from(uapi::MAX_QUEUE_DEPTH) * desc_bytes);
        let mapped_bytes = round(usize::from(depth) * desc_bytes);
        let offset = uapi::CMD_BUF_OFFSET as usize + usize::from(q_id) * stride;
        // SAFETY: a new shared read-only mapping of the driver's descriptor pages; nothing
        // else refers to the address range it returns. The result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_bytes,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                char_device.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(UblkError::io(
                format!("mapping the request descriptors of queue {q_id}"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Descriptors {
            base: base as *const IoDesc,
            count: usize::from(depth),
            mapped_bytes,
        })
    }

    /// Tag `tag`'s descriptor as the driver wrote it before completing the tag's fetch.
    fn get(&self, tag: u16) -> IoDesc {
        assert!(
            usize::from(tag) < self.count,
            "tag {tag} beyond the queue depth"
        );
        // SAFETY: in bounds (asserted) of a live mapping; the driver does not change a tag's
        // descriptor while the tag is ours (between its fetch completing and its commit).
        unsafe { std::ptr::read_volatile(self.base.add(usize::from(tag))) }
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, used by nobody after this.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.mapped_bytes) };
    }
}

/// Everything the thread owns.
struct Queue {
    spec: QueueSpec,
    char_device: Arc<File>,
    jobs: Arc<JobQueue>,
    completions: Arc<Completions>,
    descriptors: Descriptors,
    ring: IoUring,
    /// Tags whose command ended (ABORT or an error): not to be sent again.
    finished_tags: usize,
}

/// Starts queue `spec.q_id`'s thread; returns once its fetches are with the driver (so the
/// device can be started or recovered), or with the error that stopped it.
pub fn spawn(
    spec: QueueSpec,
    char_device: Arc<File>,
    jobs: Arc<JobQueue>,
    completions: Arc<Completions>,
) -> Result<JoinHandle<Result<(), UblkError>>, UblkError> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("ublk-q{}-{}", spec.dev_id, spec.q_id))
        .spawn(move || {
            let queue = match Queue::new(spec, char_device, jobs, completions) {
                Ok(queue) => queue,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let ended = queue.run(ready_tx);
            if let Err(e) = &ended {
                tracing::error!(
                    dev_id = spec.dev_id,
                    q_id = spec.q_id,
                    "the queue stopped serving (its requests wait until the device is stopped): {e}"
                );
            }
            ended
        })
        .map_err(|e| UblkError::io("starting a ublk queue thread", e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(UblkError::io(
                format!("queue {} of /dev/ublkb{}", spec.q_id, spec.dev_id),
                std::io::Error::other("the queue thread ended before it was ready"),
            ))
        }
    }
}

impl Queue {
    fn new(
        spec: QueueSpec,
        char_device: Arc<File>,
        jobs: Arc<JobQueue>,
        completions: Arc<Completions>,
    ) -> Result<Queue, UblkError> {
        let descriptors = Descriptors::map(&char_device, spec.q_id, spec.depth)?;
        let entries = (u32::from(spec.depth) + 1).next_power_of_two();
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .build(entries)
            .map_err(|e| UblkError::io("setting up io_uring for a ublk queue", e))?;
        Ok(Queue {
            spec,
            char_device,
            jobs,
            completions,
            descriptors,
            ring,
            finished_tags: 0,
        })
    }

    fn run(mut self, ready: mpsc::Sender<Result<(), UblkError>>) -> Result<(), UblkError> {
        let first = match self.fetch_all() {
            Ok(first) => first,
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(());
            }
        };
        let _ = ready.send(Ok(()));
        self.handle(first)?;
        while self.finished_tags < usize::from(self.spec.depth) {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
                Err(e) => return Err(self.fail("waiting on the queue's ring", e)),
            }
            let events = self.reap();
            self.handle(events)?;
        }
        Ok(())
    }

    /// Sends every tag's FETCH_REQ and arms the wake poll; the completions already there (a
    /// refused fetch shows at once), or the refusal.
    fn fetch_all(&mut self) -> Result<Vec<(u64, i32)>, UblkError> {
        for tag in 0..self.spec.depth {
            let sqe = self.io_command(uapi::U_IO_FETCH_REQ, tag, -1);
            self.push(&sqe)?;
        }
        self.arm_wake()?;
        self.ring
            .submit()
            .map_err(|e| self.fail("sending the queue's fetches", e))?;
        let first = self.reap();
        if let Some((_, result)) = first.iter().find(|(data, res)| *data != WAKE && *res < 0) {
            return Err(UblkError::command("FETCH_REQ", self.spec.dev_id, -result));
        }
        Ok(first)
    }

    fn reap(&mut self) -> Vec<(u64, i32)> {
        self.ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect()
    }

    fn handle(&mut self, events: Vec<(u64, i32)>) -> Result<(), UblkError> {
        for (data, result) in events {
            if data == WAKE {
                self.commit_finished()?;
                continue;
            }
            let tag = data as u16;
            match result {
                uapi::IO_RES_OK => self.dispatch(tag),
                uapi::IO_RES_ABORT => self.finished_tags += 1,
                other => {
                    tracing::error!(
                        dev_id = self.spec.dev_id,
                        q_id = self.spec.q_id,
                        tag,
                        errno = -other,
                        "the driver refused a command for this tag; its requests stop"
                    );
                    self.finished_tags += 1;
                }
            }
        }
        Ok(())
    }

    /// Tag `tag` has a request: decode it and hand it to the workers.
    fn dispatch(&mut self, tag: u16) {
        let desc = self.descriptors.get(tag);
        let request = decode(&desc, self.spec.size_bytes, self.spec.read_only);
        self.jobs.push(Job {
            q_id: self.spec.q_id,
            tag,
            request,
            completions: self.completions.clone(),
        });
    }

    /// Commits every finished request (fetching each tag's next one) and re-arms the poll.
    fn commit_finished(&mut self) -> Result<(), UblkError> {
        for (tag, result) in self.completions.take() {
            let sqe = self.io_command(uapi::U_IO_COMMIT_AND_FETCH_REQ, tag, result);
            self.push(&sqe)?;
        }
        self.arm_wake()
    }

    fn io_command(&self, op: u32, tag: u16, result: i32) -> squeue::Entry {
        let cmd = IoCmd {
            q_id: self.spec.q_id,
            tag,
            result,
            addr: 0,
        };
        opcode::UringCmd16::new(types::Fd(self.char_device.as_raw_fd()), op)
            .cmd(uapi::bytes_of::<IoCmd, 16>(&cmd))
            .build()
            .user_data(u64::from(tag))
    }

    fn arm_wake(&mut self) -> Result<(), UblkError> {
        let sqe = opcode::PollAdd::new(types::Fd(self.completions.wake_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(&sqe)
    }

    /// Queues `sqe`, sending what is queued first when the submission queue is full.
    fn push(&mut self, sqe: &squeue::Entry) -> Result<(), UblkError> {
        loop {
            // SAFETY: the commands carry no pointers (user copy: `addr` is 0; the poll names
            // an eventfd this queue holds open for as long as the ring).
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring
                .submit()
                .map_err(|e| self.fail("sending queued commands", e))?;
        }
    }

    fn fail(&self, what: &str, e: std::io::Error) -> UblkError {
        UblkError::io(
            format!(
                "queue {} of /dev/ublkb{}: {what}",
                self.spec.q_id, self.spec.dev_id
            ),
            e,
        )
    }
}
