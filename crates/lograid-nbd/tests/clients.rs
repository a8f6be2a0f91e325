//! Real clients against the server over a MemExport: nbdinfo, qemu-img, qemu-io, nbdcopy, fio,
//! nbdsh (libnbd from Python, for clients that do not ask for block sizes).
//! A missing tool fails the test unless LOGRAID_SKIP_EXTERNAL=1.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lograid_nbd::mem_export::MemExport;
use lograid_nbd::proto::*;
use lograid_nbd::{Allocation, Export, ListenAddr};

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn nbdinfo_lists_exports_and_shows_capabilities() {
    if !require_tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let first = Arc::new(MemExport::new("disk0", 64 * MIB).with_description("first disk"));
    let second = Arc::new(MemExport::new("disk1", 16 * MIB));
    let server = TestServer::start(test_config(), vec![first.clone(), second.clone()]);

    let list = run_ok(
        Command::new("nbdinfo")
            .arg("--list")
            .arg(format!("nbd://{}", server.addr)),
        TOOL_TIMEOUT,
    );
    assert!(list.contains("export=\"disk0\""), "{list}");
    assert!(list.contains("export=\"disk1\""), "{list}");
    assert!(list.contains("description: first disk"), "{list}");
    assert!(list.contains("export-size: 16777216"), "{list}");

    let info = run_ok(
        Command::new("nbdinfo").arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    for expected in [
        "export-size: 67108864",
        "using structured packets",
        "base:allocation",
        "block_size_minimum: 512",
        "block_size_preferred: 4096",
        "block_size_maximum: 33554432",
        "is_read_only: false",
        "can_df: true",
        "can_fast_zero: true",
        "can_flush: true",
        "can_fua: true",
        "can_multi_conn: true",
        "can_trim: true",
        "can_zero: true",
    ] {
        assert!(info.contains(expected), "missing {expected:?} in:\n{info}");
    }
    // The empty name is the default export (the first one).
    let default = run_ok(
        Command::new("nbdinfo").arg(format!("nbd://{}", server.addr)),
        TOOL_TIMEOUT,
    );
    assert!(default.contains("export-size: 67108864"), "{default}");
    // An unknown export is refused with a clear error.
    let unknown = run_tool(
        Command::new("nbdinfo").arg(server.uri("nope")),
        TOOL_TIMEOUT,
    );
    assert!(!unknown.status.success());
    assert_eq!(
        first.contract_violations() + second.contract_violations(),
        0
    );
    server.stop().expect("clean shutdown");
}

#[test]
fn nbdinfo_read_only_server() {
    if !require_tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let export = Arc::new(MemExport::new("disk0", 8 * MIB));
    let config = lograid_nbd::ServerConfig {
        read_only: true,
        ..test_config()
    };
    let server = TestServer::start(config, vec![export]);
    let info = run_ok(
        Command::new("nbdinfo").arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    assert!(info.contains("is_read_only: true"), "{info}");
    assert!(info.contains("can_trim: false"), "{info}");
}

#[test]
fn nbdinfo_over_unix_socket() {
    if !require_tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let dir = TempDir::new("unix");
    let socket = dir.path().join("nbd.sock");
    let export = Arc::new(MemExport::new("vol", 4 * MIB));
    let config = lograid_nbd::ServerConfig {
        listen: vec![ListenAddr::Unix(socket.clone())],
        ..test_config()
    };
    let server = lograid_nbd::Server::bind(config, vec![export]).expect("bind");
    let handle = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve());
    let info = run_ok(
        Command::new("nbdinfo").arg(format!("nbd+unix:///vol?socket={}", socket.display())),
        TOOL_TIMEOUT,
    );
    assert!(info.contains("export-size: 4194304"), "{info}");
    handle.shutdown();
    thread.join().unwrap().expect("clean shutdown");
    assert!(!socket.exists(), "socket file left behind");
}

#[test]
fn nbdinfo_map_shows_holes_after_trim() {
    if !require_tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let (server, export) = TestServer::with_mem(8 * MIB);
    export.fill(0, &pattern(1, 8 * MIB as usize));
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    assert_eq!(
        client.call(0, NBD_CMD_TRIM, 2 * MIB, MIB as u32, &[]).error,
        0
    );
    assert_eq!(
        client
            .call(
                NBD_CMD_FLAG_NO_HOLE,
                NBD_CMD_WRITE_ZEROES,
                5 * MIB,
                MIB as u32,
                &[]
            )
            .error,
        0
    );
    client.disconnect();
    let map = run_ok(
        Command::new("nbdinfo")
            .arg("--map")
            .arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    let lines: Vec<Vec<&str>> = map
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    let expected = [
        ["0", "2097152", "0", "data"].as_slice(),
        &["2097152", "1048576", "3", "hole,zero"],
        &["3145728", "2097152", "0", "data"],
        &["5242880", "1048576", "2", "zero"],
        &["6291456", "2097152", "0", "data"],
    ];
    assert_eq!(lines.len(), expected.len(), "{map}");
    for (line, expected) in lines.iter().zip(expected) {
        assert_eq!(line.as_slice(), expected, "{map}");
    }
}

#[test]
fn qemu_img_info_and_convert_round_trip() {
    if !require_tool("qemu-img", "qemu-utils") {
        return;
    }
    let (server, export) = TestServer::with_mem(32 * MIB);
    let dir = TempDir::new("qemu-img");
    let source = dir.path().join("source.raw");
    let back = dir.path().join("back.raw");
    let mut data = pattern(7, 32 * MIB as usize);
    data[8 * MIB as usize..12 * MIB as usize].fill(0); // a zero run for qemu-img to skip
    std::fs::write(&source, &data).unwrap();

    let info = run_ok(
        Command::new("qemu-img")
            .arg("info")
            .arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    assert!(
        info.contains("virtual size: 32 MiB (33554432 bytes)"),
        "{info}"
    );

    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&source)
            .arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    assert!(
        export.contents(0, 32 * MIB) == data,
        "export differs from the source"
    );
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(server.uri("disk0"))
            .arg(&back),
        TOOL_TIMEOUT,
    );
    assert!(std::fs::read(&back).unwrap() == data, "copy back differs");
    let compare = run_tool(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&source)
            .arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    assert!(
        compare.status.success(),
        "{}",
        String::from_utf8_lossy(&compare.stdout)
    );
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn qemu_io_patterns_discard_zero_fua_flush() {
    if !require_tool("qemu-io", "qemu-utils") {
        return;
    }
    let (server, export) = TestServer::with_mem(16 * MIB);
    let commands = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -f -P 0xcd 1M 64k",
        "read -P 0xcd 1M 64k",
        "write -P 0x11 4M 2M",
        "discard 4M 1M",
        "write -z 5M 1M",
        "read -P 0 5M 1M",
        "write -z -u 8M 1M",
        "read -P 0 8M 1M",
        "flush",
        "aio_write -P 0x22 10M 512k",
        "aio_write -P 0x33 11M 512k",
        "aio_flush",
        "read -P 0x22 10M 512k",
        "read -P 0x33 11M 512k",
    ];
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for line in commands {
        command.arg("-c").arg(line);
    }
    command.arg(server.uri("disk0"));
    let output = run_ok(&mut command, TOOL_TIMEOUT);
    let lower = output.to_lowercase();
    assert!(
        !lower.contains("fail") && !lower.contains("error"),
        "{output}"
    );
    assert_eq!(output.matches("read ").count(), 6, "{output}");
    assert!(export.contents(0, MIB).iter().all(|&b| b == 0xab));
    assert!(export.contents(MIB, 65536).iter().all(|&b| b == 0xcd));
    assert!(export.contents(5 * MIB, MIB).iter().all(|&b| b == 0));
    assert!(
        export.fua_write_count() >= 1,
        "write -f did not arrive with FUA"
    );
    assert!(export.flush_count() >= 1, "flush did not arrive");
    assert_eq!(
        export.allocation_at(4 * MIB),
        Allocation::Hole,
        "discard did not trim"
    );
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn nbdcopy_into_and_out_of_the_export() {
    if !require_tool("nbdcopy", "libnbd-bin") {
        return;
    }
    let size = 64 * MIB;
    let (server, export) = TestServer::with_mem(size);
    let dir = TempDir::new("nbdcopy");
    let source = dir.path().join("source.raw");
    let back = dir.path().join("back.raw");
    let mut data = pattern(11, size as usize);
    data[16 * MIB as usize..40 * MIB as usize].fill(0);
    std::fs::write(&source, &data).unwrap();

    let started = Instant::now();
    run_ok(
        Command::new("nbdcopy")
            .arg(&source)
            .arg(server.uri("disk0")),
        TOOL_TIMEOUT,
    );
    let write_secs = started.elapsed().as_secs_f64();
    assert!(
        export.contents(0, size) == data,
        "export differs from the source"
    );
    let started = Instant::now();
    run_ok(
        Command::new("nbdcopy").arg(server.uri("disk0")).arg(&back),
        TOOL_TIMEOUT,
    );
    let read_secs = started.elapsed().as_secs_f64();
    assert!(std::fs::read(&back).unwrap() == data, "copy back differs");
    eprintln!(
        "nbdcopy 64 MiB: into export {:.0} MiB/s, out of export {:.0} MiB/s",
        64.0 / write_secs,
        64.0 / read_secs
    );
    // The zero run was not sent as data (nbdcopy zeroes or trims it).
    assert_ne!(export.allocation_at(20 * MIB), Allocation::Data);
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn fio_nbd_engine_random_writes_verify_crc32c() {
    if !require_tool("fio", "fio") {
        return;
    }
    let (server, export) = TestServer::with_mem(64 * MIB);
    let dir = TempDir::new("fio");
    let output = run_ok(
        Command::new("fio")
            .current_dir(dir.path())
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bsrange=4k-64k",
                "--iodepth=16",
                "--size=32M",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--randrepeat=1",
                "--output-format=terse",
            ])
            .arg(format!("--uri={}", server.uri("disk0"))),
        TOOL_TIMEOUT,
    );
    assert!(!output.to_lowercase().contains("verify:"), "{output}");
    assert!(export.write_count() > 0 && export.read_count() > 0);
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn two_qemu_io_connections_with_flushes() {
    if !require_tool("qemu-io", "qemu-utils") {
        return;
    }
    let (server, export) = TestServer::with_mem(16 * MIB);
    let spawn = |pattern: &'static str, base_mib: u64| {
        let mut command = Command::new("qemu-io");
        command.args(["-f", "raw"]);
        for round in 0..8 {
            command
                .arg("-c")
                .arg(format!("write -P {pattern} {}M 1M", base_mib + round));
            command.arg("-c").arg("flush");
        }
        command.arg(server.uri("disk0"));
        std::thread::spawn(move || run_ok(&mut command, TOOL_TIMEOUT))
    };
    let first = spawn("0x5a", 0);
    let second = spawn("0xa5", 8);
    let first = first.join().expect("first client");
    let second = second.join().expect("second client");
    for output in [&first, &second] {
        assert!(!output.to_lowercase().contains("fail"), "{output}");
    }
    assert!(export.contents(0, 8 * MIB).iter().all(|&b| b == 0x5a));
    assert!(export.contents(8 * MIB, 8 * MIB).iter().all(|&b| b == 0xa5));
    assert!(export.flush_count() >= 16);
    assert_eq!(export.unflushed_writes(), 0);
    assert_eq!(server.stats.snapshot().connections_accepted, 2);
}

/// nbdsh (libnbd's Python shell, Debian package python3-libnbd) running `script`.
fn nbdsh(script: &str) -> Command {
    let mut command = Command::new("nbdsh");
    // nbdsh runs `python3 -m nbd`: put the system python3 (the one python3-libnbd installs
    // into) ahead of any other on PATH (a pyenv shim, say).
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("/usr/bin:{path}"));
    command.arg("-c").arg(script);
    command
}

