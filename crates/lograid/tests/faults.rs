//! Member failures at run time: a member whose writes or flushes keep
//! failing is faulted after its retries and the pool goes on degraded (new
//! rows over the other members with full parity, reads rebuilt), up to P
//! members; one more and the pool refuses writes. A transient failure is
//! retried and leaves the member online. Checked against a model, and after
//! reopening without the failed members.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{test_options, Model, SimPool};
use lograid::device::{Member, SimMember, SimRng};
use lograid::{Error, ReadOnlyReason};
use std::sync::Arc;

/// Random writes, trims, reads and flushes, checked against the model.
fn workload(pool: &SimPool, model: &mut Model, rng: &mut SimRng, ops: usize, what: &str) {
    for op in 0..ops {
        match rng.below(10) {
            0..=5 => {
                let (off, len) = model.random_range(rng, 48 * 1024);
                let data = model.write(off, len);
                match pool.volume().write(off, &data) {
                    Ok(()) => {}
                    // With members lost the pool holds less (rows get narrower).
                    Err(lograid::Error::NoSpace) => model.forget_last_write(),
                    Err(e) => panic!("{what} op {op}: write: {e}"),
                }
            }
            6 => {
                let (off, len) = model.random_range(rng, 64 * 1024);
                match pool.volume().trim(off, len) {
                    Ok(()) => model.trim(off, len),
                    // (6,3) with three members lost holds a third of what it
                    // did: even trim records can find the log full.
                    Err(lograid::Error::NoSpace) => {}
                    Err(e) => panic!("{what} op {op}: trim: {e}"),
                }
            }
            7 => {
                let (off, len) = model.random_range(rng, 128 * 1024);
                let mut buf = vec![0u8; len as usize];
                pool.volume()
                    .read(off, &mut buf)
                    .unwrap_or_else(|e| panic!("{what} op {op}: read: {e}"));
                model
                    .check_exact(off, &buf)
                    .unwrap_or_else(|m| panic!("{what} op {op}: {m}"));
            }
            _ => {
                pool.volume()
                    .flush()
                    .unwrap_or_else(|e| panic!("{what} op {op}: flush: {e}"));
                model.flushed();
            }
        }
    }
}

fn member_states(pool: &SimPool) -> Vec<String> {
    pool.pool()
        .status()
        .members
        .iter()
        .map(|m| m.state.clone())
        .collect()
}

#[test]
fn up_to_p_members_failing_mid_run_lose_nothing() {
    for (members, parity) in [(3usize, 1u8), (4, 2), (6, 3)] {
        let what = format!("({members},{parity})");
        let mut rng = SimRng(members as u64 * 31 + parity as u64);
        let pool = SimPool::create(members, parity, 8 << 20, 0.3);
        let mut model = Model::new(pool.volume_size());
        workload(&pool, &mut model, &mut rng, 150, &what);
        let mut failed = Vec::new();
        for f in 0..parity as usize {
            let m = (f * 2 + 1) % members;
            pool.sims[m].set_dead(true);
            failed.push(m);
            workload(
                &pool,
                &mut model,
                &mut rng,
                200,
                &format!("{what} {failed:?} dead"),
            );
            let states = member_states(&pool);
            for &d in &failed {
                assert_eq!(states[d], "faulted", "{what}: {states:?}");
            }
            let st = pool.pool().status();
            assert!(!st.read_only, "{what}: pool stopped writing: {}", st.state);
            assert!(st.state.contains("degraded"), "{what}: {}", st.state);
        }
        pool.pool().check_invariants().expect("invariants");
        // The whole volume reads back, then again after reopening without the dead members.
        let all = pool.read_all().expect("read all");
        model
            .check_exact(0, &all)
            .unwrap_or_else(|m| panic!("{what}: {m}"));
        pool.pool().close().expect("close");
        let members_left: Vec<Arc<dyn Member>> = pool
            .sims
            .iter()
            .enumerate()
            .filter(|(i, _)| !failed.contains(i))
            .map(|(i, s)| {
                Arc::new(SimMember::from_image(&format!("sim{i}"), s.snapshot())) as Arc<dyn Member>
            })
            .collect();
        let reopened = lograid::open_members(members_left, test_options(), false)
            .unwrap_or_else(|e| panic!("{what}: reopen without {failed:?}: {e}"));
        let vol = reopened.volume("vol").expect("volume");
        let mut buf = vec![0u8; vol.size_bytes() as usize];
        vol.read(0, &mut buf).expect("read after reopen");
        model
            .check_exact(0, &buf)
            .unwrap_or_else(|m| panic!("{what} reopened: {m}"));
        // Still writable (degraded, full parity over what is left), unless
        // what is left is full ((6,3) without three members holds a third).
        match vol.write(0, &[7u8; 8192]) {
            Ok(()) => vol.flush().expect("flush after reopen"),
            Err(lograid::Error::NoSpace) if members == 6 => {}
            Err(e) => panic!("{what}: write after reopen: {e}"),
        }
    }
}

