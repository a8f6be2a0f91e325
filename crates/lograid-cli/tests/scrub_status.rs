//! `lograid scrub` and `lograid status` of a served pool, through the real
//! binary: data written over NBD (qemu-io), a member damaged on disk, a
//! check that reports without writing, a scrub that repairs, a second scrub
//! that finds nothing, and the data read back over NBD.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::os::unix::fs::FileExt;

/// The byte offset of the 4 MiB window of `drive` (past its first MiB) with
/// the most non-zero 4 KiB blocks.
fn fullest_4m_window(drive: &std::path::Path) -> u64 {
    let bytes = std::fs::read(drive).unwrap();
    let used = |w: &[u8]| w.chunks(4096).filter(|b| b.iter().any(|&x| x != 0)).count();
    let window = 4 << 20;
    (1..bytes.len() / window)
        .max_by_key(|&i| used(&bytes[i * window..(i + 1) * window]))
        .map(|i| (i * window) as u64)
        .unwrap()
}

fn scrub_json(pool: &TestPool, extra: &[&str]) -> serde_json::Value {
    let out = stdout_of(
        lograid()
            .arg("scrub")
            .arg("--json")
            .args(extra)
            .args(&pool.drives),
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("scrub --json output: {e}: {out}"))
}

#[test]
fn scrub_repairs_a_damaged_member_and_status_sees_a_served_pool() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("128M", "vol0:96M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 0x5a 0 48M", &uri]));

    // While served: status reads what the server publishes (once a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let st = loop {
        let st = status_json(&pool.drives);
        if st["stored_bytes"].as_u64().unwrap() >= 48 << 20 || std::time::Instant::now() > deadline
        {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(st["volumes"][0]["name"], "vol0");
    assert!(st["stored_bytes"].as_u64().unwrap() >= 48 << 20, "{st}");
    assert!(st["cleaner"]["state"].is_string(), "{st}");
    let human = stdout_of(lograid().arg("status").args(&pool.drives));
    assert!(
        human.contains("live status from `lograid serve`"),
        "{human}"
    );
    // A served pool is scrubbed by its server, while it serves.
    let served = scrub_json(&pool, &[]);
    assert!(served["rows_checked"].as_u64().unwrap() > 10, "{served}");
    assert_eq!(served["complete"], true, "{served}");
    assert_eq!(served["repaired_blocks"], 0, "{served}");
    // Pausing when no scrub runs is refused clearly.
    let out = lograid()
        .args(["scrub", "--pause"])
        .args(&pool.drives)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no scrub is running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.terminate();

    let clean = scrub_json(&pool, &[]);
    assert!(clean["rows_checked"].as_u64().unwrap() > 10, "{clean}");
    assert_eq!(clean["repaired_blocks"], 0, "healthy pool: {clean}");
    assert_eq!(clean["lost_blocks"].as_array().unwrap().len(), 0);

    // Rot 4 MiB of one member's data area.
    let member = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pool.drives[1])
        .unwrap();
    let garbage: Vec<u8> = (0..4 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    member.write_all_at(&garbage, 3 << 20).unwrap();
    member.sync_all().unwrap();

    let check = scrub_json(&pool, &["--check"]);
    assert!(
        check["repaired_blocks"].as_u64().unwrap() > 0,
        "check found nothing: {check}"
    );
    let mut after_check = vec![0u8; 4 << 20];
    member.read_exact_at(&mut after_check, 3 << 20).unwrap();
    assert!(after_check == garbage, "--check wrote to the member");

    let fixed = scrub_json(&pool, &[]);
    assert!(fixed["repaired_blocks"].as_u64().unwrap() > 0, "{fixed}");
    assert_eq!(fixed["lost_blocks"].as_array().unwrap().len(), 0, "{fixed}");
    let again = scrub_json(&pool, &[]);
    assert_eq!(again["repaired_blocks"], 0, "second scrub: {again}");

    // Rot while served: the server's scrub repairs it, and a second finds nothing.
    let server = pool.serve();
    let other = std::fs::OpenOptions::new()
        .write(true)
        .open(&pool.drives[2])
        .unwrap();
    // Where the member holds most data: the log's layout decides where rows go.
    other
        .write_all_at(&garbage, fullest_4m_window(&pool.drives[2]))
        .unwrap();
    other.sync_all().unwrap();
    let fixed = scrub_json(&pool, &[]);
    assert!(
        fixed["repaired_blocks"].as_u64().unwrap() > 0,
        "served scrub: {fixed}"
    );
    assert_eq!(fixed["lost_blocks"].as_array().unwrap().len(), 0, "{fixed}");
    let again = scrub_json(&pool, &[]);
    assert_eq!(again["repaired_blocks"], 0, "second served scrub: {again}");
    run(tool("qemu-io").args(["-f", "raw", "-c", "read -P 0x5a 0 48M", &server.uri("vol0")]));
    server.terminate();
}
