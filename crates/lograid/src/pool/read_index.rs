//! What a read looks up without the ledger lock: each volume's map, behind
//! a read-write lock of its own, and the size reads may use (`VolumeView`);
//! whether any sub-block write is held (a read would have to apply it);
//! and where the rows in flight lie (their blocks are still only in
//! memory). Only holders of the ledger lock change them, in an order that
//! lets a reader check them in turn (`Engine::look_up_unlocked`):
//! - a row's place goes on the in-flight list before the map names its
//!   blocks, and leaves it once the row is on its members;
//! - a held overlay is counted from its write on, and uncounted only after
//!   the map shows what replaced it (a whole-block write, a trim), or after
//!   its volume's size was published as 0 (a deletion);
//! - a deleted volume's size is published as 0 before its overlays go and
//!   before its map is emptied.
//!
//! So a reader that sees no overlay held, then the size covering its
//! request, then (in one hold of the map's lock) each block a hole, zeroes
//! or on a member, then no row in flight over those and the size still
//! there, may read them from the members (the `reuse` lock keeps their
//! segments from being rewritten meanwhile); any other case takes the
//! ledger lock (`read`). Each block read so is one of its versions during
//! the read; a read of several blocks beside writes to them is not one
//! instant of the volume (as with a drive).

use crate::layout::{Geometry, Pba, RowGeom};
use crate::map::VolumeMap;
use arc_swap::ArcSwap;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One volume's map and the size reads may use, shared by the ledger (which
/// changes them, under its lock) and the volume's handles (which read them
/// without it). The map's lock is a leaf: nothing else is taken while it is
/// held, and a ledger holder takes it after the ledger.
#[derive(Default)]
pub struct VolumeView {
    map: RwLock<VolumeMap>,
    /// The volume's size once it exists (its creation durable), else 0;
    /// 0 again once it is deleted.
    readable_bytes: AtomicU64,
}

impl VolumeView {
    /// A view of `map`, read by nobody until its size is published.
    pub fn new(map: VolumeMap) -> VolumeView {
        VolumeView {
            map: RwLock::new(map),
            readable_bytes: AtomicU64::new(0),
        }
    }
    pub fn map(&self) -> RwLockReadGuard<'_, VolumeMap> {
        self.map.read()
    }
    /// The map to read, if no writer holds or waits for it.
    pub fn try_map(&self) -> Option<RwLockReadGuard<'_, VolumeMap>> {
        self.map.try_read()
    }
    /// The map to change: for holders of the ledger lock only
    /// (`VolumeState::map_mut`).
    pub(super) fn map_mut(&self) -> RwLockWriteGuard<'_, VolumeMap> {
        self.map.write()
    }
    /// Bytes a read may cover, as of the last change the ledger published.
    pub fn readable_bytes(&self) -> u64 {
        self.readable_bytes.load(Ordering::Acquire)
    }
    /// Publishes the size reads may use (a ledger holder, after the change).
    pub(super) fn publish_readable_bytes(&self, bytes: u64) {
        self.readable_bytes.store(bytes, Ordering::Release);
    }
}

/// The pool-wide facts a read without the ledger lock checks.
pub struct ReadIndex {
    /// Overlays held (the overlay table's size, published by the table).
    overlays_held: Arc<AtomicUsize>,
    /// The places of the rows in flight (sealed, not yet written).
    rows_in_flight: ArcSwap<Vec<RowGeom>>,
}

impl ReadIndex {
    /// An index reading the overlay count the table publishes.
    pub fn new(overlays_held: Arc<AtomicUsize>) -> ReadIndex {
        ReadIndex {
            overlays_held,
            rows_in_flight: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// Whether a sub-block write is held anywhere in the pool.
    pub fn overlays_held(&self) -> bool {
        self.overlays_count() != 0
    }

    /// The overlays held, as published.
    pub fn overlays_count(&self) -> usize {
        self.overlays_held.load(Ordering::Acquire)
    }

    /// Publishes the rows in flight (a ledger holder: before the map points
    /// at a new row's blocks, and after a written row left the list).
    pub(super) fn publish_rows_in_flight(&self, rows: impl Iterator<Item = RowGeom>) {
        self.rows_in_flight.store(Arc::new(rows.collect()));
    }

    /// The rows in flight as last published.
    pub fn rows_in_flight(&self) -> arc_swap::Guard<Arc<Vec<RowGeom>>> {
        self.rows_in_flight.load()
    }

    /// Whether `pba` lies in one of `rows` (as `rows_in_flight` returned).
    pub fn in_flight(rows: &[RowGeom], geometry: &Geometry, pba: Pba) -> bool {
        rows.iter().any(|g| g.locate(geometry, pba).is_some())
    }
}
