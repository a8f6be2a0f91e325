//! Durability when operations overlap: one operation is held inside its
//! member I/O (a flush's or a checkpoint's syncs, a checkpoint's superblock
//! writes) while another runs beside it, and the power is cut at that
//! instant. Whatever the second operation acknowledged as durable must be in
//! what the members hold then; and an operation that depends on the held
//! one must wait for it.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{pattern, wait_until, SimPool};
use lograid::device::{AlignedBuf, Device, Member, SimMember, StaleSegments};
use lograid::device::{CrashMode, Hold, SimRng};
use lograid::{Error, PoolOptions, Volume};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const BLOCK: usize = lograid::format::BLOCK_SIZE;

/// How long an operation that must wait is watched before it counts as
/// waiting (a correct one waits until released; a wrong one returned within
/// milliseconds when this test was written).
const WATCH: Duration = Duration::from_millis(300);

/// Waits until some member holds I/O at its gate.
fn wait_for_held(pool: &SimPool, what: &str) {
    wait_until(what, || pool.sims.iter().any(|s| s.held() > 0));
}

/// Lets every held I/O go when dropped (also while a test unwinds).
struct ReleaseOnDrop<'a>(&'a SimPool);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        release_all(self.0);
    }
}

fn release_all(pool: &SimPool) {
    for s in &pool.sims {
        s.release();
    }
}

fn read(vol: &Volume, offset: u64, blocks: usize) -> lograid::Result<Vec<u8>> {
    let mut buf = vec![0u8; blocks * BLOCK];
    vol.read(offset, &mut buf)?;
    Ok(buf)
}

/// Options without background threads, so that only the operations of the
/// test touch the members.
fn quiet() -> PoolOptions {
    common::test_options()
}

#[derive(Debug, Clone, Copy)]
enum Held {
    Flush,
    Checkpoint,
}

#[derive(Debug, Clone, Copy)]
enum Beside {
    Flush,
    FuaWrite,
}

/// Write W; start `held` and hold it in its member syncs; start `beside`.
/// `beside` must not return while the syncs are held; with the power cut at
/// that instant, W must be there if it did; once released, both succeed
/// and W survives a power cut.
fn beside_a_held_sync(held: Held, beside: Beside) {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x11, 1)).unwrap();
    for s in &pool.sims {
        s.hold(Hold::Flushes);
    }
    let (returned_early, images) = std::thread::scope(|scope| {
        let first = scope.spawn(|| match held {
            Held::Flush => vol.flush(),
            Held::Checkpoint => pool.pool().checkpoint(),
        });
        wait_for_held(&pool, "the first operation to reach its syncs");
        let (done_tx, done_rx) = mpsc::channel();
        let vol = &vol;
        let second = scope.spawn(move || {
            let r = match beside {
                Beside::Flush => vol.flush(),
                Beside::FuaWrite => vol.write_fua(BLOCK as u64, &pattern(0x22, 1)),
            };
            let _ = done_tx.send(());
            r
        });
        let returned_early = done_rx.recv_timeout(WATCH).is_ok();
        // The power cut, at this instant: only what is durable survives.
        let images = pool.images_now(CrashMode::DropAll, &mut SimRng(7));
        release_all(&pool);
        first.join().unwrap().expect("the held operation");
        second.join().unwrap().expect("the operation beside it");
        (returned_early, images)
    });
    if returned_early {
        let crashed = SimPool::open_images(images, quiet()).expect("reopen after the cut");
        let got = read(crashed.volume(), 0, 1).expect("read W after the cut");
        assert_eq!(
            got,
            pattern(0x11, 1),
            "{beside:?} returned while a {held:?} was held in its syncs, and W was lost by a power cut then"
        );
    }
    assert!(
        !returned_early,
        "{beside:?} returned while a {held:?} was held in its syncs: it acknowledged what it had not made durable"
    );
    let pool = pool
        .crash(CrashMode::DropAll, &mut SimRng(8))
        .expect("reopen");
    assert_eq!(read(pool.volume(), 0, 1).unwrap(), pattern(0x11, 1));
    if let Beside::FuaWrite = beside {
        assert_eq!(
            read(pool.volume(), BLOCK as u64, 1).unwrap(),
            pattern(0x22, 1)
        );
    }
}

