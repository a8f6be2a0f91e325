//! Parity for lograid: XOR P and Reed-Solomon Q and R over GF(2^8).
//!
//! This crate owns the parity math and its kernels and nothing else: no I/O, no
//! layout, no allocation on the hot path. The engine hands it equal-length byte
//! columns; it fills in parity ([`encode`]) or rebuilds lost columns
//! ([`reconstruct`]).
//!
//! # The code (part of the on-disk format)
//!
//! A row has `K` data columns `d_0 .. d_{K-1}` (1 <= K <= [`MAX_DATA_COLUMNS`]) and
//! `P` parity columns `p_0 .. p_{P-1}` (0 <= P <= [`MAX_PARITY`]), all the same
//! length. The code works on each byte offset independently:
//!
//! ```text
//! p_r[i] = XOR over j in 0..K of  g_r^j * d_j[i]       with g_r = 2^r: g_0 = 1, g_1 = 2, g_2 = 4
//! ```
//!
//! - Arithmetic is in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1
//!   (0x11d). A byte is the polynomial whose coefficient of x^i is bit i of the byte;
//!   addition is XOR; multiplication is carry-less multiplication reduced modulo
//!   0x11d (see [`gf`]).
//! - The element 2 (the polynomial `x`) generates the multiplicative group, and the
//!   coefficient of `d_j` in `p_r` is `(2^r)^j = 2^(r*j mod 255)`, as given by
//!   [`coefficient`]. The generator matrix is `(K + P) x K`: the identity on top, then
//!   the Vandermonde rows `[1, g_r, g_r^2, ..., g_r^(K-1)]`.
//! - So `p_0` is the plain XOR of the data (RAID-5 P) and `p_1` is the RAID-6 Q
//!   syndrome, byte-identical to Linux md raid6 P and Q (and ISA-L `pq_gen`); `p_0 ..
//!   p_2` are also the first three parity rows of ISA-L's `gf_gen_rs_matrix`.
//!
//! Example (K = 3): data bytes `d = [0x01, 0x80, 0xff]` give `p_0 = 0x7e`,
//! `p_1 = 0x01 ^ 2*0x80 ^ 4*0xff = 0x01 ^ 0x1d ^ 0xdb = 0xc7` and
//! `p_2 = 0x01 ^ 4*0x80 ^ 16*0xff = 0x01 ^ 0x3a ^ 0x4b = 0x70`.
//!
//! The code is MDS for every K <= 32 and P <= 3: any K of the K + P columns
//! determine the rest. (Every square submatrix of the parity rows is a Vandermonde
//! matrix in the distinct elements `2^j`, or for rows {0, 2} one in their squares, or
//! for rows {1, 2} has determinant `x_a x_b (x_a + x_b)`, so none is singular as long
//! as the `2^j` are distinct, i.e. up to K = 255; the tests check every erasure
//! pattern for every K up to 32.)
//!
//! Decoding takes the first K surviving columns in index order (the surviving data,
//! then the lowest surviving parity), inverts the generator rows of those columns and
//! multiplies. The result does not depend on that choice when the columns are
//! consistent.
//!
//! # Kernels
//!
//! [`encode`] and [`reconstruct`] pick a vector kernel at run time ([`kernel_name`]):
//! `avx512-gfni`, `avx2-gfni`, `avx2`, or the portable `generic`. The environment
//! variable `LOGRAID_PARITY_KERNEL`, read once, forces one of these by name (if the
//! CPU can run it), to compare or test them. The [`scalar`] module is the byte-at-a-
//! time reference they are tested against.

pub mod gf;
pub mod scalar;

mod bench;
mod kernels;
#[cfg(test)]
mod tests;

pub use bench::{bench_encode, bench_reconstruct};

use kernels::{Kernel, Method};
use std::fmt;

/// The most data columns in a row.
pub const MAX_DATA_COLUMNS: usize = 32;

/// The most parity columns in a row.
pub const MAX_PARITY: usize = 3;

