//! Protocol conformance with a raw client: option haggling, simple and structured replies,
//! block status, error mapping, concurrency, multi-conn flush, read-only, limits, shutdown.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lograid_nbd::mem_export::{FaultOp, MemExport};
use lograid_nbd::proto::*;
use lograid_nbd::{Allocation, ServerConfig};

fn two_exports() -> (TestServer, Arc<MemExport>, Arc<MemExport>) {
    let first = Arc::new(MemExport::new("disk0", 8 * MIB).with_description("the first"));
    let second = Arc::new(MemExport::new("disk1", 4 * MIB));
    let server = TestServer::start(test_config(), vec![first.clone(), second.clone()]);
    (server, first, second)
}

#[test]
fn option_haggling() {
    let (server, _, _) = two_exports();
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    haggle_list(&mut client);
    haggle_info(&mut client);
    haggle_refusals(&mut client);
    haggle_meta_contexts(&mut client);

    // GO on the export the context was selected for: block status works.
    client.send_option(NBD_OPT_GO, &RawClient::info_data("disk1", &[]));
    let replies = client.read_option_replies();
    assert_eq!(replies.last().unwrap().reply_type, NBD_REP_ACK);
    let status = client.call(0, NBD_CMD_BLOCK_STATUS, 0, 4 * MIB as u32, &[]);
    assert_eq!(status.error, 0);
    assert_eq!(status.context_id, BASE_ALLOCATION_CONTEXT_ID);
    assert_eq!(
        status.extents,
        vec![(4 * MIB as u32, NBD_STATE_HOLE | NBD_STATE_ZERO)]
    );
    client.disconnect();
}

/// LIST: every export, with its description, then ACK.
fn haggle_list(client: &mut RawClient) {
    client.send_option(NBD_OPT_LIST, &[]);
    let replies = client.read_option_replies();
    assert_eq!(replies.len(), 3);
    assert_eq!(replies[0].reply_type, NBD_REP_SERVER);
    assert_eq!(&replies[0].data[4..], b"disk0the first");
    assert_eq!(&replies[1].data[4..], b"disk1");
    assert_eq!(replies[2].reply_type, NBD_REP_ACK);
    client.send_option(NBD_OPT_LIST, b"x");
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
}

/// INFO with name, description and block size.
fn haggle_info(client: &mut RawClient) {
    client.send_option(
        NBD_OPT_INFO,
        &RawClient::info_data(
            "",
            &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE],
        ),
    );
    let replies = client.read_option_replies();
    assert_eq!(replies.last().unwrap().reply_type, NBD_REP_ACK);
    let info = |kind: u16| {
        replies
            .iter()
            .find(|reply| {
                reply.reply_type == NBD_REP_INFO && reply.data[0..2] == kind.to_be_bytes()
            })
            .unwrap_or_else(|| panic!("no info {kind}"))
            .data[2..]
            .to_vec()
    };
    assert_eq!(&info(NBD_INFO_EXPORT)[0..8], &(8 * MIB).to_be_bytes());
    assert_eq!(info(NBD_INFO_NAME), b"disk0");
    assert_eq!(info(NBD_INFO_DESCRIPTION), b"the first");
    let block = info(NBD_INFO_BLOCK_SIZE);
    assert_eq!(&block[0..4], &512u32.to_be_bytes());
    assert_eq!(&block[4..8], &4096u32.to_be_bytes());
    assert_eq!(&block[8..12], &DEFAULT_MAX_PAYLOAD.to_be_bytes());
}

