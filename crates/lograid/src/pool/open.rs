//! Opening a pool: find the members by their superblocks, load the newest
//! checkpoint, and roll the log forward along each head's chain of rows
//! written after it. The work grows with what was written since the
//! checkpoint, not with the size of the pool. Rows are located and verified
//! even with members missing: a header on a missing or corrupt member is
//! rebuilt from the other columns of its row.

use super::stats::RecoveryReport;
use super::{random_u64, Engine, PoolOptions, Shape};
use crate::device::{AlignedBuf, Device, Member};
use crate::error::ReadOnlyReason;
use crate::error::{Error, Refusal, Result};
use crate::format::checkpoint::CheckpointImage;
use crate::format::superblock::{MemberRecord, MemberState, Superblock};
use crate::format::{BLOCK_BYTES, BLOCK_SIZE};
use crate::layout::{Geometry, MemberSizes};
use std::sync::Arc;
use std::time::Instant;

/// The newest valid superblock on a member (of its four slots).
pub fn read_superblock(member: &dyn Member) -> Result<Superblock> {
    let size_blocks = member.size_bytes() / BLOCK_BYTES;
    if size_blocks < crate::format::DATA_START_BLOCK + 4 {
        return Err(Error::Refused(Refusal::TooSmallForAMember {
            drive: member.describe(),
        }));
    }
    let mut best: Option<Superblock> = None;
    let mut first_error = None;
    let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
    for g in 0..2 {
        for b in Superblock::slot_blocks(size_blocks, g) {
            if let Err(e) = member.read_at(&mut buf, b * BLOCK_BYTES) {
                first_error.get_or_insert(Error::io(
                    format!("reading superblock of {}", member.describe()),
                    e,
                ));
                continue;
            }
            match Superblock::decode(&buf) {
                Ok(sb) if best.as_ref().is_none_or(|x| sb.generation > x.generation) => {
                    best = Some(sb)
                }
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(Error::format(
                        format!("superblock of {}", member.describe()),
                        e,
                    ));
                }
            }
        }
    }
    best.ok_or_else(|| {
        first_error.unwrap_or_else(|| {
            Error::Refused(Refusal::NotAMember {
                drive: member.describe(),
            })
        })
    })
}

/// Refuses a drive whose start now holds something else (e.g. a filesystem
/// made over a former member whose tail superblocks survived).
fn refuse_foreign_contents(member: &dyn Member) -> Result<()> {
    let mut head = AlignedBuf::zeroed(128 * 1024);
    let len = head
        .len()
        .min(member.size_bytes() as usize / BLOCK_SIZE * BLOCK_SIZE);
    if member.read_at(&mut head[..len], 0).is_err() {
        return Ok(());
    }
    match crate::device::signature_in(&head[..len]) {
        Some(what) if what != crate::device::LOGRAID_SIGNATURE => {
            Err(Error::Refused(Refusal::NowHolds {
                drive: member.describe(),
                holds: what.to_string(),
            }))
        }
        _ => Ok(()),
    }
}

/// Opens the engine of a pool from its members (any order; missing members
/// are allowed up to the parity count). `read_only` opens without writing
/// anything. (`open_members` wraps it.)
pub(crate) fn open_engine(
    members: Vec<Arc<dyn Member>>,
    options: PoolOptions,
    read_only: bool,
) -> Result<Arc<Engine>> {
    let started = Instant::now();
    if members.is_empty() {
        return Err(Error::InvalidArgument("no drives given".into()));
    }
    let found = read_superblocks(members)?;
    let newest = found
        .iter()
        .max_by_key(|(_, sb)| sb.generation)
        .map(|(_, sb)| sb.clone())
        .expect("at least one member");
    let slots = place_members(found, &newest)?;
    let table = MembersAtOpen::new(&newest, &slots)?;
    let shape = shape_of(&newest)?;
    let devices: Vec<Option<Arc<Device>>> = slots
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.map(|m| shape.device(i, m)))
        .collect();
    let engine = Arc::new(Engine::new(
        shape,
        table.members,
        devices,
        options,
        table.active_mask,
        newest.generation,
    ));
    let report = engine.recover(&newest, started, table.missing, table.joining, read_only)?;
    tracing::info!(
        "pool '{}': checkpoint {} loaded, {} rows ({} blocks) replayed, bookkeeping checked in {:.3} s, opened in {:.3} s",
        engine.shape.pool_name,
        report.checkpoint_id,
        report.rows_replayed,
        report.blocks_replayed,
        report.checked.as_secs_f64(),
        report.duration.as_secs_f64()
    );
    *engine.recovery_report.lock() = Some(report);
    if read_only {
        engine.ledger.lock().read_only_reason = Some(ReadOnlyReason::Opened);
    }
    Ok(engine)
}

