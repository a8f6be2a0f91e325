//! lograid-nbd: an NBD server (fixed newstyle handshake, structured replies, `base:allocation`
//! block status, FLUSH/FUA/TRIM/WRITE_ZEROES, multi-conn, export list; TCP and Unix sockets;
//! TLS through STARTTLS)
//! over any [`Export`], plus the helpers that turn an export into a kernel block device on hosts
//! without the nbd driver.
//!
//! Module map:
//! - [`export`]: the [`Export`] trait the engine implements, and error mapping.
//! - [`proto`]: wire constants (spec names) and pure parsers/encoders.
//! - [`negotiate`]: option haggling as a pure state machine.
//! - `dispatch`: runs a validated request on an export and encodes the reply.
//! - [`sectors`]: requests at any byte offset (clients that did not negotiate block sizes) on
//!   exports that take whole sectors: widening, read-modify-write, per-export stripe locks.
//! - `connection`: per-connection I/O, bounds and the reply writer.
//! - [`server`]: listeners, limits, shutdown; [`Server`], [`serve_until`].
//! - [`stats`]: per-export request counters and latency histograms, for metrics.
//! - [`tls`]: certificates and rustls settings for `NBD_OPT_STARTTLS`.
//! - [`mod@attach`]: nbdfuse + loop device attach/detach (Linux's tools; the `lograid` command
//!   uses it on Linux only).
//! - [`harden`]: `PR_SET_IO_FLUSHER` + `mlockall` for a process backing a local block device.
//! - `os`: what differs between Linux and macOS (process hardening, a TCP option).
//!
//! Typical use from a plain binary:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn volume() -> Arc<dyn lograid_nbd::Export> { unimplemented!() }
//! use lograid_nbd::{ListenAddr, Server, ServerConfig};
//! let config = ServerConfig {
//!     listen: vec![ListenAddr::Tcp("127.0.0.1:10809".parse().unwrap())],
//!     ..ServerConfig::default()
//! };
//! let server = Server::bind(config, vec![volume()]).expect("bind");
//! let handle = server.shutdown_handle(); // call handle.shutdown() from any thread to stop
//! # drop(handle);
//! server.serve().expect("serve");
//! ```

pub mod attach;
mod buffers;
mod connection;
mod dispatch;
pub mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod harden;
#[cfg(any(test, feature = "test-util"))]
pub mod mem_export;
pub mod negotiate;
mod os;
pub mod proto;
pub mod sectors;
pub mod server;
pub mod stats;
pub mod tls;

pub use attach::{
    attach, attach_file, detach, list_attachments, AttachError, Attached, AttachmentRecord,
};
pub use dispatch::{block_status_descriptors, plan_read, ReadPiece};
pub use export::{nbd_error_from_io, Allocation, Export};
pub use harden::harden_process_for_block_backing;
pub use server::{
    serve_until, ListenAddr, Server, ServerConfig, ServerError, ServerStats, ShutdownHandle,
    StatsHandle,
};
pub use stats::{ExportStatsRegistry, ExportStatsValues};
pub use tls::{TlsFiles, TlsMode, TlsSettings};
