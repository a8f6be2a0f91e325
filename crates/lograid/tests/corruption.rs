//! Checksums and repair, measured by their outcome on simulated members:
//! bits are flipped where the format says blocks live (found by reading the
//! member images, see common/corrupt.rs), then reads, counters and the
//! member images are checked.
//!
//! Shapes (members, parity): (3,1), (4,2), (6,3).
//! - data rot on up to P members: reads are right, the right member's
//!   `checksum_errors` and `repaired_blocks` go up by exactly the blocks
//!   rotted there, the repair is written back (and made durable by a flush);
//! - parity rot only: reads are right and nothing is counted;
//! - row header rot (with up to P columns of the row damaged): the pool
//!   reopens after a crash or a clean close and every block reads back;
//! - P+1 damaged copies of a block: the read fails with `Unrecoverable`
//!   naming the volume and the byte offset, and nothing is rewritten;
//! - dead members (up to P): degraded reads are right, also with rot.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;
#[path = "common/corrupt.rs"]
mod corrupt;

use common::{sector_pattern, test_options};
use corrupt::{block_crc, corrupt_block, corrupt_bytes, member_block, DiskView};
use lograid::device::{
    is_aligned, AlignedBuf, CounterValues, CrashMode, Member, SimMember, SimRng,
};
use lograid::format::BLOCK_SIZE;
use lograid::layout::Pba;
use lograid::{create_pool, open_members, CreateOptions, Error, Pool, RepairError, Volume};
use std::sync::Arc;

const SHAPES: [(usize, u8); 3] = [(3, 1), (4, 2), (6, 3)];
const MEMBER_BYTES: u64 = 8 << 20;
const BS: u64 = BLOCK_SIZE as u64;

/// A pool on simulated members with one volume "vol", plus what the volume
/// must read back.
struct Rig {
    sims: Vec<Arc<SimMember>>,
    pool: Pool,
    vol: Volume,
    expected: Vec<u8>,
    next_tag: u64,
}

fn as_members(sims: &[Arc<SimMember>]) -> Vec<Arc<dyn Member>> {
    sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect()
}

impl Rig {
    fn create(members: usize, parity: u8) -> Rig {
        Rig::create_chunk(members, parity, 16 * 1024)
    }

    fn create_chunk(members: usize, parity: u8, chunk_bytes: u32) -> Rig {
        let sims: Vec<Arc<SimMember>> = (0..members)
            .map(|i| {
                Arc::new(SimMember::new(
                    &format!("sim{i}"),
                    MEMBER_BYTES.max(chunk_bytes as u64 * 128),
                ))
            })
            .collect();
        let opts = CreateOptions {
            name: "corrupt".into(),
            parity,
            chunk_bytes,
            segment_bytes: Some((64 * 1024).max(4 * chunk_bytes as u64)),
            force: true,
            initial_volume: None,
        };
        let pool = create_pool(as_members(&sims), &opts, test_options()).expect("create pool");
        let vol = pool.create_volume("vol", 2 << 20).expect("create volume");
        let expected = vec![0u8; vol.size_bytes() as usize];
        Rig {
            sims,
            pool,
            vol,
            expected,
            next_tag: 1,
        }
    }

