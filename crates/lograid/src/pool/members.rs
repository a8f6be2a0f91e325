//! Changing the member set of an open pool: adding members, replacing one
//! (a failed member, a healthy one, or a member that came back, re-added as
//! new), and the reshape that follows. Rows are never rewritten in place:
//! live rows laid over a member that is leaving, or narrower than the
//! current members allow, are moved by the cleaner's relocation into new
//! rows over the current members, a segment at a time, in the background.
//! Rebuild after a replace and rebalance after an add are that one reshape;
//! only live data moves. Which segments still need it follows from their
//! masks and the member table, so a reshape resumes by itself when the pool
//! is reopened.
//!
//! Member states and their order on disk (docs/FORMAT.md, "Member states"):
//! a new member is recorded `Joining` in superblocks first, and only then
//! used for new segments; a leaving member is recorded `Removing` first, and
//! only then left out of new segments. Recovery can thus tell the members a
//! segment taken after its checkpoint may have been laid over.

use super::ledger::check_writable;
use super::ledger::{Ledger, SegState, Segment};
use super::Engine;
use crate::device::{AlignedBuf, Member};
use crate::error::{Error, Refusal, Result};
use crate::format::row::HeadId;
use crate::format::superblock::{MemberRecord, MemberState};
use crate::format::{BLOCK_BYTES, BLOCK_SIZE, MAX_MEMBERS, TAIL_BLOCKS};
use crate::layout::{MemberIndex, SegmentIndex};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Segments a member must hold at least to be added.
const MIN_MEMBER_SEGMENTS: u64 = 8;

/// Progress of the reshape (rebuild or rebalance), for `lograid status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReshapeStatus {
    /// "rebuild" while a member is being replaced, else "rebalance".
    pub kind: String,
    pub paused: bool,
    /// Segments still to move, and the live bytes they hold.
    pub segments_left: u64,
    pub bytes_left: u64,
    /// Since this pool was opened.
    pub segments_done: u64,
    pub bytes_moved: u64,
    pub seconds: f64,
    /// Bytes moved per second since it started (null before the first segment).
    pub rate_bytes_per_second: Option<f64>,
    pub eta_seconds: Option<f64>,
    /// Share of the time left to user I/O while it runs and users are busy.
    pub user_share: f64,
}

impl Engine {
    /// Takes `member` into the member table as `Joining` (not yet used for
    /// new segments). `replacing`: the member it replaces (its own drive may
    /// come back as its replacement); `in_place`: it takes that member's
    /// index, and the segments laid over it are stale on it until rebuilt
    /// (`rebuild.rs`). The caller holds `maintenance` and writes a
    /// checkpoint next.
    pub(crate) fn join_member(
        &self,
        member: Arc<dyn Member>,
        replacing: Option<usize>,
        in_place: bool,
    ) -> Result<usize> {
        check_writable(&self.ledger.lock())?;
        let blocks = self.check_new_member(member.as_ref(), replacing)?;
        wipe_superblocks(member.as_ref(), blocks)?;
        let index = {
            let mut ledger = self.ledger.lock();
            let index = take_member_slot(&mut ledger, in_place, replacing)?;
            self.record_joining(&mut ledger, index, blocks, in_place);
            index
        };
        {
            let device = self.shape.device(index, member);
            self.devices.update(|devices| {
                if devices.len() <= index {
                    devices.resize(index + 1, None);
                }
                devices[index] = Some(device);
            });
        }
        if in_place {
            // Rows sealed from now on are written to it (their writes look
            // the device up after this); rows before may not have been.
            let since = self.ledger.lock().next_seq;
            self.shape.stale[index].set_since_seq(since);
        }
        Ok(index)
    }

