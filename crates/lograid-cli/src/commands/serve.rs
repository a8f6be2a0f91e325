//! `lograid serve`: serve every volume of a pool as an NBD export.
//!
//! Owns: the server process's life: hardening it for backing local block
//! devices, opening (or, with no drives, creating) the pool, mounting the
//! `--fuse` files, binding, starting the `--nfs` service and the `--ublk`
//! devices, telling the user how to connect, and the orderly end on
//! SIGINT/SIGTERM (stop accepting, finish requests in flight, flush, remove the
//! ublk devices, close the pool with a final checkpoint). Must never: exit with writes
//! acknowledged by a flush that is not durable, listen beyond loopback unless
//! told to, or answer on a listener before the `--fuse` files are mounted.

mod nfs;
mod notify;
mod scan;
mod ublk;

pub use nfs::parse_addr as parse_nfs_addr;

use super::open_pool_with;
use crate::export::VolumeExport;
use crate::size::human;
use anyhow::{bail, Context, Result};
use clap::Args;
use lograid::{CreateOptions, Pool, PoolOptions};
use lograid_nbd::{Export, ListenAddr, Server, ServerConfig, TlsFiles, TlsMode, TlsSettings};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
/// Where `lograid serve` with no drives keeps its pool (relative to the current directory).
pub const DEFAULT_DATA_DIR: &str = "lograid-data";
const DEFAULT_MEMBERS: usize = 3;
const DEFAULT_MEMBER_BYTES: u64 = 4 << 30;
const DEFAULT_VOLUME: &str = "vol0";

#[derive(Args)]
pub struct ServeArgs {
    /// TCP address to listen on (default 127.0.0.1:10809, or none when only --socket is given).
    /// Anything but a loopback address exposes the volumes to the network, unauthenticated.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Also (or, without --listen, only) listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve the volumes read-only (the pool is opened read-only: nothing is written).
    #[arg(long)]
    pub read_only: bool,
    /// Refuse to serve a pool with members missing (by default it is served
    /// degraded while its parity covers them).
    #[arg(long)]
    pub no_degraded: bool,
    /// Serve this volume read-only (repeatable; the others stay writable).
    #[arg(long, value_name = "VOLUME")]
    pub read_only_volume: Vec<String>,
    /// Serve only TCP clients from these addresses (comma-separated).
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    pub allow: Vec<IpAddr>,
    /// TLS (NBD STARTTLS): off, on (clients choose) or require (default when
    /// --tls-certificates is given).
    #[arg(long, value_name = "MODE", value_parser = ["off", "on", "require"])]
    pub tls: Option<String>,
    /// Directory with server-cert.pem and server-key.pem (and ca-cert.pem for
    /// --tls-verify-peer), the layout nbdkit and qemu-nbd use.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Serve only clients whose certificate is issued by DIR/ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// How the cleaner picks segments to empty: cost-benefit (default; best on skewed
    /// overwrites) or greedy (the emptiest segment; as good on uniform ones).
    #[arg(long, value_name = "POLICY", default_value = "cost-benefit")]
    pub cleaner_policy: lograid::CleanerPolicy,
    /// Discard segments on the drives when the cleaner frees them (punch holes in files,
    /// BLKDISCARD on block devices), so sparse files and thin or flash storage shrink.
    #[arg(long)]
    pub discard: bool,
    /// Share of the time a rebuild or rebalance may take while clients are
    /// doing I/O (0.05-1; it runs flat out when they are idle).
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub rebuild_share: f64,
    /// Scrub the pool in the background every DURATION (e.g. 12h, 7d, 30d), the first
    /// one DURATION after the server starts.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub scrub_every: Option<std::time::Duration>,
    /// Also show each volume as a file DIR/VOLUME in a FUSE mount served by this process, for
    /// `lograid attach --file DIR/VOLUME` (a /dev/loopN with no NBD client in between).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// Also serve each volume as a fixed-size file /VOLUME over NFSv3 on ADDR:PORT (or PORT on
    /// 127.0.0.1), NFS and MOUNT on that one port, for disk-image attachers (macOS hdiutil, a
    /// Linux loop device on an NFS mount). No authentication: keep it on loopback.
    #[arg(long, value_name = "ADDR:PORT")]
    pub nfs: Option<String>,
    /// Also serve each volume as a Linux block device /dev/ublkbN through the kernel's ublk
    /// driver (as root; Linux 6.5 or later, `modprobe ublk_drv`). Write-through: a write
    /// completes once it is durable, so a server killed and started again on the same pool
    /// takes its devices back and a filesystem mounted on one sees only a pause.
    #[arg(long)]
    pub ublk: bool,
    /// Hardware queues per ublk device (default: the number of CPUs, at most 4).
    #[arg(long, value_name = "N", requires = "ublk")]
    pub ublk_queues: Option<u16>,
    /// Requests in flight per ublk queue.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "ublk")]
    pub ublk_depth: u16,
    /// Volume i becomes /dev/ublkb(N+i), or the server does not start (by default each volume
    /// gets the id it had last time if that is free, else the lowest free one).
    #[arg(long, value_name = "N", requires = "ublk")]
    pub ublk_id_base: Option<u32>,
    /// Give the ublk devices a volatile write cache, like a drive's (writes complete from
    /// memory; FLUSH and FUA make them durable). Fewer flushes, but a killed server's devices
    /// are not taken back: their I/O fails and a filesystem on them must be mounted again.
    #[arg(long, requires = "ublk")]
    pub ublk_write_cache: bool,
    /// With --nfs: at stop, go on serving the NFS clients still connected (a disk image being
    /// detached, its mount unmounted) for up to SECONDS before closing their connections.
    #[arg(long, value_name = "SECONDS", requires = "nfs", default_value_t = 0)]
    pub nfs_drain: u64,
    /// Serve metrics in the Prometheus text format at http://ADDR:PORT/metrics (off by
    /// default; e.g. 127.0.0.1:9450). docs/OPERATIONS.md, "Metrics", lists them.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub scan: scan::ScanArgs,
    /// The drives (files, block devices, or a directory of *.img files). None: ./lograid-data,
    /// created on first run as three sparse 4 GiB files with parity 1 and one volume "vol0".
    /// Drives that are missing or not members of the pool are set aside (with a log line);
    /// the pool is served degraded while its parity covers the members they leave out. With
    /// --pool: the candidates to find the pool's drives among.
    pub drives: Vec<PathBuf>,
}

fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let (num, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{text}': a number and s, m, h or d (e.g. 7d)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" | "" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("'{text}': unit s, m, h or d")),
    };
    if secs == 0 {
        return Err(format!("'{text}': must be more than zero"));
    }
    Ok(std::time::Duration::from_secs(secs))
}

fn parse_share(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if (0.05..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("'{text}': a fraction from 0.05 to 1")),
    }
}

fn parse_listen(text: &str) -> Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .with_context(|| {
            format!("--listen '{text}': expected ADDR:PORT (e.g. 127.0.0.1:10809 or [::1]:10809)")
        })?
        .next()
        .with_context(|| format!("--listen '{text}': the name resolves to no address"))
}

/// How a client on this host reaches a TCP listener (an unspecified address means loopback).
fn client_uri(addr: &ListenAddr, export: &str) -> String {
    match addr {
        ListenAddr::Tcp(a) => format!("nbd://{}/{export}", local_client_addr(a)),
        ListenAddr::Unix(path) => format!("nbd+unix:///{export}?socket={}", path.display()),
    }
}

/// The TLS form of a plaintext NBD URI (nbd:// → nbds://, nbd+unix:// → nbds+unix://).
fn tls_uri(uri: &str) -> String {
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        format!("nbds+unix://{rest}")
    } else if let Some(rest) = uri.strip_prefix("nbd://") {
        format!("nbds://{rest}")
    } else {
        uri.to_string()
    }
}

