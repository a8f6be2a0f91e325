//! Member failures: a member whose write fails after its retries, whose
//! flush fails once, or whose reads keep failing is faulted (new rows go to
//! the others with full parity, reads rebuild its columns), or, past the
//! parity, the pool stops writing. Counts the members lost. Owns the retry
//! policy for member writes; a flush is never retried.

use super::ledger::Ledger;
use super::Engine;
use crate::error::ReadOnlyReason;
use crate::error::{Error, Result};
use crate::format::superblock::MemberState;
use crate::layout::MemberIndex;
use std::sync::atomic::Ordering;

impl Engine {
    /// A member failed `what` after its retries: fault it (new rows go to
    /// the others with full parity; reads rebuild its columns), or, if that
    /// would leave more members lost than the pool has parity, stop writing.
    pub(crate) fn fault_member(&self, m: MemberIndex, what: &str, e: std::io::Error) -> Result<()> {
        let name = self
            .device(m)
            .map(|d| d.member.describe())
            .unwrap_or_else(|| "-".into());
        let mut ledger = self.ledger.lock();
        let state = ledger.members.get(m.0).map(|r| r.state);
        if !matches!(
            state,
            Some(MemberState::Active | MemberState::Joining | MemberState::Removing)
        ) || (state == Some(MemberState::Removing) && self.device(m).is_none())
        {
            return Ok(()); // already faulted: its columns are not counted on
        }
        // (A member rebuilt in place may count as lost already.)
        let lost = self.lost_members(&ledger) + u32::from(!self.is_lost(&ledger, m));
        if lost > self.shape.parity() as u32 {
            let reason = ReadOnlyReason::MemberFailed {
                member: m.0,
                name,
                what: what.to_string(),
                cause: e.to_string(),
                lost_before: lost - 1,
                parity: self.shape.parity(),
            };
            tracing::error!("{reason}");
            ledger.read_only_reason.get_or_insert(reason.clone());
            return Err(Error::io(reason.to_string(), e));
        }
        tracing::error!(
            "member {m} ({name}) failed {what} ({e}): faulted; \
             the pool goes on degraded, new rows use the other members with full parity"
        );
        if state != Some(MemberState::Removing) {
            ledger.members[m.0].state = MemberState::Faulted;
        }
        // Recorded faulted before any flush is acknowledged (`record_faults`).
        let uuid = ledger.members[m.0].uuid;
        if !ledger.faulted_uuids.contains(&uuid) {
            ledger.faulted_uuids.push(uuid);
        }
        // Not read or written any more: its columns are rebuilt from parity.
        if let Some(dev) = self.device(m) {
            dev.retired.store(true, Ordering::Relaxed);
        }
        self.event(format!("member {m} ({name}) faulted: {what} failed: {e}"));
        ledger.active_mask &= !m.bit();
        ledger.member_set_changed(&self.shape);
        // New rows are narrower: the pool holds less (writes of new blocks
        // get NoSpace once it is full at the new width).
        ledger.update_capacity(&self.shape);
        ledger.checkpoint_wanted = true;
        Ok(())
    }

    /// Faults members whose reads keep failing (or are too slow):
    /// `BAD_READS_TO_FAULT` in a row. Their blocks were rebuilt from parity
    /// each time; from now on they are not read at all.
    pub(crate) fn check_read_health(&self) {
        for (m, dev) in self.open_devices() {
            let bad = dev.bad_reads_in_a_row();
            if bad >= BAD_READS_TO_FAULT {
                let e = std::io::Error::other(format!("{bad} reads in a row failed or timed out"));
                if let Err(e) = self.fault_member(m, "reads", e) {
                    tracing::error!("{e}");
                }
            }
        }
    }

    /// Faults open members whose drive is gone (a deleted member file, a
    /// block device that went away): held open, they would look online
    /// until the next restart while nothing they take is safe.
    pub(crate) fn check_members_present(&self) {
        for (m, dev) in self.open_devices() {
            if let Some(why) = dev.member.gone() {
                let e = std::io::Error::other(why);
                if let Err(e) = self.fault_member(m, "a presence check", e) {
                    tracing::error!("{e}");
                }
            }
        }
    }

    fn is_lost(&self, ledger: &Ledger, m: MemberIndex) -> bool {
        let r = &ledger.members[m.0];
        r.state == MemberState::Faulted
            || (r.state.may_hold_rows()
                && (self.device(m).is_none() || self.shape.stale[m.0].count() > 0))
    }

    /// Members that may hold rows but cannot be read (all of them): faulted,
    /// gone, or taking a failed member's place with rows not yet rebuilt
    /// onto it.
    pub(crate) fn lost_members(&self, ledger: &Ledger) -> u32 {
        (0..ledger.members.len())
            .filter(|&m| self.is_lost(ledger, MemberIndex(m)))
            .count() as u32
    }
}

/// Failed or too slow reads in a row before a member is faulted.
const BAD_READS_TO_FAULT: u64 = 8;

/// Attempts at a member write before the member is faulted (a flush gets
/// one: see `device::write_cache`).
const WRITE_ATTEMPTS: u32 = 3;

/// Runs a member write `op` up to `WRITE_ATTEMPTS` times, backing off a
/// little between attempts (a transient error: a bus reset, a timeout).
/// Never for a flush: a failed flush is final.
pub(crate) fn with_retries(mut op: impl FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
    let mut attempt = 1;
    loop {
        match op() {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= WRITE_ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::warn!("member I/O failed (attempt {attempt} of {WRITE_ATTEMPTS}): {e}");
                crate::sync::thread::sleep(std::time::Duration::from_millis(10 << attempt));
                attempt += 1;
            }
        }
    }
}
