//! `MemExport`: an in-memory [`Export`] for tests (feature `test-util`), with allocation
//! tracking per 512-byte sector, a volatile-write model for flush checks, and fault injection.
//!
//! Owns nothing of the server; exists so that this crate's tests (and the CLI's) can drive the
//! protocol layer with real clients without an engine. Never use it to store data.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use crate::export::{Allocation, Export};

const SECTOR: u64 = crate::proto::MIN_BLOCK_SIZE as u64;
/// Most extents one `block_status` call returns.
const MAX_EXTENTS: usize = 4096;

/// Which calls an injected fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
}

#[derive(Clone, Debug)]
struct Fault {
    op: FaultOp,
    range: Range<u64>,
    errno: i32,
}

struct MemState {
    data: Vec<u8>,
    /// Per 512-byte sector.
    allocation: Vec<Allocation>,
}

/// A `Vec<u8>`-backed export. Freshly created, every sector is a hole.
pub struct MemExport {
    name: String,
    description: String,
    read_only: bool,
    state: RwLock<MemState>,
    faults: Mutex<Vec<Fault>>,
    delays: Mutex<Vec<(FaultOp, Range<u64>, Duration)>>,
    delay: Mutex<Duration>,
    unflushed_writes: Mutex<u64>,
    flushes: AtomicU64,
    writes: AtomicU64,
    reads: AtomicU64,
    reads_now: AtomicU64,
    fua_writes: AtomicU64,
    contract_violations: AtomicU64,
}

fn poisoned<T>(guard: Result<T, std::sync::PoisonError<T>>) -> T {
    guard.unwrap_or_else(|error| error.into_inner())
}

impl MemExport {
    /// `size_bytes` is rounded up to a multiple of 512.
    pub fn new(name: &str, size_bytes: u64) -> Self {
        let size = size_bytes.div_ceil(SECTOR) * SECTOR;
        MemExport {
            name: name.to_owned(),
            description: String::new(),
            read_only: false,
            state: RwLock::new(MemState {
                data: vec![0u8; size as usize],
                allocation: vec![Allocation::Hole; (size / SECTOR) as usize],
            }),
            faults: Mutex::new(Vec::new()),
            delays: Mutex::new(Vec::new()),
            delay: Mutex::new(Duration::ZERO),
            unflushed_writes: Mutex::new(0),
            flushes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            reads_now: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            contract_violations: AtomicU64::new(0),
        }
    }

    pub fn with_description(mut self, description: &str) -> Self {
        self.description = description.to_owned();
        self
    }

    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Makes `op` calls that overlap `range` fail with OS error `errno`.
    pub fn inject_fault(&self, op: FaultOp, range: Range<u64>, errno: i32) {
        poisoned(self.faults.lock()).push(Fault { op, range, errno });
    }

    /// Makes `op` calls that overlap `range` sleep for `delay` first.
    pub fn inject_delay(&self, op: FaultOp, range: Range<u64>, delay: Duration) {
        poisoned(self.delays.lock()).push((op, range, delay));
    }

    pub fn clear_faults(&self) {
        poisoned(self.faults.lock()).clear();
        poisoned(self.delays.lock()).clear();
    }

    /// Every read and write sleeps this long first (to keep requests in flight).
    pub fn set_delay(&self, delay: Duration) {
        *poisoned(self.delay.lock()) = delay;
    }

