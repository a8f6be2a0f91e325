//! Fuzzes `CheckpointImage::decode`, the parser of the checkpoint blob read
//! back at every open (its CRC lives in the superblock, so the decoder sees
//! whatever bytes carry a matching CRC). Input: the blob. Whatever decodes
//! must encode (as the engine encodes it) and decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lograid::format::checkpoint::{CheckpointImage, CheckpointWriter};

fn encode(img: &CheckpointImage) -> Vec<u8> {
    let mut w = CheckpointWriter::new(
        img.checkpoint_id,
        img.next_seq,
        img.next_volume_id,
        &img.counters,
        &img.member_counters,
        img.volumes.len(),
    );
    for v in &img.volumes {
        w.volume(v.id, &v.name, v.size_bytes, v.created_unix, v.entries.iter().copied());
    }
    w.segments(&img.segments);
    w.finish(&img.heads, &img.rebuilds)
}

fuzz_target!(|data: &[u8]| {
    if let Ok(img) = CheckpointImage::decode(data) {
        let again = encode(&img);
        assert_eq!(CheckpointImage::decode(&again).expect("re-encoded checkpoint decodes"), img);
    }
});
