//! Shared test support: pools on simulated drives that can be crashed and
//! reopened, and a reference model of a volume that knows which contents
//! each 512-byte sector may hold.
#![allow(dead_code)]

use lograid::device::{CrashMode, Member, SimMember, SimRng};
use lograid::{create_pool, open_members, CreateOptions, Pool, PoolOptions, Volume};
use std::sync::Arc;

/// `blocks` 4 KiB blocks, every byte `tag`.
pub fn pattern(tag: u8, blocks: usize) -> Vec<u8> {
    vec![tag; blocks * lograid::format::BLOCK_SIZE]
}

/// Waits until `ready`, at most 10 s.
pub fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

pub const SECTOR: usize = lograid::format::SECTOR_BYTES as usize;

pub fn test_options() -> PoolOptions {
    PoolOptions {
        io_threads: 4,
        checkpoint_interval_blocks: 4096,
        max_inflight_rows: 8,
        max_inflight_bytes: 16 << 20,
        background_cleaner: false,
        // Sub-block writes are merged by writers and flushes only (no
        // background thread; the row writer still runs, so a seed fixes
        // the workload, not the exact order of the members' I/O).
        background_resolver: false,
        // Freed segments are zeroed by the simulated drives, so a segment
        // freed while still needed shows up as lost data.
        discard: true,
        ..Default::default()
    }
}

/// A pool on simulated drives with one volume named "vol".
pub struct SimPool {
    pub sims: Vec<Arc<SimMember>>,
    pool: Option<Pool>,
    volume: Option<Volume>,
    /// The options the pool is opened with (again after a crash).
    options: PoolOptions,
}

impl SimPool {
    pub fn create(members: usize, parity: u8, member_bytes: u64, fill: f64) -> SimPool {
        Self::create_with_options(members, parity, member_bytes, fill, test_options())
    }

    pub fn create_with_options(
        members: usize,
        parity: u8,
        member_bytes: u64,
        fill: f64,
        options: PoolOptions,
    ) -> SimPool {
        let sims: Vec<Arc<SimMember>> = (0..members)
            .map(|i| Arc::new(SimMember::new(&format!("sim{i}"), member_bytes)))
            .collect();
        let dyn_members: Vec<Arc<dyn Member>> =
            sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect();
        let opts = CreateOptions {
            name: "test".into(),
            parity,
            chunk_bytes: 16 * 1024,
            segment_bytes: Some(64 * 1024),
            force: true,
            initial_volume: None,
        };
        let pool = create_pool(dyn_members, &opts, options.clone()).expect("create pool");
        let usable = pool.status().usable_bytes;
        let size = ((usable as f64 * fill) as u64 / 4096).max(16) * 4096;
        let volume = pool.create_volume("vol", size).expect("create volume");
        SimPool {
            sims,
            pool: Some(pool),
            volume: Some(volume),
            options,
        }
    }

    pub fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("open")
    }
    pub fn volume(&self) -> &Volume {
        self.volume.as_ref().expect("open")
    }
    pub fn volume_size(&self) -> u64 {
        self.volume().size_bytes()
    }

    fn reopen_from(
        images: Vec<Vec<u8>>,
        rng: Option<&mut SimRng>,
        options: PoolOptions,
    ) -> lograid::Result<SimPool> {
        let sims: Vec<Arc<SimMember>> = images
            .into_iter()
            .enumerate()
            .map(|(i, img)| Arc::new(SimMember::from_image(&format!("sim{i}"), img)))
            .collect();
        let mut order: Vec<Arc<dyn Member>> =
            sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect();
        if let Some(rng) = rng {
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let pool = open_members(order, options.clone(), false)?;
        let volume = pool.volume("vol")?;
        Ok(SimPool {
            sims,
            pool: Some(pool),
            volume: Some(volume),
            options,
        })
    }

    /// What the members would hold after a power cut now (keeping what
    /// `mode` says of unflushed writes), while this pool goes on running.
    pub fn images_now(&self, mode: CrashMode, rng: &mut SimRng) -> Vec<Vec<u8>> {
        self.sims.iter().map(|s| s.crash_image(mode, rng)).collect()
    }

    /// A pool opened from member images (see `images_now`).
    pub fn open_images(images: Vec<Vec<u8>>, options: PoolOptions) -> lograid::Result<SimPool> {
        Self::reopen_from(images, None, options)
    }

    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// Power cut: every member keeps what `mode` says of its unflushed writes.
    pub fn crash(mut self, mode: CrashMode, rng: &mut SimRng) -> lograid::Result<SimPool> {
        let images: Vec<Vec<u8>> = self.sims.iter().map(|s| s.crash_image(mode, rng)).collect();
        self.volume.take();
        self.pool.take();
        Self::reopen_from(images, Some(rng), self.options.clone())
    }

    /// Clean close and reopen.
    pub fn reopen_clean(mut self) -> lograid::Result<SimPool> {
        self.pool().close()?;
        let images: Vec<Vec<u8>> = self.sims.iter().map(|s| s.snapshot()).collect();
        self.volume.take();
        self.pool.take();
        Self::reopen_from(images, None, self.options.clone())
    }

    pub fn read_all(&self) -> lograid::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.volume_size() as usize];
        self.volume().read(0, &mut buf)?;
        Ok(buf)
    }
}

