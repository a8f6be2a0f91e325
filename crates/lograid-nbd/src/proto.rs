//! The NBD wire protocol: every constant under its spec name, and pure, total functions that turn
//! bytes from the network into typed values (and typed replies into bytes).
//!
//! Owns: the byte layout of the handshake, option haggling and transmission messages, as set out
//! in the NBD protocol document (`doc/proto.md` of the NetworkBlockDevice/nbd project). All
//! integers on the wire are big-endian.
//!
//! Must never: do I/O, allocate in proportion to a length field it has not checked against a
//! bound, or panic on any input. Every parser here is fuzzed (`fuzz/fuzz_targets/nbd_proto.rs`)
//! and run over random bytes in the normal test suite.

use std::fmt;

// ---------------------------------------------------------------------------------------------
// Magic numbers
// ---------------------------------------------------------------------------------------------

/// `NBDMAGIC`, the first 8 bytes the server sends (also called `INIT_PASSWD`).
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: sent by the server after `NBDMAGIC` in newstyle negotiation, and by the client in
/// front of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every fixed-newstyle option reply.
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`, in front of every transmission request.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC` (formerly `NBD_REPLY_MAGIC`).
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`, in front of every structured reply chunk.
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------------------------
// Handshake flags (server, 16 bits) and client flags (32 bits)
// ---------------------------------------------------------------------------------------------

pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------------------------------------
// Transmission flags (16 bits)
// ---------------------------------------------------------------------------------------------

pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------------------------
// Options (client -> server during haggling)
// ---------------------------------------------------------------------------------------------

pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------------------------------------
// Option reply types
// ---------------------------------------------------------------------------------------------

pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;

const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

// ---------------------------------------------------------------------------------------------
// NBD_REP_INFO information types
// ---------------------------------------------------------------------------------------------

pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------------------------
// Commands and command flags (transmission)
// ---------------------------------------------------------------------------------------------

pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---------------------------------------------------------------------------------------------
// Structured replies
// ---------------------------------------------------------------------------------------------

pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;

pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// ---------------------------------------------------------------------------------------------
// base:allocation
// ---------------------------------------------------------------------------------------------

/// The one metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;

// ---------------------------------------------------------------------------------------------
// Error values (transmission)
// ---------------------------------------------------------------------------------------------

pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

// ---------------------------------------------------------------------------------------------
// Sizes and limits of this implementation
// ---------------------------------------------------------------------------------------------

/// Size of the server's opening: NBDMAGIC, IHAVEOPT, handshake flags.
pub const SERVER_GREETING_LEN: usize = 18;
/// Size of an option header: IHAVEOPT, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Size of a transmission request header (compact, non-extended headers).
pub const REQUEST_HEADER_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const STRUCTURED_REPLY_HEADER_LEN: usize = 20;
/// Longest option payload accepted; anything longer is answered with `NBD_REP_ERR_TOO_BIG`.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Longest string (export name, query) the spec allows.
pub const MAX_STRING_LEN: usize = 4096;
/// Most metadata-context queries accepted in one option.
pub const MAX_META_QUERIES: u32 = 128;
/// Minimum block size advertised to a client that asks for block sizes (`NBD_INFO_BLOCK_SIZE`
/// in its `NBD_OPT_GO`): its offsets and lengths must be multiples of it. Also the unit of the
/// [`crate::Export`] contract.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Minimum block size of a client that did not ask for block sizes: the protocol's default of
/// 1, any byte offset and length (partly covered sectors are read-modify-written).
pub const DEFAULT_MIN_BLOCK_SIZE: u32 = 1;
/// Preferred block size advertised.
pub const PREFERRED_BLOCK_SIZE: u32 = 4096;
/// Default maximum payload (and the floor of the configurable one): 32 MiB.
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Largest READ/WRITE accepted from a client that did not ask for block sizes, unless the
/// configured maximum payload is larger (or the per-connection buffer budget smaller): 64 MiB.
/// The protocol asks servers for at least 32 MiB from such clients; twice that still fits the
/// default per-connection buffer budget in one request.
pub const UNNEGOTIATED_MAX_PAYLOAD: u32 = 64 * 1024 * 1024;
/// Context id this server assigns to `base:allocation` in `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// Name of an option code, for logs and error messages.
pub fn option_name(option: u32) -> &'static str {
    match option {
        NBD_OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        NBD_OPT_ABORT => "NBD_OPT_ABORT",
        NBD_OPT_LIST => "NBD_OPT_LIST",
        NBD_OPT_PEEK_EXPORT => "NBD_OPT_PEEK_EXPORT",
        NBD_OPT_STARTTLS => "NBD_OPT_STARTTLS",
        NBD_OPT_INFO => "NBD_OPT_INFO",
        NBD_OPT_GO => "NBD_OPT_GO",
        NBD_OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        NBD_OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        NBD_OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        NBD_OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// Name of a command code, for logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        NBD_CMD_READ => "NBD_CMD_READ",
        NBD_CMD_WRITE => "NBD_CMD_WRITE",
        NBD_CMD_DISC => "NBD_CMD_DISC",
        NBD_CMD_FLUSH => "NBD_CMD_FLUSH",
        NBD_CMD_TRIM => "NBD_CMD_TRIM",
        NBD_CMD_CACHE => "NBD_CMD_CACHE",
        NBD_CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        NBD_CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        _ => "unknown command",
    }
}

