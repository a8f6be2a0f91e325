//! lograid-nfs: an NFSv3 server (RFC 1813) that shows each volume as one fixed-size file, for
//! hosts that attach a disk image from an NFS mount (macOS `hdiutil attach`, a Linux loop
//! device) instead of speaking NBD.
//!
//! The export is `/`; each volume is the file `/<volume name>` with the volume's size. The NFS
//! and MOUNT (version 3) programs are both served on the one TCP port, so clients are told the
//! port for both (`mount_nfs -o port=P,mountport=P`, libnfs `?nfsport=P&mountport=P`).
//!
//! Durability: an UNSTABLE write is the volume's write (acknowledged from memory, like a
//! drive's write cache) and COMMIT is the volume's flush; DATA_SYNC and FILE_SYNC writes are
//! written with FUA before the reply. The write verifier changes with every server start, so
//! a client resends what it wrote UNSTABLE and had not committed. File handles name the pool's
//! UUID and the volume's id, so they stay valid across restarts.
//!
//! Module map:
//! - [`xdr`]: total XDR decoding and encoding helpers.
//! - [`rpc`]: ONC RPC record marks, call headers, reply headers.
//! - [`nfs3`]: NFSv3 numbers, arguments and attribute encoding.
//! - `mount`: the MOUNT v3 procedures.
//! - [`handle`]: file handles.
//! - [`files`]: the root directory and the volumes' files ([`Namespace`]).
//! - [`service`]: one record in, one reply out ([`Service`]).
//! - `connection`: one TCP connection, its bounds and its reply writer.
//! - [`server`]: the listener, limits and shutdown ([`NfsServer`]).
//! - [`fuzzing`]: the entry point of the fuzz target and the property tests.

mod connection;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod handle;
mod mount;
pub mod nfs3;
pub mod rpc;
pub mod server;
pub mod service;
pub mod xdr;

pub use connection::MAX_RECORD_BYTES;
pub use files::{Namespace, NamespaceError, NfsVolume, Space, SpaceReporter};
pub use mount::PROCEDURE_NAMES as MOUNT_PROCEDURE_NAMES;
pub use nfs3::PROCEDURE_NAMES as NFS_PROCEDURE_NAMES;
pub use server::{NfsConfig, NfsError, NfsServer, NfsStats, ShutdownHandle, StatsHandle};
pub use service::{Outcome, Service, MAX_IO_BYTES};
