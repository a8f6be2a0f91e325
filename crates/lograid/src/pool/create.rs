//! Creating a pool: check every drive (size, in use, foreign contents),
//! choose the geometry, wipe old superblock slots, and write the first
//! checkpoint and superblocks.

use super::engine::Engine;
use super::ledger::SegState;
use super::open::{SetAside, Survey};
use super::{now_unix, random_u128, random_u64, Pool, PoolOptions, Shape};
use crate::device::{is_mounted, probe_signature, AlignedBuf, FileMember, Member, OpenMode};
use crate::error::{Error, Refusal, Result};
use crate::format::row::HeadId;
use crate::format::superblock::{MemberRecord, MemberState};
use crate::format::{
    BLOCK_BYTES, BLOCK_SIZE, DATA_START_BLOCK, MAX_MEMBERS, MAX_PARITY, TAIL_BLOCKS,
};
use crate::layout::{Geometry, MemberSizes};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const DEFAULT_CHUNK_BYTES: u32 = 512 * 1024;
/// Segment size per member when the drives are large enough.
const TARGET_SEGMENT_BYTES: u64 = 8 << 20;
/// Segments the smallest member should hold at least.
const MIN_SEGMENTS: u64 = 16;

#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub name: String,
    pub parity: u8,
    pub chunk_bytes: u32,
    /// Per member; None chooses from the drive sizes.
    pub segment_bytes: Option<u64>,
    /// Overwrite drives that hold a filesystem, partition table or pool.
    pub force: bool,
    /// A volume to create at once: (name, size in bytes).
    pub initial_volume: Option<(String, u64)>,
}

impl CreateOptions {
    /// Checks the options for `n` drives (before anything is touched).
    pub fn validate(&self, n: usize) -> Result<()> {
        if !(2..=MAX_MEMBERS).contains(&n) {
            return Err(Error::InvalidArgument(format!(
                "a pool needs 2 to {MAX_MEMBERS} drives, {n} given"
            )));
        }
        if self.parity as usize > MAX_PARITY || self.parity as usize >= n {
            return Err(Error::InvalidArgument(format!(
                "parity {} needs more drives than that: at most {} parity for {n} drives (and never more than {MAX_PARITY})",
                self.parity,
                (n - 1).min(MAX_PARITY)
            )));
        }
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(Error::InvalidArgument(format!(
                "pool name '{}': use 1-64 characters of letters, digits, '-', '_' and '.'",
                self.name
            )));
        }
        let chunk = self.chunk_bytes as u64;
        if !chunk.is_power_of_two() || !(4096..=1 << 20).contains(&chunk) {
            return Err(Error::InvalidArgument(format!(
                "chunk size {chunk}: must be a power of two from 4 KiB to 1 MiB"
            )));
        }
        Ok(())
    }
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            name: "lograid".into(),
            parity: 1,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            segment_bytes: None,
            force: false,
            initial_volume: None,
        }
    }
}

/// Prepares drives given by path: creates missing files sparse when
/// `create_size` is given, refuses drives that are mounted, locked by
/// another process, or hold recognizable contents (unless `force`).
pub fn open_new_members(
    paths: &[PathBuf],
    create_size: Option<u64>,
    force: bool,
) -> Result<Vec<Arc<dyn Member>>> {
    let mut created: Vec<PathBuf> = Vec::new();
    let result = open_new_members_inner(paths, create_size, force, &mut created);
    if result.is_err() {
        for p in created {
            let _ = std::fs::remove_file(p);
        }
    }
    result
}

