//! An in-memory member with a volatile write cache, for tests and the
//! deterministic simulator. Writes are visible at once but durable only after
//! `flush`; `crash` returns the drive as a power cut would leave it: the
//! durable image plus some of the unflushed writes, possibly reordered or torn.

use super::Member;
use parking_lot::Mutex;
use std::io;

/// What a crash keeps of the writes that were not flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// None of them.
    DropAll,
    /// A random subset, applied in random order.
    KeepRandomSubset,
    /// A random subset, and one of the kept writes torn at a 512-byte sector.
    TearOne,
    /// All of them (as if the cache had been written back).
    KeepAll,
}

struct SimState {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes not yet durable, oldest first: write number `pending_from + i`.
    pending: Vec<(u64, Vec<u8>)>,
    /// The number of the first pending write (writes are numbered from 0
    /// as they complete).
    pending_from: u64,
    /// Flushes that failed so far: a flush that sees one fail while it
    /// runs fails too (what it covered may be what the failure dropped).
    failed_flushes: u64,
    /// Fail every I/O (a drive that vanished).
    dead: bool,
}

pub struct SimMember {
    name: String,
    size_bytes: u64,
    state: Mutex<SimState>,
    /// Writes and flushes that fail before the member works again (a
    /// transient fault).
    transient: std::sync::atomic::AtomicU64,
    /// Flushes to come that fail (writes work).
    flush_failures: std::sync::atomic::AtomicU64,
    /// Reads fail (bad sectors everywhere, a dying drive) while writes work.
    reads_fail: std::sync::atomic::AtomicBool,
    /// The drive was pulled (`vanish`): `gone` says so; I/O still works.
    vanished: std::sync::atomic::AtomicBool,
    /// Writes to come that are acknowledged but not done (lost writes), or
    /// done `misdirect_by` bytes away from where they were sent.
    lose: std::sync::atomic::AtomicU64,
    misdirect: std::sync::atomic::AtomicU64,
    misdirect_by: std::sync::atomic::AtomicU64,
    /// Writes (and discards and flushes) left before a power cut, shared by
    /// the members of a pool: when it runs out every member stops, so a
    /// crash can land inside any operation.
    budget: Mutex<Option<PowerCut>>,
    /// I/O held at the door until released (see `SimMember::hold`).
    gate: Gate,
}

/// Which I/O a `SimMember` holds before doing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Every flush (a drive slow to write back its cache).
    Flushes,
    /// Writes starting at a byte offset in `from..to` (a superblock slot, say).
    WritesIn { from: u64, to: u64 },
}

impl Hold {
    /// Whether this rule holds `io`: a flush, or a write starting at
    /// byte `from` (given as `WritesIn { from, to: from }`).
    fn holds(self, io: Hold) -> bool {
        match (self, io) {
            (Hold::Flushes, Hold::Flushes) => true,
            (Hold::WritesIn { from, to }, Hold::WritesIn { from: at, .. }) => {
                (from..to).contains(&at)
            }
            _ => false,
        }
    }
}

/// Holds chosen I/O of a member until released, and counts what waits, so
/// that a test can stop an operation of the engine inside its member I/O
/// and do something else meanwhile (another flush, a power cut). Waits on
/// the engine's own primitives (`crate::sync`), so it works under shuttle.
#[derive(Default)]
struct Gate {
    state: crate::sync::Mutex<GateState>,
    opened: crate::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    rule: Option<Hold>,
    waiting: usize,
}

impl Gate {
    /// Waits while the rule holds `io`.
    fn pass(&self, io: Hold) {
        let mut s = self.state.lock();
        if !s.rule.is_some_and(|rule| rule.holds(io)) {
            return;
        }
        s.waiting += 1;
        while s.rule.is_some_and(|rule| rule.holds(io)) {
            self.opened.wait(&mut s);
        }
        s.waiting -= 1;
    }
}

/// A countdown shared by members; see `SimMember::power_cut_after`.
#[derive(Clone, Default)]
pub struct PowerCut(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl PowerCut {
    pub fn after(ios: u64) -> PowerCut {
        PowerCut(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(
            ios as i64,
        )))
    }
    /// Takes one I/O from the budget; false once the power is out.
    fn take(&self) -> bool {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) > 0
    }
    /// Whether an I/O found the budget spent: the power is out now. (The
    /// I/O that took the last of the budget completed; `tripped` is true
    /// from then on, `is_out` only once another one was refused.)
    pub fn is_out(&self) -> bool {
        self.remaining() < 0
    }
    /// I/Os left before the power goes out (0 or less: out).
    pub fn remaining(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub fn tripped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst) <= 0
    }
}

