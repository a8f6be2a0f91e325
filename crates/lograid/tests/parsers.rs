//! Totality of every parser of on-disk bytes, and the documented layout.
//!
//! - `Superblock::decode`, `RowHeader::decode`, `RowHeader::peek_geometry`,
//!   `CheckpointImage::decode` and `read_superblock`: random bytes, random
//!   bytes that pass the magic/version/CRC gates (so the field checks are
//!   reached), every truncation of valid encodings, every single-bit flip of
//!   valid encodings, and encode -> decode round trips. None may panic.
//! - Opening a pool from members that are garbage, zeroes, a damaged
//!   member, members of two pools, one member twice, an ext4 filesystem:
//!   each a clear `Err`.
//! - docs/FORMAT.md: the offset tables of the row header, the superblock and
//!   the checkpoint prefix are parsed and checked against encoded bytes.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;
#[path = "common/corrupt.rs"]
mod corrupt;

use lograid::device::{CounterValues, Member, SimMember, SimRng};
use lograid::format::checkpoint::{
    CheckpointImage, CheckpointWriter, HeadRecord, PoolCounters, RebuildRecord, SegmentRecord,
    SegmentStateCode, VolumeRecord,
};
use lograid::format::row::{
    header_blocks_for, Entry, EntryKind, HeadId, RowHeader, RowKind, HEADER_FIXED_BYTES,
};
use lograid::format::superblock::{CheckpointPointer, MemberRecord, MemberState, Superblock};
use lograid::format::{crc32c_skipping, FormatError, BLOCK_SIZE, FORMAT_VERSION};
use lograid::layout::RowGeom;
use lograid::{open_members, read_superblock, Error, ReadOnlyReason, Refusal};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

// ---------------------------------------------------------------- strategies

fn member_state() -> impl Strategy<Value = MemberState> {
    prop_oneof![
        Just(MemberState::Active),
        Just(MemberState::Faulted),
        Just(MemberState::Joining),
        Just(MemberState::Removing),
        Just(MemberState::Removed),
    ]
}

fn superblock() -> impl Strategy<Value = Superblock> {
    (
        1usize..=24,
        "\\PC{0,80}",
        any::<u128>(),
        any::<u64>(),
        any::<u64>(),
        0u32..=8,
        1u32..=64,
        2u64..=(1 << 20),
    )
        .prop_flat_map(
            |(count, name, uuid, created, generation, chunk, seg_mult, data_start)| {
                let parity_max = (count - 1).min(3) as u8;
                (
                    0..count as u8,
                    0..=parity_max,
                    prop::collection::vec(
                        (
                            any::<u128>(),
                            (1u64 << 20) + 2..=lograid::format::MAX_MEMBER_BLOCKS,
                            member_state(),
                        ),
                        count,
                    ),
                    (
                        any::<u64>(),
                        any::<u32>(),
                        any::<u32>(),
                        any::<u32>(),
                        any::<u64>(),
                        any::<u32>(),
                    ),
                )
                    .prop_map(move |(member_index, parity, members, cp)| {
                        Superblock {
                            pool_uuid: uuid,
                            pool_name: name.clone(),
                            created_unix: created,
                            member_index,
                            generation,
                            parity,
                            chunk_blocks: 1 << chunk,
                            segment_blocks: (1 << chunk) * seg_mult,
                            data_start_block: data_start,
                            members: members
                                .into_iter()
                                .map(|(uuid, size_blocks, state)| MemberRecord {
                                    uuid,
                                    size_blocks,
                                    state,
                                })
                                .collect(),
                            checkpoint: CheckpointPointer {
                                checkpoint_id: cp.0,
                                segment: cp.1,
                                offset_blocks: cp.2,
                                first_row_crc: cp.3,
                                blob_bytes: cp.4,
                                blob_crc: cp.5,
                            },
                        }
                    })
            },
        )
}

fn entry_kind() -> impl Strategy<Value = EntryKind> {
    prop_oneof![
        4 => Just(EntryKind::Data),
        1 => Just(EntryKind::Relocated),
        1 => Just(EntryKind::Trim),
        1 => Just(EntryKind::Zero),
        1 => Just(EntryKind::Payload),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        entry_kind(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(kind, volume, lba, crc, count, source)| Entry {
            kind,
            volume,
            lba,
            crc,
            count,
            source,
        })
}

fn row_header(max_entries: usize) -> impl Strategy<Value = RowHeader> {
    (prop::collection::vec(entry(), 0..max_entries), 1usize..=24).prop_flat_map(
        |(entries, width)| {
            let slots = entries.iter().filter(|e| e.kind.owns_slot()).count() as u32;
            let hb = header_blocks_for(entries.len());
            let parity_max = (width - 1).min(3) as u8;
            (
                Just(entries),
                prop::sample::subsequence((0u32..32).collect::<Vec<_>>(), width),
                0..=parity_max,
                any::<(u128, u64, u64, u32, u32, u32, u32, u64, u64, u32)>(),
                prop_oneof![Just(RowKind::Data), Just(RowKind::Checkpoint)],
                prop_oneof![
                    Just(HeadId::User),
                    Just(HeadId::Cleaner),
                    Just(HeadId::Checkpoint)
                ],
                0u32..64,
                any::<prop::sample::Index>(),
            )
                .prop_map(
                    move |(entries, bits, parity, f, kind, head, extra_height, dc_pick)| {
                        let members_mask = bits.iter().fold(0u32, |m, b| m | 1 << b);
                        let dc_max = width - parity as usize;
                        let data_columns = 1 + dc_pick.index(dc_max);
                        let need = (hb as u32 + slots).div_ceil(data_columns as u32);
                        let height = (need + extra_height).clamp(1, u16::MAX as u32) as u16;
                        RowHeader {
                            header_blocks: hb,
                            kind,
                            head,
                            pool_uuid: f.0,
                            nonce: f.1,
                            seq: f.2,
                            prev_crc: f.3,
                            segment: f.4,
                            offset_blocks: f.5,
                            height,
                            data_columns: data_columns as u8,
                            width: width as u8,
                            parity,
                            members_mask,
                            next_segment: f.6,
                            slots,
                            checkpoint_id: f.7,
                            checkpoint_offset: f.8,
                            payload_bytes: f.9,
                            flushed_seq: 0,
                            entries,
                        }
                    },
                )
        },
    )
}

fn counter_values() -> impl Strategy<Value = CounterValues> {
    prop::array::uniform8(any::<u64>()).prop_map(|v| CounterValues {
        bytes_read: v[0],
        bytes_written: v[1],
        reads: v[2],
        writes: v[3],
        flushes: v[4],
        io_errors: v[5],
        checksum_errors: v[6],
        repaired_blocks: v[7],
    })
}

fn segment_state() -> impl Strategy<Value = SegmentStateCode> {
    prop_oneof![
        Just(SegmentStateCode::Free),
        Just(SegmentStateCode::OpenUser),
        Just(SegmentStateCode::OpenCleaner),
        Just(SegmentStateCode::Sealed),
        Just(SegmentStateCode::ReservedUser),
        Just(SegmentStateCode::ReservedCleaner),
    ]
}

/// Map entries in strictly increasing LBA order, in runs (as a real map is).
fn map_entries() -> impl Strategy<Value = Vec<(u64, u64, u32)>> {
    prop::collection::vec((0u64..1000, 1u64..20, any::<u64>(), any::<u32>()), 0..6).prop_map(
        |runs| {
            let mut out = Vec::new();
            let mut lba = 0u64;
            for (gap, len, loc, crc) in runs {
                lba += gap + 1;
                for i in 0..len {
                    out.push((lba, loc.wrapping_add(i), crc.wrapping_add(i as u32)));
                    lba += 1;
                }
            }
            out
        },
    )
}

fn volume_record() -> impl Strategy<Value = VolumeRecord> {
    (
        any::<u32>(),
        "[a-z0-9._-]{0,20}",
        any::<u64>(),
        any::<u64>(),
        map_entries(),
    )
        .prop_map(
            |(id, name, size_bytes, created_unix, entries)| VolumeRecord {
                id,
                name,
                size_bytes,
                created_unix,
                entries,
            },
        )
}

/// A row of a segment: (offset, height, data columns, header blocks,
/// slots, seq).
type RowParts = (u32, u16, u8, u16, u32, u64);

/// A segment: (state, members mask, parity, live blocks, fill blocks,
/// sealed seq, rows).
type SegmentParts = (SegmentStateCode, u32, u8, u32, u32, u64, Vec<RowParts>);

fn segment_parts() -> impl Strategy<Value = SegmentParts> {
    let row = (
        any::<u32>(),
        any::<u16>(),
        any::<u8>(),
        any::<u16>(),
        any::<u32>(),
        any::<u64>(),
    );
    (
        segment_state(),
        any::<u32>(),
        any::<u8>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        prop::collection::vec(row, 0..4),
    )
}

/// Segment `s` of the table: its rows carry its number, members and parity.
fn segment_record(s: usize, parts: SegmentParts) -> SegmentRecord {
    let (state, members_mask, parity, live_blocks, fill_blocks, sealed_seq, rows) = parts;
    SegmentRecord {
        state,
        members_mask,
        parity,
        live_blocks,
        fill_blocks,
        sealed_seq,
        rows: rows
            .into_iter()
            .map(
                |(offset, height, data_columns, header_blocks, slots, seq)| RowGeom {
                    segment: s as u32,
                    offset,
                    height,
                    data_columns,
                    header_blocks,
                    slots,
                    members_mask,
                    parity,
                    seq,
                },
            )
            .collect(),
    }
}

fn head_record() -> impl Strategy<Value = HeadRecord> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(segment, offset, next_segment, last_crc, last_seq)| HeadRecord {
                segment,
                offset,
                next_segment,
                last_crc,
                last_seq,
            },
        )
}

