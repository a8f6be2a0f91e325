//! Runs the fuzz entry point (the same one `fuzz/fuzz_targets/nbd_proto.rs` uses) over 100,000
//! pseudo-random inputs from a fixed seed, half of them shaped to get past the handshake.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

use std::time::Instant;

use lograid_nbd::fuzzing::fuzz_protocol;
use lograid_nbd::proto::*;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, count: usize) -> Vec<u8> {
        (0..count).map(|_| self.next() as u8).collect()
    }
}

/// An input laid out the way `fuzz_protocol` reads it: setup, extents, options, requests.
fn shaped_input(rng: &mut XorShift) -> Vec<u8> {
    let mut input = Vec::new();
    let size_sectors = (rng.next() % 4096) as u32;
    input.extend_from_slice(&size_sectors.to_be_bytes());
    input.push(rng.next() as u8);
    input.push(rng.next() as u8);
    input.push(rng.next() as u8);
    let extent_count = (rng.next() % 16) as u8;
    input.push(extent_count);
    input.extend_from_slice(&rng.bytes(usize::from(extent_count % 64) * 3));
    if rng.next() % 2 == 0 {
        // Structured replies, then base:allocation for the default export.
        input.extend_from_slice(&NBD_OPT_STRUCTURED_REPLY.to_be_bytes());
        input.extend_from_slice(&0u32.to_be_bytes());
        let mut meta = Vec::new();
        meta.extend_from_slice(&0u32.to_be_bytes());
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
        input.extend_from_slice(&NBD_OPT_SET_META_CONTEXT.to_be_bytes());
        input.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        input.extend_from_slice(&meta);
    }
    // NBD_OPT_GO for the default export.
    input.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    input.extend_from_slice(&6u32.to_be_bytes());
    input.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    for _ in 0..(rng.next() % 12) {
        let command = (rng.next() % 10) as u16;
        let flags = match rng.next() % 8 {
            0 => rng.next() as u16,
            1 | 2 => (rng.next() % 32) as u16,
            3 => NBD_CMD_FLAG_FUA,
            _ => 0,
        };
        let sectors = u64::from(size_sectors.max(1));
        let offset = match rng.next() % 4 {
            0 => rng.next(),
            _ => (rng.next() % sectors) * 512,
        };
        let remaining = (sectors * 512).saturating_sub(offset) / 512;
        let length = match rng.next() % 4 {
            0 => rng.next() as u32,
            _ => ((rng.next() % remaining.clamp(1, 2048)) * 512) as u32,
        };
        input.extend_from_slice(&flags.to_be_bytes());
        input.extend_from_slice(&command.to_be_bytes());
        input.extend_from_slice(&rng.next().to_be_bytes());
        input.extend_from_slice(&offset.to_be_bytes());
        input.extend_from_slice(&length.to_be_bytes());
    }
    input
}

#[test]
fn protocol_parsers_survive_100k_random_inputs() {
    let mut rng = XorShift(0x6c6f_6772_6169_6431);
    let started = Instant::now();
    let (mut sessions, mut validated, mut executed) = (0u32, 0u32, 0u32);
    for round in 0..100_000u32 {
        let input = if round % 2 == 0 {
            let length = (rng.next() % 600) as usize;
            rng.bytes(length)
        } else {
            let mut input = shaped_input(&mut rng);
            // Flip a few bytes now and then.
            if round % 3 == 0 && !input.is_empty() {
                for _ in 0..3 {
                    let at = (rng.next() as usize) % input.len();
                    input[at] = rng.next() as u8;
                }
            }
            input
        };
        let reach = fuzz_protocol(&input);
        sessions += u32::from(reach.reached_transmission);
        validated += reach.requests_validated;
        executed += reach.requests_executed;
    }
    eprintln!(
        "100k inputs in {:?}: {sessions} reached transmission, {validated} requests validated, {executed} executed",
        started.elapsed()
    );
    // The shaped half must get past the handshake and exercise the request path.
    assert!(sessions > 20_000, "{sessions}");
    assert!(executed > 50_000, "{executed}");
}

#[test]
fn fuzz_seed_corpus_runs() {
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nbd_proto");
    let mut seeds = 0;
    let mut sessions = 0;
    for entry in std::fs::read_dir(&corpus).expect("fuzz/corpus/nbd_proto") {
        let input = std::fs::read(entry.unwrap().path()).unwrap();
        let reach = fuzz_protocol(&input);
        seeds += 1;
        sessions += u32::from(reach.reached_transmission);
    }
    assert!(seeds >= 5, "only {seeds} seeds");
    assert!(
        sessions >= 4,
        "only {sessions} seeds get past the handshake"
    );
}

/// The attachments state file's fuzz entry point (`fuzz/fuzz_targets/attach_state.rs`) over
/// 20,000 pseudo-random texts built from the file's own pieces (the version line, tabs,
/// newlines, carriage returns, digits, paths), and over a file as `lograid attach` writes it.
#[test]
fn attach_state_parser_survives_random_texts() {
    use lograid_nbd::fuzzing::fuzz_attach_state;
    fuzz_attach_state(
        "lograid-attachments-v1\n/dev/loop3\t4242\t/run/lograid/fuse-1-2\tnbd://127.0.0.1:10809/vol0\n\
         /dev/loop4\t0\t/srv/files\t/srv/files/vol1\n",
    );
    let pieces = [
        "lograid-attachments-v1\n",
        "\t",
        "\n",
        "\r",
        "\r\n",
        "0",
        "4294967296",
        "+7",
        "-1",
        "/dev/loop0",
        "/run/x y",
        "nbd://h/é",
        "",
    ];
    let mut rng = XorShift(0x5eed_a77a);
    for _ in 0..20_000 {
        let count = (rng.next() % 24) as usize;
        let text: String = (0..count)
            .map(|_| pieces[(rng.next() % pieces.len() as u64) as usize])
            .collect();
        fuzz_attach_state(&text);
    }
}
