//! The server over TCP with in-memory volumes (`MemExport`): many calls in flight within the
//! buffer budgets, the durability mapping as the volume sees it (UNSTABLE writes unflushed
//! until COMMIT, FILE_SYNC as FUA, a flush of everything at shutdown), and the volume's
//! errors as NFS status codes (NOSPC, IO).

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use lograid_nbd::mem_export::{FaultOp, MemExport};
use lograid_nfs::fuzzing::{call_record, framed};
use lograid_nfs::handle::{encode, Node};
use lograid_nfs::xdr::XdrWriter;
use lograid_nfs::{Namespace, NfsConfig, NfsServer, NfsVolume, ShutdownHandle, StatsHandle};

const POOL: u128 = 42;
const MIB: usize = 1 << 20;

struct Running {
    addr: SocketAddr,
    shutdown: ShutdownHandle,
    stats: StatsHandle,
    thread: std::thread::JoinHandle<Result<(), lograid_nfs::NfsError>>,
}

fn start(export: Arc<MemExport>, config: NfsConfig) -> Running {
    let volumes = vec![NfsVolume {
        export,
        volume_id: 3,
    }];
    let namespace = Namespace::new(POOL, volumes, false, None).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = NfsServer::new(listener, config, namespace).unwrap();
    Running {
        addr: server.local_addr(),
        shutdown: server.shutdown_handle(),
        stats: server.stats_handle(),
        thread: std::thread::spawn(move || server.serve()),
    }
}

fn write_call(xid: u32, offset: u64, data: &[u8], stable: u32) -> Vec<u8> {
    let mut args = Vec::new();
    args.put_opaque(&encode(POOL, Node::Volume(3)));
    args.put_u64(offset);
    args.put_u32(data.len() as u32);
    args.put_u32(stable);
    args.put_opaque(data);
    framed(&call_record(xid, 100_003, 3, 7, &args))
}

fn commit_call(xid: u32) -> Vec<u8> {
    let mut args = Vec::new();
    args.put_opaque(&encode(POOL, Node::Volume(3)));
    args.put_u64(0);
    args.put_u32(0);
    framed(&call_record(xid, 100_003, 3, 21, &args))
}

/// Reads one reply: (xid, NFS status).
fn read_reply(stream: &mut TcpStream) -> (u32, u32) {
    let mut mark = [0u8; 4];
    stream.read_exact(&mut mark).unwrap();
    let length = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    let word = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    assert_eq!(word(20), 0, "accepted with SUCCESS");
    (word(0), word(24))
}

fn connect(running: &Running) -> TcpStream {
    let stream = TcpStream::connect(running.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
}

#[test]
fn many_calls_in_flight_stay_within_the_budgets() {
    let export = Arc::new(MemExport::new("vol0", 256 << 20));
    export.set_delay(Duration::from_millis(2));
    let config = NfsConfig {
        max_in_flight_bytes_per_conn: 4 << 20,
        max_total_in_flight_bytes: 8 << 20,
        ..NfsConfig::default()
    };
    let running = start(export.clone(), config);
    let mut stream = connect(&running);
    let mut sender = stream.try_clone().unwrap();
    // 200 calls of 1 MiB sent at once, from another thread: the server must stop reading
    // rather than hold them all.
    let writer = std::thread::spawn(move || {
        let data = vec![0x5a; MIB];
        for xid in 0..200u32 {
            sender
                .write_all(&write_call(xid, u64::from(xid) * MIB as u64, &data, 0))
                .unwrap();
        }
    });
    let mut seen = [false; 200];
    for _ in 0..200 {
        let (xid, status) = read_reply(&mut stream);
        assert_eq!(status, 0);
        seen[xid as usize] = true;
    }
    writer.join().unwrap();
    assert!(seen.iter().all(|&s| s));
    let stats = running.stats.snapshot();
    assert!(stats.peak_in_flight_bytes <= 4 << 20, "{stats:?}");
    assert!(stats.peak_in_flight_bytes >= MIB as u64, "{stats:?}");
    assert_eq!(stats.writes, 200);
    // UNSTABLE: written, not flushed; COMMIT flushes.
    assert!(export.unflushed_writes() > 0);
    stream.write_all(&commit_call(1000)).unwrap();
    assert_eq!(read_reply(&mut stream), (1000, 0));
    assert_eq!(export.unflushed_writes(), 0);
    assert_eq!(export.contents(199 * MIB as u64, 4), vec![0x5a; 4]);
    // FILE_SYNC: a write with FUA.
    stream
        .write_all(&write_call(1001, 0, &[1; 4096], 2))
        .unwrap();
    assert_eq!(read_reply(&mut stream), (1001, 0));
    assert_eq!(export.fua_write_count(), 1);
    assert_eq!(export.contract_violations(), 0);
    running.shutdown.shutdown();
    running.thread.join().unwrap().unwrap();
}

#[test]
fn volume_errors_are_nfs_status_codes_and_shutdown_flushes() {
    let export = Arc::new(MemExport::new("vol0", 16 << 20));
    let running = start(export.clone(), NfsConfig::default());
    let mut stream = connect(&running);
    export.inject_fault(FaultOp::Write, 0..4096, 28); // ENOSPC
    stream.write_all(&write_call(1, 0, &[7; 4096], 0)).unwrap();
    assert_eq!(read_reply(&mut stream), (1, 28), "NFS3ERR_NOSPC");
    export.clear_faults();
    export.inject_fault(FaultOp::Flush, 0..u64::MAX, 5); // EIO
    stream.write_all(&commit_call(2)).unwrap();
    assert_eq!(read_reply(&mut stream), (2, 5), "NFS3ERR_IO");
    export.clear_faults();
    stream
        .write_all(&write_call(3, 8192, &[9; 100], 0))
        .unwrap();
    assert_eq!(read_reply(&mut stream), (3, 0));
    assert!(export.unflushed_writes() > 0);
    let flushes = export.flush_count();
    running.shutdown.shutdown();
    running.thread.join().unwrap().unwrap();
    assert!(export.flush_count() > flushes, "no flush at shutdown");
    assert_eq!(export.unflushed_writes(), 0);
    assert_eq!(export.contents(8192, 100), vec![9; 100]);
    assert_eq!(export.contract_violations(), 0);
}

/// Sets SO_LINGER to 0, so that closing `stream` resets the connection (as libnfs does).
fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt with a linger struct we own, on a socket we own.
    let result = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(result, 0);
}