    /// Writes `len` bytes of a fresh pattern at `off` and records them.
    fn write(&mut self, off: u64, len: u64) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut data = vec![0u8; len as usize];
        for (i, sector) in data.chunks_mut(512).enumerate() {
            sector_pattern(tag, off / 512 + i as u64, sector);
        }
        self.vol.write(off, &data).expect("write");
        self.expected[off as usize..(off + len) as usize].copy_from_slice(&data);
    }

    /// A mix of short rows (small flushed writes), full rows, a sub-block
    /// write, and rows spread over several segments; everything flushed.
    fn fill(&mut self) {
        for i in 0..6u64 {
            self.write(i * 3 * BS, (1 + i % 3) * BS);
            self.vol.flush().expect("flush");
        }
        self.write(40 * BS, 96 * BS);
        self.vol.flush().expect("flush");
        self.write(200 * BS + 512, 1024);
        self.write(210 * BS, 13 * BS);
        self.vol.flush().expect("flush");
    }

    /// Reads the whole volume twice: into a 4 KiB-aligned buffer (members
    /// read straight into it, blocks checked and repaired in place), then
    /// into one that is not (members read through the engine's buffer).
    /// The first read repairs what it finds, so the second finds nothing.
    fn check_all(&self, what: &str) {
        let len = self.expected.len();
        let mut aligned = AlignedBuf::zeroed(len + 512);
        for (buf, how) in [(0, "aligned"), (512, "unaligned")] {
            let buf = &mut aligned[buf..buf + len];
            assert_eq!(is_aligned(buf), how == "aligned");
            buf.fill(0xa5);
            self.vol.read(0, buf).unwrap_or_else(|e| {
                panic!("{what}: read of the whole volume ({how} buffer) failed: {e}")
            });
            assert_same(buf, &self.expected, &format!("{what} ({how} buffer)"));
        }
    }

    fn counters(&self) -> Vec<CounterValues> {
        self.pool
            .status()
            .members
            .iter()
            .map(|m| m.counters)
            .collect()
    }

    /// Reopens from the members' images, in the order given (None: left out).
    fn reopen_from(
        images: Vec<Option<Vec<u8>>>,
        expected: Vec<u8>,
        next_tag: u64,
    ) -> lograid::Result<Rig> {
        let sims: Vec<Arc<SimMember>> = images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                Arc::new(SimMember::from_image(
                    &format!("sim{i}"),
                    img.clone().unwrap_or_default(),
                ))
            })
            .collect();
        let present: Vec<Arc<dyn Member>> = sims
            .iter()
            .zip(&images)
            .filter(|(_, i)| i.is_some())
            .map(|(s, _)| s.clone() as Arc<dyn Member>)
            .collect();
        let pool = open_members(present, test_options(), false)?;
        let vol = pool.volume("vol")?;
        Ok(Rig {
            sims,
            pool,
            vol,
            expected,
            next_tag,
        })
    }

    /// Power cut that keeps only flushed writes.
    fn crash(self) -> lograid::Result<Rig> {
        let mut rng = SimRng(1);
        let images = self
            .sims
            .iter()
            .map(|s| Some(s.crash_image(CrashMode::DropAll, &mut rng)))
            .collect();
        let (expected, tag) = (self.expected.clone(), self.next_tag);
        drop(self.vol);
        drop(self.pool);
        Rig::reopen_from(images, expected, tag)
    }

    /// Power cut, then reopen without the members in `missing`.
    fn crash_without(self, missing: &[usize]) -> lograid::Result<Rig> {
        let mut rng = SimRng(1);
        let images = self
            .sims
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (!missing.contains(&i)).then(|| s.crash_image(CrashMode::DropAll, &mut rng))
            })
            .collect();
        let (expected, tag) = (self.expected.clone(), self.next_tag);
        drop(self.vol);
        drop(self.pool);
        Rig::reopen_from(images, expected, tag)
    }

    /// The members' current images, after `close` was called.
    fn reopen_closed(self) -> lograid::Result<Rig> {
        let images = self.sims.iter().map(|s| Some(s.snapshot())).collect();
        let (expected, tag) = (self.expected.clone(), self.next_tag);
        drop(self.vol);
        drop(self.pool);
        Rig::reopen_from(images, expected, tag)
    }

    fn view(&self) -> DiskView {
        DiskView::capture(&self.sims)
    }
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: wrong bytes at volume offset {i} (block {}): got {:#04x}, want {:#04x}",
            i / BLOCK_SIZE,
            got[i],
            want[i]
        );
    }
}

/// The live blocks of "vol" as found on the members, checked against what
/// was written (every written block is found, with the right checksum).
fn live_blocks(rig: &Rig, view: &DiskView) -> Vec<corrupt::LiveBlock> {
    let live = view.live_blocks(rig.vol.id());
    let written = rig
        .expected
        .chunks(BLOCK_SIZE)
        .filter(|b| b.iter().any(|&x| x != 0))
        .count();
    assert_eq!(
        live.len(),
        written,
        "every written block is found in a row on the members"
    );
    for lb in live.values() {
        let want = &rig.expected[(lb.lba * BS) as usize..((lb.lba + 1) * BS) as usize];
        assert_eq!(
            lb.crc,
            block_crc(want),
            "row entry checksum of LBA {}",
            lb.lba
        );
        assert_eq!(
            block_crc(view.block(lb.pba)),
            lb.crc,
            "block of LBA {} at {:?}",
            lb.lba,
            lb.pba
        );
    }
    live.into_values().collect()
}

/// Flips bits in a block, varying how much: the whole block, one byte, or
/// a short run, at a place that depends on `salt`.
fn rot(sims: &[Arc<SimMember>], pba: Pba, salt: u64) {
    match salt % 3 {
        0 => corrupt_block(sims, pba),
        1 => corrupt_bytes(sims, pba, (salt as usize * 37) % BLOCK_SIZE, 1),
        _ => corrupt_bytes(sims, pba, (salt as usize * 101) % (BLOCK_SIZE - 16), 16),
    }
}

/// (checksum_errors, repaired_blocks) per member.
fn repair_counters(c: &[CounterValues]) -> Vec<(u64, u64)> {
    c.iter()
        .map(|c| (c.checksum_errors, c.repaired_blocks))
        .collect()
}

fn delta(
    after: &[CounterValues],
    before: &[CounterValues],
    f: fn(&CounterValues) -> u64,
) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| f(a) - f(b)).collect()
}

// ---------------------------------------------------------------- (a) data rot

