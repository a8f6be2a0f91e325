//! `lograid serve --nfs`: the volumes as files over NFSv3, through the real binary, with a real
//! third-party client: libnfs (Debian's libnfs-utils for nfs-ls and nfs-cat, and a small C
//! client on libnfs's RPC layer, tests/nfs/nfs_probe.c, compiled here against libnfs-dev).
//! Writes, COMMIT and read-back; a server killed between UNSTABLE writes and their COMMIT
//! (the verifier changes, handles stay valid, what was committed or written FILE_SYNC
//! survives); the file's size and attributes; a read-only volume; a full pool (NOSPC); hostile
//! bytes on the socket; a connected client served on at stop (`--nfs-drain`).

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The probe's write pattern (nfs_probe.c): byte at file offset p for seed s.
fn pattern(seed: u64, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|p| (seed.wrapping_mul(131) + p * 7 + (p >> 9)) as u8)
        .collect()
}

fn fnv(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn url(port: u16, path: &str) -> String {
    format!("nfs://127.0.0.1/{path}?nfsport={port}&mountport={port}&version=3")
}

/// `lograid serve DRIVES --nfs 127.0.0.1:NFS_PORT EXTRA...` on a free NBD port.
fn serve_nfs(pool: &TestPool, nfs_port: u16, extra: &[&str]) -> Server {
    let mut args = vec!["--nfs".to_string(), format!("127.0.0.1:{nfs_port}")];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&pool.drives, &args, pool.dir.path())
}

#[test]
fn files_are_the_volumes_and_writes_read_back() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    pool.add_volume("ro", "8M");
    let nfs_port = free_port();
    let server = serve_nfs(&pool, nfs_port, &["--read-only-volume", "ro"]);
    // The NBD port answers once bound; the lines saying how to connect
    // are printed just after.
    let line = format!("nfsport={nfs_port}&mountport={nfs_port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !server.stdout().contains(&line) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(server.stdout().contains(&line), "{}", server.stdout());

    // The directory as nfs-ls sees it: one file per volume, of the volume's size.
    let listing = stdout_of(tool("nfs-ls").arg(url(nfs_port, "")));
    let line_of = |name: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("{name} not listed: {listing}"))
            .to_string()
    };
    assert!(line_of("vol0").starts_with("-rw-rw-rw-"), "{listing}");
    assert!(
        line_of("vol0").contains(&(64 * MIB).to_string()),
        "{listing}"
    );
    assert!(line_of("ro").starts_with("-r--r--r--"), "{listing}");

    let lines = probe(
        nfs_port,
        &[
            "mount",
            "lookup:vol0",
            "getattr",
            "fsinfo",
            "write:777:3000:5:0",
            "read:777:3000",
            "write:1048576:1048576:9:2",
            "write:3145728:65536:11:1",
            "commit",
            "setattr-size:1",
            "setattr-size:134217728",
            "setattr-size:67108864",
            "write:67108860:8:1:0",
            "read:67108000:10000",
            "getattr",
        ],
    );
    let attr = &lines[2];
    assert_eq!(field(attr, "type"), "1", "a regular file: {attr}");
    assert_eq!(field(attr, "size"), (64 * MIB).to_string());
    assert_eq!(field(attr, "nlink"), "1");
    assert_eq!(field(&lines[3], "rtmax"), "1048576");
    assert_eq!(field(&lines[3], "wtmax"), "1048576");
    assert_eq!(field(&lines[3], "maxfilesize"), (64 * MIB).to_string());
    let verifier = field(&lines[4], "verf").to_string();
    assert_eq!(
        field(&lines[4], "committed"),
        "0",
        "UNSTABLE stays unstable"
    );
    assert_eq!(field(&lines[5], "fnv"), fnv(&pattern(5, 777, 3000)));
    assert_eq!(
        field(&lines[6], "committed"),
        "2",
        "FILE_SYNC: {}",
        lines[6]
    );
    assert_eq!(
        field(&lines[7], "committed"),
        "2",
        "DATA_SYNC answered FILE_SYNC"
    );
    assert_eq!(
        field(&lines[8], "verf"),
        verifier,
        "one verifier for the server's run"
    );
    assert_eq!(field(&lines[9], "status"), "22", "shrinking: NFS3ERR_INVAL");
    assert_eq!(field(&lines[10], "status"), "27", "growing: NFS3ERR_FBIG");
    assert_eq!(
        field(&lines[11], "status"),
        "0",
        "the same size is no change"
    );
    assert_eq!(
        field(&lines[12], "status"),
        "27",
        "a write past the end: NFS3ERR_FBIG"
    );
    assert_eq!(field(&lines[13], "count"), "864");
    assert_eq!(field(&lines[13], "eof"), "1");
    assert_eq!(field(&lines[14], "size"), (64 * MIB).to_string());

    // The whole file through libnfs's file API (nfs-cat): its size, and the bytes written.
    let whole = run(tool("nfs-cat").arg(url(nfs_port, "/vol0"))).stdout;
    assert_eq!(whole.len() as u64, 64 * MIB);
    assert_eq!(&whole[777..3777], &pattern(5, 777, 3000)[..]);
    assert_eq!(
        &whole[MIB as usize..2 * MIB as usize],
        &pattern(9, MIB, MIB)[..]
    );

    // The read-only volume: readable, every write refused with NFS3ERR_ROFS.
    let ro = probe(
        nfs_port,
        &[
            "mount",
            "lookup:ro",
            "getattr",
            "write:0:4096:1:2",
            "setattr-size:0",
            "read:0:4096",
        ],
    );
    assert_eq!(field(&ro[2], "mode"), "444");
    assert_eq!(field(&ro[3], "status"), "30");
    assert_eq!(field(&ro[4], "status"), "30");
    assert_eq!(field(&ro[5], "fnv"), fnv(&[0u8; 4096]));
    server.terminate();
}