#[test]
fn a_client_that_resets_between_calls_has_gone_and_broke_nothing() {
    let export = Arc::new(MemExport::new("vol0", 16 << 20));
    let running = start(export, NfsConfig::default());
    let wait_closed = |accepted: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stats = running.stats.snapshot();
            if stats.connections_accepted == accepted && stats.connections_active == 0 {
                return stats;
            }
            assert!(std::time::Instant::now() < deadline, "{stats:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Reset after a call was answered: a client going away.
    let mut stream = connect(&running);
    stream.write_all(&commit_call(1)).unwrap();
    assert_eq!(read_reply(&mut stream), (1, 0));
    reset_on_close(&stream);
    drop(stream);
    assert_eq!(wait_closed(1).protocol_errors, 0);
    // Reset halfway through a record: a broken call.
    let mut stream = connect(&running);
    stream.write_all(&commit_call(2)[..10]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    reset_on_close(&stream);
    drop(stream);
    assert_eq!(wait_closed(2).protocol_errors, 1);
    running.shutdown.shutdown();
    running.thread.join().unwrap().unwrap();
}

#[test]
fn at_shutdown_connected_clients_are_served_until_they_go_within_the_drain() {
    let export = Arc::new(MemExport::new("vol0", 16 << 20));
    let config = NfsConfig {
        drain: Duration::from_secs(60),
        ..NfsConfig::default()
    };
    let running = start(export.clone(), config);
    let mut stream = connect(&running);
    stream.write_all(&write_call(1, 0, &[3; 4096], 0)).unwrap();
    assert_eq!(read_reply(&mut stream), (1, 0));
    let started = std::time::Instant::now();
    running.shutdown.shutdown();
    // New clients are refused at once...
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(running.addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "still accepting");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ... the connected one is served on (a write and the COMMIT a detach sends)...
    stream
        .write_all(&write_call(2, 4096, &[4; 4096], 0))
        .unwrap();
    assert_eq!(read_reply(&mut stream), (2, 0));
    stream.write_all(&commit_call(3)).unwrap();
    assert_eq!(read_reply(&mut stream), (3, 0));
    assert_eq!(export.unflushed_writes(), 0);
    // ... and once it goes, the server ends without waiting out the drain.
    drop(stream);
    running.thread.join().unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(export.contents(4096, 4), vec![4; 4]);
}

#[test]
fn a_client_that_stays_is_closed_when_the_drain_is_over() {
    let export = Arc::new(MemExport::new("vol0", 16 << 20));
    let config = NfsConfig {
        drain: Duration::from_millis(500),
        ..NfsConfig::default()
    };
    let running = start(export, config);
    let mut stream = connect(&running);
    stream.write_all(&commit_call(1)).unwrap();
    assert_eq!(read_reply(&mut stream), (1, 0));
    let started = std::time::Instant::now();
    running.shutdown.shutdown();
    running.thread.join().unwrap().unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(20),
        "{took:?}"
    );
    // The server closed it.
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).unwrap_or(0), 0);
}
