//! [`UblkError`]: what can go wrong making, serving, recovering and removing ublk devices,
//! each variant worded for the person running the server (what happened and what to do).
//!
//! Owns: the error type and the translation of a control command's errno into it. Must never:
//! hide the kernel's errno (it is in the message).

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum UblkError {
    /// /dev/ublk-control is not there.
    #[error(
        "/dev/ublk-control is missing: the ublk driver is not loaded (as root: `modprobe ublk_drv`; it needs \
         Linux 6.5 or later built with CONFIG_BLK_DEV_UBLK)"
    )]
    DriverMissing,
    /// The control device or a device node refused us.
    #[error("{what}: permission denied (ublk devices are made by root, or a process with CAP_SYS_ADMIN)")]
    PermissionDenied { what: String },
    /// The kernel's driver lacks a feature this server needs.
    #[error(
        "the kernel's ublk driver lacks {missing} (it offers features {offered:#x}); Linux 6.5 or later is needed"
    )]
    KernelTooOld { missing: &'static str, offered: u64 },
    /// The wanted device id belongs to a device that is not ours.
    #[error(
        "/dev/ublkb{dev_id} is taken by another ublk server{}; stop it, or choose other ids with --ublk-id-base",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    IdTaken { dev_id: u32, pid: Option<i32> },
    /// Our own device is served by another live process.
    #[error("/dev/ublkb{dev_id} for volume '{volume}' is still served by pid {pid}; stop that server first")]
    ServedElsewhere {
        dev_id: u32,
        volume: String,
        pid: i32,
    },
    /// Our own device is still live long after its server was last seen here.
    #[error(
        "/dev/ublkb{dev_id} for volume '{volume}' is still live {waited_secs} s after its server (pid {pid}) \
         was last seen here; it may be served from another PID namespace or container: stop that server first \
         (a live device is never taken over)"
    )]
    StillLive {
        dev_id: u32,
        volume: String,
        pid: i32,
        waited_secs: u64,
    },
    /// The volume does not fit a block device.
    #[error("volume '{volume}' of {size_bytes} bytes cannot be a block device: {reason}")]
    VolumeUnfit {
        volume: String,
        size_bytes: u64,
        reason: &'static str,
    },
    /// Options out of range.
    #[error("{0}")]
    BadOption(String),
    /// A control command failed.
    #[error("ublk {command} for /dev/ublkb{dev_id} failed: {source}")]
    Command {
        command: &'static str,
        dev_id: u32,
        #[source]
        source: io::Error,
    },
    /// A system call on the way (opening, mapping, io_uring) failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl UblkError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> UblkError {
        UblkError::Io {
            what: what.into(),
            source,
        }
    }

    /// A failed control command: a refusal for lack of privilege reads as such.
    pub(crate) fn command(command: &'static str, dev_id: u32, errno: i32) -> UblkError {
        if errno == libc::EPERM || errno == libc::EACCES {
            return UblkError::PermissionDenied {
                what: format!("ublk {command} for /dev/ublkb{dev_id}"),
            };
        }
        UblkError::Command {
            command,
            dev_id,
            source: io::Error::from_raw_os_error(errno),
        }
    }

    /// The errno of a failed control command, if that is what this is.
    pub fn errno(&self) -> Option<i32> {
        match self {
            UblkError::Command { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
