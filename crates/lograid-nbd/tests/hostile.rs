//! Hostile and broken clients with raw sockets. Each test asserts a concrete outcome (an error
//! value or a closed connection), that a well-behaved client still works afterwards, and that
//! data outside the requests' ranges is untouched.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lograid_nbd::mem_export::MemExport;
use lograid_nbd::proto::*;
use lograid_nbd::ServerConfig;

const SIZE: u64 = 8 * MIB;
const SENTINEL_AT: u64 = 4 * MIB;
const SCRATCH_AT: u64 = 6 * MIB;

/// A server with one 8 MiB export whose [4 MiB, 5 MiB) holds a known pattern.
fn setup(config: ServerConfig) -> (TestServer, Arc<MemExport>, Vec<u8>) {
    let export = Arc::new(MemExport::new("disk0", SIZE));
    let sentinel = pattern(0x5e, MIB as usize);
    export.fill(SENTINEL_AT, &sentinel);
    let server = TestServer::start(config, vec![export.clone()]);
    (server, export, sentinel)
}

fn healthy(server: &TestServer, export: &MemExport, sentinel: &[u8]) {
    assert_healthy(server.addr, "disk0", SCRATCH_AT, SENTINEL_AT, sentinel);
    assert_eq!(
        export.contract_violations(),
        0,
        "a bad request reached the export"
    );
}

#[test]
fn bad_client_flags_and_bad_option_magic_close_the_connection() {
    let (server, export, sentinel) = setup(test_config());
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(0x8000_0000);
    assert!(client.wait_closed(Duration::from_secs(5)));

    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    let mut bogus = b"IHAVEOPX".to_vec();
    bogus.extend_from_slice(&NBD_OPT_LIST.to_be_bytes());
    bogus.extend_from_slice(&0u32.to_be_bytes());
    client.send(&bogus);
    assert!(client.wait_closed(Duration::from_secs(5)));
    healthy(&server, &export, &sentinel);
    assert!(server.stats.snapshot().handshake_failures >= 2);
}

