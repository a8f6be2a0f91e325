//! The listening NFS server: configuration, accepting with a connection limit and an
//! allow-list, and an orderly shutdown.
//!
//! Owns: the life cycle of the listener and its connections, and the end-of-life sequence (stop
//! accepting, serve the connections still open for the drain time while their clients
//! unmount, let every connection answer the calls it has in flight, flush every volume).
//! Must never: block the async runtime on a volume call, or let the failure of one connection
//! stop the others.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use crate::connection::{self, ConnectionLimits, Counters, Shared, MAX_RECORD_BYTES};
use crate::files::Namespace;
use crate::service::{Service, MAX_IO_BYTES, MOUNT_PROCEDURES, NFS_PROCEDURES};

/// Server settings; [`NfsConfig::default`] suits a local disk image.
#[derive(Clone, Debug)]
pub struct NfsConfig {
    /// Connections served at once; further clients are accepted and closed at once.
    pub max_connections: usize,
    /// Calls one connection may have in flight; at the limit the server stops reading from it.
    pub max_in_flight_per_conn: usize,
    /// Bytes of call and reply buffers one connection may hold.
    pub max_in_flight_bytes_per_conn: u32,
    /// Bytes of call and reply buffers all connections together may hold.
    pub max_total_in_flight_bytes: u64,
    /// If set, only peers with these addresses are served.
    pub allow_list: Option<Vec<IpAddr>>,
    /// Serve every file read-only.
    pub read_only: bool,
    /// Once a record's first mark has arrived, the whole record must arrive within this time.
    pub record_timeout: Duration,
    /// A client that does not take a reply within this time is disconnected.
    pub reply_write_timeout: Duration,
    /// Worker threads of the runtime built by [`NfsServer::serve_until`].
    pub runtime_worker_threads: usize,
    /// Most threads of that runtime's blocking pool (where volume calls run).
    pub blocking_threads: usize,
    /// On shutdown, how long to wait for connections to finish before flushing anyway.
    pub shutdown_grace: Duration,
    /// On shutdown, how long connections already open go on being served (new ones are
    /// refused) until their clients close them, before the server closes them: time for a
    /// client to detach a disk image and unmount. Zero: they are closed at once.
    pub drain: Duration,
}

impl Default for NfsConfig {
    fn default() -> Self {
        NfsConfig {
            max_connections: 64,
            max_in_flight_per_conn: 64,
            max_in_flight_bytes_per_conn: 64 << 20,
            max_total_in_flight_bytes: 1 << 30,
            allow_list: None,
            read_only: false,
            record_timeout: Duration::from_secs(30),
            reply_write_timeout: Duration::from_secs(30),
            runtime_worker_threads: 2,
            blocking_threads: 64,
            shutdown_grace: Duration::from_secs(30),
            drain: Duration::ZERO,
        }
    }
}

/// Errors of making and running a server.
#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    #[error("invalid NFS server configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Namespace(#[from] crate::files::NamespaceError),
    #[error("NFS listener: {0}")]
    Listener(io::Error),
    #[error("cannot start the NFS server's runtime: {0}")]
    Runtime(io::Error),
    #[error("flushing volume {volume:?} at shutdown failed: {source}")]
    Flush { volume: String, source: io::Error },
}

/// Buffer bytes one call may need at most: its record and a READ's reply.
const MAX_CALL_BYTES: u64 = MAX_RECORD_BYTES as u64 + MAX_IO_BYTES as u64 + 256;

impl NfsConfig {
    fn validate(&self) -> Result<(), NfsError> {
        let fail = |message: String| Err(NfsError::Config(message));
        if u64::from(self.max_in_flight_bytes_per_conn) < MAX_CALL_BYTES {
            return fail(format!(
                "max_in_flight_bytes_per_conn must be at least {MAX_CALL_BYTES}"
            ));
        }
        if self.max_total_in_flight_bytes < u64::from(self.max_in_flight_bytes_per_conn) {
            return fail(
                "max_total_in_flight_bytes is smaller than max_in_flight_bytes_per_conn".into(),
            );
        }
        if !(1..=1 << 16).contains(&self.max_connections)
            || !(1..=1 << 16).contains(&self.max_in_flight_per_conn)
        {
            return fail(
                "max_connections and max_in_flight_per_conn must be within 1..=65536".into(),
            );
        }
        if self.runtime_worker_threads == 0 || self.blocking_threads == 0 {
            return fail("runtime_worker_threads and blocking_threads must be at least 1".into());
        }
        Ok(())
    }
}

