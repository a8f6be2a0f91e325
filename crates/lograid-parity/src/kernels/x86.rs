//! x86-64 vector kernels: AVX-512 + GFNI, AVX2 + GFNI, and plain AVX2.
//!
//! GFNI's `gf2p8affineqb` applies an 8x8 bit matrix to every byte; multiplication by
//! a constant is linear over GF(2), so with the right matrix it multiplies in our field
//! (0x11d) in one instruction. (GFNI's own `gf2p8mulb` uses the AES polynomial 0x11b
//! and is of no use here.) Without GFNI, 2 and 4 are shift-and-reduce and other
//! constants are two 16-entry `pshufb` lookups, one per nibble.

use super::{dot, horner, Lanes};
use crate::gf;
use crate::{MAX_DATA_COLUMNS, MAX_PARITY};
use std::arch::x86_64::*;

/// Vectors per column per loop step for the 512-bit kernel: 32 registers leave room
/// for 3 outputs x 4 accumulators.
const UNROLL_512: usize = 4;
/// Vectors per column per loop step for the 256-bit kernels (16 registers).
const UNROLL_256: usize = 2;

/// The GFNI matrix of multiplication by 2.
const MATRIX_2: u64 = gf::affine_matrix(2);
/// The GFNI matrix of multiplication by 4.
const MATRIX_4: u64 = gf::affine_matrix(4);

/// 64 bytes in a zmm register; GFNI for multiplies.
#[derive(Clone, Copy)]
struct Avx512Gfni(__m512i);

impl Lanes for Avx512Gfni {
    const WIDTH: usize = 64;
    /// The GFNI matrix.
    type Mul = u64;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Self(_mm512_loadu_si512(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        self.mul(&MATRIX_2)
    }
    #[inline(always)]
    unsafe fn mul4(self) -> Self {
        self.mul(&MATRIX_4)
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> u64 {
        gf::affine_matrix(c)
    }
    #[inline(always)]
    unsafe fn mul(self, m: &u64) -> Self {
        let matrix = _mm512_set1_epi64(*m as i64);
        Self(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, matrix))
    }
}

/// 32 bytes in a ymm register; GFNI for multiplies.
#[derive(Clone, Copy)]
struct Avx2Gfni(__m256i);

impl Lanes for Avx2Gfni {
    const WIDTH: usize = 32;
    /// The GFNI matrix.
    type Mul = u64;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Self(_mm256_loadu_si256(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        self.mul(&MATRIX_2)
    }
    #[inline(always)]
    unsafe fn mul4(self) -> Self {
        self.mul(&MATRIX_4)
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> u64 {
        gf::affine_matrix(c)
    }
    #[inline(always)]
    unsafe fn mul(self, m: &u64) -> Self {
        let matrix = _mm256_set1_epi64x(*m as i64);
        Self(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, matrix))
    }
}

/// 32 bytes in a ymm register; shift-and-reduce and `pshufb` tables for multiplies.
#[derive(Clone, Copy)]
struct Avx2(__m256i);

impl Lanes for Avx2 {
    const WIDTH: usize = 32;
    /// The 16 low-nibble products, then the 16 high-nibble products.
    type Mul = [u8; 32];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Self(_mm256_loadu_si256(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // Double each byte; where its top bit was set (a signed byte below 0), reduce
        // by the low byte of the polynomial.
        let x = self.0;
        let overflow = _mm256_cmpgt_epi8(_mm256_setzero_si256(), x);
        let reduce = _mm256_and_si256(overflow, _mm256_set1_epi8(0x1d));
        Self(_mm256_xor_si256(_mm256_add_epi8(x, x), reduce))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> [u8; 32] {
        let (low, high) = gf::nibble_tables(c);
        let mut tables = [0u8; 32];
        tables[..16].copy_from_slice(&low);
        tables[16..].copy_from_slice(&high);
        tables
    }
    #[inline(always)]
    unsafe fn mul(self, m: &[u8; 32]) -> Self {
        // Each table in both 128-bit lanes, since pshufb looks up within a lane.
        let low_table = _mm256_broadcastsi128_si256(_mm_loadu_si128(m.as_ptr().cast()));
        let high_table = _mm256_broadcastsi128_si256(_mm_loadu_si128(m[16..].as_ptr().cast()));
        let nibble = _mm256_set1_epi8(0x0f);
        let low = _mm256_and_si256(self.0, nibble);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(self.0), nibble);
        Self(_mm256_xor_si256(
            _mm256_shuffle_epi8(low_table, low),
            _mm256_shuffle_epi8(high_table, high),
        ))
    }
}

// The entry points: each instantiates the generic algorithm inside a function compiled
// for the instruction set. Safety: as for `horner` and `dot`, plus CPU support.

#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn avx512_gfni_horner(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    mask: u8,
    len: usize,
) -> usize {
    horner::<Avx512Gfni, UNROLL_512>(inputs, outputs, mask, len)
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn avx512_gfni_dot(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    dot::<Avx512Gfni, UNROLL_512>(inputs, rows, outputs, len)
}

#[target_feature(enable = "avx2,gfni")]
pub(super) unsafe fn avx2_gfni_horner(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    mask: u8,
    len: usize,
) -> usize {
    horner::<Avx2Gfni, UNROLL_256>(inputs, outputs, mask, len)
}

#[target_feature(enable = "avx2,gfni")]
pub(super) unsafe fn avx2_gfni_dot(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    dot::<Avx2Gfni, UNROLL_256>(inputs, rows, outputs, len)
}

#[target_feature(enable = "avx2")]
pub(super) unsafe fn avx2_horner(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    mask: u8,
    len: usize,
) -> usize {
    horner::<Avx2, UNROLL_256>(inputs, outputs, mask, len)
}

#[target_feature(enable = "avx2")]
pub(super) unsafe fn avx2_dot(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    dot::<Avx2, UNROLL_256>(inputs, rows, outputs, len)
}