#[test]
fn a_restart_between_unstable_writes_and_commit_changes_the_verifier() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let nfs_port = free_port();
    let server = serve_nfs(&pool, nfs_port, &[]);
    // 8 MiB FILE_SYNC, then 8 MiB UNSTABLE never committed (32 writes of 256 KiB in flight).
    let before = probe(
        nfs_port,
        &[
            "mount",
            "lookup:vol0",
            "writes:0:1048576:8:21:2",
            "writes:8388608:262144:32:22:0",
        ],
    );
    let handle = field(&before[1], "handle").to_string();
    assert_eq!(field(&before[2], "status"), "0");
    assert_eq!(field(&before[3], "status"), "0");
    let old_verifier = field(&before[3], "verf").to_string();
    server.kill();

    let server = serve_nfs(&pool, nfs_port, &[]);
    // The handle from before the restart, with no MNT or LOOKUP: still the file.
    let handle_step = format!("handle:{handle}");
    let after = probe(
        nfs_port,
        &[&handle_step, "getattr", "commit", "read:0:8388608"],
    );
    assert_eq!(
        field(&after[1], "status"),
        "0",
        "handle stale after a restart"
    );
    assert_eq!(field(&after[1], "size"), (64 * MIB).to_string());
    let new_verifier = field(&after[2], "verf").to_string();
    assert_ne!(
        new_verifier, old_verifier,
        "the verifier must change across a restart"
    );
    // What was written FILE_SYNC survived SIGKILL (reads are at most 1 MiB: count 1 MiB).
    let first = probe(
        nfs_port,
        &[&handle_step, "read:0:1048576", "read:7340032:1048576"],
    );
    assert_eq!(field(&first[1], "fnv"), fnv(&pattern(21, 0, MIB)));
    assert_eq!(field(&first[2], "fnv"), fnv(&pattern(21, 7 * MIB, MIB)));

    // The client sends the uncommitted writes again and commits them; then a SIGKILL.
    let resent = probe(
        nfs_port,
        &[&handle_step, "writes:8388608:262144:32:22:0", "commit"],
    );
    assert_eq!(field(&resent[1], "verf"), new_verifier);
    assert_eq!(field(&resent[2], "verf"), new_verifier);
    server.kill();
    let server = serve_nfs(&pool, nfs_port, &[]);
    let last = probe(
        nfs_port,
        &[
            &handle_step,
            "read:8388608:1048576",
            "read:15728640:1048576",
        ],
    );
    assert_eq!(field(&last[1], "fnv"), fnv(&pattern(22, 8 * MIB, MIB)));
    assert_eq!(field(&last[2], "fnv"), fnv(&pattern(22, 15 * MIB, MIB)));
    server.terminate();
}

#[test]
fn a_full_pool_answers_nospc_and_stored_blocks_stay_writable() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    // A thin 1 GiB volume on a pool that holds about 200 MiB.
    let pool = TestPool::create("128M", "vol0:1G");
    let nfs_port = free_port();
    let server = serve_nfs(&pool, nfs_port, &[]);
    let lines = probe(
        nfs_port,
        &[
            "mount",
            "lookup:vol0",
            "writes:0:1048576:300:4:0",
            "commit",
            "write:0:4096:5:2",
            "read:0:4096",
        ],
    );
    assert_eq!(
        field(&lines[2], "status"),
        "28",
        "NFS3ERR_NOSPC once the pool is full"
    );
    assert_eq!(field(&lines[3], "status"), "0", "what was taken commits");
    assert_eq!(
        field(&lines[4], "status"),
        "0",
        "an overwrite of a stored block still fits"
    );
    assert_eq!(field(&lines[5], "fnv"), fnv(&pattern(5, 0, 4096)));
    server.terminate();
}

