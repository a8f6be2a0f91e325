//! The portable kernel: eight bytes at a time in a `u64` (SWAR), for CPUs without a
//! vector kernel. Multiplying by 2 is a masked shift plus reduction; other constants
//! go through a 256-entry byte table.

use super::{dot as generic_dot, horner as generic_horner, Lanes};
use crate::gf;
use crate::{MAX_DATA_COLUMNS, MAX_PARITY};

/// Words per column per loop step.
const UNROLL: usize = 4;

/// Eight bytes, little-endian in a `u64`.
#[derive(Clone, Copy)]
struct Swar(u64);

impl Lanes for Swar {
    const WIDTH: usize = 8;
    type Mul = [u8; 256];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Self(0)
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Self(u64::from_le_bytes(src.cast::<[u8; 8]>().read_unaligned()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        dst.cast::<[u8; 8]>().write_unaligned(self.0.to_le_bytes())
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(self.0 ^ other.0)
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // Shift each byte left without carrying into the next one, then reduce the
        // bytes whose top bit fell off (their carry bit times 0x1d).
        let carries = (self.0 >> 7) & 0x0101_0101_0101_0101;
        Self(((self.0 & 0x7f7f_7f7f_7f7f_7f7f) << 1) ^ (carries * 0x1d))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> [u8; 256] {
        gf::mul_table(c)
    }
    #[inline(always)]
    unsafe fn mul(self, m: &[u8; 256]) -> Self {
        Self(u64::from_le_bytes(
            self.0.to_le_bytes().map(|b| m[b as usize]),
        ))
    }
}

/// [`super::horner`] on 64-bit words. Safety: as for it.
pub(super) unsafe fn horner(
    inputs: &[*const u8],
    outputs: &[*mut u8; MAX_PARITY],
    mask: u8,
    len: usize,
) -> usize {
    generic_horner::<Swar, UNROLL>(inputs, outputs, mask, len)
}

/// [`super::dot`] on 64-bit words. Safety: as for it.
pub(super) unsafe fn dot(
    inputs: &[*const u8],
    rows: &[[u8; MAX_DATA_COLUMNS]],
    outputs: &[*mut u8],
    len: usize,
) -> usize {
    generic_dot::<Swar, UNROLL>(inputs, rows, outputs, len)
}