/// Rebuild records from member -> (since seq, segments); they list
/// segments of the table (`n_segs` of them) only.
fn rebuild_records(
    rebuilds: BTreeMap<u8, (u64, BTreeSet<u32>)>,
    n_segs: u32,
) -> Vec<RebuildRecord> {
    rebuilds
        .into_iter()
        .map(|(member, (since_seq, segments))| RebuildRecord {
            member,
            since_seq,
            segments: segments.into_iter().filter(|&x| x < n_segs).collect(),
        })
        .collect()
}

fn checkpoint_image() -> impl Strategy<Value = CheckpointImage> {
    (
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            prop::array::uniform7(any::<u64>()),
        ),
        prop::collection::vec(counter_values(), 0..=24),
        prop::collection::vec(volume_record(), 0..4),
        prop::collection::vec(segment_parts(), 0..6),
        prop::collection::vec(head_record(), 0..=8),
        prop::collection::btree_map(
            0u8..24,
            (any::<u64>(), prop::collection::btree_set(0u32..6, 0..6)),
            0..3,
        ),
    )
        .prop_map(
            |(
                (checkpoint_id, next_seq, next_volume_id, c),
                member_counters,
                volumes,
                segs,
                heads,
                rebuilds,
            )| {
                // Rebuilds list segments of the table only.
                let n_segs = segs.len() as u32;
                let rebuilds = rebuild_records(rebuilds, n_segs);
                let segments = segs
                    .into_iter()
                    .enumerate()
                    .map(|(s, parts)| segment_record(s, parts))
                    .collect();
                CheckpointImage {
                    checkpoint_id,
                    next_seq,
                    next_volume_id,
                    counters: PoolCounters {
                        user_bytes_written: c[0],
                        user_bytes_read: c[1],
                        relocated_blocks: c[2],
                        trimmed_blocks: c[3],
                        checkpoints: c[4],
                        rows_written: c[5],
                        short_rows: c[6],
                    },
                    member_counters,
                    volumes,
                    segments,
                    heads,
                    rebuilds,
                }
            },
        )
}

/// Encodes an image the way the engine does (`pool/checkpoint.rs`).
fn encode_checkpoint(img: &CheckpointImage) -> Vec<u8> {
    let mut w = CheckpointWriter::new(
        img.checkpoint_id,
        img.next_seq,
        img.next_volume_id,
        &img.counters,
        &img.member_counters,
        img.volumes.len(),
    );
    for v in &img.volumes {
        w.volume(
            v.id,
            &v.name,
            v.size_bytes,
            v.created_unix,
            v.entries.iter().copied(),
        );
    }
    w.segments(&img.segments);
    w.finish(&img.heads, &img.rebuilds)
}

// ---------------------------------------------------------------- gates

/// Makes random bytes pass the superblock's magic, version and CRC checks.
fn forge_superblock(mut block: Vec<u8>) -> Vec<u8> {
    block.resize(BLOCK_SIZE, 0);
    block[..8].copy_from_slice(b"LGRDSUPR");
    block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c_skipping(&block, BLOCK_SIZE - 4);
    block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    block
}

/// Makes random bytes pass the row header's magic, version, header-block
/// count and CRC checks.
fn forge_row_header(mut bytes: Vec<u8>, header_blocks: u16) -> Vec<u8> {
    bytes.resize(header_blocks as usize * BLOCK_SIZE, 0);
    bytes[..8].copy_from_slice(b"LGRDROW1");
    bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes[12..14].copy_from_slice(&header_blocks.to_le_bytes());
    let crc = crc32c_skipping(&bytes, 124);
    bytes[124..128].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn flip(bytes: &[u8], bit: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[bit / 8] ^= 1 << (bit % 8);
    b
}

// ---------------------------------------------------------------- superblock

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn superblock_round_trips(sb in superblock()) {
        let bytes = sb.encode();
        prop_assert_eq!(bytes.len(), BLOCK_SIZE);
        prop_assert_eq!(Superblock::decode(&bytes).expect("decodes"), sb.clone());
        // Longer input: only the first block counts.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0xab; 100]);
        prop_assert_eq!(Superblock::decode(&longer).expect("decodes"), sb);
    }

    #[test]
    fn superblock_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..5000)) {
        prop_assert!(Superblock::decode(&bytes).is_err());
    }

    #[test]
    fn superblock_forged_gates_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..BLOCK_SIZE)) {
        // Past magic, version and CRC, the field checks must still hold.
        if let Ok(sb) = Superblock::decode(&forge_superblock(bytes)) {
            prop_assert!(!sb.members.is_empty() && sb.members.len() <= 24);
            prop_assert!((sb.member_index as usize) < sb.members.len());
            prop_assert!((sb.parity as usize) < sb.members.len() && sb.parity <= 3);
            prop_assert!(sb.chunk_blocks > 0 && sb.segment_blocks % sb.chunk_blocks == 0 && sb.segment_blocks > 0);
        }
    }

    #[test]
    fn superblock_forged_with_valid_prefix_never_panic(sb in superblock(), tail in prop::collection::vec(any::<u8>(), 0..200), cut in 12usize..400) {
        // A valid encoding whose fields after `cut` are random: deep field checks.
        let mut bytes = sb.encode();
        let cut = cut.min(bytes.len());
        for (i, b) in tail.iter().enumerate() {
            if cut + i < BLOCK_SIZE - 4 {
                bytes[cut + i] = *b;
            }
        }
        let _ = Superblock::decode(&forge_superblock(bytes));
    }

    #[test]
    fn superblock_truncations_fail(sb in superblock()) {
        let bytes = sb.encode();
        for n in 0..BLOCK_SIZE {
            prop_assert!(matches!(Superblock::decode(&bytes[..n]), Err(FormatError::Truncated { .. })), "length {}", n);
        }
    }
}

#[test]
fn superblock_every_bit_flip_fails() {
    let mut rng = SimRng(7);
    for _ in 0..4 {
        let sb = sample_superblock(&mut rng);
        let bytes = sb.encode();
        for bit in 0..BLOCK_SIZE * 8 {
            let r = Superblock::decode(&flip(&bytes, bit));
            // The CRC covers every byte of the block, so every flip is caught.
            assert!(r.is_err(), "bit {bit} flipped: decoded {r:?}");
            if bit >= 64 {
                assert!(
                    matches!(r, Err(FormatError::BadChecksum { .. })),
                    "bit {bit}: {r:?}"
                );
            }
        }
    }
}

fn sample_superblock(rng: &mut SimRng) -> Superblock {
    let n = 1 + rng.below(24) as usize;
    Superblock {
        pool_uuid: (rng.next_u64() as u128) << 64 | rng.next_u64() as u128,
        pool_name: format!("pool-{}", rng.below(1000)),
        created_unix: rng.next_u64(),
        member_index: rng.below(n as u64) as u8,
        generation: rng.next_u64(),
        parity: rng.below(n.min(4) as u64) as u8,
        chunk_blocks: 32,
        segment_blocks: 32 * 64,
        data_start_block: 256,
        members: (0..n)
            .map(|i| MemberRecord {
                uuid: rng.next_u64() as u128,
                size_blocks: (rng.next_u64() >> 24).max(4096),
                state: if i % 3 == 0 {
                    MemberState::Faulted
                } else {
                    MemberState::Active
                },
            })
            .collect(),
        checkpoint: CheckpointPointer {
            checkpoint_id: rng.next_u64(),
            segment: rng.next_u64() as u32,
            offset_blocks: rng.next_u64() as u32,
            first_row_crc: rng.next_u64() as u32,
            blob_bytes: rng.next_u64(),
            blob_crc: rng.next_u64() as u32,
        },
    }
}

// ---------------------------------------------------------------- row header

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn row_header_round_trips(h in row_header(300)) {
        let (bytes, crc) = h.encode();
        prop_assert_eq!(bytes.len(), h.header_blocks as usize * BLOCK_SIZE);
        let (back, crc2) = RowHeader::decode(&bytes).expect("decodes");
        prop_assert_eq!(&back, &h);
        prop_assert_eq!(crc, crc2);
        let peek = RowHeader::peek_geometry(&bytes[..BLOCK_SIZE]).expect("peeks");
        prop_assert_eq!(peek.header_blocks, h.header_blocks);
        prop_assert_eq!(peek.segment, h.segment);
        prop_assert_eq!(peek.offset_blocks, h.offset_blocks);
        prop_assert_eq!(peek.height, h.height);
        prop_assert_eq!(peek.data_columns, h.data_columns);
        prop_assert_eq!(peek.width, h.width);
        prop_assert_eq!(peek.parity, h.parity);
        prop_assert_eq!(peek.members_mask, h.members_mask);
        // Longer input (the rest of a column): only the header's blocks count.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&vec![0x77; BLOCK_SIZE]);
        prop_assert_eq!(RowHeader::decode(&longer).expect("decodes").0, h);
    }

    #[test]
    fn row_header_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..9000)) {
        prop_assert!(RowHeader::decode(&bytes).is_err());
        let _ = RowHeader::peek_geometry(&bytes);
        let _ = RowHeader::peek_header_blocks(&bytes);
    }

    #[test]
    fn row_header_forged_gates_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..3 * BLOCK_SIZE), hb in 0u16..4) {
        let forged = forge_row_header(bytes, hb.max(1));
        let mut with_hb = forged.clone();
        with_hb[12..14].copy_from_slice(&hb.to_le_bytes());
        for b in [&forged, &with_hb] {
            let _ = RowHeader::peek_geometry(b);
            if let Ok((h, _)) = RowHeader::decode(b) {
                // What decode lets through must satisfy the invariants the engine relies on.
                prop_assert!(h.height > 0 && h.data_columns > 0);
                prop_assert!(h.data_columns as usize + h.parity as usize <= h.width as usize);
                prop_assert_eq!(h.members_mask.count_ones(), h.width as u32);
                prop_assert!(h.header_blocks as u64 + h.slots as u64 <= h.height as u64 * h.data_columns as u64);
                prop_assert_eq!(h.entries.iter().filter(|e| e.kind.owns_slot()).count() as u32, h.slots);
            }
        }
    }

    #[test]
    fn row_header_forged_fields_never_panic(h in row_header(40), noise in prop::collection::vec(any::<u8>(), 1..64), at in 14usize..(HEADER_FIXED_BYTES + 40 * 32)) {
        // A valid header with a few random bytes, CRC fixed up: every field check is reached.
        let (mut bytes, _) = h.encode();
        for (i, b) in noise.iter().enumerate() {
            if at + i < bytes.len() && !(124..128).contains(&(at + i)) {
                bytes[at + i] = *b;
            }
        }
        let hb = h.header_blocks;
        let forged = forge_row_header(bytes, hb);
        let _ = RowHeader::peek_geometry(&forged);
        if let Ok((d, _)) = RowHeader::decode(&forged) {
            // Whatever is accepted is a valid header: it encodes and decodes
            // to itself. (Not byte-identical to `forged`: reserved bytes -
            // 101..124, bytes 1..4 of each entry, and the block tail after
            // the entries - are covered by the CRC but not checked for zero.)
            let (again, crc2) = d.encode();
            let (back, crc3) = RowHeader::decode(&again).expect("re-encoded header decodes");
            prop_assert_eq!(back, d);
            prop_assert_eq!(crc2, crc3);
            // Reserved: 101..124 (and the CRC at 124), bytes 1..=3 of each
            // entry, and everything after the last entry.
            let entries_end = HEADER_FIXED_BYTES + 32 * again_entries(&again);
            let reserved = |i: usize| {
                let in_entry = i.checked_sub(HEADER_FIXED_BYTES).map(|r| r % 32);
                (101..128).contains(&i) || matches!(in_entry, Some(1..=3)) || i >= entries_end
            };
            let diff: Vec<usize> = (0..forged.len()).filter(|&i| again[i] != forged[i] && !reserved(i)).collect();
            prop_assert!(diff.is_empty(), "accepted header differs outside reserved bytes: {:?}", diff);
        }
    }

    #[test]
    fn row_header_truncations_fail(h in row_header(200)) {
        let (bytes, _) = h.encode();
        for n in 0..bytes.len() {
            prop_assert!(RowHeader::decode(&bytes[..n]).is_err(), "length {}", n);
            if n < HEADER_FIXED_BYTES {
                prop_assert!(RowHeader::peek_geometry(&bytes[..n]).is_err());
            }
        }
    }
}

