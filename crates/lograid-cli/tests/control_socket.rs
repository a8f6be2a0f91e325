//! The served pool's control socket (`pool-<uuid>.sock` in the run directory) given hostile
//! requests: each gets an error reply, nothing changes, the server goes on serving.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn control_socket(run_dir: &Path) -> PathBuf {
    for _ in 0..100 {
        if let Some(entry) = std::fs::read_dir(run_dir).ok().and_then(|dir| {
            dir.flatten()
                .find(|e| e.file_name().to_string_lossy().ends_with(".sock"))
        }) {
            return entry.path();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no control socket in {}", run_dir.display());
}

/// Sends `request` (bytes as given) and returns the reply line.
fn send(socket: &Path, request: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).expect("connecting to the control socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let _ = stream.write_all(request);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .expect("a reply");
    line
}

#[test]
fn hostile_control_requests_are_refused_and_change_nothing() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let run_dir = pool.path("run");
    let mut args: Vec<String> = vec!["serve".into()];
    args.extend(pool.drives.iter().map(|d| d.display().to_string()));
    let server = Server::start_prepared(Path::new(BIN), args, pool.dir.path(), None, |c| {
        c.env("LOGRAID_RUN_DIR", &run_dir);
    });
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x7e 0 1M",
        &server.uri("vol0"),
    ]));
    assert!(out.contains("wrote 1048576/1048576"), "{out}");
    let socket = control_socket(&run_dir);
    let member0 = pool.drives[0].display().to_string();
    let long = vec![b'{'; 100 << 10];
    let hostile: Vec<(Vec<u8>, &str)> = vec![
        (b"garbage\n".to_vec(), "malformed"),
        (b"{\"set-parity\": 300}\n".to_vec(), "malformed"),
        (b"{\"set-parity\": 9}\n".to_vec(), ""),
        (b"{\"set-parity\": 3}\n".to_vec(), ""),
        (b"{\"replace\": {\"old\": 99, \"new\": \"/nonexistent/x.img\", \"size\": null, \"force\": false}}\n".to_vec(), ""),
        (format!("{{\"replace\": {{\"old\": 0, \"new\": \"{member0}\", \"size\": null, \"force\": true}}}}\n").into_bytes(), ""),
        (format!("{{\"add\": {{\"drives\": [\"{member0}\"], \"size\": null, \"force\": true}}}}\n").into_bytes(), ""),
        (b"{\"add\": {\"drives\": [\"/nonexistent/dir/x.img\"], \"size\": 18446744073709551615, \"force\": false}}\n".to_vec(), ""),
        (b"{\"add\": {\"drives\": [], \"size\": null, \"force\": false}}\n".to_vec(), ""),
        (b"{\"remove\": {\"old\": 99}}\n".to_vec(), "member 99"),
        (b"{\"remove\": {\"old\": 18446744073709551615}}\n".to_vec(), ""),
        (b"{\"remove\": {\"old\": -1}}\n".to_vec(), "malformed"),
        (b"{\"pause-scrub\": true}\n".to_vec(), "no scrub"),
        ("cancel-scrub".as_bytes().to_vec(), "malformed"),
        (long, "malformed"),
        (b"\xff\xfe\x00\n".to_vec(), ""),
    ];
    for (request, expect) in &hostile {
        let reply = send(&socket, request);
        let shown = String::from_utf8_lossy(&request[..request.len().min(120)]);
        assert!(reply.contains("\"ok\":false"), "{shown}: accepted: {reply}");
        assert!(
            reply.contains(expect),
            "{shown}: expected {expect:?} in {reply}"
        );
    }
    // A client that connects and says nothing, and one that hangs up at once.
    drop(UnixStream::connect(&socket).unwrap());
    let mut silent = UnixStream::connect(&socket).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut nothing = Vec::new();
    let _ = silent.read_to_end(&mut nothing);

    // Nothing changed: same members, same parity, the data is there, the server serves.
    let status = stdout_of(
        lograid()
            .env("LOGRAID_RUN_DIR", &run_dir)
            .args(["status", "--json"])
            .args(&pool.drives),
    );
    assert!(status.contains("\"parity\": 1"), "{status}");
    // The pool and its three members.
    assert_eq!(
        status.matches("\"state\": \"online\"").count(),
        4,
        "{status}"
    );
    assert!(status.contains("\"members_total\": 3"), "{status}");
    let out = stdout_of(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x7e 0 1M",
        &server.uri("vol0"),
    ]));
    assert!(
        out.contains("read 1048576/1048576") && !out.contains("failed"),
        "{out}"
    );
    // And a good request still works.
    let reply = send(&socket, b"{\"scrub\": {\"repair\": false}}\n");
    assert!(reply.contains("\"ok\":true"), "{reply}");
    server.terminate();
}
