//! What a read looks up without the ledger lock: each volume's map, behind
//! a read-write lock of its own, the size reads may use, and how many of
//! its blocks hold a sub-block write (a read would have to apply it:
//! `VolumeView`); where the rows in flight lie (their blocks are still
//! only in memory: `ReadIndex`); and each segment's rows, for rebuilding a
//! block from its row's other columns (`SegmentRows`, `ReadIndex::row_at`).
//! Only holders of the ledger lock change them, in an order that lets a
//! reader check them in turn (`Engine::look_up_unlocked`):
//! - a row's place goes on the in-flight list before the map names its
//!   blocks, and leaves it once the row is on its members;
//! - a held overlay is counted in its volume's view from its write on, and
//!   uncounted only after the map shows what replaced it (a whole-block
//!   write, a trim), or after its volume's size was published as 0 (a
//!   deletion);
//! - a deleted volume's size is published as 0 before its overlays go and
//!   before its map is emptied.
//!
//! So a reader that sees no overlay held in its volume, then the size
//! covering its request, then (in one hold of the map's lock) each block a
//! hole, zeroes or on a member, then no row in flight over those and the
//! size still there, may read them from the members (the `reuse` lock keeps
//! their segments from being rewritten meanwhile); any other case takes the
//! ledger lock (`read`). Each block read so is one of its versions during
//! the read; a read of several blocks beside writes to them is not one
//! instant of the volume (as with a drive).

use crate::layout::{Geometry, Pba, RowGeom};
use crate::map::VolumeMap;
use arc_swap::ArcSwap;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One volume's map, the size reads may use and its overlays held, shared
/// by the ledger (which changes them, under its lock) and the volume's
/// handles (which read them without it). The map's lock is a leaf:
/// nothing else is taken while it is held, and a ledger holder takes it
/// after the ledger.
#[derive(Default)]
pub struct VolumeView {
    map: RwLock<VolumeMap>,
    /// The volume's size once it exists (its creation durable), else 0;
    /// 0 again once it is deleted.
    readable_bytes: AtomicU64,
    /// The volume's overlays held, published by the overlay table (which
    /// holds this counter from the volume's registration on: `watch`).
    overlays_held: Arc<AtomicUsize>,
}

impl VolumeView {
    /// A view of `map`, read by nobody until its size is published.
    pub fn new(map: VolumeMap) -> VolumeView {
        VolumeView {
            map: RwLock::new(map),
            readable_bytes: AtomicU64::new(0),
            overlays_held: Arc::default(),
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
    /// Whether a sub-block write is held in the volume, as published.
    pub fn overlays_held(&self) -> bool {
        self.overlays_held.load(Ordering::Acquire) != 0
    }
    /// The counter the overlay table publishes the volume's overlays to.
    pub(super) fn overlays_counter(&self) -> Arc<AtomicUsize> {
        self.overlays_held.clone()
    }
}

/// The pool-wide facts a read without the ledger lock checks.
#[derive(Default)]
pub struct ReadIndex {
    /// The places of the rows in flight (sealed, not yet written).
    rows_in_flight: ArcSwap<Vec<RowGeom>>,
    /// Every segment's rows, by segment index (`publish_segments`).
    segment_rows: ArcSwap<Vec<SharedRows>>,
}

type SharedRows = Arc<RwLock<Vec<RowGeom>>>;

/// One segment's rows in offset order (this incarnation of the segment):
/// changed by holders of the ledger lock only (through the segment, which
/// they hold mutably), read by them, and read without the ledger lock by
/// whoever rebuilds a block from its row's other columns
/// (`ReadIndex::row_at`), who holds `reuse` for reading, so the segment is
/// not emptied and written anew meanwhile. Its lock is a leaf: nothing is
/// taken under it, and it is held only to copy or change the list.
#[derive(Default)]
pub struct SegmentRows(SharedRows);

impl SegmentRows {
    pub fn push(&mut self, row: RowGeom) {
        self.0.write().push(row);
    }
    pub fn clear(&mut self) {
        self.0.write().clear();
    }
    pub fn replace(&mut self, rows: Vec<RowGeom>) {
        *self.0.write() = rows;
    }
    /// The rows, to read in place.
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<RowGeom>> {
        self.0.read()
    }
    pub fn to_vec(&self) -> Vec<RowGeom> {
        self.0.read().clone()
    }
    pub fn len(&self) -> usize {
        self.0.read().len()
    }
    pub fn last(&self) -> Option<RowGeom> {
        self.0.read().last().copied()
    }
}

/// The row of `rows` (in offset order) holding block `offset`.
pub(super) fn row_in(rows: &[RowGeom], offset: u32) -> Option<RowGeom> {
    let i = rows.partition_point(|r| r.offset <= offset);
    let r = rows.get(i.checked_sub(1)?)?;
    (offset < r.offset + r.height as u32).then_some(*r)
}

impl ReadIndex {
    /// Publishes the rows in flight (a ledger holder: before the map points
    /// at a new row's blocks, and after a written row left the list).
    pub(super) fn publish_rows_in_flight(&self, rows: impl Iterator<Item = RowGeom>) {
        self.rows_in_flight.store(Arc::new(rows.collect()));
    }

    /// The rows in flight as last published.
    pub fn rows_in_flight(&self) -> arc_swap::Guard<Arc<Vec<RowGeom>>> {
        self.rows_in_flight.load()
    }

    /// Publishes the segments' row lists (a ledger holder, whenever the
    /// segment table grows: segments are never dropped while open).
    pub(super) fn publish_segments<'a>(&self, rows: impl Iterator<Item = &'a SegmentRows>) {
        self.segment_rows
            .store(Arc::new(rows.map(|r| r.0.clone()).collect()));
    }

    /// Whether the published row lists are `rows`, in order (an invariant).
    pub(super) fn segments_published<'a>(
        &self,
        mut rows: impl ExactSizeIterator<Item = &'a SegmentRows>,
    ) -> bool {
        let published = self.segment_rows.load();
        published.len() == rows.len()
            && published
                .iter()
                .all(|p| rows.next().is_some_and(|r| Arc::ptr_eq(p, &r.0)))
    }

    /// The row of segment `segment` holding its block `offset`, looked up
    /// without the ledger lock (see `SegmentRows`).
    pub fn row_at(&self, segment: u32, offset: u32) -> Option<RowGeom> {
        let all = self.segment_rows.load();
        let rows = all.get(segment as usize)?.read();
        row_in(&rows, offset)
    }

    /// Whether `pba` lies in one of `rows` (as `rows_in_flight` returned).
    pub fn in_flight(rows: &[RowGeom], geometry: &Geometry, pba: Pba) -> bool {
        rows.iter().any(|g| g.locate(geometry, pba).is_some())
    }
}
