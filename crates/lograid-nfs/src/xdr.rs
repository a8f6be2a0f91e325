//! XDR (RFC 4506) as far as NFSv3 and ONC RPC need it: big-endian 32- and 64-bit integers,
//! booleans, and fixed or variable-length opaque data padded to four bytes.
//!
//! Owns: the decoding of untrusted bytes ([`XdrReader`]: every read checks what is left and
//! every variable length against a maximum the caller names) and the encoding helpers
//! ([`XdrWriter`]). Must never: index past the input, allocate from a length it did not check,
//! or panic on any input.

/// Why bytes are not valid XDR for what was expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    #[error("input ends {missing} bytes early")]
    Truncated { missing: usize },
    #[error("length {length} is over the limit of {max}")]
    TooLong { length: u32, max: u32 },
    #[error("boolean with value {0}")]
    BadBool(u32),
    #[error("enumeration with value {0}")]
    BadEnum(u32),
}

/// Reads XDR items from a byte slice, front to back.
#[derive(Clone, Debug)]
pub struct XdrReader<'a> {
    bytes: &'a [u8],
    position: usize,
}

/// Bytes of padding after `length` bytes of opaque data.
pub fn padding(length: usize) -> usize {
    (4 - length % 4) % 4
}

impl<'a> XdrReader<'a> {
    pub fn new(bytes: &'a [u8]) -> XdrReader<'a> {
        XdrReader { bytes, position: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.position..]
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], XdrError> {
        let left = self.remaining();
        if count > left {
            return Err(XdrError::Truncated {
                missing: count - left,
            });
        }
        let taken = &self.bytes[self.position..self.position + count];
        self.position += count;
        Ok(taken)
    }

    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let raw = self.take(4)?;
        Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, XdrError> {
        let high = self.u32()?;
        let low = self.u32()?;
        Ok((u64::from(high) << 32) | u64::from(low))
    }

    pub fn bool(&mut self) -> Result<bool, XdrError> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(XdrError::BadBool(other)),
        }
    }

    /// Opaque data of a length known to both sides, and its padding.
    pub fn opaque_fixed(&mut self, length: usize) -> Result<&'a [u8], XdrError> {
        let bytes = self.take(length)?;
        self.take(padding(length))?;
        Ok(bytes)
    }

    /// Opaque data with its length in front (at most `max` bytes), and its padding.
    pub fn opaque(&mut self, max: u32) -> Result<&'a [u8], XdrError> {
        let length = self.u32()?;
        if length > max {
            return Err(XdrError::TooLong { length, max });
        }
        self.opaque_fixed(length as usize)
    }
}

/// Appends XDR items to a byte vector.
pub trait XdrWriter {
    fn put_u32(&mut self, value: u32);
    fn put_u64(&mut self, value: u64);
    fn put_bool(&mut self, value: bool);
    /// Opaque data with its length in front, padded.
    fn put_opaque(&mut self, bytes: &[u8]);
    /// Opaque data of a known length, padded.
    fn put_opaque_fixed(&mut self, bytes: &[u8]);
}

impl XdrWriter for Vec<u8> {
    fn put_u32(&mut self, value: u32) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_u64(&mut self, value: u64) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_bool(&mut self, value: bool) {
        self.put_u32(u32::from(value));
    }
    fn put_opaque(&mut self, bytes: &[u8]) {
        // Every opaque this server sends (handles, names, paths) is far below 4 GiB.
        self.put_u32(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
        self.put_opaque_fixed(bytes);
    }
    fn put_opaque_fixed(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
        self.extend_from_slice(&[0u8; 3][..padding(bytes.len())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let mut out = Vec::new();
        out.put_u32(7);
        out.put_u64(0x0102_0304_0506_0708);
        out.put_bool(true);
        out.put_opaque(b"abcde");
        out.put_opaque_fixed(b"xy");
        assert_eq!(out.len(), 4 + 8 + 4 + 4 + 8 + 4);
        let mut reader = XdrReader::new(&out);
        assert_eq!(reader.u32(), Ok(7));
        assert_eq!(reader.u64(), Ok(0x0102_0304_0506_0708));
        assert_eq!(reader.bool(), Ok(true));
        assert_eq!(
            reader.clone().opaque(4),
            Err(XdrError::TooLong { length: 5, max: 4 })
        );
        assert_eq!(reader.opaque(5), Ok(&b"abcde"[..]));
        assert_eq!(reader.opaque_fixed(2), Ok(&b"xy"[..]));
        assert_eq!(reader.remaining(), 0);
        assert_eq!(reader.u32(), Err(XdrError::Truncated { missing: 4 }));
        assert_eq!(
            XdrReader::new(&[0, 0, 0, 2]).bool(),
            Err(XdrError::BadBool(2))
        );
        // A length that claims more than is there.
        assert_eq!(
            XdrReader::new(&[0, 0, 0, 9, 1, 2]).opaque(100),
            Err(XdrError::Truncated { missing: 7 })
        );
    }
}
