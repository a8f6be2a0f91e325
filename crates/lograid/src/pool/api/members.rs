//! The public API for changing a pool's members: adding drives, replacing
//! or removing one, changing the parity, and driving the rebuild or
//! rebalance that follows (`reshape`). Each takes `maintenance`, records
//! the new member table with a checkpoint, and leaves the data movement to
//! the engine (`pool::members`, `pool::rebuild`).

use super::super::ledger::check_writable;
use super::Pool;
use crate::device::Member;
use crate::error::{Error, Refusal, Result};
use crate::format::superblock::MemberState;
use crate::format::BLOCK_BYTES;
use crate::layout::MemberIndex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Pool {
    /// Adds members; new rows use them once the pool's superblocks record
    /// them (at once: this writes a checkpoint). Rows written before are
    /// moved to the new width in the background (rebalance). Returns the
    /// new members' indices.
    pub fn add_members(&self, members: Vec<Arc<dyn Member>>) -> Result<Vec<usize>> {
        if members.is_empty() {
            return Err(Error::InvalidArgument("no drives to add".into()));
        }
        self.engine.guarded("adding members", || {
            let _m = self.engine.maintenance.lock();
            let mut added = Vec::new();
            for m in members {
                added.push(self.engine.join_member(m, None, false)?);
            }
            self.engine.checkpoint_log_locked()?;
            let names: Vec<String> = added
                .iter()
                .map(|&i| self.engine.member_name(MemberIndex(i)))
                .collect();
            self.engine
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
        self.engine.guarded("replacing a member", || {
            let _m = self.engine.maintenance.lock();
            let state = self.engine.ledger.lock().members.get(old).map(|r| r.state);
            match state {
                Some(MemberState::Active | MemberState::Faulted | MemberState::Joining) => {}
                Some(MemberState::Removing) => {
                    return Err(Error::Refused(Refusal::MemberBusy { member: old }))
                }
                _ => return Err(Error::NotFound(format!("member {old} in this pool"))),
            }
            let old_name = self.engine.member_name(MemberIndex(old));
            // A member that failed or is gone gets its columns back in
            // place, if the new drive can hold all it held.
            let in_place = {
                let ledger = self.engine.ledger.lock();
                (ledger.members[old].state == MemberState::Faulted
                    || self.engine.device(MemberIndex(old)).is_none())
                    && new.size_bytes() / BLOCK_BYTES >= ledger.members[old].size_blocks
            };
            if in_place {
                let index = self.engine.join_member(new, Some(old), true)?;
                self.engine.checkpoint_log_locked()?;
                self.engine.event(format!(
                    "replacing member {old} ({old_name}) by {} in place; rebuilding its columns",
                    self.engine.member_name(MemberIndex(index))
                ));
                return Ok(index);
            }
            let index = self.engine.join_member(new, Some(old), false)?;
            {
                let mut ledger = self.engine.ledger.lock();
                let was = ledger.members[old].state;
                ledger.members[old].state = MemberState::Removing;
                // A healthy member leaving no longer counts; its
                // replacement (joining) does.
                ledger.update_capacity(&self.engine.shape);
                if was == MemberState::Faulted {
                    drop(ledger);
                    // Its columns are rebuilt from parity; it is not read.
                    self.engine.devices.update(|d| d[old] = None);
                }
            }
            self.engine.checkpoint_log_locked()?;
            self.engine.event(format!(
                "replacing member {old} ({old_name}) by member {index} ({}); rebuilding",
                self.engine.member_name(MemberIndex(index))
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
        self.engine.guarded("removing a member", || {
            let _m = self.engine.maintenance.lock();
            let name = self.engine.member_name(MemberIndex(m));
            let was = {
                let mut ledger = self.engine.ledger.lock();
                check_writable(&ledger)?;
                let was = match ledger.members.get(m).map(|r| r.state) {
                    Some(
                        s @ (MemberState::Active | MemberState::Faulted | MemberState::Joining),
                    ) => s,
                    Some(MemberState::Removing) => {
                        return Err(Error::Refused(Refusal::MemberBusy { member: m }))
                    }
                    _ => return Err(Error::NotFound(format!("member {m} in this pool"))),
                };
                let parity = self.engine.shape.parity() as usize;
                // (A member still being rebuilt in place does not count.)
                let rebuilding = self.engine.rebuilding_members(&ledger);
                let left = (0..ledger.members.len())
                    .filter(|&i| {
                        i != m
                            && rebuilding & (1 << i) == 0
                            && matches!(
                                ledger.members[i].state,
                                MemberState::Active | MemberState::Joining
                            )
                            && self.engine.device(MemberIndex(i)).is_some()
                    })
                    .count();
                if left < parity + 1 || left < 2 {
                    return Err(Error::Refused(Refusal::TooFewLeft {
                        member: m,
                        left,
                        parity,
                        needed: (parity + 1).max(2),
                    }));
                }
                ledger.members[m].state = MemberState::Removing;
                ledger.update_capacity(&self.engine.shape);
                // Acknowledged sub-block writes have their room reserved.
                let held = ledger.stored_blocks + ledger.overlays.unstored();
                if held > ledger.usable_blocks {
                    let (stored, usable) = (held, ledger.usable_blocks);
                    ledger.members[m].state = was;
                    ledger.update_capacity(&self.engine.shape);
                    return Err(Error::Refused(Refusal::WouldNotFitWithout {
                        member: m,
                        stored_bytes: stored * BLOCK_BYTES,
                        usable_bytes: usable * BLOCK_BYTES,
                    }));
                }
                was
            };
            self.engine.checkpoint_log_locked()?;
            if was == MemberState::Faulted {
                // Its columns are rebuilt from parity; it is not read.
                self.engine.devices.update(|d| d[m] = None);
            }
            self.engine.event(format!(
                "removing member {m} ({name}); moving its rows to the other members"
            ));
            Ok(())
        })
    }

    /// Changes the parity columns of the pool's rows (e.g. from 1 to 2 after
    /// adding a member): new rows get `parity` at once, and rows written
    /// before are moved to it in the background, like a rebalance.
    pub fn set_parity(&self, parity: u8) -> Result<()> {
        self.engine.guarded("changing the parity", || {
            let _m = self.engine.maintenance.lock();
            let old = self.engine.shape.parity();
            {
                let mut ledger = self.engine.ledger.lock();
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
                    return Err(Error::Refused(Refusal::MemberFaulted));
                }
                self.engine.shape.parity.store(parity, Ordering::SeqCst);
                ledger.update_capacity(&self.engine.shape);
                let held = ledger.stored_blocks + ledger.overlays.unstored();
                if held > ledger.usable_blocks {
                    let (stored, usable) = (held, ledger.usable_blocks);
                    self.engine.shape.parity.store(old, Ordering::SeqCst);
                    ledger.update_capacity(&self.engine.shape);
                    return Err(Error::Refused(Refusal::WouldNotFitWithParity {
                        parity,
                        stored_bytes: stored * BLOCK_BYTES,
                        usable_bytes: usable * BLOCK_BYTES,
                    }));
                }
                ledger.member_set_changed(&self.engine.shape);
            }
            self.engine.checkpoint_log_locked()?;
            self.engine.event(format!(
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
            .engine
            .ledger
            .lock()
            .members
            .get(m)
            .is_some_and(|r| r.state == MemberState::Faulted);
        if faulted {
            self.engine.devices.update(|d| {
                if let Some(slot) = d.get_mut(m) {
                    *slot = None;
                }
            });
        }
        faulted
    }

    /// Pauses or resumes the reshape (it also resumes when reopened).
    pub fn set_reshape_paused(&self, paused: bool) {
        self.engine.reshape_paused.store(paused, Ordering::SeqCst);
    }

    /// Moves reshape segments in the foreground until none is left and
    /// leaving members are removed (for tests and offline use; an open pool
    /// with its background cleaner does this by itself). `progress(done,
    /// left)` after each segment; returning false stops early.
    pub fn reshape(&self, mut progress: impl FnMut(u64, u64) -> bool) -> Result<()> {
        self.engine.guarded("reshape", || {
            // Asked for in the foreground: at full speed.
            self.engine.reshape.lock().users_busy = false;
            let mut idle_tries = 0;
            loop {
                let moved = self.engine.reshape_step()?;
                let left = self.engine.reshape_left().0;
                let done = self.engine.reshape.lock().segments_done;
                if !progress(done, left) {
                    return Ok(());
                }
                if !moved {
                    let leaving = self.engine.ledger.lock().members_in(MemberState::Removing);
                    idle_tries += 1;
                    if (leaving == 0 && left == 0) || idle_tries > 4 {
                        return Ok(());
                    }
                    // Removal waits for heads to move and checkpoints: retry now.
                    self.engine.reshape.lock().last_finish_attempt = None;
                }
            }
        })
    }
}