#[test]
fn unknown_and_malformed_options_are_answered_and_haggling_continues() {
    let (server, export, sentinel) = setup(test_config());
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    for code in [0u32, 4, 12, 0x7fff_ffff, u32::MAX] {
        client.send_option(code, &[1, 2, 3]);
        let reply = client.read_option_reply();
        assert_eq!((reply.option, reply.reply_type), (code, NBD_REP_ERR_UNSUP));
    }
    // GO whose name length points past the option data.
    let mut data = RawClient::info_data("disk0", &[]);
    data[3] = 200;
    client.send_option(NBD_OPT_GO, &data);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    // INFO whose request count does not match.
    let mut data = RawClient::info_data("disk0", &[NBD_INFO_NAME]);
    data.pop();
    client.send_option(NBD_OPT_INFO, &data);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    // Export name with invalid UTF-8 and with NUL.
    client.send_option(NBD_OPT_INFO, &[0, 0, 0, 2, 0xff, 0xfe, 0, 0]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    client.send_option(NBD_OPT_INFO, &[0, 0, 0, 2, b'a', 0, 0, 0]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    // Meta-context query whose length overflows, after structured replies.
    client.send_option(NBD_OPT_STRUCTURED_REPLY, &[]);
    client.read_option_reply();
    let mut data = RawClient::meta_data("disk0", &[BASE_ALLOCATION]);
    let query_len_at = 4 + 5 + 4;
    data[query_len_at..query_len_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    client.send_option(NBD_OPT_LIST_META_CONTEXT, &data);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_INVALID);
    // A 100 KiB option: too big, read and discarded; haggling goes on.
    client.send_option(NBD_OPT_LIST, &vec![0u8; 100 * 1024]);
    assert_eq!(client.read_option_reply().reply_type, NBD_REP_ERR_TOO_BIG);
    client.send_option(NBD_OPT_GO, &RawClient::info_data("disk0", &[]));
    assert_eq!(
        client.read_option_replies().last().unwrap().reply_type,
        NBD_REP_ACK
    );
    client.structured = true;
    assert_eq!(client.read(SENTINEL_AT, 4096).data, sentinel[..4096]);
    client.disconnect();
    healthy(&server, &export, &sentinel);
}

#[test]
fn option_with_4_gib_length_gets_too_big_then_close() {
    let (server, export, sentinel) = setup(test_config());
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    client.send(&header);
    client.send(&[0u8; 4096]);
    let reply = client.read_option_reply();
    assert_eq!(reply.reply_type, NBD_REP_ERR_TOO_BIG);
    assert!(client.wait_closed(Duration::from_secs(5)));
    // The same for NBD_OPT_EXPORT_NAME, which cannot be answered: just closed.
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&NBD_OPT_EXPORT_NAME.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    client.send(&header);
    assert!(client.wait_closed(Duration::from_secs(5)));
    healthy(&server, &export, &sentinel);
}

#[test]
fn too_many_options_end_the_handshake() {
    let (server, export, sentinel) = setup(test_config());
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    let mut closed = false;
    for _ in 0..1100 {
        let mut option = IHAVEOPT.to_be_bytes().to_vec();
        option.extend_from_slice(&NBD_OPT_STRUCTURED_REPLY.to_be_bytes());
        option.extend_from_slice(&0u32.to_be_bytes());
        let mut header = [0u8; 20];
        if client.stream.write_all(&option).is_err()
            || client.stream.read_exact(&mut header).is_err()
        {
            closed = true;
            break;
        }
    }
    assert!(closed || client.wait_closed(Duration::from_secs(5)));
    healthy(&server, &export, &sentinel);
}

#[test]
fn truncated_frames_then_close() {
    let (server, export, sentinel) = setup(test_config());
    // Half an option header.
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    client.send(&IHAVEOPT.to_be_bytes()[..6]);
    drop(client);
    // Option header announcing data that never comes.
    let mut client = RawClient::connect(server.addr);
    client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    header.extend_from_slice(&1000u32.to_be_bytes());
    client.send(&header);
    client.send(&[0u8; 10]);
    drop(client);
    // Half a request header.
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    client.send(&RawClient::request_bytes(0, NBD_CMD_READ, 1, 0, 4096)[..13]);
    drop(client);
    // A WRITE over the sentinel whose payload stops half way.
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    client.send(&RawClient::request_bytes(
        0,
        NBD_CMD_WRITE,
        1,
        SENTINEL_AT,
        MIB as u32,
    ));
    client.send(&vec![0xee; 300 * 1024]);
    drop(client);
    healthy(&server, &export, &sentinel);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats.snapshot().connections_active > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        server.stats.snapshot().connections_active,
        0,
        "a broken connection lingers"
    );
    assert_eq!(server.stats.snapshot().in_flight_bytes, 0);
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let (server, export, sentinel) = setup(test_config());
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    let mut request = RawClient::request_bytes(0, NBD_CMD_WRITE, 1, SENTINEL_AT, 4096);
    request[0] ^= 0xff;
    client.send(&request);
    client.send(&[0u8; 4096]);
    assert!(client.wait_closed(Duration::from_secs(5)));
    healthy(&server, &export, &sentinel);
    assert!(server.stats.snapshot().protocol_errors >= 1);
}

#[test]
fn invalid_requests_get_errors_and_leave_data_alone() {
    let (server, export, sentinel) = setup(test_config());
    for structured in [false, true] {
        let (mut client, _) = RawClient::open(server.addr, "disk0", structured, false);
        let junk = vec![0xeeu8; 4096];
        refuses_unknown_commands_and_flags(&mut client, structured, &junk);
        refuses_ranges_past_the_end(&mut client, &junk);
        refuses_misaligned_ranges(&mut client, &junk);
        // Flush with a range.
        assert_eq!(client.call(0, NBD_CMD_FLUSH, 0, 512, &[]).error, NBD_EINVAL);
        // The stream is still in step.
        assert_eq!(client.read(SENTINEL_AT, 4096).data, sentinel[..4096]);
        client.disconnect();
    }
    healthy(&server, &export, &sentinel);
    assert!(export.contents(SENTINEL_AT, MIB) == sentinel);
}

/// Unknown command and unknown flags (and, without structured replies, DF and block status).
fn refuses_unknown_commands_and_flags(client: &mut RawClient, structured: bool, junk: &[u8]) {
    // Unknown command and unknown flags.
    assert_eq!(client.call(0, 9, 0, 0, &[]).error, NBD_EINVAL);
    assert_eq!(
        client.call(0, 0xffff, SENTINEL_AT, 4096, &[]).error,
        NBD_EINVAL
    );
    assert_eq!(
        client.call(1 << 9, NBD_CMD_READ, 0, 4096, &[]).error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE, SENTINEL_AT, 4096, junk)
            .error,
        NBD_EINVAL
    );
    if !structured {
        assert_eq!(
            client
                .call(NBD_CMD_FLAG_DF, NBD_CMD_READ, 0, 4096, &[])
                .error,
            NBD_EINVAL
        );
        assert_eq!(
            client.call(0, NBD_CMD_BLOCK_STATUS, 0, 4096, &[]).error,
            NBD_EINVAL
        );
    }
}

