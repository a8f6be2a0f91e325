//! `lograid serve --discard`: segments the cleaner or overwrites free are
//! punched out of the member files, so sparse files shrink back.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::os::unix::fs::MetadataExt;

fn allocated(pool: &TestPool) -> u64 {
    pool.drives
        .iter()
        .map(|d| std::fs::metadata(d).unwrap().blocks() * 512)
        .sum()
}

#[test]
fn freed_segments_are_punched_out_of_member_files() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:320M");
    let server = pool.serve_with(&["--discard"]);
    let uri = server.uri("vol0");
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 1 0 128M", "-c", "flush", &uri]));
    let written = allocated(&pool);
    // Trimming most of it empties whole segments; a flush frees them.
    run(tool("qemu-io").args(["-f", "raw", "-c", "discard 0 120M", "-c", "flush", &uri]));
    // Freed segments are released at the next flush or checkpoint.
    run(tool("qemu-io").args(["-f", "raw", "-c", "write -P 2 120M 4M", "-c", "flush", &uri]));
    server.terminate();
    let after = allocated(&pool);
    assert!(
        written >= 180 << 20,
        "128 MiB with parity should take about 192 MiB of files, took {written}"
    );
    assert!(
        after < written / 2,
        "member files did not shrink after trim with --discard: {written} -> {after}"
    );
    let out = stdout_of(lograid().args(["scrub", "--json"]).args(&pool.drives));
    assert!(out.contains("\"repaired_blocks\": 0"), "{out}");
}
