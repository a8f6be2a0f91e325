//! The public API of a pool: `Pool` (volumes, checkpoint, clean, scrub,
//! status, close, member changes in `members`) and `Volume` (read, write,
//! FUA, flush, trim, write-zeroes, block status). Checks arguments and
//! ranges, runs each call guarded (a panic stops the pool writing), and
//! hands the work to the engine's paths. Volume creation, growth and
//! deletion are here: each takes `maintenance` through its checkpoint and
//! becomes visible (or its space reusable) only once that is durable.

mod members;
mod volume;

pub use volume::Volume;

use super::engine::now_unix;
use super::ledger::check_writable;
use super::ledger::Ledger;
use super::stats;
use super::{background, ledger, open, status, Engine};
use super::{PoolStatus, ScrubReport};
use crate::error::{Error, Refusal, Result};
use crate::format::BLOCK_SIZE;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Ledger {}

/// An open pool. Cheap to clone; closing writes a final checkpoint.
#[derive(Clone)]
pub struct Pool {
    pub(crate) engine: Arc<Engine>,
    _cleaner: Arc<background::BackgroundThread>,
    _resolver: Arc<background::BackgroundThread>,
}

impl Pool {
    pub(crate) fn from_engine(engine: Arc<Engine>) -> Pool {
        engine.start_row_writer();
        let cleaner = background::BackgroundThread::start(
            &engine,
            engine.options.background_cleaner,
            "lograid-cleaner",
            background::cleaner_loop,
        );
        let resolver = background::BackgroundThread::start(
            &engine,
            engine.options.background_resolver,
            "lograid-resolver",
            background::resolver_loop,
        );
        Pool {
            engine,
            _cleaner: cleaner,
            _resolver: resolver,
        }
    }

    pub fn name(&self) -> &str {
        &self.engine.shape.pool_name
    }
    pub fn uuid(&self) -> u128 {
        self.engine.shape.pool_uuid
    }

    /// What recovery did when this pool was opened.
    pub fn recovery_report(&self) -> Option<stats::RecoveryReport> {
        self.engine.recovery_report.lock().clone()
    }

    /// The volumes that exist (a volume being created is not listed until
    /// its creation is durable).
    pub fn volumes(&self) -> Vec<Volume> {
        let ledger = self.engine.ledger.lock();
        ledger
            .volumes
            .values()
            .filter(|v| v.exists())
            .map(|v| Volume {
                engine: self.engine.clone(),
                id: v.id,
                name: v.name.clone(),
                view: v.view.clone(),
            })
            .collect()
    }

