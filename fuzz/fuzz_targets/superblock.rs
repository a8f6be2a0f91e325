//! Fuzzes `Superblock::decode`, the parser of a member's first and last
//! blocks. Input: byte 0 selects the mode, the rest is the block.
//! - even: the bytes as they are (most stop at the magic or the CRC);
//! - odd: the bytes with a valid magic, version and CRC forged in, so that
//!   every field check behind the checksum is reached.
//! Whatever decodes must re-encode and decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lograid::format::superblock::Superblock;
use lograid::format::{crc32c_skipping, BLOCK_SIZE, FORMAT_VERSION};

fn check(block: &[u8]) {
    if let Ok(sb) = Superblock::decode(block) {
        let again = sb.encode();
        assert_eq!(Superblock::decode(&again).expect("re-encoded superblock decodes"), sb);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else { return };
    if mode % 2 == 0 {
        check(bytes);
        return;
    }
    let mut block = bytes.to_vec();
    block.resize(BLOCK_SIZE, 0);
    block[..8].copy_from_slice(b"LGRDSUPR");
    block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c_skipping(&block, BLOCK_SIZE - 4);
    block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    check(&block);
});
