//! `lograid bench` measures CPU beside speed: memory-backed members, a CPU
//! limit, and every figure's CPU per operation in the JSON report.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;

#[test]
fn memory_backed_bench_on_one_cpu_reports_cpu_per_operation() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = lograid()
        .args(["bench", "--memory", "--cpus", "1", "--member-size", "64M"])
        .args(["--seconds", "0.3", "--workloads", "rand", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The summary names the memory-backed target, not the disk's.
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains("x raw (target >= 0.5); write amplification"),
        "{summary}"
    );
    // Members and raw file are written in full before they are measured.
    for file in ["raw.img", "member0.img", "member2.img"] {
        assert!(
            err.contains("writing 64.0 MiB of /dev/shm/lograid-bench-") && err.contains(file),
            "{file}: {err}"
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    for (target, workload) in [
        ("raw", "rand-write-4K"),
        ("raw", "rand-read-4K"),
        ("lograid", "rand-write-4K"),
        ("lograid", "rand-read-4K"),
    ] {
        let m = results
            .iter()
            .find(|m| m["target"] == target && m["workload"] == workload)
            .unwrap_or_else(|| panic!("no {target} {workload} in {report}"));
        let cpu =
            m["cpu_user_us_per_op"].as_f64().unwrap() + m["cpu_system_us_per_op"].as_f64().unwrap();
        // Any 4 KiB request costs some CPU, and none costs a millisecond here.
        assert!(
            cpu > 0.0 && cpu < 1000.0,
            "{target} {workload}: {cpu} us/op"
        );
        assert!(m["cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{m}");
    }
    // Random writes into the empty volume stop at half its size (2 x 64 MiB of members hold
    // less than 32 Ki blocks): the cleaner has not started, so the WA is the parity floor's.
    let rand_write = results
        .iter()
        .find(|m| m["target"] == "lograid" && m["workload"] == "rand-write-4K")
        .unwrap();
    assert!(
        rand_write["ops"].as_u64().unwrap() <= 16 * 1024,
        "{rand_write}"
    );
    let wa = rand_write["write_amplification"].as_f64().unwrap();
    assert!((1.5..1.6).contains(&wa), "{rand_write}");
    // Nothing left behind in /dev/shm.
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with(&format!("-{}", out_pid(&err)))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The bench's folder name ends with its process id; it prints the folder.
fn out_pid(stderr: &str) -> String {
    let at = stderr.find("lograid-bench-").unwrap() + "lograid-bench-".len();
    stderr[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect()
}

#[test]
fn bench_refused_for_room_leaves_no_folder_behind() {
    let child = lograid()
        .args([
            "bench",
            "--memory",
            "--member-size",
            "64T",
            "--workloads",
            "rand",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let folder = format!("/dev/shm/lograid-bench-{}", child.id());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the benchmark may write up to"), "{err}");
    assert!(
        !std::path::Path::new(&folder).exists(),
        "{folder} was left behind"
    );
}

#[test]
fn bench_refuses_a_cpu_count_the_machine_does_not_have() {
    for n in ["0", "100000"] {
        let out = lograid()
            .args(["bench", "--memory", "--cpus", n, "--workloads", "rand"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(&format!("--cpus {n}")) && err.contains("CPUs asked for"),
            "{err}"
        );
    }
    let out = lograid()
        .args(["bench", "--memory", "--dir", "/tmp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}
