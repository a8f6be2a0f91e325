//! In-place rebuild: a drive that takes the place (the member index) of a
//! failed or missing member gets that member's columns back, rebuilt from
//! the other columns of each row, one segment at a time in the background.
//! Nothing is remapped and no row is rewritten: each live row's lost column
//! is computed and written where it was, so a rebuild reads the surviving
//! columns once and writes only the new member's share.
//!
//! Until a segment is rebuilt, the new member does not hold its old rows:
//! the segment is *stale* on it (`StaleSegments`, shared with the member's
//! `Device`, whose reads of stale segments fail at once, so every reader
//! rebuilds those columns from parity as it would a missing member's). A
//! segment stops being stale when it is rebuilt or taken anew; the stale
//! list is in every checkpoint (docs/FORMAT.md, checkpoint blob, "Rebuilds"), so
//! a rebuild resumes after a restart. While any segment is stale the member
//! counts as lost (the pool has that much less redundancy), which is what
//! `lograid status` shows as degraded and rebuilding.

use super::ledger::SegState;
use super::stripe::row_data_block;
use super::Engine;
use crate::device::{AlignedBuf, Device};
use crate::error::Result;
use crate::format::superblock::MemberState;
use crate::format::{crc32c, BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::RowGeom;
use crate::layout::{MemberIndex, SegmentIndex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Threads rebuilding groups of rows of a segment at once (one while users
/// are doing I/O).
const REBUILD_WORKERS: usize = 3;
/// Blocks per member a group of rows spans at most (2 MiB).
const GROUP_BLOCKS: u32 = 512;

/// What rebuilding one segment did.
struct SegmentRebuild {
    /// Live bytes of the segment (what the rebuild made safe again).
    live_bytes: u64,
    /// Rows whose lost column could not be rebuilt (more columns lost than
    /// the parity covers).
    lost_rows: u64,
}

impl Engine {
    /// Members taking a failed member's place (not ones leaving or failed
    /// again) with segments not rebuilt onto them yet, as a mask.
    pub(crate) fn rebuilding_members(&self, ledger: &super::ledger::Ledger) -> u32 {
        (0..ledger.members.len())
            .filter(|&m| {
                self.shape.stale[m].count() > 0
                    && matches!(
                        ledger.members[m].state,
                        MemberState::Active | MemberState::Joining
                    )
                    && self.device(MemberIndex(m)).is_some()
            })
            .fold(0, |mask, m| mask | 1 << m)
    }

    /// (segments, live bytes) still stale on members rebuilt in place.
    pub(crate) fn stale_left(&self, ledger: &super::ledger::Ledger) -> (u64, u64) {
        let rebuilding = self.rebuilding_members(ledger);
        let mut left = (0, 0);
        for m in (0..ledger.members.len()).filter(|m| rebuilding & (1 << m) != 0) {
            for s in self.shape.stale[m].list() {
                left.0 += 1;
                left.1 += ledger.segments[s as usize].live_blocks as u64 * BLOCK_BYTES;
            }
        }
        left
    }

    /// Rebuilds one stale segment onto its member. False when there is none
    /// to do: no member is being rebuilt in place, or what is left could not
    /// be rebuilt (tried again once the pool is reopened or its members
    /// change). The caller holds `maintenance`.
    pub(crate) fn rebuild_in_place_step(&self) -> Result<bool> {
        let (m, s) = {
            let ledger = self.ledger.lock();
            let rebuilding = self.rebuilding_members(&ledger);
            let stuck = &self.reshape.lock().stuck;
            let next = (0..ledger.members.len())
                .filter(|m| rebuilding & (1 << m) != 0)
                .find_map(|m| {
                    let list = self.shape.stale[m].list();
                    list.into_iter()
                        .find(|s| !stuck.contains(s))
                        .map(|s| (MemberIndex(m), SegmentIndex(s)))
                });
            let Some(next) = next else {
                return Ok(false);
            };
            super::ledger::check_writable(&ledger)?;
            next
        };
        let started = Instant::now();
        self.reshape.lock().started.get_or_insert(started);
        let Some(done) = self.rebuild_segment(m, s)? else {
            return Ok(false);
        };
        if done.lost_rows > 0 {
            // Its column stays unrebuilt (the member stays counted as lost)
            // and the segment is not tried again while the pool is open.
            self.reshape.lock().stuck.insert(s.0);
            self.event(format!(
                "rebuild of member {m}: segment {s}: {} row(s) have more columns lost than parity; \
                 left unrebuilt (their blocks read as errors until a missing member is back)",
                done.lost_rows
            ));
        } else if self.shape.stale[m.0].count() == 0 {
            self.ledger.lock().checkpoint_wanted = true;
            self.event(format!(
                "member {m} ({}) rebuilt: every row is whole again",
                self.member_name(m)
            ));
        }
        let mut r = self.reshape.lock();
        r.segments_done += 1;
        r.bytes_moved += done.live_bytes;
        r.busy_seconds += started.elapsed().as_secs_f64();
        Ok(true)
    }

    /// Rebuilds member `m`'s columns of segment `s` in place and, if every
    /// row could be rebuilt, marks the segment no longer stale. None if `m`
    /// can no longer be written (it failed meanwhile).
    fn rebuild_segment(&self, m: MemberIndex, s: SegmentIndex) -> Result<Option<SegmentRebuild>> {
        // The segment cannot be freed and reused while its column is written.
        let _r = self.reuse.read();
        let (rows, live_blocks) = {
            let ledger = self.ledger.lock();
            let seg = &ledger.segments[s.slot()];
            // Taken anew since it was picked (its bit is clear then), or
            // holding no row over `m`: nothing old to rebuild in it.
            if !self.shape.stale[m.0].contains(s.0)
                || matches!(seg.state, SegState::Free | SegState::Reserved(_))
                || seg.members_mask & m.bit() == 0
            {
                drop(ledger);
                self.shape.stale[m.0].clear(s.0);
                return Ok(Some(SegmentRebuild {
                    live_bytes: 0,
                    lost_rows: 0,
                }));
            }
            // Rows still being written are written whole (the member was in
            // place before they were sealed: the replacement's checkpoint
            // waited for every row in flight then); rows a head adds later
            // too. So a segment a head still writes in is rebuilt as well.
            let rows: Vec<RowGeom> = seg
                .rows
                .read()
                .iter()
                .filter(|r| r.member_column(m.0 as u8).is_some_and(|c| r.column_used(c)))
                .filter(|r| !ledger.inflight.iter().any(|f| f.geom == **r))
                .copied()
                .collect();
            (rows, seg.live_blocks as u64)
        };
        let Some(dev) = self.device(m) else {
            return Ok(None);
        };
        // Groups of consecutive rows, rebuilt by a few workers at once so
        // that one group's reads overlap another's decoding and writing.
        let mut groups: Vec<&[RowGeom]> = Vec::new();
        let mut at = 0;
        while at < rows.len() {
            let mut n = 1;
            let mut blocks = rows[at].height as u32;
            while at + n < rows.len()
                && rows[at + n].offset == rows[at + n - 1].offset + rows[at + n - 1].height as u32
                && blocks + rows[at + n].height as u32 <= GROUP_BLOCKS
            {
                blocks += rows[at + n].height as u32;
                n += 1;
            }
            groups.push(&rows[at..at + n]);
            at += n;
        }
        let workers = if self.reshape.lock().users_busy {
            1
        } else {
            REBUILD_WORKERS
        };
        let next = AtomicUsize::new(0);
        let results: Vec<std::io::Result<u64>> = crate::sync::thread::scope(|scope| {
            let workers: Vec<_> = (0..workers.min(groups.len()))
                .map(|_| {
                    let (groups, next, dev) = (&groups, &next, &dev);
                    scope.spawn(move || -> std::io::Result<u64> {
                        let mut lost = 0;
                        while let Some(group) = groups.get(next.fetch_add(1, Ordering::SeqCst)) {
                            lost += self.rebuild_group(m, s, dev, group)?;
                        }
                        Ok(lost)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("rebuild worker"))
                .collect()
        });
        let mut lost_rows = 0;
        for r in results {
            match r {
                Ok(lost) => lost_rows += lost,
                Err(e) => {
                    self.fault_member(m, "a rebuild write", e)?;
                    return Ok(None);
                }
            }
        }
        if lost_rows == 0 {
            self.shape.stale[m.0].clear(s.0);
        }
        Ok(Some(SegmentRebuild {
            live_bytes: live_blocks * BLOCK_BYTES,
            lost_rows,
        }))
    }

    /// Rebuilds member `m`'s column of consecutive rows of segment `s`:
    /// reads the other members' range of them (one read each), rebuilds and
    /// checks each row, writes what it rebuilt (one write). Returns the rows
    /// it could not rebuild; an error if `m` could not be written.
    fn rebuild_group(
        &self,
        m: MemberIndex,
        s: SegmentIndex,
        dev: &Device,
        rows: &[RowGeom],
    ) -> std::io::Result<u64> {
        let geometry = &self.shape.geometry;
        let first = rows[0].offset;
        let last = &rows[rows.len() - 1];
        let span = (last.offset + last.height as u32 - first) as usize * BLOCK_SIZE;
        let base = (geometry.segment_base(s.0) + first as u64) * BLOCK_BYTES;
        let mask = rows[0].members_mask & !m.bit();
        let slices: Vec<(MemberIndex, Option<AlignedBuf>)> = MemberIndex::all_in(mask)
            .map(|j| {
                let buf = self.device(j).and_then(|d| {
                    let mut buf = AlignedBuf::zeroed(span);
                    d.read_at(&mut buf, base).ok().map(|_| buf)
                });
                (j, buf)
            })
            .collect();
        let slice_of = |member: u8| -> Option<&[u8]> {
            slices
                .iter()
                .find(|(j, _)| *j == MemberIndex(member as usize))
                .and_then(|(_, b)| b.as_deref())
        };
        let mut out = AlignedBuf::zeroed(span);
        // Byte ranges of `out` rebuilt (rows are back to back).
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut lost = 0;
        for geom in rows {
            let at = (geom.offset - first) as usize * BLOCK_SIZE;
            let len = geom.height as usize * BLOCK_SIZE;
            match self.rebuild_row(geom, m, |member| slice_of(member).map(|b| &b[at..at + len])) {
                Some(column) => {
                    out[at..at + len].copy_from_slice(&column);
                    match runs.last_mut() {
                        Some((_, end)) if *end == at => *end = at + len,
                        _ => runs.push((at, at + len)),
                    }
                }
                // A second bad column: the row is checked block by block and
                // what can be rebuilt is written to `m` as it goes.
                None => {
                    if !self.repair_row(geom) {
                        lost += 1;
                    }
                }
            }
        }
        for (at, end) in runs {
            super::faults::with_retries(|| dev.write_at(&out[at..end], base + at as u64))?;
        }
        Ok(lost)
    }

    /// Member `m`'s column of a row, rebuilt from the row's other columns
    /// (`column_of(member)`: that member's bytes of the row, None if
    /// unreadable), after checking the header and every slot of the row
    /// against their checksums. None if they do not all check out.
    fn rebuild_row<'a>(
        &self,
        geom: &RowGeom,
        m: MemberIndex,
        column_of: impl Fn(u8) -> Option<&'a [u8]>,
    ) -> Option<AlignedBuf> {
        let target = geom.member_column(m.0 as u8)?;
        let len = geom.height as usize * BLOCK_SIZE;
        let mut columns: Vec<Option<AlignedBuf>> = (0..geom.width())
            .map(|c| {
                if c == target || !geom.column_used(c) {
                    return None;
                }
                let bytes = column_of(geom.column_member(c))?;
                let mut buf = AlignedBuf::zeroed(len);
                buf.copy_from_slice(bytes);
                Some(buf)
            })
            .collect();
        if !super::stripe::rebuild_missing_columns(geom, &mut columns, len) {
            return None;
        }
        let header = self.header_from_columns(geom, &columns)?;
        let hb = geom.header_blocks as usize;
        let all_good = header
            .entries
            .iter()
            .filter(|e| e.kind.owns_slot())
            .enumerate()
            .all(|(j, e)| {
                row_data_block(geom, &columns, hb + j).is_some_and(|b| crc32c(b) == e.crc)
            });
        if !all_good {
            return None;
        }
        columns[target].take()
    }

    /// Checks a row block by block and rewrites what it can rebuild (the
    /// scrub's repair). True if nothing was left unrepaired.
    fn repair_row(&self, geom: &RowGeom) -> bool {
        match self.load_known_row(geom) {
            Some(row) => self.check_row(&row, true).unrepairable.is_empty(),
            None => false,
        }
    }
}
