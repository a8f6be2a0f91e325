//! What an administrator sees when something goes wrong under a running
//! server: a member file deleted while served is faulted within seconds
//! (log line, status, `status -x`); blocks found bad by reads and by a
//! scrub are each logged with where they were and the counters add up.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

/// Polls `done` every 100 ms for up to 15 s.
fn within_seconds(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The body of GET /metrics (the exposition itself is checked with a real
/// Prometheus parser in metrics.rs).
fn scrape(port: u16) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    body.to_string()
}

fn health_code(pool: &TestPool) -> Option<i32> {
    lograid()
        .args(["status", "-x"])
        .args(&pool.drives)
        .output()
        .unwrap()
        .status
        .code()
}

#[test]
fn a_member_file_deleted_while_served_is_faulted_within_seconds() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 0x21 0 4M", "-c", "flush", &uri]));
    assert_eq!(health_code(&pool), Some(0));
    std::fs::remove_file(&pool.drives[1]).unwrap();
    let faulted = within_seconds(|| status_json(&pool.drives)["members"][1]["state"] == "faulted");
    assert!(
        faulted,
        "member 1 still: {}",
        status_json(&pool.drives)["members"][1]
    );
    assert_eq!(health_code(&pool), Some(1));
    // Still served: reads rebuild from parity, writes go on.
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x21 0 4M",
        "-c",
        "write -P 0x22 4M 1M",
        "-c",
        "flush",
        &uri,
    ]));
    assert!(out.contains("read 4194304/4194304"), "{out}");
    let log = server.terminate();
    assert!(
        log.contains("failed a presence check (its file was deleted)"),
        "{log}"
    );
}

#[test]
fn bad_blocks_found_by_reads_and_scrubs_are_logged_and_counted() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    run(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x44 0 16M",
        "-c",
        "flush",
        &uri,
    ]));
    server.terminate();
    // Rot on member 0: garbage over its data area's first 8 MiB (the
    // superblocks at its start and end are left alone).
    let mut f = std::fs::File::options()
        .write(true)
        .open(&pool.drives[0])
        .unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    let garbage: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    f.write_all(&garbage).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let server = pool.serve();
    let uri = server.uri("vol0");
    let out = stdout_of(tool("qemu-io").args(["-f", "raw", "-c", "read -P 0x44 0 16M", &uri]));
    assert!(out.contains("read 16777216/16777216"), "{out}");
    // The server publishes its status about once a second.
    let counted =
        within_seconds(|| status_json(&pool.drives)["checksum_errors"].as_u64() > Some(0));
    assert!(counted, "{}", status_json(&pool.drives));
    let st = status_json(&pool.drives);
    let found = st["checksum_errors"].as_u64().unwrap();
    let repaired = st["repaired_blocks"].as_u64().unwrap();
    assert!(found > 0, "{st}");
    assert!(
        repaired > 0 && repaired <= found,
        "found {found}, repaired {repaired}"
    );
    // What the reads did not touch, a scrub finds.
    run(lograid().arg("scrub").args(&pool.drives));
    let log = server.terminate();
    assert!(
        log.contains("returned a bad block; repaired from parity"),
        "{log}"
    );
    assert!(log.contains("volume 'vol0' offset "), "{log}");
    assert!(
        log.contains("not logged, for a few seconds (rate limit)"),
        "{log}"
    );
    assert!(log.contains("scrub of pool 'lograid' started"), "{log}");
    assert!(log.contains("scrub of pool 'lograid' finished"), "{log}");
    let st = status_json(&pool.drives);
    let found = st["checksum_errors"].as_u64().unwrap();
    let repaired = st["repaired_blocks"].as_u64().unwrap();
    assert!(repaired <= found, "found {found}, repaired {repaired}");
    assert_eq!(st["lost_blocks_seen"], 0, "{st}");
    assert_eq!(health_code(&pool), Some(0));
}

