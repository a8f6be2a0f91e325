//! Prints single-thread encode and reconstruct throughput on cached buffers.
//!
//! Usage: `cargo run --release -p lograid-parity --example parity_speed [SECONDS]`,
//! where SECONDS is the time per measurement (default 0.5). Set
//! `LOGRAID_PARITY_KERNEL=avx2` (or another kernel name) to measure another kernel.

use lograid_parity::{bench_encode, bench_reconstruct, kernel_name};

fn main() {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse().expect("SECONDS must be a number"),
        None => 0.5,
    };
    println!("kernel: {}", kernel_name());
    println!("GB/s of row data per second, one thread, median of slices");
    let sizes = [4096, 65536, 131072];
    println!(
        "{:<28}{:>10}{:>10}{:>10}",
        "operation", "4 KiB", "64 KiB", "128 KiB"
    );
    for (k, p) in [
        (2, 1),
        (4, 1),
        (4, 2),
        (5, 3),
        (8, 2),
        (8, 3),
        (16, 3),
        (32, 3),
    ] {
        print!("{:<28}", format!("encode {k}+{p}"));
        for size in sizes {
            print!("{:>10.1}", bench_encode(k, p, size, seconds));
        }
        println!();
    }
    for (k, p, missing) in [(4, 1, 1), (4, 2, 1), (4, 2, 2), (8, 3, 3), (16, 3, 3)] {
        print!("{:<28}", format!("reconstruct {k}+{p}, {missing} lost"));
        for size in sizes {
            print!("{:>10.1}", bench_reconstruct(k, p, missing, size, seconds));
        }
        println!();
    }
}
