//! Tests: the field, known vectors, every kernel against the scalar reference, the MDS
//! property, argument errors, and a property test.

use crate::kernels::Kernel;
use crate::{
    bench_encode, bench_reconstruct, coefficient, encode, encode_with, gf, kernel_name,
    reconstruct, reconstruct_with, scalar, ParityError, MAX_DATA_COLUMNS, MAX_PARITY, VANDERMONDE,
};
use proptest::prelude::*;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| (self.next() >> 56) as u8).collect()
    }

    /// `count` distinct values below `n`, in random order.
    fn distinct(&mut self, count: usize, n: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..count {
            let j = i + self.below(n - i);
            all.swap(i, j);
        }
        all.truncate(count);
        all
    }
}

/// Borrows owned columns the way the API takes them.
fn refs(columns: &[Vec<u8>]) -> Vec<&[u8]> {
    columns.iter().map(Vec::as_slice).collect()
}

fn refs_mut(columns: &mut [Vec<u8>]) -> Vec<&mut [u8]> {
    columns.iter_mut().map(Vec::as_mut_slice).collect()
}

/// A full row: `k` random data columns, then `p` parity columns from the scalar code.
fn encoded_row(rng: &mut Rng, k: usize, p: usize, len: usize) -> Vec<Vec<u8>> {
    let mut row: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
    let mut parity = vec![vec![0u8; len]; p];
    scalar::encode(&refs(&row), &mut refs_mut(&mut parity));
    row.extend(parity);
    row
}

/// Multiplication by shift-and-add, independent of the tables.
fn slow_mul(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        a = (a << 1) ^ if a & 0x80 != 0 { 0x1d } else { 0 };
        b >>= 1;
    }
    product
}

#[test]
fn field_tables_match_shift_and_add() {
    for a in 0..=255u8 {
        let table = gf::mul_table(a);
        let (low, high) = gf::nibble_tables(a);
        for b in 0..=255u8 {
            let expected = slow_mul(a, b);
            assert_eq!(gf::mul(a, b), expected, "{a} * {b}");
            assert_eq!(table[b as usize], expected);
            assert_eq!(low[(b & 15) as usize] ^ high[(b >> 4) as usize], expected);
        }
        if a != 0 {
            assert_eq!(gf::mul(a, gf::inv(a)), 1, "inverse of {a}");
        }
    }
    // 2 generates the whole multiplicative group.
    let powers: std::collections::HashSet<u8> = (0..255).map(gf::exp2).collect();
    assert_eq!(powers.len(), 255);
    assert_eq!(gf::exp2(8), 0x1d);
}

#[test]
#[should_panic(expected = "no inverse")]
fn zero_has_no_inverse() {
    gf::inv(0);
}

#[test]
fn gfni_matrix_applies_the_multiplication() {
    // Apply the matrix the way gf2p8affineqb does: bit i of the result is the parity
    // of (byte 7 - i of the matrix) AND x.
    for c in 0..=255u8 {
        let matrix = gf::affine_matrix(c).to_le_bytes();
        for x in 0..=255u8 {
            let y = (0..8).fold(0u8, |y, i| {
                y | (((matrix[7 - i] & x).count_ones() & 1) as u8) << i
            });
            assert_eq!(y, gf::mul(c, x));
        }
    }
}

#[test]
fn coefficients_are_powers_of_the_generator() {
    for (r, g) in [1u8, 2, 4].into_iter().enumerate() {
        let mut expected = 1u8;
        for (j, &table) in VANDERMONDE[r].iter().enumerate() {
            assert_eq!(coefficient(r, j), expected, "row {r} column {j}");
            assert_eq!(table, expected);
            expected = gf::mul(expected, g);
        }
    }
    assert_eq!(coefficient(1, 8), 0x1d);
    assert_eq!(coefficient(2, 4), 0x1d);
}

/// P is XOR and Q is the Linux RAID-6 syndrome, on vectors worked out by hand.
#[test]
fn known_vectors() {
    let data: [&[u8]; 4] = [
        &[0x01, 0x02, 0x80, 0xff, 0x00, 0x55],
        &[0x01, 0x40, 0x80, 0x00, 0x11, 0xaa],
        &[0x01, 0x00, 0x80, 0x01, 0x22, 0x5a],
        &[0x01, 0x00, 0x80, 0x8e, 0x33, 0xa5],
    ];
    // Q byte 2 = 0x80 ^ 2*0x80 ^ 4*0x80 ^ 8*0x80 = 0x80 ^ 0x1d ^ 0x3a ^ 0x74 = 0xd3.
    let expected: [[u8; 6]; 3] = [
        [0x00, 0x42, 0x00, 0x70, 0x00, 0x00],
        [0x0f, 0x82, 0xd3, 0xff, 0x2f, 0x28],
        [0x55, 0x1f, 0xd5, 0xcf, 0x02, 0x3c],
    ];
    for i in 0..6 {
        let xor = data.iter().fold(0, |x, d| x ^ d[i]);
        assert_eq!(expected[0][i], xor);
    }
    let check = |encoder: fn(&[&[u8]], &mut [&mut [u8]])| {
        let mut parity = [[0u8; 6]; 3];
        let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
        encoder(&data, &mut parity_refs);
        assert_eq!(parity, expected);
    };
    check(encode);
    check(scalar::encode);

    // The example in the crate documentation.
    let mut parity = [[0u8; 1]; 3];
    let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
    encode(&[&[0x01], &[0x80], &[0xff]], &mut parity_refs);
    assert_eq!(parity, [[0x7e], [0xc7], [0x70]]);
}

