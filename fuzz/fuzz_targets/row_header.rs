//! Fuzzes `RowHeader::decode`, `peek_geometry` and `peek_header_blocks`, the
//! parsers of the blocks recovery and the cleaner read from the log. Input:
//! byte 0 selects the mode, the rest is the header.
//! - even: the bytes as they are;
//! - odd: the bytes with a valid magic and version, `header_blocks` set to
//!   1 + (mode / 2) % 4 and the CRC forged, so that every field check
//!   behind the checksum is reached.
//! Whatever decodes must re-encode and decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lograid::format::row::RowHeader;
use lograid::format::{crc32c_skipping, BLOCK_SIZE, FORMAT_VERSION};

fn check(bytes: &[u8]) {
    let _ = RowHeader::peek_header_blocks(bytes);
    let _ = RowHeader::peek_geometry(bytes);
    if let Ok((h, crc)) = RowHeader::decode(bytes) {
        let (again, crc2) = h.encode();
        let (back, crc3) = RowHeader::decode(&again).expect("re-encoded header decodes");
        assert_eq!(back, h);
        assert_eq!(crc2, crc3);
        let _ = crc;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else { return };
    if mode % 2 == 0 {
        check(bytes);
        return;
    }
    let header_blocks = 1 + (mode as u16 / 2) % 4;
    let mut b = bytes.to_vec();
    b.resize(header_blocks as usize * BLOCK_SIZE, 0);
    b[..8].copy_from_slice(b"LGRDROW1");
    b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[12..14].copy_from_slice(&header_blocks.to_le_bytes());
    let crc = crc32c_skipping(&b, 124);
    b[124..128].copy_from_slice(&crc.to_le_bytes());
    check(&b);
});
