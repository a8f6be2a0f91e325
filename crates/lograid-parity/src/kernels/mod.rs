//! The fast kernels and their runtime dispatch.
//!
//! Every kernel computes the same thing, a set of linear combinations of equal-length
//! input columns, in one of two ways:
//!
//! - **Horner**: the Vandermonde rows themselves (P, Q and/or R), as
//!   `P = d_0 ^ d_1 ^ ...`, `Q = ((d_{K-1} * 2 ^ d_{K-2}) * 2 ^ ...) ^ d_0` and the same
//!   for R with 4, the way Linux lib/raid6 computes P and Q. Multiplying a vector by 2
//!   or 4 costs a few instructions. Encode uses it, and so does reconstruct when only
//!   parity is missing, or when a single column is the XOR of the survivors.
//! - **Dot**: arbitrary coefficients, one "multiply by constant and XOR" per input and
//!   output, through split-nibble `pshufb` tables (AVX2) or a GFNI affine
//!   transformation. Reconstruct uses it for everything else.
//!
//! Both walk the columns once, in steps of a few vectors: for each step they load that
//! slice of every input, keep the partial results in registers and store each output
//! once, so every byte is read once and written once and nothing needs strip-mining.
//! The last `len % step` bytes are left to the scalar code.
//!
//! The algorithms are written once, generically over [`Lanes`] (a vector of bytes with
//! the few operations needed), and instantiated per instruction set inside
//! `#[target_feature]` functions, so that everything inlines into one loop compiled
//! for that instruction set.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::{scalar, MAX_DATA_COLUMNS, MAX_PARITY};
use std::sync::OnceLock;

/// A vector of bytes in one instruction set, with the operations the algorithms need.
///
/// # Safety
///
/// All methods are `unsafe`: they may only be called on a CPU that has the
/// implementation's instruction set, and `load`/`store` need valid pointers to
/// `WIDTH` bytes (any alignment).
pub(crate) trait Lanes: Copy {
    /// Bytes per vector.
    const WIDTH: usize;
    /// A constant prepared for [`Lanes::mul`], kept compact (a matrix or tables that
    /// `mul` broadcasts from memory) so that preparing a whole decode matrix is cheap.
    type Mul: Copy;

    unsafe fn zero() -> Self;
    unsafe fn load(src: *const u8) -> Self;
    unsafe fn store(self, dst: *mut u8);
    unsafe fn xor(self, other: Self) -> Self;
    /// Multiplies every byte by 2.
    unsafe fn mul2(self) -> Self;
    /// Multiplies every byte by 4.
    unsafe fn mul4(self) -> Self {
        self.mul2().mul2()
    }
    unsafe fn prepare(c: u8) -> Self::Mul;
    /// Multiplies every byte by the constant `m` was prepared from.
    unsafe fn mul(self, m: &Self::Mul) -> Self;
}

/// Computes the Vandermonde rows selected by `mask` (bit 0: P, bit 1: Q, bit 2: R)
/// of `inputs` into `outputs[row]`, over the first bytes of `len` that fill whole steps
/// of `U` vectors. Returns how many bytes it did.
///
/// # Safety
///
/// The CPU supports `V`; `inputs` is non-empty; every input, and `outputs[r]` for each
/// `r` in `mask`, points to `len` valid bytes, the outputs not overlapping anything.
#[inline(always)]
unsafe fn horner<V: Lanes, const U: usize>(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    mask: u8,
    len: usize,
) -> usize {
    match mask {
        0b001 => horner_rows::<V, U, true, false, false>(inputs, outputs, len),
        0b010 => horner_rows::<V, U, false, true, false>(inputs, outputs, len),
        0b011 => horner_rows::<V, U, true, true, false>(inputs, outputs, len),
        0b100 => horner_rows::<V, U, false, false, true>(inputs, outputs, len),
        0b101 => horner_rows::<V, U, true, false, true>(inputs, outputs, len),
        0b110 => horner_rows::<V, U, false, true, true>(inputs, outputs, len),
        0b111 => horner_rows::<V, U, true, true, true>(inputs, outputs, len),
        _ => unreachable!("bad row mask {mask:#b}"),
    }
}