/// Every kernel, on every shape and on lengths that leave tails, gives the scalar bytes.
#[test]
fn every_kernel_encodes_like_scalar() {
    let mut rng = Rng::new(1);
    let kernels: Vec<Kernel> = Kernel::available().collect();
    assert!(kernels.contains(&Kernel::Generic));
    for len in [0, 1, 63, 4096, 4097, 65536] {
        for k in 1..=23 {
            let data: Vec<Vec<u8>> = (0..k).map(|_| rng.bytes(len)).collect();
            for p in 0..=MAX_PARITY {
                let mut expected = vec![vec![0u8; len]; p];
                scalar::encode(&refs(&data), &mut refs_mut(&mut expected));
                for &kernel in &kernels {
                    let mut parity: Vec<Vec<u8>> = (0..p).map(|_| rng.bytes(len)).collect();
                    encode_with(kernel, &refs(&data), &mut refs_mut(&mut parity));
                    assert!(
                        parity == expected,
                        "{} differs from scalar: k={k} p={p} len={len}",
                        kernel.name()
                    );
                }
            }
        }
    }
}

/// Every kernel rebuilds like the scalar code, for random erasure sets; on encoded rows
/// both give back the original, and on random (inconsistent) rows they still agree,
/// which checks that they apply the same decode matrix.
#[test]
fn every_kernel_reconstructs_like_scalar() {
    let mut rng = Rng::new(2);
    for kernel in Kernel::available() {
        for k in 1..=23 {
            for p in 1..=MAX_PARITY {
                for round in 0..6 {
                    let len = [4096, 4096 + 17, 1000][round % 3];
                    let original = if round < 3 {
                        encoded_row(&mut rng, k, p, len)
                    } else {
                        (0..k + p).map(|_| rng.bytes(len)).collect()
                    };
                    let count = 1 + rng.below(p);
                    let missing = rng.distinct(count, k + p);
                    let mut fast = original.clone();
                    let mut slow = original.clone();
                    for &c in &missing {
                        fast[c] = rng.bytes(len);
                        slow[c] = rng.bytes(len);
                    }
                    reconstruct_with(kernel, k, &mut refs_mut(&mut fast), &missing).unwrap();
                    scalar::reconstruct(k, &mut refs_mut(&mut slow), &missing).unwrap();
                    let what = format!("{}: k={k} p={p} missing={missing:?}", kernel.name());
                    assert!(fast == slow, "fast and scalar differ, {what}");
                    if round < 3 {
                        assert!(fast == original, "not the original, {what}");
                    }
                }
            }
        }
    }
}

/// The MDS property: for every K up to the maximum and every P, every set of up to P
/// lost columns (data or parity) is rebuilt exactly.
#[test]
fn every_erasure_pattern_is_recoverable() {
    let mut rng = Rng::new(3);
    let len = 4 * 64 + 37; // one step of the widest kernel, and a tail
    for k in 1..=MAX_DATA_COLUMNS {
        for p in 1..=MAX_PARITY {
            let original = encoded_row(&mut rng, k, p, len);
            let mut row = original.clone();
            let n = k + p;
            let mut patterns: Vec<Vec<usize>> = (0..n).map(|a| vec![a]).collect();
            for a in 0..n {
                for b in a + 1..n {
                    if p >= 2 {
                        patterns.push(vec![a, b]);
                    }
                    if p >= 3 {
                        patterns.extend((b + 1..n).map(|c| vec![a, b, c]));
                    }
                }
            }
            for missing in patterns {
                for &c in &missing {
                    row[c].fill(0xa5);
                }
                let result = reconstruct(k, &mut refs_mut(&mut row), &missing);
                assert_eq!(result, Ok(()), "k={k} p={p} missing={missing:?}");
                assert!(row == original, "k={k} p={p} missing={missing:?}");
            }
        }
    }
}

