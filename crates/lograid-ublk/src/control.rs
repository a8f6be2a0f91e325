//! The control device, /dev/ublk-control: adding, configuring, starting, stopping, deleting
//! and recovering devices, one io_uring command (128-byte SQE) at a time.
//!
//! Owns: the control file and its ring, the memory the commands' `addr` points to, and the
//! wording of "the driver is missing" and "not allowed". Must never: send a command while
//! another is outstanding (one at a time, the caller serialises), guess at a device it did not
//! read, or free memory a command the kernel may still hold points to.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use io_uring::{opcode, squeue, types, IoUring};

use crate::error::UblkError;
use crate::uapi::{self, CtrlCmd, DevInfo, Params};

/// `queue_id` of a command for the whole device.
const NO_QUEUE: u16 = u16::MAX;
/// `dev_id` asking the kernel to choose the id.
pub const ANY_ID: u32 = u32::MAX;

/// What a command's `addr` points to. It lives on the heap and belongs to the [`Control`], not
/// to the caller's stack frame: the driver runs control commands on an io_uring worker thread,
/// so one whose completion was never seen may still read or write it (see `Control::abandon`).
#[repr(C)]
#[derive(Clone, Copy)]
union Argument {
    info: DevInfo,
    params: Params,
    features: u64,
}

pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128>,
    argument: Box<Argument>,
    /// A command was sent and its completion never seen (waiting for it failed): the ring is
    /// not used again, and that command's argument memory is never freed.
    broken: bool,
}

/// One command: its encoded number, device, the length of its argument (0: none) and its
/// inline data.
struct Command {
    op: u32,
    dev_id: u32,
    len: u16,
    data: u64,
}