/// Entries in an encoded header (its entry_count field).
fn again_entries(bytes: &[u8]) -> usize {
    u32::from_le_bytes(bytes[77..81].try_into().unwrap()) as usize
}

#[test]
fn row_header_every_bit_flip_fails() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for entries in [3usize, 140] {
        let h = loop {
            let h = row_header(entries + 1)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            if h.entries.len() >= entries.min(100) {
                break h;
            }
        };
        let (bytes, _) = h.encode();
        for bit in 0..bytes.len() * 8 {
            let r = RowHeader::decode(&flip(&bytes, bit));
            assert!(
                r.is_err(),
                "{} header blocks, bit {bit} flipped: decoded",
                h.header_blocks
            );
        }
    }
}

/// Geometry peeked from a header is only a hint: a block that passes
/// `peek_geometry` need not decode, but peek must never panic on any block
/// of a real row (slots, padding, parity).
#[test]
fn peek_geometry_on_short_and_odd_inputs() {
    for n in [0usize, 1, 8, 14, 51, 52, 60, 68, 69, 127] {
        let mut b = vec![0u8; n];
        if n >= 8 {
            b[..8].copy_from_slice(b"LGRDROW1");
        }
        assert!(RowHeader::peek_geometry(&b).is_err(), "length {n}");
    }
    // Exactly the fixed part, with a valid magic and header-block count.
    let mut b = vec![0u8; HEADER_FIXED_BYTES];
    b[..8].copy_from_slice(b"LGRDROW1");
    b[12] = 1;
    b[60] = 1; // height
    b[62] = 1; // data columns
    assert!(RowHeader::peek_geometry(&b).is_ok());
    b[12] = 65; // more header blocks than allowed
    assert!(matches!(
        RowHeader::peek_geometry(&b),
        Err(FormatError::Invalid(_))
    ));
}

// ---------------------------------------------------------------- checkpoint

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_round_trips(img in checkpoint_image()) {
        let bytes = encode_checkpoint(&img);
        let back = CheckpointImage::decode(&bytes).expect("decodes");
        prop_assert_eq!(&back, &img);
        prop_assert_eq!(encode_checkpoint(&back), bytes.clone());
        // Trailing bytes are refused.
        let mut longer = bytes;
        longer.push(0);
        prop_assert!(CheckpointImage::decode(&longer).is_err());
    }

    #[test]
    fn checkpoint_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4000)) {
        prop_assert!(CheckpointImage::decode(&bytes).is_err());
    }

    #[test]
    fn checkpoint_forged_prefix_never_panics(img in checkpoint_image(), noise in prop::collection::vec(any::<u8>(), 1..32), at in 12usize..2000) {
        // A valid blob with random bytes somewhere: counts, lengths, strings, codes.
        let mut bytes = encode_checkpoint(&img);
        for (i, b) in noise.iter().enumerate() {
            if at + i < bytes.len() {
                bytes[at + i] = *b;
            }
        }
        let _ = CheckpointImage::decode(&bytes);
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_truncations_fail(img in checkpoint_image()) {
        let bytes = encode_checkpoint(&img);
        for n in 0..bytes.len() {
            prop_assert!(CheckpointImage::decode(&bytes[..n]).is_err(), "length {}", n);
        }
    }

    /// The blob has no checksum of its own (the superblock pointer holds
    /// its CRC), so a flipped bit may decode. Then what it decodes to must
    /// be a value the encoder can write: it encodes and decodes to itself.
    /// (Not always to the flipped bytes: a flipped run start can make two
    /// runs adjacent, which the encoder would write as one run. A flip can
    /// also make runs overlap or go backwards, which the decoder accepts:
    /// see `checkpoint_refuses_unordered_map_runs`.)
    #[test]
    fn checkpoint_bit_flips_fail_or_decode_to_an_encodable_image(img in checkpoint_image()) {
        let bytes = encode_checkpoint(&img);
        for bit in 0..bytes.len() * 8 {
            let flipped = flip(&bytes, bit);
            if let Ok(d) = CheckpointImage::decode(&flipped) {
                let again = encode_checkpoint(&d);
                prop_assert_eq!(CheckpointImage::decode(&again).expect("re-encoded blob decodes"), d);
                // Flips outside the map runs' start fields re-encode byte for byte.
                if again != flipped {
                    prop_assert!(again.len() < flipped.len(), "bit {}: re-encoding differs but is not shorter", bit);
                }
            }
        }
    }
}

/// A map whose LBAs are not strictly increasing (overlapping or repeated
/// runs) is not something the encoder writes; a decoder that accepts it
/// lets the loader count one block twice (`live_blocks` per entry).
#[test]
fn checkpoint_refuses_unordered_map_runs() {
    let img = CheckpointImage {
        checkpoint_id: 1,
        next_seq: 1,
        next_volume_id: 2,
        counters: PoolCounters::default(),
        member_counters: vec![],
        volumes: vec![VolumeRecord {
            id: 1,
            name: "vol".into(),
            size_bytes: 1 << 20,
            created_unix: 0,
            // 5, then 5 again: two runs for the same LBA.
            entries: vec![(5, (1 << 48) | 300, 1), (5, (1 << 48) | 301, 2)],
        }],
        segments: vec![],
        heads: vec![],
        rebuilds: vec![],
    };
    let bytes = encode_checkpoint(&img);
    assert!(
        CheckpointImage::decode(&bytes).is_err(),
        "duplicate LBA 5 accepted"
    );
}

// ---------------------------------------------------------------- read_superblock

fn garbage(rng: &mut SimRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        let x = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&x[..chunk.len()]);
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn read_superblock_of_garbage_members(seed in any::<u64>(), blocks in 0u64..600, extra in 0u64..4096) {
        let mut rng = SimRng(seed | 1);
        let size = (blocks * 4096 + extra) as usize;
        let m = SimMember::from_image("garbage", garbage(&mut rng, size));
        prop_assert!(read_superblock(&m).is_err());
        // Forged superblocks (valid magic, version and CRC, random fields) in
        // every slot: never a panic; whatever is accepted is self-consistent.
        if blocks >= 260 {
            let size_blocks = size as u64 / 4096;
            for b in [0, 1, size_blocks - 2, size_blocks - 1] {
                let forged = forge_superblock(garbage(&mut rng, BLOCK_SIZE));
                m.write_at(&forged, b * 4096).unwrap();
            }
            if let Ok(sb) = read_superblock(&m) {
                prop_assert!((sb.member_index as usize) < sb.members.len());
            }
        }
    }

    /// A member holding a valid superblock (any fields) and garbage
    /// elsewhere: opening must fail cleanly, whatever the superblock says.
    /// Member sizes in the table are kept within the member (see
    /// `open_refuses_superblock_claiming_huge_missing_member` for the rest).
    #[test]
    fn open_member_with_valid_superblock_and_garbage(sb in superblock(), seed in any::<u64>()) {
        let mut rng = SimRng(seed | 1);
        let size_blocks = 600u64;
        let mut sb = sb;
        for m in &mut sb.members {
            m.size_blocks %= size_blocks + 1;
        }
        sb.data_start_block %= size_blocks;
        let m = Arc::new(SimMember::from_image("forged", garbage(&mut rng, (size_blocks * 4096) as usize)));
        let block = sb.encode();
        m.write_at(&block, Superblock::slot_blocks(size_blocks, sb.generation)[0] * 4096).unwrap();
        let r = open_members(vec![m as Arc<dyn Member>], common::test_options(), true);
        prop_assert!(r.is_err(), "a lone member with a forged superblock opened");
    }
}