fn data_rot(members: usize, parity: u8, bad_members: &[usize]) {
    let what = format!("({members},{parity}) data rot on members {bad_members:?}");
    let mut rig = Rig::create(members, parity);
    rig.fill();
    let view = rig.view();
    let live = live_blocks(&rig, &view);
    let mut rotted = vec![0u64; members];
    for lb in &live {
        if bad_members.contains(&(lb.pba.member as usize)) {
            rot(&rig.sims, lb.pba, lb.lba);
            rotted[lb.pba.member as usize] += 1;
        }
    }
    for &m in bad_members {
        assert!(
            rotted[m] > 0,
            "{what}: member {m} holds no live block to rot"
        );
    }
    let before = rig.counters();
    rig.check_all(&format!("{what}: first read"));
    let after = rig.counters();
    assert_eq!(
        delta(&after, &before, |c| c.checksum_errors),
        rotted,
        "{what}: checksum_errors per member"
    );
    assert_eq!(
        delta(&after, &before, |c| c.repaired_blocks),
        rotted,
        "{what}: repaired_blocks per member"
    );
    // The repair was written back to where the block lives.
    for lb in &live {
        assert_eq!(
            block_crc(&member_block(&rig.sims, lb.pba)),
            lb.crc,
            "{what}: LBA {} not rewritten",
            lb.lba
        );
    }
    // A second read finds nothing to repair.
    rig.check_all(&format!("{what}: second read"));
    assert_eq!(
        repair_counters(&rig.counters()),
        repair_counters(&after),
        "{what}: second read changed the counters"
    );
    // A flush makes the repairs durable: after a power cut nothing is left to repair.
    rig.vol.flush().expect("flush");
    let rig = rig
        .crash()
        .unwrap_or_else(|e| panic!("{what}: reopen after crash: {e}"));
    let reopened = rig.counters();
    assert!(
        reopened.iter().all(|c| c.repaired_blocks == 0),
        "{what}: recovery repaired again: {reopened:?}"
    );
    rig.check_all(&format!("{what}: read after crash"));
    let later = rig.counters();
    assert_eq!(
        delta(&later, &reopened, |c| c.checksum_errors),
        vec![0; members],
        "{what}: rot after crash"
    );
}

#[test]
fn data_rot_on_up_to_p_members_is_repaired_and_written_back() {
    for (members, parity) in SHAPES {
        for f in 1..=parity as usize {
            // Different members for each count, so every member gets its turn.
            let bad: Vec<usize> = (0..f).map(|j| (j * 2 + f) % members).collect();
            data_rot(members, parity, &bad);
        }
    }
}

/// Rot on every member at once, but at most one bad block per stripe (one
/// block position of one row): every stripe stays within P = 1, so every
/// block is repaired although no member is clean.
#[test]
fn data_rot_spread_over_all_members_one_per_stripe() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) one bad block per stripe");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        // Rot the first live block of each (row, stripe position).
        let mut seen = std::collections::HashSet::new();
        let mut rotted = vec![0u64; members];
        for lb in &live {
            let row = &view.rows[lb.row];
            let (_, blk) = row
                .geom
                .locate(&view.geometry, lb.pba)
                .expect("block in its row");
            if seen.insert((lb.row, blk)) {
                rot(&rig.sims, lb.pba, lb.lba);
                rotted[lb.pba.member as usize] += 1;
            }
        }
        assert!(
            rotted.iter().filter(|&&n| n > 0).count() == members,
            "{what}: every member got rot: {rotted:?}"
        );
        let before = rig.counters();
        rig.check_all(&what);
        let after = rig.counters();
        assert_eq!(
            delta(&after, &before, |c| c.checksum_errors),
            rotted,
            "{what}: checksum_errors"
        );
        assert_eq!(
            delta(&after, &before, |c| c.repaired_blocks),
            rotted,
            "{what}: repaired_blocks"
        );
        rig.check_all(&what);
        assert_eq!(
            repair_counters(&rig.counters()),
            repair_counters(&after),
            "{what}: second read"
        );
    }
}

/// A misdirected write: a valid block of one LBA lands where another LBA's
/// block lives. Each block is self-consistent, so only a checksum kept
/// apart from the block catches it.
#[test]
fn misdirected_block_is_caught_and_repaired() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) misdirected write");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let a = live.iter().find(|l| l.lba >= 40).unwrap();
        let b = live
            .iter()
            .find(|l| l.pba.member == a.pba.member && l.row != a.row)
            .expect("another row on the member");
        let bytes = member_block(&rig.sims, a.pba);
        rig.sims[b.pba.member as usize]
            .write_at(&bytes, b.pba.byte_offset())
            .unwrap();
        rig.sims[b.pba.member as usize].flush().unwrap();
        let before = rig.counters();
        rig.check_all(&what);
        let after = rig.counters();
        let m = b.pba.member as usize;
        assert_eq!(
            after[m].checksum_errors - before[m].checksum_errors,
            1,
            "{what}"
        );
        assert_eq!(
            after[m].repaired_blocks - before[m].repaired_blocks,
            1,
            "{what}"
        );
        assert_eq!(
            block_crc(&member_block(&rig.sims, b.pba)),
            b.crc,
            "{what}: rewritten"
        );
    }
}

// ---------------------------------------------------------------- (b) parity rot

#[test]
fn parity_rot_only_reads_fine_and_counts_nothing() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) parity rot");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let rows: std::collections::BTreeSet<usize> = live.iter().map(|l| l.row).collect();
        let mut rotted = 0;
        for &ri in &rows {
            let row = &view.rows[ri];
            for c in row.parity_columns() {
                for blk in 0..row.geom.height as usize {
                    let pba = row.pba(&view.geometry, c, blk);
                    rot(&rig.sims, pba, (ri + blk) as u64);
                    assert_ne!(
                        member_block(&rig.sims, pba),
                        view.block(pba),
                        "{what}: parity at {pba:?} rotted"
                    );
                    rotted += 1;
                }
            }
        }
        assert!(rotted > 0);
        let before = rig.counters();
        rig.check_all(&what);
        rig.check_all(&what);
        assert_eq!(
            rig.counters()
                .iter()
                .map(|c| c.checksum_errors)
                .sum::<u64>(),
            0,
            "{what}"
        );
        assert_eq!(
            repair_counters(&rig.counters()),
            repair_counters(&before),
            "{what}: parity rot changed counters on a read"
        );
    }
}

