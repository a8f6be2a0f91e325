//! Reads done at once (`Volume::try_read_now`, for callers on an event
//! loop), on real member files. On tmpfs (the members are memory, so a
//! read of them never waits for a drive) a read of flushed blocks,
//! of blocks still in an open row and of blocks never written is done
//! without a wait and is right; a block whose checksum is wrong is declined
//! and left to `read`, which repairs it; what is misaligned, out of range
//! or after close is declined, and `read` says why. On members read with
//! direct I/O nothing is done this way. Linux's: tmpfs, O_DIRECT (macOS
//! opens every member uncached, so its members' reads always wait).

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{sector_pattern, test_options};
use lograid::device::{FileMember, Member, OpenMode};
use lograid::{create_pool, CreateOptions, Error, Pool, Volume};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const BLOCK: usize = lograid::format::BLOCK_SIZE;
const MEMBER_BYTES: u64 = 32 << 20;

/// `blocks` 4 KiB blocks that all differ (from each other and from any
/// other `tag`'s).
fn pattern(tag: u64, blocks: usize) -> Vec<u8> {
    let mut out = vec![0u8; blocks * BLOCK];
    for (i, sector) in out.chunks_exact_mut(512).enumerate() {
        sector_pattern(tag, i as u64, sector);
    }
    out
}

/// A pool of three member files in `dir`, with a volume "vol" of 8 MiB.
fn file_pool(dir: &Path) -> (Pool, Volume, Vec<PathBuf>) {
    let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}.img"))).collect();
    let members: Vec<Arc<dyn Member>> = paths
        .iter()
        .map(|p| {
            FileMember::create_sparse(p, MEMBER_BYTES).unwrap();
            Arc::new(FileMember::open(p, OpenMode::ReadWrite).unwrap()) as Arc<dyn Member>
        })
        .collect();
    let opts = CreateOptions {
        name: "now".into(),
        parity: 1,
        chunk_bytes: 16 * 1024,
        segment_bytes: Some(64 * 1024),
        force: true,
        initial_volume: None,
    };
    let pool = create_pool(members, &opts, test_options()).unwrap();
    let vol = pool.create_volume("vol", 8 << 20).unwrap();
    (pool, vol, paths)
}

/// `try_read_now` of `len` bytes at `offset`: the bytes if it was done.
fn read_now(vol: &Volume, offset: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0xa5; len];
    vol.try_read_now(offset, &mut buf)
        .map(|r| r.map(|()| buf).unwrap())
}

/// Flips a byte of the one 4 KiB block of a member file that holds
/// `block`; panics unless exactly one does.
fn rot_on_member(paths: &[PathBuf], block: &[u8]) {
    let mut found = Vec::new();
    for p in paths {
        let bytes = std::fs::read(p).unwrap();
        for (i, b) in bytes.chunks_exact(BLOCK).enumerate() {
            if b == block {
                found.push((p.clone(), i));
            }
        }
    }
    assert_eq!(found.len(), 1, "copies of the block on the members");
    let (path, i) = &found[0];
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&[!block[100]], (i * BLOCK + 100) as u64)
        .unwrap();
}