/// Where a client on this host reaches a TCP listener: loopback (of the
/// same family) for an unspecified address.
fn local_client_addr(sa: &SocketAddr) -> SocketAddr {
    if !sa.ip().is_unspecified() {
        return *sa;
    }
    let ip = if sa.is_ipv4() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
    };
    SocketAddr::new(ip, sa.port())
}

/// Whether opening failed because another process holds a drive's lock.
pub fn is_locked(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<lograid::Error>().is_some_and(|le| {
            matches!(le, lograid::Error::Io { cause, .. } if cause.kind() == std::io::ErrorKind::WouldBlock)
        })
    })
}

/// An engine error as one line: its message already names its cause (so the
/// cause is not repeated), plus a hint when another server holds the drives.
fn readable(e: anyhow::Error) -> anyhow::Error {
    let locked = is_locked(&e);
    let Some(engine) = e.downcast_ref::<lograid::Error>() else {
        return e;
    };
    let mut message = engine.to_string();
    if locked {
        message.push_str(
            "; is `lograid serve` already running on these drives? A pool is served by one process at a time \
             (stop the other server first)",
        );
    }
    anyhow::anyhow!(message)
}

/// Opens the default pool in ./lograid-data, creating it on first run.
fn open_or_create_default(read_only: bool, options: PoolOptions, degraded: bool) -> Result<Pool> {
    let dir = Path::new(DEFAULT_DATA_DIR);
    let paths: Vec<PathBuf> = (0..DEFAULT_MEMBERS)
        .map(|i| dir.join(format!("member{i}.img")))
        .collect();
    if dir.exists() && paths.iter().any(|p| p.exists()) {
        eprintln!("lograid: no drives given: serving the pool in ./{DEFAULT_DATA_DIR}");
        return open_pool_with(&[dir.to_path_buf()], read_only, options, degraded).map_err(|e| {
            let locked = is_locked(&e);
            let e = readable(e);
            if locked {
                e
            } else {
                e.context(format!(
                    "opening the default pool in ./{DEFAULT_DATA_DIR} (remove that directory to start over with an empty pool)"
                ))
            }
        });
    }
    let created_dir = !dir.exists();
    std::fs::create_dir_all(dir).with_context(|| format!("creating ./{DEFAULT_DATA_DIR}"))?;
    let result = create_default(&paths, options);
    if result.is_err() {
        // Leave nothing half-made behind: the next run would refuse it.
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        if created_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
    result
}

fn create_default(paths: &[PathBuf], options: PoolOptions) -> Result<Pool> {
    let flat = |e: lograid::Error| {
        anyhow::anyhow!("creating the default pool in ./{DEFAULT_DATA_DIR}: {e}")
    };
    let members =
        lograid::open_new_members(paths, Some(DEFAULT_MEMBER_BYTES), false).map_err(flat)?;
    let opts = CreateOptions {
        name: "lograid".into(),
        parity: 1,
        ..Default::default()
    };
    let pool = lograid::create_pool(members, &opts, options).map_err(flat)?;
    let usable = pool.status().usable_bytes / 4096 * 4096;
    pool.create_volume(DEFAULT_VOLUME, usable).map_err(flat)?;
    eprintln!(
        "lograid: no drives given: created a pool in ./{DEFAULT_DATA_DIR}: {} sparse files of {} ({}), parity 1, \
         volume '{DEFAULT_VOLUME}' of {}",
        paths.len(),
        human(DEFAULT_MEMBER_BYTES),
        paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        human(usable)
    );
    Ok(pool)
}

pub fn run(a: ServeArgs) -> Result<()> {
    // systemd (Type=notify): nothing is sent unless NOTIFY_SOCKET is set.
    let notifier = Arc::new(notify::Notifier::from_env());
    // Before the pool allocates its buffers: lock memory, mark us an I/O flusher.
    for warning in lograid_nbd::harden_process_for_block_backing() {
        eprintln!("lograid: warning: {warning}");
    }

    let tls = tls_settings(&a)?;
    // Bound before the pool is opened, so that a bad --metrics address fails first.
    let metrics = a
        .metrics
        .as_deref()
        .map(crate::metrics::Endpoint::bind)
        .transpose()?;
    // Also bound first: a bad --nfs address fails before the pool opens.
    let nfs_listener = a
        .nfs
        .as_deref()
        .map(|text| nfs::bind(text, &a.allow))
        .transpose()?;
    // And the ublk driver checked: a missing one fails before the pool opens.
    if a.ublk {
        ublk::check(&a)?;
    }
    let mut listen = Vec::new();
    let tcp = match (&a.listen, &a.socket) {
        (Some(text), _) => Some(parse_listen(text)?),
        (None, None) => Some(DEFAULT_LISTEN.parse().expect("default address")),
        (None, Some(_)) => None,
    };
    if let Some(addr) = tcp {
        let authenticated =
            tls.as_ref().is_some_and(|t| t.mode == TlsMode::Required) && a.tls_verify_peer;
        if !addr.ip().is_loopback() && !authenticated {
            eprintln!(
                "lograid: warning: listening on {addr}, beyond this host: NBD has no authentication here, anyone who \
                 can reach this address can read and overwrite the volumes{}",
                if a.allow.is_empty() { " (restrict clients with --allow IP,...)" } else { "" }
            );
        }
        listen.push(ListenAddr::Tcp(addr));
    }
    if let Some(path) = &a.socket {
        listen.push(ListenAddr::Unix(path.clone()));
    }

    // The pool first: its exclusive locks are what refuses a second server on the same drives.
    let options = PoolOptions {
        cleaner_policy: a.cleaner_policy,
        discard: a.discard,
        reshape_share: a.rebuild_share,
        ..Default::default()
    };
    let pool = if a.drives.is_empty() && a.scan.pool.is_none() {
        open_or_create_default(a.read_only, options, !a.no_degraded)?
    } else {
        let drives = scan::drives_to_open(&a.scan, &a.drives, !a.no_degraded)?;
        open_pool_with(&drives, a.read_only, options, !a.no_degraded).map_err(readable)?
    };
    // `lograid status` on these drives reads what this publishes.
    let jobs = std::sync::Arc::new(crate::live::Jobs::default());
    let publisher = match crate::live::Publisher::start(pool.clone(), jobs.clone()) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("lograid: warning: `lograid status` will not see this server: {e:#}");
            None
        }
    };
    // `lograid replace`, `add` and `reshape` reach this server here.
    let scheduler = a
        .scrub_every
        .map(|every| crate::live::schedule_scrubs(pool.clone(), jobs.clone(), every));
    let control = match crate::live::Control::start(pool.clone(), jobs.clone()) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("lograid: warning: replace/add will not reach this server: {e:#}");
            None
        }
    };
    let metrics = crate::metrics::serve(metrics, &pool, &jobs);
    let result = serve_pool(&pool, listen, nfs_listener, tls, &a, &notifier);
    drop(metrics);
    // Said at SIGTERM already; here for a server that ended by itself.
    notifier.stopping("closing the pool: flushing, writing a checkpoint");
    drop(control);
    drop(scheduler);
    jobs.stop();
    drop(publisher);
    let close = pool.close().context("closing the pool (final checkpoint)");
    match (result, close) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => {
            eprintln!(
                "lograid: pool '{}' closed cleanly (final checkpoint written)",
                pool.name()
            );
            Ok(())
        }
    }
}