/// Rotted parity of rows written after the last checkpoint is found and
/// rewritten by recovery (it verifies every replayed row), so that a data
/// block that rots afterwards can still be rebuilt.
#[test]
fn parity_rot_is_rewritten_by_recovery() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) parity rot then crash");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let rows: std::collections::BTreeSet<usize> = live.iter().map(|l| l.row).collect();
        let mut rotted_per_member = vec![0u64; members];
        for &ri in &rows {
            let row = &view.rows[ri];
            for c in row.parity_columns() {
                for blk in 0..row.geom.height as usize {
                    let pba = row.pba(&view.geometry, c, blk);
                    corrupt_block(&rig.sims, pba);
                    rotted_per_member[pba.member as usize] += 1;
                }
            }
        }
        let rig = rig
            .crash()
            .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        let repaired: Vec<u64> = rig.counters().iter().map(|c| c.repaired_blocks).collect();
        assert_eq!(
            repaired, rotted_per_member,
            "{what}: recovery rewrote exactly the rotted parity blocks"
        );
        // Parity is right again: rot P data blocks of one stripe and read.
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let lb = live
            .iter()
            .find(|l| view.rows[l.row].geom.data_columns as usize >= parity as usize)
            .expect("row");
        let row = &view.rows[lb.row];
        let (_, blk) = row.geom.locate(&view.geometry, lb.pba).unwrap();
        let cols: Vec<usize> = (0..row.geom.data_columns as usize)
            .take(parity as usize)
            .collect();
        for &c in &cols {
            corrupt_block(&rig.sims, row.pba(&view.geometry, c, blk));
        }
        rig.check_all(&what);
    }
}

// ---------------------------------------------------------------- (c) header rot

/// Damages whole columns of every row in `rows`: column 0 (the header) and
/// `extra` more used columns, chosen per row. Returns the blocks damaged.
fn damage_rows(rig: &Rig, view: &DiskView, rows: &[usize], extra: usize) -> usize {
    let mut n = 0;
    for (j, &ri) in rows.iter().enumerate() {
        let row = &view.rows[ri];
        let used = row.used_columns();
        let mut cols = vec![0usize];
        // The others, rotating over the used columns (data or parity).
        let others: Vec<usize> = used.iter().copied().filter(|&c| c != 0).collect();
        for i in 0..extra.min(others.len()) {
            cols.push(others[(j + i) % others.len()]);
        }
        cols.sort_unstable();
        cols.dedup();
        for c in cols {
            for blk in 0..row.geom.height as usize {
                corrupt_block(&rig.sims, row.pba(&view.geometry, c, blk));
                n += 1;
            }
        }
    }
    n
}

/// The rows of `before` listed in `rows` no longer decode where they are.
fn assert_headers_unreadable(rig: &Rig, before: &DiskView, rows: &[usize], what: &str) {
    let now = rig.view();
    for &ri in rows {
        let r = &before.rows[ri];
        let still = now.rows.iter().any(|x| {
            x.geom.segment == r.geom.segment && x.geom.offset == r.geom.offset && x.crc == r.crc
        });
        assert!(
            !still,
            "{what}: header of row {} still decodes in place",
            r.header.seq
        );
    }
}

#[test]
fn header_rot_with_up_to_p_damaged_columns_recovers_after_crash() {
    for (members, parity) in SHAPES {
        for extra in 0..parity as usize {
            let what = format!("({members},{parity}) header + {extra} more columns damaged, crash");
            let mut rig = Rig::create(members, parity);
            rig.fill();
            let view = rig.view();
            let _ = live_blocks(&rig, &view);
            // Every data row was written after the last checkpoint: recovery reads them all.
            let rows: Vec<usize> = view.data_rows().map(|(i, _)| i).collect();
            assert!(rows.len() >= 8, "{what}: rows {}", rows.len());
            let damaged = damage_rows(&rig, &view, &rows, extra);
            assert_headers_unreadable(&rig, &view, &rows, &what);
            let rig = rig
                .crash()
                .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            let report = rig.pool.recovery_report().expect("report");
            assert_eq!(
                report.rows_replayed as usize,
                rows.len(),
                "{what}: rows replayed"
            );
            // Recovery verifies every replayed row and rewrites each damaged block.
            let repaired: u64 = rig.counters().iter().map(|c| c.repaired_blocks).sum();
            assert_eq!(
                repaired, damaged as u64,
                "{what}: blocks rewritten by recovery"
            );
            rig.check_all(&what);
            // Recovery rewrote the damaged blocks: the headers decode in place again.
            let healed = rig.view();
            let live = live_blocks(&rig, &healed);
            assert!(
                live.iter().all(|l| block_crc(healed.block(l.pba)) == l.crc),
                "{what}: data rewritten"
            );
        }
    }
}

#[test]
fn header_rot_with_up_to_p_damaged_columns_recovers_after_clean_close() {
    for (members, parity) in SHAPES {
        for extra in 0..parity as usize {
            let what =
                format!("({members},{parity}) header + {extra} more columns damaged, clean close");
            let mut rig = Rig::create(members, parity);
            rig.fill();
            rig.pool.close().expect("close");
            let view = rig.view();
            let _ = live_blocks(&rig, &view);
            // The checkpoint rows (read on open) and the data rows (read by the reads).
            let cp = view.checkpoint_rows();
            assert!(!cp.is_empty(), "{what}: checkpoint rows found");
            let data: Vec<usize> = view.data_rows().map(|(i, _)| i).collect();
            let rows: Vec<usize> = cp.iter().chain(&data).copied().collect();
            damage_rows(&rig, &view, &rows, extra);
            assert_headers_unreadable(&rig, &view, &rows, &what);
            let rig = rig
                .reopen_closed()
                .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            rig.check_all(&what);
        }
    }
}