/// A superblock may describe members that are not present. Their sizes are
/// not checked against anything, and the pool allocates its segment table
/// from them: a hostile (or rotted-and-re-checksummed) superblock makes
/// open allocate without bound. The open runs in a child process limited to
/// 4 GiB of address space, so that an allocation failure (an abort, not a
/// panic) fails this test instead of killing the test binary.
#[test]
fn open_refuses_superblock_claiming_huge_missing_member() {
    const NAME: &str = "open_refuses_superblock_claiming_huge_missing_member";
    if std::env::var_os("LOGRAID_HUGE_MEMBER_CHILD").is_some() {
        huge_missing_member_open();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            NAME,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOGRAID_HUGE_MEMBER_CHILD", "1")
        .output()
        .expect("run the child test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .filter(|l| !l.starts_with("  "))
        .take(8)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "open in the child failed ({}): {tail}",
        out.status
    );
}

fn huge_missing_member_open() {
    let limit = libc::rlimit {
        rlim_cur: 4 << 30,
        rlim_max: 4 << 30,
    };
    // SAFETY: setrlimit with a valid struct only lowers this process's limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    let size_blocks = 600u64;
    let sb = Superblock {
        pool_uuid: 42,
        pool_name: "huge".into(),
        created_unix: 0,
        member_index: 0,
        generation: 5,
        parity: 1,
        chunk_blocks: 1,
        segment_blocks: 1,
        data_start_block: 256,
        members: vec![
            MemberRecord {
                uuid: 1,
                size_blocks,
                state: MemberState::Active,
            },
            // u32::MAX segments of one block each.
            MemberRecord {
                uuid: 2,
                size_blocks: 256 + 2 + u32::MAX as u64,
                state: MemberState::Active,
            },
        ],
        checkpoint: CheckpointPointer::default(),
    };
    let m = Arc::new(SimMember::new("m0", size_blocks * 4096));
    m.write_at(
        &sb.encode(),
        Superblock::slot_blocks(size_blocks, sb.generation)[0] * 4096,
    )
    .unwrap();
    let r = open_members(vec![m as Arc<dyn Member>], common::test_options(), true);
    assert!(r.is_err());
}

// ---------------------------------------------------------------- opening pools

const POOL_MEMBER_BYTES: u64 = 4 << 20;

/// A closed (3,1) pool's member images, with some data in "vol".
fn closed_pool_images(seed: u64) -> Vec<Vec<u8>> {
    let pool = common::SimPool::create(3, 1, POOL_MEMBER_BYTES, 0.2);
    let mut data = vec![0u8; 64 * 1024];
    for (i, s) in data.chunks_mut(512).enumerate() {
        common::sector_pattern(seed, i as u64, s);
    }
    pool.volume().write(0, &data).unwrap();
    pool.pool().close().unwrap();
    pool.sims.iter().map(|s| s.snapshot()).collect()
}

fn members_of(images: &[Vec<u8>]) -> Vec<Arc<SimMember>> {
    images
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img.clone())))
        .collect()
}

fn dyn_members(sims: &[Arc<SimMember>]) -> Vec<Arc<dyn Member>> {
    sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect()
}

fn open(sims: &[Arc<SimMember>]) -> lograid::Result<lograid::Pool> {
    open_members(dyn_members(sims), common::test_options(), false)
}

/// The open was refused with a refusal `expected` accepts.
fn expect_refused(
    r: lograid::Result<lograid::Pool>,
    expected: impl Fn(&Refusal) -> bool,
    what: &str,
) {
    match r {
        Err(Error::Refused(refusal)) => {
            assert!(expected(&refusal), "{what}: refused with {refusal:?}")
        }
        Err(e) => panic!("{what}: expected a refusal, got {e:?}"),
        Ok(_) => panic!("{what}: opened"),
    }
}

fn not_a_member(r: &Refusal) -> bool {
    matches!(
        r,
        Refusal::NotAMember { .. } | Refusal::NoSuperblock { .. } | Refusal::NowHolds { .. }
    )
}

#[test]
fn open_garbage_members_is_refused() {
    let mut rng = SimRng(99);
    let sims: Vec<Arc<SimMember>> = (0..3)
        .map(|i| {
            Arc::new(SimMember::from_image(
                &format!("g{i}"),
                garbage(&mut rng, POOL_MEMBER_BYTES as usize),
            ))
        })
        .collect();
    expect_refused(open(&sims), not_a_member, "garbage");
}

#[test]
fn open_zeroed_members_is_refused() {
    let sims: Vec<Arc<SimMember>> = (0..3)
        .map(|i| Arc::new(SimMember::new(&format!("z{i}"), POOL_MEMBER_BYTES)))
        .collect();
    expect_refused(open(&sims), not_a_member, "zeroes");
}

#[test]
fn open_with_no_members_or_tiny_members() {
    assert!(matches!(open(&[]), Err(Error::InvalidArgument(_))));
    let tiny = vec![Arc::new(SimMember::new("tiny", 4096 * 100))];
    expect_refused(
        open(&tiny),
        |r| matches!(r, Refusal::TooSmallForAMember { .. }),
        "tiny member",
    );
    let odd = vec![Arc::new(SimMember::new("odd", 1000))];
    expect_refused(
        open(&odd),
        |r| matches!(r, Refusal::TooSmallForAMember { .. }),
        "odd-sized member",
    );
}

fn slot_offsets(image_len: usize) -> [u64; 4] {
    let blocks = image_len as u64 / 4096;
    [0, 4096, (blocks - 2) * 4096, (blocks - 1) * 4096]
}

#[test]
fn open_member_with_all_superblock_slots_corrupt_is_an_error() {
    let images = closed_pool_images(1);
    // Whole slots flipped: the magic is gone.
    let sims = members_of(&images);
    for off in slot_offsets(images[1].len()) {
        sims[1].corrupt(off, BLOCK_SIZE);
    }
    expect_refused(
        open(&sims),
        |r| matches!(r, Refusal::NotAMember { drive } | Refusal::NoSuperblock { drive } if drive == "sim1"),
        "all slots flipped",
    );
    // A few bytes flipped inside each slot: the CRC catches it.
    let sims = members_of(&images);
    for off in slot_offsets(images[1].len()) {
        sims[1].corrupt(off + 100, 4);
    }
    match open(&sims) {
        Err(Error::Format {
            context,
            cause: FormatError::BadChecksum { .. },
        }) => {
            assert!(
                context.contains("sim1"),
                "context names the member: {context}"
            )
        }
        Err(e) => panic!("expected a checksum error naming sim1, got {e:?}"),
        Ok(_) => panic!("opened with a member whose superblocks are all corrupt"),
    }
}

#[test]
fn open_survives_some_superblock_slots_corrupt() {
    let images = closed_pool_images(2);
    // Front slots of every member gone: the tail slots carry the pool.
    let sims = members_of(&images);
    for s in &sims {
        s.corrupt(0, 2 * BLOCK_SIZE);
    }
    let pool = open(&sims).expect("opens from the tail slots");
    let mut buf = vec![0u8; 512];
    pool.volume("vol").unwrap().read(512, &mut buf).unwrap();
    let mut want = vec![0u8; 512];
    common::sector_pattern(2, 1, &mut want);
    assert_eq!(buf, want);
    pool.close().unwrap();
    // Newest generation gone on one member (both ends): the others carry it.
    let images = closed_pool_images(3);
    let sims = members_of(&images);
    let newest = read_superblock(sims[0].as_ref()).unwrap().generation;
    let [a, b] = Superblock::slot_blocks(images[0].len() as u64 / 4096, newest);
    sims[0].corrupt(a * 4096, BLOCK_SIZE);
    sims[0].corrupt(b * 4096, BLOCK_SIZE);
    assert_eq!(
        read_superblock(sims[0].as_ref()).unwrap().generation,
        newest - 1
    );
    let pool = open(&sims).expect("opens");
    pool.volume("vol").unwrap().read(0, &mut buf).unwrap();
    common::sector_pattern(3, 0, &mut want);
    assert_eq!(buf, want);
}

#[test]
fn open_members_of_two_pools_is_refused() {
    let a = members_of(&closed_pool_images(4));
    let b = members_of(&closed_pool_images(5));
    let mixed = vec![a[0].clone(), a[1].clone(), b[2].clone()];
    expect_refused(
        open(&mixed),
        |r| matches!(r, Refusal::AnotherPool { .. }),
        "two pools",
    );
    // All of another pool's members with one of ours.
    let mixed = vec![b[0].clone(), a[1].clone(), b[1].clone(), b[2].clone()];
    expect_refused(
        open(&mixed),
        |r| matches!(r, Refusal::AnotherPool { .. }),
        "one stray member",
    );
}

#[test]
fn open_same_member_twice_is_refused() {
    let a = members_of(&closed_pool_images(6));
    let twice = vec![a[0].clone(), a[0].clone(), a[1].clone()];
    match open(&twice) {
        Err(Error::InvalidArgument(_)) => {}
        Err(e) => panic!("expected InvalidArgument(given twice), got {e:?}"),
        Ok(_) => panic!("opened with a member given twice"),
    }
    // A copy of a member (same bytes, another drive) is the same member too.
    let copy = Arc::new(SimMember::from_image("copy-of-sim0", a[0].snapshot()));
    let twice = vec![a[0].clone(), copy, a[1].clone(), a[2].clone()];
    assert!(matches!(open(&twice), Err(Error::InvalidArgument(_))));
}

/// Writes the ext4 superblock magic where ext2/3/4 keep it (byte 1080) and
/// a plausible first block (mkfs zeroes the first 1 KiB and writes the
/// superblock at 1024).
fn stamp_ext4(m: &SimMember) {
    let mut head = vec![0u8; 4096];
    head[1024..1028].copy_from_slice(&65536u32.to_le_bytes()); // s_inodes_count
    head[1028..1032].copy_from_slice(&262144u32.to_le_bytes()); // s_blocks_count
    head[1048..1052].copy_from_slice(&2u32.to_le_bytes()); // s_log_block_size: 4 KiB
    head[1080..1082].copy_from_slice(&0xEF53u16.to_le_bytes()); // s_magic
    m.write_at(&head, 0).unwrap();
    m.write_at(&vec![0u8; 4096], 4096).unwrap(); // group descriptors
}

