//! Recording members, for crash-replay tests. A `RecordingMember` wraps any
//! member, passes every I/O through to it, and appends each write, flush and
//! discard that completes to an `IoLog` shared by all the members of a pool,
//! so the log holds one global order of everything the members received.
//! Replaying a prefix of that log over the members' initial images gives
//! what the drives held at that instant; which of the unflushed writes a
//! power cut keeps is for the replaying test to decide. This module owns the
//! log (`Record`, `IoLog`) and the wrapper; it never interprets the bytes.
//!
//! Memory: the log keeps a copy of every byte written, up to a limit given
//! when it is made. Past the limit it stops recording and says so
//! (`overflowed`); what it holds is then still a true prefix of the history.

use super::Member;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// One I/O a member completed. `member` is the index the recording member
/// was given (the order the test created the members in).
#[derive(Debug, Clone)]
pub enum Record {
    /// `bytes` were written at `offset`.
    Write {
        member: usize,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// A flush of `member` completed. It made durable the member's writes
    /// and discards recorded before index `covers` of the log: those that
    /// had completed when the flush started (a write completing while the
    /// flush runs is not covered by it).
    Flush { member: usize, covers: usize },
    /// `[offset, offset + len)` was discarded (reads as zeroes after it, as
    /// on `SimMember`; volatile like a write until the next flush).
    Discard {
        member: usize,
        offset: u64,
        len: u64,
    },
}

impl Record {
    pub fn member(&self) -> usize {
        match self {
            Record::Write { member, .. }
            | Record::Flush { member, .. }
            | Record::Discard { member, .. } => *member,
        }
    }

    /// Bytes this record changes on its member (0 for a flush).
    pub fn len(&self) -> u64 {
        match self {
            Record::Write { bytes, .. } => bytes.len() as u64,
            Record::Discard { len, .. } => *len,
            Record::Flush { .. } => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies a write or discard to `image` (the member's bytes); a flush
    /// changes nothing. With `keep_sectors`, only that many leading 512-byte
    /// sectors land (a torn write).
    pub fn apply(&self, image: &mut [u8], keep_sectors: Option<usize>) {
        let (offset, len) = match self {
            Record::Flush { .. } => return,
            Record::Write { offset, bytes, .. } => (*offset as usize, bytes.len()),
            Record::Discard { offset, len, .. } => (*offset as usize, *len as usize),
        };
        let len = keep_sectors.map_or(len, |s| (s * 512).min(len));
        let target = &mut image[offset..offset + len];
        match self {
            Record::Write { bytes, .. } => target.copy_from_slice(&bytes[..len]),
            _ => target.fill(0),
        }
    }
}

struct LogState {
    records: Vec<Record>,
    /// Bytes of write data held.
    bytes: usize,
    limit: usize,
    overflowed: bool,
}

/// The ordered log shared by the recording members of one pool.
#[derive(Clone)]
pub struct IoLog(Arc<Mutex<LogState>>);

impl IoLog {
    /// A log that keeps at most `limit_bytes` of write data.
    pub fn new(limit_bytes: usize) -> IoLog {
        IoLog(Arc::new(Mutex::new(LogState {
            records: Vec::new(),
            bytes: 0,
            limit: limit_bytes,
            overflowed: false,
        })))
    }

    /// Records held so far (the next record's index).
    pub fn len(&self) -> usize {
        self.0.lock().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the limit was reached and later I/O went unrecorded.
    pub fn overflowed(&self) -> bool {
        self.0.lock().overflowed
    }

    /// Takes the records out (the log is left empty and goes on recording).
    pub fn take(&self) -> Vec<Record> {
        let mut s = self.0.lock();
        s.bytes = 0;
        std::mem::take(&mut s.records)
    }

    /// Appends a record unless the log has overflowed; returns its index.
    fn push(&self, record: Record) -> Option<usize> {
        let mut s = self.0.lock();
        if s.overflowed {
            return None;
        }
        let data = match &record {
            Record::Write { bytes, .. } => bytes.len(),
            _ => 0,
        };
        if s.bytes + data > s.limit {
            s.overflowed = true;
            return None;
        }
        s.bytes += data;
        s.records.push(record);
        Some(s.records.len() - 1)
    }
}

/// A member that records what it is asked to write, flush and discard.
pub struct RecordingMember {
    index: usize,
    inner: Arc<dyn Member>,
    log: IoLog,
}

impl RecordingMember {
    /// Wraps `inner`, recording into `log` under member index `index`.
    pub fn new(index: usize, inner: Arc<dyn Member>, log: IoLog) -> RecordingMember {
        RecordingMember { index, inner, log }
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn inner(&self) -> &Arc<dyn Member> {
        &self.inner
    }
}

impl Member for RecordingMember {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn gone(&self) -> Option<String> {
        self.inner.gone()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> bool {
        self.inner.try_read_at(buf, offset)
    }
    /// Recorded once it completed (a failed write changed nothing).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.log.push(Record::Write {
            member: self.index,
            offset,
            bytes: buf.to_vec(),
        });
        Ok(())
    }
    /// Recorded once it completed, covering what was recorded before it
    /// started.
    fn flush(&self) -> io::Result<()> {
        let covers = self.log.len();
        self.inner.flush()?;
        self.log.push(Record::Flush {
            member: self.index,
            covers,
        });
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)?;
        self.log.push(Record::Discard {
            member: self.index,
            offset,
            len,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimMember;

    #[test]
    fn records_in_order_and_replays() {
        let log = IoLog::new(1 << 20);
        let members: Vec<RecordingMember> = (0..2)
            .map(|i| {
                let sim = Arc::new(SimMember::new(&format!("m{i}"), 64 * 1024));
                RecordingMember::new(i, sim, log.clone())
            })
            .collect();
        members[0].write_at(&[1u8; 4096], 4096).unwrap();
        members[1].write_at(&[2u8; 4096], 0).unwrap();
        members[0].flush().unwrap();
        members[1].discard(0, 4096).unwrap();
        let mut buf = [0u8; 4096];
        members[0].read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [1u8; 4096], "reads pass through");
        let records = log.take();
        assert_eq!(records.len(), 4);
        assert!(matches!(
            records[2],
            Record::Flush {
                member: 0,
                covers: 2
            }
        ));
        let mut image = vec![0u8; 64 * 1024];
        records[1].apply(&mut image, None);
        assert_eq!(&image[..4096], &[2u8; 4096][..]);
        records[3].apply(&mut image, None);
        assert!(image.iter().all(|&b| b == 0), "a discard zeroes");
        records[0].apply(&mut image, Some(3));
        assert!(image[4096..4096 + 1536].iter().all(|&b| b == 1));
        assert!(
            image[4096 + 1536..].iter().all(|&b| b == 0),
            "torn after 3 sectors"
        );
    }

    #[test]
    fn stops_at_its_limit() {
        let log = IoLog::new(8192);
        let sim = Arc::new(SimMember::new("m", 64 * 1024));
        let m = RecordingMember::new(0, sim, log.clone());
        for i in 0..3 {
            m.write_at(&[7u8; 4096], i * 4096).unwrap();
        }
        m.flush().unwrap();
        assert!(log.overflowed());
        assert_eq!(
            log.len(),
            2,
            "a prefix: nothing after the first write that did not fit"
        );
    }
}
