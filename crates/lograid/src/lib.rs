//! lograid: a log-structured parity-RAID engine.
//!
//! N member drives become thin block volumes protected by P parity columns
//! (P = 0..3). Every write, whatever its size, is appended to a log and lands
//! in a parity row that is written once: no read-modify-write, no write hole.
//! Every 4 KiB block has a CRC-32C kept apart from it (in its row header and
//! in the volume map) and is checked on every read; a bad block is rebuilt
//! from parity, returned correct, rewritten and counted.
//!
//! Layers, top to bottom (each talks only to the one below):
//! - [`pool`]: pools and volumes, the public API; the write path, reads with
//!   repair, flush, checkpoints, recovery, the cleaner.
//! - [`map`]: volume maps (logical block → location and checksum).
//! - [`layout`]: geometry (segments, rows, columns, physical addresses).
//! - [`format`]: the on-disk structures (docs/FORMAT.md).
//! - [`device`]: members (files, block devices, simulated drives).
//! - `lograid-parity` (crate): the parity codec.

pub mod device;
pub mod error;
pub mod format;
pub mod layout;
pub mod map;
pub mod pool;
pub mod sync;

pub use error::{Error, ReadOnlyReason, Refusal, RepairError, Result};
pub use pool::recovery_api::{
    open_members, read_superblock, survey_drives, RecoveryReport, SetAside, Survey,
};
pub use pool::{
    create::{create_pool, open_new_members, open_paths, survey_paths},
    Allocation, CleanerPolicy, CreateOptions, Health, LostBlock, MemoryUse, Pool, PoolOptions,
    PoolStatus, ScrubReport, Volume, LOW_SPACE_PERCENT,
};