#[test]
fn a_flush_waits_for_the_syncs_of_a_flush_before_it() {
    beside_a_held_sync(Held::Flush, Beside::Flush);
}

#[test]
fn a_fua_write_waits_for_the_syncs_of_a_flush_before_it() {
    beside_a_held_sync(Held::Flush, Beside::FuaWrite);
}

#[test]
fn a_flush_waits_for_the_syncs_of_a_checkpoint() {
    beside_a_held_sync(Held::Checkpoint, Beside::Flush);
}

#[test]
fn a_fua_write_waits_for_the_syncs_of_a_checkpoint() {
    beside_a_held_sync(Held::Checkpoint, Beside::FuaWrite);
}

/// Holds the writes of the head superblock slots (blocks 0 and 1) of every
/// member, so a checkpoint stops after its rows are durable and before any
/// superblock points at it (each member's tail slot is written after its
/// head slot).
fn hold_superblocks(pool: &SimPool) {
    for s in &pool.sims {
        s.hold(Hold::WritesIn {
            from: 0,
            to: 2 * BLOCK as u64,
        });
    }
}

/// Runs `change` (which checkpoints) in a thread, held before its
/// superblocks are written; runs `beside` meanwhile; cuts the power; lets
/// the change finish. Returns what `beside` returned, the images at the cut,
/// and the change's own result.
fn beside_a_held_checkpoint<T: Send>(
    pool: &SimPool,
    change: impl FnOnce() -> lograid::Result<()> + Send,
    beside: impl FnOnce() -> T,
) -> (T, Vec<Vec<u8>>, lograid::Result<()>) {
    hold_superblocks(pool);
    std::thread::scope(|scope| {
        let changing = scope.spawn(change);
        wait_for_held(pool, "the change's checkpoint to reach its superblocks");
        let got = beside();
        let images = pool.images_now(CrashMode::DropAll, &mut SimRng(3));
        release_all(pool);
        let changed = changing.join().unwrap();
        (got, images, changed)
    })
}

/// A volume being deleted frees its space only once the deletion is
/// durable: flushes of another volume meanwhile, then a power cut, leave it
/// whole (the deletion had not returned).
#[test]
fn a_volume_deleted_while_another_flushes_survives_a_cut_before_it_is_durable() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.3, quiet());
    let size = pool.volume_size();
    let blocks = (size as usize / BLOCK).min(512);
    let doomed = pool.volume().clone();
    doomed.write(0, &pattern(0x33, blocks)).unwrap();
    let other = pool.pool().create_volume("other", size).unwrap();
    pool.pool().checkpoint().unwrap();
    let (flushed, images, deleted) = beside_a_held_checkpoint(
        &pool,
        || pool.pool().delete_volume("vol"),
        || {
            other.write(0, &pattern(0x44, 64))?;
            other.flush()?;
            other.write(64 * BLOCK as u64, &pattern(0x45, 64))?;
            other.flush()
        },
    );
    flushed.expect("flushes of the other volume");
    deleted.expect("delete");
    let crashed = SimPool::open_images(images, quiet()).expect("reopen after the cut");
    let vol = crashed
        .pool()
        .volume("vol")
        .expect("the deletion was not durable");
    assert_eq!(
        read(&vol, 0, blocks).expect("the volume being deleted reads back"),
        pattern(0x33, blocks)
    );
    let other = crashed.pool().volume("other").unwrap();
    assert_eq!(read(&other, 0, 64).unwrap(), pattern(0x44, 64));
    assert_eq!(
        read(&other, 64 * BLOCK as u64, 64).unwrap(),
        pattern(0x45, 64)
    );
    crashed.pool().check_invariants().unwrap();
}