/// Unknown export, unknown option, TLS, malformed payloads.
fn haggle_refusals(client: &mut RawClient) {
    client.send_option(NBD_OPT_INFO, &RawClient::info_data("nope", &[]));
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_UNKNOWN);
    client.send_option(99, b"whatever");
    let reply = client.read_option_reply();
    assert_eq!((reply.option, reply.reply_type), (99, NBD_REP_ERR_UNSUP));
    client.send_option(NBD_OPT_STARTTLS, &[]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_UNSUP);
    client.send_option(NBD_OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_UNSUP);
    client.send_option(NBD_OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    client.send_option(
        NBD_OPT_SET_META_CONTEXT,
        &RawClient::meta_data("disk0", &[BASE_ALLOCATION]),
    );
    assert_eq!(
        client.read_option_reply().reply_type,
        NBD_REP_ERR_INVALID,
        "meta context before structured replies"
    );
}

/// Metadata contexts: listed, and selected for disk1 (structured replies first).
fn haggle_meta_contexts(client: &mut RawClient) {
    client.send_option(NBD_OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ACK);
    client.structured = true;
    for queries in [
        vec![],
        vec!["base:"],
        vec![BASE_ALLOCATION, "x-other:thing"],
    ] {
        client.send_option(
            NBD_OPT_LIST_META_CONTEXT,
            &RawClient::meta_data("disk1", &queries),
        );
        let replies = client.read_option_replies();
        assert_eq!(replies.len(), 2, "{queries:?}");
        assert_eq!(replies[0].reply_type, NBD_REP_META_CONTEXT);
        assert_eq!(&replies[0].data[4..], BASE_ALLOCATION.as_bytes());
    }
    client.send_option(
        NBD_OPT_LIST_META_CONTEXT,
        &RawClient::meta_data("disk1", &["qemu:dirty-bitmap:x"]),
    );
    assert_eq!(
        client.read_option_replies().len(),
        1,
        "unknown namespace selects nothing"
    );
    client.send_option(
        NBD_OPT_SET_META_CONTEXT,
        &RawClient::meta_data("nope", &[BASE_ALLOCATION]),
    );
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_UNKNOWN);
    client.send_option(
        NBD_OPT_SET_META_CONTEXT,
        &RawClient::meta_data("disk1", &[BASE_ALLOCATION]),
    );
    let replies = client.read_option_replies();
    assert_eq!(replies[0].reply_type, NBD_REP_META_CONTEXT);
    assert_eq!(
        &replies[0].data[0..4],
        &BASE_ALLOCATION_CONTEXT_ID.to_be_bytes()
    );
}

#[test]
fn block_status_needs_the_context_for_the_same_export() {
    let (server, _, _) = two_exports();
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    client.send_option(NBD_OPT_STRUCTURED_REPLY, &[]);
    client.read_option_reply();
    client.structured = true;
    client.send_option(
        NBD_OPT_SET_META_CONTEXT,
        &RawClient::meta_data("disk1", &[BASE_ALLOCATION]),
    );
    client.read_option_replies();
    client.send_option(NBD_OPT_GO, &RawClient::info_data("disk0", &[]));
    client.read_option_replies();
    let status = client.call(0, NBD_CMD_BLOCK_STATUS, 0, 4096, &[]);
    assert_eq!(status.error, NBD_EINVAL);
}

#[test]
fn export_name_with_and_without_zeroes() {
    let (server, first, _) = two_exports();
    for no_zeroes in [false, true] {
        let mut client = RawClient::connect(server.addr);
        client.send_client_flags(
            NBD_FLAG_C_FIXED_NEWSTYLE | if no_zeroes { NBD_FLAG_C_NO_ZEROES } else { 0 },
        );
        client.send_option(NBD_OPT_EXPORT_NAME, b"");
        let mut reply = vec![0u8; if no_zeroes { 10 } else { 134 }];
        client.stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[0..8], &(8 * MIB).to_be_bytes());
        let flags = u16::from_be_bytes([reply[8], reply[9]]);
        assert_eq!(flags & NBD_FLAG_SEND_DF, 0, "DF without structured replies");
        assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
        assert!(reply[10..].iter().all(|&b| b == 0));
        // Simple replies only.
        let data = pattern(3, 4096);
        assert_eq!(client.write(8192, &data).error, 0);
        let back = client.read(8192, 4096);
        assert!(!back.structured && back.data == data);
        client.disconnect();
    }
    assert_eq!(first.contents(8192, 4096), pattern(3, 4096));
    // EXPORT_NAME for an unknown export cannot be answered with an error: the server hangs up.
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    client.send_option(NBD_OPT_EXPORT_NAME, b"nope");
    assert!(client.wait_closed(Duration::from_secs(5)));
}