/// The TLS settings the flags ask for (loaded and checked before the pool is opened).
fn tls_settings(a: &ServeArgs) -> Result<Option<TlsSettings>> {
    let mode = match (a.tls.as_deref(), &a.tls_certificates) {
        (None, None) | (Some("off"), None) => return Ok(None),
        (Some("off"), Some(_)) => {
            bail!("--tls off contradicts --tls-certificates; drop one of them")
        }
        (Some(mode), None) => bail!(
            "--tls {mode} needs --tls-certificates DIR (with server-cert.pem and server-key.pem)"
        ),
        (Some("on"), Some(_)) => TlsMode::Optional,
        (None | Some(_), Some(_)) => TlsMode::Required,
    };
    let dir = a.tls_certificates.as_ref().expect("checked above");
    if !dir.is_dir() {
        bail!("--tls-certificates {}: not a directory", dir.display());
    }
    let files = TlsFiles {
        certificate: dir.join("server-cert.pem"),
        key: dir.join("server-key.pem"),
        client_ca: a.tls_verify_peer.then(|| dir.join("ca-cert.pem")),
    };
    let settings = TlsSettings::load(&files, mode).map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(settings))
}

/// Serves `pool`'s volumes on `listen` (and as files with --fuse) until SIGINT or SIGTERM.
fn serve_pool(
    pool: &Pool,
    listen: Vec<ListenAddr>,
    nfs_listener: Option<std::net::TcpListener>,
    tls: Option<TlsSettings>,
    a: &ServeArgs,
    notifier: &Arc<notify::Notifier>,
) -> Result<()> {
    let exports = exports_of(pool, a)?;
    let config = ServerConfig {
        listen,
        allow_list: if a.allow.is_empty() {
            None
        } else {
            Some(a.allow.clone())
        },
        read_only: a.read_only,
        runtime_worker_threads: 2,
        shutdown_grace: Duration::from_secs(30),
        tls: tls.clone(),
        ..ServerConfig::default()
    };
    // The files before the listeners: a client that finds the port (or socket) answering finds
    // DIR/VOLUME there too, a dead server's mount on DIR already replaced.
    let fuse = match &a.fuse {
        Some(dir) => {
            let dir =
                std::path::absolute(dir).with_context(|| format!("--fuse {}", dir.display()))?;
            Some(crate::os::mount_files(&dir, exports.clone())?)
        }
        None => None,
    };
    // Caught before the listeners answer: a SIGINT or SIGTERM sent as soon as they do stops
    // the server cleanly (acted on once the signal thread runs).
    let signals = catch_stop_signals()?;
    let unmount = |fuse: Option<crate::os::FilesMount>| {
        if let Some(mount) = fuse {
            crate::os::unmount_files(mount);
        }
    };
    let server = match Server::bind(config, exports.clone()) {
        Ok(server) => server,
        Err(e) => {
            unmount(fuse);
            return Err(e).context("starting the NBD server");
        }
    };
    let handle = server.shutdown_handle();
    let nfs = match nfs_listener.map(|l| nfs::start(l, pool, &exports, a)) {
        Some(Err(e)) => {
            unmount(fuse);
            return Err(e);
        }
        started => started.transpose()?,
    };
    let ublk = match a.ublk.then(|| ublk::start(pool, &exports, a)) {
        Some(Err(e)) => {
            drop(nfs);
            unmount(fuse);
            return Err(e);
        }
        started => started.transpose()?,
    };
    let nfs_handle = nfs.as_ref().map(nfs::Running::shutdown_handle);
    let stop = move || {
        handle.shutdown();
        if let Some(nfs) = &nfs_handle {
            nfs.shutdown();
        }
    };
    let (signals_handle, signal_thread) = start_signal_thread(signals, stop, notifier.clone())?;

    print_how_to_connect(
        pool,
        server.local_addrs(),
        &exports,
        a.read_only,
        tls.map(|t| t.mode),
        fuse.as_ref().map(|m| m.dir()),
        vec![
            nfs.as_ref()
                .map(|running| nfs::connect_lines(running.addr, exports[0].name())),
            ublk.as_ref().map(ublk::Running::connect_lines),
        ],
    );
    // systemd: ready only now (pool recovered, listeners bound, FUSE mounted);
    // the watchdog stops with this function, before the pool closes.
    let watchdog = notify::announce_ready(notifier, pool, server.local_addrs());
    let served = server.serve();
    drop(watchdog);
    signals_handle.close();
    let _ = signal_thread.join();
    // Before the pool closes: calls over NFS end and the volumes are flushed.
    let nfs_stopped = nfs.map_or(Ok(()), nfs::Running::stop);
    // Before the pool closes too: the devices' page caches written back, the volumes flushed.
    let ublk_stopped = ublk.map_or(Ok(()), ublk::Running::stop);
    if let Some(mount) = fuse {
        // Before the pool closes: requests through the files must end first.
        crate::os::unmount_files(mount);
    }
    served.context("NBD server")?;
    nfs_stopped?;
    ublk_stopped
}

