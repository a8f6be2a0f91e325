//! ONC RPC version 2 (RFC 5531) over TCP: record marking, the call header, and reply headers.
//!
//! Owns: the record-marking arithmetic (a 4-byte mark per fragment: the last-fragment bit and
//! a 31-bit length), parsing a call's header from a complete record ([`parse_call`]), and
//! encoding accepted and denied replies into a [`ReplyBuf`] that leaves room for its own
//! record mark. Must never: trust a length it did not check, or panic on any record.

use crate::xdr::{XdrError, XdrReader, XdrWriter};

pub const RPC_VERSION: u32 = 2;
const CALL: u32 = 0;
const REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;

/// `accept_stat` values.
pub const SUCCESS: u32 = 0;
pub const PROG_UNAVAIL: u32 = 1;
pub const PROG_MISMATCH: u32 = 2;
pub const PROC_UNAVAIL: u32 = 3;
pub const GARBAGE_ARGS: u32 = 4;
pub const SYSTEM_ERR: u32 = 5;

/// `reject_stat` values.
const RPC_MISMATCH: u32 = 0;
const AUTH_ERROR: u32 = 1;
/// `auth_stat`: credentials this server does not take.
pub const AUTH_BADCRED: u32 = 1;
pub const AUTH_TOOWEAK: u32 = 5;

/// Authentication flavors.
pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;
/// Largest credential or verifier body (RFC 5531).
const MAX_AUTH_BYTES: u32 = 400;

/// The last-fragment bit of a record mark.
pub const LAST_FRAGMENT: u32 = 1 << 31;

/// A record mark split into its parts.
pub fn parse_record_mark(mark: [u8; 4]) -> (bool, u32) {
    let raw = u32::from_be_bytes(mark);
    (raw & LAST_FRAGMENT != 0, raw & !LAST_FRAGMENT)
}

/// The header of one call, and where its arguments start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    pub xid: u32,
    pub program: u32,
    pub version: u32,
    pub procedure: u32,
    pub cred_flavor: u32,
    /// The procedure's arguments (the rest of the record).
    pub args: &'a [u8],
}

/// Why a record is not a call this server can take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Not even a transaction id and a message type: nothing can be answered.
    #[error("record of {0} bytes is too short for an RPC message")]
    TooShort(usize),
    /// A reply, or an unknown message type, sent to a server.
    #[error("message type {0} is not a call")]
    NotACall(u32),
    /// The header is broken after the transaction id; answered with the given reply.
    #[error("bad call header (xid {xid:#x}): {reason}")]
    Refused {
        xid: u32,
        reason: String,
        reply: Vec<u8>,
    },
}

/// Parses the call header of a complete record (all fragments joined).
pub fn parse_call(record: &[u8]) -> Result<Call<'_>, CallError> {
    let mut reader = XdrReader::new(record);
    let (Ok(xid), Ok(message_type)) = (reader.u32(), reader.u32()) else {
        return Err(CallError::TooShort(record.len()));
    };
    if message_type != CALL {
        return Err(CallError::NotACall(message_type));
    }
    let refused = |reason: String, reply: ReplyBuf| CallError::Refused {
        xid,
        reason,
        reply: reply.finish(),
    };
    let garbage = |error: XdrError| refused(error.to_string(), accepted(xid, GARBAGE_ARGS));
    let rpc_version = reader.u32().map_err(garbage)?;
    if rpc_version != RPC_VERSION {
        return Err(refused(
            format!("RPC version {rpc_version}"),
            rpc_mismatch(xid),
        ));
    }
    let program = reader.u32().map_err(garbage)?;
    let version = reader.u32().map_err(garbage)?;
    let procedure = reader.u32().map_err(garbage)?;
    let auth = |reader: &mut XdrReader<'_>| -> Result<u32, XdrError> {
        let flavor = reader.u32()?;
        reader.opaque(MAX_AUTH_BYTES)?;
        Ok(flavor)
    };
    let cred_flavor = auth(&mut reader)
        .map_err(|error| refused(error.to_string(), auth_error(xid, AUTH_BADCRED)))?;
    auth(&mut reader).map_err(|error| refused(error.to_string(), auth_error(xid, AUTH_BADCRED)))?;
    if cred_flavor != AUTH_NONE && cred_flavor != AUTH_SYS {
        return Err(refused(
            format!("credential flavor {cred_flavor}"),
            auth_error(xid, AUTH_TOOWEAK),
        ));
    }
    Ok(Call {
        xid,
        program,
        version,
        procedure,
        cred_flavor,
        args: reader.rest(),
    })
}

/// A reply being built: 4 bytes kept for its record mark, then the message.
#[derive(Debug)]
pub struct ReplyBuf {
    pub bytes: Vec<u8>,
}

impl ReplyBuf {
    /// An empty message with room for `capacity` bytes after the record mark.
    pub fn with_capacity(capacity: usize) -> ReplyBuf {
        let mut bytes = Vec::with_capacity(4 + capacity);
        bytes.put_u32(0);
        ReplyBuf { bytes }
    }