#[test]
fn open_ext4_member_is_refused() {
    let sims: Vec<Arc<SimMember>> = (0..3)
        .map(|i| Arc::new(SimMember::new(&format!("e{i}"), POOL_MEMBER_BYTES)))
        .collect();
    for s in &sims {
        stamp_ext4(s);
    }
    expect_refused(open(&sims), not_a_member, "ext4");
    // Creating a pool on a file holding ext4 is refused without force.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ext4.img");
    let m = SimMember::new("x", POOL_MEMBER_BYTES);
    stamp_ext4(&m);
    std::fs::write(&path, m.snapshot()).unwrap();
    match lograid::open_new_members(&[path], None, false) {
        Err(Error::Refused(Refusal::HoldsData { holds, .. })) => {
            assert!(holds.contains("ext2/3/4"), "{holds}")
        }
        Err(e) => panic!("expected HoldsData(ext2/3/4), got {e:?}"),
        Ok(_) => panic!("accepted a drive holding ext4"),
    }
}

/// A pool member that was later formatted with ext4 keeps its tail
/// superblock slots (mkfs does not write the last blocks), so it still
/// reads as a member. The design says a drive that "holds something that
/// is not a lograid member is refused unless the user forces it".
#[test]
fn open_former_member_now_ext4_is_refused() {
    let images = closed_pool_images(7);
    let sims = members_of(&images);
    stamp_ext4(&sims[2]);
    sims[2].flush().unwrap();
    match open(&sims) {
        Err(Error::Refused(Refusal::NowHolds { drive, holds })) => {
            assert!(drive == "sim2" && holds.contains("ext"), "{drive}: {holds}")
        }
        Err(e) => panic!("expected NowHolds naming ext4, got {e:?}"),
        Ok(_) => panic!("opened a pool with a member that now holds ext4"),
    }
}

#[test]
fn open_with_too_many_members_missing_is_refused() {
    let a = members_of(&closed_pool_images(8));
    expect_refused(
        open(&a[..1]),
        |r| {
            matches!(r, Refusal::TooFewMembers { needed: 2, members: 3, missing, .. }
                if missing.len() == 2)
        },
        "two missing",
    );
}

/// Creating a pool whose name does not fit in the superblock must be an
/// error, not a panic (Superblock::encode asserts the block does not overflow).
#[test]
fn create_pool_with_overlong_name_is_an_error() {
    let sims: Vec<Arc<dyn Member>> = (0..3)
        .map(|i| Arc::new(SimMember::new(&format!("n{i}"), POOL_MEMBER_BYTES)) as Arc<dyn Member>)
        .collect();
    let opts = lograid::CreateOptions {
        name: "n".repeat(4000),
        parity: 1,
        chunk_bytes: 16 * 1024,
        segment_bytes: Some(64 * 1024),
        force: true,
        initial_volume: None,
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lograid::create_pool(sims, &opts, common::test_options()).map(|_| ())
    }));
    match r {
        Ok(Err(Error::InvalidArgument(_))) => {}
        Ok(other) => panic!("expected InvalidArgument, got {other:?}"),
        Err(_) => panic!("create_pool panicked"),
    }
}

// ---------------------------------------------------------------- FORMAT.md tables

/// One documented field: offset expression, size, name.
struct DocField {
    offset: String,
    size: String,
    name: String,
}

/// The rows of the table under the heading that contains `heading`
/// (`| Offset | Size | Field | ... |`).
fn doc_table(doc: &str, heading: &str) -> Vec<DocField> {
    let start = doc
        .lines()
        .position(|l| l.starts_with('#') && l.contains(heading))
        .unwrap_or_else(|| panic!("FORMAT.md has no heading with {heading:?}"));
    let mut out = Vec::new();
    let mut in_table = false;
    for line in doc.lines().skip(start + 1) {
        if line.starts_with('#') {
            break;
        }
        let t = line.trim();
        if !t.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        in_table = true;
        let cells: Vec<String> = t
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_string())
            .collect();
        if cells.len() < 3 || cells[0] == "Offset" || cells[0].starts_with('-') {
            continue;
        }
        out.push(DocField {
            offset: cells[0].clone(),
            size: cells[1].clone(),
            name: cells[2].clone(),
        });
    }
    assert!(!out.is_empty(), "no table under {heading:?}");
    out
}

/// Evaluates `12`, `30+L`, `65+L+25n`, `N+8` style offsets.
fn eval(expr: &str, vars: &[(&str, u64)]) -> Option<u64> {
    let mut total = 0u64;
    for term in expr.split('+') {
        let term = term.trim();
        if let Ok(v) = term.parse::<u64>() {
            total += v;
            continue;
        }
        let digits: String = term.chars().take_while(|c| c.is_ascii_digit()).collect();
        let var = &term[digits.len()..];
        let coeff = if digits.is_empty() {
            1
        } else {
            digits.parse().ok()?
        };
        let (_, v) = vars.iter().find(|(n, _)| *n == var)?;
        total += coeff * v;
    }
    Some(total)
}

fn format_md() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/FORMAT.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks each documented field that `values` knows: the bytes at the
/// documented offset, of the documented size, are the value's little-endian
/// bytes. Every field in `values` must be documented.
fn check_fields(
    table: &[DocField],
    bytes: &[u8],
    vars: &[(&str, u64)],
    values: &[(&str, Vec<u8>)],
    what: &str,
) {
    for (name, want) in values {
        let f = table
            .iter()
            .find(|f| f.name == *name)
            .unwrap_or_else(|| panic!("{what}: field {name} is not documented"));
        let at = eval(&f.offset, vars)
            .unwrap_or_else(|| panic!("{what}: offset {:?} of {name}", f.offset))
            as usize;
        let size = eval(&f.size, vars)
            .unwrap_or_else(|| panic!("{what}: size {:?} of {name}", f.size))
            as usize;
        assert_eq!(size, want.len(), "{what}: documented size of {name}");
        assert_eq!(
            &bytes[at..at + size],
            &want[..],
            "{what}: {name} at documented offset {at}"
        );
    }
}

#[test]
fn format_md_row_header_offsets_match_the_encoder() {
    let doc = format_md();
    let h = sample_row_header();
    let (bytes, crc) = h.encode();
    check_row_header_fixed_fields(&doc, &h, &bytes, crc);
    check_row_header_entries(&doc, &h, &bytes);
    // Reserved bytes are zero: in the fixed part (checked with the
    // entries), and after the last entry.
    assert!(bytes[HEADER_FIXED_BYTES + 3 * 32..].iter().all(|&b| b == 0));
    // The documented CRC rule: CRC-32C of all header blocks with the CRC field as zero.
    let fixed = doc_table(&doc, "Row header: fixed part");
    let crc_at = documented_range(&fixed, "header_crc", &[], "row header");
    let mut z = bytes.clone();
    z[crc_at].fill(0);
    assert_eq!(lograid::format::crc32c(&z), crc);
}

/// Where FORMAT.md's `table` puts field `name` (with `vars` bound).
fn documented_range(
    table: &[DocField],
    name: &str,
    vars: &[(&str, u64)],
    what: &str,
) -> std::ops::Range<usize> {
    let f = table
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{what}: field {name} is not documented"));
    let at = eval(&f.offset, vars).unwrap_or_else(|| panic!("{what}: offset of {name}")) as usize;
    let size = eval(&f.size, vars).unwrap_or_else(|| panic!("{what}: size of {name}")) as usize;
    at..at + size
}

/// Every "(reserved)" range of FORMAT.md's `table` is zero in `bytes`;
/// returns how many ranges it checked.
fn check_reserved_zero(table: &[DocField], bytes: &[u8], what: &str) -> usize {
    let reserved: Vec<&DocField> = table.iter().filter(|f| f.name == "(reserved)").collect();
    for f in &reserved {
        let at = eval(&f.offset, &[]).unwrap_or_else(|| panic!("{what}: reserved offset")) as usize;
        let size = eval(&f.size, &[]).unwrap_or_else(|| panic!("{what}: reserved size")) as usize;
        assert!(
            bytes[at..at + size].iter().all(|&b| b == 0),
            "{what}: reserved bytes at {at}..{} are not zero",
            at + size
        );
    }
    reserved.len()
}

/// A row header with a distinct value in every field, and three entries.
fn sample_row_header() -> RowHeader {
    RowHeader {
        header_blocks: 1,
        kind: RowKind::Checkpoint,
        head: HeadId::Cleaner,
        pool_uuid: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
        nonce: 0x1111_2222_3333_4444,
        seq: 0x5555_6666_7777_8888,
        prev_crc: 0x9999_aaaa,
        segment: 0xbbbb_cccc,
        offset_blocks: 0x0000_dddd,
        height: 0x1234,
        data_columns: 5,
        width: 7,
        parity: 2,
        members_mask: 0b0111_1111 << 3,
        next_segment: 0x4242_4242,
        slots: 2,
        checkpoint_id: 0xfeed_f00d_0000_0001,
        checkpoint_offset: 0x0000_0010_0000_0000,
        payload_bytes: 0x0bad_cafe,
        flushed_seq: 0x5555_6666_7777_8000,
        entries: vec![
            Entry {
                kind: EntryKind::Relocated,
                volume: 0x0a0b0c0d,
                lba: 0x1122334455,
                crc: 0x66778899,
                count: 1,
                source: 0x0003_0000_0000_0123,
            },
            Entry {
                kind: EntryKind::Trim,
                volume: 7,
                lba: 99,
                crc: 0,
                count: 0x10203,
                source: 0,
            },
            Entry {
                kind: EntryKind::Payload,
                volume: 0,
                lba: 0,
                crc: 0xabcdef01,
                count: 1,
                source: 0,
            },
        ],
    }
}