// ---------------------------------------------------------------------------------------------
// Errors of the pure parsers
// ---------------------------------------------------------------------------------------------

/// A framing error: the peer does not speak this protocol (or the stream lost sync). The only
/// answer is to close the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoError {
    /// The client flags have bits this server does not know or did not offer.
    UnknownClientFlags(u32),
    /// An option header did not start with `IHAVEOPT`.
    BadOptionMagic(u64),
    /// A request header did not start with `NBD_REQUEST_MAGIC`.
    BadRequestMagic(u32),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::UnknownClientFlags(flags) => write!(f, "unknown client flags {flags:#x}"),
            ProtoError::BadOptionMagic(magic) => write!(f, "bad option magic {magic:#018x}"),
            ProtoError::BadRequestMagic(magic) => write!(f, "bad request magic {magic:#010x}"),
        }
    }
}

impl std::error::Error for ProtoError {}

// ---------------------------------------------------------------------------------------------
// Byte helpers (total: never index out of bounds)
// ---------------------------------------------------------------------------------------------

fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let raw = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([raw[0], raw[1]]))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw = bytes.get(at..at.checked_add(8)?)?;
    let mut array = [0u8; 8];
    array.copy_from_slice(raw);
    Some(u64::from_be_bytes(array))
}

// ---------------------------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------------------------

/// The 18 bytes the server opens every connection with.
pub fn server_greeting() -> [u8; SERVER_GREETING_LEN] {
    let mut out = [0u8; SERVER_GREETING_LEN];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// What the client's 32-bit flags word told us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Parses the client flags. Unknown bits are a protocol error (the spec says the server MUST
/// drop the connection).
pub fn parse_client_flags(bytes: &[u8; 4]) -> Result<ClientFlags, ProtoError> {
    let flags = u32::from_be_bytes(*bytes);
    if flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
        return Err(ProtoError::UnknownClientFlags(flags));
    }
    Ok(ClientFlags {
        fixed_newstyle: flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: flags & NBD_FLAG_C_NO_ZEROES != 0,
    })
}

/// The fixed part of an option: which option and how many bytes of data follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn parse_option_header(bytes: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
    let magic = be_u64(bytes, 0).unwrap_or(0);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadOptionMagic(magic));
    }
    Ok(OptionHeader {
        option: be_u32(bytes, 8).unwrap_or(0),
        length: be_u32(bytes, 12).unwrap_or(0),
    })
}