#[test]
fn abort_is_acknowledged() {
    let (server, _, _) = two_exports();
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    client.send_option(NBD_OPT_ABORT, &[]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ACK);
    assert!(client.wait_closed(Duration::from_secs(5)));
}

#[test]
fn structured_reads_holes_and_df() {
    let (server, export) = TestServer::with_mem(8 * MIB);
    let data = pattern(5, 64 * 1024);
    export.fill(MIB, &data);
    let (mut client, negotiated) = RawClient::open(server.addr, "disk0", true, true);
    assert_ne!(negotiated.flags & NBD_FLAG_SEND_DF, 0);

    // A sparse read: hole, data, hole.
    let reply = client.read(MIB - 256 * 1024, 1024 * 1024);
    assert_eq!(reply.error, 0);
    assert_eq!(
        reply.chunk_types,
        vec![
            NBD_REPLY_TYPE_OFFSET_HOLE,
            NBD_REPLY_TYPE_OFFSET_DATA,
            NBD_REPLY_TYPE_OFFSET_HOLE
        ]
    );
    assert!(reply.data[256 * 1024..256 * 1024 + data.len()] == data[..]);
    assert!(reply.data[..256 * 1024].iter().all(|&b| b == 0));

    // Don't fragment: exactly one data chunk.
    let reply = client.call(
        NBD_CMD_FLAG_DF,
        NBD_CMD_READ,
        MIB - 256 * 1024,
        1024 * 1024,
        &[],
    );
    assert_eq!(reply.error, 0);
    assert_eq!(reply.chunk_types, vec![NBD_REPLY_TYPE_OFFSET_DATA]);
    assert!(reply.data[256 * 1024..256 * 1024 + data.len()] == data[..]);

    // Small reads never look at holes.
    let reply = client.read(0, 4096);
    assert_eq!(reply.chunk_types, vec![NBD_REPLY_TYPE_OFFSET_DATA]);

    // Zero-length read: just a final NONE chunk.
    let reply = client.read(4096, 0);
    assert_eq!(
        (reply.error, reply.chunk_types.clone()),
        (0, vec![NBD_REPLY_TYPE_NONE])
    );
    client.disconnect();
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn block_status_reports_allocation() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    export.fill(0, &pattern(1, 8192));
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, true);
    assert_eq!(
        client
            .call(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 8192, 8192, &[])
            .error,
        0
    );
    let reply = client.call(0, NBD_CMD_BLOCK_STATUS, 0, 4 * MIB as u32, &[]);
    assert_eq!(
        reply.extents,
        vec![
            (8192, 0),
            (8192, NBD_STATE_ZERO),
            (4 * MIB as u32 - 16384, NBD_STATE_HOLE | NBD_STATE_ZERO)
        ]
    );
    let reply = client.call(
        NBD_CMD_FLAG_REQ_ONE,
        NBD_CMD_BLOCK_STATUS,
        0,
        4 * MIB as u32,
        &[],
    );
    assert_eq!(reply.extents, vec![(8192, 0)]);
    let reply = client.call(NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 4096, 512, &[]);
    assert_eq!(reply.extents, vec![(512, 0)]);
    let reply = client.call(0, NBD_CMD_BLOCK_STATUS, 4 * MIB - 4096, 8192, &[]);
    assert_eq!(reply.error, NBD_EINVAL, "block status past the end");
    client.disconnect();
}

