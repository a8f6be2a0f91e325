//! One entry point that drives every parser of network bytes with arbitrary input: used by the
//! cargo-fuzz target `fuzz/fuzz_targets/nfs_proto.rs` and by the property tests.
//!
//! The input is a byte stream as a client would send it on a connection: record marks and
//! fragments. Records are joined as the connection joins them (same limits) and each is
//! answered by a [`Service`] over small in-memory volumes; every reply is checked to be one
//! well-formed record that echoes the call's transaction id. Owns nothing of the server; must
//! never do I/O.

use std::io;
use std::sync::{Arc, Mutex};

use lograid_nbd::{Allocation, Export};

use crate::files::{Namespace, NfsVolume, Space};
use crate::rpc::{parse_record_mark, AUTH_SYS, LAST_FRAGMENT};
use crate::service::{Outcome, Service};
use crate::xdr::XdrWriter;
use crate::MAX_RECORD_BYTES;

/// The pool UUID of the fuzzed service (handles must name it to reach the files).
pub const FUZZ_POOL_UUID: u128 = 0x6c72_6e66_0000_0000_0000_0000_0000_0001;

/// An in-memory volume.
pub struct StubExport {
    name: &'static str,
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
}

impl StubExport {
    pub fn new(name: &'static str, size_bytes: usize, read_only: bool) -> StubExport {
        StubExport {
            name,
            bytes: Mutex::new(vec![0; size_bytes]),
            read_only,
        }
    }

    fn range(&self, offset: u64, length: usize) -> io::Result<std::ops::Range<usize>> {
        let start =
            usize::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let size = self.size_bytes() as usize;
        if offset % 512 != 0 || length % 512 != 0 || start > size || length > size - start {
            // The export contract: the server passes only whole, in-range sectors.
            panic!("export contract broken: offset {offset} length {length}");
        }
        Ok(start..start + length)
    }
}

impl Export for StubExport {
    fn name(&self) -> &str {
        self.name
    }
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().map_or(0, |bytes| bytes.len() as u64)
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let range = self.range(offset, buf.len())?;
        let bytes = self
            .bytes
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let range = self.range(offset, data.len())?;
        let mut bytes = self
            .bytes
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        bytes[range].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> io::Result<()> {
        Ok(())
    }
    fn block_status(&self, _offset: u64, length: u64) -> io::Result<Vec<(u64, Allocation)>> {
        Ok(vec![(length, Allocation::Data)])
    }
}

/// A service over a writable 1 MiB volume `vol0` (id 1) and a read-only 64 KiB `ro` (id 7).
pub fn fuzz_service() -> Service {
    let volumes = vec![
        NfsVolume {
            export: Arc::new(StubExport::new("vol0", 1 << 20, false)),
            volume_id: 1,
        },
        NfsVolume {
            export: Arc::new(StubExport::new("ro", 64 << 10, true)),
            volume_id: 7,
        },
    ];
    let space = Arc::new(|| Space {
        total_bytes: 8 << 20,
        free_bytes: 4 << 20,
    });
    match Namespace::new(FUZZ_POOL_UUID, volumes, false, Some(space)) {
        Ok(namespace) => Service::new(namespace),
        Err(error) => panic!("the fuzz namespace is valid: {error}"),
    }
}

/// A call record (no mark) with AUTH_SYS credentials.
pub fn call_record(xid: u32, program: u32, version: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + args.len());
    for value in [xid, 0, 2, program, version, procedure, AUTH_SYS] {
        out.put_u32(value);
    }
    let mut cred = Vec::new();
    cred.put_u32(0); // stamp
    cred.put_opaque(b"fuzz");
    cred.put_u32(0); // uid
    cred.put_u32(0); // gid
    cred.put_u32(0); // no more groups
    out.put_opaque(&cred);
    out.put_u32(0);
    out.put_u32(0);
    out.extend_from_slice(args);
    out
}

/// `record` as one last fragment with its mark.
pub fn framed(record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + record.len());
    out.put_u32(LAST_FRAGMENT | record.len() as u32);
    out.extend_from_slice(record);
    out
}

/// Feeds `stream` to `service` as a connection would, checking every reply. Returns how many
/// records were answered.
pub fn fuzz_stream(service: &Service, stream: &[u8]) -> usize {
    let mut position = 0usize;
    let mut answered = 0;
    loop {
        let mut record = Vec::new();
        loop {
            let Some(mark) = stream.get(position..position + 4) else {
                return answered;
            };
            let (last, length) = parse_record_mark([mark[0], mark[1], mark[2], mark[3]]);
            position += 4;
            if record.len() + length as usize > MAX_RECORD_BYTES as usize {
                return answered;
            }
            let Some(fragment) = stream.get(position..position + length as usize) else {
                return answered;
            };
            record.extend_from_slice(fragment);
            position += length as usize;
            if last {
                break;
            }
        }
        match service.handle_record(&record) {
            Outcome::Reply(reply) => check_reply(&record, &reply),
            Outcome::Close(_) => return answered,
        }
        answered += 1;
    }
}

/// A reply is one last fragment of the length its mark says, echoing the call's xid; an
/// accepted one is never SYSTEM_ERR (what a call that panicked gets, e.g. on a broken export
/// contract, which the stub export turns into a panic).
fn check_reply(record: &[u8], reply: &[u8]) {
    assert!(reply.len() >= 16, "reply too short");
    let (last, length) = parse_record_mark([reply[0], reply[1], reply[2], reply[3]]);
    assert!(last, "reply not one fragment");
    assert_eq!(length as usize, reply.len() - 4, "reply length");
    assert_eq!(record[..4], reply[4..8], "xid not echoed");
    assert_eq!(reply[8..12], [0, 0, 0, 1], "not a REPLY");
    let accepted = reply[12..16] == [0, 0, 0, 0];
    if accepted {
        let status = reply.get(24..28);
        assert_ne!(
            status,
            Some(&[0, 0, 0, 5][..]),
            "a call panicked (SYSTEM_ERR)"
        );
    }
}
