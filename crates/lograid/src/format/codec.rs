//! Little-endian byte writer and a total (never panicking) byte reader used by
//! every on-disk structure. A reader past the end yields `FormatError::Truncated`.

use super::FormatError;

/// Appends little-endian integers and byte strings to a buffer.
#[derive(Default)]
pub struct ByteWriter {
    pub bytes: Vec<u8>,
}

impl ByteWriter {
    pub fn with_capacity(capacity: usize) -> Self {
        ByteWriter {
            bytes: Vec::with_capacity(capacity),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u128(&mut self, v: u128) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn raw(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }
    /// A length-prefixed (u16) UTF-8 string.
    pub fn str16(&mut self, s: &str) {
        let b = s.as_bytes();
        let len = b.len().min(u16::MAX as usize);
        self.u16(len as u16);
        self.raw(&b[..len]);
    }
    /// Overwrites the u32 written at `at` (a count known only later).
    pub fn u32_at(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Overwrites the u64 written at `at`.
    pub fn u64_at(&mut self, at: usize, v: u64) {
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    pub fn reserve(&mut self, additional: usize) {
        self.bytes.reserve(additional);
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Reads little-endian integers from a byte slice; every read is bounds-checked.
pub struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        ByteReader { bytes, pos: 0 }
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.remaining() < n {
            return Err(FormatError::Truncated {
                needed: n,
                available: self.remaining(),
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn u128(&mut self) -> Result<u128, FormatError> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().expect("16 bytes"),
        ))
    }
    pub fn str16(&mut self) -> Result<String, FormatError> {
        let len = self.u16()? as usize;
        let b = self.take(len)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| FormatError::Invalid("string is not UTF-8".into()))
    }
    /// A count read from disk, refused if larger than `max` (guards allocations).
    pub fn count(&mut self, max: u64, what: &str) -> Result<usize, FormatError> {
        let n = self.u64()?;
        if n > max {
            return Err(FormatError::Invalid(format!(
                "{what} count {n} exceeds limit {max}"
            )));
        }
        Ok(n as usize)
    }
}
