//! Model-based tests: random sequences of writes, reads, trims, zeroes,
//! flushes, crashes and power cuts inside operations (cleaning included)
//! against the engine on simulated drives, checked
//! against a plain in-memory reference. A run is reproduced by its seed:
//! `LOGRAID_SEED=<seed> cargo test -p lograid --test model`.

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::{Model, SimPool};
use lograid::device::{CrashMode, PowerCut, SimRng};

struct Plan {
    members: usize,
    parity: u8,
    ops: usize,
    /// Volume size as a fraction of usable capacity (high = the cleaner works hard).
    fill: f64,
}

/// A run's state: its seed, the pool and the model it is checked against.
struct Run {
    seed: u64,
    rng: SimRng,
    pool: SimPool,
    model: Model,
}

fn run(plan: &Plan, seed: u64) {
    eprintln!("model run: ({}, {}) seed {seed}", plan.members, plan.parity);
    let rng = SimRng(seed);
    let pool = SimPool::create(plan.members, plan.parity, 8 << 20, plan.fill);
    let model = Model::new(pool.volume_size());
    let mut run = Run {
        seed,
        rng,
        pool,
        model,
    };
    for op in 0..plan.ops {
        run = run.op(op);
    }
    run.finish();
}

impl Run {
    /// Checks the invariants, then runs operation `op`, of the kind the
    /// dice pick (a crash reopens the pool: the run is passed on).
    fn op(mut self, op: usize) -> Run {
        let seed = self.seed;
        self.pool
            .pool()
            .check_invariants()
            .unwrap_or_else(|m| panic!("seed {seed} before op {op}: invariant: {m}"));
        let dice = self.rng.below(100);
        if std::env::var("LOGRAID_TRACE").is_ok() {
            eprintln!("op {op}: dice {dice}");
        }
        match dice {
            0..=49 => self.write(op),
            50..=69 => self.read_and_check(op),
            70..=76 => self.trim(op),
            77..=80 => self.write_zeroes(op, dice),
            81..=90 => self.flush(op),
            91..=93 => self.fua_write(op),
            94..=95 => self.checkpoint(op),
            99 => return self.power_cut_inside_a_burst(op),
            _ => return self.crash(op),
        }
        self
    }

    fn write(&mut self, op: usize) {
        let (seed, pool, model) = (self.seed, &self.pool, &mut self.model);
        let (off, len) = model.random_range(&mut self.rng, 64 * 1024);
        let data = model.write(off, len);
        match pool.volume().write(off, &data) {
            Ok(()) => {}
            Err(lograid::Error::NoSpace) => {
                model.forget_last_write();
            }
            Err(e) => panic!("seed {seed} op {op}: write failed: {e}"),
        }
    }

    fn read_and_check(&mut self, op: usize) {
        let (seed, pool, model) = (self.seed, &self.pool, &mut self.model);
        let (off, len) = model.random_range(&mut self.rng, 128 * 1024);
        let mut buf = vec![0u8; len as usize];
        pool.volume()
            .read(off, &mut buf)
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: read failed: {e}"));
        model
            .check_exact(off, &buf)
            .unwrap_or_else(|m| panic!("seed {seed} op {op}: {m}"));
    }

    fn trim(&mut self, op: usize) {
        let (seed, pool, model) = (self.seed, &self.pool, &mut self.model);
        let (off, len) = model.random_range(&mut self.rng, 256 * 1024);
        pool.volume()
            .trim(off, len)
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: trim failed: {e}"));
        model.trim(off, len);
    }

    /// Write-zeroes, with the flag the parity of `dice` gives.
    fn write_zeroes(&mut self, op: usize, dice: u64) {
        let (seed, pool, model) = (self.seed, &self.pool, &mut self.model);
        let (off, len) = model.random_range(&mut self.rng, 64 * 1024);
        pool.volume()
            .write_zeroes(off, len, dice.is_multiple_of(2))
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: zero: {e}"));
        model.zero(off, len);
    }

    fn flush(&mut self, op: usize) {
        let seed = self.seed;
        self.pool
            .volume()
            .flush()
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: flush failed: {e}"));
        self.model.flushed();
    }

    fn fua_write(&mut self, op: usize) {
        let (seed, pool, model) = (self.seed, &self.pool, &mut self.model);
        let (off, len) = model.random_range(&mut self.rng, 16 * 1024);
        let data = model.write(off, len);
        match pool.volume().write_fua(off, &data) {
            Ok(()) => model.flushed(),
            Err(lograid::Error::NoSpace) => model.forget_last_write(),
            Err(e) => panic!("seed {seed} op {op}: FUA write failed: {e}"),
        }
    }

    fn checkpoint(&mut self, op: usize) {
        let seed = self.seed;
        self.pool
            .pool()
            .checkpoint()
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: checkpoint: {e}"));
        self.model.flushed();
    }