/// A volume grows only once its new size is durable: a write into the new
/// range before that is refused (if it were acknowledged and flushed, a
/// power cut before the resize's checkpoint would lose it).
#[test]
fn a_write_into_a_volume_being_grown_is_refused_or_survives() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.2, quiet());
    let size = pool.volume_size();
    let vol = pool.volume().clone();
    let (acked, images, grown) = beside_a_held_checkpoint(
        &pool,
        || pool.pool().resize_volume("vol", 2 * size),
        || {
            vol.write(size, &pattern(0x55, 1))
                .and_then(|()| vol.flush())
        },
    );
    grown.expect("resize");
    assert!(
        matches!(acked, Err(Error::OutOfRange { .. })),
        "a write into the range being added returned {acked:?} before the size was durable"
    );
    let crashed = SimPool::open_images(images, quiet()).expect("reopen after the cut");
    assert_eq!(
        crashed.volume_size(),
        size,
        "the resize was not durable at the cut"
    );
    // Grown now: the write goes through.
    vol.write(size, &pattern(0x56, 1)).unwrap();
    vol.flush().unwrap();
    let pool = pool.crash(CrashMode::DropAll, &mut SimRng(4)).unwrap();
    assert_eq!(pool.volume_size(), 2 * size);
    assert_eq!(read(pool.volume(), size, 1).unwrap(), pattern(0x56, 1));
}

/// A volume being created is not handed out before it is durable: writes
/// to it cannot be acknowledged and then lost with it.
#[test]
fn a_volume_being_created_is_not_used_before_it_is_durable() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.2, quiet());
    let created = std::sync::Mutex::new(None);
    let (acked, images, made) = beside_a_held_checkpoint(
        &pool,
        || {
            let v = pool.pool().create_volume("new", 1 << 20)?;
            *created.lock().unwrap() = Some(v);
            Ok(())
        },
        || -> lograid::Result<()> {
            let v = pool.pool().volume("new")?;
            v.write(0, &pattern(0x66, 1))?;
            v.flush()
        },
    );
    made.expect("create");
    assert!(created.lock().unwrap().is_some());
    assert!(
        matches!(acked, Err(Error::NotFound(_))),
        "the volume being created was handed out before its creation was durable: {acked:?}"
    );
    let crashed = SimPool::open_images(images, quiet()).expect("reopen after the cut");
    assert!(
        matches!(crashed.pool().volume("new"), Err(Error::NotFound(_))),
        "the creation was not durable at the cut"
    );
    assert!(pool.pool().volume("new").is_ok(), "created once durable");
}

/// A member flush that fails is not retried into success (Linux may drop
/// the pages it could not write and clear the error): with no parity the
/// flush fails and the pool stops writing.
#[test]
fn a_failed_member_flush_fails_the_flush_without_parity() {
    let pool = SimPool::create_with_options(3, 0, 16 << 20, 0.5, quiet());
    let vol = pool.volume().clone();
    // Enough blocks for a row over every member.
    vol.write(0, &pattern(0x77, 16)).unwrap();
    pool.sims[0].fail_next_flushes(1);
    let flushed = vol.flush();
    assert!(
        matches!(flushed, Err(Error::Io { .. })),
        "a flush that member 0 failed returned {flushed:?}"
    );
    assert!(
        matches!(vol.write(0, &pattern(0x78, 1)), Err(Error::ReadOnly(_))),
        "the pool goes on writing after a flush failed beyond its parity"
    );
}

/// With parity, a member whose flush fails is faulted (its columns are
/// rebuilt from parity from then on), never flushed again, and the flush
/// succeeds; everything it covered survives a power cut.
#[test]
fn a_failed_member_flush_faults_the_member_with_parity() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x79, 16)).unwrap();
    pool.sims[0].fail_next_flushes(1);
    vol.flush().expect("flush with one member failing");
    let status = pool.pool().status();
    assert_eq!(
        status.members[0].state, "faulted",
        "member 0 after its flush failed: {:?}",
        status.members[0]
    );
    vol.write(16 * BLOCK as u64, &pattern(0x7a, 16)).unwrap();
    vol.flush().unwrap();
    let pool = pool.crash(CrashMode::DropAll, &mut SimRng(5)).unwrap();
    assert_eq!(read(pool.volume(), 0, 16).unwrap(), pattern(0x79, 16));
    assert_eq!(
        read(pool.volume(), 16 * BLOCK as u64, 16).unwrap(),
        pattern(0x7a, 16)
    );
}

