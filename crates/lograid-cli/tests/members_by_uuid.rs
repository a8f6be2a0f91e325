//! `lograid serve --pool UUID [--wait-for-members SECONDS] CANDIDATE...`: the server finds the
//! pool's drives among candidates by the pool's UUID, whatever their names (as macOS renumbers
//! its disks), ignores other pools' drives and anything else, waits for members that appear
//! late (as an enclosure's disks do after boot), serves degraded once the wait is over if the
//! parity covers what is still missing, and refuses at once without a wait. Through the real
//! binary, on member files renamed and moved while it waits.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn pool_uuid(drives: &[PathBuf]) -> String {
    status_json(drives)["uuid"].as_str().unwrap().to_string()
}

/// Waits until a `serve-*.err` in `dir` contains `text`; its contents.
fn wait_for_log(dir: &Path, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs: String = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".err"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        if logs.contains(text) {
            return logs;
        }
        assert!(Instant::now() < deadline, "no {text:?} in the log: {logs}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's args: `serve --pool UUID EXTRA... CANDIDATES...`.
fn args(uuid: &str, extra: &[&str], candidates: &[PathBuf]) -> Vec<String> {
    let mut args = vec!["serve".to_string(), "--pool".into(), uuid.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(candidates.iter().map(|p| p.display().to_string()));
    args
}

#[test]
fn members_are_found_by_pool_uuid_under_new_names_and_late_ones_are_waited_for() {
    let pool = TestPool::create("256M", "vol0:64M");
    let uuid = pool_uuid(&pool.drives);
    let data = Rng::new(3).bytes(256 << 10);
    {
        let server = pool.serve();
        let mut nbd = NbdClient::connect(server.port, "vol0");
        nbd.write(1 << 20, &data);
        nbd.flush();
        nbd.disconnect();
        server.terminate();
    }
    // The "disks": another pool's member and a file of zeros among them, and the pool's own
    // members appearing one by one under names that are not their old ones.
    let other = TestPool::create("256M", "x:16M");
    let disks = pool.path("dev");
    std::fs::create_dir(&disks).unwrap();
    std::fs::rename(&other.drives[0], disks.join("disk2")).unwrap();
    std::fs::write(disks.join("disk3"), vec![0u8; 1 << 20]).unwrap();
    std::fs::rename(&pool.drives[1], disks.join("disk7")).unwrap();
    let logs = pool.path("logs");
    std::fs::create_dir(&logs).unwrap();

    let arrive = {
        let (disks, logs, drives) = (disks.clone(), logs.clone(), pool.drives.clone());
        std::thread::spawn(move || {
            let seen = wait_for_log(&logs, "1 of 3 members found; missing member 0");
            std::fs::rename(&drives[2], disks.join("disk4")).unwrap();
            let seen_later = wait_for_log(&logs, "2 of 3 members found; missing member 0");
            std::fs::rename(&drives[0], disks.join("disk9")).unwrap();
            (seen, seen_later)
        })
    };
    let server = Server::start_args(
        args(
            &uuid,
            &["--wait-for-members", "600"],
            &[disks.join("disk*")],
        ),
        &logs,
        None,
    );
    let (seen, _) = arrive.join().unwrap();
    assert!(seen.contains("waiting for members"), "{seen}");
    let err = server.stderr();
    assert!(
        err.contains(&format!(
            "member 0 at {}, member 1 at {}, member 2 at {}",
            disks.join("disk9").display(),
            disks.join("disk7").display(),
            disks.join("disk4").display()
        )),
        "{err}"
    );
    assert!(!err.contains("DEGRADED"), "{err}");
    let mut nbd = NbdClient::connect(server.port, "vol0");
    assert_eq!(nbd.read(1 << 20, data.len() as u32), data);
    nbd.disconnect();
    server.terminate();
    let status = status_json(&[
        disks.join("disk9"),
        disks.join("disk7"),
        disks.join("disk4"),
    ]);
    assert_eq!(status["health"], "healthy", "{status}");
}

#[test]
fn after_the_wait_the_pool_is_served_degraded_if_the_parity_covers_what_is_missing() {
    let pool = TestPool::create("256M", "vol0:64M");
    let uuid = pool_uuid(&pool.drives);
    let disks = pool.path("dev");
    std::fs::create_dir(&disks).unwrap();
    std::fs::rename(&pool.drives[0], disks.join("rdisk5")).unwrap();
    std::fs::rename(&pool.drives[2], disks.join("rdisk6")).unwrap();
    let candidates = [disks.join("rdisk?")];

    // Without a wait: refused at once, saying what is missing.
    let out = lograid()
        .args(args(&uuid, &["--no-degraded"], &candidates))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("2 of 3 members found; missing member 1"),
        "{err}"
    );
    assert!(err.contains("--no-degraded"), "{err}");

    // With a wait of 2 s: waits, then serves degraded.
    let started = Instant::now();
    let server = Server::start_args(
        args(&uuid, &["--wait-for-members", "2"], &candidates),
        pool.dir.path(),
        None,
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let err = server.stderr();
    assert!(err.contains("waiting for members"), "{err}");
    assert!(
        err.contains("members 1 did not appear; serving degraded"),
        "{err}"
    );
    let mut nbd = NbdClient::connect(server.port, "vol0");
    nbd.write(0, &[7u8; 4096]);
    nbd.flush();
    assert_eq!(nbd.read(0, 4096), vec![7u8; 4096]);
    nbd.disconnect();
    server.terminate();
}

#[test]
fn too_few_members_or_none_are_refused_without_a_wait() {
    let pool = TestPool::create("256M", "vol0:64M");
    let uuid = pool_uuid(&pool.drives);
    for (candidates, expect) in [
        (vec![pool.drives[0].clone()], "1 of 3 members found"),
        (vec![pool.path("nothing-*")], "no member of the pool found"),
    ] {
        let out = lograid()
            .args(args(&uuid, &[], &candidates))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(&format!("pool {uuid}")), "{err}");
        assert!(err.contains(expect), "{err}");
    }
    let out = lograid()
        .args(["serve", "--pool", "not-a-uuid"])
        .arg(&pool.drives[0])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("32 hex digits"));
    let out = lograid().args(["serve", "--pool", &uuid]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pool needs the candidate drives"));
}

/// A candidate that never answers (here a loop device on a FUSE file of a stopped server; on
/// macOS the disk image of this very server's volume, after a restart) is skipped after the
/// probe's time limit: the pool opens without waiting for it.
#[cfg(target_os = "linux")]
#[test]
fn a_candidate_that_does_not_answer_is_skipped() {
    if !need_block_devices(&[]) {
        return;
    }
    let stuck_pool = TestPool::create("256M", "vol0:64M");
    let fuse_dir = stuck_pool.path("files");
    let stuck = stuck_pool.serve_with(&["--fuse", fuse_dir.to_str().unwrap()]);
    let attachment = Attachment::attach_file(&fuse_dir.join("vol0"), &stuck_pool.path("state"));
    // SAFETY: signals to our own child.
    assert_eq!(unsafe { libc::kill(stuck.pid(), libc::SIGSTOP) }, 0);

    let pool = TestPool::create("256M", "vol0:64M");
    let uuid = pool_uuid(&pool.drives);
    let mut candidates = vec![attachment.device.clone()];
    candidates.extend(pool.drives.iter().cloned());
    let started = Instant::now();
    let server = std::panic::catch_unwind(|| {
        Server::start_args(args(&uuid, &[], &candidates), pool.dir.path(), None)
    });
    let took = started.elapsed();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(stuck.pid(), libc::SIGCONT) }, 0);
    let server = server.unwrap();
    // It hung (the probe's 5 s went by), and was given up on.
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert!(
        server.stderr().contains("member 0 at"),
        "{}",
        server.stderr()
    );
    server.terminate();
    attachment.detach();
    stuck.terminate();
}
