//! Size constraints with a raw client: a client that does not ask for block sizes
//! (`NBD_OPT_EXPORT_NAME`, or `NBD_OPT_GO` without `NBD_INFO_BLOCK_SIZE`) is served at any byte
//! offset and length and up to 64 MiB per READ/WRITE; one that asks is held to 512 / 32 MiB;
//! concurrent read-modify-writes of one sector lose no bytes.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use lograid_nbd::mem_export::{FaultOp, MemExport};
use lograid_nbd::proto::*;
use lograid_nbd::{Export, ServerConfig};

/// An export of `size` bytes holding `pattern(1, size)`, and that model of its contents.
fn patterned(size: u64) -> (Arc<MemExport>, Vec<u8>) {
    let export = Arc::new(MemExport::new("disk0", size));
    let model = pattern(1, size as usize);
    export.fill(0, &model);
    (export, model)
}

fn start(config: ServerConfig, export: &Arc<MemExport>) -> TestServer {
    TestServer::start(config, vec![export.clone() as Arc<dyn Export>])
}

/// Writes through `client` and the model alike; the write must succeed.
fn write_both(client: &mut RawClient, model: &mut [u8], offset: u64, data: &[u8]) {
    let reply = client.write(offset, data);
    assert_eq!(reply.error, 0, "write at {offset}+{}", data.len());
    model[offset as usize..offset as usize + data.len()].copy_from_slice(data);
}

/// Reads through `client` and compares with the model.
fn check_read(client: &mut RawClient, model: &[u8], offset: u64, length: u32) {
    let reply = client.read(offset, length);
    assert_eq!(
        reply.error, 0,
        "read at {offset}+{length}: {}",
        reply.message
    );
    assert!(
        reply.data[..] == model[offset as usize..offset as usize + length as usize],
        "read at {offset}+{length} differs"
    );
}

/// Unaligned writes, zeroes and reads of every shape, checked against the model.
fn exercise_unaligned(client: &mut RawClient, model: &mut [u8]) {
    let size = model.len() as u64;
    write_both(client, model, 1, &[0xA1]);
    write_both(client, model, 100, &pattern(2, 300));
    write_both(client, model, 511, &pattern(3, 2));
    write_both(client, model, 4000, &pattern(4, 5000));
    // Past the one-buffer merge: edges by read-modify-write, the middle straight through.
    write_both(client, model, 70_001, &pattern(5, 200_003));
    write_both(client, model, 512 * 1000, &pattern(6, 70_001));
    write_both(client, model, size - 3, &[1, 2, 3]);
    for (offset, length) in [
        (0u64, 1u32),
        (1, 1),
        (99, 302),
        (510, 4),
        (3999, 5002),
        (70_000, 200_005),
        (512 * 1000 - 1, 70_003),
        (size - 7, 7),
        (12_345, 1),
    ] {
        check_read(client, model, offset, length);
    }

    let reply = client.call(0, NBD_CMD_WRITE_ZEROES, 10, 20, &[]);
    assert_eq!(reply.error, 0);
    model[10..30].fill(0);
    let reply = client.call(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 3000, 9000, &[]);
    assert_eq!(reply.error, 0);
    model[3000..12_000].fill(0);
    check_read(client, model, 0, 16_384);
}