/// A member that lost the write of a row's header block (a lost write, or
/// a flush that failed on it: the member is faulted, but no checkpoint
/// records that before the power goes out) still holds the header of the
/// row that was at the same place in the segment's previous use: a valid
/// header, same shape, that does not continue the log. Recovery must
/// rebuild the right one from parity instead of ending the log there and
/// dropping every flushed row after it. Tried with each member losing the
/// write, in a pool whose segments have all been used before.
#[test]
fn a_stale_row_header_on_one_member_does_not_end_the_log() {
    // Without discard (the default): freed segments keep their old rows.
    let options = PoolOptions {
        discard: false,
        ..quiet()
    };
    for lost_on in 0..3 {
        let pool = SimPool::create_with_options(3, 1, 8 << 20, 0.1, options.clone());
        let vol = pool.volume().clone();
        // One-block FUA writes (short rows of height 1) over a few blocks,
        // until the log has gone round the pool and reuses its segments.
        let blocks = 8u64;
        let mut i = 0u64;
        while pool.pool().status().counters.rows_written < 3000 {
            vol.write_fua(
                (i % blocks) * BLOCK as u64,
                &pattern((i % 200) as u8 + 1, 1),
            )
            .unwrap();
            i += 1;
        }
        pool.sims[lost_on].lose_next_writes(1);
        vol.write_fua(blocks * BLOCK as u64, &pattern(0xee, 1))
            .unwrap();
        vol.write_fua((blocks + 1) * BLOCK as u64, &pattern(0xef, 1))
            .unwrap();
        let crashed = pool
            .crash(CrashMode::DropAll, &mut SimRng(9))
            .expect("reopen");
        for (b, tag) in [(blocks, 0xee), (blocks + 1, 0xef)] {
            let got = read(crashed.volume(), b * BLOCK as u64, 1)
                .unwrap_or_else(|e| panic!("member {lost_on} lost a write: block {b}: {e}"));
            assert!(
                got == pattern(tag, 1),
                "member {lost_on} lost a write: block {b} lost its flushed write (reads {:#x})",
                got[0]
            );
        }
    }
}

/// `bytes` with the bytes that differ between `from` and `to` taken from `to`.
fn apply_diff(base: &mut [u8], from: &[u8], to: &[u8]) {
    for (i, b) in base.iter_mut().enumerate() {
        if from[i] != to[i] {
            *b = to[i];
        }
    }
}

fn snapshots(pool: &SimPool) -> Vec<Vec<u8>> {
    pool.sims.iter().map(|s| s.snapshot()).collect()
}

/// A row sealed while a flush is still syncing the members must not carry a
/// `flushed_seq` that vouches for rows that flush has not made durable:
/// recovery trusts it to tell a torn row (the end of the log) from a rotted
/// one (kept, its blocks failing reads). The flush is held in its syncs, a
/// checkpoint seals and writes a later row meanwhile (then waits for the
/// flush), and the power-cut image is built by hand: the later row on every
/// member, the earlier one on all but one (no parity: that row is torn).
#[test]
fn a_row_sealed_during_a_flush_does_not_vouch_for_what_that_flush_has_not_synced() {
    let pool = SimPool::create_with_options(3, 0, 16 << 20, 0.5, quiet());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x11, 4)).unwrap();
    vol.flush().unwrap();
    let before = snapshots(&pool);
    // R: sealed and written by a flush whose member flushes are held.
    vol.write(0, &pattern(0x22, 4)).unwrap();
    for s in &pool.sims {
        s.hold(Hold::Flushes);
    }
    let (with_r, with_l, durable) = std::thread::scope(|scope| {
        let flush = scope.spawn(|| vol.flush());
        wait_for_held(&pool, "the flush to reach its syncs");
        let with_r = snapshots(&pool);
        // L: sealed and written by a checkpoint (which then waits).
        vol.write(16 * BLOCK as u64, &pattern(0x33, 4)).unwrap();
        let pending = || pool.sims.iter().map(|s| s.pending_writes()).sum::<usize>();
        let before_l = pending();
        let checkpoint = scope.spawn(|| pool.pool().checkpoint());
        wait_until("the checkpoint's rows to be written", || {
            pending() > before_l
        });
        // Its writes settle before it waits for the held flush.
        let mut last = pending();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            if pending() == last {
                break;
            }
            last = pending();
        }
        let with_l = snapshots(&pool);
        let durable = pool.images_now(CrashMode::DropAll, &mut SimRng(1));
        release_all(&pool);
        flush.join().unwrap().unwrap();
        checkpoint.join().unwrap().unwrap();
        (with_r, with_l, durable)
    });
    for dropped in 0..3 {
        let images: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut img = durable[i].clone();
                if i != dropped {
                    apply_diff(&mut img, &before[i], &with_r[i]);
                }
                apply_diff(&mut img, &with_r[i], &with_l[i]);
                img
            })
            .collect();
        let crashed = SimPool::open_images(images, quiet())
            .unwrap_or_else(|e| panic!("reopen (R lost on member {dropped}): {e}"));
        // Neither R nor L was covered by a flush that returned: each block
        // holds its old or its new contents, and reads.
        for (at, old, new) in [(0u64, 0x11u8, 0x22u8), (16, 0, 0x33)] {
            let got = read(crashed.volume(), at * BLOCK as u64, 4).unwrap_or_else(|e| {
                panic!(
                    "R lost on member {dropped}: blocks {at}.. unreadable after the cut \
                     (a row sealed during the held flush vouched for R): {e}"
                )
            });
            for b in got.chunks(BLOCK) {
                assert!(
                    b.iter().all(|&x| x == old) || b.iter().all(|&x| x == new),
                    "R lost on member {dropped}: a block in {at}.. holds bytes no write put there"
                );
            }
        }
    }
}

