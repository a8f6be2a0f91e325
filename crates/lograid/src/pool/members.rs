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

use super::ledger::{Ledger, SegState, Segment};
use super::{check_writable, Engine, Pool};
use crate::device::{AlignedBuf, Member};
use crate::error::{Error, Result};
use crate::format::row::HeadId;
use crate::format::superblock::{MemberRecord, MemberState};
use crate::format::{BLOCK_BYTES, BLOCK_SIZE, MAX_MEMBERS, TAIL_BLOCKS};
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

impl Pool {
    /// Adds members; new rows use them once the pool's superblocks record
    /// them (at once: this writes a checkpoint). Rows written before are
    /// moved to the new width in the background (rebalance). Returns the
    /// new members' indices.
    pub fn add_members(&self, members: Vec<Arc<dyn Member>>) -> Result<Vec<usize>> {
        if members.is_empty() {
            return Err(Error::InvalidArgument("no drives to add".into()));
        }
        self.inner.guarded("adding members", || {
            let _m = self.inner.maintenance.lock();
            let mut added = Vec::new();
            for m in members {
                added.push(self.inner.join_member(m, None, false)?);
            }
            self.inner.checkpoint_log_locked()?;
            let names: Vec<String> = added.iter().map(|&i| self.inner.member_name(i)).collect();
            self.inner
                .event(format!("added member(s) {}; rebalancing", names.join(", ")));
            Ok(added)
        })
    }

    /// Replaces member `old` (failed, missing or healthy) by `new`: `new`
    /// joins the pool, `old` stops getting new rows, and the rows that use
    /// `old` are moved in the background (rebuilt from parity where `old`
    /// cannot be read). `new` may be the drive `old` was, back again: it is
    /// added as a new member and gets the live data again. Returns the
    /// index of the new member.
    pub fn replace_member(&self, old: usize, new: Arc<dyn Member>) -> Result<usize> {
        self.inner.guarded("replacing a member", || {
            let _m = self.inner.maintenance.lock();
            let state = self.inner.ledger.lock().members.get(old).map(|r| r.state);
            match state {
                Some(MemberState::Active | MemberState::Faulted | MemberState::Joining) => {}
                Some(MemberState::Removing) => {
                    return Err(Error::Refused(format!(
                        "member {old} is already being replaced or removed"
                    )))
                }
                _ => return Err(Error::NotFound(format!("member {old} in this pool"))),
            }
            let old_name = self.inner.member_name(old);
            // A member that failed or is gone gets its columns back in
            // place, if the new drive can hold all it held.
            let in_place = {
                let ledger = self.inner.ledger.lock();
                (ledger.members[old].state == MemberState::Faulted
                    || self.inner.device(old).is_none())
                    && new.size_bytes() / BLOCK_BYTES >= ledger.members[old].size_blocks
            };
            if in_place {
                let index = self.inner.join_member(new, Some(old), true)?;
                self.inner.checkpoint_log_locked()?;
                self.inner.event(format!(
                    "replacing member {old} ({old_name}) by {} in place; rebuilding its columns",
                    self.inner.member_name(index)
                ));
                return Ok(index);
            }
            let index = self.inner.join_member(new, Some(old), false)?;
            {
                let mut ledger = self.inner.ledger.lock();
                let was = ledger.members[old].state;
                ledger.members[old].state = MemberState::Removing;
                // A healthy member leaving no longer counts; its
                // replacement (joining) does.
                ledger.update_capacity(&self.inner.shape);
                if was == MemberState::Faulted {
                    drop(ledger);
                    // Its columns are rebuilt from parity; it is not read.
                    self.inner.devices.write()[old] = None;
                }
            }
            self.inner.checkpoint_log_locked()?;
            self.inner.event(format!(
                "replacing member {old} ({old_name}) by member {index} ({}); rebuilding",
                self.inner.member_name(index)
            ));
            Ok(index)
        })
    }

