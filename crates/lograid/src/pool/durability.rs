//! Making the log durable: a flush of the log seals the open rows, waits
//! for every row sealed before it (whoever writes it), syncs every member
//! (sharing member flushes with concurrent callers: `Device::sync`; and
//! flushes that arrive while one runs share the next one: `FlushCombiner`),
//! records any member fault in the superblocks (`record_faults`), and
//! only then raises `flushed_seq` and frees the segments emptied before it
//! began. Also the release of emptied segments after a checkpoint, and
//! their discard. Must never acknowledge what is not on stable storage,
//! nor free a segment whose contents a crash could still need.

use super::ledger::check_writable;
use super::ledger::{Ledger, SegState};
use super::Engine;
use crate::device::{Device, IoJob};
use crate::error::Result;
use crate::format::BLOCK_BYTES;
use crate::layout::{MemberIndex, SegmentIndex};
use crate::sync::{Condvar, Mutex};
use std::sync::Arc;

impl Engine {
    /// Makes every block the log took before the call durable on every
    /// member: seals the open rows, then `make_durable`; only then may the
    /// segments emptied before the call be reused (`finish_flush`).
    /// Sub-block writes still held as overlays are not merged here (the
    /// cleaner and members call this holding `maintenance`, which merging
    /// may need): `flush_acknowledged` makes every acknowledged write durable,
    /// and callers that may write a due checkpoint then call
    /// `checkpoint_log_if_due`.
    pub(crate) fn flush_log(&self) -> Result<()> {
        let mut state = self.flushes.state.lock();
        let arrived = state.begun;
        loop {
            // A flush that began after this call sealed everything the log
            // had taken before it, this call's blocks included.
            if state.completed_ok > arrived {
                return Ok(());
            }
            if !state.busy {
                state.busy = true;
                state.begun += 1;
                let number = state.begun;
                drop(state);
                let running = RunningFlush {
                    combiner: &self.flushes,
                    number,
                    ok: false,
                };
                return running.finish(self.flush_log_now());
            }
            self.flushes.done.wait(&mut state);
        }
    }

    /// One flush of the log (see `flush_log`), run by one caller at a time.
    fn flush_log_now(&self) -> Result<()> {
        let (sealed, target_seq, gen) = {
            let mut ledger = self.ledger.lock();
            ledger.flush_gen += 1;
            let gen = ledger.flush_gen;
            let sealed = self.seal_open_rows(&mut ledger);
            (sealed, ledger.next_seq, gen)
        };
        self.write_rows(sealed)?;
        self.make_durable(target_seq)?;
        self.finish_flush(gen);
        self.debug_check("flush");
        Ok(())
    }

    /// Makes every row with a sequence number below `target_seq` durable:
    /// waits until each is written (whichever thread writes it), syncs
    /// every member, and only then records them flushed (`flushed_seq`,
    /// which later rows carry and recovery trusts).
    pub(crate) fn make_durable(&self, target_seq: u64) -> Result<()> {
        {
            let mut ledger = self.ledger.lock();
            // A pool that stopped writing (a row write failed beyond the
            // parity, or panicked) may never complete its rows.
            while ledger.read_only_reason.is_none()
                && ledger.inflight.iter().any(|r| r.geom.seq < target_seq)
            {
                self.progress.wait(&mut ledger);
            }
            check_writable(&ledger)?;
        }
        self.sync_members()?;
        // A member faulted before or by these syncs did not make its part
        // durable: acknowledged only once the superblocks say so.
        self.record_faults()?;
        let mut ledger = self.ledger.lock();
        ledger.flushed_seq = ledger.flushed_seq.max(target_seq - 1);
        Ok(())
    }

    /// Makes every write completed on the members before the call durable
    /// (`Device::sync`, which shares a flush with concurrent callers and
    /// waits for one already running). A member whose flush fails is
    /// faulted, never flushed again; past the parity the pool stops
    /// writing and this fails.
    pub(crate) fn sync_members(&self) -> Result<()> {
        let dirty: Vec<(MemberIndex, Arc<Device>)> = self
            .open_devices()
            .into_iter()
            .filter(|(_, d)| d.dirty())
            .collect();
        let results: Vec<(MemberIndex, Arc<Device>, std::io::Result<()>)> = if dirty.len() <= 1 {
            dirty
                .into_iter()
                .map(|(m, d)| {
                    let r = d.sync();
                    (m, d, r)
                })
                .collect()
        } else {
            let jobs = dirty
                .into_iter()
                .map(|(m, d)| {
                    Box::new(move || {
                        let r = d.sync();
                        (m, d, r)
                    }) as IoJob<_>
                })
                .collect();
            self.io.run_all(jobs)
        };
        for (m, dev, r) in results {
            // Faulted only if the slot still holds that drive (a member
            // replaced meanwhile is not blamed for the old one's error).
            let current = self.device_any(m).is_some_and(|d| Arc::ptr_eq(&d, &dev));
            if let (Err(e), true) = (r, current) {
                self.fault_member(m, "a flush", e)?;
            }
        }
        Ok(())
    }