/// [`horner`] for one combination of rows, fixed at compile time.
#[inline(always)]
unsafe fn horner_rows<V: Lanes, const U: usize, const P: bool, const Q: bool, const R: bool>(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    len: usize,
) -> usize {
    let step = V::WIDTH * U;
    let end = len - len % step;
    let (&top, rest) = inputs.split_last().expect("no inputs");
    let mut offset = 0;
    while offset < end {
        // Start from the highest column and fold the lower ones in.
        let mut p = [V::zero(); U];
        for (u, v) in p.iter_mut().enumerate() {
            *v = V::load(top.add(offset + u * V::WIDTH));
        }
        let mut q = p;
        let mut r = p;
        for &column in rest.iter().rev() {
            for u in 0..U {
                let d = V::load(column.add(offset + u * V::WIDTH));
                if P {
                    p[u] = p[u].xor(d);
                }
                if Q {
                    q[u] = q[u].mul2().xor(d);
                }
                if R {
                    r[u] = r[u].mul4().xor(d);
                }
            }
        }
        for u in 0..U {
            let at = offset + u * V::WIDTH;
            if P {
                p[u].store(outputs[0].add(at));
            }
            if Q {
                q[u].store(outputs[1].add(at));
            }
            if R {
                r[u].store(outputs[2].add(at));
            }
        }
        offset += step;
    }
    end
}

/// Computes `outputs[n] = XOR over i of rows[n][i] * inputs[i]` for the first
/// `outputs.len()` rows, over the first bytes of `len` that fill whole steps of `U`
/// vectors. Returns how many bytes it did.
///
/// # Safety
///
/// The CPU supports `V`; there are 1 to `MAX_DATA_COLUMNS` inputs and 1 to
/// `MAX_PARITY` outputs, each pointing to `len` valid bytes, the outputs not
/// overlapping anything.
#[inline(always)]
unsafe fn dot<V: Lanes, const U: usize>(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    match outputs.len() {
        1 => dot_n::<V, U, 1>(inputs, rows, outputs, len),
        2 => dot_n::<V, U, 2>(inputs, rows, outputs, len),
        3 => dot_n::<V, U, 3>(inputs, rows, outputs, len),
        n => unreachable!("{n} outputs"),
    }
}

/// [`dot`] for `N` outputs, fixed at compile time.
#[inline(always)]
unsafe fn dot_n<V: Lanes, const U: usize, const N: usize>(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    // muls[i][n] multiplies input i by its coefficient in output n.
    let mut muls = [[V::prepare(0); N]; MAX_DATA_COLUMNS];
    for (i, m) in muls.iter_mut().enumerate().take(inputs.len()) {
        for (n, m) in m.iter_mut().enumerate() {
            *m = V::prepare(rows[n][i]);
        }
    }
    let step = V::WIDTH * U;
    let end = len - len % step;
    let mut offset = 0;
    while offset < end {
        let mut acc = [[V::zero(); U]; N];
        for (&column, muls) in inputs.iter().zip(&muls) {
            let mut x = [V::zero(); U];
            for (u, x) in x.iter_mut().enumerate() {
                *x = V::load(column.add(offset + u * V::WIDTH));
            }
            for (acc, mul) in acc.iter_mut().zip(muls) {
                for (acc, x) in acc.iter_mut().zip(&x) {
                    *acc = acc.xor(x.mul(mul));
                }
            }
        }
        for (&out, acc) in outputs.iter().zip(&acc) {
            for (u, v) in acc.iter().enumerate() {
                v.store(out.add(offset + u * V::WIDTH));
            }
        }
        offset += step;
    }
    end
}

/// How a set of outputs is computed from the inputs (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Method {
    /// The Vandermonde rows in this mask (bit 0: P, bit 1: Q, bit 2: R), one output
    /// per set bit, in order.
    Horner(u8),
    /// The general coefficient rows.
    Dot,
}

/// One implementation of the kernels.
///
/// Invariant: a value other than `Generic` exists only if the running CPU has the
/// instruction set it names (see [`Kernel::supported`]); the dispatch relies on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// 512-bit AVX-512BW vectors; GFNI affine transformations for every multiply.
    #[cfg(target_arch = "x86_64")]
    Avx512Gfni,
    /// 256-bit AVX2 vectors; GFNI affine transformations for every multiply.
    #[cfg(target_arch = "x86_64")]
    Avx2Gfni,
    /// 256-bit AVX2 vectors; shift-and-reduce for 2 and 4, `pshufb` nibble tables
    /// for other constants.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable 64-bit words (SWAR) and byte tables.
    Generic,
}

/// The environment variable that forces a kernel by name (for benchmarks and tests of
/// the fallbacks); ignored if it names a kernel this CPU cannot run.
pub(crate) const KERNEL_ENV: &str = "LOGRAID_PARITY_KERNEL";

