//! Member faults recorded in the superblocks beside member changes: a
//! member added or replaced in place while another one faults, a leaving
//! member that faults, a fault made in memory only before its slot is
//! replaced. Each cut of the power after a flush returned must reopen a
//! pool that trusts no member with writes it lost, and never names a new,
//! empty drive after the member it replaces.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;
use common::{pattern, wait_until, SimPool};
use lograid::device::{CrashMode, Hold, Member, SimMember, SimRng};
use std::sync::Arc;
use std::time::Duration;

const BLOCK: usize = 4096;

/// A 3-member P=1 pool with 64 blocks flushed, whose member 0 failed
/// enough reads to be faulted (in memory: no flush since).
fn a_pool_with_member_0_faulted_by_reads() -> (SimPool, lograid::Volume) {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 64)).unwrap();
    vol.flush().unwrap();
    pool.sims[0].fail_reads(true);
    let mut buf = vec![0u8; 64 * BLOCK];
    for _ in 0..64 {
        let _ = vol.read(0, &mut buf);
        if pool.pool().status().members[0].state == "faulted" {
            break;
        }
    }
    assert_eq!(pool.pool().status().members[0].state, "faulted");
    (pool, vol)
}

/// Adding a member while another member's flush fails: the add's checkpoint
/// calls record_faults, which writes the recorded (shorter) member table to
/// every open device, the new one included.
#[test]
fn a_member_added_while_another_one_faults_is_added() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 16)).unwrap();
    vol.flush().unwrap();
    vol.write(16 * BLOCK as u64, &pattern(0x42, 16)).unwrap();
    pool.sims[0].fail_next_flushes(1);
    let new = Arc::new(SimMember::new("new", 16 << 20));
    let r = pool.pool().add_members(vec![new as Arc<dyn Member>]);
    eprintln!("add_members: {r:?}");
    eprintln!("status: {:?}", pool.pool().status().read_only);
    r.expect("adding a member while another one faults, within the parity");
}

/// Member 0 is faulted by reads (no flush since: the fault is in memory
/// only), then replaced in place; while the replace's checkpoint is held at
/// its superblock writes, a user flush is acknowledged. A power cut then:
/// was the fault recorded?
#[test]
fn a_fault_made_by_reads_is_recorded_when_its_slot_is_replaced_in_place() {
    let (pool, vol) = a_pool_with_member_0_faulted_by_reads();
    pool.sims[0].fail_reads(false);
    let new = Arc::new(SimMember::new("new", 16 << 20));
    for s in pool.sims.iter() {
        s.hold(Hold::WritesIn {
            from: 0,
            to: 2 * BLOCK as u64,
        });
    }
    let images = std::thread::scope(|scope| {
        let p = pool.pool();
        let n = new.clone();
        let replace = scope.spawn(move || p.replace_member(0, n as Arc<dyn Member>));
        wait_until("the replace's checkpoint to reach its superblocks", || {
            pool.sims.iter().any(|s| s.held() > 0)
        });
        vol.write(64 * BLOCK as u64, &pattern(0x42, 16)).unwrap();
        let flush = scope.spawn(|| vol.flush());
        std::thread::sleep(Duration::from_millis(300));
        let acknowledged = flush.is_finished();
        eprintln!(
            "user flush acknowledged while the replace's superblocks are held: {acknowledged}"
        );
        let images = pool.images_now(CrashMode::DropAll, &mut SimRng(5));
        for s in pool.sims.iter().chain([&new]) {
            s.release();
        }
        flush.join().unwrap().unwrap();
        replace.join().unwrap().unwrap();
        (images, acknowledged)
    });
    let (images, acknowledged) = images;
    let crashed = SimPool::open_images(images, common::test_options()).unwrap();
    let state = crashed.pool().status().members[0].state.clone();
    eprintln!("after the cut member 0 is {state}");
    let scrub = crashed.pool().scrub(false, |_, _| true).unwrap();
    eprintln!(
        "scrub repaired {} lost {}",
        scrub.repaired_blocks,
        scrub.lost_blocks.len()
    );
    assert!(
        !acknowledged || state == "faulted",
        "a flush was acknowledged after member 0 faulted, yet member 0 reopens {state}"
    );
}