/// A flush whose member flush failed on one member (within the parity)
/// while a checkpoint is held at its superblock writes: the flush faults
/// the member and is not acknowledged until superblocks record the fault
/// (here: the checkpoint's, once let go). A power cut while it waits leaves
/// its writes unacknowledged (each block old or new); one right after it
/// returned reopens the pool with that member faulted and every flushed
/// write there, rebuilt from parity.
#[test]
fn a_flush_that_faulted_a_member_waits_until_the_fault_is_recorded() {
    for failing in 0..3 {
        let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
        let vol = pool.volume().clone();
        vol.write(0, &pattern(0x41, 16)).unwrap();
        vol.flush().unwrap();
        hold_superblocks(&pool);
        let (during, after) = std::thread::scope(|scope| {
            // A failed assertion below must not leave the checkpoint held
            // (the scope would wait for it for ever).
            let _release = ReleaseOnDrop(&pool);
            let checkpoint = scope.spawn(|| pool.pool().checkpoint());
            wait_for_held(&pool, "the checkpoint to reach its superblocks");
            vol.write(16 * BLOCK as u64, &pattern(0x42, 16)).unwrap();
            pool.sims[failing].fail_next_flushes(1);
            let flush = scope.spawn(|| vol.flush());
            wait_until("the failed member flush to fault the member", || {
                pool.pool().status().members[failing].state == "faulted"
            });
            std::thread::sleep(WATCH);
            assert!(
                !flush.is_finished(),
                "member {failing}: the flush returned before a superblock recorded the fault"
            );
            let during = pool.images_now(CrashMode::DropAll, &mut SimRng(5));
            release_all(&pool);
            flush
                .join()
                .unwrap()
                .expect("flush with one member failing, within parity");
            checkpoint.join().unwrap().expect("the held checkpoint");
            (during, pool.images_now(CrashMode::DropAll, &mut SimRng(6)))
        });
        let crashed = SimPool::open_images(during, quiet()).unwrap_or_else(|e| {
            panic!("member {failing}: reopen after a cut during the flush: {e}")
        });
        let got = read(crashed.volume(), 0, 32)
            .unwrap_or_else(|e| panic!("member {failing}: read after a cut during the flush: {e}"));
        assert!(
            got[..16 * BLOCK] == pattern(0x41, 16)[..],
            "member {failing}: first batch"
        );
        for b in got[16 * BLOCK..].chunks(BLOCK) {
            assert!(
                b.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 0x42),
                "member {failing}: an unacknowledged block holds bytes no write put there"
            );
        }
        let crashed = SimPool::open_images(after, quiet())
            .unwrap_or_else(|e| panic!("member {failing}: reopen after the flush: {e}"));
        assert_eq!(
            crashed.pool().status().members[failing].state,
            "faulted",
            "member {failing}: the fault was not recorded"
        );
        let got = read(crashed.volume(), 0, 32)
            .unwrap_or_else(|e| panic!("member {failing}: read after the flush: {e}"));
        assert!(
            got[..16 * BLOCK] == pattern(0x41, 16)[..],
            "member {failing}: first batch"
        );
        assert!(
            got[16 * BLOCK..] == pattern(0x42, 16)[..],
            "member {failing}: flushed second batch lost"
        );
        crashed.pool().check_invariants().unwrap();
    }
}