/// The scalar reference alone also recovers every pattern (smaller K: it inverts a
/// K x K matrix per call).
#[test]
fn scalar_recovers_every_pattern() {
    let mut rng = Rng::new(4);
    for k in 1..=8 {
        let p = MAX_PARITY;
        let original = encoded_row(&mut rng, k, p, 33);
        let n = k + p;
        for a in 0..n {
            for b in a + 1..n {
                for c in b + 1..n {
                    let mut row = original.clone();
                    for &x in &[a, b, c] {
                        row[x].fill(0);
                    }
                    scalar::reconstruct(k, &mut refs_mut(&mut row), &[c, a, b]).unwrap();
                    assert!(row == original, "k={k} missing={a},{b},{c}");
                }
            }
        }
    }
}

#[test]
fn reconstruct_rejects_bad_arguments() {
    let mut rng = Rng::new(5);
    let original = encoded_row(&mut rng, 4, 2, 64);
    let bad_shape = |r: Result<(), ParityError>| matches!(r, Err(ParityError::BadShape(_)));
    type Reconstruct = fn(usize, &mut [&mut [u8]], &[usize]) -> Result<(), ParityError>;
    for f in [reconstruct as Reconstruct, scalar::reconstruct] {
        let mut row = original.clone();
        assert_eq!(
            f(4, &mut refs_mut(&mut row), &[0, 1, 5]),
            Err(ParityError::TooManyMissing {
                missing: 3,
                parity: 2
            })
        );
        assert!(bad_shape(f(4, &mut refs_mut(&mut row), &[6])));
        assert!(bad_shape(f(4, &mut refs_mut(&mut row), &[1, 1])));
        assert!(bad_shape(f(0, &mut refs_mut(&mut row), &[])));
        assert!(bad_shape(f(7, &mut refs_mut(&mut row), &[0])));
        assert!(bad_shape(f(2, &mut refs_mut(&mut row), &[0])), "p = 4");
        let mut too_many = vec![vec![0u8; 8]; MAX_DATA_COLUMNS + 1];
        assert!(bad_shape(f(33, &mut refs_mut(&mut too_many), &[])));
        row[3].push(0);
        assert!(bad_shape(f(4, &mut refs_mut(&mut row), &[0])));
        row[3].pop();
        // Errors write nothing; nothing missing changes nothing.
        assert!(row == original);
        row[0].fill(0);
        assert_eq!(f(4, &mut refs_mut(&mut row), &[]), Ok(()));
        assert!(row[0].iter().all(|&b| b == 0));
    }
    let message = ParityError::TooManyMissing {
        missing: 3,
        parity: 2,
    }
    .to_string();
    assert_eq!(message, "3 columns missing but only 2 parity columns");
}

#[test]
#[should_panic(expected = "different lengths")]
fn encode_rejects_unequal_lengths() {
    let mut parity = vec![0u8; 4];
    encode(&[&[0; 4], &[0; 5]], &mut [&mut parity]);
}

#[test]
#[should_panic(expected = "data columns")]
fn encode_rejects_no_data() {
    encode(&[], &mut []);
}

#[test]
fn kernel_is_named_and_benchmarks_run() {
    assert!(Kernel::available().any(|k| k.name() == kernel_name()));
    assert!(bench_encode(4, 2, 4096, 0.005) > 0.0);
    assert!(bench_reconstruct(4, 2, 2, 4096, 0.005) > 0.0);
}

/// A row shape, contents and erasure set.
fn case() -> impl Strategy<Value = (usize, usize, usize, Vec<usize>, u64)> {
    (
        1..=MAX_DATA_COLUMNS,
        1..=MAX_PARITY,
        0..1200usize,
        any::<u64>(),
    )
        .prop_flat_map(|(k, p, len, seed)| {
            let erasures =
                proptest::sample::subsequence((0..k + p).collect::<Vec<_>>(), 0..=p).prop_shuffle();
            (Just(k), Just(p), Just(len), erasures, Just(seed))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn encode_and_reconstruct_agree_with_scalar((k, p, len, missing, seed) in case()) {
        let mut rng = Rng::new(seed);
        let original = encoded_row(&mut rng, k, p, len);
        let mut parity = vec![vec![0u8; len]; p];
        encode(&refs(&original[..k]), &mut refs_mut(&mut parity));
        prop_assert!(parity[..] == original[k..]);

        let mut fast = original.clone();
        let mut slow = original.clone();
        for &c in &missing {
            fast[c] = rng.bytes(len);
            slow[c] = rng.bytes(len);
        }
        prop_assert_eq!(reconstruct(k, &mut refs_mut(&mut fast), &missing), Ok(()));
        prop_assert_eq!(scalar::reconstruct(k, &mut refs_mut(&mut slow), &missing), Ok(()));
        prop_assert!(fast == original);
        prop_assert!(slow == original);
    }
}