#[test]
fn one_failure_more_than_parity_stops_writes_without_lying() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let mut model = Model::new(pool.volume_size());
    let mut rng = SimRng(5);
    workload(&pool, &mut model, &mut rng, 100, "(3,1)");
    pool.sims[0].set_dead(true);
    workload(&pool, &mut model, &mut rng, 50, "(3,1) one dead");
    pool.sims[2].set_dead(true);
    // Writes now fail with a clear error (at the latest at the flush).
    let data = vec![1u8; 64 * 1024];
    let result = pool
        .volume()
        .write(0, &data)
        .and_then(|()| pool.volume().flush());
    let err = result.expect_err("a pool with two of three members lost accepted a flush");
    // The member that failed beyond the parity is named (in the read-only
    // reason, or in the I/O error the failing operation returns).
    let named = match &err {
        Error::ReadOnly(ReadOnlyReason::MemberFailed { member, .. }) => *member == 2,
        Error::Io { context, .. } => context.contains("member 2"),
        _ => false,
    };
    assert!(named, "{err:?}");
    assert!(pool.pool().status().read_only);
    // No read returns wrong data: each either fails or matches the model.
    let size = pool.volume_size();
    let mut off = 0;
    while off < size {
        let mut buf = vec![0u8; 4096];
        if pool.volume().read(off, &mut buf).is_ok() {
            model
                .check_exact(off, &buf)
                .or_else(|_| {
                    // The last unflushed write may or may not have landed.
                    if buf.iter().all(|&b| b == 1) {
                        Ok(())
                    } else {
                        Err(())
                    }
                })
                .unwrap_or_else(|()| panic!("wrong data at {off}"));
        }
        off += 4096;
    }
}

#[test]
fn a_transient_failure_is_retried_and_the_member_stays_online() {
    let pool = SimPool::create(3, 1, 8 << 20, 0.5);
    let mut model = Model::new(pool.volume_size());
    let mut rng = SimRng(9);
    workload(&pool, &mut model, &mut rng, 50, "(3,1)");
    pool.sims[1].fail_next(2);
    workload(&pool, &mut model, &mut rng, 100, "(3,1) transient");
    let st = pool.pool().status();
    assert_eq!(st.members[1].state, "online", "{}", st.state);
    assert!(
        st.members[1].counters.io_errors >= 1,
        "the failures were not counted"
    );
    let all = pool.read_all().expect("read");
    model.check_exact(0, &all).expect("data");
}

/// A member whose reads keep failing (writes still work) is faulted after a
/// few failed reads in a row: every read meanwhile is rebuilt from parity
/// and correct, and afterwards it is not read at all.
#[test]
fn a_member_whose_reads_keep_failing_is_faulted() {
    let mut rng = SimRng(77);
    let pool = SimPool::create(3, 1, 8 << 20, 0.3);
    let mut model = Model::new(pool.volume_size());
    workload(&pool, &mut model, &mut rng, 200, "healthy");
    pool.pool().volume("vol").unwrap().flush().unwrap();
    model.flushed();
    pool.sims[2].fail_reads(true);
    assert_eq!(member_states(&pool)[2], "online");
    // Reads of the whole volume: correct, from parity where member 2 held data.
    let all = pool.read_all().expect("read all");
    model
        .check_exact(0, &all)
        .expect("reads rebuilt from parity");
    let states = member_states(&pool);
    assert_eq!(states[2], "faulted", "{states:?}");
    let st = pool.pool().status();
    assert!(st.state.contains("degraded"), "{}", st.state);
    assert!(
        st.events.iter().any(|e| e.message.contains("reads")),
        "{:?}",
        st.events
    );
    // It goes on degraded, and writable.
    workload(&pool, &mut model, &mut rng, 100, "after the read fault");
    let all = pool.read_all().expect("read all");
    model.check_exact(0, &all).expect("after the fault");
    pool.pool().check_invariants().expect("invariants");
}

/// Writes a drive acknowledged but lost, and writes it put in the wrong
/// place, on one member: every read is still right (checksums catch the old
/// or foreign contents, parity rebuilds them), a scrub repairs them, and a
/// second scrub finds nothing.
#[test]
fn lost_and_misdirected_writes_are_caught_and_repaired() {
    for (kind, members, parity) in [("lost", 3usize, 1u8), ("misdirected", 4, 2)] {
        let what = format!("{kind} ({members},{parity})");
        let mut rng = SimRng(members as u64 * 131);
        let pool = SimPool::create(members, parity, 8 << 20, 0.3);
        let mut model = Model::new(pool.volume_size());
        workload(&pool, &mut model, &mut rng, 150, &what);
        pool.pool().volume("vol").unwrap().flush().unwrap();
        model.flushed();
        match kind {
            "lost" => pool.sims[1].lose_next_writes(40),
            _ => pool.sims[1].misdirect_next_writes(40, 3 << 20),
        }
        workload(&pool, &mut model, &mut rng, 200, &what);
        pool.pool().volume("vol").unwrap().flush().unwrap();
        model.flushed();
        let all = pool.read_all().expect("read all");
        model
            .check_exact(0, &all)
            .unwrap_or_else(|m| panic!("{what}: {m}"));
        let report = pool.pool().scrub(true, |_, _| true).expect("scrub");
        assert!(report.lost_blocks.is_empty(), "{what}: {report:?}");
        assert!(
            report.repaired_blocks > 0 || pool.pool().status().repaired_blocks > 0,
            "{what}: nothing was found wrong: {report:?}"
        );
        let again = pool.pool().scrub(true, |_, _| true).expect("scrub");
        assert!(again.is_clean(), "{what}: second scrub: {again:?}");
        let all = pool.read_all().expect("read all");
        model
            .check_exact(0, &all)
            .unwrap_or_else(|m| panic!("{what} after scrub: {m}"));
    }
}

