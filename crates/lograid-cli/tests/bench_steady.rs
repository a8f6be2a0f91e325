//! `lograid bench --workloads steady` on tiny member files: every pattern
//! kind runs to its windows, the JSON report has them with sane figures,
//! a run cut short by the time limit says so, and bad patterns and traces
//! are refused before anything is created.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

fn sample_trace() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/traces/sample-msr.csv")
        .display()
        .to_string()
}

/// Runs the steady workload on 64 MiB members in `dir` and returns its
/// stderr and the report of the one (greedy) policy.
fn steady(dir: &Path, patterns: &str, extra: &[&str]) -> (String, Value) {
    let out_dir = dir.join("out");
    let out = lograid()
        .args(["bench", "--workloads", "steady", "--member-size", "64M"])
        .args([
            "--queue-depth",
            "8",
            "--policies",
            "greedy",
            "--fills",
            "0.5",
        ])
        .args(["--patterns", patterns, "--dir"])
        .arg(dir)
        .arg("--steady-out")
        .arg(&out_dir)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    let text = std::fs::read_to_string(out_dir.join("lograid-p1-greedy.json")).unwrap();
    (err, serde_json::from_str(&text).unwrap())
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn every_pattern_runs_to_windows_with_sane_figures() {
    let dir = tempfile::tempdir().unwrap();
    let patterns = format!(
        "uniform,zipf:0.99,moving:0.5x,seqmix,trace:{},sync:2",
        sample_trace()
    );
    let (err, report) = steady(dir.path(), &patterns, &["--steady-max-seconds", "60"]);
    assert_eq!(report["setup"]["windows_needed"], 3, "{report}");
    assert_eq!(report["setup"]["warmup_overwrites"], 1.0, "{report}");
    assert!(f(&report["empty"]["iops"]) > 0.0, "{report}");
    let runs = report["runs"].as_array().unwrap();
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect();
    let trace = format!("trace:{}", sample_trace());
    assert_eq!(
        names,
        [
            "uniform",
            "zipf:0.99",
            "moving:0.5x",
            "seqmix:256K",
            trace.as_str(),
            "sync:2"
        ]
    );
    for r in runs {
        let name = r["pattern"].as_str().unwrap();
        let windows = r["windows"].as_array().unwrap();
        assert!(windows.len() >= 3, "{name}: {windows:?}\n{err}");
        for w in windows {
            // Parity 1 of 3 members: 1.5 member bytes per user byte, plus relocations and
            // padding; less where rewrites of a block still in memory replace it there (zipf's
            // hottest blocks), or rows are still in memory at a window's end.
            let wa = f(&w["wa"]);
            assert!((0.3..30.0).contains(&wa), "{name}: {w}");
            assert!(f(&w["iops"]) > 0.0 && f(&w["p999_us"]) > 0.0, "{name}: {w}");
            // The longest write is at least the 99.9th percentile (less its bucket's width).
            assert!(f(&w["max_us"]) >= f(&w["p999_us"]) * 0.96, "{name}: {w}");
            assert!(
                f(&w["user_bytes"]) >= f(&r["window_bytes"]) * 0.9,
                "{name}: {w}"
            );
            assert!(w["free_segments"].as_u64().is_some(), "{name}: {w}");
            assert!(w["pending_free_segments"].as_u64().is_some(), "{name}: {w}");
            let relocated = f(&w["relocated_bytes"]);
            assert_eq!(
                w["foreground_share"].is_null(),
                relocated == 0.0,
                "{name}: {w}"
            );
            // Only windows that began after one whole overwrite count.
            let eligible = f(&w["start_bytes"]) >= f(&r["warmup_bytes"]);
            assert_eq!(w["eligible"].as_bool().unwrap(), eligible, "{name}: {w}");
        }
        let steady: Vec<usize> = r["steady_windows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(steady.len(), 3, "{name}");
        let was: Vec<f64> = steady.iter().map(|&i| f(&windows[i]["wa"])).collect();
        let mean = was.iter().sum::<f64>() / 3.0;
        assert!((f(&r["wa_steady"]) - mean).abs() < 1e-9, "{name}");
        if r["converged"].as_bool().unwrap() {
            assert!(
                steady.iter().all(|&i| windows[i]["eligible"] == true),
                "{name}"
            );
            let (lo, hi) = was
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &w| (l.min(w), h.max(w)));
            assert!(hi <= lo * 1.05 + 1e-12, "{name}: {was:?}");
        } else {
            assert!(err.contains("not converged"), "{name}\n{err}");
        }
        // The whole run's WA counts everything up to the final flush.
        assert!(f(&r["wa"]) >= 0.3, "{name}: {}", r["wa"]);
    }
    let overwrites = &runs[..5];
    for r in overwrites {
        assert_eq!(f(&r["fill"]), 0.5);
        assert_eq!(f(&r["warmup_bytes"]), f(&r["volume_bytes"]));
        assert!(f(&r["segments_cleaned"]) > 0.0, "the cleaner ran: {r}");
        // The cleaner's split: parts of what it relocated. The engine counts them per
        // segment cleaned and the total per block moved, so a window may show a share
        // above 1; over the run, every segment counted was moved within it.
        let windows = r["windows"].as_array().unwrap();
        for part in ["foreground_relocated_bytes", "relocated_again_bytes"] {
            let sum: f64 = windows.iter().map(|w| f(&w[part])).sum();
            assert!(sum <= f(&r["relocated_bytes"]), "{part}: {r}");
        }
    }
    let sync = &runs[5];
    assert!(
        sync["fill"].is_null() && sync["warmup_bytes"] == 0,
        "{sync}"
    );
    assert_eq!(sync["flush_every"], 2);
    // An eighth of the capacity at most: the log does not wrap, the cleaner stays idle.
    assert!(
        sync["stopped_by"] == "steady" || sync["stopped_by"] == "byte_limit",
        "{sync}"
    );
    assert!(
        f(&sync["user_bytes"]) <= f(&report["capacity_bytes"]) / 8.0 * 1.5,
        "{sync}"
    );
    assert_eq!(f(&sync["relocated_bytes"]), 0.0, "{sync}");
    assert!(f(&sync["flushes_per_s"]) > 0.0, "{sync}");
    // Each client flush costs member flushes, shared among concurrent clients.
    let per_flush = f(&sync["member_flushes_per_flush"]);
    assert!(per_flush > 0.0 && per_flush <= 3.0 * 2.0, "{sync}");
    assert!(
        err.contains("window") && err.contains("steady (windows"),
        "{err}"
    );
}

#[test]
fn a_run_cut_short_by_the_time_limit_is_not_converged() {
    let dir = tempfile::tempdir().unwrap();
    // Windows of the whole volume: four volumes of writes in 50 ms is beyond this machine.
    let (err, report) = steady(
        dir.path(),
        "uniform",
        &["--steady-max-seconds", "0.05", "--steady-window", "1"],
    );
    let run = &report["runs"][0];
    assert_eq!(run["converged"], false, "{run}");
    assert_eq!(run["warmup_bytes"], run["volume_bytes"], "{run}");
    assert_eq!(run["stopped_by"], "time_limit", "{run}");
    assert!(
        err.contains("not converged") && err.contains("--steady-max-seconds"),
        "{err}"
    );
    assert!(f(&run["seconds"]) < 5.0, "{run}");
}

#[test]
fn bad_patterns_and_traces_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bad_trace = dir.path().join("bad.csv");
    std::fs::write(&bad_trace, "1,h,0,Write,0,4096,1\n2,h,0,Write,4096,4096\n").unwrap();
    let empty_trace = dir.path().join("empty.csv");
    std::fs::write(&empty_trace, "").unwrap();
    let cases = [
        ("uniform,zipf:-1".to_string(), "zipf:-1".to_string()),
        (
            "hotcold".to_string(),
            "unknown pattern 'hotcold'".to_string(),
        ),
        (
            format!("trace:{}", bad_trace.display()),
            "line 2: expected 7 comma-separated fields".to_string(),
        ),
        (
            format!("trace:{}", empty_trace.display()),
            "no writes".to_string(),
        ),
        (
            format!("trace:{}", dir.path().join("missing.csv").display()),
            "missing.csv".to_string(),
        ),
    ];
    for (patterns, says) in cases {
        let out = lograid()
            .args(["bench", "--workloads", "steady", "--member-size", "64M"])
            .args(["--patterns", &patterns, "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{patterns}");
        assert!(
            err.contains("--patterns") && err.contains(&says),
            "{patterns}: {err}"
        );
        // Refused before any member file was made.
        assert!(!dir.path().join("member0.img").exists());
    }
    for (flag, value) in [
        ("--steady-max-seconds", "0"),
        ("--steady-window", "1.5"),
        ("--steady-warmup", "-1"),
    ] {
        let out = lograid()
            .args(["bench", "--workloads", "steady", "--dir"])
            .arg(dir.path())
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(flag), "{flag}: {err}");
    }
}