/// Why a reconstruct could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParityError {
    /// More columns are missing than there are parity columns.
    TooManyMissing {
        /// How many columns were listed as missing.
        missing: usize,
        /// How many parity columns the row has.
        parity: usize,
    },
    /// The arguments do not describe a valid row: K or P out of range, columns of
    /// different lengths, or a missing index that is out of range or repeated.
    BadShape(String),
    /// The decode matrix is singular. Cannot happen for K <= 32, P <= 3 (the code is
    /// MDS); kept so that a broken invariant is an error, not wrong data.
    Singular,
}

impl fmt::Display for ParityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParityError::TooManyMissing { missing, parity } => write!(
                f,
                "{missing} columns missing but only {parity} parity columns"
            ),
            ParityError::BadShape(why) => write!(f, "bad row shape: {why}"),
            ParityError::Singular => write!(f, "decode matrix is singular"),
        }
    }
}

impl std::error::Error for ParityError {}

/// GF(2^8) coefficient of data column `data_index` in parity `parity_index`:
/// `(2^parity_index)^data_index`.
pub fn coefficient(parity_index: usize, data_index: usize) -> u8 {
    gf::exp2(parity_index * data_index)
}

/// The coefficients of the parity rows, `VANDERMONDE[r][j] = coefficient(r, j)`.
static VANDERMONDE: [[u8; MAX_DATA_COLUMNS]; MAX_PARITY] = {
    let mut rows = [[0u8; MAX_DATA_COLUMNS]; MAX_PARITY];
    let mut r = 0;
    while r < MAX_PARITY {
        let mut x = 1u8;
        let mut j = 0;
        while j < MAX_DATA_COLUMNS {
            rows[r][j] = x;
            x = gf::basis_products(x)[r]; // x * 2^r
            j += 1;
        }
        r += 1;
    }
    rows
};

/// Computes all parity columns from the data columns, with the fastest kernel this
/// CPU has. Parity `r` gets `XOR over j of coefficient(r, j) * data[j]`; the previous
/// contents of `parity` are overwritten.
///
/// # Panics
///
/// On programmer error only: no data columns, more than [`MAX_DATA_COLUMNS`] data or
/// [`MAX_PARITY`] parity columns, or columns of different lengths.
pub fn encode(data: &[&[u8]], parity: &mut [&mut [u8]]) {
    encode_with(Kernel::selected(), data, parity);
}

/// [`encode`] with a given kernel.
fn encode_with(kernel: Kernel, data: &[&[u8]], parity: &mut [&mut [u8]]) {
    check_encode_shape(data, parity);
    if parity.is_empty() {
        return;
    }
    let mask = (1u8 << parity.len()) - 1;
    kernel.apply(data, parity, &VANDERMONDE, Method::Horner(mask));
}

/// Rebuilds the columns listed in `missing` from the others, in place.
///
/// `columns` holds the whole row: data columns `0..k`, then parity columns
/// `k..k + p`, so `p = columns.len() - k`. `missing` lists indices into `columns`, in
/// any order; what the missing columns hold on entry is ignored and overwritten. The
/// other columns are only read.
///
/// # Errors
///
/// [`ParityError::TooManyMissing`] if more than `p` columns are missing;
/// [`ParityError::BadShape`] if `k` or `p` is out of range, the columns differ in
/// length, or an index is out of range or repeated. Nothing is written on error.
pub fn reconstruct(
    k: usize,
    columns: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    reconstruct_with(Kernel::selected(), k, columns, missing)
}

/// [`reconstruct`] with a given kernel.
fn reconstruct_with(
    kernel: Kernel,
    k: usize,
    columns: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    let Some(mut erasures) = Erasures::split(k, columns, missing)? else {
        return Ok(());
    };
    let (rows, method) = decode_rows(&erasures)?;
    let (inputs, outputs) = erasures.parts();
    kernel.apply(inputs, outputs, &rows, method);
    Ok(())
}