/// The contents of one sector written by write `tag` (0: zeroes).
pub fn sector_pattern(tag: u64, sector: u64, out: &mut [u8]) {
    if tag == 0 {
        out.fill(0);
        return;
    }
    out[..8].copy_from_slice(&tag.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sector;
    for chunk in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Which write a sector's bytes came from (None: not a pattern we wrote).
pub fn sector_tag(bytes: &[u8], sector: u64) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let tag = u64::from_le_bytes(bytes[..8].try_into().ok()?);
    let mut expect = vec![0u8; SECTOR];
    sector_pattern(tag, sector, &mut expect);
    (expect == bytes).then_some(tag)
}

/// Reference model of a volume.
#[derive(Clone)]
pub struct Model {
    pub current: Vec<u64>,
    durable: Vec<u64>,
    since_flush: Vec<Vec<u64>>,
    next_tag: u64,
    last_write: Option<(u64, u64, Vec<u64>)>,
}

impl Model {
    pub fn new(size_bytes: u64) -> Model {
        let n = (size_bytes / SECTOR as u64) as usize;
        Model {
            current: vec![0; n],
            durable: vec![0; n],
            since_flush: vec![Vec::new(); n],
            next_tag: 1,
            last_write: None,
        }
    }

    pub fn random_range(&self, rng: &mut SimRng, max_len: u64) -> (u64, u64) {
        let size = self.current.len() as u64 * SECTOR as u64;
        let aligned = rng.below(2) == 0;
        let unit = if aligned { 4096 } else { SECTOR as u64 };
        let off = rng.below(size / unit) * unit;
        let len = ((rng.below(max_len / unit) + 1) * unit).min(size - off);
        (off, len)
    }

    fn set(&mut self, sector: usize, tag: u64) {
        self.current[sector] = tag;
        self.since_flush[sector].push(tag);
    }

    /// Records a write and returns its bytes.
    pub fn write(&mut self, off: u64, len: u64) -> Vec<u8> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let first = (off / SECTOR as u64) as usize;
        let n = (len / SECTOR as u64) as usize;
        let mut data = vec![0u8; len as usize];
        let before: Vec<u64> = self.current[first..first + n].to_vec();
        for i in 0..n {
            sector_pattern(
                tag,
                (first + i) as u64,
                &mut data[i * SECTOR..(i + 1) * SECTOR],
            );
            self.set(first + i, tag);
        }
        self.last_write = Some((off, len, before));
        data
    }

    /// The last write failed (pool full): it may have applied in part, so
    /// both values stay possible after a crash; `current` becomes unknown
    /// until `resolve`.
    pub fn forget_last_write(&mut self) {
        if let Some((off, len, before)) = self.last_write.take() {
            let first = (off / SECTOR as u64) as usize;
            for (i, &b) in before.iter().enumerate() {
                let s = first + i;
                self.current[s] = u64::MAX; // unknown
                self.since_flush[s].push(b);
            }
            let _ = len;
        }
    }

    fn trim_like(&mut self, off: u64, len: u64, whole_blocks_only: bool) {
        let (start, end) = if whole_blocks_only {
            (off.div_ceil(4096) * 4096, (off + len) / 4096 * 4096)
        } else {
            (off, off + len)
        };
        let mut s = start;
        while s < end {
            self.set((s / SECTOR as u64) as usize, 0);
            s += SECTOR as u64;
        }
    }

    pub fn trim(&mut self, off: u64, len: u64) {
        self.trim_like(off, len, true);
    }

    pub fn zero(&mut self, off: u64, len: u64) {
        self.trim_like(off, len, false);
    }

    pub fn flushed(&mut self) {
        for s in 0..self.current.len() {
            // A sector of unknown value (a failed write) keeps its
            // candidates until a read tells which one the engine holds.
            if self.current[s] == u64::MAX {
                continue;
            }
            self.since_flush[s].clear();
            self.durable[s] = self.current[s];
        }
    }

    /// Reads must match exactly (no crash since the last check); sectors
    /// of unknown value learn what the engine holds if it is plausible.
    pub fn check_exact(&mut self, off: u64, data: &[u8]) -> Result<(), String> {
        let first = off / SECTOR as u64;
        for (i, bytes) in data.chunks(SECTOR).enumerate() {
            let s = first as usize + i;
            let tag = sector_tag(bytes, s as u64).ok_or_else(|| {
                format!(
                    "sector {s} (byte {}) holds bytes no write produced",
                    s * SECTOR
                )
            })?;
            let want = self.current[s];
            if want == u64::MAX {
                if tag != 0
                    && !self.since_flush[s].contains(&tag)
                    && tag != self.durable[s]
                    && !self.was_written(s, tag)
                {
                    return Err(format!(
                        "sector {s}: unknown value resolved to implausible write {tag}"
                    ));
                }
                self.current[s] = tag;
                continue;
            }
            if tag != want {
                return Err(format!(
                    "sector {s} (byte {}): read write #{tag}, expected write #{want}",
                    s * SECTOR
                ));
            }
        }
        Ok(())
    }

    fn was_written(&self, s: usize, tag: u64) -> bool {
        self.since_flush[s].contains(&tag)
    }

    /// After a crash: each sector must hold its last flushed value or a later write.
    pub fn after_crash(&mut self, observed: &[u8]) -> Result<(), String> {
        for (s, bytes) in observed.chunks(SECTOR).enumerate() {
            let tag = sector_tag(bytes, s as u64).ok_or_else(|| {
                format!(
                    "sector {s} (byte {}) holds bytes no write produced",
                    s * SECTOR
                )
            })?;
            if tag != self.durable[s] && !self.since_flush[s].contains(&tag) {
                return Err(format!(
                    "sector {s} (byte {}): holds write #{tag}; allowed: flushed #{} or one of {:?}",
                    s * SECTOR,
                    self.durable[s],
                    self.since_flush[s]
                ));
            }
            self.current[s] = tag;
            self.durable[s] = tag;
            self.since_flush[s].clear();
        }
        Ok(())
    }
}
