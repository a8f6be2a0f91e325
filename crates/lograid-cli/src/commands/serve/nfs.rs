//! `serve --nfs ADDR`: the pool's volumes as files over NFSv3, beside the NBD exports.
//!
//! Owns: parsing and binding the NFS address (before the pool is opened, so a bad one fails
//! first; a bare port means loopback; a warning for anything beyond it), the NFS server's
//! thread and runtime, its files (the same exports as NBD serves, with the engine's volume
//! ids for stable handles), showing its counters in the metrics while it runs, and how to
//! connect. Must never: stop before the calls it has in
//! flight are answered and the volumes flushed, or outlive the pool.

use anyhow::{Context, Result};
use lograid::Pool;
use lograid_nbd::Export;
use lograid_nfs::{Namespace, NfsConfig, NfsServer, NfsVolume, ShutdownHandle, Space};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// `ADDR:PORT`, or a bare `PORT` on 127.0.0.1.
pub fn parse_addr(text: &str) -> Result<SocketAddr> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .with_context(|| {
            format!("--nfs '{text}': expected ADDR:PORT or PORT (e.g. 127.0.0.1:2049 or 20490)")
        })?
        .next()
        .with_context(|| format!("--nfs '{text}': the name resolves to no address"))
}

/// Binds the NFS listener, warning if it reaches beyond this host.
pub fn bind(text: &str, allow: &[IpAddr]) -> Result<std::net::TcpListener> {
    let addr = parse_addr(text)?;
    if !addr.ip().is_loopback() {
        eprintln!(
            "lograid: warning: NFS on {addr}, beyond this host: this NFS server has no authentication, anyone who can \
             reach this address can read and overwrite the volumes{}",
            if allow.is_empty() { " (restrict clients with --allow IP,...)" } else { "" }
        );
    }
    std::net::TcpListener::bind(addr).with_context(|| format!("--nfs {addr}: cannot listen"))
}

/// A running NFS server: stop it with [`Running::stop`]; dropped, it is stopped too (an early
/// return must not leave it serving a pool about to close).
pub struct Running {
    handle: ShutdownHandle,
    stats: lograid_nfs::StatsHandle,
    thread: Option<std::thread::JoinHandle<Result<(), lograid_nfs::NfsError>>>,
    pub addr: SocketAddr,
}

/// Serves `exports` (the volumes of `pool`, as NBD serves them) as files on `listener`, as
/// `args` say (read-only, allowed clients, drain at stop).
pub fn start(
    listener: std::net::TcpListener,
    pool: &Pool,
    exports: &[Arc<dyn Export>],
    args: &super::ServeArgs,
) -> Result<Running> {
    let (read_only, allow) = (args.read_only, &args.allow);
    let ids: Vec<(String, u32)> = pool
        .volumes()
        .iter()
        .map(|v| (v.name().to_string(), v.id()))
        .collect();
    let volumes = exports
        .iter()
        .filter_map(|export| {
            let id = ids.iter().find(|(name, _)| name == export.name())?.1;
            Some(NfsVolume {
                export: export.clone(),
                volume_id: id,
            })
        })
        .collect();
    let space_pool = pool.clone();
    let space = Arc::new(move || {
        let status = space_pool.status();
        Space {
            total_bytes: status.usable_bytes,
            free_bytes: status.free_bytes,
        }
    });
    let namespace = Namespace::new(pool.uuid(), volumes, read_only, Some(space))
        .context("serving the volumes over NFS")?;
    let config = NfsConfig {
        allow_list: (!allow.is_empty()).then(|| allow.to_vec()),
        read_only,
        shutdown_grace: Duration::from_secs(30),
        drain: Duration::from_secs(args.nfs_drain),
        ..NfsConfig::default()
    };
    let server = NfsServer::new(listener, config, namespace).context("starting the NFS server")?;
    let addr = server.local_addr();
    let handle = server.shutdown_handle();
    let stats = server.stats_handle();
    crate::metrics::serve_nfs_stats(Some(stats.clone()));
    let thread = std::thread::Builder::new()
        .name("lograid-nfs".into())
        .spawn(move || server.serve())
        .context("starting the NFS server's thread")?;
    Ok(Running {
        handle,
        stats,
        thread: Some(thread),
        addr,
    })
}

impl Running {
    /// A handle that starts the shutdown from any thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Stops accepting, answers what is in flight, flushes the volumes, and waits for it;
    /// then says what was served.
    pub fn stop(mut self) -> Result<()> {
        self.handle.shutdown();
        let result = match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result.context("NFS server"),
            Some(Err(_)) => Err(anyhow::anyhow!("the NFS server's thread panicked")),
            None => Ok(()),
        };
        let s = self.stats.snapshot();
        crate::metrics::serve_nfs_stats(None);
        tracing::info!(
            connections = s.connections_accepted,
            refused = s.connections_refused,
            calls = s.calls,
            errors = s.call_errors,
            read_bytes = s.read_bytes,
            written_bytes = s.written_bytes,
            commits = s.commits,
            protocol_errors = s.protocol_errors,
            peak_in_flight_bytes = s.peak_in_flight_bytes,
            "NFS server stopped"
        );
        result
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.handle.shutdown();
            let _ = thread.join();
            crate::metrics::serve_nfs_stats(None);
        }
    }
}

/// How to reach the files (file `first`) at `addr` from this host.
pub fn connect_lines(addr: SocketAddr, first: &str) -> String {
    let host = if addr.ip().is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        addr.ip()
    };
    let port = addr.port();
    let url_host = match host {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    };
    format!(
        "volumes as files over NFSv3 on {url_host}:{port} (export /, NFS and MOUNT on port {port}):\n  \
         nfs-ls 'nfs://{url_host}/?nfsport={port}&mountport={port}&version=3'\n  \
         mount_nfs -o vers=3,tcp,port={port},mountport={port},nolocks {url_host}:/ DIR      (macOS; then hdiutil attach DIR/{first})\n  \
         mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock {url_host}:/ DIR      (Linux)\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr("20490").unwrap(),
            "127.0.0.1:20490".parse().unwrap()
        );
        assert_eq!(parse_addr("[::1]:5").unwrap(), "[::1]:5".parse().unwrap());
        assert!(parse_addr("nonsense").is_err());
        let lines = connect_lines("0.0.0.0:7".parse().unwrap(), "vol0");
        assert!(
            lines.contains("nfs://127.0.0.1/?nfsport=7&mountport=7&version=3"),
            "{lines}"
        );
    }
}
