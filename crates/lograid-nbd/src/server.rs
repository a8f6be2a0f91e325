//! The listening server: configuration, binding (TCP and Unix sockets), accepting with a
//! connection limit and an allow-list, and an orderly shutdown.
//!
//! Owns: the life cycle of listeners and connections, and the end-of-life sequence (stop
//! accepting, let every connection finish and answer what it has in flight, flush every export,
//! remove Unix socket files). Must never: block the async runtime on an export call, or let a
//! failure of one listener or connection stop the others.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use crate::connection::{self, ConnectionLimits, Counters, Duplex, Shared};
use crate::export::Export;
use crate::negotiate::{ExportRegistry, NegotiationPolicy, RegistryError};
use crate::proto::{DEFAULT_MAX_PAYLOAD, MIN_BLOCK_SIZE, UNNEGOTIATED_MAX_PAYLOAD};
use crate::tls::{TlsMode, TlsSettings};

/// Largest configurable payload (a READ reply chunk must stay far below 4 GiB).
pub const MAX_CONFIGURABLE_PAYLOAD: u32 = 1 << 30;

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "nbd://{addr}"),
            ListenAddr::Unix(path) => write!(f, "nbd+unix:///?socket={}", path.display()),
        }
    }
}

/// Server settings. `ServerConfig::default()` listens nowhere; set `listen`.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: Vec<ListenAddr>,
    /// Connections served at once; further clients are accepted and closed at once.
    pub max_connections: usize,
    /// Requests one connection may have in flight; at the limit the server stops reading from it.
    pub max_in_flight_per_conn: usize,
    /// Bytes of request and reply buffers one connection may hold (at least `max_payload_bytes`).
    pub max_in_flight_bytes_per_conn: u32,
    /// Bytes of request and reply buffers all connections together may hold (at least
    /// `max_in_flight_bytes_per_conn`).
    pub max_total_in_flight_bytes: u64,
    /// Largest READ or WRITE (advertised as the maximum block size) of a client that asks for
    /// block sizes; at least 32 MiB. A client that does not ask gets
    /// [`unnegotiated_max_payload`] (64 MiB by default).
    pub max_payload_bytes: u32,
    /// If set, only TCP peers with these addresses are served (Unix-socket peers always are).
    pub allow_list: Option<Vec<IpAddr>>,
    /// Serve every export read-only.
    pub read_only: bool,
    /// A client that has not finished the handshake in this time is dropped.
    pub handshake_timeout: Duration,
    /// A WRITE payload must arrive within this time of its header.
    pub payload_timeout: Duration,
    /// A client that does not take a reply within this time is disconnected.
    pub reply_write_timeout: Duration,
    /// Answer reads of ranges the export reports as zero with `OFFSET_HOLE` chunks.
    pub sparse_reads: bool,
    /// Worker threads of the runtime built by the blocking entry points.
    pub runtime_worker_threads: usize,
    /// Most threads of that runtime's blocking pool (where export calls run).
    pub blocking_threads: usize,
    /// On shutdown, how long to wait for connections to finish before flushing anyway.
    pub shutdown_grace: Duration,
    /// TLS through `NBD_OPT_STARTTLS` (offered or required, per its mode); `None` for plaintext.
    pub tls: Option<TlsSettings>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Vec::new(),
            max_connections: 64,
            max_in_flight_per_conn: 64,
            max_in_flight_bytes_per_conn: 2 * DEFAULT_MAX_PAYLOAD,
            max_total_in_flight_bytes: 1 << 30,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD,
            allow_list: None,
            read_only: false,
            handshake_timeout: Duration::from_secs(10),
            payload_timeout: Duration::from_secs(30),
            reply_write_timeout: Duration::from_secs(30),
            sparse_reads: true,
            runtime_worker_threads: 2,
            blocking_threads: 64,
            shutdown_grace: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// Errors of binding and running a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Exports(#[from] RegistryError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: ListenAddr, source: io::Error },
    #[error("cannot start the runtime: {0}")]
    Runtime(io::Error),
    #[error("flushing export {export:?} at shutdown failed: {source}")]
    Flush { export: String, source: io::Error },
}

