//! `lograid serve --metrics`: the real binary serves a pool, qemu-io writes and reads over NBD,
//! and the exposition fetched with a plain TCP client is parsed by the Prometheus Python client
//! (`prometheus_client.parser`, Debian's python3-prometheus-client). The values are checked
//! against what was done and against `lograid status --json`; histograms against the format's
//! rules; garbage sent to the endpoint gets an error and leaves it working.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Parses the text format with prometheus_client and prints the families as JSON.
const PARSE: &str = r#"
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families
families = []
for f in text_string_to_metric_families(sys.stdin.read()):
    families.append({
        "name": f.name, "type": f.type, "help": f.documentation,
        "samples": [{"name": s.name, "labels": s.labels,
                     "value": s.value if math.isfinite(s.value) else str(s.value)}
                    for s in f.samples],
    })
print(json.dumps(families))
"#;

/// A Python 3 that has prometheus_client (PATH's, else Debian's /usr/bin/python3, which is
/// where python3-prometheus-client installs it).
fn python_with_prometheus_client() -> Option<PathBuf> {
    ["python3", "/usr/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|python| {
            Command::new(python)
                .args(["-c", "import prometheus_client.parser"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug)]
struct Family {
    name: String,
    kind: String,
    help: String,
    samples: Vec<Sample>,
}

/// The families in `text`, as the Prometheus client parses them.
fn parse(python: &Path, text: &str) -> Vec<Family> {
    let mut child = Command::new(python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client could not parse the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc.as_array()
        .unwrap()
        .iter()
        .map(|f| Family {
            name: f["name"].as_str().unwrap().to_string(),
            kind: f["type"].as_str().unwrap().to_string(),
            help: f["help"].as_str().unwrap().to_string(),
            samples: f["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Sample {
                    name: s["name"].as_str().unwrap().to_string(),
                    labels: s["labels"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                        .collect(),
                    value: match &s["value"] {
                        serde_json::Value::String(v) => v.parse().unwrap(),
                        v => v.as_f64().unwrap(),
                    },
                })
                .collect(),
        })
        .collect()
}

/// The one sample named `name` whose labels include `labels`.
fn value(families: &[Family], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0].value
}

/// Sends `request` on a new connection and returns everything the endpoint answers.
fn exchange(port: u16, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The endpoint may answer (and close) before taking all of a large request.
    let _ = stream.write_all(request);
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    reply
}

/// GET /metrics over plain TCP: checks the status line and headers, returns the body.
fn fetch(port: u16) -> String {
    let reply = exchange(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n",
    );
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    assert_eq!(lines.next(), Some("HTTP/1.1 200 OK"), "{head}");
    let headers: BTreeMap<String, String> = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    assert_eq!(
        headers["content-type"], "text/plain; version=0.0.4; charset=utf-8",
        "{head}"
    );
    assert_eq!(headers["content-length"], body.len().to_string(), "{head}");
    body.to_string()
}

fn status_code(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply)
        .split("\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Every family is typed, documented and named by the conventions; every histogram's buckets
/// are cumulative, end with +Inf, and `_count` equals the +Inf bucket.
fn check_families(families: &[Family]) {
    let mut names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a family is split or repeated");
    for f in families {
        assert!(f.name.starts_with("lograid_"), "{}", f.name);
        assert!(
            ["counter", "gauge", "histogram"].contains(&f.kind.as_str()),
            "{} is {} (a sample outside its family?)",
            f.name,
            f.kind
        );
        assert!(!f.help.is_empty(), "{} has no help", f.name);
        assert!(!f.samples.is_empty(), "{} has no samples", f.name);
        for s in &f.samples {
            assert!(s.value.is_finite(), "{s:?}");
            assert!(s.labels.contains_key("pool"), "{s:?}");
            if f.kind == "counter" {
                assert!(s.name.ends_with("_total"), "{s:?}");
                assert!(s.value >= 0.0, "{s:?}");
            }
        }
        if f.kind != "histogram" {
            continue;
        }
        assert!(f.name.ends_with("_seconds"), "{}", f.name);
        // One histogram per label set (without `le`).
        let mut series: BTreeMap<Vec<(String, String)>, Vec<&Sample>> = BTreeMap::new();
        for s in &f.samples {
            let key = s
                .labels
                .iter()
                .filter(|(k, _)| *k != "le")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            series.entry(key).or_default().push(s);
        }
        for (labels, samples) in series {
            let mut buckets: Vec<(f64, f64)> = samples
                .iter()
                .filter(|s| s.name == format!("{}_bucket", f.name))
                .map(|s| (s.labels["le"].parse::<f64>().unwrap(), s.value))
                .collect();
            assert_eq!(buckets.len(), 14, "{} {labels:?}", f.name);
            buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
            assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
            assert_eq!(buckets[0].0, 0.00005);
            assert_eq!(buckets[12].0, 1.0);
            for w in buckets.windows(2) {
                assert!(
                    w[0].1 <= w[1].1,
                    "{} {labels:?}: not cumulative: {buckets:?}",
                    f.name
                );
            }
            let one = |suffix: &str| {
                let found: Vec<f64> = samples
                    .iter()
                    .filter(|s| s.name == format!("{}{suffix}", f.name))
                    .map(|s| s.value)
                    .collect();
                assert_eq!(found.len(), 1, "{}{suffix} {labels:?}", f.name);
                found[0]
            };
            let count = one("_count");
            assert_eq!(count, buckets.last().unwrap().1, "{} {labels:?}", f.name);
            let sum = one("_sum");
            assert!(sum >= 0.0, "{} {labels:?}", f.name);
            assert!(
                count == 0.0 || sum > 0.0,
                "{} {labels:?}: {count} calls took no time",
                f.name
            );
        }
    }
}

#[test]
fn metrics_are_served_in_the_prometheus_format_and_add_up() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let Some(python) = python_with_prometheus_client() else {
        if std::env::var("LOGRAID_SKIP_EXTERNAL").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED (LOGRAID_SKIP_EXTERNAL=1): no python3 with prometheus_client");
            return;
        }
        panic!(
            "no python3 with prometheus_client: install python3-prometheus-client \
             (scripts/test-all.sh does) or set LOGRAID_SKIP_EXTERNAL=1 to skip this test"
        );
    };
    let pool = TestPool::create("256M", "vol0:128M");
    pool.add_volume("idle", "16M");
    let run_dir = pool.path("run");
    let port = free_port();
    let mut args: Vec<String> = vec!["serve".into()];
    args.extend(pool.drives.iter().map(|d| d.display().to_string()));
    args.extend(["--metrics".into(), format!("127.0.0.1:{port}")]);
    let server = Server::start_prepared(Path::new(BIN), args, pool.dir.path(), None, |c| {
        c.env("LOGRAID_RUN_DIR", &run_dir);
    });
    assert!(
        server
            .stderr()
            .contains(&format!("metrics on http://127.0.0.1:{port}/metrics")),
        "{}",
        server.stderr()
    );

    // Before any I/O: every family is there, and well formed.
    let families = parse(&python, &fetch(port));
    check_families(&families);
    assert_eq!(value(&families, "lograid_pool_health", &[]), 0.0);

    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x11 0 64k",
        "-c",
        "write -P 0x22 1M 64k",
        "-c",
        "write -P 0x33 4M 1M",
        "-c",
        "flush",
        "-c",
        "read -P 0x11 0 64k",
        "-c",
        "read -P 0x33 4M 1M",
        &server.uri("vol0"),
    ]));
    assert!(out.contains("read 1048576/1048576"), "{out}");
    // A scrub run by the server, for its progress.
    let scrub_out = stdout_of(
        lograid()
            .env("LOGRAID_RUN_DIR", &run_dir)
            .args(["scrub", "--json"])
            .args(&pool.drives),
    );
    let scrub: serde_json::Value = serde_json::from_str(&scrub_out).unwrap();
    assert_eq!(scrub["complete"], true, "{scrub}");

    // Metrics, then the status the server publishes once a second (one taken after these
    // metrics), then metrics again: each member's bytes written, as status saw them, lie
    // between the two.
    let first = parse(&python, &fetch(port));
    let taken = Instant::now();
    std::thread::sleep(Duration::from_millis(2500));
    let status = stdout_of(
        lograid()
            .env("LOGRAID_RUN_DIR", &run_dir)
            .args(["status", "--json"])
            .args(&pool.drives),
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let families = parse(&python, &fetch(port));
    assert!(taken.elapsed() < Duration::from_secs(60));
    check_families(&first);
    check_families(&families);

    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    for m in members {
        let index = m["index"].as_u64().unwrap().to_string();
        let path = m["path"].as_str().unwrap();
        let labels = [("member", index.as_str()), ("path", path)];
        let in_status = m["counters"]["bytes_written"].as_u64().unwrap() as f64;
        let before = value(&first, "lograid_member_written_bytes_total", &labels);
        let after = value(&families, "lograid_member_written_bytes_total", &labels);
        assert!(before > 0.0, "member {index}: nothing written");
        assert!(
            before <= in_status && in_status <= after,
            "member {index}: bytes written {before} (metrics), {in_status} (status), {after} (metrics)"
        );
        let reads_before = value(&first, "lograid_member_reads_total", &labels);
        let reads_in_status = m["counters"]["reads"].as_u64().unwrap() as f64;
        assert!(reads_before <= reads_in_status);
        assert!(reads_in_status <= value(&families, "lograid_member_reads_total", &labels));
        assert_eq!(
            value(
                &families,
                "lograid_member_state",
                &[labels[0], ("state", "online")]
            ),
            1.0
        );
        // The histograms count this process's calls; the counters all since creation.
        let written = value(&families, "lograid_member_writes_total", &labels);
        let timed = value(
            &families,
            "lograid_member_write_duration_seconds_count",
            &labels,
        );
        assert!(timed > 0.0 && timed <= written, "{timed} of {written}");
        let reads = value(&families, "lograid_member_reads_total", &labels);
        let timed = value(
            &families,
            "lograid_member_read_duration_seconds_count",
            &labels,
        );
        assert!(timed > 0.0 && timed <= reads, "{timed} of {reads}");
        assert!(
            value(
                &families,
                "lograid_member_flush_duration_seconds_count",
                &labels
            ) > 0.0
        );
    }

    // Volumes: what qemu-io asked for (it may ask for more: probes, its own flushes).
    let vol0 = [("volume", "vol0")];
    let writes = value(&families, "lograid_volume_writes_total", &vol0);
    assert!(writes >= 3.0, "{writes}");
    assert!(
        value(&families, "lograid_volume_written_bytes_total", &vol0)
            >= (64 * 2 + 1024) as f64 * 1024.0
    );
    assert!(value(&families, "lograid_volume_reads_total", &vol0) >= 2.0);
    assert!(
        value(&families, "lograid_volume_read_bytes_total", &vol0) >= (64 + 1024) as f64 * 1024.0
    );
    assert!(value(&families, "lograid_volume_flushes_total", &vol0) >= 1.0);
    assert_eq!(
        value(&families, "lograid_volume_request_errors_total", &vol0),
        0.0
    );
    assert_eq!(
        value(
            &families,
            "lograid_volume_write_duration_seconds_count",
            &vol0
        ),
        writes
    );
    assert_eq!(
        value(&families, "lograid_volume_size_bytes", &vol0),
        (128 << 20) as f64
    );
    assert!(
        value(&families, "lograid_volume_live_bytes", &vol0) >= (64 * 2 + 1024) as f64 * 1024.0
    );
    let idle = [("volume", "idle")];
    assert_eq!(value(&families, "lograid_volume_writes_total", &idle), 0.0);
    assert_eq!(
        value(
            &families,
            "lograid_volume_read_duration_seconds_count",
            &idle
        ),
        0.0
    );

    // The pool.
    assert_eq!(value(&families, "lograid_pool_health", &[]), 0.0);
    assert_eq!(
        value(
            &families,
            "lograid_pool_health_state",
            &[("state", "healthy")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &families,
            "lograid_pool_health_state",
            &[("state", "degraded")]
        ),
        0.0
    );
    let space = |name: &str| value(&families, name, &[]);
    assert_eq!(
        space("lograid_pool_usable_bytes"),
        status["usable_bytes"].as_u64().unwrap() as f64
    );
    assert_eq!(
        space("lograid_pool_free_bytes") + space("lograid_pool_used_bytes"),
        space("lograid_pool_usable_bytes")
    );
    assert_eq!(
        space("lograid_pool_live_bytes"),
        status["stored_bytes"].as_u64().unwrap() as f64
    );
    assert!(space("lograid_pool_user_written_bytes_total") >= (64 * 2 + 1024) as f64 * 1024.0);
    assert!(space("lograid_pool_write_amplification") >= 1.0);
    assert_eq!(
        value(&families, "lograid_cleaner_state", &[("state", "idle")]),
        1.0
    );
    assert_eq!(
        value(&families, "lograid_reshape_running", &[("kind", "rebuild")]),
        0.0
    );
    // The scrub ran to its end.
    assert_eq!(
        value(&families, "lograid_scrub_state", &[("state", "finished")]),
        1.0
    );
    let rows = space("lograid_scrub_rows");
    assert!(rows > 0.0);
    assert_eq!(space("lograid_scrub_checked_rows"), rows);
    assert_eq!(
        scrub["rows_checked"].as_u64().unwrap() as f64,
        rows,
        "{scrub}"
    );
    assert_eq!(space("lograid_scrub_last_repaired_blocks"), 0.0);

    // Garbage gets an error and leaves the endpoint working.
    let random: Vec<u8> = Rng::new(7).bytes(20_000);
    for (request, want) in [
        (&b"GET /nothing HTTP/1.1\r\n\r\n"[..], "HTTP/1.1 404 "),
        (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "HTTP/1.1 405 ",
        ),
        (b"GET /metrics SPDY/3\r\n\r\n", "HTTP/1.1 400 "),
        (b"hello\n\n", "HTTP/1.1 400 "),
        (&[b'A'; 20_000][..], "HTTP/1.1 431 "),
        (&random[..], "HTTP/1.1 4"),
    ] {
        let reply = exchange(port, request);
        assert!(
            status_code(&reply).starts_with(want),
            "{:?}...: {}",
            &request[..request.len().min(40)],
            status_code(&reply)
        );
    }
    // A client that connects and says nothing, one that sends half a request and waits, and
    // one that goes away: the endpoint serves others meanwhile.
    let silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let families = parse(&python, &fetch(port));
    check_families(&families);
    drop((silent, slow));

    // The NBD side is unharmed, and the server stops cleanly.
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x22 1M 64k",
        &server.uri("vol0"),
    ]));
    assert!(out.contains("read 65536/65536"), "{out}");
    server.terminate();
}