/// Two damaged columns in the header's stripe of a P = 2 (or 3) pool: the
/// header block itself and a few bytes of the first parity block at the
/// same height, both past the geometry fields. Any two columns are
/// repairable with P = 2, so the row must be found after a crash.
fn header_and_parity_bytes_rot(members: usize, parity: u8, clean_close: bool) {
    let what =
        format!("({members},{parity}) header bytes + parity bytes rot, clean close: {clean_close}");
    let mut rig = Rig::create(members, parity);
    rig.fill();
    if clean_close {
        rig.pool.close().expect("close");
    }
    let view = rig.view();
    let rows: Vec<usize> = if clean_close {
        view.checkpoint_rows()
    } else {
        view.data_rows().map(|(i, _)| i).collect()
    };
    for &ri in &rows {
        let row = &view.rows[ri];
        let k = row.geom.data_capacity_columns();
        corrupt_bytes(&rig.sims, row.header_pba(&view.geometry, 0), 200, 16);
        corrupt_bytes(&rig.sims, row.pba(&view.geometry, k, 0), 200, 16);
    }
    assert_headers_unreadable(&rig, &view, &rows, &what);
    let rig = if clean_close {
        rig.reopen_closed()
    } else {
        rig.crash()
    };
    let rig = rig.unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    rig.check_all(&what);
}

#[test]
fn header_rot_plus_localized_parity_rot_after_crash() {
    for (members, parity) in [(4, 2), (6, 3)] {
        header_and_parity_bytes_rot(members, parity, false);
    }
}

#[test]
fn header_rot_plus_localized_parity_rot_in_checkpoint_after_clean_close() {
    for (members, parity) in [(4, 2), (6, 3)] {
        header_and_parity_bytes_rot(members, parity, true);
    }
}

/// The single-column case of the above works: P = 1 and only header bytes rot.
#[test]
fn header_bytes_rot_alone_recovers() {
    for (members, parity) in SHAPES {
        for clean_close in [false, true] {
            let what = format!("({members},{parity}) header bytes rot, clean close: {clean_close}");
            let mut rig = Rig::create(members, parity);
            rig.fill();
            if clean_close {
                rig.pool.close().expect("close");
            }
            let view = rig.view();
            let rows: Vec<usize> = if clean_close {
                view.checkpoint_rows()
                    .into_iter()
                    .chain(view.data_rows().map(|(i, _)| i))
                    .collect()
            } else {
                view.data_rows().map(|(i, _)| i).collect()
            };
            for &ri in &rows {
                corrupt_bytes(
                    &rig.sims,
                    view.rows[ri].header_pba(&view.geometry, 0),
                    200,
                    16,
                );
            }
            assert_headers_unreadable(&rig, &view, &rows, &what);
            let rig = if clean_close {
                rig.reopen_closed()
            } else {
                rig.crash()
            };
            let rig = rig.unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            rig.check_all(&what);
        }
    }
}

// ---------------------------------------------------------------- (d) P+1 bad copies

fn expect_unrecoverable(r: lograid::Result<()>, offset: u64, what: &str) {
    match r {
        Err(Error::Unrecoverable {
            volume,
            offset: o,
            cause,
        }) => {
            assert_eq!(volume, "vol", "{what}: volume named");
            assert_eq!(o, offset, "{what}: offset named ({cause})");
            assert!(
                matches!(
                    cause,
                    RepairError::TooManyUnreadable { .. }
                        | RepairError::NoMatchingCombination { .. }
                ),
                "{what}: {cause:?}"
            );
            let msg = Error::Unrecoverable {
                volume,
                offset: o,
                cause,
            }
            .to_string();
            assert!(
                msg.contains("'vol'") && msg.contains(&offset.to_string()),
                "{what}: message: {msg}"
            );
        }
        Err(e) => panic!("{what}: expected Unrecoverable, got {e:?}"),
        Ok(()) => panic!("{what}: read succeeded although P+1 copies are damaged"),
    }
}