/// The name of the kernel [`encode`] and [`reconstruct`] use on this CPU:
/// `"avx512-gfni"`, `"avx2-gfni"`, `"avx2"` or `"generic"`.
pub fn kernel_name() -> &'static str {
    Kernel::selected().name()
}

/// Asserts the shape rules of [`encode`].
pub(crate) fn check_encode_shape(data: &[&[u8]], parity: &[&mut [u8]]) {
    assert!(
        (1..=MAX_DATA_COLUMNS).contains(&data.len()),
        "{} data columns, need 1 to {MAX_DATA_COLUMNS}",
        data.len()
    );
    assert!(
        parity.len() <= MAX_PARITY,
        "{} parity columns, at most {MAX_PARITY}",
        parity.len()
    );
    let len = data[0].len();
    assert!(
        data.iter().all(|c| c.len() == len) && parity.iter().all(|c| c.len() == len),
        "columns of different lengths"
    );
}

/// A row split for decoding: the first `k` surviving columns (the inputs) and the
/// missing ones (the outputs), both in index order.
pub(crate) struct Erasures<'a> {
    k: usize,
    inputs: [&'a [u8]; MAX_DATA_COLUMNS],
    /// The column index of each input.
    input_columns: [usize; MAX_DATA_COLUMNS],
    outputs: [&'a mut [u8]; MAX_PARITY],
    /// The column index of each output.
    output_columns: [usize; MAX_PARITY],
    missing: usize,
}

impl<'a> Erasures<'a> {
    /// Checks the arguments of [`reconstruct`] and splits the row; `None` if nothing
    /// is missing.
    pub(crate) fn split(
        k: usize,
        columns: &'a mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<Option<Self>, ParityError> {
        let bad = |why: String| Err(ParityError::BadShape(why));
        if !(1..=MAX_DATA_COLUMNS).contains(&k) {
            return bad(format!("k = {k}, need 1 to {MAX_DATA_COLUMNS}"));
        }
        let Some(p) = columns.len().checked_sub(k).filter(|&p| p <= MAX_PARITY) else {
            return bad(format!(
                "{} columns for k = {k}, need k to k + {MAX_PARITY}",
                columns.len()
            ));
        };
        let len = columns[0].len();
        if columns.iter().any(|c| c.len() != len) {
            return bad("columns of different lengths".into());
        }
        let mut is_missing = [false; MAX_DATA_COLUMNS + MAX_PARITY];
        for &index in missing {
            if index >= k + p {
                return bad(format!("missing column {index} out of range 0..{}", k + p));
            }
            if std::mem::replace(&mut is_missing[index], true) {
                return bad(format!("missing column {index} listed twice"));
            }
        }
        if missing.len() > p {
            return Err(ParityError::TooManyMissing {
                missing: missing.len(),
                parity: p,
            });
        }
        if missing.is_empty() {
            return Ok(None);
        }
        let mut erasures = Erasures {
            k,
            inputs: [&[]; MAX_DATA_COLUMNS],
            input_columns: [0; MAX_DATA_COLUMNS],
            outputs: [&mut [], &mut [], &mut []],
            output_columns: [0; MAX_PARITY],
            missing: 0,
        };
        let mut survivors = 0;
        for (index, column) in columns.iter_mut().enumerate() {
            if is_missing[index] {
                erasures.outputs[erasures.missing] = &mut **column;
                erasures.output_columns[erasures.missing] = index;
                erasures.missing += 1;
            } else if survivors < k {
                erasures.inputs[survivors] = &**column;
                erasures.input_columns[survivors] = index;
                survivors += 1;
            }
        }
        Ok(Some(erasures))
    }

    /// The column indices of the inputs (the first `k` survivors).
    pub(crate) fn input_columns(&self) -> &[usize] {
        &self.input_columns[..self.k]
    }

    /// The column indices of the outputs (the missing columns).
    pub(crate) fn output_columns(&self) -> &[usize] {
        &self.output_columns[..self.missing]
    }

    /// The input columns and the output columns.
    pub(crate) fn parts(&mut self) -> (&[&'a [u8]], &mut [&'a mut [u8]]) {
        (&self.inputs[..self.k], &mut self.outputs[..self.missing])
    }
}

/// The coefficient rows that give each missing column from the inputs, and the
/// cheapest way to apply them.
///
/// Rather than inverting the `K x K` generator submatrix as [`scalar::reconstruct`]
/// does, this solves only for the `m` missing data columns `D`. The inputs are the
/// `K - m` surviving data columns and `m` parity columns `R`. For each `a`, the
/// syndrome `p_R[a] ^ XOR over surviving j of coefficient(R[a], j) * d_j` equals
/// `XOR over b of A[a][b] * d_D[b]` with `A[a][b] = coefficient(R[a], D[b])`, so
/// `d_D = A^-1 * syndromes`, where `A` is at most 3 x 3. A missing parity column is
/// its Vandermonde row applied to the surviving data and the rebuilt data. The rows
/// are the same as the scalar ones, since the inverse is unique.
fn decode_rows(
    erasures: &Erasures,
) -> Result<([[u8; MAX_DATA_COLUMNS]; MAX_PARITY], Method), ParityError> {
    let k = erasures.k;
    let inputs = erasures.input_columns();
    let outputs = erasures.output_columns();
    let mut lost_data = [0; MAX_PARITY];
    let mut m = 0;
    for &column in outputs.iter().filter(|&&c| c < k) {
        lost_data[m] = column;
        m += 1;
    }
    let lost_data = &lost_data[..m];
    let survivors = k - m;
    let parity_rows = &inputs[survivors..];

    let mut a = [[0u8; MAX_PARITY]; MAX_PARITY];
    for (a_row, &r) in a.iter_mut().zip(parity_rows) {
        for (x, &d) in a_row.iter_mut().zip(lost_data) {
            *x = coefficient(r - k, d);
        }
    }
    let a_inv = gf::invert(&a, m).ok_or(ParityError::Singular)?;

    // lost_rows[b]: the lost data column D[b] as a combination of the inputs.
    let mut lost_rows = [[0u8; MAX_DATA_COLUMNS]; MAX_PARITY];
    for (lost_row, a_inv_row) in lost_rows.iter_mut().zip(&a_inv).take(m) {
        for (position, &column) in inputs[..survivors].iter().enumerate() {
            lost_row[position] = (0..m).fold(0, |acc, a| {
                acc ^ gf::mul(a_inv_row[a], coefficient(parity_rows[a] - k, column))
            });
        }
        lost_row[survivors..k].copy_from_slice(&a_inv_row[..m]);
    }

    let mut rows = [[0u8; MAX_DATA_COLUMNS]; MAX_PARITY];
    let mut lost = 0;
    for (row, &column) in rows.iter_mut().zip(outputs) {
        if column < k {
            *row = lost_rows[lost];
            lost += 1;
        } else {
            // coefficient(t, j) on each surviving data input, plus the lost data
            // columns' rows scaled by their coefficients.
            let t = column - k;
            for (x, &j) in row.iter_mut().zip(&inputs[..survivors]) {
                *x = coefficient(t, j);
            }
            for (&d, lost_row) in lost_data.iter().zip(&lost_rows) {
                let c = coefficient(t, d);
                for (x, &y) in row.iter_mut().zip(&lost_row[..k]) {
                    *x ^= gf::mul(c, y);
                }
            }
        }
    }

    let method = if m == 0 {
        // Only parity is missing and the inputs are the data: the Vandermonde rows.
        Method::Horner(outputs.iter().fold(0, |mask, &c| mask | 1 << (c - k)))
    } else if outputs.len() == 1 {
        // One lost data column and nothing else: P survives and is the parity input,
        // so the column is the XOR of the inputs.
        debug_assert!(rows[0][..k].iter().all(|&c| c == 1));
        Method::Horner(1)
    } else {
        Method::Dot
    };
    Ok((rows, method))
}
