//! lograid-fuse: the volumes a server exports, as files in a FUSE mount served by the server
//! itself, so that `losetup --direct-io=on DIR/VOLUME` makes a kernel block device of a volume on
//! hosts without the nbd driver, with no NBD client process in between (the other route is
//! `nbdfuse` over NBD, see `lograid_nbd::attach`).
//!
//! Owns: the FUSE mount (one directory, one regular file per
//! [`Export`](lograid_nbd::Export), named after it), the translation of the kernel's file
//! requests into export calls (read, write, fsync as flush, `fallocate` punch-hole as zeroes
//! that may be unmapped and zero-range as zeroes that stay allocated, `O_SYNC`/`O_DSYNC` writes
//! as FUA), and unmounting, also when a loop device still holds a file. Must never: pass the
//! export a call outside the export's contract (offsets and lengths are multiples of 512 and
//! within the size; unaligned requests are widened here), call an export after the mount ended,
//! grow or shrink a file, take over, unmount or abort a mount or connection it did not make (see
//! `connection` for how it tells), or answer a request after the export refused it.
//!
//! Modules: `mount` (a mount's lifecycle), `device` (making the mount), `connection` (proving a
//! mount and its connection ours before ending them), `mount_point` (what is mounted on a
//! directory), `detach` (the kernel calls that unmount, abort and detach), `gate` (keeping
//! requests away from the exports once unmounting starts), `files` (the file operations),
//! `sectors` (widening requests to whole sectors), `stats` (requests served), `error`
//! ([`FuseError`]).

// FUSE (through `fuser` and the kernel's /dev/fuse) is Linux-only here: elsewhere the crate is
// empty, and the `lograid` command says what to use instead.
#![cfg(target_os = "linux")]

mod connection;
mod detach;
mod device;
mod error;
mod files;
mod gate;
mod mount;
mod mount_point;
mod sectors;
mod stats;

pub use error::FuseError;
pub use mount::{mount, FuseMount, FuseOptions, Unmounted};
pub use mount_point::{connection_of, is_mount_point};