/// Damages the block of `lb` and `others` at the same height of its row.
fn p_plus_one(members: usize, parity: u8, use_data_columns: bool) {
    let what =
        format!("({members},{parity}) P+1 damaged copies (data columns: {use_data_columns})");
    let mut rig = Rig::create(members, parity);
    rig.fill();
    let view = rig.view();
    let live = live_blocks(&rig, &view);
    let p = parity as usize;
    // A block whose stripe has enough used data columns for the variant.
    let lb = live
        .iter()
        .filter(|l| l.lba >= 40) // in the big write: full rows
        .find(|l| {
            let row = &view.rows[l.row];
            let (col, _) = row.geom.locate(&view.geometry, l.pba).unwrap();
            !use_data_columns || (row.geom.data_columns >= 2 && col < 2)
        })
        .expect("a suitable block");
    let row = &view.rows[lb.row];
    let (col, blk) = row.geom.locate(&view.geometry, lb.pba).unwrap();
    // The P other copies: other data columns first (for that variant), then parity.
    let others: Vec<usize> = if use_data_columns {
        (0..row.geom.data_columns as usize)
            .filter(|&c| c != col)
            .chain(row.parity_columns())
            .take(p)
            .collect()
    } else {
        row.parity_columns()
    };
    assert_eq!(others.len(), p);
    rot(&rig.sims, lb.pba, 1);
    for &c in &others {
        rot(&rig.sims, row.pba(&view.geometry, c, blk), c as u64 + 2);
    }
    let image_before = member_block(&rig.sims, lb.pba);
    let before = rig.counters();
    let offset = lb.lba * BS;
    let mut one = vec![0u8; BLOCK_SIZE];
    expect_unrecoverable(
        rig.vol.read(offset, &mut one),
        offset,
        &format!("{what}: block read"),
    );
    let mut sector = vec![0u8; 512];
    expect_unrecoverable(
        rig.vol.read(offset + 1024, &mut sector),
        offset,
        &format!("{what}: sector read"),
    );
    let mut all = vec![0u8; rig.expected.len()];
    let r = rig.vol.read(0, &mut all);
    if use_data_columns {
        // Another damaged data block of the stripe may be met first.
        assert!(
            matches!(r, Err(Error::Unrecoverable { .. })),
            "{what}: whole read: {r:?}"
        );
    } else {
        expect_unrecoverable(r, offset, &format!("{what}: whole-volume read"));
    }
    let after = rig.counters();
    assert!(
        after[lb.pba.member as usize].checksum_errors
            > before[lb.pba.member as usize].checksum_errors,
        "{what}"
    );
    assert_eq!(
        delta(&after, &before, |c| c.repaired_blocks),
        vec![0; members],
        "{what}: nothing repaired"
    );
    assert_eq!(
        member_block(&rig.sims, lb.pba),
        image_before,
        "{what}: the damaged block was rewritten"
    );
    // The rest of the row, away from the damaged stripe, still reads.
    for other in live.iter().filter(|l| l.row == lb.row) {
        let (_, b) = row.geom.locate(&view.geometry, other.pba).unwrap();
        if b != blk {
            let mut buf = vec![0u8; BLOCK_SIZE];
            rig.vol
                .read(other.lba * BS, &mut buf)
                .unwrap_or_else(|e| panic!("{what}: LBA {}: {e}", other.lba));
            assert_same(
                &buf,
                &rig.expected[(other.lba * BS) as usize..((other.lba + 1) * BS) as usize],
                &what,
            );
        }
    }
}

#[test]
fn p_plus_one_damaged_copies_fail_the_read() {
    for (members, parity) in SHAPES {
        p_plus_one(members, parity, false);
        p_plus_one(members, parity, true);
    }
}

/// With P members dead, one rotted block is one copy too many.
#[test]
fn p_dead_members_plus_rot_fails_the_read() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) P dead + rot");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let victim = live.iter().find(|l| l.lba >= 40).unwrap();
        let dead: Vec<usize> = (1..=parity as usize)
            .map(|j| (victim.pba.member as usize + j) % members)
            .collect();
        rot(&rig.sims, victim.pba, 0);
        for &d in &dead {
            rig.sims[d].set_dead(true);
        }
        let mut buf = vec![0u8; BLOCK_SIZE];
        let r = rig.vol.read(victim.lba * BS, &mut buf);
        // The victim's row may not use every dead member's column for data;
        // its stripe has P dead-or-rotted columns plus the victim at least
        // when all dead members hold used columns of that row.
        let row = &view.rows[victim.row];
        let dead_used = row
            .used_columns()
            .iter()
            .filter(|&&c| dead.contains(&(row.geom.column_member(c) as usize)))
            .count();
        if dead_used == parity as usize {
            expect_unrecoverable(r, victim.lba * BS, &what);
        } else {
            r.unwrap_or_else(|e| panic!("{what}: only {dead_used} dead columns in the row: {e}"));
        }
    }
}

/// Rot beyond parity in one stripe of a row written after the last
/// checkpoint: recovery cannot tell it from a torn write, ends the log at
/// that row, and silently drops every later row, all flushed and intact.
/// Only the damaged block should be lost (read as an error).
#[test]
fn rot_beyond_parity_in_one_replayed_row_loses_only_that_block() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) P+1 rot in the first replayed row");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let first_row = view
            .data_rows()
            .min_by_key(|(_, r)| r.header.seq)
            .map(|(i, _)| i)
            .unwrap();
        let victim = live
            .iter()
            .find(|l| l.row == first_row)
            .expect("a block in the first row")
            .clone();
        let row = &view.rows[first_row];
        let (_, blk) = row.geom.locate(&view.geometry, victim.pba).unwrap();
        corrupt_block(&rig.sims, victim.pba);
        // Each parity column rots in a different byte range: identical
        // patterns on P and Q would cancel out in P+Q and let the block be
        // rebuilt correctly (which the checksum would then rightly accept).
        let cols: Vec<usize> = row.parity_columns();
        let span = BLOCK_SIZE / cols.len();
        for (i, &c) in cols.iter().enumerate() {
            corrupt_bytes(&rig.sims, row.pba(&view.geometry, c, blk), i * span, span);
        }
        let rig = rig
            .crash()
            .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        let mut lost = Vec::new();
        for lb in live.iter().filter(|l| l.lba != victim.lba) {
            let mut buf = vec![0u8; BLOCK_SIZE];
            let want = &rig.expected[(lb.lba * BS) as usize..((lb.lba + 1) * BS) as usize];
            match rig.vol.read(lb.lba * BS, &mut buf) {
                Ok(()) if buf == want => {}
                Ok(()) | Err(Error::Unrecoverable { .. }) => lost.push(lb.lba),
                Err(e) => panic!("{what}: reading block {}: {e}", lb.lba),
            }
        }
        assert!(
            lost.is_empty(),
            "{what}: {} of {} intact flushed blocks lost: LBAs {lost:?}",
            lost.len(),
            live.len() - 1
        );
        let mut buf = vec![0u8; BLOCK_SIZE];
        expect_unrecoverable(
            rig.vol.read(victim.lba * BS, &mut buf),
            victim.lba * BS,
            &what,
        );
    }
}

