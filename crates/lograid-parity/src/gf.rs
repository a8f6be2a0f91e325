//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).
//!
//! A byte `b` stands for the polynomial `sum(bit_i(b) * x^i)`. Addition is XOR;
//! multiplication is polynomial multiplication modulo 0x11d. The element 2 (the
//! polynomial `x`) generates the multiplicative group, so every non-zero byte is
//! `2^e` for exactly one `e` in `0..255`.
//!
//! All tables are built at compile time.

/// The field polynomial x^8 + x^4 + x^3 + x^2 + 1, with the x^8 bit.
pub const POLYNOMIAL: u16 = 0x11d;

/// The generator of the multiplicative group: the polynomial `x`.
pub const GENERATOR: u8 = 2;

/// Multiplies by the generator 2: a shift, then reduction by 0x11d if a bit fell off.
const fn mul2(a: u8) -> u8 {
    let shifted = (a as u16) << 1;
    if shifted & 0x100 != 0 {
        (shifted ^ POLYNOMIAL) as u8
    } else {
        shifted as u8
    }
}

/// `EXP[e] = 2^e` for `e` in `0..510`: two periods, so that `EXP[LOG[a] + LOG[b]]`
/// needs no reduction modulo 255.
static EXP: [u8; 510] = {
    let mut table = [0u8; 510];
    let mut x = 1u8;
    let mut e = 0;
    while e < 510 {
        table[e] = x;
        x = mul2(x);
        e += 1;
    }
    table
};

/// `LOG[a] = e` such that `2^e = a`, for non-zero `a`. `LOG[0]` is unused.
static LOG: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut x = 1u8;
    let mut e = 0;
    while e < 255 {
        table[x as usize] = e as u8;
        x = mul2(x);
        e += 1;
    }
    table
};

/// Multiplies two field elements.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// The multiplicative inverse of a non-zero element.
///
/// # Panics
///
/// If `a` is 0, which has no inverse.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "0 has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// `2^e` in the field, for any exponent (the group has order 255).
#[inline]
pub fn exp2(e: usize) -> u8 {
    EXP[e % 255]
}

/// `c * 2^i` for `i` in `0..8`: the images of the eight bit basis vectors under
/// multiplication by `c`, which is linear over GF(2). The vector kernels build their
/// lookup tables and GFNI matrices from these.
pub(crate) const fn basis_products(c: u8) -> [u8; 8] {
    let mut out = [0u8; 8];
    let mut x = c;
    let mut i = 0;
    while i < 8 {
        out[i] = x;
        x = mul2(x);
        i += 1;
    }
    out
}

/// The full 256-entry table of `c * x`, built from [`basis_products`] by linearity.
pub(crate) fn mul_table(c: u8) -> [u8; 256] {
    let basis = basis_products(c);
    let mut table = [0u8; 256];
    for x in 1..256usize {
        // x = (x with its lowest set bit cleared) + (its lowest set bit).
        table[x] = table[x & (x - 1)] ^ basis[x.trailing_zeros() as usize];
    }
    table
}

/// The products of `c` with the 16 low nibbles (`c * x` for `x < 16`) and with the
/// 16 high nibbles (`c * (x << 4)`), for split-nibble table lookup (`pshufb`):
/// `c * b = low[b & 15] ^ high[b >> 4]`. Built from [`basis_products`] by linearity.
// Used by the x86-64 kernels; elsewhere only by the tests, which check it on every architecture.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let basis = basis_products(c);
    let mut low = [0u8; 16];
    let mut high = [0u8; 16];
    for x in 1..16usize {
        let bit = x.trailing_zeros() as usize;
        low[x] = low[x & (x - 1)] ^ basis[bit];
        high[x] = high[x & (x - 1)] ^ basis[bit + 4];
    }
    (low, high)
}

/// The 8x8 bit matrix of multiplication by `c`, in the layout of the x86 GFNI
/// instruction `gf2p8affineqb`: byte `7 - i` of the result holds row `i`, whose
/// bit `j` is bit `i` of `c * 2^j`.
// Used by the x86-64 kernels; elsewhere only by the tests, which check it on every architecture.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn affine_matrix(c: u8) -> u64 {
    // Byte j of `x` is c * 2^j, so bit 8j + i of `x` is the matrix entry (i, j).
    // Transposing the 8x8 bit matrix (Hacker's Delight 7-3) puts it at bit 8i + j,
    // i.e. row i in byte i; the byte swap moves row i to byte 7 - i.
    let mut x = u64::from_le_bytes(basis_products(c));
    let t = (x ^ (x >> 7)) & 0x00aa_00aa_00aa_00aa;
    x ^= t ^ (t << 7);
    let t = (x ^ (x >> 14)) & 0x0000_cccc_0000_cccc;
    x ^= t ^ (t << 14);
    let t = (x ^ (x >> 28)) & 0x0000_0000_f0f0_f0f0;
    x ^= t ^ (t << 28);
    x.swap_bytes()
}

/// A square matrix over GF(2^8) of order at most `N`; only the top-left `n x n` is used.
pub(crate) type Matrix<const N: usize> = [[u8; N]; N];

/// Inverts the top-left `n x n` of `a` by Gauss-Jordan elimination; `None` if it is
/// singular.
pub(crate) fn invert<const N: usize>(a: &Matrix<N>, n: usize) -> Option<Matrix<N>> {
    assert!(n <= N);
    let mut a = *a;
    let mut inverse = [[0u8; N]; N];
    for (i, row) in inverse.iter_mut().enumerate().take(n) {
        row[i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&row| a[row][col] != 0)?;
        a.swap(col, pivot);
        inverse.swap(col, pivot);
        let scale = inv(a[col][col]);
        for j in 0..n {
            a[col][j] = mul(a[col][j], scale);
            inverse[col][j] = mul(inverse[col][j], scale);
        }
        for row in 0..n {
            let factor = a[row][col];
            if row == col || factor == 0 {
                continue;
            }
            for j in 0..n {
                a[row][j] ^= mul(factor, a[col][j]);
                inverse[row][j] ^= mul(factor, inverse[col][j]);
            }
        }
    }
    Some(inverse)
}