    /// The reply as one record (a single, last fragment) ready for the socket.
    pub fn finish(mut self) -> Vec<u8> {
        // Replies are at most a READ of 1 MiB and its headers: far below 2 GiB.
        let length = u32::try_from(self.bytes.len() - 4).unwrap_or(LAST_FRAGMENT - 1);
        self.bytes[..4].copy_from_slice(&(LAST_FRAGMENT | length).to_be_bytes());
        self.bytes
    }
}

fn reply_header(xid: u32, capacity: usize) -> ReplyBuf {
    let mut reply = ReplyBuf::with_capacity(capacity + 24);
    reply.bytes.put_u32(xid);
    reply.bytes.put_u32(REPLY);
    reply
}

/// An accepted reply with `accept_stat`; for `SUCCESS` the results follow (append them), and for
/// `PROG_MISMATCH` the supported versions (see [`prog_mismatch`]).
pub fn accepted(xid: u32, accept_stat: u32) -> ReplyBuf {
    accepted_with_capacity(xid, accept_stat, 128)
}

/// As [`accepted`], with room for `capacity` bytes of results.
pub fn accepted_with_capacity(xid: u32, accept_stat: u32, capacity: usize) -> ReplyBuf {
    let mut reply = reply_header(xid, capacity);
    reply.bytes.put_u32(MSG_ACCEPTED);
    reply.bytes.put_u32(AUTH_NONE);
    reply.bytes.put_u32(0);
    reply.bytes.put_u32(accept_stat);
    reply
}

/// `PROG_MISMATCH`: the program is served, in versions `low..=high` only.
pub fn prog_mismatch(xid: u32, low: u32, high: u32) -> ReplyBuf {
    let mut reply = accepted(xid, PROG_MISMATCH);
    reply.bytes.put_u32(low);
    reply.bytes.put_u32(high);
    reply
}

/// Denied: this server speaks RPC version 2 only.
pub fn rpc_mismatch(xid: u32) -> ReplyBuf {
    let mut reply = reply_header(xid, 16);
    reply.bytes.put_u32(MSG_DENIED);
    reply.bytes.put_u32(RPC_MISMATCH);
    reply.bytes.put_u32(RPC_VERSION);
    reply.bytes.put_u32(RPC_VERSION);
    reply
}

/// Denied: the credentials are not taken (`auth_stat`).
pub fn auth_error(xid: u32, auth_stat: u32) -> ReplyBuf {
    let mut reply = reply_header(xid, 8);
    reply.bytes.put_u32(MSG_DENIED);
    reply.bytes.put_u32(AUTH_ERROR);
    reply.bytes.put_u32(auth_stat);
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_bytes(rpc_version: u32, flavor: u32, cred_len: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for value in [0x1234, CALL, rpc_version, 100003, 3, 0, flavor, cred_len] {
            out.put_u32(value);
        }
        out.extend(std::iter::repeat_n(0u8, cred_len as usize));
        out.put_u32(AUTH_NONE);
        out.put_u32(0);
        out.extend_from_slice(b"args");
        out
    }

    #[test]
    fn calls_parse_and_bad_headers_get_their_reply() {
        let record = call_bytes(2, AUTH_SYS, 8);
        let call = parse_call(&record).unwrap();
        assert_eq!((call.xid, call.program, call.version), (0x1234, 100003, 3));
        assert_eq!(call.args, b"args");
        assert_eq!(parse_call(&[1, 2, 3]), Err(CallError::TooShort(3)));
        let mut reply_to_server = Vec::new();
        reply_to_server.put_u32(1);
        reply_to_server.put_u32(REPLY);
        assert_eq!(parse_call(&reply_to_server), Err(CallError::NotACall(1)));
        let Err(CallError::Refused { reply, .. }) = parse_call(&call_bytes(3, AUTH_NONE, 0)) else {
            panic!("RPC version 3 accepted");
        };
        // mark, xid, REPLY, MSG_DENIED, RPC_MISMATCH, 2, 2
        assert_eq!(reply.len(), 4 + 24);
        assert_eq!(&reply[12..16], &MSG_DENIED.to_be_bytes());
        let Err(CallError::Refused { reply, .. }) = parse_call(&call_bytes(2, 6, 0)) else {
            panic!("RPCSEC_GSS accepted");
        };
        assert_eq!(&reply[20..24], &AUTH_TOOWEAK.to_be_bytes());
        assert!(matches!(
            parse_call(&call_bytes(2, AUTH_SYS, 404)),
            Err(CallError::Refused { .. })
        ));
    }

    #[test]
    fn record_marks() {
        assert_eq!(parse_record_mark([0x80, 0, 0, 5]), (true, 5));
        assert_eq!(
            parse_record_mark([0x7f, 0xff, 0xff, 0xff]),
            (false, 0x7fff_ffff)
        );
        let reply = accepted(9, SUCCESS).finish();
        assert_eq!(
            parse_record_mark([reply[0], reply[1], reply[2], reply[3]]),
            (true, 24)
        );
    }
}