/// Fires the shutdown of a server from any thread. Cloneable.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    sender: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// Starts the shutdown; returns at once. Idempotent.
    pub fn shutdown(&self) {
        self.sender.send_replace(true);
    }
}

/// A snapshot of a server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsStats {
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_active: u64,
    pub calls: u64,
    pub call_errors: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub commits: u64,
    pub in_flight_calls: u64,
    pub in_flight_bytes: u64,
    pub peak_in_flight_bytes: u64,
    pub protocol_errors: u64,
    pub stalled_writers: u64,
    /// Calls by NFSv3 procedure (names: `crate::NFS_PROCEDURE_NAMES`).
    pub nfs_calls: [u64; NFS_PROCEDURES],
    /// Calls by MOUNT procedure (names: `crate::MOUNT_PROCEDURE_NAMES`).
    pub mount_calls: [u64; MOUNT_PROCEDURES],
    /// Calls to programs, versions or procedures not served.
    pub unserved_calls: u64,
}

/// Reads a server's counters from any thread. Cloneable.
#[derive(Clone)]
pub struct StatsHandle {
    counters: Arc<Counters>,
    service: Arc<Service>,
}

impl StatsHandle {
    pub fn snapshot(&self) -> NfsStats {
        let load = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
        let c = &self.counters;
        let s = &self.service.counters;
        NfsStats {
            connections_accepted: load(&c.connections_accepted),
            connections_refused: load(&c.connections_refused),
            connections_active: load(&c.connections_active),
            calls: load(&s.calls),
            call_errors: load(&s.errors),
            reads: load(&s.reads),
            read_bytes: load(&s.read_bytes),
            writes: load(&s.writes),
            written_bytes: load(&s.written_bytes),
            commits: load(&s.commits),
            in_flight_calls: load(&c.in_flight_calls),
            in_flight_bytes: load(&c.in_flight_bytes),
            peak_in_flight_bytes: load(&c.peak_in_flight_bytes),
            protocol_errors: load(&c.protocol_errors),
            stalled_writers: load(&c.stalled_writers),
            nfs_calls: s.nfs_calls.each_ref().map(load),
            mount_calls: s.mount_calls.each_ref().map(load),
            unserved_calls: load(&s.unserved_calls),
        }
    }
}

/// A bound, not yet running NFS server.
pub struct NfsServer {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    config: NfsConfig,
    service: Arc<Service>,
    shutdown: Arc<watch::Sender<bool>>,
    counters: Arc<Counters>,
}