    /// Removes member `m` (failed, missing or healthy) without a
    /// replacement: new rows leave it out at once, and the rows that use it
    /// are moved to the other members in the background (its columns
    /// rebuilt from parity where it cannot be read); it is recorded removed
    /// once nothing uses it. For a failed member this is how a pool gets its
    /// redundancy back from its free space alone, with no spare drive: the
    /// pool's free space is the spare, spread over every remaining member,
    /// and the rebuild writes to all of them at once. Refused if the other
    /// members could not hold what the pool stores, or would be too few for
    /// the parity.
    pub fn remove_member(&self, m: usize) -> Result<()> {
        self.inner.guarded("removing a member", || {
            let _m = self.inner.maintenance.lock();
            let name = self.inner.member_name(m);
            let was = {
                let mut ledger = self.inner.ledger.lock();
                check_writable(&ledger)?;
                let was = match ledger.members.get(m).map(|r| r.state) {
                    Some(
                        s @ (MemberState::Active | MemberState::Faulted | MemberState::Joining),
                    ) => s,
                    Some(MemberState::Removing) => {
                        return Err(Error::Refused(format!(
                            "member {m} is already being replaced or removed"
                        )))
                    }
                    _ => return Err(Error::NotFound(format!("member {m} in this pool"))),
                };
                let parity = self.inner.shape.parity() as usize;
                // (A member still being rebuilt in place does not count.)
                let rebuilding = self.inner.rebuilding_members(&ledger);
                let left = (0..ledger.members.len())
                    .filter(|&i| {
                        i != m
                            && rebuilding & (1 << i) == 0
                            && matches!(
                                ledger.members[i].state,
                                MemberState::Active | MemberState::Joining
                            )
                            && self.inner.device(i).is_some()
                    })
                    .count();
                if left < parity + 1 || left < 2 {
                    return Err(Error::Refused(format!(
                        "without member {m} the pool would have {left} working member(s); \
                         parity {parity} needs at least {}",
                        (parity + 1).max(2)
                    )));
                }
                ledger.members[m].state = MemberState::Removing;
                ledger.update_capacity(&self.inner.shape);
                // Acknowledged sub-block writes have their room reserved.
                let held = ledger.stored_blocks + ledger.overlays.unstored();
                if held > ledger.usable_blocks {
                    let (stored, usable) = (held, ledger.usable_blocks);
                    ledger.members[m].state = was;
                    ledger.update_capacity(&self.inner.shape);
                    return Err(Error::Refused(format!(
                        "the pool holds {} bytes; without member {m} it could hold only {} \
                         (free space or add a drive first)",
                        stored * BLOCK_BYTES,
                        usable * BLOCK_BYTES
                    )));
                }
                was
            };
            self.inner.checkpoint_log_locked()?;
            if was == MemberState::Faulted {
                // Its columns are rebuilt from parity; it is not read.
                self.inner.devices.write()[m] = None;
            }
            self.inner.event(format!(
                "removing member {m} ({name}); moving its rows to the other members"
            ));
            Ok(())
        })
    }

    /// Changes the parity columns of the pool's rows (e.g. from 1 to 2 after
    /// adding a member): new rows get `parity` at once, and rows written
    /// before are moved to it in the background, like a rebalance.
    pub fn set_parity(&self, parity: u8) -> Result<()> {
        self.inner.guarded("changing the parity", || {
            let _m = self.inner.maintenance.lock();
            let old = self.inner.shape.parity();
            {
                let mut ledger = self.inner.ledger.lock();
                check_writable(&ledger)?;
                let members = ledger.active_mask.count_ones();
                if parity as usize > crate::format::MAX_PARITY || parity as u32 >= members {
                    return Err(Error::InvalidArgument(format!(
                        "parity {parity}: must be at most {} and less than the {members} active members",
                        crate::format::MAX_PARITY
                    )));
                }
                if parity == old {
                    return Ok(());
                }
                if ledger.members_in(MemberState::Faulted) != 0 {
                    return Err(Error::Refused(
                        "a member is faulted: replace it before changing the parity".into(),
                    ));
                }
                self.inner.shape.parity.store(parity, Ordering::SeqCst);
                ledger.update_capacity(&self.inner.shape);
                let held = ledger.stored_blocks + ledger.overlays.unstored();
                if held > ledger.usable_blocks {
                    let (stored, usable) = (held, ledger.usable_blocks);
                    self.inner.shape.parity.store(old, Ordering::SeqCst);
                    ledger.update_capacity(&self.inner.shape);
                    return Err(Error::Refused(format!(
                        "the pool holds {} bytes; with parity {parity} it could hold only {} (free space or add members first)",
                        stored * BLOCK_BYTES,
                        usable * BLOCK_BYTES
                    )));
                }
                ledger.member_set_changed(&self.inner.shape);
            }
            self.inner.checkpoint_log_locked()?;
            self.inner.event(format!(
                "parity changed from {old} to {parity}; moving older rows to it"
            ));
            Ok(())
        })
    }