/// One export per volume of `pool`, read-only as the flags say.
fn exports_of(pool: &Pool, a: &ServeArgs) -> Result<Vec<Arc<dyn Export>>> {
    let volumes = pool.volumes();
    if volumes.is_empty() {
        bail!(
            "pool '{}' has no volumes to serve; create one with `lograid volume create --size SIZE NAME DRIVE...`",
            pool.name()
        );
    }
    let exports: Vec<Arc<dyn Export>> = volumes
        .into_iter()
        .map(|v| {
            let read_only = a.read_only || a.read_only_volume.iter().any(|n| n == v.name());
            Arc::new(VolumeExport::new(v, pool.name(), read_only)) as Arc<dyn Export>
        })
        .collect();
    if let Some(unknown) = a
        .read_only_volume
        .iter()
        .find(|n| !exports.iter().any(|e| e.name() == n.as_str()))
    {
        bail!(
            "--read-only-volume {unknown}: pool '{}' has no such volume",
            pool.name()
        );
    }
    Ok(exports)
}

/// SIGINT and SIGTERM caught from now on, for [`start_signal_thread`] (one that comes before it
/// runs waits for it).
fn catch_stop_signals() -> Result<signal_hook::iterator::Signals> {
    signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("installing the SIGINT/SIGTERM handlers")
}