    /// Refuses a drive that cannot join: too small or too large for the
    /// pool's geometry, open as a member already, a member of this pool
    /// (other than the one it replaces) or of another. Its size in blocks.
    fn check_new_member(&self, member: &dyn Member, replacing: Option<usize>) -> Result<u64> {
        let name = member.describe();
        let blocks = member.size_bytes() / BLOCK_BYTES;
        let g = &self.shape.geometry;
        let min = g.data_start_block + TAIL_BLOCKS + g.segment_blocks as u64 * MIN_MEMBER_SEGMENTS;
        if blocks < min {
            return Err(Error::Refused(Refusal::NewMemberTooSmall {
                drive: name,
                size_bytes: blocks * BLOCK_BYTES,
                needed_bytes: min * BLOCK_BYTES,
            }));
        }
        if blocks > crate::format::MAX_MEMBER_BLOCKS
            || (blocks - g.data_start_block) / g.segment_blocks as u64 > crate::format::MAX_SEGMENTS
        {
            return Err(Error::Refused(Refusal::NewMemberTooLarge { drive: name }));
        }
        // (A member replaced by its own drive must have failed first: its
        // device is closed then, see `release_faulted_member`.)
        if self
            .open_devices()
            .iter()
            .any(|(_, d)| d.member.describe() == name)
        {
            return Err(Error::Refused(Refusal::AlreadyOpenMember { drive: name }));
        }
        let Ok(sb) = super::open::read_superblock(member) else {
            return Ok(blocks);
        };
        if sb.pool_uuid != self.shape.pool_uuid {
            return Err(Error::Refused(Refusal::OtherPoolsMember {
                drive: name,
                pool: sb.pool_name,
                uuid: sb.pool_uuid,
            }));
        }
        let ledger = self.ledger.lock();
        let current = ledger
            .members
            .iter()
            .position(|r| r.uuid == sb.member_uuid() && r.state != MemberState::Removed);
        match current {
            Some(i) if Some(i) != replacing => Err(Error::Refused(Refusal::AlreadyMember {
                drive: name,
                member: i,
            })),
            _ => Ok(blocks),
        }
    }

    /// Records member `index` as joining with `blocks` blocks: the member
    /// table, the geometry and segment table (a larger member adds
    /// segments), the capacity, and what it does not hold yet (in place:
    /// every segment laid over its index, before anyone can read it there).
    fn record_joining(&self, ledger: &mut Ledger, index: usize, blocks: u64, in_place: bool) {
        let g = &self.shape.geometry;
        g.member_blocks.set(index, blocks);
        ledger.members[index] = MemberRecord {
            uuid: super::random_u128(),
            size_blocks: blocks,
            state: MemberState::Joining,
        };
        while ledger.segments.len() < g.segment_count() as usize {
            ledger.segments.push(Segment::free());
        }
        ledger.publish_segment_rows();
        ledger.update_capacity(&self.shape);
        // Segments that could not be moved or rebuilt are tried again with
        // the new member set.
        self.reshape.lock().stuck.clear();
        if in_place {
            let stale: Vec<u32> = (0..ledger.segments.len() as u32)
                .filter(|&s| {
                    let seg = &ledger.segments[s as usize];
                    seg.state != SegState::Free && seg.members_mask & (1 << index) != 0
                })
                .collect();
            self.shape.stale[index].reset(u64::MAX, stale);
        } else {
            // (A slot that a member rebuilt in place had may be reused.)
            self.shape.stale[index].reset(0, []);
        }
    }

    /// Sealed segments the reshape still has to move (all but those whose
    /// blocks it could not read), in order.
    fn reshape_todo(&self, ledger: &Ledger) -> Vec<usize> {
        let leaving = ledger.members_in(MemberState::Removing);
        let faulted = ledger.members_in(MemberState::Faulted);
        let reshape = self.reshape.lock();
        (0..ledger.segments.len())
            .filter(|&s| {
                ledger.segments[s].state == SegState::Sealed
                    && !reshape.stuck.contains(&(s as u32))
                    && self.misshapen(ledger, SegmentIndex(s as u32), leaving, faulted)
            })
            .collect()
    }

    /// Is segment `s` laid out otherwise than the current members and
    /// parity would lay it? Yes if it uses a member that is leaving, or
    /// (when no member is faulted) if the current members would lay it
    /// wider or with another parity.
    fn misshapen(&self, ledger: &Ledger, s: SegmentIndex, leaving: u32, faulted: u32) -> bool {
        let seg = ledger.segment(s);
        if seg.members_mask & leaving != 0 {
            return true;
        }
        let target = self.shape.geometry.segment_members(s.0, ledger.active_mask);
        faulted == 0
            && seg.members_mask & !ledger.active_mask == 0
            && (seg.members_mask != target || seg.parity != self.shape.segment_parity(target))
    }

    /// (segments, live bytes) the reshape has left to move or rebuild.
    pub(crate) fn reshape_left(&self) -> (u64, u64) {
        let ledger = self.ledger.lock();
        let todo = self.reshape_todo(&ledger);
        let bytes: u64 = todo
            .iter()
            .map(|&s| ledger.segments[s].live_blocks as u64 * BLOCK_BYTES)
            .sum();
        let (stale, stale_bytes) = self.stale_left(&ledger);
        (todo.len() as u64 + stale, bytes + stale_bytes)
    }

