//! Serves an in-memory export over NBD until Ctrl-C, for manual testing and benchmarks:
//! `cargo run -p lograid-nbd --features test-util --example mem_server -- 127.0.0.1:10809 1024`
//! (address, size in MiB).

use std::sync::Arc;

use lograid_nbd::mem_export::MemExport;
use lograid_nbd::{Export, ListenAddr, Server, ServerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:10809".into());
    let size_mib: u64 = args
        .next()
        .and_then(|size| size.parse().ok())
        .unwrap_or(1024);
    let export: Arc<dyn Export> = Arc::new(MemExport::new("disk0", size_mib << 20));
    let config = ServerConfig {
        listen: vec![ListenAddr::Tcp(addr.parse().expect("address"))],
        runtime_worker_threads: std::env::var("NBD_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, vec![export]).expect("bind");
    for addr in server.local_addrs() {
        eprintln!("serving {size_mib} MiB export disk0 on {addr}/disk0");
    }
    let handle = server.shutdown_handle();
    // Stop on SIGINT/SIGTERM without extra dependencies: block both signals in every thread
    // (threads inherit the mask) and wait for them in one.
    // SAFETY: plain libc signal-set calls on a zeroed local sigset_t.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut signal = 0;
        // SAFETY: waits on the signal set built above.
        unsafe { libc::sigwait(&signals, &mut signal) };
        handle.shutdown();
    });
    server.serve().expect("serve");
}