    /// After flush `gen` completed: segments emptied before it started become
    /// free, except those holding rows written since the durable checkpoint
    /// (recovery follows the log through them) and those emptied since a
    /// change only a checkpoint records (`Ledger::unlogged_since_gen`): they
    /// wait for the next checkpoint (`after_checkpoint`).
    pub(crate) fn finish_flush(&self, gen: u64) {
        self.release_pending(|ledger, seg, flush_gen| {
            flush_gen < gen
                && ledger.unlogged_since_gen.is_none_or(|u| flush_gen < u)
                && seg
                    .rows
                    .last()
                    .is_none_or(|r| r.seq < ledger.checkpoint_next_seq)
        });
    }

    /// After a checkpoint is durable (it started with flush `gen`): it
    /// records every change made before it started, and every segment
    /// emptied before it started becomes free.
    pub(crate) fn after_checkpoint(&self, gen: u64) {
        {
            let mut ledger = self.ledger.lock();
            if let Some(since) = ledger.unlogged_since_gen {
                assert!(
                    since < gen,
                    "a change only a checkpoint records, made during one"
                );
                ledger.unlogged_since_gen = None;
            }
        }
        self.release_pending(|_, _, flush_gen| flush_gen < gen);
    }

    fn release_pending(&self, ready: impl Fn(&Ledger, &super::ledger::Segment, u64) -> bool) {
        let is_ready = |ledger: &Ledger, s: SegmentIndex| match ledger.segment(s).state {
            SegState::PendingFree { flush_gen } => ready(ledger, ledger.segment(s), flush_gen),
            _ => false,
        };
        {
            let ledger = self.ledger.lock();
            if !ledger.segment_indices().any(|s| is_ready(&ledger, s)) {
                return;
            }
        }
        // Wait for readers that may still read the old contents.
        let _w = self.reuse.write();
        if self.options.discard {
            let ready: Vec<(SegmentIndex, u32)> = {
                let ledger = self.ledger.lock();
                ledger
                    .segment_indices()
                    .filter(|&s| is_ready(&ledger, s))
                    .map(|s| (s, ledger.segment(s).members_mask))
                    .collect()
            };
            // Still pending (so never handed out) while their blocks are
            // discarded; `reuse` keeps other releases out meanwhile.
            for (s, mask) in ready {
                self.discard_segment(s, mask);
            }
        }
        let mut ledger = self.ledger.lock();
        for s in ledger.segment_indices() {
            if is_ready(&ledger, s) {
                assert_eq!(
                    ledger.segment(s).live_blocks,
                    0,
                    "freeing segment {s} with live blocks"
                );
                ledger.release_segment(s, &self.shape);
            }
        }
        self.progress.notify_all();
        drop(ledger);
        self.debug_check("releasing segments");
    }

    /// Tells the members that segment `s` no longer holds anything. Advisory:
    /// a member that fails it is logged and the segment is freed anyway.
    fn discard_segment(&self, s: SegmentIndex, members_mask: u32) {
        let g = &self.shape.geometry;
        let offset = g.segment_base(s.0) * BLOCK_BYTES;
        let len = g.segment_blocks as u64 * BLOCK_BYTES;
        for (m, dev) in self.open_devices() {
            if members_mask & m.bit() == 0 {
                continue;
            }
            match dev.discard(offset, len) {
                Ok(()) => {
                    self.stats.lock().discarded_bytes += len;
                }
                Err(e) => tracing::warn!(
                    "discard of segment {s} on member {m} ({}): {e}",
                    dev.member.describe()
                ),
            }
        }
    }
}

/// Group commit of flushes: one flush of the log runs at a time; callers
/// that arrive meanwhile wait for it to end, and then one of them runs the
/// next, which seals and syncs what all of them wrote (one short row for
/// many writers instead of one each: a short row pays a header block and
/// its parity). A caller whose blocks a flush that began after it arrived
/// made durable returns with that flush. No flush waits longer than for
/// the one running when it arrived, plus its own.
#[derive(Default)]
pub(crate) struct FlushCombiner {
    state: Mutex<FlushCombinerState>,
    done: Condvar,
}

#[derive(Default)]
struct FlushCombinerState {
    /// A flush of the log is running.
    busy: bool,
    /// Flushes begun so far (each one's number).
    begun: u64,
    /// The number of the last flush that succeeded.
    completed_ok: u64,
}

/// The flush a caller runs; ends it (success or not, a panic included)
/// and wakes the callers waiting for it.
struct RunningFlush<'a> {
    combiner: &'a FlushCombiner,
    number: u64,
    ok: bool,
}

impl RunningFlush<'_> {
    fn finish(mut self, result: Result<()>) -> Result<()> {
        self.ok = result.is_ok();
        result
    }
}

impl Drop for RunningFlush<'_> {
    fn drop(&mut self) {
        let mut state = self.combiner.state.lock();
        state.busy = false;
        if self.ok {
            debug_assert!(state.completed_ok < self.number, "flushes end in order");
            state.completed_ok = self.number;
        }
        drop(state);
        self.combiner.done.notify_all();
    }
}