// ---------------------------------------------------------------- (e) dead members

#[test]
fn dead_members_degraded_reads_are_right() {
    for (members, parity) in SHAPES {
        for f in 1..=parity as usize {
            let what = format!("({members},{parity}) {f} dead");
            let mut rig = Rig::create(members, parity);
            rig.fill();
            let dead: Vec<usize> = (0..f).map(|j| (j * 3 + 1) % members).collect();
            for &d in &dead {
                rig.sims[d].set_dead(true);
            }
            let before = rig.counters();
            rig.check_all(&what);
            rig.check_all(&what);
            let after = rig.counters();
            for &d in &dead {
                assert!(
                    after[d].io_errors > before[d].io_errors,
                    "{what}: member {d} I/O errors counted"
                );
            }
            assert_eq!(
                delta(&after, &before, |c| c.checksum_errors),
                vec![0; members],
                "{what}: no checksum errors"
            );
        }
    }
}

/// P-1 dead members and rot on one more: still every read is right.
#[test]
fn dead_members_plus_rot_within_parity() {
    for (members, parity) in SHAPES.into_iter().filter(|s| s.1 >= 2) {
        let what = format!("({members},{parity}) P-1 dead + rot on one member");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let dead: Vec<usize> = (0..parity as usize - 1).collect();
        let rotten = members - 1;
        let mut rotted = 0;
        for lb in live.iter().filter(|l| l.pba.member as usize == rotten) {
            rot(&rig.sims, lb.pba, lb.lba);
            rotted += 1;
        }
        assert!(rotted > 0);
        for &d in &dead {
            rig.sims[d].set_dead(true);
        }
        let before = rig.counters();
        rig.check_all(&what);
        let after = rig.counters();
        assert_eq!(
            after[rotten].checksum_errors - before[rotten].checksum_errors,
            rotted,
            "{what}"
        );
        assert_eq!(
            after[rotten].repaired_blocks - before[rotten].repaired_blocks,
            rotted,
            "{what}"
        );
    }
}

/// A member that vanished is left out when the pool is opened again (after
/// a power cut or a clean close): every block reads back, and new writes
/// land (on the remaining members) and survive another power cut.
#[test]
fn reopen_without_up_to_p_members() {
    for (members, parity) in SHAPES {
        for f in 1..=parity as usize {
            for clean in [false, true] {
                let what = format!(
                    "({members},{parity}) reopen without {f} member(s), clean close: {clean}"
                );
                let mut rig = Rig::create(members, parity);
                rig.fill();
                let missing: Vec<usize> = (0..f).map(|j| (members - 1 + j * 2) % members).collect();
                if clean {
                    rig.pool.close().expect("close");
                }
                let mut rig = rig
                    .crash_without(&missing)
                    .unwrap_or_else(|e| panic!("{what}: open: {e}"));
                rig.check_all(&what);
                rig.write(300 * BS, 20 * BS);
                rig.write(5 * BS, 2 * BS);
                rig.vol.flush().expect("flush while degraded");
                rig.check_all(&format!("{what}: after degraded writes"));
                let rig = rig
                    .crash_without(&missing)
                    .unwrap_or_else(|e| panic!("{what}: second open: {e}"));
                rig.check_all(&format!("{what}: after degraded writes and a crash"));
            }
        }
    }
}

// ---------------------------------------------------------------- layout

/// Full rows should spread parity over the members ("parity column rotating
/// row by row"): every member should hold data columns of some full rows.
/// With the rotation taken as `offset % width` and full rows at offsets
/// that are multiples of the chunk height, a width that divides the chunk
/// height (4 members, 16 KiB chunks = 4 blocks here; 4, 8 or 16 members
/// with the default 128 KiB chunk) never rotates.
#[test]
fn parity_rotates_over_members_in_full_rows() {
    for (members, parity) in SHAPES {
        let mut rig = Rig::create(members, parity);
        rig.write(0, 400 * BS);
        rig.vol.flush().unwrap();
        let view = rig.view();
        let mut parity_blocks = vec![0u64; members];
        for (_, row) in view.data_rows() {
            for c in row.parity_columns() {
                parity_blocks[row.geom.column_member(c) as usize] += row.geom.height as u64;
            }
        }
        assert!(
            parity_blocks.iter().all(|&n| n > 0),
            "({members},{parity}): parity blocks per member {parity_blocks:?}: some members never hold parity (and others never data)"
        );
    }
}

// ---------------------------------------------------------------- scrub

