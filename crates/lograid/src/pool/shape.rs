//! The facts fixed while a pool is open (`Shape`): geometry, parity of new
//! rows, identity, the member table it was opened from, and which segments
//! each member does not hold yet. Shared read-only by every part of the
//! engine; the parity alone changes (`Pool::set_parity`).

use crate::device::Device;
use crate::layout::Geometry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Facts fixed while a pool is open.
pub struct Shape {
    pub geometry: Geometry,
    /// Parity columns of new rows (changed by `Pool::set_parity`).
    pub parity: std::sync::atomic::AtomicU8,
    pub pool_uuid: u128,
    pub pool_name: String,
    pub created_unix: u64,
    /// Random per opening; stamped in every row header.
    pub nonce: u64,
    /// The member table of the superblock this pool was opened from:
    /// recovery lays segments taken after its checkpoint over these members
    /// (see `replay::segment_mask_candidates`).
    pub recorded_members: Vec<crate::format::superblock::MemberRecord>,
    /// Per member index, the segments it does not hold yet (a member that
    /// took a failed one's place, while its rows are rebuilt onto it).
    pub stale: Vec<Arc<crate::device::StaleSegments>>,
}

impl Shape {
    /// An empty stale map per member index.
    pub fn no_stale(geometry: &Geometry) -> Vec<Arc<crate::device::StaleSegments>> {
        (0..crate::format::MAX_MEMBERS)
            .map(|_| {
                Arc::new(crate::device::StaleSegments::new(
                    geometry.data_start_block * crate::format::BLOCK_BYTES,
                    geometry.segment_blocks as u64 * crate::format::BLOCK_BYTES,
                ))
            })
            .collect()
    }

    /// A device for member `m` (sharing its stale map).
    pub fn device(&self, m: usize, member: Arc<dyn crate::device::Member>) -> Arc<Device> {
        Arc::new(Device::new(member, self.stale[m].clone()))
    }

    /// Parity columns of new rows.
    pub fn parity(&self) -> u8 {
        self.parity.load(Ordering::Relaxed)
    }

    /// Can new rows go to a segment laid over `members_mask`? Only with full
    /// parity, unless fewer members are active than that needs (a pool
    /// degraded past what new rows can fully protect writes with what it has).
    pub fn segment_usable(&self, members_mask: u32, active_mask: u32) -> bool {
        let n = members_mask.count_ones();
        n > self.parity() as u32 || (n >= 2 && n == active_mask.count_ones())
    }

    /// Parity of rows in a segment laid over `members_mask`: the pool's
    /// parity, reduced only when too few members are left to hold it and
    /// one data column (degraded beyond what new rows can fully protect).
    pub fn segment_parity(&self, members_mask: u32) -> u8 {
        self.parity()
            .min(members_mask.count_ones().saturating_sub(1) as u8)
    }
}
