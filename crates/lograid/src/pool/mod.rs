//! A pool: N members turned into thin volumes protected by P parity
//! columns, written as a log of rows (docs/DESIGN.md walks the data flow).
//!
//! Modules, from the bottom up; each names (`use`) only modules above it
//! in this list, so there are no import cycles. Most operations are
//! methods of `Engine`, each defined in the module that owns its concept;
//! calls between them are not bound by this order (the background threads
//! call the cleaner, for one).
//!
//! Bookkeeping (pure, or run under the ledger lock; no member I/O):
//! - `shape`: what never changes while open (geometry, parity, identity).
//! - `options`: run-time knobs (`PoolOptions`, cleaner policy).
//! - `overlay_table`: sub-block writes held in memory, as a table.
//! - `read_index`: what reads look up without the ledger lock (each
//!   volume's map behind its own lock, its size, overlays held, rows in
//!   flight, each segment's rows), published by ledger holders.
//! - `stats`: counters and reports (runtime, cleaner, reshape, recovery).
//! - `ledger`: `Ledger`, all mutable bookkeeping behind one mutex
//!   (segments, heads, volumes and their maps' views, rows in flight,
//!   read-only reason).
//! - `log`: the log heads: opening, appending to and sealing rows.
//! - `lifetime`: which head a user block goes to (hot and cold data apart).
//! - `space`: capacity, the cleaner's floors, stall detection.
//! - `device_table`: the open members by index, looked up without a lock.
//! - `column_buffers`: whole-column buffers kept between row reads.
//! - `row_writer`: a bounded queue of sealed rows and the thread that
//!   hands them to a callback (`rows` makes it write them).
//!
//! The engine:
//! - `engine`: `Engine` (shape, options, ledger, devices, I/O pool,
//!   background threads), member lookup, events, invariant checks.
//! - `background`: the cleaner/checkpoint and overlay-resolver threads.
//!
//! The data path:
//! - `faults`: a member's failed I/O faults it, or stops the pool.
//! - `stripe`: reading rows' columns and rebuilding them from parity.
//! - `row_header`: finding a row header whose own column is gone or stale.
//! - `row_check`: checking a whole row against its header and parity.
//! - `rows`: writing sealed rows (parity, one write per column).
//! - `durability`: flushing the log and syncing members (`flush_log`,
//!   `make_durable`), releasing segments once a flush covers them.
//! - `checkpoint`: writing the checkpoint and the superblocks.
//! - `read`: the read path (map lookup, member reads, checks, repair).
//! - `cleaner`: choosing segments and moving their live blocks.
//! - `write`: the write path for whole blocks.
//! - `overlay`: sub-block writes, flushing and checkpointing everything
//!   acknowledged (`flush_acknowledged`, `checkpoint_acknowledged`).
//! - `range`: trims and zeroes.
//!
//! Maintenance and lifecycle:
//! - `rebuild`: rebuilding a replaced member's columns in place.
//! - `scrub`: checking and repairing every row.
//! - `replay`: recovery: loading the checkpoint and rolling the log forward.
//! - `open`: opening a pool from its members' superblocks.
//! - `members`: adding, replacing and removing members, and the reshape
//!   that moves rows off members that leave.
//! - `watch`: the once-a-second watch for members that are gone and
//!   free space running low.
//! - `status`: what `lograid status` shows.
//! - `api`: the public `Pool` and `Volume`.
//! - `create`: creating a pool (and opening it through `api`).
//!
//! A write from request to member: `Volume::write` (api/volume.rs) →
//! `Engine::write` (overlay.rs: whole blocks go on, partial ones become
//! overlays) → `Engine::write_blocks` (write.rs: `Ledger::append_block`
//! puts each block in the user head's open row, under the ledger lock;
//! a full row is sealed, `Ledger::seal` in log.rs) → `submit_rows`
//! (rows.rs: to the row writer's queue, or written here when it is full)
//! → `write_row` (rows.rs: parity encoded, one write per column to each
//! `Device`, device/) → `finish_row_write` (a failed member is faulted,
//! faults.rs; the row leaves the in-flight list). The write is
//! acknowledged once its block is in the open row. `Volume::flush` →
//! `flush_acknowledged` (overlay.rs: held sub-block writes merged into
//! their blocks first) → `flush_log` (durability.rs: open rows sealed and
//! written) → `make_durable` (rows below the target written, every member
//! synced, then `flushed_seq` raised) → `checkpoint_log_if_due`
//! (checkpoint.rs: a checkpoint if enough log was written since the last).
//!
//! Locking: one mutex (`Ledger`) guards all bookkeeping and is never held
//! across member I/O; each volume's map has its own read-write lock, taken
//! after the ledger by writers and alone by reads that need nothing else
//! (`read_index`). `reuse` is a read-write lock that readers hold while
//! reading member blocks, so that a segment freed by the cleaner is never
//! rewritten under a reader. `maintenance` serialises checkpoints, cleaning
//! passes, member and volume changes and the reshape; flushes never wait
//! for it (one that finds a checkpoint due try-locks it).

mod api;
mod background;
mod checkpoint;
mod cleaner;
mod column_buffers;
pub mod create;
mod device_table;
mod durability;
mod engine;
mod faults;
mod ledger;
mod lifetime;
mod log;
mod members;
mod open;
mod options;
mod overlay;
mod overlay_table;
mod range;
mod read;
mod read_index;
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
#[cfg(test)]
mod test_pool;
mod watch;
mod write;

/// Opening pools and what recovery reports.
pub mod recovery_api {
    pub use super::api::open_members;
    pub use super::open::{read_superblock, survey_drives, SetAside, Survey};
    pub use super::stats::RecoveryReport;
}

pub use create::{CreateOptions, DEFAULT_CHUNK_BYTES};
pub(crate) use engine::{now_unix, random_u128, random_u64, Engine};
pub use members::ReshapeStatus;
pub use options::{CleanerPolicy, PoolOptions};
pub use scrub::{LostBlock, ScrubReport};
pub use shape::Shape;
pub use stats::CleanerState;
pub use status::{CleanerStatus, Health, MemberStatus, MemoryUse, PoolStatus, VolumeStatus};
pub use watch::LOW_SPACE_PERCENT;

pub use api::{Pool, Volume};
pub use read::Allocation;