#[test]
fn trim_zeroes_fua_cache() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    export.fill(0, &pattern(2, 4 * MIB as usize));
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    assert_eq!(
        client
            .call(NBD_CMD_FLAG_FUA, NBD_CMD_TRIM, 0, 65536, &[])
            .error,
        0
    );
    assert_eq!(export.allocation_at(0), Allocation::Hole);
    assert_eq!(
        client
            .call(
                NBD_CMD_FLAG_FAST_ZERO,
                NBD_CMD_WRITE_ZEROES,
                MIB,
                65536,
                &[]
            )
            .error,
        0
    );
    assert_eq!(export.allocation_at(MIB), Allocation::Hole);
    assert!(export.contents(MIB, 65536).iter().all(|&b| b == 0));
    assert_eq!(
        client
            .call(
                NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FUA,
                NBD_CMD_WRITE_ZEROES,
                2 * MIB,
                65536,
                &[]
            )
            .error,
        0
    );
    assert_eq!(export.allocation_at(2 * MIB), Allocation::Zero);
    let writes_before = export.fua_write_count();
    assert_eq!(
        client
            .call(NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 3 * MIB, 512, &[7u8; 512])
            .error,
        0
    );
    assert_eq!(export.fua_write_count(), writes_before + 1);
    assert_eq!(client.call(0, NBD_CMD_CACHE, 0, 65536, &[]).error, 0);
    // Zero-length trims and zeroes are accepted and do nothing.
    assert_eq!(client.call(0, NBD_CMD_TRIM, 4096, 0, &[]).error, 0);
    assert_eq!(client.call(0, NBD_CMD_WRITE_ZEROES, 4096, 0, &[]).error, 0);
    // FUA on a read is tolerated.
    assert_eq!(
        client
            .call(NBD_CMD_FLAG_FUA, NBD_CMD_READ, 0, 512, &[])
            .error,
        0
    );
    client.disconnect();
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn export_errors_are_mapped() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    export.inject_fault(FaultOp::Read, 0..4096, libc::EIO);
    export.inject_fault(FaultOp::Write, 65536..69632, libc::ENOSPC);
    export.inject_fault(FaultOp::Write, 131072..135168, libc::EFBIG);
    export.inject_fault(FaultOp::Trim, 0..4096, libc::EROFS);
    export.inject_fault(FaultOp::WriteZeroes, 0..4096, libc::EOPNOTSUPP);
    export.inject_fault(FaultOp::BlockStatus, 0..4096, libc::EIO);
    for structured in [false, true] {
        let (mut client, _) = RawClient::open(server.addr, "disk0", structured, structured);
        let reply = client.read(0, 8192);
        assert_eq!(reply.error, NBD_EIO);
        if structured {
            assert_eq!(reply.chunk_types, vec![NBD_REPLY_TYPE_ERROR]);
            assert!(!reply.message.is_empty());
        }
        assert_eq!(client.write(65536, &[1u8; 4096]).error, NBD_ENOSPC);
        assert_eq!(client.write(131072, &[1u8; 4096]).error, NBD_ENOSPC);
        assert_eq!(client.call(0, NBD_CMD_TRIM, 0, 4096, &[]).error, NBD_EPERM);
        assert_eq!(
            client
                .call(NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_WRITE_ZEROES, 0, 4096, &[])
                .error,
            NBD_ENOTSUP
        );
        assert_eq!(
            client.call(0, NBD_CMD_WRITE_ZEROES, 0, 4096, &[]).error,
            NBD_EINVAL
        );
        if structured {
            assert_eq!(
                client.call(0, NBD_CMD_BLOCK_STATUS, 0, 4096, &[]).error,
                NBD_EIO
            );
        }
        // The connection is still fine.
        assert_eq!(client.read(8192, 4096).error, 0);
        client.disconnect();
    }
    assert!(server.stats.snapshot().request_errors >= 10);
}

