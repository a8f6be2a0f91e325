//! The control device, /dev/ublk-control: adding, configuring, starting, stopping, deleting
//! and recovering devices, one io_uring command (128-byte SQE) at a time.
//!
//! Owns: the control file and its ring, and the wording of "the driver is missing" and "not
//! allowed". Must never: send a command while another is outstanding (one at a time, the
//! caller serialises), or guess at a device it did not read.

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

pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128>,
}

/// One command: its encoded number, device, and the buffer it reads or fills.
struct Command {
    op: u32,
    dev_id: u32,
    addr: u64,
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
        let ring = IoUring::builder().build(4).map_err(|e| {
            UblkError::io(
                "setting up io_uring for ublk control commands (is io_uring disabled?)",
                e,
            )
        })?;
        Ok(Control { file, ring })
    }

    /// Sends `command` and waits for its result: `Ok(value)` or `Err(errno)`.
    fn send(&mut self, command: &Command) -> Result<i32, i32> {
        let header = CtrlCmd {
            dev_id: command.dev_id,
            queue_id: NO_QUEUE,
            len: command.len,
            addr: command.addr,
            data: [command.data],
            ..CtrlCmd::default()
        };
        let mut cmd = [0u8; 80];
        cmd[..32].copy_from_slice(&uapi::bytes_of::<CtrlCmd, 32>(&header));
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), command.op)
            .cmd(cmd)
            .build()
            .user_data(u64::from(command.op));
        // SAFETY: the buffer `command.addr` points to outlives the wait below, which returns
        // only once the kernel has completed the command.
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| libc::EBUSY)?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
            }
            if let Some(cqe) = self.ring.completion().next() {
                let result = cqe.result();
                return if result < 0 { Err(-result) } else { Ok(result) };
            }
        }
    }

    fn run(&mut self, command: Command) -> Result<i32, UblkError> {
        let (op, dev_id) = (command.op, command.dev_id);
        self.send(&command)
            .map_err(|errno| UblkError::command(uapi::command_name(op), dev_id, errno))
    }

    /// The features the driver offers (`UBLK_F_*`).
    pub fn features(&mut self) -> Result<u64, UblkError> {
        let mut features = 0u64;
        self.send(&Command {
            op: uapi::U_CMD_GET_FEATURES,
            dev_id: 0,
            addr: &mut features as *mut u64 as u64,
            len: 8,
            data: 0,
        })
        .map_err(|_| UblkError::KernelTooOld {
            missing: "GET_FEATURES",
            offered: 0,
        })?;
        Ok(features)
    }

    /// Adds a device as `info` describes (`info.dev_id` = [`ANY_ID`] or the wanted id); on
    /// success `info` is what the kernel made (its id, negotiated flags).
    pub fn add(&mut self, info: &mut DevInfo) -> Result<(), UblkError> {
        let dev_id = info.dev_id;
        self.run(Command {
            op: uapi::U_CMD_ADD_DEV,
            dev_id,
            addr: info as *mut DevInfo as u64,
            len: std::mem::size_of::<DevInfo>() as u16,
            data: 0,
        })
        .map(drop)
    }

    /// The device `dev_id` as the kernel has it, or `None` if there is none.
    pub fn info(&mut self, dev_id: u32) -> Result<Option<DevInfo>, UblkError> {
        let mut info = DevInfo::default();
        let result = self.send(&Command {
            op: uapi::U_CMD_GET_DEV_INFO,
            dev_id,
            addr: &mut info as *mut DevInfo as u64,
            len: std::mem::size_of::<DevInfo>() as u16,
            data: 0,
        });
        match result {
            Ok(_) => Ok(Some(info)),
            Err(libc::ENODEV) => Ok(None),
            Err(errno) => Err(UblkError::command("GET_DEV_INFO", dev_id, errno)),
        }
    }

    pub fn set_params(&mut self, dev_id: u32, params: &Params) -> Result<(), UblkError> {
        let mut params = *params;
        params.len = uapi::PARAMS_LEN;
        self.run(Command {
            op: uapi::U_CMD_SET_PARAMS,
            dev_id,
            addr: &mut params as *mut Params as u64,
            len: uapi::PARAMS_LEN as u16,
            data: 0,
        })
        .map(drop)
    }

    pub fn params(&mut self, dev_id: u32) -> Result<Params, UblkError> {
        let mut params = Params {
            len: uapi::PARAMS_LEN,
            ..Params::default()
        };
        self.run(Command {
            op: uapi::U_CMD_GET_PARAMS,
            dev_id,
            addr: &mut params as *mut Params as u64,
            len: uapi::PARAMS_LEN as u16,
            data: 0,
        })?;
        Ok(params)
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
            addr: 0,
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
            addr: 0,
            len: 0,
            data: server_pid.max(0) as u64,
        })
        .map(drop)
    }
}
