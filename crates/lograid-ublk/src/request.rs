//! One block request: decoding the driver's descriptor into a [`Request`], and running it on an
//! [`Export`]. Pure: the data has already been copied in (a write) or is copied out after (a
//! read) by the caller.
//!
//! Owns: the op mapping (READ → read, WRITE → write with FUA when flagged, FLUSH → flush,
//! DISCARD → trim, WRITE_ZEROES → write-zeroes keeping the range allocated when NOUNMAP is
//! set), the bounds checks, and the result the driver is told (bytes done, 0, or a negative
//! errno). Must never: look at the sector fields of a FLUSH (the block layer leaves them
//! unset: a flush's start sector is typically all ones), pass the export a range outside the
//! volume, or write to a read-only export.

use std::io;

use lograid_nbd::Export;

use crate::params::{LOGICAL_BLOCK_BYTES, MAX_IO_BYTES};
use crate::uapi::{self, IoDesc};

/// A decoded request. Offsets and lengths are in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Discard {
        offset: u64,
        length: u64,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u64,
        keep_allocated: bool,
        fua: bool,
    },
    /// Refused with this (positive) errno before reaching the export.
    Refuse(i32),
}

impl Request {
    /// Whether it changes the volume (and so, on a write-through device, waits for a flush
    /// before it completes).
    pub fn modifies(&self) -> bool {
        matches!(
            self,
            Request::Write { .. } | Request::Discard { .. } | Request::WriteZeroes { .. }
        )
    }

    /// Bytes of data that travel with it (to the export for a write, back for a read).
    pub fn data_bytes(&self) -> usize {
        match self {
            Request::Read { length, .. } | Request::Write { length, .. } => *length as usize,
            _ => 0,
        }
    }
}

/// Decodes `desc` for a device of `size_bytes`; out-of-range or unknown requests become
/// [`Request::Refuse`].
pub fn decode(desc: &IoDesc, size_bytes: u64, read_only: bool) -> Request {
    let op = (desc.op_flags & 0xff) as u8;
    let flags = desc.op_flags;
    if op == uapi::IO_OP_FLUSH {
        return Request::Flush;
    }
    if !matches!(
        op,
        uapi::IO_OP_READ | uapi::IO_OP_WRITE | uapi::IO_OP_DISCARD | uapi::IO_OP_WRITE_ZEROES
    ) {
        return Request::Refuse(libc::EOPNOTSUPP);
    }
    if op != uapi::IO_OP_READ && read_only {
        return Request::Refuse(libc::EROFS);
    }
    let Some((offset, length)) = range(desc, size_bytes) else {
        return Request::Refuse(libc::EINVAL);
    };
    match op {
        uapi::IO_OP_READ | uapi::IO_OP_WRITE if length > u64::from(MAX_IO_BYTES) => {
            Request::Refuse(libc::EINVAL)
        }
        uapi::IO_OP_READ => Request::Read {
            offset,
            length: length as u32,
        },
        uapi::IO_OP_WRITE => Request::Write {
            offset,
            length: length as u32,
            fua: flags & uapi::IO_F_FUA != 0,
        },
        uapi::IO_OP_DISCARD => Request::Discard {
            offset,
            length,
            fua: flags & uapi::IO_F_FUA != 0,
        },
        _ => Request::WriteZeroes {
            offset,
            length,
            keep_allocated: flags & uapi::IO_F_NOUNMAP != 0,
            fua: flags & uapi::IO_F_FUA != 0,
        },
    }
}

/// The byte range of a ranged request, if it is nonempty and inside the device.
fn range(desc: &IoDesc, size_bytes: u64) -> Option<(u64, u64)> {
    let offset = desc.start_sector.checked_mul(LOGICAL_BLOCK_BYTES)?;
    let length = u64::from(desc.nr_sectors) * LOGICAL_BLOCK_BYTES;
    let end = offset.checked_add(length)?;
    (length > 0 && end <= size_bytes).then_some((offset, length))
}

/// Runs `request` on `export`. `data` holds a write's bytes, or receives a read's (at least
/// [`Request::data_bytes`] long). Returns the driver's result: bytes for reads and writes, 0
/// for the others, or a negative errno.
pub fn execute(export: &dyn Export, request: Request, data: &mut [u8]) -> i32 {
    let outcome = match request {
        Request::Read { offset, length } => export
            .read(offset, &mut data[..length as usize])
            .map(|()| length as i32),
        Request::Write {
            offset,
            length,
            fua,
        } => export
            .write(offset, &data[..length as usize], fua)
            .map(|()| length as i32),
        Request::Flush => export.flush().map(|()| 0),
        Request::Discard {
            offset,
            length,
            fua,
        } => export.trim(offset, length, fua).map(|()| 0),
        Request::WriteZeroes {
            offset,
            length,
            keep_allocated,
            fua,
        } => export
            .write_zeroes(offset, length, keep_allocated, fua)
            .map(|()| 0),
        Request::Refuse(errno) => return -errno,
    };
    outcome.unwrap_or_else(|e| -errno_of(&e))
}

