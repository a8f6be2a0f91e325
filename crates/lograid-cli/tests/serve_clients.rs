//! `lograid serve` driven by real NBD clients: qemu-img, qemu-io, nbdinfo,
//! nbdcopy, fio's nbd engine, and a minimal client of our own for what those
//! cannot do (flushes across connections, writes never flushed). Each test
//! makes its own pool of sparse files and its own server on a free port.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut cmd = tool("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    cmd.arg(uri);
    let out = stdout_of(&mut cmd);
    assert!(
        !out.contains("failed"),
        "qemu-io {commands:?} reported a failure:\n{out}"
    );
    out
}

/// `nbdinfo --map` as (offset, length, type) runs.
fn map(uri: &str) -> Vec<(u64, u64, u32)> {
    stdout_of(tool("nbdinfo").args(["--map", uri]))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// The type `nbdinfo --map` reports over all of [start, end) (panics if mixed).
fn map_type(runs: &[(u64, u64, u32)], start: u64, end: u64) -> u32 {
    let covering: Vec<_> = runs
        .iter()
        .filter(|(o, l, _)| o + l > start && *o < end)
        .collect();
    assert!(
        !covering.is_empty(),
        "no run covers [{start}, {end}): {runs:?}"
    );
    let t = covering[0].2;
    assert!(
        covering.iter().all(|r| r.2 == t),
        "[{start}, {end}) is mixed: {runs:?}"
    );
    t
}

/// Source contents with random data and zero stretches (so zero detection and sparse paths run).
fn random_image(seed: u64, size: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut data = rng.bytes(size);
    for _ in 0..6 {
        let start = rng.below(size as u64 - 4 * MIB) as usize & !4095;
        let len = (rng.below(4 * MIB) as usize + 4096) & !511;
        data[start..start + len].fill(0);
    }
    data
}

#[test]
fn qemu_img_info_convert_in_and_out_compare() {
    if !need_tools(&["qemu-img"]) {
        return;
    }
    let started = Instant::now();
    let pool = TestPool::create("256M", "vol0:300M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    let info = stdout_of(tool("qemu-img").args(["info", &uri]));
    assert!(
        info.contains("virtual size: 300 MiB (314572800 bytes)"),
        "{info}"
    );

    let source = random_image(1, 48 * MIB as usize);
    let src = write_file(&pool.path("src.raw"), &source);
    run(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri));
    let cmp = stdout_of(
        tool("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri),
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");

    let out = pool.path("out.raw");
    run(tool("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&out));
    let back = read_file(&out);
    assert_eq!(back.len() as u64, 300 * MIB);
    assert!(
        back[..source.len()] == source[..],
        "converted-out image differs from the source"
    );
    assert!(
        back[source.len()..].iter().all(|&b| b == 0),
        "never-written range is not zero"
    );
    server.terminate();
    elapsed_note("qemu_img", started);
}

#[test]
fn qemu_io_patterns_discard_zero_and_restart() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:300M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    qemu_io(
        &uri,
        &[
            "write -P 0xab 0 4M",
            "write -P 0x5a 1536 512", // one sector inside a 4 KiB block
            "write -f -P 0x3c 8M 1M", // FUA
            "aio_write -P 0x71 16M 256k",
            "aio_write -P 0x72 20M 64k",
            "aio_flush",
            "discard 1M 1M",
            "write -z 2M 64k",
            "write -z -u 3M 128k",
            "write -P 0x99 299M 1M", // last MiB of the volume
            "flush",
        ],
    );
    let verify = [
        "read -P 0xab 0 1536",
        "read -P 0x5a 1536 512",
        "read -P 0xab 2048 1046528",
        "read -P 0 1M 1M",
        "read -P 0 2M 64k",
        "read -P 0xab 2162688 983040",
        "read -P 0 3M 128k",
        "read -P 0xab 3276800 917504",
        "read -P 0x3c 8M 1M",
        "read -P 0x71 16M 256k",
        "read -P 0x72 20M 64k",
        "read -P 0 21M 1M",
        "read -P 0x99 299M 1M",
    ];
    qemu_io(&uri, &verify);
    // Out of range: refused, nothing written.
    let past = tool("qemu-io")
        .args(["-f", "raw", "-c", "write -P 1 300M 4k", &uri])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&past.stdout).to_string() + &String::from_utf8_lossy(&past.stderr);
    assert!(
        text.contains("failed") || text.contains("out of range") || !past.status.success(),
        "{text}"
    );

    server.terminate();
    let server = Server::start(&pool.drives, &[], pool.dir.path());
    qemu_io(&server.uri("vol0"), &verify);
    server.terminate();
}

#[test]
fn nbdinfo_lists_volumes_and_maps_holes_after_trim() {
    if !need_tools(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:300M");
    pool.add_volume("vol1", "64M");
    pool.add_volume("scratch.2", "8M");
    let server = pool.serve();
    let listing = stdout_of(tool("nbdinfo").args(["--list", "--json", &server.base_uri()]));
    let json: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let mut names: Vec<(String, u64)> = json["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            ("scratch.2".into(), 8 * MIB),
            ("vol0".into(), 300 * MIB),
            ("vol1".into(), 64 * MIB)
        ],
        "{listing}"
    );
    for e in json["exports"].as_array().unwrap() {
        assert_eq!(e["can_multi_conn"], true);
        assert_eq!(e["can_trim"], true);
        assert_eq!(e["block_size_minimum"], 512);
        assert_eq!(e["block_size_preferred"], 4096);
        assert!(e["block_size_maximum"].as_u64().unwrap() >= 32 * MIB);
    }

    let uri = server.uri("vol0");
    assert_eq!(
        map(&uri),
        vec![(0, 300 * MIB, 3)],
        "a new volume is one hole"
    );
    qemu_io(&uri, &["write -P 0x42 0 4M", "flush"]);
    let runs = map(&uri);
    assert_eq!(map_type(&runs, 0, 4 * MIB), 0, "{runs:?}");
    assert_eq!(map_type(&runs, 4 * MIB, 300 * MIB), 3, "{runs:?}");
    qemu_io(&uri, &["discard 1M 1M", "flush"]);
    let runs = map(&uri);
    assert_eq!(map_type(&runs, 0, MIB), 0, "{runs:?}");
    assert_eq!(
        map_type(&runs, MIB, 2 * MIB),
        3,
        "trimmed range is not a hole: {runs:?}"
    );
    assert_eq!(map_type(&runs, 2 * MIB, 4 * MIB), 0, "{runs:?}");
    // Other volumes are untouched.
    assert_eq!(map(&server.uri("vol1")), vec![(0, 64 * MIB, 3)]);
    server.terminate();
}

#[test]
fn nbdcopy_in_out_and_between_volumes_over_many_connections() {
    if !need_tools(&["nbdcopy", "qemu-img"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    pool.add_volume("vol1", "64M");
    let server = pool.serve();
    let source = random_image(2, 40 * MIB as usize);
    let src = write_file(&pool.path("src.raw"), &source);
    run(tool("nbdcopy")
        .args(["--connections=4", "--requests=16", "--flush"])
        .arg(&src)
        .arg(server.uri("vol0")));
    run(tool("nbdcopy").args([
        "--connections=2",
        "--flush",
        &server.uri("vol0"),
        &server.uri("vol1"),
    ]));
    let out = pool.path("out.raw");
    run(tool("nbdcopy")
        .args(["--connections=4", &server.uri("vol1")])
        .arg(&out));
    let back = read_file(&out);
    assert_eq!(back.len() as u64, 64 * MIB);
    assert!(
        back[..source.len()] == source[..],
        "nbdcopy round trip differs"
    );
    assert!(back[source.len()..].iter().all(|&b| b == 0));
    let cmp = stdout_of(tool("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        &server.uri("vol0"),
        &server.uri("vol1"),
    ]));
    assert!(cmp.contains("Images are identical"), "{cmp}");
    server.terminate();
}

fn fio_job(name: &str, uri: &str, extra: &[&str]) -> Command {
    let mut c = tool("fio");
    c.args([
        &format!("--name={name}"),
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        // No verify state files left in the working directory.
        "--verify_state_save=0",
        "--group_reporting",
    ]);
    c.args(extra);
    c
}

#[test]
fn fio_nbd_random_writes_verify() {
    if !need_tools(&["fio"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    // 4 KiB random writes at depth 16, then mixed 512 B - 64 KiB: every block verified by crc32c.
    let out = stdout_of(&mut fio_job(
        "rand4k",
        &uri,
        &["--rw=randwrite", "--bs=4k", "--size=32M", "--iodepth=16"],
    ));
    assert!(out.contains("err= 0"), "{out}");
    let out = stdout_of(&mut fio_job(
        "mixed",
        &uri,
        &[
            "--rw=randwrite",
            "--bsrange=512-64k",
            "--size=32M",
            "--offset=32M",
            "--iodepth=8",
            "--fsync=16",
        ],
    ));
    assert!(out.contains("err= 0"), "{out}");
    server.terminate();
    // What fio wrote and verified survives a restart.
    let server = Server::start(&pool.drives, &[], pool.dir.path());
    let uri = server.uri("vol0");
    let out = stdout_of(&mut fio_job(
        "rand4k",
        &uri,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--iodepth=16",
            "--verify_only",
        ],
    ));
    assert!(out.contains("err= 0"), "{out}");
    server.terminate();
}

#[test]
fn two_clients_write_two_volumes_at_once() {
    if !need_tools(&["fio"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:48M");
    pool.add_volume("vol1", "48M");
    let server = pool.serve();
    let job = |vol: &str, bs: &str| {
        let mut c = fio_job(
            vol,
            &server.uri(vol),
            &["--rw=randwrite", bs, "--size=48M", "--iodepth=16"],
        );
        c.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let a = job("vol0", "--bs=4k").spawn().unwrap();
    let b = job("vol1", "--bsrange=4k-128k").spawn().unwrap();
    for (name, child) in [("vol0", a), ("vol1", b)] {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("err= 0"),
            "fio on {name}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // After both finished: each volume still holds exactly its own writes.
    for (vol, bs) in [("vol0", "--bs=4k"), ("vol1", "--bsrange=4k-128k")] {
        let out = stdout_of(&mut fio_job(
            vol,
            &server.uri(vol),
            &[
                "--rw=randwrite",
                bs,
                "--size=48M",
                "--iodepth=16",
                "--verify_only",
            ],
        ));
        assert!(out.contains("err= 0"), "{out}");
    }
    server.terminate();
}

#[test]
fn two_connections_on_one_volume_with_flushes_survive_sigkill() {
    if !need_tools(&["fio"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    // Two fio jobs = two connections, each on its own half, flushing every 8 writes and at the end.
    let args = [
        "--rw=randwrite",
        "--bsrange=4k-64k",
        "--numjobs=2",
        "--size=24M",
        "--offset_increment=32M",
        "--iodepth=8",
        "--fsync=8",
        "--end_fsync=1",
    ];
    let out = stdout_of(&mut fio_job("pair", &uri, &args));
    assert!(out.contains("err= 0"), "{out}");

    // Our own client: writes on connection A, the flush on connection B. The
    // server advertises multi-conn, so B's flush must make A's writes durable.
    let mut a = NbdClient::connect(server.port, "vol0");
    let mut b = NbdClient::connect(server.port, "vol0");
    assert!(
        a.flags & (1 << 8) != 0,
        "NBD_FLAG_CAN_MULTI_CONN not advertised"
    );
    let mut rng = Rng::new(7);
    let block_a = rng.bytes(256 * 1024);
    let block_b = rng.bytes(8192);
    a.write(30 * MIB, &block_a);
    b.write(62 * MIB, &block_b);
    b.flush();
    // A's data is visible on B at once (one volume, one cache).
    assert!(b.read(30 * MIB, block_a.len() as u32) == block_a);
    server.kill();

    let server = Server::start(&pool.drives, &[], pool.dir.path());
    let mut c = NbdClient::connect(server.port, "vol0");
    assert!(
        c.read(30 * MIB, block_a.len() as u32) == block_a,
        "write flushed by another connection was lost"
    );
    assert!(
        c.read(62 * MIB, block_b.len() as u32) == block_b,
        "flushed write was lost"
    );
    c.disconnect();
    let mut verify = args.to_vec();
    verify.push("--verify_only");
    let out = stdout_of(&mut fio_job("pair", &server.uri("vol0"), &verify));
    assert!(
        out.contains("err= 0"),
        "flushed fio writes lost after SIGKILL:\n{out}"
    );
    server.terminate();
}

#[test]
fn sigterm_flushes_writes_no_client_flushed() {
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let mut rng = Rng::new(11);
    let data = rng.bytes(2 * MIB as usize);
    let mut a = NbdClient::connect(server.port, "vol0");
    a.write(MIB, &data);
    a.disconnect();
    // A client still connected (idle) must not hold the shutdown up.
    let mut idle = NbdClient::connect(server.port, "vol0");
    let tail = rng.bytes(4096);
    idle.write(40 * MIB, &tail);
    let started = Instant::now();
    let err = server.terminate();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}:\n{err}",
        started.elapsed()
    );
    drop(idle);

    let server = Server::start(&pool.drives, &[], pool.dir.path());
    let mut c = NbdClient::connect(server.port, "vol0");
    assert!(
        c.read(MIB, data.len() as u32) == data,
        "unflushed writes lost over a clean shutdown"
    );
    assert!(
        c.read(40 * MIB, 4096) == tail,
        "write of a still-connected client lost over a clean shutdown"
    );
    c.disconnect();
    server.terminate();
}

#[test]
fn second_server_on_the_same_drives_is_refused() {
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let started = Instant::now();
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second serve started:\n{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(err.contains("is open by another lograid process"), "{err}");
    assert!(err.contains("already running"), "{err}");
    assert_eq!(
        err.matches("is open by another lograid process").count(),
        1,
        "cause repeated: {err}"
    );
    // The first server is unaffected.
    let mut c = NbdClient::connect(server.port, "vol0");
    c.write(0, &[7u8; 4096]);
    c.flush();
    c.disconnect();
    server.terminate();
}

#[test]
fn serve_without_drives_creates_and_reuses_lograid_data() {
    let cwd = tempfile::Builder::new()
        .prefix("lograid-cli-default-")
        .tempdir()
        .unwrap();
    let server = Server::start_args(vec!["serve".into()], cwd.path(), Some(cwd.path()));
    let err = server.stderr();
    assert!(err.contains("created a pool in ./lograid-data"), "{err}");
    let data_dir = cwd.path().join("lograid-data");
    for i in 0..3 {
        let meta = std::fs::metadata(data_dir.join(format!("member{i}.img"))).unwrap();
        assert_eq!(meta.len(), 4 << 30);
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 64 * MIB,
            "member {i} is not sparse: {} bytes allocated",
            meta.blocks() * 512
        );
    }
    let out = server.stdout();
    for hint in [
        format!("qemu-img info nbd://127.0.0.1:{}/vol0", server.port),
        format!("nbdinfo --list nbd://127.0.0.1:{}", server.port),
        format!(
            "lograid attach --server nbd://127.0.0.1:{} --export vol0",
            server.port
        ),
        format!("nbd-client -N vol0 127.0.0.1 {} /dev/nbd0", server.port),
    ] {
        assert!(out.contains(&hint), "missing {hint:?} in:\n{out}");
    }
    let mut c = NbdClient::connect(server.port, "vol0");
    // 3 x 4 GiB, parity 1: one volume of (nearly) the 8 GiB of data capacity.
    assert!(
        c.size & 4095 == 0 && c.size > 6 << 30 && c.size <= 8 << 30,
        "size {}",
        c.size
    );
    c.write(c.size - 4096, &[0xee; 4096]);
    c.disconnect();
    server.terminate();

    let server = Server::start_args(vec!["serve".into()], cwd.path(), Some(cwd.path()));
    let err = server.stderr();
    assert!(
        err.contains("serving the pool in ./lograid-data") && !err.contains("created"),
        "{err}"
    );
    let mut c = NbdClient::connect(server.port, "");
    assert_eq!(c.read(c.size - 4096, 4096), vec![0xee; 4096]);
    c.disconnect();
    server.terminate();
}

/// One volume served read-only, the other writable; an unknown volume
/// named read-only is refused at start.
#[test]
fn one_volume_read_only() {
    if !need_tools(&["nbdinfo"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:32M");
    pool.add_volume("vol1", "32M");
    let server = pool.serve_with(&["--read-only-volume", "vol1"]);
    assert!(stdout_of(tool("nbdinfo").arg(server.uri("vol1"))).contains("is_read_only: true"));
    assert!(stdout_of(tool("nbdinfo").arg(server.uri("vol0"))).contains("is_read_only: false"));
    let mut c = NbdClient::connect(server.port, "vol1");
    let (error, _) = c.request(NBD_CMD_WRITE, 0, 0, 4096, &[1u8; 4096]);
    assert_eq!(
        error, 1,
        "write to the read-only volume: expected NBD_EPERM"
    );
    c.disconnect();
    let mut c = NbdClient::connect(server.port, "vol0");
    let (error, _) = c.request(NBD_CMD_WRITE, 0, 0, 4096, &[1u8; 4096]);
    assert_eq!(error, 0, "write to the writable volume");
    c.disconnect();
    server.terminate();
    let out = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args(["--read-only-volume", "nope", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such volume"));
}

#[test]
fn unix_socket_and_read_only() {
    if !need_tools(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    qemu_io(&server.uri("vol0"), &["write -P 0x61 0 1M"]);
    server.terminate();

    let socket = pool.path("nbd.sock");
    let server = pool.serve_with(&["--socket", socket.to_str().unwrap(), "--read-only"]);
    let unix_uri = format!("nbd+unix:///vol0?socket={}", socket.display());
    assert!(
        server.stdout().contains(&unix_uri) || server.stdout().contains("nbd+unix"),
        "{}",
        server.stdout()
    );
    let info = stdout_of(tool("nbdinfo").arg(&unix_uri));
    assert!(info.contains("is_read_only: true"), "{info}");
    let out =
        stdout_of(tool("qemu-io").args(["-r", "-f", "raw", "-c", "read -P 0x61 0 1M", &unix_uri]));
    assert!(!out.contains("failed"), "{out}");
    let mut c = NbdClient::connect(server.port, "vol0");
    let (error, _) = c.request(NBD_CMD_WRITE, 0, 0, 4096, &[1u8; 4096]);
    assert_eq!(error, 1, "write to a read-only export: expected NBD_EPERM");
    c.disconnect();
    server.terminate();
    assert!(!socket.exists(), "socket file left behind");
}

#[test]
fn allow_list_refuses_other_peers() {
    if !need_tools(&["nbdinfo"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve_with(&["--allow", "10.11.12.13,192.0.2.1"]);
    let out = tool("nbdinfo")
        .arg(server.uri("vol0"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a peer outside the allow list was served"
    );
    server.terminate();
    let server = pool.serve_with(&["--allow", "127.0.0.1"]);
    run(tool("nbdinfo").arg(server.uri("vol0")));
    server.terminate();
}

#[test]
fn write_zeroes_with_no_hole_is_not_reported_as_a_hole() {
    if !need_tools(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:64M");
    let server = pool.serve();
    let uri = server.uri("vol0");
    // `write -z` without -u sends NBD_CMD_WRITE_ZEROES with NO_HOLE.
    qemu_io(&uri, &["write -P 0x11 0 2M", "write -z 0 1M", "flush"]);
    let runs = map(&uri);
    assert_eq!(
        map_type(&runs, 0, MIB),
        2,
        "NO_HOLE zeroes reported as {runs:?}"
    );
    server.terminate();
}

#[test]
fn sigkill_while_writing_keeps_every_flushed_write() {
    const BLOCK: u64 = lograid::format::BLOCK_BYTES;
    const BLOCKS: u64 = (192 * MIB) / BLOCK;
    let pool = TestPool::create("256M", "vol0:192M");
    let contents = |b: u64| Rng::new(0xC0FFEE ^ b).bytes(BLOCK as usize);
    // What each written block must read as from now on: Some(true) its data, Some(false) zeroes,
    // None either (written after the last acknowledged flush).
    let mut expect: Vec<Option<bool>> = Vec::new();
    let mut rng = Rng::new(99);
    let mut server = pool.serve();
    for round in 0..3 {
        let pid = server.pid();
        let delay = Duration::from_millis(100 + rng.below(400));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: kill on the pid of a child the test has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let mut c = NbdClient::connect(server.port, "vol0");
        let first_unflushed_before = expect.len();
        let mut pending = expect.len(); // first block not yet covered by an acknowledged flush
        while (expect.len() as u64) < BLOCKS {
            let b = expect.len() as u64;
            match c.try_request(NBD_CMD_WRITE, 0, b * BLOCK, BLOCK as u32, &contents(b)) {
                Ok((0, _)) => expect.push(None),
                Ok((e, _)) => panic!("write of block {b} failed with NBD error {e}"),
                Err(_) => break,
            }
            if b % 16 == 15 {
                match c.try_request(NBD_CMD_FLUSH, 0, 0, 0, &[]) {
                    Ok((0, _)) => {
                        for x in &mut expect[pending..] {
                            *x = Some(true);
                        }
                        pending = expect.len();
                    }
                    Ok((e, _)) => panic!("flush failed with NBD error {e}"),
                    Err(_) => break,
                }
            }
        }
        killer.join().unwrap();
        let flushed = pending - first_unflushed_before;
        server.kill();
        server = pool.serve();
        let mut c = NbdClient::connect(server.port, "vol0");
        let (mut kept, mut lost) = (0, 0);
        let zero = vec![0u8; BLOCK as usize];
        let written = expect.len();
        for (chunk_start, chunk) in (0..written)
            .step_by(256)
            .map(|s| (s, s..(s + 256).min(written)))
        {
            let bytes = c.read(
                chunk_start as u64 * BLOCK,
                (chunk.len() as u64 * BLOCK) as u32,
            );
            for b in chunk {
                let got = &bytes[(b - chunk_start) * BLOCK as usize..][..BLOCK as usize];
                let is_data = got == &contents(b as u64)[..];
                let is_zero = got == &zero[..];
                match expect[b] {
                    Some(true) => {
                        assert!(is_data, "round {round}: flushed block {b} lost or damaged")
                    }
                    Some(false) => assert!(
                        is_zero,
                        "round {round}: block {b} changed after it was lost"
                    ),
                    None => {
                        assert!(
                            is_data || is_zero,
                            "round {round}: unflushed block {b} reads as garbage"
                        );
                        // Whatever it reads now is on disk: from now on it must stay so.
                        expect[b] = Some(is_data);
                        if is_data {
                            kept += 1
                        } else {
                            lost += 1
                        }
                    }
                }
            }
        }
        c.disconnect();
        eprintln!("round {round}: {} blocks written ({flushed} flushed), unflushed kept {kept}, lost {lost}", expect.len() - first_unflushed_before);
    }
    server.terminate();
}

#[test]
fn serve_runs_unprivileged_with_the_default_memlock_limit() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // An ordinary user: RLIMIT_MEMLOCK of 8 MiB and (when we are root) uid/gid 65534, no capabilities.
    // mlockall(MCL_FUTURE) would let the server start and then fail every thread spawn.
    let cwd = tempfile::Builder::new()
        .prefix("lograid-cli-unpriv-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(cwd.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy of the binary the unprivileged user can surely read.
    let bin = cwd.path().join("lograid");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start_prepared(
        &bin,
        vec!["serve".into()],
        cwd.path(),
        Some(cwd.path()),
        |cmd| {
            // SAFETY: only async-signal-safe libc calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: 8 << 20,
                        rlim_max: 8 << 20,
                    };
                    if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::geteuid() == 0
                        && (libc::setgroups(0, std::ptr::null()) != 0
                            || libc::setgid(65534) != 0
                            || libc::setuid(65534) != 0)
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        },
    );
    let err = server.stderr();
    assert!(
        err.contains("memory not locked") || err.contains("mlockall failed"),
        "{err}"
    );
    let mut c = NbdClient::connect(server.port, "vol0");
    c.write(0, &[0x42; 65536]);
    c.flush();
    assert_eq!(c.read(0, 65536), vec![0x42; 65536]);
    c.disconnect();
    server.terminate();
}

#[test]
fn listening_beyond_loopback_warns() {
    let pool = TestPool::create("256M", "vol0:64M");
    let port = free_port();
    let child = lograid()
        .arg("serve")
        .args(&pool.drives)
        .args([
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--allow",
            "127.0.0.1",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(pool.path("err")).unwrap())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline && child.0.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(pool.path("err")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = NbdClient::connect(port, "vol0");
    c.flush();
    c.disconnect();
    // SAFETY: kill on our own unreaped child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    assert!(child.0.wait().unwrap().success());
    let err = std::fs::read_to_string(pool.path("err")).unwrap();
    assert!(
        err.contains("warning: listening on 0.0.0.0") && err.contains("no authentication"),
        "{err}"
    );
    assert!(err.contains("closed cleanly"), "{err}");
}

/// Kills a child process on drop (when a test fails before it could stop it).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A member missing at start: the server says the pool is degraded, still
/// serves every block (rebuilt from parity), takes new writes, and after
/// the member comes back everything written in both states reads back.
#[test]
fn serves_degraded_with_a_member_missing() {
    if !need_tools(&["qemu-io"]) {
        return;
    }
    let pool = TestPool::create("256M", "vol0:200M");
    let server = pool.serve();
    qemu_io(
        &server.uri("vol0"),
        &["write -P 0x4d 0 8M", "write -P 0x4e 100M 3M", "flush"],
    );
    server.terminate();
    // Serve with member 1 missing.
    let present = vec![pool.drives[0].clone(), pool.drives[2].clone()];
    let server = Server::start(&present, &[], pool.dir.path());
    let uri = server.uri("vol0");
    qemu_io(&uri, &["read -P 0x4d 0 8M", "read -P 0x4e 100M 3M"]);
    qemu_io(&uri, &["write -P 0x6f 50M 2M", "flush"]);
    qemu_io(&uri, &["read -P 0x6f 50M 2M"]);
    let log = server.terminate();
    assert!(
        log.contains("DEGRADED") && log.contains("missing members [1]"),
        "{log}"
    );
    // Back with all members (the returning one is stale for the new rows).
    let server = pool.serve();
    let uri = server.uri("vol0");
    qemu_io(
        &uri,
        &[
            "read -P 0x4d 0 8M",
            "read -P 0x4e 100M 3M",
            "read -P 0x6f 50M 2M",
        ],
    );
    server.terminate();
}