/// A member that dies at each step of a flush in turn (its row writes, its
/// member flush, the superblocks that record a fault), then a power cut
/// right after the flush returned: every member the flush wrote either has
/// the data on stable storage or is recorded faulted. Reopened, the pool
/// reads every flushed write back, and a scrub finds nothing to repair
/// (a repair would be a member trusted with writes it lost).
#[test]
fn a_member_that_dies_at_any_step_of_a_flush_is_recorded_before_the_flush_returns() {
    for failing in 0..3 {
        for ios in 0.. {
            let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
            let vol = pool.volume().clone();
            vol.write(0, &pattern(0x51, 16)).unwrap();
            vol.flush().unwrap();
            vol.write(16 * BLOCK as u64, &pattern(0x52, 24)).unwrap();
            let cut = lograid::device::PowerCut::after(ios);
            pool.sims[failing].power_cut_after(cut.clone());
            vol.flush()
                .unwrap_or_else(|e| panic!("member {failing} dead after {ios} I/Os: flush: {e}"));
            let died = cut.is_out();
            let images = pool.images_now(CrashMode::DropAll, &mut SimRng(ios));
            let crashed = SimPool::open_images(images, quiet())
                .unwrap_or_else(|e| panic!("member {failing} dead after {ios} I/Os: reopen: {e}"));
            let state = crashed.pool().status().members[failing].state.clone();
            assert_eq!(
                state == "faulted",
                died,
                "member {failing} dead after {ios} I/Os of the flush: recorded {state}"
            );
            let got = read(crashed.volume(), 0, 40).unwrap();
            assert!(got[..16 * BLOCK] == pattern(0x51, 16)[..]);
            assert!(
                got[16 * BLOCK..] == pattern(0x52, 24)[..],
                "member {failing} dead after {ios} I/Os: the flushed batch"
            );
            let scrub = crashed.pool().scrub(false, |_, _| true).unwrap();
            assert_eq!(
                (scrub.repaired_blocks, scrub.lost_blocks.len()),
                (0, 0),
                "member {failing} dead after {ios} I/Os: blocks a recorded member lost"
            );
            crashed.pool().check_invariants().unwrap();
            if !died {
                assert!(ios > 1, "the flush made no I/O on member {failing}");
                break; // the member lived through the whole flush
            }
        }
    }
}