/// Reads the export does at once (`Export::try_read_now`: whole sectors, at most 128 KiB, not a
/// sparse read) are answered from the event loop with the bytes and replies of the blocking
/// path, simple and structured; the others, and reads made slow, take the blocking path.
#[test]
fn reads_done_at_once_reply_like_the_blocking_path() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    let data = pattern(5, 256 * 1024);
    for structured in [false, true] {
        // Without block sizes asked for, so that reads need not be whole sectors.
        let (mut client, _, _) =
            RawClient::open_without_block_sizes(server.addr, "disk0", structured, structured);
        assert_eq!(client.write(0, &data).error, 0);
        let (now_before, all_before) = (export.reads_now(), export.read_count());
        // At once: aligned 4 KiB, two blocks, whole sectors, 32 KiB.
        for (offset, length) in [(0u64, 4096u32), (12288, 8192), (512, 1024), (0, 32768)] {
            let reply = client.read(offset, length);
            assert_eq!(reply.error, 0);
            assert!(reply.data == data[offset as usize..][..length as usize]);
            if structured {
                assert_eq!(reply.chunk_types, vec![NBD_REPLY_TYPE_OFFSET_DATA]);
            }
        }
        assert_eq!(export.reads_now() - now_before, 4);
        // The blocking path: past 128 KiB, or not whole sectors.
        let long = client.read(0, 256 * 1024);
        assert!(long.error == 0 && long.data == data);
        let odd = client.read(100, 1000);
        assert!(odd.error == 0 && odd.data == data[100..1100]);
        assert_eq!(export.reads_now() - now_before, 4);
        assert!(export.read_count() - all_before >= 6);
        client.disconnect();
    }
    // A slow export's reads are left to the blocking pool, and still right.
    export.set_delay(Duration::from_millis(1));
    let before = export.reads_now();
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    let reply = client.read(4096, 4096);
    assert!(reply.error == 0 && reply.data == data[4096..8192]);
    assert_eq!(export.reads_now(), before);
    client.disconnect();
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn requests_run_concurrently_and_reply_out_of_order() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    export.inject_delay(FaultOp::Read, 0..4096, Duration::from_millis(400));
    export.inject_delay(FaultOp::Read, MIB..2 * MIB, Duration::from_millis(100));
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    let slow = client.submit(0, NBD_CMD_READ, 0, 4096, &[]);
    let started = Instant::now();
    let mut fast = Vec::new();
    for index in 0..16 {
        fast.push(client.submit(0, NBD_CMD_READ, MIB + index * 4096, 4096, &[]));
    }
    let mut order = Vec::new();
    for _ in 0..17 {
        let reply = client.read_reply();
        assert_eq!(reply.error, 0);
        order.push(reply.cookie);
    }
    let elapsed = started.elapsed();
    assert_eq!(
        *order.last().unwrap(),
        slow,
        "the slow read should be answered last: {order:?}"
    );
    // 16 reads of 100 ms each in far less than 1.6 s: they ran concurrently.
    assert!(elapsed < Duration::from_millis(1200), "{elapsed:?}");
    client.disconnect();
}

#[test]
fn flush_on_one_connection_covers_writes_of_another() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    let (mut writer, negotiated) = RawClient::open(server.addr, "disk0", true, false);
    assert_ne!(negotiated.flags & NBD_FLAG_CAN_MULTI_CONN, 0);
    let (mut flusher, _) = RawClient::open(server.addr, "disk0", false, false);
    let data = pattern(9, 65536);
    for round in 0..4u64 {
        assert_eq!(writer.write(round * 65536, &data).error, 0);
    }
    assert!(export.unflushed_writes() >= 4);
    let flushes = export.flush_count();
    assert_eq!(flusher.flush().error, 0);
    assert_eq!(export.flush_count(), flushes + 1);
    assert_eq!(
        export.unflushed_writes(),
        0,
        "flush on connection B left writes of A volatile"
    );
    let back = flusher.read(3 * 65536, 65536);
    assert!(back.data == data);
    writer.disconnect();
    flusher.disconnect();
}