/// Each drive's newest superblock; a drive with none (or that now holds
/// something else) is refused.
fn read_superblocks(members: Vec<Arc<dyn Member>>) -> Result<Vec<(Arc<dyn Member>, Superblock)>> {
    let mut found = Vec::with_capacity(members.len());
    for m in members {
        let sb = member_superblock(m.as_ref())?;
        found.push((m, sb));
    }
    Ok(found)
}

/// A drive's newest superblock, if it is a lograid member and holds
/// nothing else now.
fn member_superblock(m: &dyn Member) -> Result<Superblock> {
    refuse_foreign_contents(m)?;
    read_superblock(m).map_err(|e| match e {
        Error::Format {
            cause: crate::format::FormatError::BadMagic,
            ..
        } => Error::Refused(Refusal::NoSuperblock {
            drive: m.describe(),
        }),
        other => other,
    })
}

/// The drives by member index, as the newest superblock's member table
/// places them; a drive of another pool, a removed or unknown member, one
/// given twice or one smaller than it was is refused.
fn place_members(
    found: Vec<(Arc<dyn Member>, Superblock)>,
    newest: &Superblock,
) -> Result<Vec<Option<Arc<dyn Member>>>> {
    let mut slots: Vec<Option<Arc<dyn Member>>> = vec![None; newest.members.len()];
    for (m, sb) in found {
        let i = member_slot(m.as_ref(), &sb, newest, &slots)?;
        slots[i] = Some(m);
    }
    Ok(slots)
}

/// Where the pool `newest` describes places a drive whose superblock is
/// `sb`, given the drives already placed in `slots`.
fn member_slot(
    m: &dyn Member,
    sb: &Superblock,
    newest: &Superblock,
    slots: &[Option<Arc<dyn Member>>],
) -> Result<usize> {
    if sb.pool_uuid != newest.pool_uuid {
        return Err(Error::Refused(Refusal::AnotherPool {
            drive: m.describe(),
            found: sb.pool_uuid,
            expected: newest.pool_uuid,
        }));
    }
    let i = sb.member_index as usize;
    let recorded = newest.members.get(i).filter(|r| r.uuid == sb.member_uuid());
    if recorded.is_some_and(|r| r.state == MemberState::Removed) {
        return Err(Error::Refused(Refusal::RemovedMember {
            drive: m.describe(),
            pool: newest.pool_name.clone(),
        }));
    }
    let Some(recorded) = recorded else {
        return Err(Error::Refused(Refusal::NotACurrentMember {
            drive: m.describe(),
            pool: newest.pool_name.clone(),
        }));
    };
    if slots.get(i).is_some_and(Option::is_some) {
        return Err(Error::InvalidArgument(format!(
            "{} given twice (member {i})",
            m.describe()
        )));
    }
    if m.size_bytes() / BLOCK_BYTES < recorded.size_blocks {
        return Err(Error::Refused(Refusal::ShrunkMember {
            drive: m.describe(),
        }));
    }
    Ok(i)
}

/// A drive given to open a pool that the pool opens without, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SetAside {
    pub drive: String,
    pub reason: String,
}

/// The drives given to open a pool, sorted (`survey_drives`).
pub struct Survey {
    /// The drives that take part, in member order.
    pub members: Vec<Arc<dyn Member>>,
    /// The drives the pool opens without.
    pub set_aside: Vec<SetAside>,
    /// Members that may hold rows and are not among `members`.
    pub missing: Vec<usize>,
    /// The pool's name and parity, from its newest superblock.
    pub pool_name: String,
    pub parity: u8,
}

