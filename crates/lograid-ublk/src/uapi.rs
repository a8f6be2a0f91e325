//! The subset of the kernel's ublk interface (include/uapi/linux/ublk_cmd.h) this crate uses:
//! command numbers in their ioctl encoding, feature and attribute bits, and the structures
//! shared with the driver, laid out as the kernel lays them out (`#[repr(C)]`, checked by
//! the tests below against the header's sizes and offsets).
//!
//! Owns: numbers and layouts only. Must never: hold logic, or add a field the kernel does not
//! define at that offset.

/// The control device: every device is added, started, stopped and deleted through it.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

// Control command numbers (`_IOC_NR`).
const CMD_GET_DEV_INFO: u32 = 0x02;
const CMD_ADD_DEV: u32 = 0x04;
const CMD_DEL_DEV: u32 = 0x05;
const CMD_START_DEV: u32 = 0x06;
const CMD_STOP_DEV: u32 = 0x07;
const CMD_SET_PARAMS: u32 = 0x08;
const CMD_GET_PARAMS: u32 = 0x09;
const CMD_START_USER_RECOVERY: u32 = 0x10;
const CMD_END_USER_RECOVERY: u32 = 0x11;
const CMD_GET_FEATURES: u32 = 0x13;
const CMD_DEL_DEV_ASYNC: u32 = 0x14;

// I/O command numbers.
const IO_FETCH_REQ: u32 = 0x20;
const IO_COMMIT_AND_FETCH_REQ: u32 = 0x21;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
const IOC_TYPE_UBLK: u32 = b'u' as u32;

/// `_IOC(dir, 'u', nr, size)`: the encoding the kernel requires of every command (the legacy
/// bare numbers may be compiled out, CONFIG_BLKDEV_UBLK_LEGACY_OPCODES).
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (IOC_TYPE_UBLK << 8) | nr
}

const fn ctrl_iowr(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, std::mem::size_of::<CtrlCmd>())
}

const fn ctrl_ior(nr: u32) -> u32 {
    ioc(IOC_READ, nr, std::mem::size_of::<CtrlCmd>())
}

const fn io_iowr(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, std::mem::size_of::<IoCmd>())
}

pub const U_CMD_GET_DEV_INFO: u32 = ctrl_ior(CMD_GET_DEV_INFO);
pub const U_CMD_ADD_DEV: u32 = ctrl_iowr(CMD_ADD_DEV);
pub const U_CMD_DEL_DEV: u32 = ctrl_iowr(CMD_DEL_DEV);
pub const U_CMD_START_DEV: u32 = ctrl_iowr(CMD_START_DEV);
pub const U_CMD_STOP_DEV: u32 = ctrl_iowr(CMD_STOP_DEV);
pub const U_CMD_SET_PARAMS: u32 = ctrl_iowr(CMD_SET_PARAMS);
pub const U_CMD_GET_PARAMS: u32 = ctrl_ior(CMD_GET_PARAMS);
pub const U_CMD_START_USER_RECOVERY: u32 = ctrl_iowr(CMD_START_USER_RECOVERY);
pub const U_CMD_END_USER_RECOVERY: u32 = ctrl_iowr(CMD_END_USER_RECOVERY);
pub const U_CMD_GET_FEATURES: u32 = ctrl_ior(CMD_GET_FEATURES);
pub const U_CMD_DEL_DEV_ASYNC: u32 = ctrl_ior(CMD_DEL_DEV_ASYNC);
pub const U_IO_FETCH_REQ: u32 = io_iowr(IO_FETCH_REQ);
pub const U_IO_COMMIT_AND_FETCH_REQ: u32 = io_iowr(IO_COMMIT_AND_FETCH_REQ);

/// An I/O command's result: a request is there to serve.
pub const IO_RES_OK: i32 = 0;
/// An I/O command's result: the queue is going away; the command is not to be sent again.
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// Where the per-queue request descriptors are mapped from on /dev/ublkcN.
pub const CMD_BUF_OFFSET: u64 = 0;
/// Where request data is read and written on /dev/ublkcN with `UBLK_F_USER_COPY`.
pub const IO_BUF_OFFSET: u64 = 0x8000_0000;
pub const IO_BUF_BITS: u32 = 25;
pub const TAG_OFFSET_BITS: u32 = IO_BUF_BITS;
pub const TAG_BITS: u32 = 16;
pub const QUEUE_OFFSET_BITS: u32 = TAG_OFFSET_BITS + TAG_BITS;
pub const MAX_QUEUE_DEPTH: u16 = 4096;
pub const MAX_QUEUES: u16 = 4096;

// Device features (`ublksrv_ctrl_dev_info.flags`).
pub const F_USER_RECOVERY: u64 = 1 << 3;
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub const F_USER_COPY: u64 = 1 << 7;

// Device states.
pub const S_DEV_DEAD: u16 = 0;
pub const S_DEV_LIVE: u16 = 1;
pub const S_DEV_QUIESCED: u16 = 2;
pub const S_DEV_FAIL_IO: u16 = 3;

// Request operations and flags (`ublksrv_io_desc.op_flags`).
pub const IO_OP_READ: u8 = 0;
pub const IO_OP_WRITE: u8 = 1;
pub const IO_OP_FLUSH: u8 = 2;
pub const IO_OP_DISCARD: u8 = 3;
pub const IO_OP_WRITE_ZEROES: u8 = 5;
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;

