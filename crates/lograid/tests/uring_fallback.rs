//! Row writes through io_uring that fail: the column is written again the
//! ordinary way, and the member is faulted only when that fails too.
//!
//! The members are real files. Each hands io_uring a read-only descriptor of
//! its file (so every ring write fails with EBADF) and writes through a
//! read-write one otherwise; `write_at` can be made to fail as well.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

use lograid::device::Member;
use lograid::{create_pool, CreateOptions, PoolOptions};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

struct RingRefused {
    name: String,
    rw: File,
    read_only: File,
    size: u64,
    fail_writes: AtomicBool,
}

impl RingRefused {
    fn new(path: &Path, size: u64) -> RingRefused {
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        rw.set_len(size).unwrap();
        RingRefused {
            name: path.display().to_string(),
            read_only: File::open(path).unwrap(),
            rw,
            size,
            fail_writes: AtomicBool::new(false),
        }
    }
}

impl Member for RingRefused {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.rw.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.rw.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.rw.sync_data()
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.read_only.as_raw_fd())
    }
}

fn options() -> PoolOptions {
    PoolOptions {
        io_threads: 4,
        background_cleaner: false,
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 / 7).wrapping_mul(seed * 2 + 1) ^ seed) as u8)
        .collect()
}

#[test]
fn a_ring_write_that_fails_is_written_again_and_the_member_stays() {
    // The ring is opt-in; this test binary runs only this test, so the
    // switch is read after this line.
    std::env::set_var("LOGRAID_IO_URING", "1");
    if !lograid::device::uring::available() {
        eprintln!("io_uring unavailable here: test skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<Arc<RingRefused>> = (0..3)
        .map(|i| {
            Arc::new(RingRefused::new(
                &dir.path().join(format!("m{i}")),
                64 << 20,
            ))
        })
        .collect();
    let dyn_members: Vec<Arc<dyn Member>> = members
        .iter()
        .map(|m| m.clone() as Arc<dyn Member>)
        .collect();
    let create = CreateOptions {
        name: "ring".into(),
        parity: 1,
        chunk_bytes: 64 * 1024,
        segment_bytes: Some(1 << 20),
        force: true,
        initial_volume: None,
    };
    let pool = create_pool(dyn_members, &create, options()).unwrap();
    let vol = pool.create_volume("vol", 16 << 20).unwrap();
    let data = pattern(4 << 20, 3);
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    let status = pool.status();
    for m in &status.members {
        assert_eq!(m.state, "online", "{m:?}");
        // Every row's ring write failed once on every member and was
        // written again: errors counted, nothing faulted.
        assert!(m.counters.io_errors > 0, "{m:?}");
    }
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert!(back == data, "the data reads back");

    // Now the ordinary write fails too on member 1: it is faulted, and the
    // pool goes on degraded with everything readable.
    members[1].fail_writes.store(true, Ordering::SeqCst);
    let more = pattern(2 << 20, 5);
    vol.write(8 << 20, &more).unwrap();
    vol.flush().unwrap();
    let states: Vec<String> = pool
        .status()
        .members
        .iter()
        .map(|m| m.state.clone())
        .collect();
    assert_eq!(states[1], "faulted", "{states:?}");
    assert_eq!(states[0], "online");
    assert_eq!(states[2], "online");
    let mut back = vec![0u8; more.len()];
    vol.read(8 << 20, &mut back).unwrap();
    assert!(back == more);
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert!(back == data);
}