/// A repairing scrub cut by a power failure at a random instant: the pool
/// opens with everything flushed intact, and a scrub run again finishes,
/// repairs what was left, and a third finds nothing.
#[test]
fn scrub_cut_by_a_power_failure_runs_again_and_finishes() {
    use lograid::device::{CrashMode, PowerCut};
    for seed in 0..4u64 {
        let what = format!("seed {seed}");
        let mut rng = SimRng(seed * 7919 + 5);
        let pool = SimPool::create(3, 1, 8 << 20, 0.4);
        let mut model = Model::new(pool.volume_size());
        workload(&pool, &mut model, &mut rng, 250, &what);
        pool.volume().flush().unwrap();
        model.flushed();
        // Rot in member 1's data area (1 MiB on).
        pool.sims[1].corrupt((1 << 20) + rng.below(2 << 20) / 4096 * 4096, 256 << 10);
        let cut = PowerCut::after(rng.below(60) + 1);
        for s in &pool.sims {
            s.power_cut_after(cut.clone());
        }
        let _ = pool.pool().scrub(true, |_, _| true);
        let pool = pool
            .crash(CrashMode::KeepRandomSubset, &mut rng)
            .unwrap_or_else(|e| panic!("{what}: reopen after the cut: {e}"));
        let all = pool.read_all().expect("read all");
        model
            .after_crash(&all)
            .unwrap_or_else(|m| panic!("{what}: {m}"));
        let report = pool.pool().scrub(true, |_, _| true).expect("scrub again");
        assert!(
            report.complete && report.lost_blocks.is_empty(),
            "{what}: {report:?}"
        );
        let again = pool.pool().scrub(true, |_, _| true).expect("third scrub");
        assert!(again.is_clean(), "{what}: {again:?}");
    }
}

/// Degraded reads of every request size and alignment, forwards and
/// backwards, return the right bytes whichever columns are lost (first,
/// middle or last of a row).
#[test]
fn degraded_reads_of_any_size_and_order_are_right() {
    for (members, parity, lose) in [
        (3usize, 1u8, vec![0usize]),
        (3, 1, vec![2]),
        (5, 2, vec![0, 3]),
        (5, 2, vec![1, 2]),
    ] {
        let mut rng = SimRng(members as u64 * 31 + lose[0] as u64);
        let pool = SimPool::create(members, parity, 8 << 20, 0.5);
        let mut model = Model::new(pool.volume_size());
        workload(&pool, &mut model, &mut rng, 300, "healthy");
        // Long sequential writes too, so that requests span whole rows.
        let size = pool.volume_size();
        let mut off = 0;
        while off + (256 << 10) <= size / 2 {
            let data = model.write(off, 256 << 10);
            pool.volume().write(off, &data).unwrap();
            off += 256 << 10;
        }
        pool.volume().flush().unwrap();
        model.flushed();
        for &m in &lose {
            pool.sims[m].set_dead(true);
        }
        let what = format!("({members},{parity}) without {lose:?}");
        for request in [4096u64, 12 << 10, 64 << 10, 1 << 20, 3 << 20] {
            let mut at = if request % 8192 == 0 { 0 } else { 4096 };
            while at < size {
                let len = request.min(size - at);
                let mut buf = vec![0u8; len as usize];
                pool.volume()
                    .read(at, &mut buf)
                    .unwrap_or_else(|e| panic!("{what}: read {at}+{len}: {e}"));
                model
                    .check_exact(at, &buf)
                    .unwrap_or_else(|e| panic!("{what}: {request}-byte reads: {e}"));
                at += len;
            }
        }
        // Backwards, one row's worth at a time.
        let mut at = size;
        while at > 0 {
            let len = (192u64 << 10).min(at);
            at -= len;
            let mut buf = vec![0u8; len as usize];
            pool.volume().read(at, &mut buf).unwrap();
            model
                .check_exact(at, &buf)
                .unwrap_or_else(|e| panic!("{what}: backwards: {e}"));
        }
    }
}