#[test]
fn a_metrics_address_that_cannot_be_used_fails_before_the_pool_is_opened() {
    let pool = TestPool::create("256M", "vol0:64M");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    for (metrics, expect) in [
        (format!("127.0.0.1:{port}"), "cannot listen there"),
        ("nonsense".to_string(), "expected ADDR:PORT"),
    ] {
        let out = lograid()
            .env("LOGRAID_RUN_DIR", pool.path("run"))
            .arg("serve")
            .args(&pool.drives)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--metrics", &metrics])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("--metrics"), "{err}");
        assert!(err.contains(expect), "{err}");
        assert!(!err.contains("opened pool"), "{err}");
    }
    drop(taken);
}

/// `serve --nfs --metrics`: the NFS server's counters after real NFS traffic (the libnfs probe
/// of tests/nfs_export.rs): calls by procedure, bytes, commits, errors, connections; parsed by
/// the Prometheus client like the rest. Without --nfs there is no `lograid_nfs_` family.
#[test]
fn nfs_counters_are_served_after_real_nfs_traffic() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let Some(python) = python_with_prometheus_client() else {
        if std::env::var("LOGRAID_SKIP_EXTERNAL").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED (LOGRAID_SKIP_EXTERNAL=1): no python3 with prometheus_client");
            return;
        }
        panic!("no python3 with prometheus_client: install python3-prometheus-client");
    };
    let pool = TestPool::create("256M", "vol0:64M");
    pool.add_volume("ro", "8M");
    let (port, nfs_port) = (free_port(), free_port());
    let server = pool.serve_with(&[
        "--metrics",
        &format!("127.0.0.1:{port}"),
        "--nfs",
        &format!("127.0.0.1:{nfs_port}"),
        "--read-only-volume",
        "ro",
    ]);
    let before = parse(&python, &fetch(port));
    check_families(&before);
    let nfs =
        |families: &[Family], name: &str, labels: &[(&str, &str)]| value(families, name, labels);
    assert_eq!(
        nfs(
            &before,
            "lograid_nfs_calls_total",
            &[("procedure", "write")]
        ),
        0.0
    );
    assert_eq!(
        nfs(&before, "lograid_nfs_connections_accepted_total", &[]),
        0.0
    );

    let lines = probe(
        nfs_port,
        &[
            "mount",
            "lookup:vol0",
            "write:0:65536:3:0",
            "write:1048576:4096:4:2",
            "commit",
            "read:0:65536",
            "read:1048576:8192",
            "lookup:nothing",
            "lookup:ro",
            "write:0:512:5:2",
        ],
    );
    assert_eq!(field(&lines[7], "status"), "2", "NOENT: {}", lines[7]);
    assert_eq!(field(&lines[9], "status"), "30", "ROFS: {}", lines[9]);
    let after = parse(&python, &fetch(port));
    check_families(&after);
    let calls = |program: &str, procedure: &str| {
        nfs(
            &after,
            "lograid_nfs_calls_total",
            &[("program", program), ("procedure", procedure)],
        )
    };
    assert_eq!(calls("mount", "mnt"), 1.0);
    assert_eq!(calls("nfs", "lookup"), 3.0);
    assert_eq!(calls("nfs", "write"), 3.0);
    assert_eq!(calls("nfs", "commit"), 1.0);
    assert_eq!(calls("nfs", "read"), 2.0);
    assert_eq!(calls("nfs", "readdirplus"), 0.0);
    let one = |name: &str| nfs(&after, name, &[]);
    assert_eq!(
        one("lograid_nfs_written_bytes_total"),
        (65536 + 4096) as f64
    );
    assert_eq!(one("lograid_nfs_read_bytes_total"), (65536 + 8192) as f64);
    assert_eq!(one("lograid_nfs_commits_total"), 1.0);
    assert_eq!(one("lograid_nfs_call_errors_total"), 2.0, "NOENT and ROFS");
    assert!(one("lograid_nfs_connections_accepted_total") >= 1.0);
    assert_eq!(one("lograid_nfs_connections_refused_total"), 0.0);
    assert_eq!(one("lograid_nfs_protocol_errors_total"), 0.0);
    assert_eq!(one("lograid_nfs_unserved_calls_total"), 0.0);
    assert!(one("lograid_nfs_in_flight_bytes_peak") > 65536.0);
    // The probe has gone: nothing in flight, no connection open (once the server noticed).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = parse(&python, &fetch(port));
        if nfs(&now, "lograid_nfs_connections", &[]) == 0.0 {
            assert_eq!(nfs(&now, "lograid_nfs_in_flight_calls", &[]), 0.0);
            assert_eq!(nfs(&now, "lograid_nfs_in_flight_bytes", &[]), 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the probe's connection stays open"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The bytes reached the volume: its live bytes count them.
    assert!(value(&after, "lograid_volume_live_bytes", &[("volume", "vol0")]) >= 69632.0);
    // Hostile bytes: a protocol error, counted.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", nfs_port)).unwrap();
    stream
        .write_all(&[0x80, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    let mut sink = Vec::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.read_to_end(&mut sink);
    let last = parse(&python, &fetch(port));
    assert_eq!(nfs(&last, "lograid_nfs_protocol_errors_total", &[]), 1.0);
    server.terminate();

    // Without --nfs: no NFS family at all.
    let plain_port = free_port();
    let plain = pool.serve_with(&["--metrics", &format!("127.0.0.1:{plain_port}")]);
    let families = parse(&python, &fetch(plain_port));
    assert!(!families.iter().any(|f| f.name.starts_with("lograid_nfs_")));
    plain.terminate();
}