/// Ranges whose end overflows or lies past the end of the export.
fn refuses_ranges_past_the_end(client: &mut RawClient, junk: &[u8]) {
    // offset + length overflows u64.
    assert_eq!(
        client
            .call(0, NBD_CMD_READ, u64::MAX - 511, 4096, &[])
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_WRITE, u64::MAX - 511, 4096, junk)
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_TRIM, u64::MAX - 511, 4096, &[])
            .error,
        NBD_EINVAL
    );
    // Past the end.
    assert_eq!(
        client.call(0, NBD_CMD_READ, SIZE - 512, 1024, &[]).error,
        NBD_EINVAL
    );
    assert_eq!(client.call(0, NBD_CMD_READ, SIZE, 0, &[]).error, 0);
    assert_eq!(
        client.call(0, NBD_CMD_READ, SIZE + 512, 0, &[]).error,
        NBD_EINVAL
    );
    assert_eq!(
        client.call(0, NBD_CMD_WRITE, SIZE - 512, 4096, junk).error,
        NBD_ENOSPC
    );
    assert_eq!(
        client.call(0, NBD_CMD_TRIM, SIZE - 512, 4096, &[]).error,
        NBD_EINVAL
    );
    assert_eq!(
        client.call(0, NBD_CMD_WRITE_ZEROES, SIZE, 512, &[]).error,
        NBD_ENOSPC
    );
}

/// Offsets and lengths not multiples of 512.
fn refuses_misaligned_ranges(client: &mut RawClient, junk: &[u8]) {
    // Misaligned.
    assert_eq!(
        client
            .call(0, NBD_CMD_READ, SENTINEL_AT + 1, 4096, &[])
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_WRITE, SENTINEL_AT, 100, &junk[..100])
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_WRITE, SENTINEL_AT + 256, 512, &junk[..512])
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_TRIM, SENTINEL_AT + 512, 100, &[])
            .error,
        NBD_EINVAL
    );
    assert_eq!(
        client
            .call(0, NBD_CMD_WRITE_ZEROES, SENTINEL_AT + 100, 512, &[])
            .error,
        NBD_EINVAL
    );
}

#[test]
fn oversized_read_and_write() {
    let (server, export, sentinel) = setup(test_config());
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    let over = DEFAULT_MAX_PAYLOAD + 512;
    assert_eq!(client.call(0, NBD_CMD_READ, 0, over, &[]).error, NBD_EINVAL);
    // A WRITE a little over the limit: refused, payload drained, connection usable.
    let payload = vec![0xeeu8; over as usize];
    let reply = client.call(0, NBD_CMD_WRITE, 0, over, &payload);
    assert_eq!(reply.error, NBD_EINVAL);
    assert_eq!(client.read(SENTINEL_AT, 4096).data, sentinel[..4096]);
    // A WRITE announcing ~4 GiB: refused, then the server hangs up instead of reading it.
    let cookie = client.submit(0, NBD_CMD_WRITE, 0, u32::MAX - 511, &[]);
    client.send(&[0xee; 65536]);
    let reply = client.read_reply();
    assert_eq!((reply.cookie, reply.error), (cookie, NBD_EINVAL));
    assert!(client.wait_closed(Duration::from_secs(5)));
    healthy(&server, &export, &sentinel);
    assert!(export.contents(0, 4096).iter().all(|&b| b == 0));
}

#[test]
fn client_disappears_mid_request() {
    let (server, export, sentinel) = setup(test_config());
    export.inject_delay(
        lograid_nbd::mem_export::FaultOp::Read,
        0..MIB,
        Duration::from_millis(200),
    );
    // Requests in flight when the client vanishes: their replies are dropped quietly.
    let (mut client, _) = RawClient::open(server.addr, "disk0", true, false);
    for index in 0..8 {
        client.submit(0, NBD_CMD_READ, index * 65536, 65536, &[]);
    }
    client.submit(0, NBD_CMD_WRITE, SENTINEL_AT, 2 * MIB as u32, &[]);
    client.send(&vec![0xee; 512 * 1024]);
    drop(client);
    std::thread::sleep(Duration::from_millis(300));
    healthy(&server, &export, &sentinel);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats.snapshot().in_flight_requests > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = server.stats.snapshot();
    assert_eq!(
        (stats.in_flight_requests, stats.in_flight_bytes),
        (0, 0),
        "{stats:?}"
    );
}

