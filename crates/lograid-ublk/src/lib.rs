//! lograid-ublk: the volumes a server exports as Linux kernel block devices, /dev/ublkbN,
//! served by the server process itself through the kernel's ublk driver (ublk_drv) and
//! io_uring: no NBD client, FUSE file or loop device in between.
//!
//! Owns: the ublk devices of one server, from adding (or recovering) them to deleting them, and
//! the translation of their block requests into calls on any [`lograid_nbd::Export`] (the
//! volume abstraction the NBD and NFS servers use): READ and WRITE (FUA as a FUA write), FLUSH
//! as flush, DISCARD as trim, WRITE_ZEROES as write-zeroes. Must never: complete a request the
//! export did not complete, complete a write on a write-through device before a flush covers
//! it, pass the export a call outside its contract (512-byte multiples, inside the volume), or
//! touch a ublk device that is not marked as this pool's volume's.
//!
//! Serving model: per device, `queues` queue threads (each the only thread that talks to the
//! driver for its queue, through its own io_uring) and a small pool of worker threads that make
//! the export's blocking calls, so up to `queues × depth` requests are in flight and a bounded
//! number (workers) run at once. A request completes only after its export call returned, so a
//! FLUSH (whose export call covers every write that returned before it) covers every write
//! completed before it. Request data is copied with pread/pwrite on /dev/ublkcN
//! (`UBLK_F_USER_COPY`) into one buffer per worker, so memory per device is bounded by its
//! worker count, not by queues × depth × 1 MiB.
//!
//! Two cache modes ([`CacheMode`]): write-through (the default) advertises no volatile cache;
//! a write, discard or write-zeroes completes once a flush has covered it (many share one
//! flush: `completion::GroupCommit`). Nothing completed is lost when the server dies, so its
//! devices carry `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`: the kernel keeps
//! /dev/ublkbN and holds its I/O, and the next server on the pool recovers it (requests that
//! were in flight are reissued), so a mounted filesystem sees a pause. Write-back advertises a
//! volatile write cache with FUA, like a drive: writes complete from memory and FLUSH/FUA make
//! them durable, which costs fewer flushes; but a server that dies loses completed writes a
//! mounted filesystem counts on, so write-back devices are not recoverable: the kernel fails
//! their I/O (as a drive that lost power), and the next server deletes them and makes new ones.
//!
//! Why not libublk: libublk 0.4.8 (by ublk's author) was read and set aside. It can be made
//! right for flush, FUA, discard, write-zeroes (the server decodes every request itself), for
//! user recovery (`start_user_recover`, `UBLK_DEV_F_RECOVER_DEV`) and for a clean stop
//! (`kill_dev`, `del_dev`), but: it pulls about 80 crates (smol, async-lock, futures-timer,
//! serde_json, thiserror 1, bitmaps with RUSTSEC-2025-0167, and libublk-rs-sys); it runs each
//! queue as an async task set on a thread-local ring, where the engine's blocking calls would
//! still need threads of their own; its examples give each tag a buffer of the largest request
//! (queues × depth × 1 MiB per device, and this server locks its memory); and it keeps its own
//! JSON state in /run/ublksrvd. What this server needs is ten control commands and two I/O
//! commands over the `io-uring` crate the engine already uses, so it is written here
//! (`uapi`, `control`, `queue`). Its ramdisk example failed mkfs's flush with EINVAL because
//! it bounds-checked the flush's start sector, which the block layer leaves unset
//! (`request::decode` never reads a FLUSH's sectors).
//!
//! Needs Linux 6.5 or later (user copy, the ioctl command encoding; Debian 12's backports
//! kernel 6.12 is what the tests run on) with ublk_drv loaded, and root (CAP_SYS_ADMIN).
//!
//! Modules: `uapi` (the kernel interface's numbers and layouts), `control` (/dev/ublk-control),
//! `params` (sizes, limits, attributes), `request` (decoding and running one request), `queue`
//! (a queue thread), `workers` (the export calls and data copies), `completion` (hand-offs and
//! group commit), `device` (one device's life), `discovery` (fingerprints, records, finding a
//! dead server's devices), `server` ([`UblkServer`]), `error` ([`UblkError`]).

// ublk is a Linux driver: elsewhere the crate is empty, and the `lograid` command says so.
#![cfg(target_os = "linux")]

mod completion;
mod control;
mod device;
mod discovery;
mod error;
pub mod params;
mod queue;
pub mod request;
mod server;
pub mod uapi;
mod workers;

pub use discovery::{fingerprint, DEFAULT_STATE_DIR};
pub use error::UblkError;
pub use params::CacheMode;
pub use server::{DeviceSummary, UblkOptions, UblkServer, UblkVolume, MAX_QUEUES};