/// Sorts the drives given to open a pool into those that take part and
/// those set aside: drives that cannot be read or hold no lograid member
/// (or now hold something else), members of another pool than most of the
/// drives, removed or replaced members, drives smaller than they were, a
/// member given twice. Refuses only when the drive with the pool's newest
/// superblock would be set aside (the others could describe an older
/// state of the pool) or when no drive is a member. Reads only.
pub fn survey_drives(drives: Vec<Arc<dyn Member>>) -> Result<Survey> {
    let mut set_aside = Vec::new();
    let mut found = Vec::new();
    let mut first_error = None;
    for m in drives {
        match member_superblock(m.as_ref()) {
            Ok(sb) => found.push((m, sb)),
            Err(e) => {
                set_aside.push(SetAside {
                    drive: m.describe(),
                    reason: e.to_string(),
                });
                first_error.get_or_insert(e);
            }
        }
    }
    let no_member = || Error::InvalidArgument("no drives given".into());
    let Some(pool_uuid) = most_common_pool(&found)? else {
        return Err(first_error.unwrap_or_else(no_member));
    };
    let newest = found
        .iter()
        .filter(|(_, sb)| sb.pool_uuid == pool_uuid)
        .map(|(_, sb)| sb)
        .max_by_key(|sb| sb.generation)
        .cloned()
        .ok_or_else(no_member)?;
    let mut slots: Vec<Option<Arc<dyn Member>>> = vec![None; newest.members.len()];
    for (m, sb) in found {
        match member_slot(m.as_ref(), &sb, &newest, &slots) {
            Ok(i) => slots[i] = Some(m),
            Err(e) if sb == newest => return Err(e),
            Err(e) => set_aside.push(SetAside {
                drive: m.describe(),
                reason: e.to_string(),
            }),
        }
    }
    let missing = (0..slots.len())
        .filter(|&i| slots[i].is_none() && newest.members[i].state.may_hold_rows())
        .collect();
    Ok(Survey {
        members: slots.into_iter().flatten().collect(),
        set_aside,
        missing,
        pool_name: newest.pool_name,
        parity: newest.parity,
    })
}

/// The pool most of the drives belong to; None if no drive is a member.
/// Refused when two pools have as many drives each (which one was meant?).
fn most_common_pool(found: &[(Arc<dyn Member>, Superblock)]) -> Result<Option<u128>> {
    let count = |uuid: u128| found.iter().filter(|(_, sb)| sb.pool_uuid == uuid).count();
    let mut pools: Vec<(usize, u128)> = found
        .iter()
        .map(|(_, sb)| (count(sb.pool_uuid), sb.pool_uuid))
        .collect();
    pools.sort_unstable_by(|a, b| b.cmp(a));
    pools.dedup();
    match pools.as_slice() {
        [] => Ok(None),
        [(n, first), (m, second), ..] if n == m => {
            let drive = found
                .iter()
                .find(|(_, sb)| sb.pool_uuid == *second)
                .map_or_else(String::new, |(d, _)| d.describe());
            Err(Error::Refused(Refusal::AnotherPool {
                drive,
                found: *second,
                expected: *first,
            }))
        }
        [(_, first), ..] => Ok(Some(*first)),
    }
}

/// The member table the pool opens with, given the drives present.
struct MembersAtOpen {
    members: Vec<MemberRecord>,
    /// Members new rows may use: active and present.
    active_mask: u32,
    /// Members that may hold rows and are not here.
    missing: Vec<usize>,
    /// The superblock records a member joining.
    joining: bool,
}

impl MembersAtOpen {
    /// Refuses if more members are missing than the parity covers.
    fn new(newest: &Superblock, slots: &[Option<Arc<dyn Member>>]) -> Result<MembersAtOpen> {
        let n = newest.members.len();
        let missing: Vec<usize> = (0..n)
            .filter(|&i| slots[i].is_none() && newest.members[i].state.may_hold_rows())
            .collect();
        if missing.len() > newest.parity as usize {
            return Err(Error::Refused(Refusal::TooFewMembers {
                pool: newest.pool_name.clone(),
                needed: n - newest.parity as usize,
                members: n,
                missing,
            }));
        }
        // A joining member that is here is active from now on (the
        // checkpoint recovery writes records it so).
        let mut members = newest.members.clone();
        for (i, r) in members.iter_mut().enumerate() {
            if r.state == MemberState::Joining && slots[i].is_some() {
                r.state = MemberState::Active;
            }
        }
        let active_mask = members
            .iter()
            .enumerate()
            .filter(|(i, r)| r.state == MemberState::Active && slots[*i].is_some())
            .fold(0u32, |m, (i, _)| m | 1 << i);
        let joining = newest
            .members
            .iter()
            .any(|r| r.state == MemberState::Joining);
        Ok(MembersAtOpen {
            members,
            active_mask,
            missing,
            joining,
        })
    }
}

/// The pool's shape as the newest superblock records it (segments over
/// the members that may hold rows; a fresh nonce for this opening).
fn shape_of(newest: &Superblock) -> Result<Shape> {
    let sizes: Vec<u64> = newest
        .members
        .iter()
        .map(|r| {
            if r.state.may_hold_rows() {
                r.size_blocks
            } else {
                0
            }
        })
        .collect();
    let geometry = Geometry {
        member_blocks: MemberSizes::new(&sizes),
        data_start_block: newest.data_start_block,
        segment_blocks: newest.segment_blocks,
        chunk_blocks: newest.chunk_blocks,
    };
    if geometry.segment_count() as u64 > crate::format::MAX_SEGMENTS {
        return Err(Error::Corrupt(format!(
            "superblock describes {} segments (at most {} supported)",
            geometry.segment_count(),
            crate::format::MAX_SEGMENTS
        )));
    }
    let stale = Shape::no_stale(&geometry);
    Ok(Shape {
        geometry,
        parity: newest.parity.into(),
        pool_uuid: newest.pool_uuid,
        pool_name: newest.pool_name.clone(),
        created_unix: newest.created_unix,
        nonce: random_u64(),
        recorded_members: newest.members.clone(),
        stale,
    })
}