impl ServerConfig {
    fn validate(&self) -> Result<(), ServerError> {
        let fail = |message: String| Err(ServerError::Config(message));
        if self.listen.is_empty() {
            return fail("no listen address".into());
        }
        if self.max_payload_bytes < DEFAULT_MAX_PAYLOAD
            || self.max_payload_bytes > MAX_CONFIGURABLE_PAYLOAD
        {
            return fail(format!(
                "max_payload_bytes {} not within {DEFAULT_MAX_PAYLOAD}..={MAX_CONFIGURABLE_PAYLOAD}",
                self.max_payload_bytes
            ));
        }
        if self.max_payload_bytes % MIN_BLOCK_SIZE != 0 {
            return fail(format!(
                "max_payload_bytes {} is not a multiple of 512",
                self.max_payload_bytes
            ));
        }
        if self.max_in_flight_bytes_per_conn < self.max_payload_bytes {
            return fail("max_in_flight_bytes_per_conn is smaller than max_payload_bytes".into());
        }
        if self.max_total_in_flight_bytes < u64::from(self.max_in_flight_bytes_per_conn) {
            return fail(
                "max_total_in_flight_bytes is smaller than max_in_flight_bytes_per_conn".into(),
            );
        }
        if self.max_connections == 0 || self.max_connections > 1 << 16 {
            return fail(format!(
                "max_connections {} not within 1..=65536",
                self.max_connections
            ));
        }
        if self.max_in_flight_per_conn == 0 || self.max_in_flight_per_conn > 1 << 16 {
            return fail(format!(
                "max_in_flight_per_conn {} not within 1..=65536",
                self.max_in_flight_per_conn
            ));
        }
        if self.runtime_worker_threads == 0 || self.blocking_threads == 0 {
            return fail("runtime_worker_threads and blocking_threads must be at least 1".into());
        }
        Ok(())
    }
}

/// Fires the shutdown of a server from any thread (or a signal handler thread). Cloneable.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    sender: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// Starts the shutdown; returns at once. Idempotent.
    pub fn shutdown(&self) {
        self.sender.send_replace(true);
    }

    pub fn is_shutdown(&self) -> bool {
        *self.sender.borrow()
    }
}

/// A snapshot of a server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub connections_accepted: u64,
    /// Refused by the allow-list or the connection limit.
    pub connections_refused: u64,
    pub connections_active: u64,
    /// Handshakes that timed out, broke the protocol, or ended without transmission.
    pub handshake_failures: u64,
    pub requests: u64,
    pub request_errors: u64,
    pub in_flight_requests: u64,
    pub in_flight_bytes: u64,
    pub peak_in_flight_bytes: u64,
    /// Connections closed because the client did not read its replies in time.
    pub stalled_writers: u64,
    pub protocol_errors: u64,
}

/// Reads a server's counters from any thread. Cloneable.
#[derive(Clone, Debug)]
pub struct StatsHandle {
    counters: Arc<Counters>,
}

impl StatsHandle {
    pub fn snapshot(&self) -> ServerStats {
        let c = &self.counters;
        let load = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: load(&c.connections_accepted),
            connections_refused: load(&c.connections_refused),
            connections_active: load(&c.connections_active),
            handshake_failures: load(&c.handshake_failures),
            requests: load(&c.requests),
            request_errors: load(&c.request_errors),
            in_flight_requests: load(&c.in_flight_requests),
            in_flight_bytes: load(&c.in_flight_bytes),
            peak_in_flight_bytes: load(&c.peak_in_flight_bytes),
            stalled_writers: load(&c.stalled_writers),
            protocol_errors: load(&c.protocol_errors),
        }
    }
}

enum BoundListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener, PathBuf),
}

/// A bound, not yet running NBD server.
pub struct Server {
    config: ServerConfig,
    registry: ExportRegistry,
    listeners: Vec<BoundListener>,
    local_addrs: Vec<ListenAddr>,
    shutdown: Arc<watch::Sender<bool>>,
    counters: Arc<Counters>,
}

/// Binds a Unix socket, replacing a stale socket file nobody listens on.
fn bind_unix(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "a server is already listening there",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "path exists and is not a socket",
            ));
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::os::unix::net::UnixListener::bind(path)
}

impl Server {
    /// Validates the configuration and the exports and binds every listen address (no runtime
    /// needed). Port 0 picks a free port; see [`Server::local_addrs`].
    pub fn bind(
        config: ServerConfig,
        exports: Vec<Arc<dyn Export>>,
    ) -> Result<Server, ServerError> {
        config.validate()?;
        let registry = ExportRegistry::new(exports)?;
        let mut listeners = Vec::new();
        let mut local_addrs = Vec::new();
        for addr in &config.listen {
            let bind_error = |source| ServerError::Bind {
                addr: addr.clone(),
                source,
            };
            match addr {
                ListenAddr::Tcp(socket_addr) => {
                    let listener = std::net::TcpListener::bind(socket_addr).map_err(bind_error)?;
                    listener.set_nonblocking(true).map_err(bind_error)?;
                    local_addrs.push(ListenAddr::Tcp(listener.local_addr().map_err(bind_error)?));
                    listeners.push(BoundListener::Tcp(listener));
                }
                ListenAddr::Unix(path) => {
                    let listener = bind_unix(path).map_err(bind_error)?;
                    listener.set_nonblocking(true).map_err(bind_error)?;
                    local_addrs.push(ListenAddr::Unix(path.clone()));
                    listeners.push(BoundListener::Unix(listener, path.clone()));
                }
            }
        }
        let (sender, _) = watch::channel(false);
        Ok(Server {
            config,
            registry,
            listeners,
            local_addrs,
            shutdown: Arc::new(sender),
            counters: Arc::new(Counters::default()),
        })
    }