/// The fixed part of the encoded header `bytes` (with CRC `crc`) is where
/// FORMAT.md says.
fn check_row_header_fixed_fields(doc: &str, h: &RowHeader, bytes: &[u8], crc: u32) {
    let fixed = doc_table(doc, "Row header: fixed part");
    let le = |v: u128, n: usize| v.to_le_bytes()[..n].to_vec();
    check_fields(
        &fixed,
        bytes,
        &[],
        &[
            ("magic", b"LGRDROW1".to_vec()),
            ("version", le(FORMAT_VERSION as u128, 4)),
            ("header_blocks", le(1, 2)),
            ("kind", vec![1]),
            ("head", vec![1]),
            ("pool_uuid", le(h.pool_uuid, 16)),
            ("nonce", le(h.nonce as u128, 8)),
            ("seq", le(h.seq as u128, 8)),
            ("prev_crc", le(h.prev_crc as u128, 4)),
            ("segment", le(h.segment as u128, 4)),
            ("offset_blocks", le(h.offset_blocks as u128, 4)),
            ("height", le(h.height as u128, 2)),
            ("data_columns", vec![5]),
            ("width", vec![7]),
            ("parity", vec![2]),
            ("members_mask", le(h.members_mask as u128, 4)),
            ("next_segment", le(h.next_segment as u128, 4)),
            ("slots", le(2, 4)),
            ("entry_count", le(3, 4)),
            ("checkpoint_id", le(h.checkpoint_id as u128, 8)),
            ("checkpoint_offset", le(h.checkpoint_offset as u128, 8)),
            ("payload_bytes", le(h.payload_bytes as u128, 4)),
            ("flushed_seq", le(h.flushed_seq as u128, 8)),
            ("header_crc", le(crc as u128, 4)),
        ],
        "row header",
    );
    assert_eq!(check_reserved_zero(&fixed, bytes, "row header"), 1);
}

/// Each entry of the encoded header `bytes` is where FORMAT.md says.
fn check_row_header_entries(doc: &str, h: &RowHeader, bytes: &[u8]) {
    let entry = doc_table(doc, "Row header: entry");
    let le = |v: u128, n: usize| v.to_le_bytes()[..n].to_vec();
    for (i, e) in h.entries.iter().enumerate() {
        let at = HEADER_FIXED_BYTES + 32 * i;
        check_fields(
            &entry,
            &bytes[at..at + 32],
            &[],
            &[
                ("kind", vec![e.kind as u8]),
                ("volume", le(e.volume as u128, 4)),
                ("lba", le(e.lba as u128, 8)),
                ("crc", le(e.crc as u128, 4)),
                ("count", le(e.count as u128, 4)),
                ("source", le(e.source as u128, 8)),
            ],
            &format!("row header entry {i}"),
        );
        let what = format!("row header entry {i}");
        assert_eq!(check_reserved_zero(&entry, &bytes[at..at + 32], &what), 1);
    }
}

#[test]
fn format_md_superblock_offsets_match_the_encoder() {
    let doc = format_md();
    let mut rng = SimRng(3);
    let mut sb = sample_superblock(&mut rng);
    sb.pool_name = "pool-ünïcode".into();
    let n = sb.members.len() as u64;
    let l = sb.pool_name.len() as u64;
    let bytes = sb.encode();
    let table = doc_table(&doc, "Superblock: fields");
    let le = |v: u128, n: usize| v.to_le_bytes()[..n].to_vec();
    let c = &sb.checkpoint;
    check_fields(
        &table,
        &bytes,
        &[("L", l), ("n", n)],
        &[
            ("magic", b"LGRDSUPR".to_vec()),
            ("version", le(FORMAT_VERSION as u128, 4)),
            ("pool_uuid", le(sb.pool_uuid, 16)),
            ("pool_name_len", le(l as u128, 2)),
            ("pool_name", sb.pool_name.as_bytes().to_vec()),
            ("created_unix", le(sb.created_unix as u128, 8)),
            ("member_index", vec![sb.member_index]),
            ("generation", le(sb.generation as u128, 8)),
            ("parity", vec![sb.parity]),
            ("chunk_blocks", le(sb.chunk_blocks as u128, 4)),
            ("segment_blocks", le(sb.segment_blocks as u128, 4)),
            ("data_start_block", le(sb.data_start_block as u128, 8)),
            ("member_count", vec![n as u8]),
            ("checkpoint.checkpoint_id", le(c.checkpoint_id as u128, 8)),
            ("checkpoint.segment", le(c.segment as u128, 4)),
            ("checkpoint.offset_blocks", le(c.offset_blocks as u128, 4)),
            ("checkpoint.first_row_crc", le(c.first_row_crc as u128, 4)),
            ("checkpoint.blob_bytes", le(c.blob_bytes as u128, 8)),
            ("checkpoint.blob_crc", le(c.blob_crc as u128, 4)),
            ("crc", bytes[4092..].to_vec()),
        ],
        "superblock",
    );
    // Member records.
    let members_at = eval(
        &table
            .iter()
            .find(|f| f.name == "members")
            .expect("members documented")
            .offset,
        &[("L", l), ("n", n)],
    )
    .unwrap() as usize;
    let rec = doc_table(&doc, "Superblock: member record");
    for (i, m) in sb.members.iter().enumerate() {
        let at = members_at + 25 * i;
        check_fields(
            &rec,
            &bytes[at..at + 25],
            &[],
            &[
                ("uuid", le(m.uuid, 16)),
                ("size_blocks", le(m.size_blocks as u128, 8)),
                (
                    "state",
                    vec![match m.state {
                        MemberState::Active => 0,
                        MemberState::Faulted => 1,
                        MemberState::Joining => 2,
                        MemberState::Removing => 3,
                        MemberState::Removed => 4,
                    }],
                ),
            ],
            &format!("member record {i}"),
        );
    }
    let end = eval("97+L+25n", &[("L", l), ("n", n)]).unwrap() as usize;
    assert!(
        bytes[end..4092].iter().all(|&b| b == 0),
        "zero padding after the checkpoint pointer"
    );
    let crc = u32::from_le_bytes(bytes[4092..].try_into().unwrap());
    let mut z = bytes.clone();
    z[4092..].fill(0);
    assert_eq!(
        lograid::format::crc32c(&z),
        crc,
        "CRC-32C of the block with the CRC field as zero"
    );
}

#[test]
fn format_md_checkpoint_prefix_offsets_match_the_encoder() {
    let doc = format_md();
    let counters = PoolCounters {
        user_bytes_written: 11,
        user_bytes_read: 12,
        relocated_blocks: 13,
        trimmed_blocks: 14,
        checkpoints: 15,
        rows_written: 16,
        short_rows: 17,
    };
    let img = CheckpointImage {
        checkpoint_id: 0x0101,
        next_seq: 0x0202,
        next_volume_id: 0x0303,
        counters,
        member_counters: vec![CounterValues {
            bytes_read: 21,
            checksum_errors: 27,
            repaired_blocks: 28,
            ..Default::default()
        }],
        volumes: vec![],
        segments: vec![],
        heads: vec![],
        rebuilds: vec![],
    };
    let bytes = encode_checkpoint(&img);
    let table = doc_table(&doc, "Checkpoint: fixed prefix");
    let le8 = |v: u64| v.to_le_bytes().to_vec();
    check_fields(
        &table,
        &bytes,
        &[],
        &[
            ("magic", b"LGRDCKPT".to_vec()),
            ("version", FORMAT_VERSION.to_le_bytes().to_vec()),
            ("checkpoint_id", le8(0x0101)),
            ("next_seq", le8(0x0202)),
            ("next_volume_id", 0x0303u32.to_le_bytes().to_vec()),
            ("counters.user_bytes_written", le8(11)),
            ("counters.user_bytes_read", le8(12)),
            ("counters.relocated_blocks", le8(13)),
            ("counters.trimmed_blocks", le8(14)),
            ("counters.checkpoints", le8(15)),
            ("counters.rows_written", le8(16)),
            ("counters.short_rows", le8(17)),
            ("member_counter_count", le8(1)),
        ],
        "checkpoint prefix",
    );
    // One member counter record of 8 u64, then the volume count (0), segment
    // count (0), head count (0) and rebuild count (0).
    assert_eq!(bytes.len(), 96 + 64 + 8 + 8 + 8 + 8);
    assert_eq!(&bytes[96..104], &le8(21)[..]);
    assert_eq!(&bytes[96 + 48..96 + 56], &le8(27)[..]);
}

/// Reads a real pool's checkpoint back from raw member images by the rules
/// FORMAT.md gives (superblock pointer, rotation of column 0, header chain,
/// payload slots, segment moves), and decodes it: the documented rules are
/// enough to find everything.
fn checkpoint_blob_by_the_documented_rules(view: &corrupt::DiskView) -> Vec<u8> {
    let ptr = view.superblock.checkpoint;
    let g = &view.geometry;
    let (mut seg, mut off) = (ptr.segment, ptr.offset_blocks);
    let mut blob = Vec::new();
    let mut prev: Option<u32> = None;
    while (blob.len() as u64) < ptr.blob_bytes {
        let row = view
            .rows
            .iter()
            .filter(|r| {
                r.geom.segment == seg
                    && r.geom.offset == off
                    && r.header.kind == RowKind::Checkpoint
            })
            .find(|r| r.header.checkpoint_id == ptr.checkpoint_id)
            .unwrap_or_else(|| panic!("no checkpoint row at segment {seg} offset {off}"));
        let h = &row.header;
        assert_eq!(h.head, HeadId::Checkpoint);
        assert_eq!(h.checkpoint_offset, blob.len() as u64);
        match prev {
            None => {
                assert_eq!(row.crc, ptr.first_row_crc, "first row's header CRC");
                assert_eq!(h.prev_crc, 0, "first checkpoint row's prev_crc");
            }
            Some(c) => assert_eq!(h.prev_crc, c),
        }
        let mut in_row = 0u64;
        for (slot, e) in h.entries.iter().enumerate() {
            assert_eq!(e.kind, EntryKind::Payload);
            let block = view.block(row.geom.slot_pba(g, slot as u32));
            assert_eq!(lograid::format::crc32c(block), e.crc);
            let take = (ptr.blob_bytes - blob.len() as u64).min(4096) as usize;
            blob.extend_from_slice(&block[..take]);
            in_row += take as u64;
        }
        assert_eq!(in_row, h.payload_bytes as u64);
        prev = Some(row.crc);
        off += h.height as u32;
        if off + g.chunk_blocks > g.segment_blocks {
            (seg, off) = (h.next_segment, 0);
        }
    }
    assert_eq!(lograid::format::crc32c(&blob), ptr.blob_crc, "blob CRC");
    blob
}

