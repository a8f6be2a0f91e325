//! The on-disk format: every structure lograid writes to a member, encoded and
//! decoded here and nowhere else. docs/FORMAT.md is the written specification;
//! this module is its implementation. All integers are little-endian, every
//! structure carries a magic, a version and a CRC-32C, and every decoder is
//! total: corrupt, truncated or hostile bytes give a `FormatError`, never a
//! panic or an out-of-bounds read.

pub mod checkpoint;
pub mod codec;
pub mod row;
pub mod superblock;

pub use codec::{ByteReader, ByteWriter};

/// The unit of checksums, mapping and member I/O.
pub const BLOCK_SIZE: usize = 4096;
/// `BLOCK_SIZE` typed for offset arithmetic (the same constant).
pub const BLOCK_BYTES: u64 = BLOCK_SIZE as u64;
/// The smallest unit volumes are read and written in (NBD's minimum block
/// size); a block holds `BLOCK_SIZE / SECTOR_BYTES` of them.
pub const SECTOR_BYTES: u64 = 512;
/// The on-disk format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Members per pool, at most.
pub const MAX_MEMBERS: usize = 24;
/// Parity columns per row, at most.
pub const MAX_PARITY: usize = 3;
/// Segments per pool, at most (bounds the segment table a superblock can ask for).
pub const MAX_SEGMENTS: u64 = 1 << 24;
/// Blocks per member, at most: 4 PiB. Physical addresses on disk keep 48
/// bits of block number; the in-memory map packs member and block in 46.
pub const MAX_MEMBER_BLOCKS: u64 = 1 << 40;
/// First block of a member's data area (1 MiB): blocks before it hold the
/// superblock slots and stay clear of partition tables.
pub const DATA_START_BLOCK: u64 = 256;
/// Blocks reserved at the end of a member for the trailing superblock slots.
pub const TAIL_BLOCKS: u64 = 2;

// The limits fit the types and packings that carry them.
const _: () = {
    assert!(BLOCK_SIZE.is_power_of_two());
    assert!(BLOCK_BYTES.is_multiple_of(SECTOR_BYTES));
    // A block's sectors are one bit each in a u8 mask (sub-block writes).
    assert!(BLOCK_BYTES / SECTOR_BYTES <= 8);
    // Member sets are u32 masks; the map packs a member index in 6 bits.
    assert!(MAX_MEMBERS <= 32 && MAX_MEMBERS < 64);
    assert!(MAX_PARITY < MAX_MEMBERS);
    // The map packs a block number in 40 bits, a PBA in 48.
    assert!(MAX_MEMBER_BLOCKS <= 1 << 40);
    // The data area starts after the head superblock slots.
    assert!(DATA_START_BLOCK >= 2);
};

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated structure: needed {needed} more bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic (not a lograid structure)")]
    BadMagic,
    #[error("unsupported format version {0} (this build reads version {FORMAT_VERSION})")]
    BadVersion(u32),
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("invalid field: {0}")]
    Invalid(String),
}

/// CRC-32C (Castagnoli), the checksum of every block and structure.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    // The algorithm's value fits its 32 bits.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// CRC-32C of `bytes` computed as if the 4 bytes at `field_at` were zero.
pub fn crc32c_skipping(bytes: &[u8], field_at: usize) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    digest.update(&bytes[..field_at]);
    digest.update(&[0u8; 4]);
    digest.update(&bytes[field_at + 4..]);
    digest.finalize() as u32
}

/// The checksum of a block of zeroes, used for padding and zero-filled blocks.
pub fn zero_block_crc() -> u32 {
    static ZERO: [u8; BLOCK_SIZE] = [0u8; BLOCK_SIZE];
    crc32c(&ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum is the format's: CRC-32C's check value, and values that
    /// pools written by earlier builds hold (a zero block, a patterned one).
    #[test]
    fn crc32c_is_the_castagnoli_crc_of_every_length() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(zero_block_crc(), 0x98f9_4189);
        let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i * 7 + i / 256) as u8).collect();
        assert_eq!(crc32c(&block), 0x162f_e1b7);
        // Any length, any alignment: the same as a byte-at-a-time CRC.
        for (start, len) in [(0, 1), (1, 7), (3, 64), (5, 511), (0, 4095), (1, 4095)] {
            let bytes = &block[start..start + len];
            assert_eq!(crc32c(bytes), bitwise(bytes), "{start}+{len}");
        }
    }

    #[test]
    fn a_skipped_field_counts_as_zeroes() {
        let mut bytes: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        let skipped = crc32c_skipping(&bytes, 40);
        bytes[40..44].fill(0);
        assert_eq!(skipped, crc32c(&bytes));
    }

    fn bitwise(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