/// As above, but member 0 is faulted by a failed row write (rows it lost
/// are counted on by the flush acknowledged during the replace).
#[test]
fn a_fault_made_by_writes_is_recorded_when_its_slot_is_replaced_in_place() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 64)).unwrap();
    vol.flush().unwrap();
    pool.sims[0].fail_next(1_000_000);
    vol.write(64 * BLOCK as u64, &pattern(0x43, 256)).unwrap();
    wait_until("member 0 faulted by a row write", || {
        pool.pool().status().members[0].state == "faulted"
    });
    pool.sims[0].fail_next(0);
    let new = Arc::new(SimMember::new("new", 16 << 20));
    for s in pool.sims.iter() {
        s.hold(Hold::WritesIn {
            from: 0,
            to: 2 * BLOCK as u64,
        });
    }
    let (images, acknowledged) = std::thread::scope(|scope| {
        let p = pool.pool();
        let n = new.clone();
        let replace = scope.spawn(move || p.replace_member(0, n as Arc<dyn Member>));
        wait_until("the replace's checkpoint to reach its superblocks", || {
            pool.sims.iter().any(|s| s.held() > 0)
        });
        vol.write(320 * BLOCK as u64, &pattern(0x42, 16)).unwrap();
        let flush = scope.spawn(|| vol.flush());
        std::thread::sleep(Duration::from_millis(300));
        let acknowledged = flush.is_finished();
        let images = pool.images_now(CrashMode::DropAll, &mut SimRng(5));
        for s in pool.sims.iter() {
            s.release();
        }
        flush.join().unwrap().unwrap();
        replace.join().unwrap().unwrap();
        (images, acknowledged)
    });
    eprintln!("user flush acknowledged while the replace's superblocks are held: {acknowledged}");
    let crashed = SimPool::open_images(images, common::test_options()).unwrap();
    let state = crashed.pool().status().members[0].state.clone();
    eprintln!("after the cut member 0 is {state}");
    let mut buf = vec![0u8; 336 * BLOCK];
    crashed.volume().read(0, &mut buf).unwrap();
    assert!(buf[64 * BLOCK..320 * BLOCK] == pattern(0x43, 256)[..]);
    let scrub = crashed.pool().scrub(false, |_, _| true).unwrap();
    eprintln!("scrub: {scrub:?}");
    eprintln!("status: {:?}", crashed.pool().status().members);
    assert!(
        !acknowledged || (state == "faulted" && scrub.repaired_blocks == 0),
        "a flush was acknowledged after member 0 faulted, yet member 0 reopens {state}, {} blocks repaired",
        scrub.repaired_blocks
    );
}

/// A new drive that, on its first flush after a superblock naming it an
/// active member with the old member's uuid, captures every drive's image.
struct Spy {
    inner: Arc<SimMember>,
    old_uuid: u128,
    all: Vec<Arc<SimMember>>,
    captured: std::sync::Mutex<Option<Vec<Vec<u8>>>>,
}

impl Member for Spy {
    fn describe(&self) -> String {
        self.inner.describe()
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
        self.inner.flush()?;
        if let Ok(sb) = lograid::read_superblock(self.inner.as_ref()) {
            if sb.member_index == 0 && sb.member_uuid() == self.old_uuid {
                let mut c = self.captured.lock().unwrap();
                if c.is_none() {
                    eprintln!(
                        "new drive got generation {} naming it member 0 {:?} with the old uuid",
                        sb.generation, sb.members[0].state
                    );
                    let mut rng = SimRng(9);
                    let mut images: Vec<Vec<u8>> = self
                        .all
                        .iter()
                        .map(|s| s.crash_image(CrashMode::DropAll, &mut rng))
                        .collect();
                    images.push(self.inner.crash_image(CrashMode::DropAll, &mut rng));
                    *c = Some(images);
                }
            }
        }
        Ok(())
    }
}

/// Member 0 is missing (recorded active); it is replaced in place while
/// member 1's flush fails (parity 2): record_faults writes the old table to
/// every open drive, the new one at index 0 included.
#[test]
fn an_empty_drive_replacing_a_missing_member_is_never_named_the_old_one() {
    let pool = SimPool::create_with_options(4, 2, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 64)).unwrap();
    vol.flush().unwrap();
    let old_uuid = u128::from_str_radix(&pool.pool().status().members[0].uuid, 16).unwrap();
    pool.pool().close().unwrap();
    let images: Vec<Vec<u8>> = pool.sims.iter().map(|s| s.snapshot()).collect();
    drop(vol);
    drop(pool);
    let sims: Vec<Arc<SimMember>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img)))
        .collect();
    let pool = lograid::open_members(
        sims[1..]
            .iter()
            .map(|s| s.clone() as Arc<dyn Member>)
            .collect(),
        common::test_options(),
        false,
    )
    .unwrap();
    let vol = pool.volume("vol").unwrap();
    vol.write(64 * BLOCK as u64, &pattern(0x42, 16)).unwrap();
    let spy = Arc::new(Spy {
        inner: Arc::new(SimMember::new("new", 16 << 20)),
        old_uuid,
        all: sims.clone(),
        captured: Default::default(),
    });
    sims[1].fail_next_flushes(1);
    let r = pool.replace_member(0, spy.clone() as Arc<dyn Member>);
    eprintln!("replace: {r:?}");
    let Some(mut images) = spy.captured.lock().unwrap().take() else {
        eprintln!("the new drive never got a superblock naming it the old member");
        return;
    };
    // Open from the new drive (as member 0), members 1..3 (sim0 is gone).
    images.remove(0);
    let members: Vec<Arc<dyn Member>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("x{i}"), img)) as Arc<dyn Member>)
        .collect();
    match lograid::open_members(members, common::test_options(), false) {
        Ok(p) => {
            let st = p.status();
            for m in &st.members {
                eprintln!("reopened: member {} {} {}", m.index, m.path, m.state);
            }
            let v = p.volume("vol").unwrap();
            let mut buf = vec![0u8; 80 * BLOCK];
            eprintln!(
                "read: {:?}",
                v.read(0, &mut buf)
                    .map(|_| buf[..64 * BLOCK] == pattern(0x41, 64)[..])
            );
            eprintln!("scrub: {:?}", p.scrub(false, |_, _| true));
            eprintln!("reshape: {:?}", p.status().reshape);
            panic!(
                "an empty new drive reopened as member 0 (state {})",
                st.members[0].state
            );
        }
        Err(e) => eprintln!("reopen refused: {e}"),
    }
}