    /// Closes member `m` if it is faulted (so that its drive can be opened
    /// again, e.g. to re-add it with `replace_member`). False if it is not
    /// faulted.
    pub fn release_faulted_member(&self, m: usize) -> bool {
        let faulted = self
            .inner
            .ledger
            .lock()
            .members
            .get(m)
            .is_some_and(|r| r.state == MemberState::Faulted);
        if faulted {
            if let Some(slot) = self.inner.devices.write().get_mut(m) {
                *slot = None;
            }
        }
        faulted
    }

    /// Pauses or resumes the reshape (it also resumes when reopened).
    pub fn set_reshape_paused(&self, paused: bool) {
        self.inner.reshape_paused.store(paused, Ordering::SeqCst);
    }

    /// Moves reshape segments in the foreground until none is left and
    /// leaving members are removed (for tests and offline use; an open pool
    /// with its background cleaner does this by itself). `progress(done,
    /// left)` after each segment; returning false stops early.
    pub fn reshape(&self, mut progress: impl FnMut(u64, u64) -> bool) -> Result<()> {
        self.inner.guarded("reshape", || {
            // Asked for in the foreground: at full speed.
            self.inner.reshape.lock().users_busy = false;
            let mut idle_tries = 0;
            loop {
                let moved = self.inner.reshape_step()?;
                let left = self.inner.reshape_left().0;
                let done = self.inner.reshape.lock().segments_done;
                if !progress(done, left) {
                    return Ok(());
                }
                if !moved {
                    let leaving = self.inner.ledger.lock().members_in(MemberState::Removing);
                    idle_tries += 1;
                    if (leaving == 0 && left == 0) || idle_tries > 4 {
                        return Ok(());
                    }
                    // Removal waits for heads to move and checkpoints: retry now.
                    self.inner.reshape.lock().last_finish_attempt = None;
                }
            }
        })
    }
}

