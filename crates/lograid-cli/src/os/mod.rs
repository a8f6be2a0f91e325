//! What the `lograid` command does differently on Linux and macOS, with the same names on both
//! sides (`linux.rs`, `macos.rs`):
//!
//! - A volume as a kernel block device. Linux: `serve --fuse DIR` shows each volume as a file in
//!   a FUSE mount served by the server itself (`mount_files`, `unmount_files`, `FilesMount`), and
//!   `attach`/`detach` make and remove loop devices on those files or on NBD exports through
//!   nbdfuse (`attach_supported`, `is_fuse_mount_point`). macOS: FUSE and loop devices are
//!   Linux's; each of these fails with an error that says so.
//! - Abstract Unix socket names (`@name`), which systemd's `NOTIFY_SOCKET` may use: Linux only
//!   (`abstract_socket`).
//!
//! - Keeping the process on the first N CPUs (`run_on_first_cpus`, for `bench --cpus`):
//!   Linux's CPU affinity; macOS has none to set, and says so.
//!
//! Must never: decide anything the commands decide on both systems.

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod sys;
#[cfg(target_os = "macos")]
#[path = "macos.rs"]
mod sys;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!("the lograid command is implemented for Linux and macOS only");

pub use sys::{
    abstract_socket, attach_supported, is_fuse_mount_point, mount_files, run_on_first_cpus,
    unmount_files, FilesMount,
};
