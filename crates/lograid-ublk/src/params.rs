//! What a volume looks like as a block device: its sizes, limits and attributes
//! (`struct ublk_params`), computed from the export and the serving options. Pure arithmetic,
//! no system calls.
//!
//! Owns: the block sizes (512-byte logical blocks and 4 KiB physical ones, as the NBD server
//! advertises: minimum 512, preferred 4096), the largest request (1 MiB), discard and
//! write-zeroes limits, read-only and write-cache attributes, and refusing sizes a block
//! device cannot have. Must never: advertise a write cache without honouring FLUSH and FUA,
//! or a size that is not whole logical blocks.

use crate::uapi::{self, ParamBasic, ParamDiscard, Params};

/// Logical block: the unit of every request (the export contract's sector).
pub const LOGICAL_BLOCK_BYTES: u64 = 512;
const LOGICAL_BLOCK_SHIFT: u8 = 9;
/// Physical block: the engine's block; smaller writes cost a read-modify-write there.
const PHYSICAL_BLOCK_SHIFT: u8 = 12;
/// The largest request the kernel sends (it splits larger ones).
pub const MAX_IO_BYTES: u32 = 1 << 20;
/// The largest discard or write-zeroes range in one request (the engine's calls on one range
/// stay bounded in time; the kernel splits larger ones).
const MAX_RANGE_BYTES: u32 = 1 << 30;
/// Discards are worth sending in whole engine blocks.
const DISCARD_GRANULARITY_BYTES: u32 = 4096;
/// The kernel keeps sizes in bytes as a signed 64-bit number (loff_t).
const MAX_DEVICE_BYTES: u64 = i64::MAX as u64 / LOGICAL_BLOCK_BYTES * LOGICAL_BLOCK_BYTES;

/// How writes become durable on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// No volatile cache: a write completes once it is on stable storage (writes are flushed
    /// in groups before they complete). A server that dies loses no completed write, so its
    /// devices can be recovered under a mounted filesystem.
    WriteThrough,
    /// A volatile write cache, like a drive's: writes complete from memory, FLUSH and FUA make
    /// them durable. A server that dies may lose completed writes, so its devices are not
    /// recovered in place: their I/O fails, as on a drive that lost power.
    WriteBack,
}

/// Why a volume cannot be a block device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfit {
    Empty,
    NotWholeBlocks,
    TooBig,
}

impl Unfit {
    pub fn reason(self) -> &'static str {
        match self {
            Unfit::Empty => "it is empty",
            Unfit::NotWholeBlocks => "its size is not a multiple of 512 bytes",
            Unfit::TooBig => "it is larger than the kernel's largest block device (8 EiB)",
        }
    }
}

/// The parameters of a device for a volume of `size_bytes`.
pub fn device_params(size_bytes: u64, read_only: bool, cache: CacheMode) -> Result<Params, Unfit> {
    if size_bytes == 0 {
        return Err(Unfit::Empty);
    }
    if size_bytes % LOGICAL_BLOCK_BYTES != 0 {
        return Err(Unfit::NotWholeBlocks);
    }
    if size_bytes > MAX_DEVICE_BYTES {
        return Err(Unfit::TooBig);
    }
    let mut attrs = 0;
    if read_only {
        attrs |= uapi::ATTR_READ_ONLY;
    }
    if cache == CacheMode::WriteBack {
        attrs |= uapi::ATTR_VOLATILE_CACHE | uapi::ATTR_FUA;
    }
    let basic = ParamBasic {
        attrs,
        logical_bs_shift: LOGICAL_BLOCK_SHIFT,
        physical_bs_shift: PHYSICAL_BLOCK_SHIFT,
        io_opt_shift: PHYSICAL_BLOCK_SHIFT,
        io_min_shift: PHYSICAL_BLOCK_SHIFT,
        max_sectors: MAX_IO_BYTES >> LOGICAL_BLOCK_SHIFT,
        chunk_sectors: 0,
        dev_sectors: size_bytes / LOGICAL_BLOCK_BYTES,
        virt_boundary_mask: 0,
    };
    let mut params = Params {
        len: uapi::PARAMS_LEN,
        types: uapi::PARAM_TYPE_BASIC,
        basic,
        discard: ParamDiscard::default(),
    };
    if !read_only {
        params.types |= uapi::PARAM_TYPE_DISCARD;
        params.discard = ParamDiscard {
            discard_alignment: 0,
            discard_granularity: DISCARD_GRANULARITY_BYTES,
            max_discard_sectors: MAX_RANGE_BYTES >> LOGICAL_BLOCK_SHIFT,
            max_write_zeroes_sectors: MAX_RANGE_BYTES >> LOGICAL_BLOCK_SHIFT,
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    Ok(params)
}

/// The size in bytes of a device with these parameters.
pub fn size_bytes_of(params: &Params) -> u64 {
    params.basic.dev_sectors.saturating_mul(LOGICAL_BLOCK_BYTES)
}

/// The cache mode a device was made with.
pub fn cache_mode_of(params: &Params) -> CacheMode {
    if params.basic.attrs & uapi::ATTR_VOLATILE_CACHE != 0 {
        CacheMode::WriteBack
    } else {
        CacheMode::WriteThrough
    }
}

/// Whether a device was made read-only.
pub fn read_only_of(params: &Params) -> bool {
    params.basic.attrs & uapi::ATTR_READ_ONLY != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_write_through_volume() {
        let params = device_params(64 << 20, false, CacheMode::WriteThrough).unwrap();
        assert_eq!(params.basic.dev_sectors, (64 << 20) / 512);
        assert_eq!(params.basic.attrs, 0);
        assert_eq!(params.basic.logical_bs_shift, 9);
        assert_eq!(params.basic.physical_bs_shift, 12);
        assert_eq!(params.basic.max_sectors, 2048);
        assert_eq!(
            params.types,
            uapi::PARAM_TYPE_BASIC | uapi::PARAM_TYPE_DISCARD
        );
        assert_eq!(params.discard.max_discard_segments, 1);
        assert_eq!(params.discard.discard_granularity, 4096);
        assert_eq!(params.discard.max_write_zeroes_sectors, 1 << 21);
        assert_eq!(size_bytes_of(&params), 64 << 20);
        assert_eq!(cache_mode_of(&params), CacheMode::WriteThrough);
        assert!(!read_only_of(&params));
    }

    #[test]
    fn write_back_advertises_cache_and_fua_and_read_only_no_discard() {
        let params = device_params(1 << 30, false, CacheMode::WriteBack).unwrap();
        assert_eq!(
            params.basic.attrs,
            uapi::ATTR_VOLATILE_CACHE | uapi::ATTR_FUA
        );
        assert_eq!(cache_mode_of(&params), CacheMode::WriteBack);
        let params = device_params(1 << 30, true, CacheMode::WriteThrough).unwrap();
        assert_eq!(params.basic.attrs, uapi::ATTR_READ_ONLY);
        assert_eq!(params.types, uapi::PARAM_TYPE_BASIC);
        assert!(read_only_of(&params));
    }

    #[test]
    fn sizes_a_block_device_cannot_have() {
        let wt = CacheMode::WriteThrough;
        assert_eq!(device_params(0, false, wt), Err(Unfit::Empty));
        assert_eq!(device_params(1000, false, wt), Err(Unfit::NotWholeBlocks));
        assert_eq!(
            device_params(u64::MAX / 512 * 512, false, wt),
            Err(Unfit::TooBig)
        );
        assert!(device_params(MAX_DEVICE_BYTES, false, wt).is_ok());
    }
}