/// The walkthrough of docs/OPERATIONS.md and the README, step by step: a
/// drive pulled while serving, the log line, `status -x`, the metrics,
/// `replace` while serving, the rebuild followed to the end, healthy again
/// (status and metrics), data intact.
#[test]
fn failed_drive_walkthrough() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let port = free_port();
    let server = pool.serve_with(&["--metrics", &format!("127.0.0.1:{port}")]);
    let uri = server.uri("vol0");
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 0x61 0 8M", "-c", "flush", &uri]));
    assert!(scrape(port).contains("lograid_pool_health{pool=\"lograid\"} 0"));

    // The drive is pulled: faulted within seconds, said in the log and the metrics.
    std::fs::remove_file(&pool.drives[1]).unwrap();
    assert!(within_seconds(|| health_code(&pool) == Some(1)));
    assert!(within_seconds(|| server
        .stderr()
        .contains("failed a presence check")));
    let metrics = scrape(port);
    assert!(
        metrics.contains("lograid_pool_health{pool=\"lograid\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lograid_member_state{")
                && l.contains("member=\"1\"")
                && l.contains("state=\"faulted\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    let out = lograid()
        .args(["status", "-x"])
        .args(&pool.drives)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.contains("is degraded"), "{line}");

    // Replaced while serving; the command follows the rebuild to the end.
    let new = pool.path("m3.img");
    let dir = pool.dir.path().display().to_string();
    let out = run(lograid().args(["replace", &dir, "1"]).arg(&new));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("done"), "{said}");
    let now = vec![pool.drives[0].clone(), pool.drives[2].clone(), new.clone()];
    assert!(
        within_seconds(|| lograid()
            .args(["status", "-x"])
            .args(&now)
            .output()
            .unwrap()
            .status
            .code()
            == Some(0)),
        "{}",
        String::from_utf8_lossy(
            &lograid()
                .args(["status", "-x"])
                .args(&now)
                .output()
                .unwrap()
                .stdout
        )
    );
    let out = stdout_of(tool("qemu-io").args(["-f", "raw", "-c", "read -P 0x61 0 8M", &uri]));
    assert!(out.contains("read 8388608/8388608"), "{out}");
    assert!(within_seconds(
        || scrape(port).contains("lograid_pool_health{pool=\"lograid\"} 0")
    ));
    let log = server.terminate();
    assert!(
        log.contains("rebuilt: every row is whole again") || log.contains("rebuilding"),
        "{log}"
    );
}

/// A thin volume larger than the pool: the pool warns when free space gets
/// low, and a write it cannot place fails with ENOSPC and a log line.
#[test]
fn a_full_pool_warns_first_and_refuses_writes_loudly() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("64M", "vol0:256M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    let out = tool("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0x7 0 200M",
            "-c",
            "flush",
            &uri,
        ])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("No space left on device"), "{said}");
    assert!(within_seconds(|| health_code(&pool) == Some(1)));
    let log = server.terminate();
    assert!(log.contains("is low on space"), "{log}");
    assert!(
        log.contains("refused: pool 'lograid' is full (ENOSPC"),
        "{log}"
    );
}

/// The rows of OPERATIONS.md's `status --json` table: (field column, meaning).
fn documented_json_fields() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/OPERATIONS.md"
    ))
    .unwrap();
    let table = doc
        .split("### `status --json` fields")
        .nth(1)
        .expect("the section");
    table
        .lines()
        .skip_while(|l| !l.starts_with("| field"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            (cells[1].trim().to_string(), cells[2].trim().to_string())
        })
        .collect()
}

/// The names in backquotes in `text`.
fn quoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn status_json_fields_are_the_documented_ones() {
    let pool = TestPool::create("256M", "vol0:64M");
    let json = status_json(&pool.drives);
    let rows = documented_json_fields();
    assert!(rows.len() > 10, "{rows:?}");
    let top: Vec<String> = rows
        .iter()
        .flat_map(|(f, _)| quoted(f))
        .filter(|f| !f.contains('.'))
        .map(|f| f.trim_end_matches("[]").to_string())
        .collect();
    let actual: Vec<String> = json.as_object().unwrap().keys().cloned().collect();
    for key in &actual {
        assert!(
            top.contains(key),
            "status --json field `{key}` is not documented"
        );
    }
    for key in &top {
        // `scrub` is only there when a server publishes its status.
        assert!(
            actual.contains(key) || key == "scrub",
            "documented field `{key}` is not printed"
        );
    }
    // Nested objects: every field printed is named in its row.
    let nested = |path: &str, value: &serde_json::Value| {
        let (_, meaning) = rows
            .iter()
            .find(|(f, _)| quoted(f).iter().any(|q| q == path))
            .unwrap_or_else(|| panic!("no row for `{path}`"));
        let named = quoted(meaning);
        for key in value.as_object().unwrap().keys() {
            assert!(named.contains(key), "`{path}.{key}` is not documented");
        }
    };
    nested("members[]", &json["members"][0]);
    nested("members[].counters", &json["members"][0]["counters"]);
    nested("cleaner", &json["cleaner"]);
    nested("volumes[]", &json["volumes"][0]);
    nested("counters", &json["counters"]);
    nested("recovery", &json["recovery"]);
    nested("memory", &json["memory"]);
}