/// An export of `size` bytes holding `i % 251` at byte `i` (easy to rebuild in Python).
fn mod_251_export(size: u64) -> Arc<MemExport> {
    let export = Arc::new(MemExport::new("disk0", size));
    let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    export.fill(0, &bytes);
    export
}

/// Python: `model` (the export's bytes as `mod_251_export` made them) and `check(h, off, n)`.
const PY_MODEL: &str = r#"
import nbd, os
size = SIZE
model = bytearray((bytes(range(251)) * (size // 251 + 1))[:size])
def check(h, off, n):
    got = h.pread(n, off)
    assert got == model[off:off + n], f"pread {off}+{n} differs from what was written"
def write(h, off, data):
    h.pwrite(data, off)
    model[off:off + len(data)] = data
"#;

/// libnbd told not to ask for block sizes (`set_request_block_size(False)`): it learns the
/// defaults (1 / 4096 / 64 MiB), and unaligned reads, writes, zeroes, trims and block status,
/// and requests beyond 32 MiB, all work, with simple and with structured replies.
#[test]
fn nbdsh_without_block_sizes_unaligned_and_large_requests() {
    if !require_tool("nbdsh", "python3-libnbd") {
        return;
    }
    let size = 72 * MIB;
    let export = mod_251_export(size);
    let server = TestServer::start(test_config(), vec![export.clone()]);
    let script = PY_MODEL.replace("SIZE", &size.to_string())
        + &r#"
for structured in (True, False):
    h = nbd.NBD()
    h.set_request_block_size(False)
    h.set_request_structured_replies(structured)
    if structured:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri("URI")
    assert h.get_structured_replies_negotiated() == structured
    assert h.get_block_size(nbd.SIZE_MINIMUM) == 1, h.get_block_size(nbd.SIZE_MINIMUM)
    assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 64 << 20, h.get_block_size(nbd.SIZE_MAXIMUM)
    for off, n in [(1, 1), (100, 300), (511, 2), (4000, 5000), (70001, 200003), (size - 3, 3)]:
        write(h, off, os.urandom(n))
    for off, n in [(0, 1), (99, 302), (510, 4), (3999, 5002), (70000, 200005), (size - 7, 7)]:
        check(h, off, n)
    # Beyond the 32 MiB a client that asks is held to, and unaligned.
    write(h, 12345, os.urandom((40 << 20) + 1))
    check(h, 3, 48 << 20)
    check(h, 0, 64 << 20)
    h.zero(20, 1000)
    model[1000:1020] = bytes(20)
    check(h, 0, 8192)
    # Only the whole sectors inside [10000, 60001) are trimmed (MemExport: they read as zero).
    h.trim(50001, 10000)
    model[10240:59904] = bytes(59904 - 10240)
    check(h, 9000, 52000)
    if structured:
        seen = []
        def extents(context, offset, entries, err):
            seen.extend(entries)
        # [59000, 61000): trimmed up to the last whole sector, 59904; data (untouched) after.
        h.block_status(2000, 59000, extents)
        assert seen == [904, 3, 1096, 0], seen
    h.flush()
    h.shutdown()
print("ok")
"#
        .replace("URI", &server.uri("disk0"));
    let output = run_ok(&mut nbdsh(&script), TOOL_TIMEOUT);
    assert_eq!(output.trim(), "ok");
    assert_eq!(export.contract_violations(), 0);
}

/// libnbd without fixed newstyle (`set_handshake_flags(0)`) can only use
/// `NBD_OPT_EXPORT_NAME`, which cannot ask for block sizes: unaligned I/O works.
#[test]
fn nbdsh_export_name_unaligned_io() {
    if !require_tool("nbdsh", "python3-libnbd") {
        return;
    }
    let size = 4 * MIB;
    let export = mod_251_export(size);
    let server = TestServer::start(test_config(), vec![export.clone()]);
    let script = PY_MODEL.replace("SIZE", &size.to_string())
        + &r#"
h = nbd.NBD()
h.set_handshake_flags(0)
h.connect_uri("URI")
assert h.get_protocol() == "newstyle", h.get_protocol()
assert h.get_block_size(nbd.SIZE_MINIMUM) == 0  # nothing learnt: EXPORT_NAME has no info
for off, n in [(1, 1), (100, 300), (511, 2), (4000, 5000), (70001, 200003), (size - 3, 3)]:
    write(h, off, os.urandom(n))
for off, n in [(0, 1), (99, 302), (510, 4), (3999, 5002), (70000, 200005), (size - 7, 7)]:
    check(h, off, n)
h.zero(7, 513)
model[513:520] = bytes(7)
check(h, 0, 4096)
h.shutdown()
print("ok")
"#
        .replace("URI", &server.uri("disk0"));
    let output = run_ok(&mut nbdsh(&script), TOOL_TIMEOUT);
    assert_eq!(output.trim(), "ok");
    assert_eq!(export.contract_violations(), 0);
}

/// Two libnbd connections that did not ask for block sizes write alternate single bytes of the
/// same two sectors, every write in flight at once (asynchronous). Each is a read-modify-write,
/// whose write-back is slowed (MemExport sleeps before storing), so that unserialised ones
/// would store stale copies of each other's bytes; none may be lost.
#[test]
fn nbdsh_concurrent_unaligned_writes_to_one_sector_lose_no_bytes() {
    if !require_tool("nbdsh", "python3-libnbd") {
        return;
    }
    const BYTES: u64 = 1024;
    let export = Arc::new(MemExport::new("disk0", MIB));
    export.inject_delay(
        lograid_nbd::mem_export::FaultOp::Write,
        0..BYTES,
        Duration::from_millis(1),
    );
    let server = TestServer::start(test_config(), vec![export.clone()]);
    let writers: Vec<_> = (0..2)
        .map(|parity| {
            let script = r#"
import nbd
h = nbd.NBD()
h.set_request_block_size(False)
h.connect_uri("URI")
cookies = [h.aio_pwrite(bytes([0x80 | (b % 127)]), b) for b in range(PARITY, BYTES, 2)]
while h.aio_in_flight() > 0:
    h.poll(-1)
for cookie in cookies:
    assert h.aio_command_completed(cookie)
h.shutdown()
print("ok")
"#
            .replace("URI", &server.uri("disk0"))
            .replace("PARITY", &parity.to_string())
            .replace("BYTES", &BYTES.to_string());
            let child = nbdsh(&script)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("nbdsh");
            ChildGuard(Some(child))
        })
        .collect();
    let deadline = Instant::now() + TOOL_TIMEOUT;
    for mut writer in writers {
        let child = writer.0.as_mut().unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "nbdsh writer did not finish");
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = writer.0.take().unwrap().wait_with_output().unwrap();
        assert!(
            status.success(),
            "nbdsh writer failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let contents = export.contents(0, BYTES);
    let lost: Vec<u64> = (0..BYTES)
        .filter(|b| contents[*b as usize] != 0x80 | (b % 127) as u8)
        .collect();
    assert!(lost.is_empty(), "bytes lost at {lost:?}");
    assert_eq!(export.contract_violations(), 0);
}

/// Throughput against MemExport, for information (run with `--ignored --nocapture`).
#[test]
#[ignore]
fn fio_throughput_report() {
    if !require_tool("fio", "fio") {
        return;
    }
    let (server, export) = TestServer::with_mem(1024 * MIB);
    export.fill(0, &vec![1u8; 1024 * MIB as usize]);
    let dir = TempDir::new("fio-bench");
    for (name, args) in [
        (
            "4k randrw qd32",
            vec!["--rw=randrw", "--bs=4k", "--iodepth=32"],
        ),
        (
            "4k randread qd32",
            vec!["--rw=randread", "--bs=4k", "--iodepth=32"],
        ),
        (
            "128k seq write qd8",
            vec!["--rw=write", "--bs=128k", "--iodepth=8"],
        ),
        (
            "128k seq read qd8",
            vec!["--rw=read", "--bs=128k", "--iodepth=8"],
        ),
    ] {
        let output = run_ok(
            Command::new("fio")
                .current_dir(dir.path())
                .args([
                    "--name=bench",
                    "--ioengine=nbd",
                    "--size=1G",
                    "--time_based",
                    "--runtime=5",
                ])
                .args(&args)
                .arg(format!("--uri={}", server.uri("disk0"))),
            Duration::from_secs(120),
        );
        for line in output.lines().filter(|line| line.contains("IOPS=")) {
            eprintln!("{name}: {}", line.trim());
        }
    }
    let _ = export.size_bytes();
}