/// A thread that turns the first of `signals` (SIGINT or SIGTERM, also one caught before it
/// started) into a server shutdown (and says so); stop it by closing the returned handle, then
/// join it.
fn start_signal_thread(
    mut signals: signal_hook::iterator::Signals,
    stop: impl Fn() + Send + 'static,
    notifier: Arc<notify::Notifier>,
) -> Result<(signal_hook::iterator::Handle, std::thread::JoinHandle<()>)> {
    let signals_handle = signals.handle();
    let signal_thread = std::thread::Builder::new()
        .name("lograid-signals".into())
        .spawn(move || {
            let mut seen = 0;
            for signal in signals.forever() {
                seen += 1;
                let name = if signal == signal_hook::consts::SIGINT { "SIGINT" } else { "SIGTERM" };
                // Shut down first, then say so, and never panic on a closed
                // stderr (eprintln! would, and the server would not stop).
                if seen == 1 {
                    stop();
                    notifier.stopping(&format!(
                        "{name}: finishing requests in flight, flushing, writing a checkpoint"
                    ));
                    let _ = writeln!(
                        std::io::stderr(),
                        "lograid: {name}: shutting down: finishing requests in flight, flushing, writing a checkpoint"
                    );
                } else {
                    let _ = writeln!(
                        std::io::stderr(),
                        "lograid: {name}: shutdown already in progress (waits at most 30 s for clients)"
                    );
                }
            }
        })
        .context("starting the signal thread")?;
    Ok((signals_handle, signal_thread))
}

/// Tells the user (on stdout) what is served where, and how to connect.
fn print_how_to_connect(
    pool: &Pool,
    addrs: &[ListenAddr],
    exports: &[Arc<dyn Export>],
    read_only: bool,
    tls: Option<TlsMode>,
    fuse: Option<&Path>,
    more: Vec<Option<String>>,
) {
    let status = pool.status();
    let mut out = String::new();
    let where_ = addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" and ");
    out.push_str(&format!(
        "lograid: serving pool '{}' ({} drives, parity {}, {}){}{} on {where_}\n",
        status.name,
        status.members_total,
        status.parity,
        status.state,
        if read_only { ", read-only" } else { "" },
        match tls {
            Some(TlsMode::Required) => ", TLS required",
            Some(TlsMode::Optional) => ", TLS offered",
            _ => "",
        },
    ));
    for e in exports {
        out.push_str(&format!(
            "  export '{}': {}\n",
            e.name(),
            human(e.size_bytes())
        ));
    }
    let first = exports[0].name();
    let addr = &addrs[0];
    if tls == Some(TlsMode::Required) {
        out.push_str(&tls_connect_lines(addr, first));
    } else {
        out.push_str(&plain_connect_lines(addr, first));
    }
    if let Some(dir) = fuse {
        out.push_str(&format!(
            "volumes as files in {} (FUSE, served by this process):\n  lograid attach --file {}      (as root: a /dev/loopN with no NBD client)\n",
            dir.display(),
            dir.join(first).display()
        ));
    }
    for lines in more.into_iter().flatten() {
        out.push_str(&lines);
    }
    out.push_str("stop with Ctrl-C or SIGTERM (flushes and checkpoints before exiting)\n");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
}