impl NfsServer {
    /// A server on `listener` (bound by the caller, so that a bad address fails before
    /// anything else is opened) for the files of `namespace`.
    pub fn new(
        listener: std::net::TcpListener,
        config: NfsConfig,
        namespace: Namespace,
    ) -> Result<NfsServer, NfsError> {
        config.validate()?;
        listener.set_nonblocking(true).map_err(NfsError::Listener)?;
        let local_addr = listener.local_addr().map_err(NfsError::Listener)?;
        let (sender, _) = watch::channel(false);
        Ok(NfsServer {
            listener,
            local_addr,
            config,
            service: Arc::new(Service::new(namespace)),
            shutdown: Arc::new(sender),
            counters: Arc::new(Counters::default()),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            sender: self.shutdown.clone(),
        }
    }

    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            counters: self.counters.clone(),
            service: self.service.clone(),
        }
    }

    /// Serves until `shutdown` completes or the shutdown handle fires, then stops accepting,
    /// serves the connections still open until they close or `drain` is over, lets every
    /// connection answer what it has in flight, flushes every volume and returns.
    pub async fn run_until<F: Future<Output = ()>>(self, shutdown: F) -> Result<(), NfsError> {
        let NfsServer {
            listener,
            config,
            service,
            shutdown: shutdown_tx,
            counters,
            ..
        } = self;
        // Connections stop when this says so: after the drain.
        let (connections_stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            service: service.clone(),
            limits: ConnectionLimits {
                max_in_flight: config.max_in_flight_per_conn,
                max_in_flight_bytes: config.max_in_flight_bytes_per_conn,
                record_timeout: config.record_timeout,
                reply_write_timeout: config.reply_write_timeout,
            },
            counters,
            global_bytes: Arc::new(Semaphore::new(
                usize::try_from(config.max_total_in_flight_bytes)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
            shutdown: connections_stop.subscribe(),
        });
        let listener = tokio::net::TcpListener::from_std(listener).map_err(NfsError::Runtime)?;
        let slots = Arc::new(Semaphore::new(config.max_connections));
        let allow_list = config
            .allow_list
            .as_ref()
            .map(|list| list.iter().map(|ip| ip.to_canonical()).collect::<Vec<_>>());
        let accepting = tokio::spawn(accept(
            listener,
            shared.clone(),
            slots.clone(),
            allow_list,
            shutdown_tx.subscribe(),
        ));
        let mut shutdown_rx = shutdown_tx.subscribe();
        tokio::select! {
            _ = shutdown => {}
            _ = shutdown_rx.wait_for(|value| *value) => {}
        }
        shutdown_tx.send_replace(true);
        tracing::info!("NFS: shutting down: no new connections");
        let _ = accepting.await;
        let all_slots = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
        drain(&shared, &slots, all_slots, config.drain).await;
        tracing::info!("NFS: closing the connections; finishing calls in flight");
        connections_stop.send_replace(true);
        if tokio::time::timeout(config.shutdown_grace, slots.acquire_many(all_slots))
            .await
            .is_err()
        {
            tracing::warn!(
                "NFS connections still busy after the shutdown grace period; flushing anyway"
            );
        }
        flush_all(&service).await
    }

    /// Blocking form of [`NfsServer::run_until`]: builds its own multi-thread runtime.
    pub fn serve_until<F>(self, shutdown: F) -> Result<(), NfsError>
    where
        F: Future<Output = ()> + Send,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.config.runtime_worker_threads)
            .max_blocking_threads(self.config.blocking_threads)
            .thread_name("lograid-nfs")
            .enable_io()
            .enable_time()
            .build()
            .map_err(NfsError::Runtime)?;
        runtime.block_on(self.run_until(shutdown))
    }

    /// Blocking: serves until the [`ShutdownHandle`] fires.
    pub fn serve(self) -> Result<(), NfsError> {
        self.serve_until(std::future::pending::<()>())
    }
}

/// Flushes every writable volume on the blocking pool; the first failure is the result.
async fn flush_all(service: &Arc<Service>) -> Result<(), NfsError> {
    let mut first_error = None;
    for file in &service.namespace.files {
        if file.read_only {
            continue;
        }
        let export = file.export.clone();
        let volume = file.name().to_owned();
        let result = tokio::task::spawn_blocking(move || export.flush())
            .await
            .unwrap_or_else(|_| Err(io::Error::other("volume panicked while flushing")));
        if let Err(source) = result {
            tracing::error!(%volume, %source, "NFS: flush at shutdown failed");
            first_error.get_or_insert(NfsError::Flush { volume, source });
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Serves the connections still open (each holds a slot) until all have closed or `limit`
/// is over.
async fn drain(shared: &Shared, slots: &Semaphore, all_slots: u32, limit: Duration) {
    let open = shared.counters.connections_active.load(Ordering::Relaxed);
    if limit.is_zero() || open == 0 {
        return;
    }
    tracing::info!(
        "NFS: {open} clients still connected; serving them for up to {} s while they unmount",
        limit.as_secs()
    );
    match tokio::time::timeout(limit, slots.acquire_many(all_slots)).await {
        Ok(_) => tracing::info!("NFS: every client has disconnected"),
        Err(_) => tracing::warn!(
            "NFS: clients still connected after {} s; closing their connections",
            limit.as_secs()
        ),
    }
}

/// Sleep after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections until `stop` says so (the listener is then closed).
async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    allow_list: Option<Vec<IpAddr>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|value| *value) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "NFS: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let refused = |why: &str| {
            shared
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "NFS: {why}; closing");
        };
        if allow_list
            .as_ref()
            .is_some_and(|list| !list.contains(&peer.ip().to_canonical()))
        {
            refused("peer not in the allow-list");
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused("connection limit reached");
            continue;
        };
        let _ = stream.set_nodelay(true);
        set_keepalive(&stream);
        let shared = shared.clone();
        tokio::spawn(async move {
            let counters = shared.counters.clone();
            counters
                .connections_accepted
                .fetch_add(1, Ordering::Relaxed);
            counters.connections_active.fetch_add(1, Ordering::Relaxed);
            connection::serve(stream, peer.to_string(), shared).await;
            counters.connections_active.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
}

/// TCP keepalive (the system's timing), so that a peer that vanished without a FIN releases its
/// connection slot in the end. Only the portable option: the timing knobs differ by system.
fn set_keepalive(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}
