//! A pool: N members turned into thin volumes protected by P parity columns.
//! This module owns the pool's lifecycle (create, open with recovery, close
//! with a checkpoint), the volume table, and the public API. The data path
//! is split by concern: `log` (heads, open rows, sealing), `io` (writing
//! rows, flush, reads with checksum verification and repair), `overlay`
//! (sub-block writes held in memory until merged into their blocks), `recovery`
//! (checkpoint load and roll-forward), `checkpoint`, `cleaner`, `create`.
//!
//! Locking: one mutex (`Ledger`) guards all bookkeeping and is never held
//! across member I/O. `reuse` is a read-write lock that readers hold while
//! reading member blocks, so that a segment freed by the cleaner is never
//! rewritten under a reader.

mod api;
mod background;
mod checkpoint;
mod cleaner;
pub mod create;
mod durability;
mod engine;
mod faults;
mod ledger;
mod log;
mod members;
mod open;
mod options;
mod overlay;
mod overlay_table;
mod range;
mod read;
mod rebuild;
mod replay;
mod row_check;
mod row_header;
mod row_writer;
mod rows;
mod scrub;
mod shape;
mod space;
mod stats;
mod status;
mod stripe;
mod write;

/// Opening pools and what recovery reports.
pub mod recovery_api {
    pub use super::api::open_members;
    pub use super::open::read_superblock;
    pub use super::stats::RecoveryReport;
}

pub use create::{CreateOptions, DEFAULT_CHUNK_BYTES};
pub(crate) use engine::{now_unix, random_u128, random_u64, Engine};
pub use members::ReshapeStatus;
pub use options::{CleanerPolicy, PoolOptions};
pub use scrub::{LostBlock, ScrubReport};
pub use shape::Shape;
pub use stats::CleanerState;
pub use status::{CleanerStatus, MemberStatus, PoolStatus, VolumeStatus};

pub use api::{Pool, Volume};
pub use read::Allocation;