fn scrub(rig: &Rig, repair: bool) -> lograid::ScrubReport {
    let mut last = None;
    let report = rig
        .pool
        .scrub(repair, |done, total| {
            assert!(done <= total);
            if let Some((before, _)) = last {
                assert!(done >= before, "progress went back");
            }
            last = Some((done, total));
            true
        })
        .expect("scrub");
    assert!(report.complete);
    let (done, total) = last.expect("progress reported");
    assert_eq!(done, total, "the last progress report is the end");
    assert_eq!(total, report.rows_checked);
    report
}

#[test]
fn scrub_of_a_healthy_pool_reports_nothing() {
    for (members, parity) in SHAPES {
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let r = scrub(&rig, true);
        assert!(r.rows_checked > 5, "({members},{parity}): {r:?}");
        assert!(r.is_clean(), "({members},{parity}) healthy: {r:?}");
        // Also after a clean close and reopen.
        rig.pool.close().expect("close");
        let rig = rig.reopen_closed().expect("reopen");
        let r = scrub(&rig, true);
        assert!(r.is_clean(), "({members},{parity}) after reopen: {r:?}");
    }
}

#[test]
fn scrub_repairs_data_and_parity_rot_on_up_to_p_members() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) scrub");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        // Live data blocks of different stripes, and a parity block.
        let mut damaged = Vec::new();
        for (i, lb) in live.iter().enumerate().filter(|(i, _)| i % 7 == 0) {
            rot(&rig.sims, lb.pba, i as u64);
            damaged.push((lb.pba, lb.crc));
        }
        let (_, row) = view.data_rows().nth(1).expect("a second data row");
        let par = row.pba(&view.geometry, row.parity_columns()[0], 0);
        let par_before = member_block(&rig.sims, par);
        corrupt_block(&rig.sims, par);
        let r = scrub(&rig, true);
        assert!(r.lost_blocks.is_empty(), "{what}: {r:?}");
        assert!(
            r.repaired_blocks > damaged.len() as u64,
            "{what}: repaired {} of {}",
            r.repaired_blocks,
            damaged.len() + 1
        );
        for (pba, crc) in &damaged {
            assert_eq!(
                block_crc(&member_block(&rig.sims, *pba)),
                *crc,
                "{what}: {pba:?} rewritten"
            );
        }
        assert_eq!(
            member_block(&rig.sims, par),
            par_before,
            "{what}: parity rewritten"
        );
        // A second scrub finds nothing, and the data reads back without repairs.
        let r = scrub(&rig, true);
        assert!(r.is_clean(), "{what}: second scrub: {r:?}");
        let before = rig.counters();
        rig.check_all(&what);
        assert_eq!(
            repair_counters(&rig.counters()),
            repair_counters(&before),
            "{what}"
        );
    }
}

#[test]
fn scrub_names_the_blocks_it_cannot_repair_and_a_check_writes_nothing() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) scrub P+1");
        let mut rig = Rig::create(members, parity);
        rig.fill();
        let view = rig.view();
        let live = live_blocks(&rig, &view);
        let lb = live
            .iter()
            .find(|l| l.lba >= 40)
            .expect("a block in a full row");
        let row = &view.rows[lb.row];
        let (_, blk) = row.geom.locate(&view.geometry, lb.pba).unwrap();
        rot(&rig.sims, lb.pba, 1);
        for (j, c) in row.parity_columns().into_iter().enumerate() {
            rot(&rig.sims, row.pba(&view.geometry, c, blk), j as u64 + 2);
        }
        let image = member_block(&rig.sims, lb.pba);
        // A check only: reports, writes nothing.
        let r = scrub(&rig, false);
        assert_eq!(
            r.lost_blocks,
            vec![lograid::LostBlock {
                volume: "vol".into(),
                offset: lb.lba * BS
            }],
            "{what}: check"
        );
        assert_eq!(
            member_block(&rig.sims, lb.pba),
            image,
            "{what}: check wrote"
        );
        let r = scrub(&rig, true);
        assert_eq!(r.lost_blocks.len(), 1, "{what}: {r:?}");
        assert_eq!(r.lost_blocks[0].offset, lb.lba * BS, "{what}");
        assert_eq!(
            member_block(&rig.sims, lb.pba),
            image,
            "{what}: lost block rewritten"
        );
    }
}

/// A rotted (still readable) later block of a multi-block row header is
/// rebuilt from parity: found by the CLI scrub test, where such a row was
/// reported unreadable.
#[test]
fn rot_in_a_later_header_block_is_rebuilt() {
    for (members, parity) in SHAPES {
        let what = format!("({members},{parity}) later header block");
        // Rows of 2 x 64 blocks or more: headers of two blocks and more.
        let mut rig = Rig::create_chunk(members, parity, 256 * 1024);
        rig.fill();
        rig.write(64 * BS, 400 * BS);
        rig.vol.flush().expect("flush");
        let view = rig.view();
        let (_, row) = view
            .data_rows()
            .find(|(_, r)| r.geom.header_blocks > 1)
            .expect("a row with a multi-block header");
        let pba = row.header_pba(&view.geometry, 1);
        let before = member_block(&rig.sims, pba);
        corrupt_bytes(&rig.sims, pba, 100, 8);
        let r = scrub(&rig, true);
        assert_eq!(r.unreadable_rows, 0, "{what}: {r:?}");
        assert!(r.repaired_blocks >= 1, "{what}: {r:?}");
        assert_eq!(
            member_block(&rig.sims, pba),
            before,
            "{what}: header block rewritten"
        );
        rig.check_all(&what);
    }
}