/// A member being replaced (recorded Removing) whose flush fails: the
/// fault is never recorded (fault_member keeps it Removing), the flush is
/// acknowledged, and after a power cut it is trusted again.
#[test]
fn a_leaving_member_that_faults_is_recorded_faulted() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 64)).unwrap();
    vol.flush().unwrap();
    let new = Arc::new(SimMember::new("new", 16 << 20));
    pool.pool()
        .replace_member(1, new.clone() as Arc<dyn Member>)
        .unwrap();
    pool.pool().set_reshape_paused(true);
    vol.write(64 * BLOCK as u64, &pattern(0x42, 96)).unwrap();
    pool.sims[1].fail_next_flushes(1);
    vol.flush()
        .expect("flush with the leaving member failing, within parity");
    assert_reopened_with_member_1_faulted_and_nothing_to_repair(&cut_and_reopen(&pool, &new));
}

/// The member being replaced fails its flush in the replace's own
/// checkpoint (rows were just written to it): fault_member keeps it
/// Removing, nothing records the fault.
#[test]
fn a_member_that_fails_in_its_own_replacement_is_recorded_faulted() {
    let pool = SimPool::create_with_options(3, 1, 16 << 20, 0.5, common::test_options());
    let vol = pool.volume().clone();
    vol.write(0, &pattern(0x41, 64)).unwrap();
    vol.flush().unwrap();
    vol.write(64 * BLOCK as u64, &pattern(0x42, 96)).unwrap();
    let new = Arc::new(SimMember::new("new", 16 << 20));
    pool.sims[1].fail_next_flushes(1);
    pool.pool()
        .replace_member(1, new.clone() as Arc<dyn Member>)
        .unwrap();
    pool.pool().set_reshape_paused(true);
    vol.flush().unwrap();
    assert_reopened_with_member_1_faulted_and_nothing_to_repair(&cut_and_reopen(&pool, &new));
}

/// The pool as a power cut now leaves it, the new drive `new` among its members.
fn cut_and_reopen(pool: &SimPool, new: &SimMember) -> SimPool {
    let mut rng = SimRng(3);
    let mut images = pool.images_now(CrashMode::DropAll, &mut rng);
    images.push(new.crash_image(CrashMode::DropAll, &mut rng));
    SimPool::open_images(images, common::test_options()).unwrap()
}

/// After the cut: the flushed second batch reads back, member 1 is
/// recorded faulted, and neither reads nor a scrub find a block to repair
/// (one would be a member trusted with writes it lost).
fn assert_reopened_with_member_1_faulted_and_nothing_to_repair(crashed: &SimPool) {
    let mut buf = vec![0u8; 160 * BLOCK];
    crashed.volume().read(0, &mut buf).unwrap();
    assert!(buf[64 * BLOCK..] == pattern(0x42, 96)[..]);
    let scrub = crashed.pool().scrub(false, |_, _| true).unwrap();
    let st = crashed.pool().status();
    assert_eq!(st.members[1].state, "faulted");
    assert_eq!(
        (scrub.repaired_blocks, scrub.lost_blocks.len()),
        (0, 0),
        "{scrub:?}"
    );
    let repaired: u64 = st.members.iter().map(|m| m.counters.repaired_blocks).sum();
    assert_eq!(
        repaired, 0,
        "reads repaired blocks of a member trusted after its fault"
    );
}

#[test]
fn a_member_is_added_after_a_fault_made_by_reads() {
    let (pool, _vol) = a_pool_with_member_0_faulted_by_reads();
    let sb = lograid::read_superblock(pool.sims[1].as_ref()).unwrap();
    eprintln!(
        "before add: gen {} member0 {:?}",
        sb.generation, sb.members[0].state
    );
    let new = Arc::new(SimMember::new("new", 16 << 20));
    let r = pool.pool().add_members(vec![new as Arc<dyn Member>]);
    eprintln!("add_members after a read fault: {r:?}");
    for i in 1..3 {
        let sb = lograid::read_superblock(pool.sims[i].as_ref()).unwrap();
        eprintln!(
            "after add: sim{i} gen {} members {:?}",
            sb.generation,
            sb.members.iter().map(|m| m.state).collect::<Vec<_>>()
        );
    }
    r.unwrap();
}