impl Control {
    /// Opens /dev/ublk-control, saying clearly when the driver is not loaded or we may not.
    pub fn open() -> Result<Control, UblkError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(uapi::CONTROL_PATH)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => UblkError::DriverMissing,
                io::ErrorKind::PermissionDenied => UblkError::PermissionDenied {
                    what: format!("opening {}", uapi::CONTROL_PATH),
                },
                _ => UblkError::io(format!("opening {}", uapi::CONTROL_PATH), e),
            })?;
        Control::on(file)
    }

    /// Control commands sent to `file` (/dev/ublk-control, or another file in tests).
    fn on(file: File) -> Result<Control, UblkError> {
        let ring = IoUring::builder().build(4).map_err(|e| {
            UblkError::io(
                "setting up io_uring for ublk control commands (is io_uring disabled?)",
                e,
            )
        })?;
        Ok(Control {
            file,
            ring,
            argument: Box::new(Argument { features: 0 }),
            broken: false,
        })
    }

    /// Sends `command` (its argument, if any, already in `self.argument`) and waits for its
    /// result: `Ok(value)` or `Err(errno)`.
    fn send(&mut self, command: &Command) -> Result<i32, i32> {
        if self.broken {
            return Err(libc::EIO);
        }
        let addr = if command.len == 0 {
            0
        } else {
            std::ptr::addr_of_mut!(*self.argument) as u64
        };
        let header = CtrlCmd {
            dev_id: command.dev_id,
            queue_id: NO_QUEUE,
            len: command.len,
            addr,
            data: [command.data],
            ..CtrlCmd::default()
        };
        let mut cmd = [0u8; 80];
        cmd[..32].copy_from_slice(&uapi::bytes_of::<CtrlCmd, 32>(&header));
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), command.op)
            .cmd(cmd)
            .build()
            .user_data(u64::from(command.op));
        // SAFETY: `addr` is 0 or points into `self.argument`, heap memory that is freed only
        // once this command has completed: the wait below returns only with its completion,
        // and when waiting fails the memory is leaked instead (`abandon`).
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| libc::EBUSY)?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    self.abandon(command, &e);
                    return Err(e.raw_os_error().unwrap_or(libc::EIO));
                }
            }
            if let Some(cqe) = self.ring.completion().next() {
                let result = cqe.result();
                return if result < 0 { Err(-result) } else { Ok(result) };
            }
        }
    }

    /// After a failed wait the command may still be queued or running in the kernel: its
    /// argument memory is leaked (so the kernel never writes freed memory) and no further
    /// command is sent on this ring.
    fn abandon(&mut self, command: &Command, error: &io::Error) {
        tracing::error!(
            command = uapi::command_name(command.op),
            dev_id = command.dev_id,
            "waiting for a ublk control command failed ({error}); no further control commands \
             are sent by this server"
        );
        let held = std::mem::replace(&mut self.argument, Box::new(Argument { features: 0 }));
        Box::leak(held);
        self.broken = true;
    }

    fn run(&mut self, command: Command) -> Result<i32, UblkError> {
        let (op, dev_id) = (command.op, command.dev_id);
        self.send(&command)
            .map_err(|errno| UblkError::command(uapi::command_name(op), dev_id, errno))
    }

    /// The features the driver offers (`UBLK_F_*`).
    pub fn features(&mut self) -> Result<u64, UblkError> {
        self.argument.features = 0;
        self.send(&Command {
            op: uapi::U_CMD_GET_FEATURES,
            dev_id: 0,
            len: 8,
            data: 0,
        })
        .map_err(|_| UblkError::KernelTooOld {
            missing: "GET_FEATURES",
            offered: 0,
        })?;
        // SAFETY: `features` was written above; the driver writes a u64 there.
        Ok(unsafe { self.argument.features })
    }

    /// Adds a device as `info` describes (`info.dev_id` = [`ANY_ID`] or the wanted id); on
    /// success `info` is what the kernel made (its id, negotiated flags).
    pub fn add(&mut self, info: &mut DevInfo) -> Result<(), UblkError> {
        let dev_id = info.dev_id;
        self.argument.info = *info;
        self.run(Command {
            op: uapi::U_CMD_ADD_DEV,
            dev_id,
            len: std::mem::size_of::<DevInfo>() as u16,
            data: 0,
        })?;
        // SAFETY: `info` was written above; the driver writes a `ublksrv_ctrl_dev_info` there
        // (integers only: any bytes are a valid `DevInfo`).
        *info = unsafe { self.argument.info };
        Ok(())
    }

    /// The device `dev_id` as the kernel has it, or `None` if there is none.
    pub fn info(&mut self, dev_id: u32) -> Result<Option<DevInfo>, UblkError> {
        self.argument.info = DevInfo::default();
        let result = self.send(&Command {
            op: uapi::U_CMD_GET_DEV_INFO,
            dev_id,
            len: std::mem::size_of::<DevInfo>() as u16,
            data: 0,
        });
        match result {
            // SAFETY: `info` was written above; the driver writes a `ublksrv_ctrl_dev_info`
            // there (integers only: any bytes are a valid `DevInfo`).
            Ok(_) => Ok(Some(unsafe { self.argument.info })),
            Err(libc::ENODEV) => Ok(None),
            Err(errno) => Err(UblkError::command("GET_DEV_INFO", dev_id, errno)),
        }
    }

    pub fn set_params(&mut self, dev_id: u32, params: &Params) -> Result<(), UblkError> {
        self.argument.params = Params {
            len: uapi::PARAMS_LEN,
            ..*params
        };
        self.run(Command {
            op: uapi::U_CMD_SET_PARAMS,
            dev_id,
            len: uapi::PARAMS_LEN as u16,
            data: 0,
        })
        .map(drop)
    }

    pub fn params(&mut self, dev_id: u32) -> Result<Params, UblkError> {
        self.argument.params = Params {
            len: uapi::PARAMS_LEN,
            ..Params::default()
        };
        self.run(Command {
            op: uapi::U_CMD_GET_PARAMS,
            dev_id,
            len: uapi::PARAMS_LEN as u16,
            data: 0,
        })?;
        // SAFETY: `params` was written above; the driver writes the first `PARAMS_LEN` bytes
        // of a `ublk_params` over it (integers only: any bytes are valid there).
        Ok(unsafe { self.argument.params })
    }

    /// Starts the device: returns once every queue has fetched its requests and the block
    /// device exists (its partition table read through the queues).
    pub fn start(&mut self, dev_id: u32, server_pid: i32) -> Result<(), UblkError> {
        self.pid_command(uapi::U_CMD_START_DEV, dev_id, server_pid)
    }

    /// Stops the device: the block device goes, requests in flight are answered first.
    pub fn stop(&mut self, dev_id: u32) -> Result<(), UblkError> {
        self.pid_command(uapi::U_CMD_STOP_DEV, dev_id, 0)
    }

    /// Deletes the device. Without waiting when the kernel can (a device whose block device
    /// is still held, by a mount for one, is freed when it is let go).
    pub fn delete(&mut self, dev_id: u32) -> Result<(), UblkError> {
        let command = |op| Command {
            op,
            dev_id,
            len: 0,
            data: 0,
        };
        match self.send(&command(uapi::U_CMD_DEL_DEV_ASYNC)) {
            Ok(_) | Err(libc::ENODEV) => Ok(()),
            Err(libc::EOPNOTSUPP) | Err(libc::EINVAL) => {
                self.run(command(uapi::U_CMD_DEL_DEV)).map(drop)
            }
            Err(errno) => Err(UblkError::command("DEL_DEV_ASYNC", dev_id, errno)),
        }
    }

    /// Readies a quiesced device whose server died for a new server's queues.
    pub fn start_recovery(&mut self, dev_id: u32) -> Result<(), UblkError> {
        self.pid_command(uapi::U_CMD_START_USER_RECOVERY, dev_id, 0)
    }

    /// Ends a recovery: returns once every queue has fetched, and lets the held requests go.
    pub fn end_recovery(&mut self, dev_id: u32, server_pid: i32) -> Result<(), UblkError> {
        self.pid_command(uapi::U_CMD_END_USER_RECOVERY, dev_id, server_pid)
    }

    fn pid_command(&mut self, op: u32, dev_id: u32, server_pid: i32) -> Result<(), UblkError> {
        self.run(Command {
            op,
            dev_id,
            len: 0,
            data: server_pid.max(0) as u64,
        })
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A regular file (this test's binary) has no io_uring commands: every command completes
    /// at once with EOPNOTSUPP. (Not /dev/null: it accepts them as a no-op.)
    fn control_on_a_plain_file() -> Control {
        let file = File::open(std::env::current_exe().unwrap()).unwrap();
        Control::on(file).unwrap()
    }

    #[test]
    fn a_refused_command_is_an_error_naming_it() {
        let mut control = control_on_a_plain_file();
        let e = control.info(7).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{e}");
        assert!(e.to_string().contains("GET_DEV_INFO"), "{e}");
        assert!(control.add(&mut DevInfo::default()).is_err());
        assert!(control.params(7).is_err());
        assert!(!control.broken);
    }

    #[test]
    fn an_abandoned_command_keeps_its_memory_and_stops_the_ring() {
        let mut control = control_on_a_plain_file();
        let held = std::ptr::addr_of!(*control.argument) as usize;
        let command = Command {
            op: uapi::U_CMD_GET_DEV_INFO,
            dev_id: 7,
            len: 64,
            data: 0,
        };
        control.abandon(&command, &io::Error::from_raw_os_error(libc::EFAULT));
        // The abandoned memory is not reused for later commands, and none is sent.
        assert_ne!(std::ptr::addr_of!(*control.argument) as usize, held);
        assert_eq!(control.send(&command), Err(libc::EIO));
        assert!(control.ring.submission().is_empty());
    }
}