#[test]
fn format_md_checkpoint_chain_reads_back_by_the_documented_rules() {
    for (members, parity) in [(3usize, 1u8), (4, 2), (6, 3)] {
        let pool = common::SimPool::create(members, parity, 8 << 20, 0.3);
        let mut data = vec![0u8; 300 * 4096];
        for (i, s) in data.chunks_mut(512).enumerate() {
            common::sector_pattern(9, i as u64, s);
        }
        pool.volume().write(8192, &data).unwrap();
        pool.volume()
            .write_zeroes(2 * 1024 * 1024, 64 * 1024, false)
            .unwrap();
        pool.pool().close().unwrap();
        let view = corrupt::DiskView::capture(&pool.sims);
        let blob = checkpoint_blob_by_the_documented_rules(&view);
        let img = CheckpointImage::decode(&blob).expect("checkpoint decodes");
        assert_eq!(img.checkpoint_id, view.superblock.checkpoint.checkpoint_id);
        assert_eq!(img.segments.len(), view.geometry.segment_count() as usize);
        let vol = img
            .volumes
            .iter()
            .find(|v| v.name == "vol")
            .expect("volume in checkpoint");
        // Every mapped block: at its PBA with its CRC, or a zero record.
        let mut stored = 0;
        for &(lba, loc, crc) in &vol.entries {
            if loc == u64::MAX {
                assert_eq!(crc, 0);
                assert!((512..528).contains(&lba), "zero record at LBA {lba}");
                continue;
            }
            let pba = lograid::layout::Pba::decode(loc);
            assert_eq!(lograid::format::crc32c(view.block(pba)), crc, "LBA {lba}");
            let want = &data[((lba - 2) * 4096) as usize..((lba - 1) * 4096) as usize];
            assert_eq!(lograid::format::crc32c(want), crc, "LBA {lba} content");
            stored += 1;
        }
        assert_eq!(stored, 300);
        // Written on request only: seed corpora for the fuzz targets
        // (`LOGRAID_WRITE_FUZZ_SEEDS=/path/to/fuzz/corpus`).
        if let Some(dir) = std::env::var_os("LOGRAID_WRITE_FUZZ_SEEDS") {
            write_fuzz_seeds(std::path::Path::new(&dir), &view, &blob, members);
        }
    }
}

fn write_fuzz_seeds(dir: &std::path::Path, view: &corrupt::DiskView, blob: &[u8], members: usize) {
    let put = |target: &str, name: String, mode: Option<u8>, bytes: &[u8]| {
        let d = dir.join(target);
        std::fs::create_dir_all(&d).unwrap();
        let mut v = mode.map(|m| vec![m]).unwrap_or_default();
        v.extend_from_slice(bytes);
        std::fs::write(d.join(name), v).unwrap();
    };
    let sb = view.superblock.encode();
    put("superblock", format!("real-{members}"), Some(0), &sb);
    put("superblock", format!("real-{members}-forged"), Some(1), &sb);
    let mut rng = SimRng(members as u64);
    put(
        "superblock",
        format!("sample-{members}"),
        Some(0),
        &sample_superblock(&mut rng).encode(),
    );
    let mut kinds = std::collections::BTreeSet::new();
    for r in &view.rows {
        let key = (
            r.header.kind as u8,
            r.header.header_blocks,
            r.geom.data_columns,
            r.geom.height == view.geometry.chunk_blocks as u16,
        );
        if kinds.insert(key) {
            let (bytes, _) = r.header.encode();
            let name = format!(
                "real-{members}-k{}-hb{}-dc{}-full{}",
                key.0, key.1, key.2, key.3
            );
            put("row_header", name.clone(), Some(0), &bytes);
            put(
                "row_header",
                format!("{name}-forged"),
                Some(1 + 2 * ((r.header.header_blocks - 1) % 4) as u8),
                &bytes,
            );
        }
    }
    // A two-block header (150 data entries).
    let entries: Vec<Entry> = (0..150u64)
        .map(|i| Entry {
            kind: EntryKind::Data,
            volume: 1,
            lba: i * 3,
            crc: i as u32,
            count: 1,
            source: 0,
        })
        .collect();
    let big = RowHeader {
        header_blocks: header_blocks_for(entries.len()),
        kind: RowKind::Data,
        head: HeadId::User,
        pool_uuid: 7,
        nonce: 8,
        seq: 9,
        prev_crc: 10,
        segment: 11,
        offset_blocks: 12,
        height: 38,
        data_columns: 4,
        width: 5,
        parity: 1,
        members_mask: 0b11111,
        next_segment: 13,
        slots: 150,
        checkpoint_id: 0,
        checkpoint_offset: 0,
        payload_bytes: 0,
        flushed_seq: 0,
        entries,
    };
    let (bytes, _) = big.encode();
    put("row_header", "two-blocks".into(), Some(0), &bytes);
    put("row_header", "two-blocks-forged".into(), Some(3), &bytes);
    put("checkpoint", format!("real-{members}"), None, blob);
    let empty = CheckpointImage {
        checkpoint_id: 1,
        next_seq: 1,
        next_volume_id: 1,
        counters: PoolCounters::default(),
        member_counters: vec![CounterValues::default(); members],
        volumes: vec![],
        segments: vec![],
        heads: vec![HeadRecord::default(); 3],
        rebuilds: vec![],
    };
    put(
        "checkpoint",
        format!("empty-{members}"),
        None,
        &encode_checkpoint(&empty),
    );
}

// ---------------------------------------------------------------- hostile checkpoints

/// A closed (3,1) pool whose checkpoint is replaced by `edit` of it, with
/// every CRC made to match (payload entries, header chain, superblock
/// pointer): what a hostile image, or a bug that writes a bad checkpoint,
/// looks like to `open`. The blob's length must not change.
fn pool_with_forged_checkpoint(edit: impl FnOnce(&mut CheckpointImage)) -> Vec<Arc<SimMember>> {
    let pool = common::SimPool::create(3, 1, POOL_MEMBER_BYTES, 0.2);
    let data = vec![0x5au8; 64 * 1024];
    pool.volume().write(0, &data).unwrap();
    pool.pool().create_volume("vom", 1 << 20).unwrap();
    pool.pool().close().unwrap();
    let sims = members_of(&pool.sims.iter().map(|s| s.snapshot()).collect::<Vec<_>>());
    let view = corrupt::DiskView::capture(&sims);
    let blob = checkpoint_blob_by_the_documented_rules(&view);
    let mut img = CheckpointImage::decode(&blob).unwrap();
    edit(&mut img);
    let new = encode_checkpoint(&img);
    assert_eq!(new.len(), blob.len(), "the edit keeps the blob's length");
    let g = &view.geometry;
    let mut prev_crc = 0u32;
    let mut first_crc = None;
    for ri in view.checkpoint_rows() {
        let row = &view.rows[ri];
        let mut header = row.header.clone();
        let start = header.checkpoint_offset as usize;
        header.prev_crc = prev_crc;
        for (slot, e) in header.entries.iter_mut().enumerate() {
            let at = start + slot * BLOCK_SIZE;
            let mut block = vec![0u8; BLOCK_SIZE];
            let n = new.len().saturating_sub(at).min(BLOCK_SIZE);
            block[..n].copy_from_slice(&new[at..at + n]);
            e.crc = lograid::format::crc32c(&block);
            let pba = row.geom.slot_pba(g, slot as u32);
            sims[pba.member as usize]
                .write_at(&block, pba.byte_offset())
                .unwrap();
        }
        let (bytes, crc) = header.encode();
        for i in 0..header.header_blocks as u32 {
            let pba = row.geom.data_block_pba(g, i);
            let b = &bytes[i as usize * BLOCK_SIZE..(i as usize + 1) * BLOCK_SIZE];
            sims[pba.member as usize]
                .write_at(b, pba.byte_offset())
                .unwrap();
        }
        first_crc.get_or_insert(crc);
        prev_crc = crc;
    }
    for s in &sims {
        let mut sb = read_superblock(s.as_ref()).unwrap();
        sb.checkpoint.first_row_crc = first_crc.unwrap();
        sb.checkpoint.blob_crc = lograid::format::crc32c(&new);
        let size_blocks = s.size_bytes() / 4096;
        for b in Superblock::slot_blocks(size_blocks, sb.generation) {
            s.write_at(&sb.encode(), b * 4096).unwrap();
        }
    }
    sims
}

/// Opens, turning a panic into a test failure that says so.
fn open_no_panic(sims: &[Arc<SimMember>]) -> lograid::Result<lograid::Pool> {
    let members = dyn_members(sims);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open_members(members, common::test_options(), false)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        panic!("open panicked: {msg:?}")
    })
}