    /// Writes (and trims, zeroes) acknowledged without FUA since the last flush.
    pub fn unflushed_writes(&self) -> u64 {
        *poisoned(self.unflushed_writes.lock())
    }

    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    pub fn write_count(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    pub fn fua_write_count(&self) -> u64 {
        self.fua_writes.load(Ordering::SeqCst)
    }

    /// Calls that broke the [`Export`] contract (unaligned or out of bounds); must stay 0.
    pub fn contract_violations(&self) -> u64 {
        self.contract_violations.load(Ordering::SeqCst)
    }

    pub fn read_count(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Reads done through `try_read_now` (on the server's event loop).
    pub fn reads_now(&self) -> u64 {
        self.reads_now.load(Ordering::SeqCst)
    }

    /// A copy of `[offset, offset+length)`, bypassing the protocol.
    pub fn contents(&self, offset: u64, length: u64) -> Vec<u8> {
        let state = poisoned(self.state.read());
        state.data[offset as usize..(offset + length) as usize].to_vec()
    }

    /// Stores `bytes` at `offset` as data, bypassing the protocol.
    pub fn fill(&self, offset: u64, bytes: &[u8]) {
        let mut state = poisoned(self.state.write());
        state.data[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        let first = (offset / SECTOR) as usize;
        let last = (offset + bytes.len() as u64).div_ceil(SECTOR) as usize;
        for sector in &mut state.allocation[first..last] {
            *sector = Allocation::Data;
        }
    }

    /// Allocation of the sector holding `offset`.
    pub fn allocation_at(&self, offset: u64) -> Allocation {
        poisoned(self.state.read()).allocation[(offset / SECTOR) as usize]
    }

    fn check(&self, op: FaultOp, offset: u64, length: u64) -> io::Result<()> {
        let end = offset
            .checked_add(length)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let size = poisoned(self.state.read()).data.len() as u64;
        if offset % SECTOR != 0 || length % SECTOR != 0 || end > size {
            // The server must never let such a call through; tests assert the count stays zero.
            self.contract_violations.fetch_add(1, Ordering::SeqCst);
            tracing::error!(
                "MemExport: bad {op:?} call offset={offset} length={length} size={size}"
            );
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let delay = poisoned(self.delays.lock())
            .iter()
            .filter(|(delay_op, range, _)| {
                *delay_op == op && range.start < end.max(offset + 1) && offset < range.end
            })
            .map(|(_, _, delay)| *delay)
            .max();
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        for fault in poisoned(self.faults.lock()).iter() {
            // A call of no length (a flush) meets the faults that cover its offset.
            if fault.op == op && fault.range.start < end.max(offset + 1) && offset < fault.range.end
            {
                return Err(io::Error::from_raw_os_error(fault.errno));
            }
        }
        Ok(())
    }

    fn sleep(&self) {
        let delay = *poisoned(self.delay.lock());
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }

    fn note_write(&self, fua: bool) {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        } else {
            *poisoned(self.unflushed_writes.lock()) += 1;
        }
    }

    fn set_range(&self, offset: u64, length: u64, allocation: Allocation) {
        let mut state = poisoned(self.state.write());
        state.data[offset as usize..(offset + length) as usize].fill(0);
        let first = (offset / SECTOR) as usize;
        let last = ((offset + length) / SECTOR) as usize;
        for sector in &mut state.allocation[first..last] {
            *sector = allocation;
        }
    }
}

impl Export for MemExport {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn size_bytes(&self) -> u64 {
        poisoned(self.state.read()).data.len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(FaultOp::Read, offset, buf.len() as u64)?;
        self.sleep();
        self.reads.fetch_add(1, Ordering::SeqCst);
        let state = poisoned(self.state.read());
        buf.copy_from_slice(&state.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    /// Every read at once, as from memory, unless reads are made slow (then they are left to
    /// the blocking pool, as a drive's would be). Injected faults fail it as they fail `read`.
    fn try_read_now(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        if !poisoned(self.delay.lock()).is_zero() || !poisoned(self.delays.lock()).is_empty() {
            return None;
        }
        self.reads_now.fetch_add(1, Ordering::SeqCst);
        Some(self.read(offset, buf))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.check(FaultOp::Write, offset, data.len() as u64)?;
        self.sleep();
        {
            let mut state = poisoned(self.state.write());
            state.data[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            let first = (offset / SECTOR) as usize;
            let last = (offset + data.len() as u64).div_ceil(SECTOR) as usize;
            for sector in &mut state.allocation[first..last] {
                *sector = Allocation::Data;
            }
        }
        self.note_write(fua);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.check(FaultOp::Flush, 0, 0)?;
        *poisoned(self.unflushed_writes.lock()) = 0;
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> io::Result<()> {
        self.check(FaultOp::Trim, offset, length)?;
        self.set_range(offset, length, Allocation::Hole);
        self.note_write(fua);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fua: bool) -> io::Result<()> {
        self.check(FaultOp::WriteZeroes, offset, length)?;
        self.set_range(
            offset,
            length,
            if no_hole {
                Allocation::Zero
            } else {
                Allocation::Hole
            },
        );
        self.note_write(fua);
        Ok(())
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<(u64, Allocation)>> {
        self.check(FaultOp::BlockStatus, offset, length)?;
        let state = poisoned(self.state.read());
        let first = (offset / SECTOR) as usize;
        let last = ((offset + length) / SECTOR) as usize;
        let mut extents: Vec<(u64, Allocation)> = Vec::new();
        for &allocation in &state.allocation[first..last] {
            match extents.last_mut() {
                Some((len, last_allocation)) if *last_allocation == allocation => *len += SECTOR,
                _ => {
                    if extents.len() == MAX_EXTENTS {
                        break;
                    }
                    extents.push((SECTOR, allocation));
                }
            }
        }
        Ok(extents)
    }
}