#[test]
fn reads_from_cached_members_are_done_at_once_and_right() {
    let dir = tempfile::Builder::new().tempdir_in("/dev/shm").unwrap();
    let (_pool, vol, _) = file_pool(dir.path());
    let flushed = pattern(7, 64);
    vol.write(0, &flushed).unwrap();
    vol.flush().unwrap();
    // One run of many blocks, single blocks, and an unaligned caller buffer.
    assert!(read_now(&vol, 0, flushed.len()).unwrap() == flushed);
    for b in [0, 5, 63] {
        let got = read_now(&vol, (b * BLOCK) as u64, BLOCK).unwrap();
        assert!(got == flushed[b * BLOCK..(b + 1) * BLOCK]);
    }
    let mut unaligned = vec![0u8; 3 * BLOCK + 1];
    vol.try_read_now(BLOCK as u64, &mut unaligned[1..])
        .unwrap()
        .unwrap();
    assert!(unaligned[1..] == flushed[BLOCK..4 * BLOCK]);
    // Blocks never written read as zeroes; a block still in the open row
    // (not flushed) is read from memory.
    assert!(read_now(&vol, 1 << 20, 2 * BLOCK)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    let open = pattern(8, 1);
    vol.write(2 << 20, &open).unwrap();
    assert!(read_now(&vol, 2 << 20, BLOCK).unwrap() == open);
    // Sub-block writes held beside the block are applied.
    vol.write(512, &[0x3c; 512]).unwrap();
    let mut want = flushed[..BLOCK].to_vec();
    want[512..1024].fill(0x3c);
    assert!(read_now(&vol, 0, BLOCK).unwrap() == want);
}

#[test]
fn a_block_with_a_wrong_checksum_is_left_to_read_which_repairs_it() {
    let dir = tempfile::Builder::new().tempdir_in("/dev/shm").unwrap();
    let (pool, vol, paths) = file_pool(dir.path());
    let data = pattern(9, 16);
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    let victim = &data[3 * BLOCK..4 * BLOCK];
    rot_on_member(&paths, victim);
    let member_reads = |pool: &Pool| -> (u64, u64) {
        let members = pool.status().members;
        let reads = members.iter().map(|m| m.counters.reads).sum();
        (reads, members.iter().map(|m| m.counters.bytes_read).sum())
    };
    let (reads_before, bytes_before) = member_reads(&pool);
    // Declined: the block does not check out (and nothing is counted, the
    // member reads taken before the bad block included).
    assert!(read_now(&vol, 3 * BLOCK as u64, BLOCK).is_none());
    assert!(read_now(&vol, 0, data.len()).is_none());
    assert_eq!(member_reads(&pool), (reads_before, bytes_before));
    assert_eq!(pool.status().counters.user_bytes_read, 0);
    let repaired_before: u64 = pool
        .status()
        .members
        .iter()
        .map(|m| m.counters.repaired_blocks)
        .sum();
    assert_eq!(repaired_before, 0);
    // `read` repairs it from parity and writes it back...
    let mut got = vec![0u8; data.len()];
    vol.read(0, &mut got).unwrap();
    assert!(got == data);
    let repaired: u64 = pool
        .status()
        .members
        .iter()
        .map(|m| m.counters.repaired_blocks)
        .sum();
    assert_eq!(repaired, 1);
    // ...after which it is read at once again, and counted.
    let (reads_before, bytes_before) = member_reads(&pool);
    assert!(read_now(&vol, 0, data.len()).unwrap() == data);
    let (reads, bytes) = member_reads(&pool);
    assert!(reads > reads_before, "{reads} reads, {reads_before} before");
    assert_eq!(bytes, bytes_before + data.len() as u64);
}

#[test]
fn what_cannot_be_done_at_once_is_left_to_read() {
    let dir = tempfile::Builder::new().tempdir_in("/dev/shm").unwrap();
    let (pool, vol, _) = file_pool(dir.path());
    let size = vol.size_bytes();
    vol.write(0, &pattern(4, 2)).unwrap();
    // Not whole aligned blocks, empty, or past the end: declined.
    assert!(read_now(&vol, 512, BLOCK).is_none());
    assert!(read_now(&vol, 0, 512).is_none());
    assert!(read_now(&vol, 0, 0).is_none());
    assert!(read_now(&vol, size, BLOCK).is_none());
    assert!(read_now(&vol, size - BLOCK as u64, 2 * BLOCK).is_none());
    let top = u64::MAX / BLOCK as u64 * BLOCK as u64;
    assert!(read_now(&vol, top, BLOCK).is_none());
    let mut buf = vec![0u8; BLOCK];
    assert!(matches!(
        vol.read(size, &mut buf),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        vol.read(top, &mut buf),
        Err(Error::OutOfRange { .. })
    ));
    // Reads done at once count as reads.
    let before = pool.status().counters.user_bytes_read;
    read_now(&vol, 0, 2 * BLOCK).unwrap();
    assert_eq!(
        pool.status().counters.user_bytes_read,
        before + 2 * BLOCK as u64
    );
    // A deleted volume and a closed pool decline; `read` says why.
    let other = pool.create_volume("other", 1 << 20).unwrap();
    pool.delete_volume("other").unwrap();
    assert!(read_now(&other, 0, BLOCK).is_none());
    assert!(matches!(other.read(0, &mut buf), Err(Error::NotFound(_))));
    pool.close().unwrap();
    assert!(read_now(&vol, 0, BLOCK).is_none());
    assert!(matches!(vol.read(0, &mut buf), Err(Error::ReadOnly(_))));
}

/// Whether files in `dir` can be opened for direct I/O (then members there
/// are read with it, and a read always waits for the drive).
fn takes_direct_io(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join("probe");
    std::fs::write(&probe, [0u8; BLOCK]).unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok()
}

#[test]
fn members_read_with_direct_io_are_never_read_at_once() {
    let dir = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
    assert!(
        takes_direct_io(dir.path()),
        "this test needs /var/tmp on a filesystem with direct I/O"
    );
    let (_pool, vol, _) = file_pool(dir.path());
    let data = pattern(6, 4);
    vol.write(0, &data).unwrap();
    // In the open row: done from memory.
    assert!(read_now(&vol, 0, data.len()).unwrap() == data);
    vol.flush().unwrap();
    // On the members: declined, `read` reads them.
    assert!(read_now(&vol, 0, data.len()).is_none());
    let mut got = vec![0u8; data.len()];
    vol.read(0, &mut got).unwrap();
    assert!(got == data);
}
