//! Writing the columns of a row with one io_uring submission (opt-in:
//! `LOGRAID_IO_URING=1`).
//!
//! Owns: one ring per writing thread (made on first use), and a batch write
//! that puts every column of a row on it and waits for all of them, so a
//! row costs one system call and no thread hand-offs instead of a wake-up
//! of an I/O thread per column. Only members that expose a file
//! descriptor take part (files and block devices); a batch with any other
//! member, or a thread whose ring cannot be made, is not handled here and
//! goes through the I/O pool as before. A column the ring fails to write
//! whole is reported as not written, and the caller writes it again the
//! usual way (with its retries and fault handling). Must never: return
//! while the kernel may still read a buffer of the batch.

use super::Device;
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;

/// Entries per ring: more columns than that are submitted in rounds.
const RING_ENTRIES: u32 = 32;

enum Ring {
    Unmade,
    Ready(Box<IoUring>),
    /// io_uring is not available to this thread (disabled, or no memory).
    Unavailable,
}

thread_local! {
    static RING: RefCell<Ring> = const { RefCell::new(Ring::Unmade) };
}

/// One column to write: the device, the bytes and the byte offset.
pub struct ColumnWrite<'a> {
    pub device: &'a Device,
    pub bytes: &'a [u8],
    pub offset: u64,
}

/// Writes every column through this thread's ring and waits for all.
/// `None` if the batch is not for the ring (a member without a file
/// descriptor, or no ring on this thread); nothing was written then.
/// Otherwise one result per column, in order: `Ok` when written whole;
/// an error (from the kernel, or for a short write) means the column may
/// be partly written and must be written again.
pub fn write_columns(columns: &[ColumnWrite<'_>]) -> Option<Vec<io::Result<()>>> {
    if !enabled() || columns.is_empty() {
        return None;
    }
    let fds: Vec<i32> = columns
        .iter()
        .map(|c| c.device.member.raw_fd())
        .collect::<Option<_>>()?;
    RING.with(|cell| {
        let mut state = cell.borrow_mut();
        if let Ring::Unmade = *state {
            *state = match make_ring() {
                Ok(r) => Ring::Ready(Box::new(r)),
                Err(e) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        tracing::info!(
                            "io_uring unavailable ({e}); rows are written by the I/O pool"
                        );
                    });
                    Ring::Unavailable
                }
            };
        }
        let Ring::Ready(ring) = &mut *state else {
            return None;
        };
        let mut results: Vec<Option<io::Result<()>>> = (0..columns.len()).map(|_| None).collect();
        let started = std::time::Instant::now();
        for round in (0..columns.len()).step_by(RING_ENTRIES as usize) {
            let end = (round + RING_ENTRIES as usize).min(columns.len());
            submit_round(ring, columns, &fds, round..end, &mut results);
        }
        // Each column is timed as the batch it was in.
        let took = started.elapsed();
        Some(
            results
                .into_iter()
                .zip(columns)
                .map(|(r, c)| {
                    let r = r.expect("every column answered");
                    // Counted as `Device::write_at` counts an attempt.
                    let counters = &c.device.counters;
                    counters.writes.add(1);
                    counters.bytes_written.add(c.bytes.len() as u64);
                    c.device.latency.writes.record(took);
                    c.device.completed(&r);
                    r
                })
                .collect(),
        )
    })
}

/// Whether rows go through io_uring in this process: it is not turned off,
/// and the kernel lets this process make a ring with the write operation
/// (a container's seccomp filter or `kernel.io_uring_disabled` may not).
pub fn available() -> bool {
    enabled() && make_ring().is_ok()
}

/// A ring that has the write opcode (Linux 5.6 and later).
fn make_ring() -> io::Result<IoUring> {
    let ring = IoUring::new(RING_ENTRIES)?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    if !probe.is_supported(opcode::Write::CODE) {
        return Err(io::Error::other(
            "the kernel's io_uring has no write operation",
        ));
    }
    Ok(ring)
}

/// Whether the ring is used at all: only with `LOGRAID_IO_URING=1` (and
/// always in this module's unit tests). Off by default: on sparse member
/// files it cost 6-11% of the 4 KiB random-write IOPS (docs/BENCHMARKS.md,
/// "A row's columns in one io_uring submission").
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cfg!(test) || *ON.get_or_init(|| std::env::var("LOGRAID_IO_URING").is_ok_and(|v| v == "1"))
}

/// Submits columns `range` and waits until every one submitted has
/// completed; those that could not be submitted get an error.
fn submit_round(
    ring: &mut IoUring,
    columns: &[ColumnWrite<'_>],
    fds: &[i32],
    range: std::ops::Range<usize>,
    results: &mut [Option<io::Result<()>>],
) {
    // Every entry is built before any is queued, so nothing can panic
    // between queueing and submitting: an entry left queued would be
    // submitted by this thread's next batch, long after its buffer moved on.
    let entries: Vec<(usize, io_uring::squeue::Entry)> = range
        .clone()
        .map(|i| {
            let c = &columns[i];
            let len = u32::try_from(c.bytes.len()).expect("a column is far below 4 GiB");
            let sqe = opcode::Write::new(types::Fd(fds[i]), c.bytes.as_ptr(), len)
                .offset(c.offset)
                .build()
                .user_data(i as u64);
            (i, sqe)
        })
        .collect();
    // Aborts the process if this function is left (by a panic) while writes
    // are in flight: see the wait error below.
    let mut in_flight = InFlight(0);
    for (i, sqe) in &entries {
        // SAFETY: the buffer and the descriptor outlive the operation: this
        // function does not return before its completion has been reaped.
        if unsafe { ring.submission().push(sqe) }.is_err() {
            results[*i] = Some(Err(io::Error::other("io_uring submission queue full")));
            continue;
        }
        in_flight.0 += 1;
    }
    let mut busy = 0u32;
    while in_flight.0 > 0 {
        match ring.submit_and_wait(1) {
            Ok(_) => busy = 0,
            // Interrupted, or the kernel short of memory for a moment.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) && busy < 10_000 =>
            {
                busy += 1;
                if busy > 1 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            Err(e) => {
                // Writes may be in flight on buffers the caller reuses once
                // this returns. With a valid ring this cannot happen
                // (io_uring_enter fails only as handled above).
                tracing::error!("io_uring wait failed with writes in flight: {e}");
                stop(&e.to_string());
            }
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            let c = &columns[i];
            let res = cqe.result();
            results[i] = Some(if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else if res as usize != c.bytes.len() {
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write: {res} of {} bytes", c.bytes.len()),
                ))
            } else {
                Ok(())
            });
            in_flight.0 -= 1;
        }
    }
}