impl Engine {
    /// Takes `member` into the member table as `Joining` (not yet used for
    /// new segments). `replacing`: the member it replaces (its own drive may
    /// come back as its replacement); `in_place`: it takes that member's
    /// index, and the segments laid over it are stale on it until rebuilt
    /// (`rebuild.rs`). The caller holds `maintenance` and writes a
    /// checkpoint next.
    fn join_member(
        &self,
        member: Arc<dyn Member>,
        replacing: Option<usize>,
        in_place: bool,
    ) -> Result<usize> {
        check_writable(&self.ledger.lock())?;
        let name = member.describe();
        let blocks = member.size_bytes() / BLOCK_BYTES;
        let g = &self.shape.geometry;
        let min = g.data_start_block + TAIL_BLOCKS + g.segment_blocks as u64 * MIN_MEMBER_SEGMENTS;
        if blocks < min {
            return Err(Error::Refused(format!(
                "{name} is too small: {} bytes, at least {} needed",
                blocks * BLOCK_BYTES,
                min * BLOCK_BYTES
            )));
        }
        if blocks > crate::format::MAX_MEMBER_BLOCKS
            || (blocks - g.data_start_block) / g.segment_blocks as u64 > crate::format::MAX_SEGMENTS
        {
            return Err(Error::Refused(format!(
                "{name} is too large for this pool's segment size"
            )));
        }
        // (A member replaced by its own drive must have failed first: its
        // device is closed then, see `release_faulted_member`.)
        if self
            .open_devices()
            .iter()
            .any(|(_, d)| d.member.describe() == name)
        {
            return Err(Error::Refused(format!(
                "{name} is already a member of this pool"
            )));
        }
        if let Ok(sb) = super::open::read_superblock(member.as_ref()) {
            let ledger = self.ledger.lock();
            let current = ledger
                .members
                .iter()
                .enumerate()
                .find(|(_, r)| r.uuid == sb.member_uuid() && r.state != MemberState::Removed);
            if sb.pool_uuid == self.shape.pool_uuid {
                if let Some((i, _)) = current {
                    if Some(i) != replacing {
                        return Err(Error::Refused(format!("{name} is member {i} of this pool")));
                    }
                }
            } else {
                return Err(Error::Refused(format!(
                    "{name} belongs to pool '{}' ({:032x}); wipe it first to use it here",
                    sb.pool_name, sb.pool_uuid
                )));
            }
        }
        // Wipe its superblock slots: until the checkpoint records it, it
        // is not a member of anything.
        let zero = AlignedBuf::zeroed(BLOCK_SIZE);
        for b in [0, 1, blocks - TAIL_BLOCKS, blocks - TAIL_BLOCKS + 1] {
            member
                .write_at(&zero, b * BLOCK_BYTES)
                .and_then(|_| member.flush())
                .map_err(|e| Error::io(format!("wiping the superblocks of {name}"), e))?;
        }
        let mut ledger = self.ledger.lock();
        let free_slot = ledger
            .members
            .iter()
            .position(|r| r.state == MemberState::Removed);
        let index = match (in_place, replacing, free_slot) {
            (true, Some(old), _) => old,
            (true, None, _) => unreachable!("an in-place join replaces a member"),
            (false, _, Some(i)) => i,
            (false, _, None) if ledger.members.len() < MAX_MEMBERS => {
                ledger.members.push(MemberRecord {
                    uuid: 0,
                    size_blocks: 0,
                    state: MemberState::Removed,
                });
                ledger.members.len() - 1
            }
            (false, _, None) => {
                return Err(Error::Refused(format!(
                    "the pool has {MAX_MEMBERS} members, the most it can have"
                )))
            }
        };
        g.member_blocks.set(index, blocks);
        ledger.members[index] = MemberRecord {
            uuid: super::random_u128(),
            size_blocks: blocks,
            state: MemberState::Joining,
        };
        while ledger.segments.len() < g.segment_count() as usize {
            ledger.segments.push(Segment::free());
        }
        ledger.update_capacity(&self.shape);
        // Segments that could not be moved or rebuilt are tried again with
        // the new member set.
        self.reshape.lock().stuck.clear();
        if in_place {
            // Every row laid over this index so far is stale on the new
            // drive, before anyone can read it there.
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
        drop(ledger);
        {
            let mut devices = self.devices.write();
            if devices.len() <= index {
                devices.resize(index + 1, None);
            }
            devices[index] = Some(self.shape.device(index, member));
        }
        if in_place {
            // Rows sealed from now on are written to it (their writes look
            // the device up after this); rows before may not have been.
            let since = self.ledger.lock().next_seq;
            self.shape.stale[index].set_since_seq(since);
        }
        Ok(index)
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
                    && self.misshapen(ledger, s, leaving, faulted)
            })
            .collect()
    }

    /// Is segment `s` laid out otherwise than the current members and
    /// parity would lay it? Yes if it uses a member that is leaving, or
    /// (when no member is faulted) if the current members would lay it
    /// wider or with another parity.
    fn misshapen(&self, ledger: &Ledger, s: usize, leaving: u32, faulted: u32) -> bool {
        let seg = &ledger.segments[s];
        if seg.members_mask & leaving != 0 {
            return true;
        }
        let target = self
            .shape
            .geometry
            .segment_members(s as u32, ledger.active_mask);
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
            let gone = (0..ledger.members.len())
                .filter(|&m| leaving & (1 << m) != 0 && self.device(m).is_none())
                .fold(0u32, |mask, m| mask | 1 << m);
            self.reshape_todo(&ledger)
                .into_iter()
                .min_by_key(|&s| (ledger.segments[s].members_mask & gone == 0, s))
        };
        let Some(victim) = victim else {
            if self.move_misshapen_heads()? {
                return Ok(true);
            }
            return self.finish_removals();
        };
        let started = Instant::now();
        self.reshape.lock().started.get_or_insert(started);
        let moved = self.relocate_segment(victim as u32)?;
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
            [HeadId::User, HeadId::Cleaner]
                .into_iter()
                .filter(|h| {
                    let s = ledger.heads[h.index()].segment;
                    (s as usize) < ledger.segments.len()
                        && self.misshapen(ledger, s as usize, leaving, faulted)
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
                for head in [HeadId::User, HeadId::Cleaner] {
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
            let dev = self.devices.write()[m].take();
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