#[test]
fn client_that_never_reads_replies_is_bounded_and_dropped() {
    let config = ServerConfig {
        reply_write_timeout: Duration::from_secs(1),
        max_in_flight_per_conn: 16,
        max_in_flight_bytes_per_conn: DEFAULT_MAX_PAYLOAD,
        ..test_config()
    };
    let limit = u64::from(config.max_in_flight_bytes_per_conn);
    let (server, export, sentinel) = setup(config);
    let (client, _) = RawClient::open(server.addr, "disk0", true, false);
    let mut sender = client.stream.try_clone().unwrap();
    // Up to a million reads of 1 MiB (1 TiB of replies, 28 MB of requests), never read.
    let flood = std::thread::spawn(move || {
        let mut sent = 0u64;
        'outer: for batch in 0..1000u64 {
            let mut requests = Vec::with_capacity(1000 * 28);
            for index in 0..1000u64 {
                let cookie = batch * 1000 + index;
                requests.extend_from_slice(&RawClient::request_bytes(
                    0,
                    NBD_CMD_READ,
                    cookie,
                    (cookie % 7) * MIB,
                    MIB as u32,
                ));
            }
            if sender.write_all(&requests).is_err() {
                break 'outer;
            }
            sent += 1000;
        }
        sent
    });
    let started = Instant::now();
    // Meanwhile another client works normally.
    std::thread::sleep(Duration::from_millis(300));
    healthy(&server, &export, &sentinel);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats.snapshot().stalled_writers == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = server.stats.snapshot();
    assert_eq!(
        stats.stalled_writers, 1,
        "the stalled client was not dropped: {stats:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    let sent = flood.join().unwrap();
    assert!(
        sent < 1_000_000,
        "the server kept reading requests from a client that reads no replies"
    );
    // Memory stayed within the connection's budget (plus the healthy client's small requests).
    assert!(
        stats.peak_in_flight_bytes <= limit + 2 * MIB,
        "peak {} over the limit {limit}",
        stats.peak_in_flight_bytes
    );
    let mut client = client;
    assert!(client.wait_closed(Duration::from_secs(10)));
    healthy(&server, &export, &sentinel);
}

#[test]
fn stalled_handshakes_time_out() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(800),
        ..test_config()
    };
    let (server, export, sentinel) = setup(config);
    // Connects and says nothing.
    let started = Instant::now();
    let mut silent = RawClient::connect(server.addr);
    // Sends flags and half an option, then stalls.
    let mut partial = RawClient::connect(server.addr);
    partial.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    partial.send(&IHAVEOPT.to_be_bytes());
    // Keeps haggling forever (one option every 100 ms).
    let mut chatty = RawClient::connect(server.addr);
    chatty.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE);
    let mut chatty_closed = false;
    for _ in 0..30 {
        let mut option = IHAVEOPT.to_be_bytes().to_vec();
        option.extend_from_slice(&NBD_OPT_LIST.to_be_bytes());
        option.extend_from_slice(&0u32.to_be_bytes());
        if chatty.stream.write_all(&option).is_err() {
            chatty_closed = true;
            break;
        }
        let mut header = [0u8; 20];
        if chatty.stream.read_exact(&mut header).is_err() {
            chatty_closed = true;
            break;
        }
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut data = vec![0u8; length as usize];
        if chatty.stream.read_exact(&mut data).is_err() {
            chatty_closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(chatty_closed || chatty.wait_closed(Duration::from_secs(3)));
    assert!(silent.wait_closed(Duration::from_secs(3)));
    assert!(partial.wait_closed(Duration::from_secs(3)));
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(700), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    healthy(&server, &export, &sentinel);
}

#[test]
fn garbage_storm_from_many_clients() {
    let (server, export, sentinel) = setup(test_config());
    let addr = server.addr;
    let workers: Vec<_> = (0..8u64)
        .map(|worker| {
            std::thread::spawn(move || {
                for round in 0..12u64 {
                    let Ok(mut stream) = TcpStream::connect(addr) else {
                        continue;
                    };
                    stream
                        .set_read_timeout(Some(Duration::from_millis(500)))
                        .unwrap();
                    let mut greeting = [0u8; 18];
                    let _ = stream.read_exact(&mut greeting);
                    let junk = pattern(worker * 100 + round, 200 + (round as usize * 997) % 5000);
                    // Sometimes a valid start, then garbage.
                    if round % 3 == 0 {
                        let _ = stream.write_all(
                            &(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes(),
                        );
                        let mut option = IHAVEOPT.to_be_bytes().to_vec();
                        option.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
                        option.extend_from_slice(
                            &RawClient::info_data("disk0", &[]).len().to_be_bytes()[4..],
                        );
                        option.extend_from_slice(&RawClient::info_data("disk0", &[]));
                        let _ = stream.write_all(&option);
                    }
                    let _ = stream.write_all(&junk);
                    let mut sink = [0u8; 4096];
                    let _ = stream.read(&mut sink);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    healthy(&server, &export, &sentinel);
    assert!(export.contents(SENTINEL_AT, MIB) == sentinel);
}