/// Sends `bytes` on a new connection and returns what came back before the server closed it
/// or went quiet.
fn exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut back = Vec::new();
    let _ = stream.read_to_end(&mut back);
    back
}

fn record(words: &[u32], tail: &[u8]) -> Vec<u8> {
    let mut body: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    body.extend_from_slice(tail);
    let mut out = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

#[test]
fn hostile_bytes_get_errors_and_the_server_serves_on() {
    if !need_tools(&["cc", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:16M");
    let nfs_port = free_port();
    let server = serve_nfs(&pool, nfs_port, &[]);
    // xid 9, CALL, RPC 2, NFS 3, WRITE, AUTH_NONE x2, then arguments cut short.
    let garbage_args = record(&[9, 0, 2, 100_003, 3, 7, 0, 0, 0, 0], &[0, 0, 0, 28, 1, 2]);
    let back = exchange(nfs_port, &garbage_args);
    assert_eq!(back.len(), 4 + 24, "one accepted reply: {back:?}");
    assert_eq!(&back[4..8], &9u32.to_be_bytes());
    assert_eq!(&back[24..28], &4u32.to_be_bytes(), "GARBAGE_ARGS");
    // RPC version 3: denied with RPC_MISMATCH.
    let back = exchange(
        nfs_port,
        &record(&[5, 0, 3, 100_003, 3, 0, 0, 0, 0, 0], &[]),
    );
    assert_eq!(&back[12..16], &1u32.to_be_bytes(), "MSG_DENIED: {back:?}");
    // NFS version 4 on this port: PROG_MISMATCH 3..3.
    let back = exchange(
        nfs_port,
        &record(&[6, 0, 2, 100_003, 4, 0, 0, 0, 0, 0], &[]),
    );
    assert_eq!(&back[24..36], &[0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3]);
    // A record too large, a reply sent to the server, a record cut short, random bytes:
    // the connection is closed without an answer.
    for hostile in [
        vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        record(&[1, 1, 0, 0], &[]),
        vec![0x80, 0, 0, 100, 1, 2, 3],
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
    ] {
        assert!(
            exchange(nfs_port, &hostile).is_empty(),
            "answered {hostile:?}"
        );
    }
    // A client that stalls inside a record does not hold up the others.
    let mut stalled = TcpStream::connect(("127.0.0.1", nfs_port)).unwrap();
    stalled.write_all(&[0x80, 0, 0x10, 0, 1, 2]).unwrap();
    let lines = probe(
        nfs_port,
        &["mount", "lookup:vol0", "write:0:4096:3:2", "read:0:4096"],
    );
    assert_eq!(field(&lines[3], "fnv"), fnv(&pattern(3, 0, 4096)));
    drop(stalled);
    server.terminate();
}

#[test]
fn a_bad_nfs_address_fails_before_the_pool_opens() {
    let pool = TestPool::create("256M", "vol0:16M");
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--listen", "127.0.0.1:0", "--nfs", "not an address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--nfs 'not an address'"), "{err}");
    assert!(!err.contains("opened pool"), "{err}");
}

/// `--nfs-drain SECONDS`: at SIGTERM a client still connected (a disk image being detached)
/// is served on, a new one is refused, and once the client goes the server stops cleanly
/// without waiting out the drain.
#[test]
fn at_stop_a_connected_client_is_served_until_it_goes() {
    let pool = TestPool::create("256M", "vol0:16M");
    let nfs_port = free_port();
    let server = serve_nfs(&pool, nfs_port, &["--nfs-drain", "120"]);
    let null_call = |xid: u32| record(&[xid, 0, 2, 100_003, 3, 0, 0, 0, 0, 0], &[]);
    let mut client = TcpStream::connect(("127.0.0.1", nfs_port)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reply = [0u8; 28];
    client.write_all(&null_call(1)).unwrap();
    client.read_exact(&mut reply).unwrap();
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !server.stderr().contains("serving them for up to 120 s") {
        assert!(std::time::Instant::now() < deadline, "{}", server.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(TcpStream::connect(("127.0.0.1", nfs_port)).is_err());
    client.write_all(&null_call(2)).unwrap();
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..8], &2u32.to_be_bytes());
    let started = std::time::Instant::now();
    drop(client);
    let err = server.terminate();
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(err.contains("every client has disconnected"), "{err}");
}