/// A small deterministic PRNG (xorshift64*) so crashes replay from a seed.
pub struct SimRng(pub u64);
impl SimRng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

impl SimMember {
    pub fn new(name: &str, size_bytes: u64) -> SimMember {
        SimMember::from_image(name, vec![0u8; size_bytes as usize])
    }

    pub fn from_image(name: &str, image: Vec<u8>) -> SimMember {
        SimMember {
            name: name.to_string(),
            size_bytes: image.len() as u64,
            state: Mutex::new(SimState {
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
                pending_from: 0,
                failed_flushes: 0,
                dead: false,
            }),
            budget: Mutex::new(None),
            transient: Default::default(),
            flush_failures: Default::default(),
            reads_fail: Default::default(),
            vanished: Default::default(),
            lose: Default::default(),
            misdirect: Default::default(),
            misdirect_by: Default::default(),
            gate: Gate::default(),
        }
    }

    /// Holds the I/O `rule` names (before it is done) until `release`.
    pub fn hold(&self, rule: Hold) {
        self.gate.state.lock().rule = Some(rule);
    }

    /// Lets held I/O go on, and holds nothing more.
    pub fn release(&self) {
        self.gate.state.lock().rule = None;
        self.gate.opened.notify_all();
    }

    /// I/Os waiting at the gate now.
    pub fn held(&self) -> usize {
        self.gate.state.lock().waiting
    }