/// The errno the kernel is told for an export's error (EIO when it carries none).
pub fn errno_of(error: &io::Error) -> i32 {
    match error.raw_os_error() {
        Some(errno) if errno > 0 => errno,
        _ => match error.kind() {
            io::ErrorKind::InvalidInput => libc::EINVAL,
            io::ErrorKind::StorageFull => libc::ENOSPC,
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => libc::EROFS,
            io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
            _ => libc::EIO,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lograid_nbd::mem_export::MemExport;

    const SIZE: u64 = 1 << 20;

    fn desc(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: u32::from(op) | flags,
            nr_sectors,
            start_sector,
            addr: 0,
        }
    }

    #[test]
    fn ops_map_to_export_calls() {
        let read = desc(uapi::IO_OP_READ, 0, 8, 8);
        assert_eq!(
            decode(&read, SIZE, false),
            Request::Read {
                offset: 4096,
                length: 4096
            }
        );
        let fua = desc(uapi::IO_OP_WRITE, uapi::IO_F_FUA, 0, 1);
        assert_eq!(
            decode(&fua, SIZE, false),
            Request::Write {
                offset: 0,
                length: 512,
                fua: true
            }
        );
        let trim = desc(uapi::IO_OP_DISCARD, 0, 16, 16);
        assert_eq!(
            decode(&trim, SIZE, false),
            Request::Discard {
                offset: 8192,
                length: 8192,
                fua: false
            }
        );
        let zeroes = desc(
            uapi::IO_OP_WRITE_ZEROES,
            uapi::IO_F_NOUNMAP | uapi::IO_F_FUA,
            0,
            8,
        );
        assert_eq!(
            decode(&zeroes, SIZE, false),
            Request::WriteZeroes {
                offset: 0,
                length: 4096,
                keep_allocated: true,
                fua: true
            }
        );
    }

    #[test]
    fn a_flush_ignores_its_unset_sector_fields() {
        // The block layer's flush request carries start sector -1: a server that bounds-checks
        // it fails every flush with EINVAL (mkfs.ext4 then reports a failed WRITE at sector 0).
        let flush = desc(uapi::IO_OP_FLUSH, 0, u64::MAX, 0);
        assert_eq!(decode(&flush, SIZE, false), Request::Flush);
        assert_eq!(decode(&flush, SIZE, true), Request::Flush);
    }

    #[test]
    fn out_of_range_unknown_and_read_only_requests_are_refused() {
        let past_end = desc(uapi::IO_OP_READ, 0, SIZE / 512, 1);
        assert_eq!(
            decode(&past_end, SIZE, false),
            Request::Refuse(libc::EINVAL)
        );
        let overflow = desc(uapi::IO_OP_WRITE, 0, u64::MAX / 256, 1);
        assert_eq!(
            decode(&overflow, SIZE, false),
            Request::Refuse(libc::EINVAL)
        );
        let empty = desc(uapi::IO_OP_READ, 0, 0, 0);
        assert_eq!(decode(&empty, SIZE, false), Request::Refuse(libc::EINVAL));
        let huge = desc(uapi::IO_OP_READ, 0, 0, 4096);
        assert_eq!(decode(&huge, 1 << 30, false), Request::Refuse(libc::EINVAL));
        let zone = desc(13, 0, 0, 8);
        assert_eq!(
            decode(&zone, SIZE, false),
            Request::Refuse(libc::EOPNOTSUPP)
        );
        let write = desc(uapi::IO_OP_WRITE, 0, 0, 8);
        assert_eq!(decode(&write, SIZE, true), Request::Refuse(libc::EROFS));
        let read = desc(uapi::IO_OP_READ, 0, 0, 8);
        assert!(matches!(decode(&read, SIZE, true), Request::Read { .. }));
    }

    #[test]
    fn requests_run_on_an_export() {
        let export = MemExport::new("vol", SIZE);
        let mut data = vec![0xabu8; 8192];
        let write = Request::Write {
            offset: 4096,
            length: 8192,
            fua: true,
        };
        assert_eq!(execute(&export, write, &mut data), 8192);
        let mut back = vec![0u8; 8192];
        let read = Request::Read {
            offset: 4096,
            length: 8192,
        };
        assert_eq!(execute(&export, read, &mut back), 8192);
        assert!(back.iter().all(|b| *b == 0xab));
        let zero = Request::WriteZeroes {
            offset: 4096,
            length: 4096,
            keep_allocated: false,
            fua: true,
        };
        assert_eq!(execute(&export, zero, &mut []), 0);
        let trim = Request::Discard {
            offset: 8192,
            length: 4096,
            fua: false,
        };
        assert_eq!(execute(&export, trim, &mut []), 0);
        assert_eq!(execute(&export, Request::Flush, &mut []), 0);
        assert_eq!(execute(&export, read, &mut back), 8192);
        assert!(back.iter().all(|b| *b == 0));
        assert_eq!(
            execute(&export, Request::Refuse(libc::EROFS), &mut []),
            -libc::EROFS
        );
        assert_eq!(export.contract_violations(), 0);
        assert!(write.modifies() && !read.modifies() && !Request::Flush.modifies());
    }

    #[test]
    fn export_errors_become_negative_errnos() {
        assert_eq!(
            errno_of(&io::Error::from_raw_os_error(libc::ENOSPC)),
            libc::ENOSPC
        );
        assert_eq!(errno_of(&io::Error::other("broken")), libc::EIO);
        assert_eq!(errno_of(&io::ErrorKind::InvalidInput.into()), libc::EINVAL);
    }
}
