//! The adapter between an engine volume and the NBD server: `impl
//! lograid_nbd::Export` for a [`lograid::Volume`].
//!
//! Owns: translating NBD calls into volume calls (FUA as `write_fua` or a
//! flush after the operation, allocation states), and engine errors into OS
//! error numbers, logging the engine's own message (the client only ever
//! sees the errno). Must never: reinterpret or retry an engine error, or
//! acknowledge anything the engine did not.

use lograid::Volume;
use lograid_nbd::{Allocation, Export};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Warnings logged per second at most (a dead drive must not flood the log);
/// the rest are counted and summarised.
const MAX_WARNINGS_PER_SECOND: u64 = 20;

/// One engine volume served as one NBD export named after it.
pub struct VolumeExport {
    volume: Volume,
    name: String,
    description: String,
    read_only: bool,
    /// Rate limit of warnings: the current second and how many were logged in it.
    warn_second: AtomicU64,
    warn_count: AtomicU64,
    warn_suppressed: AtomicU64,
}

impl VolumeExport {
    pub fn new(volume: Volume, pool_name: &str, read_only: bool) -> VolumeExport {
        let name = volume.name().to_string();
        VolumeExport {
            description: format!("lograid pool '{pool_name}', volume '{name}'"),
            name,
            volume,
            read_only,
            warn_second: AtomicU64::new(0),
            warn_count: AtomicU64::new(0),
            warn_suppressed: AtomicU64::new(0),
        }
    }

    /// Maps an engine error to the errno the client gets, logging the engine's message.
    fn fail(&self, op: &str, offset: u64, length: u64, e: lograid::Error) -> io::Error {
        let errno = e.errno();
        match errno {
            libc::EINVAL | libc::ENOSPC => {
                tracing::debug!(export = %self.name, op, offset, length, errno, "request failed: {e}")
            }
            _ => {
                if self.may_warn() {
                    tracing::warn!(export = %self.name, op, offset, length, errno, "request failed: {e}")
                }
            }
        }
        io::Error::from_raw_os_error(errno)
    }

    fn may_warn(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let second = self.warn_second.load(Ordering::Relaxed);
        if second != now
            && self
                .warn_second
                .compare_exchange(second, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.warn_count.store(0, Ordering::Relaxed);
            let suppressed = self.warn_suppressed.swap(0, Ordering::Relaxed);
            if suppressed > 0 {
                tracing::warn!(export = %self.name, "{suppressed} more failed requests were not logged");
            }
        }
        if self.warn_count.fetch_add(1, Ordering::Relaxed) < MAX_WARNINGS_PER_SECOND {
            true
        } else {
            self.warn_suppressed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    fn flush_if(&self, fua: bool, op: &str, offset: u64, length: u64) -> io::Result<()> {
        if fua {
            self.volume
                .flush()
                .map_err(|e| self.fail(op, offset, length, e))?;
        }
        Ok(())
    }
}

fn to_nbd(allocation: lograid::Allocation) -> Allocation {
    match allocation {
        lograid::Allocation::Data => Allocation::Data,
        lograid::Allocation::Zero => Allocation::Zero,
        lograid::Allocation::Hole => Allocation::Hole,
    }
}

impl Export for VolumeExport {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let length = buf.len() as u64;
        self.volume
            .read(offset, buf)
            .map_err(|e| self.fail("read", offset, length, e))
    }

    fn try_read_now(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        let length = buf.len() as u64;
        self.volume
            .try_read_now(offset, buf)
            .map(|r| r.map_err(|e| self.fail("read", offset, length, e)))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let length = data.len() as u64;
        let result = if fua {
            self.volume.write_fua(offset, data)
        } else {
            self.volume.write(offset, data)
        };
        result.map_err(|e| self.fail(if fua { "write+fua" } else { "write" }, offset, length, e))
    }

    fn try_write_now(&self, offset: u64, data: &[u8]) -> Option<io::Result<()>> {
        let length = data.len() as u64;
        self.volume
            .try_write_now(offset, data)
            .map(|r| r.map_err(|e| self.fail("write", offset, length, e)))
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            // Nothing can have been written; a read-only pool has nothing to flush.
            return Ok(());
        }
        self.volume.flush().map_err(|e| self.fail("flush", 0, 0, e))
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> io::Result<()> {
        self.volume
            .trim(offset, length)
            .map_err(|e| self.fail("trim", offset, length, e))?;
        self.flush_if(fua, "trim+fua", offset, length)
    }

    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fua: bool) -> io::Result<()> {
        // The engine stores whole zero blocks as zero records (no data, not a
        // hole) and writes partial edge blocks: correct with and without
        // NO_HOLE, and always fast (so FAST_ZERO needs no special case).
        self.volume
            .write_zeroes(offset, length, no_hole)
            .map_err(|e| self.fail("write_zeroes", offset, length, e))?;
        self.flush_if(fua, "write_zeroes+fua", offset, length)
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<(u64, Allocation)>> {
        let runs = self
            .volume
            .block_status(offset, length)
            .map_err(|e| self.fail("block_status", offset, length, e))?;
        let mut out: Vec<(u64, Allocation)> = Vec::with_capacity(runs.len());
        for (run_length, allocation) in runs {
            if run_length == 0 {
                continue;
            }
            let allocation = to_nbd(allocation);
            match out.last_mut() {
                Some((last_length, last)) if *last == allocation => *last_length += run_length,
                _ => out.push((run_length, allocation)),
            }
        }
        if out.is_empty() {
            // The server needs at least one extent; an engine that returned
            // none has told us nothing, so claim nothing (data).
            out.push((length, Allocation::Data));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lograid::{CreateOptions, PoolOptions};

    fn pool_in(dir: &std::path::Path) -> lograid::Pool {
        let paths: Vec<_> = (0..3).map(|i| dir.join(format!("m{i}.img"))).collect();
        let members = lograid::open_new_members(&paths, Some(256 << 20), false).unwrap();
        let opts = CreateOptions {
            initial_volume: Some(("vol0".into(), 64 << 20)),
            ..Default::default()
        };
        lograid::create_pool(
            members,
            &opts,
            PoolOptions {
                background_cleaner: false,
                io_threads: 4,
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn adapter_maps_calls_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool_in(dir.path());
        let export = VolumeExport::new(pool.volume("vol0").unwrap(), pool.name(), false);
        assert_eq!(export.name(), "vol0");
        assert_eq!(export.size_bytes(), 64 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        export.write(4096, &data, true).unwrap();
        let mut back = vec![0u8; 8192];
        export.read(4096, &mut back).unwrap();
        assert_eq!(back, data);
        let status = export.block_status(0, 64 << 20).unwrap();
        assert_eq!(
            status.iter().map(|(l, _)| l).sum::<u64>(),
            64 << 20,
            "{status:?}"
        );
        assert_eq!(status[0], (4096, Allocation::Hole));
        assert_eq!(status[1], (8192, Allocation::Data));
        export.trim(4096, 8192, false).unwrap();
        export.read(4096, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(
            export.block_status(4096, 8192).unwrap()[0].1,
            Allocation::Hole
        );
        export.write(0, &data, false).unwrap();
        export.write_zeroes(0, 8192, true, true).unwrap();
        export.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        // Past the end: the engine's EINVAL reaches the client as EINVAL.
        let e = export.read(64 << 20, &mut back).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = export.write(1, &data[..512], false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        export.flush().unwrap();
        pool.close().unwrap();
        // A closed pool refuses further use.
        let e = export.write(0, &data, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    }
}