#[test]
fn forged_checkpoint_unchanged_opens() {
    // The forging itself is sound: an unedited checkpoint opens and reads.
    let sims = pool_with_forged_checkpoint(|_| {});
    let pool = open_no_panic(&sims).expect("opens");
    let mut buf = vec![0u8; 4096];
    pool.volume("vol").unwrap().read(4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
}

#[test]
fn forged_checkpoint_with_bad_fields_is_an_error() {
    type Edit = fn(&mut CheckpointImage);
    let cases: [(&str, Edit); 7] = [
        ("two volumes with one name", |img| {
            img.volumes[1].name = img.volumes[0].name.clone()
        }),
        ("volume id at the next id", |img| {
            img.volumes[0].id = img.next_volume_id
        }),
        ("next id below a volume's id", |img| {
            img.next_volume_id = img.volumes[0].id
        }),
        ("map points at member 9", |img| {
            let v = &mut img.volumes[0];
            v.entries[0].1 = (9u64 << 48) | 300;
        }),
        ("map points before the data area", |img| {
            img.volumes[0].entries[0].1 = 5
        }),
        ("map entries past the volume end", |img| {
            img.volumes[0].size_bytes = 4096
        }),
        ("row record past its segment", |img| {
            let s = img
                .segments
                .iter_mut()
                .find(|s| !s.rows.is_empty())
                .unwrap();
            s.rows[0].offset = 1 << 30;
        }),
    ];
    for (what, edit) in cases {
        let sims = pool_with_forged_checkpoint(edit);
        match open_no_panic(&sims) {
            Err(e) => eprintln!("{what}: {e}"),
            Ok(_) => panic!("{what}: opened"),
        }
    }
}

/// Bookkeeping a checkpoint breaks with its checksums right is refused at
/// every opening, not only with the invariant checks turned on: the test
/// runs itself again in a child process without `LOGRAID_CHECK_INVARIANTS`.
#[test]
fn forged_bookkeeping_is_refused_without_the_invariant_checks() {
    const CHILD: &str = "LOGRAID_TEST_FORGED_BOOKKEEPING_CHILD";
    const NAME: &str = "forged_bookkeeping_is_refused_without_the_invariant_checks";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env_remove("LOGRAID_CHECK_INVARIANTS")
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "child ran no test:\n{stdout}");
        eprintln!("{stderr}");
        return;
    }
    assert!(std::env::var_os("LOGRAID_CHECK_INVARIANTS").is_none());
    type Edit = fn(&mut CheckpointImage);
    // (what, the edit, what the refusal must say)
    let cases: [(&str, Edit, &str); 3] = [
        (
            "a block mapped past the rows written",
            |img| img.volumes[0].entries[0].1 += 128,
            "which is Free",
        ),
        (
            "a block mapped just before the first data block on its member",
            |img| {
                let first = img.volumes[0].entries.iter().map(|e| e.1).min().unwrap();
                img.volumes[0].entries[0].1 = first - 1;
            },
            "not a data slot",
        ),
        (
            "a row recorded one block high",
            |img| {
                let s = img.segments.iter_mut().find(|s| s.live_blocks > 0).unwrap();
                s.rows.last_mut().unwrap().height = 1;
            },
            "not a data slot",
        ),
    ];
    for (what, edit, says) in cases {
        let sims = pool_with_forged_checkpoint(edit);
        match open_no_panic(&sims) {
            Err(Error::Corrupt(m)) => {
                eprintln!("{what}: {m}");
                assert!(m.contains(says), "{what}: {m}");
                assert!(m.contains("read-only"), "{what}: no way out named: {m}");
            }
            Err(e) => panic!("{what}: refused, but not as corrupt: {e}"),
            Ok(_) => panic!("{what}: opened"),
        }
        // Read-only, it opens (to copy off what can be read), and says why.
        let pool = open_members(dyn_members(&sims), common::test_options(), true)
            .unwrap_or_else(|e| panic!("{what}: read-only: {e}"));
        let events = pool.status().events;
        assert!(
            events.iter().any(|e| e.message.contains(says)),
            "{what}: {events:?}"
        );
    }
}

#[test]
fn forged_checkpoint_with_head_out_of_range_is_an_error() {
    type Edit = fn(&mut CheckpointImage);
    let cases: [(&str, Edit); 3] = [
        ("the user head in segment 1000000", |img| {
            img.heads[0].segment = 1_000_000
        }),
        ("the cleaner head in segment 1000000", |img| {
            img.heads[1].segment = 1_000_000
        }),
        ("the user head at offset u32::MAX", |img| {
            img.heads[0].offset = u32::MAX
        }),
    ];
    for (what, edit) in cases {
        let sims = pool_with_forged_checkpoint(edit);
        if let Ok(pool) = open_no_panic(&sims) {
            // Tolerable only if nothing was lost: the head just starts afresh.
            let mut buf = vec![0u8; 4096];
            pool.volume("vol")
                .unwrap()
                .read(0, &mut buf)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(buf.iter().all(|&b| b == 0x5a), "{what}: data changed");
        }
    }
}

/// A value to put in a field of `bits` bits: an edge, a step from `was`, or
/// anything (`kind` and `any` drawn beforehand).
fn forged_value((kind, any): (u64, u64), was: u64, bits: u32) -> u64 {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let v = match kind {
        0 => 0,
        1 => max,
        2 => was.wrapping_add(1),
        3 => was.wrapping_sub(1),
        4 => any % 64,
        _ => any,
    };
    v & max
}

/// One field of the checkpoint changed to a `forged_value` (a checkpoint a
/// buggy writer could have made: its checksums are right).
fn forge_one_field(img: &mut CheckpointImage, rng: &mut SimRng) {
    let (field, sub, at) = (rng.below(16), rng.below(8), rng.next_u64());
    let drawn = (rng.below(6), rng.next_u64());
    let f = |was: u64, bits: u32| forged_value(drawn, was, bits);
    let pick = |n: usize| (at % n as u64) as usize;
    let v = &mut img.volumes[0];
    match field {
        0 => img.next_volume_id = f(img.next_volume_id.into(), 32) as u32,
        1 => img.next_seq = f(img.next_seq, 64),
        2 => v.id = f(v.id.into(), 32) as u32,
        3 => v.size_bytes = f(v.size_bytes, 64),
        4..=6 => {
            let i = pick(v.entries.len());
            let e = &mut v.entries[i];
            match sub % 3 {
                0 => e.0 = f(e.0, 64),
                1 => e.1 = f(e.1, 64),
                _ => e.2 = f(e.2.into(), 32) as u32,
            }
        }
        7..=10 => {
            let i = pick(img.segments.len());
            let s = &mut img.segments[i];
            match sub % 6 {
                0 => s.members_mask = f(s.members_mask.into(), 32) as u32,
                1 => s.parity = f(s.parity.into(), 8) as u8,
                2 => s.live_blocks = f(s.live_blocks.into(), 32) as u32,
                3 => s.fill_blocks = f(s.fill_blocks.into(), 32) as u32,
                4 => s.sealed_seq = f(s.sealed_seq, 64),
                _ => {
                    s.state = [
                        SegmentStateCode::Free,
                        SegmentStateCode::OpenUser,
                        SegmentStateCode::Sealed,
                        SegmentStateCode::ReservedUser,
                        SegmentStateCode::OpenCold,
                    ][(drawn.1 % 5) as usize]
                }
            }
        }
        11..=13 => {
            let rows: Vec<(usize, usize)> = img
                .segments
                .iter()
                .enumerate()
                .flat_map(|(s, seg)| (0..seg.rows.len()).map(move |r| (s, r)))
                .collect();
            let (s, r) = rows[pick(rows.len())];
            let g = &mut img.segments[s].rows[r];
            match sub % 7 {
                0 => g.offset = f(g.offset.into(), 32) as u32,
                1 => g.height = f(g.height.into(), 16) as u16,
                2 => g.data_columns = f(g.data_columns.into(), 8) as u8,
                3 => g.header_blocks = f(g.header_blocks.into(), 16) as u16,
                4 => g.slots = f(g.slots.into(), 32) as u32,
                5 => g.members_mask = f(g.members_mask.into(), 32) as u32,
                _ => g.seq = f(g.seq, 64),
            }
        }
        _ => {
            // A data head (the checkpoint head's record is not loaded).
            let data = [HeadId::User, HeadId::Cleaner, HeadId::Cold];
            let i = data[pick(data.len())].index();
            let Some(h) = img.heads.get_mut(i) else {
                return;
            };
            match sub % 4 {
                0 => h.segment = f(h.segment.into(), 32) as u32,
                1 => h.offset = f(h.offset.into(), 32) as u32,
                2 => h.next_segment = f(h.next_segment.into(), 32) as u32,
                _ => h.last_seq = f(h.last_seq, 64),
            }
        }
    }
}

#[test]
fn forged_checkpoint_field_edits_never_panic() {
    // Each run: one field of a valid checkpoint changed, its checksums made
    // right again. Opening may refuse it; nothing may panic, and a pool that
    // opens reads, writes and checkpoints without a panic.
    let (mut refused, mut opened) = (0, 0);
    for seed in 1..=200u64 {
        let mut rng = SimRng(seed * 0x9e37_79b9);
        // (An edit that changes the checkpoint's length, an LBA splitting a
        // run of the map, is not made: the forged blob must fit its rows.)
        let mut edited = false;
        let sims = pool_with_forged_checkpoint(|img| {
            let mut e = img.clone();
            forge_one_field(&mut e, &mut rng);
            if e != *img && encode_checkpoint(&e).len() == encode_checkpoint(img).len() {
                *img = e;
                edited = true;
            }
        });
        if !edited {
            continue;
        }
        let pool = match open_no_panic(&sims) {
            Ok(pool) => pool,
            Err(Error::Corrupt(_)) => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("seed {seed}: a forged checkpoint refused as not corrupt: {e}"),
        };
        opened += 1;
        // The engine turns a panic in a call into a read-only pool
        // (`Internal`): none may happen.
        let internal = |r: lograid::Result<()>| {
            if let Err(Error::ReadOnly(ReadOnlyReason::Internal { during, message })) = r {
                panic!("seed {seed}: a panic during {during}: {message}");
            }
        };
        if let Ok(vol) = pool.volume("vol") {
            let mut buf = vec![0u8; 64 * 1024];
            internal(vol.read(0, &mut buf));
            internal(vol.write(0, &buf[..4096]));
            internal(vol.flush());
        }
        internal(pool.checkpoint());
        internal(pool.close());
    }
    eprintln!("{refused} forged checkpoints refused, {opened} opened");
    assert!(
        refused > 20 && opened > 20,
        "{refused} refused, {opened} opened"
    );
}
