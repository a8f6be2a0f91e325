//! Single-thread throughput of [`crate::encode`] and [`crate::reconstruct`] on cached
//! buffers, for `lograid bench`.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The timing loop is cut into this many slices; the result is the median slice, so
/// that a burst of load from other processes on the machine moves it little.
const SLICES: usize = 11;

/// GB/s (10^9 bytes per second) of data encoded by [`crate::encode`] with `k` data and
/// `p` parity columns of `column_bytes` each, on one thread, over about `seconds`.
///
/// The same 4 KiB-aligned buffers are encoded over and over, so this is compute
/// throughput on cached data. Bytes counted per call: `k * column_bytes`.
///
/// # Panics
///
/// If `k`, `p` or `column_bytes` is out of range (`column_bytes` must be at least 1).
pub fn bench_encode(k: usize, p: usize, column_bytes: usize, seconds: f64) -> f64 {
    assert!(column_bytes > 0, "empty columns");
    let data: Vec<Column> = (0..k).map(|j| Column::random(column_bytes, j)).collect();
    let mut parity: Vec<Column> = (0..p)
        .map(|r| Column::random(column_bytes, k + r))
        .collect();
    let data: Vec<&[u8]> = data.iter().map(Column::bytes).collect();
    let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(Column::bytes_mut).collect();
    throughput(k * column_bytes, seconds, || {
        crate::encode(black_box(&data), black_box(&mut parity))
    })
}

/// GB/s of row data served by [`crate::reconstruct`] rebuilding `missing_count`
/// columns of a row with `k` data and `p` parity columns of `column_bytes` each, on one
/// thread, over about `seconds`.
///
/// The missing columns are the first `missing_count` columns of the row: data columns
/// (the costly case, as for a degraded read), then parity if `missing_count > k`. Bytes
/// counted per call: `k * column_bytes`, the data of the row, as for encode.
///
/// # Panics
///
/// If the shape is out of range or `missing_count > p`.
pub fn bench_reconstruct(
    k: usize,
    p: usize,
    missing_count: usize,
    column_bytes: usize,
    seconds: f64,
) -> f64 {
    assert!(column_bytes > 0, "empty columns");
    assert!(
        missing_count <= p,
        "{missing_count} missing with {p} parity"
    );
    let mut columns: Vec<Column> = (0..k + p)
        .map(|c| Column::random(column_bytes, c))
        .collect();
    let mut columns: Vec<&mut [u8]> = columns.iter_mut().map(Column::bytes_mut).collect();
    {
        let (data, parity) = columns.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
        crate::encode(&data, parity);
    }
    let missing: Vec<usize> = (0..missing_count).collect();
    throughput(k * column_bytes, seconds, || {
        crate::reconstruct(k, black_box(&mut columns), black_box(&missing))
            .expect("reconstruct failed in benchmark")
    })
}

/// Runs `call` for about `seconds` and returns the median GB/s over [`SLICES`] slices.
fn throughput(bytes_per_call: usize, seconds: f64, mut call: impl FnMut()) -> f64 {
    // Warm the caches, then find how many calls take about one slice.
    call();
    let slice = Duration::from_secs_f64(seconds.max(0.0) / SLICES as f64);
    let mut calls_per_slice = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..calls_per_slice {
            call();
        }
        let elapsed = start.elapsed();
        if elapsed >= slice / 4 || calls_per_slice >= 1 << 40 {
            let per_call = elapsed.as_secs_f64() / calls_per_slice as f64;
            calls_per_slice = ((slice.as_secs_f64() / per_call.max(1e-12)) as u64).max(1);
            break;
        }
        calls_per_slice *= 2;
    }
    let mut rates: Vec<f64> = (0..SLICES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..calls_per_slice {
                call();
            }
            let seconds = start.elapsed().as_secs_f64().max(1e-12);
            (bytes_per_call as f64 * calls_per_slice as f64) / seconds / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[SLICES / 2]
}

/// A column buffer aligned to 4 KiB, like the engine's O_DIRECT buffers, filled with
/// pseudo-random bytes.
struct Column {
    buffer: Vec<u8>,
    start: usize,
    len: usize,
}

impl Column {
    const ALIGN: usize = 4096;

    fn random(len: usize, seed: usize) -> Self {
        let mut buffer = vec![0u8; len + Self::ALIGN];
        let start = buffer.as_ptr().align_offset(Self::ALIGN);
        let mut state =
            0x9e37_79b9_7f4a_7c15u64 ^ (seed as u64 + 1).wrapping_mul(0xff51_afd7_ed55_8ccd);
        for byte in &mut buffer[start..start + len] {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = (state >> 56) as u8;
        }
        Column { buffer, start, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.buffer[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buffer[self.start..self.start + self.len]
    }
}