    /// Moves one segment that needs it; when none is left, finishes the
    /// removal of members no segment uses any more. False when there is
    /// nothing (more) to do now.
    pub(crate) fn reshape_step(&self) -> Result<bool> {
        let _m = self.maintenance.lock();
        // Members rebuilt in place come first: until then the pool has less
        // redundancy than its parity.
        if self.rebuild_in_place_step()? {
            self.checkpoint_log_if_due_locked()?;
            return Ok(true);
        }
        let victim = {
            let ledger = self.ledger.lock();
            check_writable(&ledger)?;
            // Segments over a leaving member that cannot be read first
            // (they are the ones at risk), then the rest in order.
            let leaving = ledger.members_in(MemberState::Removing);
            let gone = MemberIndex::all_in(leaving)
                .filter(|&m| self.device(m).is_none())
                .fold(0u32, |mask, m| mask | m.bit());
            self.reshape_todo(&ledger)
                .into_iter()
                .min_by_key(|&s| (ledger.segments[s].members_mask & gone == 0, s))
        };
        let Some(victim) = victim else {
            if self.move_misshapen_heads()? {
                // A head moved without a row: only a checkpoint records where
                // it went. Recorded now, before the segment it left can be
                // emptied and taken by another head (a power cut would
                // otherwise bring it back there, over that head's rows).
                self.checkpoint_log_locked()?;
                return Ok(true);
            }
            return self.finish_removals();
        };
        let started = Instant::now();
        self.reshape.lock().started.get_or_insert(started);
        let head = self.ledger.lock().head_for_moved_block(victim as u32);
        let moved = self.relocate_segment(victim as u32, head)?.blocks;
        let left = self.ledger.lock().segments[victim].live_blocks;
        if left > 0 {
            // Blocks beyond what parity can rebuild stay where they are
            // (reads of them fail loudly); the segment is not tried again
            // while the pool is open.
            self.reshape.lock().stuck.insert(victim as u32);
            self.event(format!(
                "rebuild: segment {victim}: {left} block(s) could not be read or rebuilt; left in place"
            ));
        }
        self.checkpoint_log_if_due_locked()?;
        let mut r = self.reshape.lock();
        r.segments_done += 1;
        r.bytes_moved += moved * BLOCK_BYTES;
        r.busy_seconds += started.elapsed().as_secs_f64();
        Ok(true)
    }

    /// Log heads still writing into a segment of the old shape are moved to
    /// a new one (their open rows sealed first), so that what they wrote
    /// there can be moved too. True if one moved.
    fn move_misshapen_heads(&self) -> Result<bool> {
        let heads = |ledger: &Ledger| -> Vec<HeadId> {
            let leaving = ledger.members_in(MemberState::Removing);
            let faulted = ledger.members_in(MemberState::Faulted);
            HeadId::DATA
                .into_iter()
                .filter(|h| {
                    let s = ledger.heads[h.index()].segment;
                    (s as usize) < ledger.segments.len()
                        && self.misshapen(ledger, SegmentIndex(s), leaving, faulted)
                })
                .collect()
        };
        if heads(&self.ledger.lock()).is_empty() {
            return Ok(false);
        }
        self.flush_log()?;
        let mut ledger = self.ledger.lock();
        let mut moved = false;
        for head in heads(&ledger) {
            let before = ledger.heads[head.index()].segment;
            // No free segment now: tried again later.
            let _ = ledger.move_head_off(head, &self.shape);
            moved |= ledger.heads[head.index()].segment != before;
        }
        Ok(moved)
    }