    /// The addresses actually bound (TCP port 0 resolved).
    pub fn local_addrs(&self) -> &[ListenAddr] {
        &self.local_addrs
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            sender: self.shutdown.clone(),
        }
    }

    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            counters: self.counters.clone(),
        }
    }

    /// Serves until [`ShutdownHandle::shutdown`] is called. Must run inside a tokio runtime with
    /// the blocking pool enabled (any multi-thread runtime).
    pub async fn run(self) -> Result<(), ServerError> {
        self.run_until(std::future::pending::<()>()).await
    }

    /// Serves until `shutdown` completes or the shutdown handle fires, then stops accepting,
    /// lets every connection answer what it has in flight, flushes every export and returns.
    pub async fn run_until<F: Future<Output = ()>>(self, shutdown: F) -> Result<(), ServerError> {
        let Server {
            config,
            registry,
            listeners,
            local_addrs: _,
            shutdown: shutdown_tx,
            counters,
        } = self;
        let shared = Arc::new(Shared {
            registry: registry.clone(),
            limits: connection_limits(&config),
            counters: counters.clone(),
            global_bytes: Arc::new(Semaphore::new(
                usize::try_from(config.max_total_in_flight_bytes)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
            // Idle buffers kept for reuse: a quarter of the in-flight budget over all
            // connections (256 MiB by default), whatever their number.
            kept_buffers: crate::buffers::KeptBudget::new(
                usize::try_from(config.max_total_in_flight_bytes / 4).unwrap_or(usize::MAX),
            ),
            shutdown: shutdown_tx.subscribe(),
            tls: config.tls.clone(),
        });
        let connection_slots = Arc::new(Semaphore::new(config.max_connections));
        let allow_list: Option<Arc<Vec<IpAddr>>> = config
            .allow_list
            .as_ref()
            .map(|list| Arc::new(list.iter().map(|ip| ip.to_canonical()).collect()));
        let (accept_tasks, socket_files) =
            start_accepting(listeners, &shared, &connection_slots, &allow_list)?;

        let mut shutdown_rx = shutdown_tx.subscribe();
        tokio::select! {
            _ = shutdown => {}
            _ = shutdown_rx.wait_for(|value| *value) => {}
        }
        shutdown_tx.send_replace(true);
        tracing::info!("shutting down: no new connections; finishing requests in flight");
        for task in accept_tasks {
            let _ = task.await;
        }
        for path in &socket_files {
            let _ = std::fs::remove_file(path);
        }
        // Every connection holds one slot until it has written its last reply.
        let all_slots = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(
            config.shutdown_grace,
            connection_slots.acquire_many(all_slots),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                "connections still busy after the shutdown grace period; flushing anyway"
            );
        }
        let flushed = flush_exports(&registry).await;
        tracing::info!("shutdown complete");
        flushed
    }

    /// Blocking form of [`Server::run_until`] for plain binaries: builds a multi-thread tokio
    /// runtime (`runtime_worker_threads` workers, `blocking_threads` for export calls), serves
    /// until `shutdown` completes or the shutdown handle fires, and returns after the orderly
    /// shutdown. `shutdown` runs inside the runtime, so e.g. `tokio::signal::ctrl_c()` works.
    pub fn serve_until<F>(self, shutdown: F) -> Result<(), ServerError>
    where
        F: Future<Output = ()> + Send,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.config.runtime_worker_threads)
            .max_blocking_threads(self.config.blocking_threads)
            .thread_name("lograid-nbd")
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServerError::Runtime)?;
        runtime.block_on(self.run_until(shutdown))
    }

    /// Blocking: serves until the [`ShutdownHandle`] fires.
    pub fn serve(self) -> Result<(), ServerError> {
        self.serve_until(std::future::pending::<()>())
    }
}

/// Largest READ/WRITE taken from a client that did not ask for block sizes:
/// [`UNNEGOTIATED_MAX_PAYLOAD`] (64 MiB), or `max_payload_bytes` if larger, but never more than
/// one connection's buffer budget (`max_in_flight_bytes_per_conn`), so that such a request
/// still fits it whole.
pub fn unnegotiated_max_payload(config: &ServerConfig) -> u32 {
    let budget = config.max_in_flight_bytes_per_conn / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE;
    UNNEGOTIATED_MAX_PAYLOAD
        .min(budget)
        .max(config.max_payload_bytes)
}