impl Engine {
    fn recover(
        &self,
        sb: &Superblock,
        started: Instant,
        missing: Vec<usize>,
        joining: bool,
        read_only: bool,
    ) -> Result<RecoveryReport> {
        let ptr = sb.checkpoint;
        let blob = self.read_checkpoint(sb)?;
        let mut image =
            CheckpointImage::decode(&blob).map_err(|e| Error::format("checkpoint", e))?;
        if image.checkpoint_id != ptr.checkpoint_id {
            return Err(Error::Corrupt(
                "checkpoint id does not match the superblock".into(),
            ));
        }
        // Rows after the checkpoint were all written after any member
        // rebuilt in place took its place, so they are whole on it: the
        // stale segments apply from the end of the roll forward on.
        let rebuilds = std::mem::take(&mut image.rebuilds);
        self.load_image(image)?;
        let (rows, blocks) = self.roll_forward(read_only)?;
        let mut read_only = read_only;
        {
            let mut ledger = self.ledger.lock();
            for r in &rebuilds {
                if r.segments
                    .iter()
                    .any(|&seg| seg as usize >= ledger.segments.len())
                {
                    return Err(Error::Corrupt(format!(
                        "checkpoint: rebuild of member {} lists a segment past the pool's {}",
                        r.member,
                        ledger.segments.len()
                    )));
                }
                self.shape.stale[r.member as usize].reset(r.since_seq, r.segments.iter().copied());
            }
            self.prune_stale(&ledger);
            // A member still being rebuilt counts as lost: with more lost
            // than the parity, rows may have lost more columns than it covers.
            let lost = self.lost_members(&ledger);
            if lost > self.shape.parity() as u32 && ledger.read_only_reason.is_none() {
                let reason = ReadOnlyReason::TooManyLost {
                    lost,
                    parity: self.shape.parity(),
                };
                tracing::error!("{reason}");
                ledger.read_only_reason = Some(reason);
                read_only = true;
            }
            ledger.checkpoint = ptr;
            ledger.stored_blocks = ledger
                .volumes
                .values()
                .map(|v| v.map().stored_blocks())
                .sum();
        }
        // What was read from the drives is input: bookkeeping it breaks (a
        // map entry outside every row's data slots) fails a writable
        // opening, before the cleaner could act on it; a read-only one goes
        // on, saying so, so that what can be read can be copied off.
        let checking = Instant::now();
        if let Err(m) = self.ledger.lock().check_invariants(&self.shape) {
            let m = format!("the pool's bookkeeping after recovery is inconsistent: {m}");
            if !read_only {
                return Err(Error::Corrupt(format!(
                    "{m} (open it read-only to copy off what can be read)"
                )));
            }
            tracing::error!("pool '{}': {m}; opened read-only", self.shape.pool_name);
            self.event(m);
        }
        let checked = checking.elapsed();
        if !read_only {
            // What was replayed may sit in a volatile cache: make it durable
            // before any segment it emptied is reused, then checkpoint. (A
            // member just opened always counts as holding unsynced writes.)
            self.sync_members()?;
            let gen = {
                let mut ledger = self.ledger.lock();
                ledger.flush_gen += 1;
                ledger.flush_gen
            };
            self.finish_flush(gen);
            if !missing.is_empty() || joining {
                // New rows go only to the members present, with full parity.
                let mut ledger = self.ledger.lock();
                ledger.member_set_changed(&self.shape);
            }
            // A pool made before the cold head existed (or too full for it
            // then) gets it now, recorded by the checkpoint below.
            let (cold_head, rechained) = {
                let mut ledger = self.ledger.lock();
                (
                    ledger.prime_cold_head(&self.shape),
                    ledger.rechain_heads(&self.shape),
                )
            };
            // Durable before any row is written where the log goes on.
            self.clear_next_row_places()?;
            self.sync_members()?;
            if rows > 0 || !missing.is_empty() || joining || cold_head || rechained {
                self.checkpoint_log()?;
            }
        }
        Ok(RecoveryReport {
            checkpoint_id: ptr.checkpoint_id,
            rows_replayed: rows,
            blocks_replayed: blocks,
            duration: started.elapsed(),
            checked,
            missing_members: missing,
        })
    }
}
