//! What the `lograid` command does differently on Linux and macOS, with the same names on both
//! sides (`linux.rs`, `macos.rs`):
//!
//! - A volume as a kernel block device. Linux: `serve --fuse DIR` shows each volume as a file in
//!   a FUSE mount served by the server itself (`mount_files`, `unmount_files`, `FilesMount`), and
//!   `attach`/`detach` make and remove loop devices on those files or on NBD exports through
//!   nbdfuse (`attach_supported`, `is_fuse_mount_point`). macOS: FUSE and loop devices are
//!   Linux's; each of these fails with an error that says so.
//! - A volume's file from `serve --nfs` as a disk, on both: mounting the export and unmounting
//!   it (`mount_nfs`, `unmount`), and attaching the file as a disk, finding the file behind a
//!   disk and detaching it (`attach_image`, `image_backing`, `detach_image`; Linux: a loop
//!   device, macOS: `hdiutil`), and what to do next (`format_hint`). The tools' command lines
//!   and the readers of their output are pure functions in `linux_tools.rs` and
//!   `macos_tools.rs` (with `plist.rs`), compiled and tested on both systems; `tool.rs` runs
//!   them.
//! - The directory where a server publishes its status and `attach` keeps its records
//!   (`RUN_DIR`: /run/lograid on Linux, /var/run/lograid on macOS, whose root is read-only).
//! - Abstract Unix socket names (`@name`), which systemd's `NOTIFY_SOCKET` may use: Linux only
//!   (`abstract_socket`).
//!
//! - The allocator's settings (`pin_allocator_thresholds`): glibc's mapping threshold fixed,
//!   so that freed large buffers go back to the system; nothing to set on macOS.
//! - Keeping the process on the first N CPUs (`run_on_first_cpus`, for `bench --cpus`):
//!   Linux's CPU affinity; macOS has none to set, and says so.
//! - The hypervisor's steal time on the CPUs the process may run on (`stolen_seconds`, for
//!   `bench`): Linux's `/proc/stat`; macOS does not report it.
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

// Each system calls its own tools; both sets are built and tested everywhere.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
mod linux_tools;
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod macos_tools;
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod plist;
mod tool;

pub use sys::{
    abstract_socket, attach_image, attach_supported, detach_image, format_hint, image_backing,
    is_fuse_mount_point, mount_files, mount_nfs, pin_allocator_thresholds, run_on_first_cpus,
    stolen_seconds, unmount, unmount_files, FilesMount, RUN_DIR,
};