/// What each connection of a server with `config` is held to.
fn connection_limits(config: &ServerConfig) -> ConnectionLimits {
    ConnectionLimits {
        max_in_flight: config.max_in_flight_per_conn,
        max_in_flight_bytes: config.max_in_flight_bytes_per_conn,
        handshake_timeout: config.handshake_timeout,
        payload_timeout: config.payload_timeout,
        reply_write_timeout: config.reply_write_timeout,
        sparse_reads: config.sparse_reads,
        policy: NegotiationPolicy {
            read_only: config.read_only,
            max_payload: config.max_payload_bytes,
            default_max_payload: unnegotiated_max_payload(config),
            tls: config.tls.as_ref().map_or(TlsMode::Off, |tls| tls.mode),
        },
    }
}

/// Starts one accept task per listener. Returns the tasks and the Unix socket files to remove
/// at shutdown.
fn start_accepting(
    listeners: Vec<BoundListener>,
    shared: &Arc<Shared>,
    connection_slots: &Arc<Semaphore>,
    allow_list: &Option<Arc<Vec<IpAddr>>>,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, Vec<PathBuf>), ServerError> {
    let mut accept_tasks = Vec::new();
    let mut socket_files = Vec::new();
    for listener in listeners {
        let shared = shared.clone();
        let slots = connection_slots.clone();
        let allow_list = allow_list.clone();
        match listener {
            BoundListener::Tcp(listener) => {
                let listener =
                    tokio::net::TcpListener::from_std(listener).map_err(ServerError::Runtime)?;
                accept_tasks.push(tokio::spawn(accept_tcp(
                    listener, shared, slots, allow_list,
                )));
            }
            BoundListener::Unix(listener, path) => {
                let listener =
                    tokio::net::UnixListener::from_std(listener).map_err(ServerError::Runtime)?;
                socket_files.push(path);
                accept_tasks.push(tokio::spawn(accept_unix(listener, shared, slots)));
            }
        }
    }
    Ok((accept_tasks, socket_files))
}

/// Flushes every export on the blocking pool; the first failure is the result (each is logged).
async fn flush_exports(registry: &ExportRegistry) -> Result<(), ServerError> {
    let mut first_error = None;
    for export in registry.exports() {
        let export = export.clone();
        let name = export.name().to_owned();
        let result = tokio::task::spawn_blocking(move || export.flush())
            .await
            .unwrap_or_else(|_| Err(io::Error::other("export panicked while flushing")));
        if let Err(source) = result {
            tracing::error!(export = %name, %source, "flush at shutdown failed");
            first_error.get_or_insert(ServerError::Flush {
                export: name,
                source,
            });
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Binds and serves in one blocking call; see [`Server::serve_until`].
pub fn serve_until<F>(
    config: ServerConfig,
    exports: Vec<Arc<dyn Export>>,
    shutdown: F,
) -> Result<(), ServerError>
where
    F: Future<Output = ()> + Send,
{
    Server::bind(config, exports)?.serve_until(shutdown)
}

async fn wait_shutdown(shared: &Shared) {
    let mut receiver = shared.shutdown.clone();
    let _ = receiver.wait_for(|value| *value).await;
}

/// Sleep after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

async fn accept_tcp(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    allow_list: Option<Arc<Vec<IpAddr>>>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = wait_shutdown(&shared) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if let Some(list) = &allow_list {
            if !list.contains(&peer.ip().to_canonical()) {
                shared
                    .counters
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "peer not in the allow-list; closing");
                continue;
            }
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shared
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "connection limit reached; closing");
            continue;
        };
        let _ = stream.set_nodelay(true);
        set_keepalive(&stream);
        spawn_connection(shared.clone(), stream, peer.to_string(), slot);
    }
}

/// Serves one accepted connection on its own task, counting it while it
/// lives; `slot` (its place under the connection limit) is released at the end.
fn spawn_connection<D, S>(shared: Arc<Shared>, stream: D, peer: String, slot: S)
where
    D: Duplex,
    S: Send + 'static,
{
    tokio::spawn(async move {
        shared
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .connections_active
            .fetch_add(1, Ordering::Relaxed);
        connection::serve(stream, peer, shared.clone()).await;
        shared
            .counters
            .connections_active
            .fetch_sub(1, Ordering::Relaxed);
        drop(slot);
    });
}

/// TCP keepalive (idle 60 s, then 6 probes 10 s apart): a peer that vanished without a FIN
/// releases its connection slot after about two minutes instead of never.
fn set_keepalive(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, crate::os::TCP_KEEPALIVE_IDLE, 60);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 6);
}

async fn accept_unix(
    listener: tokio::net::UnixListener,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = wait_shutdown(&shared) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shared
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!("connection limit reached; closing");
            continue;
        };
        spawn_connection(shared.clone(), stream, "unix".to_string(), slot);
    }
}