    /// A power cut at a random instant inside a burst of overwrites, a
    /// cleaning pass and a flush; the pool reopens and holds what the model
    /// allows.
    fn power_cut_inside_a_burst(mut self, op: usize) -> Run {
        let Run {
            seed,
            ref mut rng,
            ref pool,
            ref mut model,
        } = self;
        let cut = PowerCut::after(1 + rng.below(200));
        for s in &pool.sims {
            s.power_cut_after(cut.clone());
        }
        for _ in 0..32 {
            let (off, len) = model.random_range(rng, 64 * 1024);
            let data = model.write(off, len);
            // Failed for the power cut: in doubt, like any unflushed write.
            if let Err(lograid::Error::NoSpace) = pool.volume().write(off, &data) {
                model.forget_last_write();
            }
        }
        let _ = pool.pool().clean(2);
        if pool.volume().flush().is_ok() {
            model.flushed();
        }
        let mode = match rng.below(3) {
            0 => CrashMode::DropAll,
            1 => CrashMode::KeepRandomSubset,
            _ => CrashMode::TearOne,
        };
        let tripped = cut.tripped();
        let pool = self.pool.crash(mode, &mut self.rng).unwrap_or_else(|e| {
            panic!("seed {seed} op {op}: reopen after a power cut ({tripped}) failed: {e}")
        });
        let observed = pool
            .read_all()
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: read after power cut: {e}"));
        self.model
            .after_crash(&observed)
            .unwrap_or_else(|m| panic!("seed {seed} op {op}: after a power cut ({mode:?}): {m}"));
        Run { pool, ..self }
    }

    /// A crash of a random kind; the pool reopens and holds what the model
    /// allows.
    fn crash(mut self, op: usize) -> Run {
        let seed = self.seed;
        let mode = match self.rng.below(4) {
            0 => CrashMode::DropAll,
            1 => CrashMode::KeepRandomSubset,
            2 => CrashMode::TearOne,
            _ => CrashMode::KeepAll,
        };
        let pool = self.pool.crash(mode, &mut self.rng).unwrap_or_else(|e| {
            panic!("seed {seed} op {op}: reopen after {mode:?} crash failed: {e}")
        });
        let observed = pool
            .read_all()
            .unwrap_or_else(|e| panic!("seed {seed} op {op}: read after crash: {e}"));
        self.model
            .after_crash(&observed)
            .unwrap_or_else(|m| panic!("seed {seed} op {op}: after {mode:?} crash: {m}"));
        Run { pool, ..self }
    }

    /// Finish with a clean close and reopen: everything must be exact.
    fn finish(self) {
        let Run {
            seed,
            pool,
            mut model,
            ..
        } = self;
        let pool = pool
            .reopen_clean()
            .unwrap_or_else(|e| panic!("seed {seed}: clean reopen: {e}"));
        let all = pool.read_all().expect("read all");
        model.flushed();
        model
            .check_exact(0, &all)
            .unwrap_or_else(|m| panic!("seed {seed}: after clean reopen: {m}"));
    }
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("LOGRAID_SEED") {
        Ok(s) => vec![s.parse().expect("LOGRAID_SEED is a number")],
        Err(_) => default.to_vec(),
    }
}

fn ops(default: usize) -> usize {
    std::env::var("LOGRAID_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn model_2_1() {
    for s in seeds(&[1, 2]) {
        run(
            &Plan {
                members: 2,
                parity: 1,
                ops: ops(400),
                fill: 0.5,
            },
            s,
        );
    }
}

#[test]
fn model_3_1() {
    for s in seeds(&[3, 4, 5]) {
        run(
            &Plan {
                members: 3,
                parity: 1,
                ops: ops(400),
                fill: 0.6,
            },
            s,
        );
    }
}

#[test]
fn model_4_2() {
    for s in seeds(&[6, 7]) {
        run(
            &Plan {
                members: 4,
                parity: 2,
                ops: ops(400),
                fill: 0.6,
            },
            s,
        );
    }
}

#[test]
fn model_6_3() {
    for s in seeds(&[8, 9]) {
        run(
            &Plan {
                members: 6,
                parity: 3,
                ops: ops(400),
                fill: 0.6,
            },
            s,
        );
    }
}

#[test]
fn model_5_0() {
    for s in seeds(&[10, 11]) {
        run(
            &Plan {
                members: 5,
                parity: 0,
                ops: ops(400),
                fill: 0.6,
            },
            s,
        );
    }
}

#[test]
fn model_3_1_cleaner_hard() {
    for s in seeds(&[12, 13]) {
        run(
            &Plan {
                members: 3,
                parity: 1,
                ops: ops(1500),
                fill: 0.95,
            },
            s,
        );
    }
}