    pub fn volume(&self, name: &str) -> Result<Volume> {
        self.volumes()
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::NotFound(format!("volume '{name}' in pool '{}'", self.name())))
    }

    /// Creates a thin volume of `size_bytes` (a multiple of 4096). It is
    /// handed out (here and by `volume`) once a checkpoint recording it is
    /// durable: nothing written to it can be lost with it.
    pub fn create_volume(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        validate_volume_name(name)?;
        validate_volume_size(size_bytes)?;
        self.engine.guarded("creating a volume", || {
            self.record_new_volume(name, size_bytes)
        })
    }

    /// `create_volume` after its arguments are checked.
    fn record_new_volume(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        let _m = self.engine.maintenance.lock();
        let id = {
            let mut ledger = self.engine.ledger.lock();
            check_writable(&ledger)?;
            if ledger.volumes.values().any(|v| v.name == name) {
                return Err(Error::Exists(format!("volume '{name}'")));
            }
            let id = ledger.next_volume_id;
            ledger.next_volume_id += 1;
            ledger.add_volume(ledger::VolumeState::being_created(
                (id, name.to_string()),
                size_bytes,
                now_unix(),
            ));
            id
        };
        let recorded = self.engine.checkpoint_log_locked();
        let mut ledger = self.engine.ledger.lock();
        let view = match recorded {
            Ok(()) => {
                let v = ledger.volumes.get_mut(&id).expect("volume being created");
                v.mark_created();
                v.view.clone()
            }
            Err(e) => {
                ledger.remove_volume(id);
                return Err(e);
            }
        };
        Ok(Volume {
            engine: self.engine.clone(),
            id,
            name: name.to_string(),
            view,
        })
    }

    /// Grows a volume (shrinking is refused: it would drop data). The new
    /// range takes writes once a checkpoint recording the size is durable.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<()> {
        validate_volume_size(size_bytes)?;
        self.engine.guarded("growing a volume", || {
            self.record_volume_size(name, size_bytes)
        })
    }

    /// `resize_volume` after its argument is checked.
    fn record_volume_size(&self, name: &str, size_bytes: u64) -> Result<()> {
        let _m = self.engine.maintenance.lock();
        let id = {
            let mut ledger = self.engine.ledger.lock();
            check_writable(&ledger)?;
            let v = ledger
                .volumes
                .values_mut()
                .find(|v| v.name == name && v.exists())
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            if size_bytes < v.size_bytes {
                return Err(Error::Refused(Refusal::WouldShrink {
                    volume: name.to_string(),
                    size_bytes: v.size_bytes,
                    requested_bytes: size_bytes,
                }));
            }
            v.recording_size_bytes = Some(size_bytes);
            v.id
        };
        let recorded = self.engine.checkpoint_log_locked();
        let mut ledger = self.engine.ledger.lock();
        let v = ledger.volumes.get_mut(&id).expect("volume being grown");
        v.recording_size_bytes = None;
        if recorded.is_ok() {
            v.grow_to(size_bytes);
        }
        recorded
    }

    /// Deletes a volume and frees its blocks. The space becomes reusable
    /// only once a checkpoint recording the deletion is durable (until
    /// then a crash brings the volume back, whole).
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        self.engine
            .guarded("deleting a volume", || self.record_volume_deleted(name))
    }

    /// `delete_volume`, guarded.
    fn record_volume_deleted(&self, name: &str) -> Result<()> {
        let _m = self.engine.maintenance.lock();
        let sealed = {
            let mut ledger = self.engine.ledger.lock();
            check_writable(&ledger)?;
            let id = ledger
                .volumes
                .values()
                .find(|v| v.name == name && v.exists())
                .map(|v| v.id)
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            // Seal first so no open slot refers to the volume.
            let sealed = self.engine.seal_open_rows(&mut ledger);
            let vol = ledger.remove_volume(id).expect("volume");
            for (_, loc, _) in vol.map().iter_from(0) {
                ledger.release_loc(loc, &self.engine.shape);
                if loc.is_stored() {
                    ledger.stored_blocks -= 1;
                }
            }
            // Segments it emptied wait for the checkpoint below.
            let gen = ledger.flush_gen;
            ledger.unlogged_since_gen.get_or_insert(gen);
            sealed
        };
        self.engine.write_rows(sealed)?;
        self.engine.checkpoint_log_locked()
    }

    /// Flushes everything (sub-block writes held in memory included) and
    /// writes a checkpoint.
    pub fn checkpoint(&self) -> Result<()> {
        self.engine
            .guarded("checkpoint", || self.engine.checkpoint_acknowledged())
    }

    /// Runs the cleaner until `segments` more segments are free or nothing
    /// more can be gained; returns segments freed.
    pub fn clean(&self, segments: usize) -> Result<usize> {
        self.engine.guarded("cleaning", || {
            let cleaned = self.engine.clean_segments(segments)?;
            // Make what was emptied reusable now (and, as ever, everything
            // acknowledged durable).
            self.engine.checkpoint_acknowledged()?;
            Ok(cleaned)
        })
    }

    /// Reads and checks every row (data, headers, parity), rewrites what is
    /// wrong and can be rebuilt (unless `repair` is false), and reports the
    /// live blocks that cannot. `progress(done, total)` (rows) is called
    /// every 20 ms or so and last with `done == total`; returning false
    /// stops the scrub (the report says so); the scrub waits while it runs.
    pub fn scrub(
        &self,
        repair: bool,
        mut progress: impl FnMut(u64, u64) -> bool,
    ) -> Result<ScrubReport> {
        if repair {
            check_writable(&self.engine.ledger.lock())?;
        }
        self.engine
            .guarded("scrub", || self.engine.scrub(repair, &mut progress))
    }

    /// Verifies the in-memory bookkeeping (free list, live counts, maps);
    /// for tests and `LOGRAID_CHECK_INVARIANTS`.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.engine
            .ledger
            .lock()
            .check_invariants(&self.engine.shape)
    }

    pub fn status(&self) -> PoolStatus {
        status::collect(&self.engine)
    }

    /// How long each member's reads, writes and flushes took since the
    /// pool was opened (or the member joined), by member index (as in
    /// `PoolStatus::members`); faulted members keep theirs, missing ones
    /// have none. Takes no lock.
    pub fn member_latency(&self) -> Vec<(usize, crate::device::MemberLatencyValues)> {
        self.engine
            .devices
            .load()
            .iter()
            .enumerate()
            .filter_map(|(i, d)| Some((i, d.as_ref()?.latency.values())))
            .collect()
    }

    /// Closes the pool: flush, final checkpoint. Further use of volumes fails.
    pub fn close(&self) -> Result<()> {
        if self.engine.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        self._cleaner.stop();
        self._resolver.stop();
        let read_only = self.engine.ledger.lock().read_only_reason.is_some();
        if !read_only {
            self.engine
                .guarded("close", || self.engine.checkpoint_acknowledged())?;
        }
        self.engine.row_writer.stop();
        self.engine.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

fn validate_volume_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Error::InvalidArgument(format!(
            "volume name '{name}': use 1-64 characters of letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(())
}

fn validate_volume_size(size_bytes: u64) -> Result<()> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_SIZE as u64) || size_bytes > (1u64 << 60)
    {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes}: must be a non-zero multiple of 4096 bytes"
        )));
    }
    Ok(())
}

// Pools and volumes are shared across threads by every front end.
const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Pool>();
    is_send_sync::<Volume>();
};

/// Opens a pool from its members (any order; missing members are allowed up
/// to the parity count). `read_only` opens without writing anything.
pub fn open_members(
    members: Vec<Arc<dyn crate::device::Member>>,
    options: super::PoolOptions,
    read_only: bool,
) -> Result<Pool> {
    open::open_engine(members, options, read_only).map(Pool::from_engine)
}