/// A fault is recorded by a superblock that points at a checkpoint made
/// before it: segments taken since (by the user head, or by that very
/// checkpoint's rows) were laid over the member now recorded faulted, and
/// recovery must still read them with it (its columns rebuilt from parity).
#[test]
fn segments_laid_over_a_member_before_its_recorded_fault_still_read() {
    for failing in 0..3 {
        // The user head: segments taken after the checkpoint, then the fault.
        let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
        let vol = pool.volume().clone();
        vol.write(0, &pattern(0x61, 96)).unwrap();
        vol.flush().unwrap();
        vol.write(96 * BLOCK as u64, &pattern(0x62, 16)).unwrap();
        pool.sims[failing].fail_next_flushes(1);
        vol.flush()
            .expect("flush with one member failing, within parity");
        let crashed = pool
            .crash(CrashMode::DropAll, &mut SimRng(7))
            .unwrap_or_else(|e| panic!("member {failing}, user rows: reopen: {e}"));
        assert_eq!(crashed.pool().status().members[failing].state, "faulted");
        let got = read(crashed.volume(), 0, 112)
            .unwrap_or_else(|e| panic!("member {failing}, user rows: read: {e}"));
        assert!(
            got[..96 * BLOCK] == pattern(0x61, 96)[..],
            "member {failing}: first batch"
        );
        assert!(
            got[96 * BLOCK..] == pattern(0x62, 16)[..],
            "member {failing}: second batch"
        );
        crashed.pool().check_invariants().unwrap();

        // A checkpoint whose rows were laid over the member that faults in
        // its own syncs, and records the fault in its own superblocks.
        let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, quiet());
        let vol = pool.volume().clone();
        vol.write(0, &pattern(0x63, 64)).unwrap();
        pool.sims[failing].fail_next_flushes(1);
        pool.pool()
            .checkpoint()
            .expect("checkpoint with one member failing, within parity");
        let crashed = pool
            .crash(CrashMode::DropAll, &mut SimRng(8))
            .unwrap_or_else(|e| panic!("member {failing}, checkpoint rows: reopen: {e}"));
        assert_eq!(crashed.pool().status().members[failing].state, "faulted");
        let got = read(crashed.volume(), 0, 64)
            .unwrap_or_else(|e| panic!("member {failing}, checkpoint rows: read: {e}"));
        assert!(
            got == pattern(0x63, 64),
            "member {failing}: checkpointed data"
        );
        crashed.pool().check_invariants().unwrap();
    }
}

/// A simulated drive whose writes wait inside the member until let go.
struct SlowWrites {
    inner: SimMember,
    entered: std::sync::Mutex<mpsc::Sender<()>>,
    go: std::sync::Mutex<mpsc::Receiver<()>>,
}

impl Member for SlowWrites {
    fn describe(&self) -> String {
        "slow".into()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.entered.lock().unwrap().send(()).unwrap();
        self.go.lock().unwrap().recv().unwrap();
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn device(member: Arc<dyn Member>) -> Arc<Device> {
    Arc::new(Device::new(
        member,
        Arc::new(StaleSegments::new(0, 1 << 16)),
    ))
}

/// A member counts a write once it completed, not when it was issued: a
/// sync that runs while a write is still inside the member does not cover
/// it, and the next sync after it completed flushes.
#[test]
fn a_sync_during_a_write_does_not_count_it_durable() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let member = Arc::new(SlowWrites {
        inner: SimMember::new("slow", 1 << 20),
        entered: std::sync::Mutex::new(entered_tx),
        go: std::sync::Mutex::new(go_rx),
    });
    let dev = device(member.clone());
    dev.sync().unwrap();
    let writer = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let mut buf = AlignedBuf::zeroed(BLOCK);
            buf.fill(0x5a);
            dev.write_at(&buf, 2 * BLOCK as u64)
        })
    };
    entered_rx.recv().unwrap();
    dev.sync().unwrap(); // another thread's sync while the write is in the member
    go_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();
    dev.sync().unwrap();
    let durable = member.inner.crash_image(CrashMode::DropAll, &mut SimRng(1));
    assert!(
        durable[2 * BLOCK..3 * BLOCK].iter().all(|&b| b == 0x5a),
        "a sync after the write completed returned without making it durable"
    );
}

/// A simulated drive whose next flush panics (a bug in a member, say).
struct PanickyFlush {
    inner: SimMember,
    panic_next: std::sync::atomic::AtomicBool,
}

impl Member for PanickyFlush {
    fn describe(&self) -> String {
        "panicky".into()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self
            .panic_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("member flush panicked");
        }
        self.inner.flush()
    }
}

/// The pool survives a panic (it stops writing), so a panic inside a
/// member's flush must not leave that member "flushing" for ever: a later
/// sync answers, with an error (a flush that panicked is a failed one).
#[test]
fn a_panic_in_a_member_flush_is_a_failed_flush() {
    let member = Arc::new(PanickyFlush {
        inner: SimMember::new("panicky", 1 << 20),
        panic_next: true.into(),
    });
    let dev = device(member);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.sync()));
    assert!(panicked.is_err());
    let (done_tx, done_rx) = mpsc::channel();
    {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(dev.sync().is_ok());
        });
    }
    let answered = done_rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(
        answered,
        Ok(false),
        "a sync after a member flush panicked: never answered, or retried into success"
    );
}