/// Writes queued on the ring and not yet reaped.
struct InFlight(usize);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0 > 0 {
            stop("left with writes in flight");
        }
    }
}

/// Stops the process: the kernel may still read buffers that are about to be
/// reused (a row buffer recycled for the next row could be written over the
/// member). Never reached with a valid ring; the log on the members is
/// consistent at any instant, as after a crash.
fn stop(why: &str) -> ! {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "lograid: io_uring wait failed with writes in flight ({why}); stopping"
    );
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{AlignedBuf, FileMember, Member, OpenMode, SimMember, StaleSegments};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    fn have_uring() -> bool {
        let ok = available();
        if !ok {
            eprintln!("io_uring unavailable here: test skipped");
        }
        ok
    }

    fn device(member: Arc<dyn Member>) -> Device {
        Device::new(member, Arc::new(StaleSegments::new(0, 1 << 20)))
    }

    fn pattern(len: usize, seed: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len);
        for (i, x) in b.iter_mut().enumerate() {
            *x = seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ (i as u8);
        }
        b
    }

    #[test]
    fn writes_every_column_of_a_batch_larger_than_the_ring() {
        if !have_uring() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let devices: Vec<Device> = (0..3)
            .map(|m| {
                let path = dir.path().join(format!("m{m}"));
                FileMember::create_sparse(&path, 64 << 20).unwrap();
                device(Arc::new(
                    FileMember::open(&path, OpenMode::ReadWrite).unwrap(),
                ))
            })
            .collect();
        // 3 members x 30 columns of 64 KiB: three rounds of the ring.
        let bufs: Vec<AlignedBuf> = (0..90).map(|i| pattern(64 << 10, i as u8)).collect();
        let batch: Vec<ColumnWrite<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| ColumnWrite {
                device: &devices[i % 3],
                bytes: b,
                offset: (i / 3) as u64 * (64 << 10),
            })
            .collect();
        let results = write_columns(&batch).expect("files take the ring");
        assert_eq!(results.len(), 90);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        for (i, b) in bufs.iter().enumerate() {
            let mut back = AlignedBuf::zeroed(64 << 10);
            devices[i % 3]
                .read_at(&mut back, (i / 3) as u64 * (64 << 10))
                .unwrap();
            assert!(back[..] == b[..], "column {i} reads back as written");
        }
        for d in &devices {
            assert_eq!(d.counters.writes.get(), 30);
            assert_eq!(d.latency.writes.values().count(), 30);
            assert_eq!(d.counters.bytes_written.get(), 30 * (64 << 10));
            assert_eq!(d.counters.io_errors.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn a_failed_column_is_reported_and_counted_and_the_others_are_written() {
        if !have_uring() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        let bad = dir.path().join("bad");
        FileMember::create_sparse(&good, 1 << 20).unwrap();
        FileMember::create_sparse(&bad, 1 << 20).unwrap();
        let good = device(Arc::new(
            FileMember::open(&good, OpenMode::ReadWrite).unwrap(),
        ));
        // Opened read-only: the kernel refuses the write (EBADF).
        let bad = device(Arc::new(
            FileMember::open(&bad, OpenMode::ReadOnly).unwrap(),
        ));
        let b = pattern(8192, 7);
        let results = write_columns(&[
            ColumnWrite {
                device: &good,
                bytes: &b,
                offset: 0,
            },
            ColumnWrite {
                device: &bad,
                bytes: &b,
                offset: 0,
            },
        ])
        .unwrap();
        assert!(results[0].is_ok());
        assert_eq!(
            results[1].as_ref().unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(bad.counters.io_errors.load(Ordering::Relaxed), 1);
        // Counted as an attempt, as `Device::write_at` counts one.
        assert_eq!(bad.counters.writes.get(), 1);
        assert_eq!(bad.counters.bytes_written.get(), 8192);
        let mut back = AlignedBuf::zeroed(8192);
        good.read_at(&mut back, 0).unwrap();
        assert!(back[..] == b[..]);
    }

    #[test]
    fn a_batch_with_a_member_without_a_descriptor_is_left_to_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        FileMember::create_sparse(&path, 1 << 20).unwrap();
        let file = device(Arc::new(
            FileMember::open(&path, OpenMode::ReadWrite).unwrap(),
        ));
        let sim = device(Arc::new(SimMember::new("sim", 1 << 20)));
        let b = pattern(4096, 1);
        let none = write_columns(&[
            ColumnWrite {
                device: &file,
                bytes: &b,
                offset: 0,
            },
            ColumnWrite {
                device: &sim,
                bytes: &b,
                offset: 0,
            },
        ]);
        assert!(none.is_none());
        assert_eq!(file.counters.writes.get(), 0, "nothing written");
        assert!(write_columns(&[]).is_none());
    }
}
