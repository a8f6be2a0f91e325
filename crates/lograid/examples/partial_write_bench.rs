//! Sub-block writes at queue depth 1: random 512-byte writes (also with a
//! flush every 64 writes), and random 512 B-64 KiB writes at 512-byte
//! granularity, into a volume whose blocks
//! are all stored (so a write that covers a block only partly has an old
//! block to merge with). Three sparse 1 GiB file members opened with
//! O_DIRECT, parity 1. Reports writes/s, member reads during the writes,
//! the final flush, and checks every byte of the volume afterwards.
//!
//! cargo run --release -p lograid --example partial_write_bench [-- DIR [WRITES]]
//! (DIR defaults to a new folder in /tmp, removed afterwards.)

use lograid::{CreateOptions, Pool, PoolOptions, Volume};
use std::path::{Path, PathBuf};
use std::time::Instant;

const VOLUME_BYTES: u64 = 256 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = match args.get(1) {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join(format!("lograid-partial-bench-{}", std::process::id())),
    };
    let writes: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    std::fs::create_dir_all(&dir).expect("create dir");
    let result = std::panic::catch_unwind(|| run(&dir, writes));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn run(dir: &Path, writes: u64) {
    let workloads = [
        ("random 512 B", 1u64, u64::MAX),
        ("random 512 B, flush every 64", 1, 64),
        ("random 512 B-64 KiB", 128, u64::MAX),
    ];
    for (name, max_sectors, flush_every) in workloads {
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}.img"))).collect();
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        let members = lograid::open_new_members(&paths, Some(1 << 30), true).expect("members");
        let opts = CreateOptions {
            name: "bench".into(),
            parity: 1,
            ..Default::default()
        };
        let pool = lograid::create_pool(members, &opts, PoolOptions::default()).expect("pool");
        let volume = pool.create_volume("v", VOLUME_BYTES).expect("volume");
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        // Every block stored: 1 MiB sequential writes.
        let mut rng = 0x1234_5678_9abc_def1u64 ^ max_sectors ^ flush_every;
        for (i, chunk) in model.chunks_mut(1 << 20).enumerate() {
            fill(&mut rng, chunk);
            volume.write((i as u64) << 20, chunk).expect("prefill");
        }
        volume.flush().expect("flush");
        let reads_before = member_reads(&pool);
        let mut data = vec![0u8; 128 * 512];
        let mut bytes = 0u64;
        let start = Instant::now();
        let mut flushes = 0u64;
        for i in 0..writes {
            let sectors = 1 + next(&mut rng) % max_sectors;
            let len = sectors * 512;
            let off = next(&mut rng) % (VOLUME_BYTES / 512 - sectors + 1) * 512;
            let buf = &mut data[..len as usize];
            fill(&mut rng, buf);
            volume.write(off, buf).expect("write");
            model[off as usize..(off + len) as usize].copy_from_slice(buf);
            bytes += len;
            if i % flush_every == flush_every - 1 {
                volume.flush().expect("flush");
                flushes += 1;
            }
        }
        let write_secs = start.elapsed().as_secs_f64();
        let reads_during = member_reads(&pool) - reads_before;
        let t = Instant::now();
        volume.flush().expect("flush");
        let flush_secs = t.elapsed().as_secs_f64();
        let total_secs = start.elapsed().as_secs_f64();
        println!(
            "{name}: {writes} writes ({:.1} MiB, {flushes} flushes) in {write_secs:.2} s = {:.0} writes/s; \
             member reads during the writes: {reads_during}; final flush {:.1} ms; \
             with the flush {:.0} writes/s",
            bytes as f64 / (1 << 20) as f64,
            writes as f64 / write_secs,
            flush_secs * 1000.0,
            writes as f64 / total_secs,
        );
        verify(&volume, &model);
        pool.close().expect("close");
        drop(volume);
        drop(pool);
        // Reopened, the data is still all there.
        let pool = lograid::open_paths(&paths, PoolOptions::default(), false).expect("reopen");
        verify(&pool.volume("v").expect("volume"), &model);
        pool.close().expect("close");
        drop(pool);
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn member_reads(pool: &Pool) -> u64 {
    pool.status().members.iter().map(|m| m.counters.reads).sum()
}

fn verify(volume: &Volume, model: &[u8]) {
    let mut buf = vec![0u8; 1 << 20];
    for (i, want) in model.chunks(1 << 20).enumerate() {
        volume.read((i as u64) << 20, &mut buf).expect("read");
        assert!(buf == want, "volume differs from the model in MiB {i}");
    }
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn fill(rng: &mut u64, buf: &mut [u8]) {
    for c in buf.chunks_mut(8) {
        let v = next(rng).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}