    /// Makes the next `n` writes or flushes fail with EIO (then it works).
    pub fn fail_next(&self, n: u64) {
        self.transient.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` flushes fail with EIO (writes still work).
    pub fn fail_next_flushes(&self, n: u64) {
        self.flush_failures
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the drive report itself gone (as a deleted member file does).
    pub fn vanish(&self) {
        self.vanished
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes every read fail with EIO (writes still work), or not.
    pub fn fail_reads(&self, fail: bool) {
        self.reads_fail
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next `n` writes are acknowledged but never reach the medium.
    pub fn lose_next_writes(&self, n: u64) {
        self.lose.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next `n` writes land `by` bytes further on than they were sent
    /// (wrapping around the drive): the data meant for one place overwrites
    /// another, and the place it was meant for keeps its old contents.
    pub fn misdirect_next_writes(&self, n: u64, by: u64) {
        self.misdirect_by
            .store(by, std::sync::atomic::Ordering::SeqCst);
        self.misdirect.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes one of a countdown of faults, if any are left.
    fn take(counter: &std::sync::atomic::AtomicU64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        counter
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Takes one transient failure, if any are left.
    fn transient_failure(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.transient
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// After the shared budget of writes, discards and flushes runs out,
    /// this member fails every I/O (the power is out); `crash_image` then
    /// gives what a reboot would find.
    pub fn power_cut_after(&self, cut: PowerCut) {
        *self.budget.lock() = Some(cut);
    }

    /// False (and the member dead from now on) if the power just went out.
    fn powered(&self, s: &mut SimState) -> bool {
        if let Some(cut) = self.budget.lock().as_ref() {
            if !cut.take() {
                s.dead = true;
                return false;
            }
        }
        true
    }

    /// The image a power cut would leave, per `mode`, drawn with `rng`.
    pub fn crash_image(&self, mode: CrashMode, rng: &mut SimRng) -> Vec<u8> {
        let s = self.state.lock();
        let mut image = s.durable.clone();
        let mut kept: Vec<&(u64, Vec<u8>)> = match mode {
            CrashMode::DropAll => Vec::new(),
            CrashMode::KeepAll => s.pending.iter().collect(),
            CrashMode::KeepRandomSubset | CrashMode::TearOne => {
                s.pending.iter().filter(|_| rng.below(2) == 0).collect()
            }
        };
        if matches!(mode, CrashMode::KeepRandomSubset | CrashMode::TearOne) {
            for i in (1..kept.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                kept.swap(i, j);
            }
        }
        let torn = if mode == CrashMode::TearOne && !kept.is_empty() {
            Some(rng.below(kept.len() as u64) as usize)
        } else {
            None
        };
        for (i, (off, bytes)) in kept.iter().enumerate() {
            let mut len = bytes.len();
            if Some(i) == torn {
                len = (rng.below((bytes.len() / 512) as u64) as usize) * 512;
            }
            image[*off as usize..*off as usize + len].copy_from_slice(&bytes[..len]);
        }
        image
    }

    /// Writes still in the volatile cache.
    pub fn pending_writes(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// Flips bits in the current and durable image (silent corruption).
    pub fn corrupt(&self, offset: u64, len: usize) {
        let mut s = self.state.lock();
        for b in &mut s.current[offset as usize..offset as usize + len] {
            *b ^= 0x5a;
        }
        for b in &mut s.durable[offset as usize..offset as usize + len] {
            *b ^= 0x5a;
        }
    }

    /// Makes every later I/O fail (a drive that vanished), or revives it.
    pub fn set_dead(&self, dead: bool) {
        self.state.lock().dead = dead;
    }

    /// A copy of what reads see now.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }
}

fn check_range(size: u64, offset: u64, len: usize) -> io::Result<()> {
    if offset.checked_add(len as u64).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "I/O past the end of the drive",
        ));
    }
    Ok(())
}

fn dead_error() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Member for SimMember {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn gone(&self) -> Option<String> {
        self.vanished
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| "the simulated drive was pulled".to_string())
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        let s = self.state.lock();
        if s.dead || self.reads_fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(dead_error());
        }
        buf.copy_from_slice(&s.current[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    /// Memory: a read never waits for the drive (as on tmpfs).
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> bool {
        self.read_at(buf, offset).is_ok()
    }
    /// A write is issued, other I/O may run (a scheduling point, so that
    /// schedules can put a flush between a write's start and its end), then
    /// it lands and completes.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        self.gate.pass(Hold::WritesIn {
            from: offset,
            to: offset,
        });
        crate::sync::thread::yield_now();
        let mut s = self.state.lock();
        if s.dead || !self.powered(&mut s) || self.transient_failure() {
            return Err(dead_error());
        }
        if Self::take(&self.lose) {
            return Ok(());
        }
        let offset = if Self::take(&self.misdirect) {
            let by = self.misdirect_by.load(std::sync::atomic::Ordering::SeqCst);
            (offset + by) % (self.size_bytes - buf.len() as u64 + 1) / 4096 * 4096
        } else {
            offset
        };
        s.current[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        s.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    /// Makes durable the writes that completed before the flush started,
    /// and no others, as a drive's cache flush does: it starts, other I/O
    /// may run (a scheduling point), then it ends. If the power goes out
    /// meanwhile it fails and made nothing durable.
    ///
    /// A flush that fails drops the writes it could not make durable, as
    /// Linux does with the dirty pages behind a failed fsync: they stay
    /// readable, a later flush succeeds, and a power cut loses them.
    fn flush(&self) -> io::Result<()> {
        self.gate.pass(Hold::Flushes);
        let (covers, failed_before) = {
            let mut s = self.state.lock();
            if s.dead || !self.powered(&mut s) {
                return Err(dead_error());
            }
            if self.transient_failure() || Self::take(&self.flush_failures) {
                s.pending_from += s.pending.len() as u64;
                s.pending.clear();
                s.failed_flushes += 1;
                return Err(dead_error());
            }
            (s.pending_from + s.pending.len() as u64, s.failed_flushes)
        };
        crate::sync::thread::yield_now();
        let mut s = self.state.lock();
        if s.dead
            || s.failed_flushes != failed_before
            || self.budget.lock().as_ref().is_some_and(PowerCut::is_out)
        {
            return Err(dead_error());
        }
        let n = covers
            .saturating_sub(s.pending_from)
            .min(s.pending.len() as u64) as usize;
        let done: Vec<(u64, Vec<u8>)> = s.pending.drain(..n).collect();
        s.pending_from += n as u64;
        for (off, bytes) in done {
            s.durable[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
    /// Zeroes the range, like a drive that returns zeroes after discard; the
    /// zeroing is as volatile as a write until the next flush.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len as usize)?;
        let mut s = self.state.lock();
        if s.dead || !self.powered(&mut s) {
            return Err(dead_error());
        }
        let zeroes = vec![0u8; len as usize];
        s.current[offset as usize..(offset + len) as usize].copy_from_slice(&zeroes);
        s.pending.push((offset, zeroes));
        Ok(())
    }
}