fn open_new_members_inner(
    paths: &[PathBuf],
    create_size: Option<u64>,
    force: bool,
    created: &mut Vec<PathBuf>,
) -> Result<Vec<Arc<dyn Member>>> {
    let mut seen = std::collections::HashSet::new();
    let mut members: Vec<Arc<dyn Member>> = Vec::new();
    for path in paths {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        if !seen.insert(canonical) {
            return Err(Error::InvalidArgument(format!(
                "{} is given twice",
                path.display()
            )));
        }
        if !path.exists() {
            match create_size {
                Some(size) => {
                    FileMember::create_sparse(path, size)
                        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
                    created.push(path.clone());
                }
                None => {
                    return Err(Error::NotFound(format!(
                        "{} does not exist (give --size to create it as a sparse file)",
                        path.display()
                    )))
                }
            }
        }
        if is_mounted(path) {
            return Err(Error::Refused(Refusal::Mounted {
                drive: path.display().to_string(),
            }));
        }
        if !force {
            if let Some(what) = probe_signature(path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?
            {
                return Err(Error::Refused(Refusal::HoldsData {
                    drive: path.display().to_string(),
                    holds: what.to_string(),
                }));
            }
        }
        let m = FileMember::open(path, OpenMode::ReadWrite)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        members.push(Arc::new(m));
    }
    Ok(members)
}

fn describe(m: &dyn Member) -> String {
    m.describe()
}

/// Creates a new pool on `members` (their contents are destroyed).
pub fn create_pool(
    members: Vec<Arc<dyn Member>>,
    opts: &CreateOptions,
    options: PoolOptions,
) -> Result<Pool> {
    let n = members.len();
    opts.validate(n)?;
    let member_blocks: Vec<u64> = members
        .iter()
        .map(|m| m.size_bytes() / BLOCK_BYTES)
        .collect();
    let segment_blocks = segment_blocks_for(opts, &member_blocks)?;
    let min_blocks = DATA_START_BLOCK + TAIL_BLOCKS + segment_blocks * MIN_SEGMENTS;
    for (m, &blocks) in members.iter().zip(&member_blocks) {
        if blocks < min_blocks {
            return Err(Error::Refused(Refusal::DriveTooSmall {
                drive: describe(m.as_ref()),
                size_bytes: blocks * BLOCK_BYTES,
                needed_bytes: min_blocks * BLOCK_BYTES,
            }));
        }
    }
    let shape = new_shape(opts, &member_blocks, segment_blocks);
    wipe_superblock_slots(&members, &member_blocks)?;
    let all = (1u32 << n) - 1;
    let devices = members
        .into_iter()
        .enumerate()
        .map(|(i, m)| Some(shape.device(i, m)))
        .collect();
    let records = shape.recorded_members.clone();
    let engine = Arc::new(Engine::new(shape, records, devices, options, all, 0));
    if engine.ledger.lock().usable_blocks == 0 {
        return Err(Error::Refused(Refusal::DrivesTooSmall));
    }
    start_log(&engine, all)?;
    engine.checkpoint_log()?;
    let pool = Pool::from_engine(engine);
    if let Some((name, size)) = &opts.initial_volume {
        pool.create_volume(name, *size)?;
    }
    Ok(pool)
}

/// Blocks per segment: as asked (a multiple of the chunk), or about
/// `TARGET_SEGMENT_BYTES` with at least `MIN_SEGMENTS * 8` segments on the
/// smallest drive; refused if the largest drive would need more segments
/// than the format holds.
fn segment_blocks_for(opts: &CreateOptions, member_blocks: &[u64]) -> Result<u64> {
    let chunk = opts.chunk_bytes as u64;
    let chunk_blocks = chunk / BLOCK_BYTES;
    let smallest = *member_blocks.iter().min().expect("members");
    let smallest_data = smallest.saturating_sub(DATA_START_BLOCK + TAIL_BLOCKS);
    let segment_blocks = match opts.segment_bytes {
        Some(b) => {
            if b % chunk != 0 || b == 0 {
                return Err(Error::InvalidArgument(format!(
                    "segment size {b}: must be a multiple of the chunk size {chunk}"
                )));
            }
            b / BLOCK_BYTES
        }
        None => {
            let target =
                (TARGET_SEGMENT_BYTES / BLOCK_BYTES).min(smallest_data / (MIN_SEGMENTS * 8));
            (target / chunk_blocks).max(4) * chunk_blocks
        }
    };
    if segment_blocks > u16::MAX as u64 * 16 {
        return Err(Error::InvalidArgument("segment size too large".into()));
    }
    let largest = *member_blocks.iter().max().expect("members");
    if largest / segment_blocks > crate::format::MAX_SEGMENTS
        || largest > crate::format::MAX_MEMBER_BLOCKS
    {
        return Err(Error::InvalidArgument(format!(
            "drives of {} bytes need a segment size of at least {} bytes",
            largest * BLOCK_BYTES,
            (largest / crate::format::MAX_SEGMENTS + 1).next_multiple_of(chunk_blocks)
                * BLOCK_BYTES
        )));
    }
    Ok(segment_blocks)
}

/// The shape of a new pool: every drive an active member, new identities.
fn new_shape(opts: &CreateOptions, member_blocks: &[u64], segment_blocks: u64) -> Shape {
    let geometry = Geometry {
        member_blocks: MemberSizes::new(member_blocks),
        data_start_block: DATA_START_BLOCK,
        segment_blocks: segment_blocks as u32,
        chunk_blocks: (opts.chunk_bytes as u64 / BLOCK_BYTES) as u32,
    };
    let stale = Shape::no_stale(&geometry);
    Shape {
        geometry,
        parity: opts.parity.into(),
        pool_uuid: random_u128(),
        pool_name: opts.name.clone(),
        created_unix: now_unix(),
        nonce: random_u64(),
        recorded_members: member_blocks
            .iter()
            .map(|&size_blocks| MemberRecord {
                uuid: random_u128(),
                size_blocks,
                state: MemberState::Active,
            })
            .collect(),
        stale,
    }
}

/// Zeroes every superblock slot, so that no older pool's generation can win.
fn wipe_superblock_slots(members: &[Arc<dyn Member>], member_blocks: &[u64]) -> Result<()> {
    let zero = AlignedBuf::zeroed(BLOCK_SIZE);
    for (m, &blocks) in members.iter().zip(member_blocks) {
        for b in [0, 1, blocks - TAIL_BLOCKS, blocks - TAIL_BLOCKS + 1] {
            m.write_at(&zero, b * BLOCK_BYTES)
                .map_err(|e| Error::io(format!("wiping {}", m.describe()), e))?;
        }
    }
    Ok(())
}

/// Every usable segment free, and the user and cleaner heads given their
/// first segments; the cold head too where the pool has the room (it is
/// not needed: blocks moved again go to the cleaner's head without it).
fn start_log(engine: &Engine, all: u32) -> Result<()> {
    let mut ledger = engine.ledger.lock();
    for s in 0..ledger.segments.len() {
        if engine
            .shape
            .segment_usable(ledger.segments[s].members_mask, all)
        {
            ledger.free.push_back(s as u32);
        }
    }
    for head in [HeadId::User, HeadId::Cleaner] {
        ledger
            .prime_head(head, &engine.shape)
            .map_err(|_| Error::Refused(Refusal::TooFewSegments))?;
    }
    ledger.prime_cold_head(&engine.shape);
    debug_assert!(ledger
        .segments
        .iter()
        .all(|s| s.state != SegState::Checkpoint));
    Ok(())
}

/// Opens an existing pool from paths.
pub fn open_paths(paths: &[PathBuf], options: PoolOptions, read_only: bool) -> Result<Pool> {
    let mode = if read_only {
        OpenMode::ReadOnly
    } else {
        OpenMode::ReadWrite
    };
    let mut members: Vec<Arc<dyn Member>> = Vec::new();
    for p in paths {
        let m = FileMember::open(Path::new(p), mode)
            .map_err(|e| Error::io(format!("opening {}", p.display()), e))?;
        members.push(Arc::new(m));
    }
    super::api::open_members(members, options, read_only)
}

/// Opens the drives at `paths` and sorts them (`survey_drives`): a path
/// that cannot be opened is set aside like a drive that is not a member.
/// Reads only; the pool is opened from `Survey::members`.
pub fn survey_paths(paths: &[PathBuf], read_only: bool) -> Result<Survey> {
    let mode = if read_only {
        OpenMode::ReadOnly
    } else {
        OpenMode::ReadWrite
    };
    let mut members: Vec<Arc<dyn Member>> = Vec::new();
    let mut unopened = Vec::new();
    for p in paths {
        match FileMember::open(Path::new(p), mode) {
            Ok(m) => members.push(Arc::new(m)),
            // Gone: the pool opens without it. Anything else (held by a
            // server, read-only, no permission) is the caller's to fix.
            Err(e) if !is_gone(&e) => {
                return Err(Error::io(format!("opening {}", p.display()), e));
            }
            Err(e) => unopened.push(SetAside {
                drive: p.display().to_string(),
                reason: format!("cannot be opened: {e}"),
            }),
        }
    }
    if members.is_empty() {
        let reasons: Vec<String> = unopened
            .iter()
            .map(|s| format!("{}: {}", s.drive, s.reason))
            .collect();
        return Err(Error::InvalidArgument(format!(
            "none of the drives can be opened ({})",
            reasons.join("; ")
        )));
    }
    let mut survey = super::open::survey_drives(members)?;
    unopened.append(&mut survey.set_aside);
    survey.set_aside = unopened;
    Ok(survey)
}

/// Whether opening a drive failed because it is not there (a deleted file,
/// a device that went away).
fn is_gone(e: &std::io::Error) -> bool {
    crate::device::is_gone_error(e)
}