/// How to reach export `first` at `addr` with TLS (nbdinfo, qemu-img).
fn tls_connect_lines(addr: &ListenAddr, first: &str) -> String {
    let uri = tls_uri(&client_uri(addr, first));
    format!(
        "connect with TLS (DIR holds the CA certificate as ca-cert.pem, and client-cert.pem and client-key.pem\n\
         if peers are verified):\n  nbdinfo '{uri}?tls-certificates=DIR'\n  \
         qemu-img info --object tls-creds-x509,id=tls0,endpoint=client,dir=DIR --image-opts \\\n    \
         driver=nbd,{},export={first},tls-creds=tls0\n",
        match addr {
            ListenAddr::Tcp(sa) => format!("host={},port={}", local_client_addr(sa).ip(), sa.port()),
            ListenAddr::Unix(path) => format!("path={}", path.display()),
        }
    )
}

/// How to reach export `first` at `addr` in plaintext (nbdinfo, qemu-img, lograid attach,
/// nbd-client).
fn plain_connect_lines(addr: &ListenAddr, first: &str) -> String {
    let uri = client_uri(addr, first);
    let mut out = String::from("connect with:\n");
    out.push_str(&format!(
        "  nbdinfo --list {}\n",
        client_uri(addr, "").trim_end_matches('/')
    ));
    out.push_str(&format!("  qemu-img info {uri}\n"));
    match addr {
        ListenAddr::Tcp(sa) => {
            let server = client_uri(addr, "");
            let server = server.trim_end_matches('/');
            out.push_str(&format!(
                "  lograid attach --server {server} --export {first}      (as root: a /dev/loopN via nbdfuse)\n"
            ));
            let host = local_client_addr(sa).ip();
            out.push_str(&format!(
                "  nbd-client -N {first} {host} {} /dev/nbd0      (kernels with the nbd driver)\n",
                sa.port()
            ));
        }
        ListenAddr::Unix(path) => {
            out.push_str(&format!(
                "  lograid attach --socket {} --export {first}      (as root: a /dev/loopN via nbdfuse)\n",
                path.display()
            ));
            out.push_str(&format!(
                "  nbd-client -unix {} /dev/nbd0 -N {first}      (kernels with the nbd driver)\n",
                path.display()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        let tcp = ListenAddr::Tcp("0.0.0.0:10809".parse().unwrap());
        assert_eq!(client_uri(&tcp, "vol0"), "nbd://127.0.0.1:10809/vol0");
        let v6 = ListenAddr::Tcp("[::1]:1".parse().unwrap());
        assert_eq!(client_uri(&v6, "a"), "nbd://[::1]:1/a");
        let unix = ListenAddr::Unix("/run/x.sock".into());
        assert_eq!(
            client_uri(&unix, "vol0"),
            "nbd+unix:///vol0?socket=/run/x.sock"
        );
        assert_eq!(tls_uri("nbd://127.0.0.1:1/a"), "nbds://127.0.0.1:1/a");
        assert_eq!(
            tls_uri("nbd+unix:///a?socket=/s"),
            "nbds+unix:///a?socket=/s"
        );
        assert!(parse_listen("127.0.0.1:10809").is_ok());
        assert!(parse_listen("nonsense").is_err());
    }
}