// Parameters.
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;

/// `struct ublksrv_ctrl_cmd`: the 32 bytes in a control command's SQE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CtrlCmd {
    pub dev_id: u32,
    pub queue_id: u16,
    pub len: u16,
    pub addr: u64,
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// `struct ublksrv_ctrl_dev_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    pub flags: u64,
    /// Kept by the driver for the server, never read by it: here, the owner's fingerprint.
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// `struct ublksrv_io_desc`: one request, written by the driver into the mapped array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoDesc {
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

/// `struct ublksrv_io_cmd`: the 16 bytes in an I/O command's SQE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    pub result: i32,
    pub addr: u64,
}

/// `struct ublk_param_basic`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

/// `struct ublk_param_discard`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

/// The head of `struct ublk_params` with the two parameter sets used here: `len` says how
/// much of it the kernel reads (every kernel with ublk knows these two).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    pub len: u32,
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
}

/// The bytes of `Params` the kernel reads: the header, basic and discard, without the
/// trailing padding Rust adds for alignment.
pub const PARAMS_LEN: u32 = 8 + 32 + 20;

/// `_IOC_NR` of an encoded command, for messages.
pub fn command_name(cmd_op: u32) -> &'static str {
    match cmd_op & 0xff {
        CMD_GET_DEV_INFO => "GET_DEV_INFO",
        CMD_ADD_DEV => "ADD_DEV",
        CMD_DEL_DEV => "DEL_DEV",
        CMD_START_DEV => "START_DEV",
        CMD_STOP_DEV => "STOP_DEV",
        CMD_SET_PARAMS => "SET_PARAMS",
        CMD_GET_PARAMS => "GET_PARAMS",
        CMD_START_USER_RECOVERY => "START_USER_RECOVERY",
        CMD_END_USER_RECOVERY => "END_USER_RECOVERY",
        CMD_GET_FEATURES => "GET_FEATURES",
        CMD_DEL_DEV_ASYNC => "DEL_DEV_ASYNC",
        IO_FETCH_REQ => "FETCH_REQ",
        IO_COMMIT_AND_FETCH_REQ => "COMMIT_AND_FETCH_REQ",
        _ => "unknown command",
    }
}

/// A command's inline structure: `#[repr(C)]`, integers only, and no padding, so each of its
/// bytes is initialised.
///
/// # Safety
/// Only for structs whose fields fill every byte (no padding), checked by the layout tests.
pub(crate) unsafe trait Inline: Copy {}
// SAFETY: 4 + 2 + 2 + 8 + 8 + 2 + 2 + 4 = 32 bytes of fields in 32 (layout test).
unsafe impl Inline for CtrlCmd {}
// SAFETY: 2 + 2 + 4 + 8 = 16 bytes of fields in 16 (layout test).
unsafe impl Inline for IoCmd {}

/// The bytes of a command's inline structure.
pub(crate) fn bytes_of<T: Inline, const N: usize>(value: &T) -> [u8; N] {
    assert_eq!(std::mem::size_of::<T>(), N, "command layout");
    let mut out = [0u8; N];
    // SAFETY: `T` is `Inline` (every one of its `N` bytes, asserted, is an initialised field),
    // and `out` is `N` bytes that do not overlap it.
    unsafe { std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), out.as_mut_ptr(), N) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_kernel_header() {
        assert_eq!(size_of::<CtrlCmd>(), 32);
        assert_eq!(offset_of!(CtrlCmd, addr), 8);
        assert_eq!(offset_of!(CtrlCmd, data), 16);
        assert_eq!(offset_of!(CtrlCmd, dev_path_len), 24);
        assert_eq!(size_of::<DevInfo>(), 64);
        assert_eq!(offset_of!(DevInfo, max_io_buf_bytes), 8);
        assert_eq!(offset_of!(DevInfo, ublksrv_pid), 16);
        assert_eq!(offset_of!(DevInfo, flags), 24);
        assert_eq!(offset_of!(DevInfo, ublksrv_flags), 32);
        assert_eq!(size_of::<IoDesc>(), 24);
        assert_eq!(size_of::<IoCmd>(), 16);
        assert_eq!(size_of::<ParamBasic>(), 32);
        assert_eq!(offset_of!(ParamBasic, dev_sectors), 16);
        assert_eq!(size_of::<ParamDiscard>(), 20);
        assert_eq!(offset_of!(Params, basic), 8);
        assert_eq!(offset_of!(Params, discard), 40);
        assert!(size_of::<Params>() >= PARAMS_LEN as usize);
    }

    #[test]
    fn commands_use_the_ioctl_encoding() {
        // Values of the UBLK_U_* macros as a C compiler computes them.
        assert_eq!(U_CMD_ADD_DEV, 0xc020_7504);
        assert_eq!(U_CMD_GET_DEV_INFO, 0x8020_7502);
        assert_eq!(U_CMD_DEL_DEV_ASYNC, 0x8020_7514);
        assert_eq!(U_IO_FETCH_REQ, 0xc010_7520);
        assert_eq!(U_IO_COMMIT_AND_FETCH_REQ, 0xc010_7521);
        assert_eq!(
            command_name(U_CMD_START_USER_RECOVERY),
            "START_USER_RECOVERY"
        );
    }
}