    /// Members being removed that no segment uses any more become empty
    /// slots: recorded as removed, their superblocks wiped (if they can be
    /// written), dropped. Writes a checkpoint first so that segments
    /// emptied by the reshape are released. True if it did anything.
    fn finish_removals(&self) -> Result<bool> {
        let leaving = self.ledger.lock().members_in(MemberState::Removing);
        if leaving == 0 {
            return Ok(false);
        }
        let in_use = |ledger: &Ledger| {
            ledger
                .segments
                .iter()
                .filter(|s| !matches!(s.state, SegState::Free))
                .fold(0u32, |m, s| m | s.members_mask)
        };
        if in_use(&self.ledger.lock()) & leaving != 0 {
            {
                let mut r = self.reshape.lock();
                if r.last_finish_attempt
                    .is_some_and(|t| t.elapsed().as_secs() < 5)
                {
                    return Ok(false);
                }
                r.last_finish_attempt = Some(Instant::now());
            }
            // Open rows are sealed; heads still in segments over leaving
            // members move on (what they leave behind is sealed and moved
            // by the next step); emptied segments wait for a checkpoint,
            // the previous checkpoint's segments for the next one.
            self.checkpoint_log_locked()?;
            {
                let mut ledger = self.ledger.lock();
                for head in HeadId::DATA {
                    if ledger
                        .segments
                        .get(ledger.heads[head.index()].segment as usize)
                        .is_some_and(|seg| seg.members_mask & leaving != 0)
                    {
                        // No free segment now: tried again later.
                        let _ = ledger.move_head_off(head, &self.shape);
                    }
                }
            }
            self.checkpoint_log_locked()?;
            self.checkpoint_log_locked()?;
        }
        let done = {
            let mut ledger = self.ledger.lock();
            let done = leaving & !in_use(&ledger);
            for m in 0..MAX_MEMBERS {
                if done & (1 << m) != 0 {
                    ledger.members[m].state = MemberState::Removed;
                    ledger.members[m].size_blocks = 0;
                    self.shape.geometry.member_blocks.set(m, 0);
                }
            }
            ledger.update_capacity(&self.shape);
            done
        };
        if done == 0 {
            return Ok(false);
        }
        self.checkpoint_log_locked()?;
        for m in 0..MAX_MEMBERS {
            if done & (1 << m) == 0 {
                continue;
            }
            let dev = self.devices.update(|devices| devices[m].take());
            let name = dev.as_ref().map(|d| d.member.describe());
            if let Some(dev) = dev {
                // So that it is not taken for a member when given again.
                let blocks = dev.member.size_bytes() / BLOCK_BYTES;
                let zero = AlignedBuf::zeroed(BLOCK_SIZE);
                for b in [0, 1, blocks - TAIL_BLOCKS, blocks - TAIL_BLOCKS + 1] {
                    let _ = dev.write_at(&zero, b * BLOCK_BYTES);
                }
                let _ = dev.sync();
            }
            self.event(format!(
                "member {m} ({}) removed: no row uses it any more",
                name.unwrap_or_else(|| "missing".into())
            ));
        }
        Ok(true)
    }

    /// The reshape's progress, if one is under way.
    pub(crate) fn reshape_status(&self) -> Option<ReshapeStatus> {
        let (segments_left, bytes_left) = self.reshape_left();
        let leaving = {
            let ledger = self.ledger.lock();
            ledger.members_in(MemberState::Removing) != 0 || self.stale_left(&ledger).0 > 0
        };
        if segments_left == 0 && !leaving {
            return None;
        }
        let r = self.reshape.lock();
        let seconds = r.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = (seconds > 0.0 && r.bytes_moved > 0).then(|| r.bytes_moved as f64 / seconds);
        Some(ReshapeStatus {
            kind: if leaving { "rebuild" } else { "rebalance" }.into(),
            paused: self.reshape_paused.load(Ordering::Relaxed),
            segments_left,
            bytes_left,
            segments_done: r.segments_done,
            bytes_moved: r.bytes_moved,
            seconds,
            rate_bytes_per_second: rate,
            eta_seconds: rate.map(|x| bytes_left as f64 / x),
            user_share: 1.0 - self.options.reshape_share,
        })
    }
}

/// Zeroes a joining drive's superblock slots: until the checkpoint records
/// it, it is not a member of anything.
fn wipe_superblocks(member: &dyn Member, blocks: u64) -> Result<()> {
    let zero = AlignedBuf::zeroed(BLOCK_SIZE);
    for b in [0, 1, blocks - TAIL_BLOCKS, blocks - TAIL_BLOCKS + 1] {
        member
            .write_at(&zero, b * BLOCK_BYTES)
            .and_then(|_| member.flush())
            .map_err(|e| {
                Error::io(
                    format!("wiping the superblocks of {}", member.describe()),
                    e,
                )
            })?;
    }
    Ok(())
}

/// The member index a joining drive takes: the one it replaces in place, a
/// removed member's, or a new one (at most `MAX_MEMBERS`).
fn take_member_slot(
    ledger: &mut Ledger,
    in_place: bool,
    replacing: Option<usize>,
) -> Result<usize> {
    if in_place {
        return Ok(replacing.expect("an in-place join replaces a member"));
    }
    if let Some(i) = ledger
        .members
        .iter()
        .position(|r| r.state == MemberState::Removed)
    {
        return Ok(i);
    }
    if ledger.members.len() >= MAX_MEMBERS {
        return Err(Error::Refused(Refusal::TooManyMembers { max: MAX_MEMBERS }));
    }
    ledger.members.push(MemberRecord {
        uuid: 0,
        size_blocks: 0,
        state: MemberState::Removed,
    });
    Ok(ledger.members.len() - 1)
}
