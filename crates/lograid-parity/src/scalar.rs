//! The plain reference implementation: one byte at a time through 256-entry
//! multiplication tables, and textbook decoding by inverting the `K x K` generator
//! submatrix of the surviving columns.
//!
//! It is slow and obviously correct; the tests check the fast path against it byte
//! for byte. It shares only the field arithmetic ([`crate::gf`]) and the argument
//! checks with the fast path.

use crate::{check_encode_shape, coefficient, gf, Erasures, ParityError, MAX_DATA_COLUMNS};

/// Computes all parity columns from the data columns, like [`crate::encode`].
///
/// # Panics
///
/// On the same programmer errors as [`crate::encode`].
pub fn encode(data: &[&[u8]], parity: &mut [&mut [u8]]) {
    check_encode_shape(data, parity);
    let mut rows = [[0u8; MAX_DATA_COLUMNS]; crate::MAX_PARITY];
    for (r, row) in rows.iter_mut().enumerate() {
        for (j, c) in row.iter_mut().enumerate().take(data.len()) {
            *c = coefficient(r, j);
        }
    }
    dot(data, &rows, parity);
}

/// Rebuilds the missing columns, like [`crate::reconstruct`].
pub fn reconstruct(
    k: usize,
    columns: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    let Some(mut erasures) = Erasures::split(k, columns, missing)? else {
        return Ok(());
    };
    // Survivors s = G_in * d, where the rows of G_in are the generator rows of the
    // surviving input columns, so d = G_in^-1 * s and a missing column c is
    // G[c] * G_in^-1 * s.
    let mut g_in = [[0u8; MAX_DATA_COLUMNS]; MAX_DATA_COLUMNS];
    for (row, &col) in g_in.iter_mut().zip(erasures.input_columns()) {
        *row = generator_row(k, col);
    }
    let decode = gf::invert(&g_in, k).ok_or(ParityError::Singular)?;
    let mut rows = [[0u8; MAX_DATA_COLUMNS]; crate::MAX_PARITY];
    for (row, &col) in rows.iter_mut().zip(erasures.output_columns()) {
        let g = generator_row(k, col);
        for (i, c) in row.iter_mut().enumerate().take(k) {
            *c = (0..k).fold(0, |acc, j| acc ^ gf::mul(g[j], decode[j][i]));
        }
    }
    let (inputs, outputs) = erasures.parts();
    dot(inputs, &rows, outputs);
    Ok(())
}

/// Row `col` of the `(K + P) x K` generator matrix: the identity for data columns,
/// the Vandermonde coefficients for parity columns.
fn generator_row(k: usize, col: usize) -> [u8; MAX_DATA_COLUMNS] {
    let mut row = [0u8; MAX_DATA_COLUMNS];
    if col < k {
        row[col] = 1;
    } else {
        for (j, c) in row.iter_mut().enumerate().take(k) {
            *c = coefficient(col - k, j);
        }
    }
    row
}

/// `outputs[n] = XOR over i of rows[n][i] * inputs[i]`, byte by byte. Also finishes
/// the tails that the vector kernels leave.
pub(crate) fn dot(inputs: &[&[u8]], rows: &[[u8; MAX_DATA_COLUMNS]], outputs: &mut [&mut [u8]]) {
    for (out, row) in outputs.iter_mut().zip(rows) {
        out.fill(0);
        for (input, &c) in inputs.iter().zip(row) {
            let table: [u8; 256] = std::array::from_fn(|x| gf::mul(c, x as u8));
            for (o, &x) in out.iter_mut().zip(input.iter()) {
                *o ^= table[x as usize];
            }
        }
    }
}