#[test]
fn go_without_block_sizes_serves_any_byte_offset() {
    let (export, mut model) = patterned(8 * MIB);
    let server = start(test_config(), &export);
    for structured in [false, true] {
        let (mut client, negotiated, sizes) =
            RawClient::open_without_block_sizes(server.addr, "disk0", structured, structured);
        assert_eq!(negotiated.size, 8 * MIB);
        // Sent unasked: what such a client may do here (the protocol's minimum of 1).
        assert_eq!(sizes, Some((1, 4096, UNNEGOTIATED_MAX_PAYLOAD)));
        exercise_unaligned(&mut client, &mut model);
        client.disconnect();
    }

    // Trim: only the whole sectors inside; the partly covered ones keep their bytes.
    let (mut client, _, _) = RawClient::open_without_block_sizes(server.addr, "disk0", true, true);
    assert_eq!(client.call(0, NBD_CMD_TRIM, 1_048_677, 100, &[]).error, 0);
    assert_eq!(
        client.call(0, NBD_CMD_TRIM, 1_048_677, 10_000, &[]).error,
        0
    );
    // Whole sectors inside [1_048_677, 1_058_677): [1_049_088, 1_058_304).
    check_read(&mut client, &model, 1_040_000, 9088);
    check_read(&mut client, &model, 1_058_304, 10_000);
    assert_eq!(
        export.allocation_at(1_049_088),
        lograid_nbd::Allocation::Hole
    );
    assert_eq!(
        export.allocation_at(1_048_576),
        lograid_nbd::Allocation::Data
    );

    // Block status at unaligned offsets: cut to the range, holes where trimmed.
    let status = client.call(0, NBD_CMD_BLOCK_STATUS, 1_049_000, 1000, &[]);
    assert_eq!(status.error, 0);
    assert_eq!(
        status.extents,
        vec![(88, 0), (912, NBD_STATE_HOLE | NBD_STATE_ZERO)]
    );
    let status = client.call(
        NBD_CMD_FLAG_REQ_ONE,
        NBD_CMD_BLOCK_STATUS,
        1_049_100,
        7,
        &[],
    );
    assert_eq!(status.extents, vec![(7, NBD_STATE_HOLE | NBD_STATE_ZERO)]);
    client.disconnect();
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn export_name_client_serves_any_byte_offset() {
    let (export, mut model) = patterned(4 * MIB);
    let server = start(test_config(), &export);
    let (mut client, negotiated) = RawClient::open_export_name(server.addr, "disk0");
    assert_eq!(negotiated.size, 4 * MIB);
    exercise_unaligned(&mut client, &mut model);
    client.disconnect();
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn requests_up_to_64_mib_without_block_sizes_and_bounded_buffers() {
    let size = 80 * MIB;
    let (export, mut model) = patterned(size);
    let server = start(test_config(), &export);
    let (mut client, _) = RawClient::open_export_name(server.addr, "disk0");
    let max = UNNEGOTIATED_MAX_PAYLOAD;
    write_both(
        &mut client,
        &mut model,
        3,
        &pattern(7, 48 * MIB as usize + 1),
    );
    check_read(&mut client, &model, 0, max);
    check_read(&mut client, &model, 5, max);
    // Beyond the bound: EINVAL, and the connection goes on (a write's payload is drained).
    assert_eq!(client.read(0, max + 1).error, NBD_EINVAL);
    let big = vec![0x55u8; max as usize + 512];
    assert_eq!(client.write(0, &big).error, NBD_EINVAL);
    check_read(&mut client, &model, 0, 4096);
    client.disconnect();
    // One such request at a time fills a connection's whole buffer budget; never more.
    let stats = server.stats.snapshot();
    assert!(
        stats.peak_in_flight_bytes
            <= u64::from(ServerConfig::default().max_in_flight_bytes_per_conn),
        "{stats:?}"
    );
    assert_eq!(export.contract_violations(), 0);
}

#[test]
fn clients_that_ask_for_block_sizes_keep_512_and_32_mib() {
    let (export, model) = patterned(40 * MIB);
    let server = start(test_config(), &export);
    for structured in [false, true] {
        let (mut client, _, sizes) = RawClient::open_go(
            server.addr,
            "disk0",
            structured,
            false,
            &[NBD_INFO_BLOCK_SIZE],
        );
        assert_eq!(sizes, Some((512, 4096, DEFAULT_MAX_PAYLOAD)));
        assert_eq!(client.read(1, 512).error, NBD_EINVAL);
        assert_eq!(client.read(512, 100).error, NBD_EINVAL);
        assert_eq!(client.write(100, &[0u8; 512]).error, NBD_EINVAL);
        assert_eq!(client.call(0, NBD_CMD_TRIM, 0, 100, &[]).error, NBD_EINVAL);
        assert_eq!(
            client.call(0, NBD_CMD_WRITE_ZEROES, 1, 512, &[]).error,
            NBD_EINVAL
        );
        assert_eq!(client.read(0, DEFAULT_MAX_PAYLOAD + 512).error, NBD_EINVAL);
        check_read(&mut client, &model, 0, DEFAULT_MAX_PAYLOAD);
        client.disconnect();
    }
    assert_eq!(
        export.contents(0, 40 * MIB),
        model,
        "a refused request changed the export"
    );
    assert_eq!(export.contract_violations(), 0);
}

/// Two connections (and many requests in flight on each) write alternate single bytes of the
/// same sectors. Each is a read-modify-write whose write-back is slowed (MemExport sleeps
/// before storing), so unserialised ones would store stale copies of each other's bytes.
#[test]
fn concurrent_unaligned_writes_to_one_sector_lose_no_bytes() {
    const BYTES: u64 = 1024; // two sectors
    let export = Arc::new(MemExport::new("disk0", MIB));
    export.inject_delay(FaultOp::Write, 0..BYTES, Duration::from_millis(1));
    let server = start(test_config(), &export);
    let writers: Vec<_> = (0..2u64)
        .map(|parity| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let (mut client, _, _) =
                    RawClient::open_without_block_sizes(addr, "disk0", parity == 1, false);
                let offsets: Vec<u64> = (0..BYTES).filter(|b| b % 2 == parity).collect();
                for offset in &offsets {
                    client.submit(
                        0,
                        NBD_CMD_WRITE,
                        *offset,
                        1,
                        &[0x80 | (*offset % 127) as u8],
                    );
                }
                for _ in &offsets {
                    assert_eq!(client.read_reply().error, 0);
                }
                client.disconnect();
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let expected: Vec<u8> = (0..BYTES).map(|b| 0x80 | (b % 127) as u8).collect();
    let contents = export.contents(0, BYTES);
    let lost: Vec<u64> = (0..BYTES)
        .filter(|b| contents[*b as usize] != expected[*b as usize])
        .collect();
    assert!(lost.is_empty(), "bytes lost at {lost:?}");
    assert_eq!(export.contract_violations(), 0);
}

/// An aligned write (from a client that asked for block sizes) to a sector that another
/// client's unaligned write is read-modify-writing waits for it, instead of being overwritten
/// by the stale copy the read-modify-write read.
#[test]
fn aligned_write_is_not_undone_by_a_read_modify_write() {
    let (export, _) = patterned(MIB);
    // The unaligned write [1, 2001) reads its first sector at once and its last one (1536..2048)
    // slowly, then writes [0, 2048) back: a window of 300 ms in which sector 0's copy is stale.
    export.inject_delay(FaultOp::Read, 1536..2048, Duration::from_millis(300));
    let server = start(test_config(), &export);
    let (mut aligned, _) = RawClient::open(server.addr, "disk0", false, false);
    let (mut unaligned, _) = RawClient::open_export_name(server.addr, "disk0");
    unaligned.submit(0, NBD_CMD_WRITE, 1, 2000, &[0x11; 2000]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(aligned.write(0, &[0xBB; 512]).error, 0);
    assert_eq!(unaligned.read_reply().error, 0);
    let bytes = export.contents(0, 2048);
    // Byte 0 is only the aligned write's; the rest of sector 0 is one write's or the other's
    // (both were in flight together), and the unaligned write's beyond it.
    assert_eq!(bytes[0], 0xBB, "the aligned write's byte was undone");
    assert!(bytes[1..512].iter().all(|b| *b == 0xBB) || bytes[1..512].iter().all(|b| *b == 0x11));
    assert!(bytes[512..2001].iter().all(|b| *b == 0x11));
    aligned.disconnect();
    unaligned.disconnect();
    assert_eq!(export.contract_violations(), 0);
}