#[test]
fn read_only_export_refuses_writes() {
    let export = Arc::new(MemExport::new("ro", 4 * MIB).with_read_only(true));
    export.fill(0, &[9u8; 4096]);
    let server = TestServer::start(test_config(), vec![export.clone()]);
    let (mut client, negotiated) = RawClient::open(server.addr, "ro", true, false);
    assert_ne!(negotiated.flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(negotiated.flags & NBD_FLAG_SEND_TRIM, 0);
    assert_eq!(client.write(0, &[1u8; 4096]).error, NBD_EPERM);
    assert_eq!(client.call(0, NBD_CMD_TRIM, 0, 4096, &[]).error, NBD_EPERM);
    assert_eq!(
        client.call(0, NBD_CMD_WRITE_ZEROES, 0, 4096, &[]).error,
        NBD_EPERM
    );
    assert_eq!(client.flush().error, 0);
    let back = client.read(0, 4096);
    assert!(back.data.iter().all(|&b| b == 9));
    client.disconnect();
    assert_eq!(export.write_count(), 0);
}

#[test]
fn shutdown_answers_in_flight_requests_and_flushes() {
    let (server, export) = TestServer::with_mem(4 * MIB);
    export.inject_delay(FaultOp::Write, 0..MIB, Duration::from_millis(300));
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    let data = pattern(4, 4096);
    let mut cookies = Vec::new();
    for index in 0..8 {
        cookies.push(client.submit(0, NBD_CMD_WRITE, index * 4096, 4096, &data));
    }
    std::thread::sleep(Duration::from_millis(100));
    let addr = server.addr;
    let started = Instant::now();
    let stopper = std::thread::spawn(move || server.stop());
    let mut answered = Vec::new();
    for _ in 0..8 {
        let reply = client.read_reply();
        assert_eq!(reply.error, 0, "in-flight write not completed at shutdown");
        answered.push(reply.cookie);
    }
    answered.sort_unstable();
    assert_eq!(answered, cookies);
    assert!(
        client.wait_closed(Duration::from_secs(5)),
        "connection not closed at shutdown"
    );
    stopper.join().unwrap().expect("clean shutdown");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(export.flush_count() >= 1, "exports not flushed at shutdown");
    assert_eq!(export.unflushed_writes(), 0);
    assert_eq!(export.contents(7 * 4096, 4096), data);
    // Nobody listens any more.
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn connection_limit_and_allow_list() {
    let export = Arc::new(MemExport::new("disk0", MIB));
    let config = ServerConfig {
        max_connections: 1,
        ..test_config()
    };
    let server = TestServer::start(config, vec![export.clone()]);
    let (first, _) = RawClient::open(server.addr, "disk0", false, false);
    let mut second = TcpStream::connect(server.addr).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 18];
    assert!(
        matches!(second.read(&mut buf), Ok(0) | Err(_)),
        "second connection over the limit was served"
    );
    first.disconnect();
    // The slot is free again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats.snapshot().connections_active > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (third, _) = RawClient::open(server.addr, "disk0", false, false);
    third.disconnect();
    assert_eq!(server.stats.snapshot().connections_refused, 1);
    drop(server);

    let config = ServerConfig {
        allow_list: Some(vec!["192.0.2.1".parse().unwrap()]),
        ..test_config()
    };
    let server = TestServer::start(config, vec![export.clone()]);
    let mut refused = TcpStream::connect(server.addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        matches!(refused.read(&mut buf), Ok(0) | Err(_)),
        "peer outside the allow-list was served"
    );
    drop(server);
    let config = ServerConfig {
        allow_list: Some(vec!["127.0.0.1".parse().unwrap()]),
        ..test_config()
    };
    let server = TestServer::start(config, vec![export]);
    let (allowed, _) = RawClient::open(server.addr, "disk0", false, false);
    allowed.disconnect();
}