/// A parsed client option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    /// `NBD_OPT_INFO` (`go == false`) or `NBD_OPT_GO` (`go == true`).
    Info {
        go: bool,
        name: String,
        requests: Vec<u16>,
    },
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT` (`set == false`) or `NBD_OPT_SET_META_CONTEXT`.
    MetaContext {
        set: bool,
        export: String,
        queries: Vec<String>,
    },
    /// Any option this server does not implement (answered with `NBD_REP_ERR_UNSUP`).
    Unsupported(u32),
}

/// Why an option's data could not be parsed; answered with the given `NBD_REP_ERR_*`, after
/// which negotiation continues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionError {
    pub reply: u32,
    pub message: String,
}

impl OptionError {
    fn invalid(message: impl Into<String>) -> Self {
        OptionError {
            reply: NBD_REP_ERR_INVALID,
            message: message.into(),
        }
    }
}

/// A protocol string: UTF-8, no NUL, at most 4096 bytes.
fn parse_string(raw: &[u8], what: &str) -> Result<String, OptionError> {
    if raw.len() > MAX_STRING_LEN {
        return Err(OptionError {
            reply: NBD_REP_ERR_TOO_BIG,
            message: format!("{what} longer than {MAX_STRING_LEN} bytes"),
        });
    }
    if raw.contains(&0) {
        return Err(OptionError::invalid(format!("{what} contains NUL")));
    }
    match std::str::from_utf8(raw) {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(OptionError::invalid(format!("{what} is not UTF-8"))),
    }
}

/// Reads a 32-bit length followed by that many bytes of string at `*at`, advancing `*at`.
fn take_string(data: &[u8], at: &mut usize, what: &str) -> Result<String, OptionError> {
    let length = be_u32(data, *at)
        .ok_or_else(|| OptionError::invalid(format!("{what} length truncated")))?;
    let start = at
        .checked_add(4)
        .ok_or_else(|| OptionError::invalid("overflow"))?;
    let end = usize::try_from(length)
        .ok()
        .and_then(|length| start.checked_add(length))
        .filter(|&end| end <= data.len())
        .ok_or_else(|| OptionError::invalid(format!("{what} runs past the option data")))?;
    let text = parse_string(&data[start..end], what)?;
    *at = end;
    Ok(text)
}

/// Parses the data of one option. `data.len()` must already be bounded by the caller (the server
/// never reads more than [`MAX_OPTION_LEN`] bytes of option data).
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, OptionError> {
    match option {
        NBD_OPT_EXPORT_NAME => Ok(ClientOption::ExportName(parse_string(data, "export name")?)),
        // The spec asks servers to ignore any data sent with NBD_OPT_ABORT.
        NBD_OPT_ABORT => Ok(ClientOption::Abort),
        NBD_OPT_LIST => {
            if data.is_empty() {
                Ok(ClientOption::List)
            } else {
                Err(OptionError::invalid("NBD_OPT_LIST takes no data"))
            }
        }
        NBD_OPT_STARTTLS => {
            if data.is_empty() {
                Ok(ClientOption::StartTls)
            } else {
                Err(OptionError::invalid("NBD_OPT_STARTTLS takes no data"))
            }
        }
        NBD_OPT_STRUCTURED_REPLY => {
            if data.is_empty() {
                Ok(ClientOption::StructuredReply)
            } else {
                Err(OptionError::invalid(
                    "NBD_OPT_STRUCTURED_REPLY takes no data",
                ))
            }
        }
        NBD_OPT_INFO | NBD_OPT_GO => {
            let mut at = 0usize;
            let name = take_string(data, &mut at, "export name")?;
            let count = be_u16(data, at)
                .ok_or_else(|| OptionError::invalid("information request count missing"))?;
            at += 2;
            let expected_end = at + usize::from(count) * 2;
            if expected_end != data.len() {
                return Err(OptionError::invalid(format!(
                    "{count} information requests do not match the option length {}",
                    data.len()
                )));
            }
            let mut requests = Vec::with_capacity(usize::from(count));
            for index in 0..usize::from(count) {
                // In bounds: checked against expected_end above.
                requests.push(be_u16(data, at + index * 2).unwrap_or(u16::MAX));
            }
            Ok(ClientOption::Info {
                go: option == NBD_OPT_GO,
                name,
                requests,
            })
        }
        NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
            let mut at = 0usize;
            let export = take_string(data, &mut at, "export name")?;
            let count =
                be_u32(data, at).ok_or_else(|| OptionError::invalid("query count missing"))?;
            at += 4;
            if count > MAX_META_QUERIES {
                return Err(OptionError {
                    reply: NBD_REP_ERR_TOO_BIG,
                    message: format!("{count} queries; at most {MAX_META_QUERIES} accepted"),
                });
            }
            let mut queries = Vec::new();
            for _ in 0..count {
                queries.push(take_string(data, &mut at, "query")?);
            }
            if at != data.len() {
                return Err(OptionError::invalid("trailing bytes after the last query"));
            }
            Ok(ClientOption::MetaContext {
                set: option == NBD_OPT_SET_META_CONTEXT,
                export,
                queries,
            })
        }
        other => Ok(ClientOption::Unsupported(other)),
    }
}

/// Encodes one fixed-newstyle option reply.
pub fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&NBD_REP_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    // Replies are built by this server from bounded inputs; clamp defensively anyway.
    let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Truncates a human-readable message so that it stays a valid protocol string.
pub fn bounded_message(message: &str) -> &str {
    if message.len() <= MAX_STRING_LEN {
        return message;
    }
    let mut end = MAX_STRING_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

// ---------------------------------------------------------------------------------------------
// Transmission requests
// ---------------------------------------------------------------------------------------------

/// A request header as it came off the wire; nothing but the magic has been checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    /// Called "handle" in older versions of the spec; echoed back in every reply.
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn parse_request(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtoError> {
    let magic = be_u32(bytes, 0).unwrap_or(0);
    if magic != NBD_REQUEST_MAGIC {
        return Err(ProtoError::BadRequestMagic(magic));
    }
    Ok(RequestHeader {
        flags: be_u16(bytes, 4).unwrap_or(0),
        command: be_u16(bytes, 6).unwrap_or(0),
        cookie: be_u64(bytes, 8).unwrap_or(0),
        offset: be_u64(bytes, 16).unwrap_or(0),
        length: be_u32(bytes, 24).unwrap_or(0),
    })
}

/// Encodes a request header (used by tests and the fuzz seeds; the server only parses them).
pub fn encode_request(header: &RequestHeader) -> [u8; REQUEST_HEADER_LEN] {
    let mut out = [0u8; REQUEST_HEADER_LEN];
    out[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.command.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&header.offset.to_be_bytes());
    out[24..28].copy_from_slice(&header.length.to_be_bytes());
    out
}

/// What the session negotiated, as far as request validation needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Export size in bytes, a multiple of [`MIN_BLOCK_SIZE`].
    pub size_bytes: u64,
    pub read_only: bool,
    pub structured_replies: bool,
    /// `base:allocation` was selected for this export.
    pub block_status: bool,
    /// Largest READ/WRITE payload.
    pub max_payload: u32,
    /// Offsets and lengths must be multiples of this: [`MIN_BLOCK_SIZE`] if the client asked
    /// for block sizes, [`DEFAULT_MIN_BLOCK_SIZE`] (any) if not.
    pub min_block_size: u32,
}

/// A request that passed every check: the server may hand it to the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// NBD_CMD_CACHE: validated and acknowledged, no effect.
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        no_hole: bool,
        fua: bool,
        fast: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
}

/// What to do with the payload of a WRITE the server refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadDisposition {
    /// No payload follows the header.
    None,
    /// `length` bytes follow; read and discard them, then reply with the error.
    Discard(u32),
    /// So many bytes follow that reading them is not worth it: reply, then hard-disconnect.
    Disconnect,
}

/// A request the server answers with an error instead of passing it to the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `NBD_E*` value for the reply.
    pub error: u32,
    pub payload: PayloadDisposition,
    pub reason: &'static str,
}

/// Checks one request header against what was negotiated, without any I/O. A `WRITE` whose
/// payload is at most `4 * max_payload` is drained when refused so that the stream stays in step;
/// a longer one ends the connection.
pub fn validate_request(
    header: &RequestHeader,
    limits: &SessionLimits,
) -> Result<Command, Rejection> {
    let is_write = header.command == NBD_CMD_WRITE;
    let payload = if is_write {
        if u64::from(header.length) <= u64::from(limits.max_payload) * 4 {
            PayloadDisposition::Discard(header.length)
        } else {
            PayloadDisposition::Disconnect
        }
    } else {
        PayloadDisposition::None
    };
    let reject = |(error, reason): Refusal| Rejection {
        error,
        payload,
        reason,
    };

    check_flags(header, limits).map_err(reject)?;
    match header.command {
        NBD_CMD_DISC => return Ok(Command::Disconnect),
        NBD_CMD_FLUSH => {
            if header.offset != 0 || header.length != 0 {
                return Err(reject((NBD_EINVAL, "flush with nonzero offset or length")));
            }
            return Ok(Command::Flush);
        }
        _ => {}
    }
    check_range(header, limits).map_err(reject)?;
    // Every other command was returned or rejected above.
    decode_command(header).ok_or_else(|| reject((NBD_EINVAL, "unknown command")))
}

/// Why a request is refused: the `NBD_E*` error and the reason logged.
type Refusal = (u32, &'static str);

/// The command must be known, and carry only flags valid for it (and negotiated).
fn check_flags(header: &RequestHeader, limits: &SessionLimits) -> Result<(), Refusal> {
    let allowed_flags = match header.command {
        NBD_CMD_READ => {
            NBD_CMD_FLAG_FUA
                | if limits.structured_replies {
                    NBD_CMD_FLAG_DF
                } else {
                    0
                }
        }
        NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_FLUSH | NBD_CMD_CACHE => NBD_CMD_FLAG_FUA,
        NBD_CMD_WRITE_ZEROES => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
        NBD_CMD_BLOCK_STATUS => NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE,
        NBD_CMD_DISC => u16::MAX,
        _ => return Err((NBD_EINVAL, "unknown command")),
    };
    if header.flags & !allowed_flags != 0 {
        return Err((NBD_EINVAL, "command flag not valid for this command"));
    }
    Ok(())
}

/// The checks of a command with a range (all but DISC and FLUSH): allowed on this export,
/// within the payload limit, aligned, and inside the export.
fn check_range(header: &RequestHeader, limits: &SessionLimits) -> Result<(), Refusal> {
    let writes_data = matches!(
        header.command,
        NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES
    );
    if writes_data && limits.read_only {
        return Err((NBD_EPERM, "export is read-only"));
    }
    if header.command == NBD_CMD_BLOCK_STATUS && !limits.block_status {
        return Err((
            NBD_EINVAL,
            "block status without a negotiated metadata context",
        ));
    }
    if matches!(header.command, NBD_CMD_READ | NBD_CMD_WRITE) && header.length > limits.max_payload
    {
        return Err((NBD_EINVAL, "length larger than the maximum block size"));
    }
    // Only a session that negotiated block sizes has a minimum above 1 (and it is 512).
    let block = u64::from(limits.min_block_size.max(1));
    if header.offset % block != 0 || u64::from(header.length) % block != 0 {
        return Err((NBD_EINVAL, "offset or length not a multiple of 512"));
    }
    let Some(end) = header.offset.checked_add(u64::from(header.length)) else {
        return Err((NBD_EINVAL, "offset plus length overflows"));
    };
    if end > limits.size_bytes {
        return Err(
            if matches!(header.command, NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES) {
                (NBD_ENOSPC, "write past the end of the export")
            } else {
                (NBD_EINVAL, "request past the end of the export")
            },
        );
    }
    if header.command == NBD_CMD_BLOCK_STATUS && header.length == 0 {
        return Err((NBD_EINVAL, "block status of zero length"));
    }
    Ok(())
}

/// The command a checked header with a range asks for (`None` for any other command).
fn decode_command(header: &RequestHeader) -> Option<Command> {
    let offset = header.offset;
    let length = header.length;
    let fua = header.flags & NBD_CMD_FLAG_FUA != 0;
    Some(match header.command {
        NBD_CMD_READ => Command::Read {
            offset,
            length,
            df: header.flags & NBD_CMD_FLAG_DF != 0,
        },
        NBD_CMD_WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        NBD_CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        NBD_CMD_CACHE => Command::Cache { offset, length },
        NBD_CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            no_hole: header.flags & NBD_CMD_FLAG_NO_HOLE != 0,
            fua,
            fast: header.flags & NBD_CMD_FLAG_FAST_ZERO != 0,
        },
        NBD_CMD_BLOCK_STATUS => Command::BlockStatus {
            offset,
            length,
            req_one: header.flags & NBD_CMD_FLAG_REQ_ONE != 0,
        },
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Transmission replies
// ---------------------------------------------------------------------------------------------

/// Appends a simple reply header.
pub fn put_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Appends a structured reply chunk header; `payload_len` bytes of payload must follow.
pub fn put_chunk_header(
    out: &mut Vec<u8>,
    cookie: u64,
    flags: u16,
    chunk_type: u16,
    payload_len: u32,
) {
    out.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&payload_len.to_be_bytes());
}

/// Appends a complete `NBD_REPLY_TYPE_ERROR` chunk (flagged DONE) with a message.
pub fn put_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let mut end = message.len().min(1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    let message_len = end as u16; // at most 1024
    put_chunk_header(
        out,
        cookie,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_ERROR,
        6 + u32::from(message_len),
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&message_len.to_be_bytes());
    out.extend_from_slice(message);
}

/// Appends a `NBD_REPLY_TYPE_NONE` chunk flagged DONE.
pub fn put_done_chunk(out: &mut Vec<u8>, cookie: u64) {
    put_chunk_header(out, cookie, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SessionLimits {
        SessionLimits {
            size_bytes: 1 << 20,
            read_only: false,
            structured_replies: true,
            block_status: true,
            max_payload: DEFAULT_MAX_PAYLOAD,
            min_block_size: MIN_BLOCK_SIZE,
        }
    }

    fn header(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn request_round_trip() {
        let original = header(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 512);
        assert_eq!(parse_request(&encode_request(&original)), Ok(original));
        let mut bad = encode_request(&original);
        bad[0] ^= 1;
        assert!(matches!(
            parse_request(&bad),
            Err(ProtoError::BadRequestMagic(_))
        ));
    }

    #[test]
    fn validation_errors() {
        let l = limits();
        let check = |h: RequestHeader| validate_request(&h, &l).map_err(|r| r.error);
        assert_eq!(
            check(header(NBD_CMD_READ, 0, 0, 512)),
            Ok(Command::Read {
                offset: 0,
                length: 512,
                df: false
            })
        );
        assert_eq!(check(header(NBD_CMD_READ, 0, 1, 512)), Err(NBD_EINVAL));
        assert_eq!(
            check(header(NBD_CMD_READ, 0, (1 << 20) - 512, 1024)),
            Err(NBD_EINVAL)
        );
        assert_eq!(
            check(header(NBD_CMD_WRITE, 0, (1 << 20) - 512, 1024)),
            Err(NBD_ENOSPC)
        );
        assert_eq!(
            check(header(NBD_CMD_WRITE, 0, u64::MAX - 511, 1024)),
            Err(NBD_EINVAL)
        );
        assert_eq!(check(header(99, 0, 0, 0)), Err(NBD_EINVAL));
        assert_eq!(
            check(header(NBD_CMD_WRITE, NBD_CMD_FLAG_REQ_ONE, 0, 512)),
            Err(NBD_EINVAL)
        );
        assert_eq!(check(header(NBD_CMD_FLUSH, 0, 0, 512)), Err(NBD_EINVAL));
        assert_eq!(
            check(header(NBD_CMD_READ, 0, 0, DEFAULT_MAX_PAYLOAD + 512)),
            Err(NBD_EINVAL)
        );
        assert_eq!(
            check(header(NBD_CMD_BLOCK_STATUS, 0, 0, 0)),
            Err(NBD_EINVAL)
        );
        let ro = SessionLimits {
            read_only: true,
            ..l
        };
        assert_eq!(
            validate_request(&header(NBD_CMD_TRIM, 0, 0, 512), &ro).map_err(|r| r.error),
            Err(NBD_EPERM)
        );
        let oversized = validate_request(&header(NBD_CMD_WRITE, 0, 0, u32::MAX), &l).unwrap_err();
        assert_eq!(oversized.payload, PayloadDisposition::Disconnect);
        let drained = validate_request(&header(NBD_CMD_WRITE, 0, 1, 512), &l).unwrap_err();
        assert_eq!(drained.payload, PayloadDisposition::Discard(512));
    }

    #[test]
    fn go_option_parsing() {
        let mut data = Vec::new();
        data.extend_from_slice(&4u32.to_be_bytes());
        data.extend_from_slice(b"disk");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        data.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
        assert_eq!(
            parse_option(NBD_OPT_GO, &data),
            Ok(ClientOption::Info {
                go: true,
                name: "disk".into(),
                requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME]
            })
        );
        // Name length pointing past the end.
        let mut bad = data.clone();
        bad[3] = 200;
        assert_eq!(
            parse_option(NBD_OPT_GO, &bad).unwrap_err().reply,
            NBD_REP_ERR_INVALID
        );
        // Request count not matching the length.
        let mut bad = data.clone();
        bad.push(0);
        assert_eq!(
            parse_option(NBD_OPT_INFO, &bad).unwrap_err().reply,
            NBD_REP_ERR_INVALID
        );
    }

    #[test]
    fn meta_context_parsing() {
        let mut data = Vec::new();
        data.extend_from_slice(&0u32.to_be_bytes());
        data.extend_from_slice(&1u32.to_be_bytes());
        data.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        data.extend_from_slice(BASE_ALLOCATION.as_bytes());
        assert_eq!(
            parse_option(NBD_OPT_SET_META_CONTEXT, &data),
            Ok(ClientOption::MetaContext {
                set: true,
                export: String::new(),
                queries: vec![BASE_ALLOCATION.into()]
            })
        );
        let mut many = Vec::new();
        many.extend_from_slice(&0u32.to_be_bytes());
        many.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            parse_option(NBD_OPT_LIST_META_CONTEXT, &many)
                .unwrap_err()
                .reply,
            NBD_REP_ERR_TOO_BIG
        );
    }

    #[test]
    fn client_flags() {
        assert!(parse_client_flags(&[0, 0, 0, 3]).is_ok());
        assert!(parse_client_flags(&[0, 0, 0, 4]).is_err());
    }
}