impl Kernel {
    /// Every kernel, best first.
    const ALL: &'static [Kernel] = &[
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Gfni,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2Gfni,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2,
        Kernel::Generic,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => "avx512-gfni",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => "avx2-gfni",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            Kernel::Generic => "generic",
        }
    }

    /// Whether the running CPU can run this kernel.
    fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => is_x86_feature_detected!("avx2"),
            Kernel::Generic => true,
        }
    }

    /// The kernels this CPU can run, best first.
    pub(crate) fn available() -> impl Iterator<Item = Kernel> {
        Self::ALL.iter().copied().filter(|k| k.supported())
    }

    /// The kernel used by [`crate::encode`] and [`crate::reconstruct`]: the best one
    /// this CPU can run, unless [`KERNEL_ENV`] names another it can run. Chosen once.
    pub(crate) fn selected() -> Kernel {
        static SELECTED: OnceLock<Kernel> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let forced = std::env::var(KERNEL_ENV).ok();
            Self::available()
                .find(|k| forced.as_deref() == Some(k.name()))
                .or_else(|| Self::available().next())
                .expect("the generic kernel is always available")
        })
    }

    /// Computes `outputs[n] = XOR over i of rows[n][i] * inputs[i]` by `method`.
    ///
    /// The caller guarantees: 1 to `MAX_DATA_COLUMNS` inputs, 1 to `MAX_PARITY`
    /// outputs, all of the same length; one row per output; for `Method::Horner(mask)`,
    /// one output per bit of `mask` and rows that are those Vandermonde rows.
    pub(crate) fn apply(
        self,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        rows: &[[u8; MAX_DATA_COLUMNS]],
        method: Method,
    ) {
        let len = outputs[0].len();
        let (n_inputs, n_outputs) = (inputs.len(), outputs.len());
        assert!(
            (1..=MAX_DATA_COLUMNS).contains(&inputs.len())
                && (1..=MAX_PARITY).contains(&outputs.len())
                && rows.len() >= outputs.len()
                && inputs.iter().all(|c| c.len() == len)
                && outputs.iter().all(|c| c.len() == len)
        );
        let mut input_ptrs = [std::ptr::null(); MAX_DATA_COLUMNS];
        for (ptr, input) in input_ptrs.iter_mut().zip(inputs) {
            *ptr = input.as_ptr();
        }
        let input_ptrs = &input_ptrs[..n_inputs];
        let mut output_ptrs = [std::ptr::null_mut(); MAX_PARITY];
        let done = match method {
            Method::Horner(mask) => {
                assert_eq!(mask.count_ones() as usize, n_outputs);
                let rows_in_mask = (0..MAX_PARITY).filter(|r| mask & (1 << r) != 0);
                for (r, output) in rows_in_mask.zip(outputs.iter_mut()) {
                    output_ptrs[r] = output.as_mut_ptr();
                }
                // SAFETY: the pointers come from the slices checked above, all `len`
                // long; outputs are `&mut` so they overlap nothing; `self` is
                // supported (type invariant).
                unsafe { self.horner(input_ptrs, &output_ptrs, mask, len) }
            }
            Method::Dot => {
                for (ptr, output) in output_ptrs.iter_mut().zip(outputs.iter_mut()) {
                    *ptr = output.as_mut_ptr();
                }
                // SAFETY: as above.
                unsafe { self.dot(input_ptrs, rows, &output_ptrs[..n_outputs], len) }
            }
        };
        if done < len {
            let mut tail_inputs: [&[u8]; MAX_DATA_COLUMNS] = [&[]; MAX_DATA_COLUMNS];
            for (tail, input) in tail_inputs.iter_mut().zip(inputs) {
                *tail = &input[done..];
            }
            let mut tail_outputs: [&mut [u8]; MAX_PARITY] = [&mut [], &mut [], &mut []];
            for (tail, output) in tail_outputs.iter_mut().zip(outputs.iter_mut()) {
                *tail = &mut output[done..];
            }
            scalar::dot(
                &tail_inputs[..n_inputs],
                rows,
                &mut tail_outputs[..n_outputs],
            );
        }
    }

    /// Dispatches [`horner`] to this kernel's instantiation.
    ///
    /// # Safety
    ///
    /// As for [`horner`], except the CPU requirement, which the type invariant covers.
    unsafe fn horner(
        self,
        inputs: &[*const u8],
        outputs: &[*mut u8; MAX_PARITY],
        mask: u8,
        len: usize,
    ) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => x86::avx512_gfni_horner(inputs, outputs, mask, len),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => x86::avx2_gfni_horner(inputs, outputs, mask, len),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => x86::avx2_horner(inputs, outputs, mask, len),
            Kernel::Generic => portable::horner(inputs, outputs, mask, len),
        }
    }

    /// Dispatches [`dot`] to this kernel's instantiation.
    ///
    /// # Safety
    ///
    /// As for [`dot`], except the CPU requirement, which the type invariant covers.
    unsafe fn dot(
        self,
        inputs: &[*const u8],
        rows: &[[u8; MAX_DATA_COLUMNS]],
        outputs: &[*mut u8],
        len: usize,
    ) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => x86::avx512_gfni_dot(inputs, rows, outputs, len),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => x86::avx2_gfni_dot(inputs, rows, outputs, len),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => x86::avx2_dot(inputs, rows, outputs, len),
            Kernel::Generic => portable::dot(inputs, rows, outputs, len),
        }
    }
}
