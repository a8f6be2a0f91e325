//! Runs one validated request against an [`Export`] and encodes the complete reply.
//!
//! Owns: the shape of every transmission reply (simple or structured, sparse reads with
//! `NBD_REPLY_TYPE_OFFSET_HOLE`, `NBD_REPLY_TYPE_BLOCK_STATUS` descriptors) and the policing of
//! what an export returns (extents that are empty, unaligned or too many). Runs on a blocking
//! thread (`try_execute_now`: on the connection's task, for a write or read the export does
//! without blocking); must never touch the socket or the async runtime, and must turn a
//! panicking export into an `EIO` reply instead of a lost request.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::buffers::PayloadBuffers;
use crate::export::{nbd_error_from_io, Allocation, Export};
use crate::proto::*;
use crate::sectors::{self, SectorLocks};

/// Reads shorter than this are always sent as one data chunk (no block-status lookup).
pub const SPARSE_READ_MIN_LEN: u32 = 64 * 1024;
/// Holes shorter than this inside a read are sent as data (not worth a chunk).
pub const SPARSE_HOLE_MIN_LEN: u64 = 4096;
/// Most `Export::block_status` calls made to plan one sparse read.
const SPARSE_PLAN_MAX_CALLS: usize = 16;
/// Most descriptors in one block-status reply.
pub const MAX_BLOCK_STATUS_DESCRIPTORS: usize = 1024;

/// How replies are encoded on this connection.
#[derive(Clone, Copy, Debug)]
pub struct ReplyOptions {
    pub structured_replies: bool,
    /// Use `OFFSET_HOLE` chunks for ranges the export reports as zero.
    pub sparse_reads: bool,
}

/// Encodes the error reply for a request the server refused or that failed.
pub fn error_reply(
    cookie: u64,
    command: u16,
    error: u32,
    message: &str,
    options: ReplyOptions,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + message.len().min(1024));
    // Structured replies are mandatory for READ, and carry the message for BLOCK_STATUS; other
    // commands get a simple reply, which every client understands.
    if options.structured_replies && matches!(command, NBD_CMD_READ | NBD_CMD_BLOCK_STATUS) {
        put_error_chunk(&mut out, cookie, error, message);
    } else {
        put_simple_reply(&mut out, cookie, error);
    }
    out
}

fn ok_reply(cookie: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIMPLE_REPLY_HEADER_LEN);
    put_simple_reply(&mut out, cookie, 0);
    out
}

/// Runs `command` (already validated against the session) and returns the reply bytes.
/// `payload` is the data of a WRITE and empty otherwise. Offsets and lengths need not be
/// multiples of 512 (a session without negotiated block sizes): such requests are widened to
/// whole sectors here, their writes under `locks` (the export's; see `sectors`).
pub(crate) fn execute(
    export: &dyn Export,
    locks: &SectorLocks,
    cookie: u64,
    command: Command,
    payload: &[u8],
    options: ReplyOptions,
    buffers: &PayloadBuffers,
) -> Vec<u8> {
    let code = command_code(command);
    let started = std::time::Instant::now();
    let reply = match catch_unwind(AssertUnwindSafe(|| {
        execute_inner(export, locks, cookie, command, payload, options, buffers)
    })) {
        Ok(reply) => reply,
        Err(_) => panicked_reply(export, cookie, code, options),
    };
    record(export, &command, started, reply)
}

/// The reply to a request whose export panicked (logged).
fn panicked_reply(export: &dyn Export, cookie: u64, code: u16, options: ReplyOptions) -> Vec<u8> {
    tracing::error!(
        export = export.name(),
        command = command_name(code),
        "export panicked"
    );
    error_reply(
        cookie,
        code,
        NBD_EIO,
        "internal error in the export",
        options,
    )
}

/// Counts a request's time and outcome in the export's statistics; returns its reply.
fn record(
    export: &dyn Export,
    command: &Command,
    started: std::time::Instant,
    reply: Vec<u8>,
) -> Vec<u8> {
    crate::stats::ExportStatsRegistry::global().record(
        export.name(),
        command,
        started.elapsed(),
        &reply,
    );
    reply
}

/// Longest READ answered on the calling thread (`try_execute_now`).
const NOW_READ_MAX_BYTES: u32 = 128 * 1024;

/// Runs a request at once on the calling thread if the export does it without blocking: a
/// WRITE without FUA (`Export::try_write_now`) whose sectors no read-modify-write holds, or a
/// READ of whole sectors, at most `NOW_READ_MAX_BYTES`, not planned as a sparse read
/// (`Export::try_read_now`).
/// `None` otherwise (nothing was written, and a declined read left nothing the client sees:
/// the caller runs `execute` on the blocking pool).
pub(crate) fn try_execute_now(
    export: &dyn Export,
    locks: &SectorLocks,
    cookie: u64,
    command: Command,
    payload: &[u8],
    options: ReplyOptions,
    buffers: &PayloadBuffers,
) -> Option<Vec<u8>> {
    let started = std::time::Instant::now();
    let reply = match command {
        Command::Write {
            offset, fua: false, ..
        } => try_write_now(export, locks, cookie, offset, payload, options)?,
        Command::Read { offset, length, df } => {
            try_read_now(export, cookie, offset, length, df, options, buffers)?
        }
        _ => return None,
    };
    Some(record(export, &command, started, reply))
}

fn try_write_now(
    export: &dyn Export,
    locks: &SectorLocks,
    cookie: u64,
    offset: u64,
    payload: &[u8],
    options: ReplyOptions,
) -> Option<Vec<u8>> {
    let _guard = locks.try_lock_aligned(offset, offset + payload.len() as u64)?;
    Some(
        match catch_unwind(AssertUnwindSafe(|| export.try_write_now(offset, payload))) {
            Ok(None) => return None,
            Ok(Some(Ok(()))) => ok_reply(cookie),
            Ok(Some(Err(error))) => {
                let nbd_error = nbd_error_from_io(&error, false);
                tracing::debug!(export = export.name(), command = "write", %error, "request failed");
                error_reply(
                    cookie,
                    NBD_CMD_WRITE,
                    nbd_error,
                    &error.to_string(),
                    options,
                )
            }
            Err(_) => panicked_reply(export, cookie, NBD_CMD_WRITE, options),
        },
    )
}

/// A READ's reply (one data chunk when structured) filled by `Export::try_read_now`.
fn try_read_now(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    df: bool,
    options: ReplyOptions,
    buffers: &PayloadBuffers,
) -> Option<Vec<u8>> {
    // The export is called with whole sectors only (`sectors::read` widens the others).
    if length == 0
        || length > NOW_READ_MAX_BYTES
        || reads_sparse(options, df, offset, length)
        || !sectors::is_aligned(offset, u64::from(length))
    {
        return None;
    }
    let (out, read) = data_reply(
        cookie,
        offset,
        length,
        options.structured_replies,
        buffers,
        |data| catch_unwind(AssertUnwindSafe(|| export.try_read_now(offset, data))),
    );
    if let Ok(Some(Ok(()))) = read {
        return Some(out);
    }
    buffers.give_back(out);
    match read {
        Ok(Some(Err(error))) => Some(read_error_reply(
            export, cookie, offset, length, &error, options,
        )),
        Err(_) => Some(panicked_reply(export, cookie, NBD_CMD_READ, options)),
        Ok(_) => None,
    }
}

fn command_code(command: Command) -> u16 {
    match command {
        Command::Read { .. } => NBD_CMD_READ,
        Command::Write { .. } => NBD_CMD_WRITE,
        Command::Disconnect => NBD_CMD_DISC,
        Command::Flush => NBD_CMD_FLUSH,
        Command::Trim { .. } => NBD_CMD_TRIM,
        Command::Cache { .. } => NBD_CMD_CACHE,
        Command::WriteZeroes { .. } => NBD_CMD_WRITE_ZEROES,
        Command::BlockStatus { .. } => NBD_CMD_BLOCK_STATUS,
    }
}

fn execute_inner(
    export: &dyn Export,
    locks: &SectorLocks,
    cookie: u64,
    command: Command,
    payload: &[u8],
    options: ReplyOptions,
    buffers: &PayloadBuffers,
) -> Vec<u8> {
    let code = command_code(command);
    let simple = |result: std::io::Result<()>, allow_enotsup: bool| match result {
        Ok(()) => ok_reply(cookie),
        Err(error) => {
            let nbd_error = nbd_error_from_io(&error, allow_enotsup);
            tracing::debug!(export = export.name(), command = command_name(code), %error, "request failed");
            error_reply(cookie, code, nbd_error, &error.to_string(), options)
        }
    };
    match command {
        Command::Read { offset, length, df } => {
            read_reply(export, cookie, offset, length, df, options, buffers)
        }
        Command::Write { offset, fua, .. } => {
            if payload.is_empty() {
                return ok_reply(cookie);
            }
            simple(sectors::write(export, locks, offset, payload, fua), false)
        }
        Command::Flush => simple(export.flush(), false),
        Command::Trim {
            offset,
            length,
            fua,
        } => {
            if length == 0 {
                return ok_reply(cookie);
            }
            simple(
                sectors::trim(export, locks, offset, u64::from(length), fua),
                false,
            )
        }
        Command::WriteZeroes {
            offset,
            length,
            no_hole,
            fua,
            fast,
        } => {
            if length == 0 {
                return ok_reply(cookie);
            }
            simple(
                sectors::write_zeroes(export, locks, offset, u64::from(length), no_hole, fua),
                fast,
            )
        }
        Command::Cache { .. } | Command::Disconnect => ok_reply(cookie),
        Command::BlockStatus {
            offset,
            length,
            req_one,
        } => block_status_reply(export, cookie, offset, length, req_one, options),
    }
}

// ---------------------------------------------------------------------------------------------
// READ
// ---------------------------------------------------------------------------------------------

/// One piece of a planned read: data to read, or a range known to read as zeroes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    pub offset: u64,
    pub length: u64,
    pub hole: bool,
}

/// Splits `[offset, offset+length)` into data and hole pieces from block-status extents (as an
/// export returned them, starting at `offset`). Holes that are short or not 512-aligned become
/// data; what the extents do not cover is data. Pure and total.
pub fn plan_read(offset: u64, length: u64, extents: &[(u64, Allocation)]) -> Vec<ReadPiece> {
    let end = offset.saturating_add(length);
    let mut raw: Vec<ReadPiece> = Vec::new();
    let mut position = offset;
    for &(extent_len, allocation) in extents {
        if position >= end {
            break;
        }
        if extent_len == 0 {
            break;
        }
        let take = extent_len.min(end - position);
        raw.push(ReadPiece {
            offset: position,
            length: take,
            hole: allocation != Allocation::Data,
        });
        position += take;
    }
    if position < end {
        raw.push(ReadPiece {
            offset: position,
            length: end - position,
            hole: false,
        });
    }
    let block = u64::from(MIN_BLOCK_SIZE);
    let mut pieces: Vec<ReadPiece> = Vec::with_capacity(raw.len());
    for mut piece in raw {
        if piece.hole
            && (piece.length < SPARSE_HOLE_MIN_LEN
                || piece.offset % block != 0
                || piece.length % block != 0)
        {
            piece.hole = false;
        }
        match pieces.last_mut() {
            Some(last) if last.hole == piece.hole && last.offset + last.length == piece.offset => {
                last.length += piece.length;
            }
            _ => pieces.push(piece),
        }
    }
    pieces
}

/// Collects block-status extents for a read, calling the export until the range is covered (or a
/// bound is hit). Errors are not fatal: the uncovered rest is simply read as data.
fn gather_extents(export: &dyn Export, offset: u64, length: u64) -> Vec<(u64, Allocation)> {
    let mut extents = Vec::new();
    let mut covered = 0u64;
    for _ in 0..SPARSE_PLAN_MAX_CALLS {
        if covered >= length {
            break;
        }
        let Ok(batch) = export.block_status(offset + covered, length - covered) else {
            break;
        };
        let before = covered;
        for (extent_len, allocation) in batch {
            if extent_len == 0 || covered >= length {
                break;
            }
            let take = extent_len.min(length - covered);
            extents.push((take, allocation));
            covered += take;
        }
        if covered == before {
            break;
        }
        if extents.len() > MAX_BLOCK_STATUS_DESCRIPTORS {
            break;
        }
    }
    extents
}

/// The reply to a READ: a simple reply with the data, or structured reply chunks (with hole
/// chunks for the holes of a sparse read); an error reply if the export fails.
fn read_reply(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    df: bool,
    options: ReplyOptions,
    buffers: &PayloadBuffers,
) -> Vec<u8> {
    let read_error =
        |error: std::io::Error| read_error_reply(export, cookie, offset, length, &error, options);
    if !options.structured_replies {
        return simple_read_reply(export, cookie, offset, length, buffers)
            .unwrap_or_else(read_error);
    }
    if length == 0 {
        let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_LEN);
        put_done_chunk(&mut out, cookie);
        return out;
    }
    let pieces = if reads_sparse(options, df, offset, length) {
        plan_read(
            offset,
            u64::from(length),
            &gather_extents(export, offset, u64::from(length)),
        )
    } else {
        vec![ReadPiece {
            offset,
            length: u64::from(length),
            hole: false,
        }]
    };
    read_chunks(export, cookie, &pieces, buffers).unwrap_or_else(read_error)
}

/// A simple reply header followed by the `length` bytes at `offset`.
fn simple_read_reply(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    buffers: &PayloadBuffers,
) -> std::io::Result<Vec<u8>> {
    let (out, read) = data_reply(cookie, offset, length, false, buffers, |data| {
        if data.is_empty() {
            return Ok(());
        }
        sectors::read(export, offset, data)
    });
    read.map(|()| out)
}

/// A reply carrying the `length` bytes at `offset` in one piece: a simple reply, or with
/// `structured` one data chunk flagged done. `fill` puts the bytes in place; what it returns
/// comes back with the reply (whose data is unspecified unless `fill` succeeded).
fn data_reply<R>(
    cookie: u64,
    offset: u64,
    length: u32,
    structured: bool,
    buffers: &PayloadBuffers,
    fill: impl FnOnce(&mut [u8]) -> R,
) -> (Vec<u8>, R) {
    let header_len = if structured {
        STRUCTURED_REPLY_HEADER_LEN + 8
    } else {
        SIMPLE_REPLY_HEADER_LEN
    };
    let mut out = buffers.take(header_len + length as usize);
    if structured {
        put_chunk_header(
            &mut out,
            cookie,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_OFFSET_DATA,
            8 + length,
        );
        out.extend_from_slice(&offset.to_be_bytes());
    } else {
        put_simple_reply(&mut out, cookie, 0);
    }
    out.resize(header_len + length as usize, 0);
    let filled = fill(&mut out[header_len..]);
    (out, filled)
}

/// Whether a READ is answered as a sparse read (holes sent as hole chunks): structured
/// replies with sparse reads on, no DF flag, long enough, and aligned (the export is asked
/// for block status at the read's offset).
fn reads_sparse(options: ReplyOptions, df: bool, offset: u64, length: u32) -> bool {
    options.structured_replies
        && options.sparse_reads
        && !df
        && length >= SPARSE_READ_MIN_LEN
        && offset % u64::from(MIN_BLOCK_SIZE) == 0
        && length % MIN_BLOCK_SIZE == 0
}

/// The error reply to a READ whose export call failed.
fn read_error_reply(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    error: &std::io::Error,
    options: ReplyOptions,
) -> Vec<u8> {
    tracing::debug!(export = export.name(), offset, length, %error, "read failed");
    error_reply(
        cookie,
        NBD_CMD_READ,
        nbd_error_from_io(error, false),
        &error.to_string(),
        options,
    )
}

/// One structured reply chunk per piece (a hole chunk, or a data chunk with the bytes read),
/// the last one flagged done.
fn read_chunks(
    export: &dyn Export,
    cookie: u64,
    pieces: &[ReadPiece],
    buffers: &PayloadBuffers,
) -> std::io::Result<Vec<u8>> {
    let total: usize = pieces
        .iter()
        .map(|piece| {
            STRUCTURED_REPLY_HEADER_LEN
                + if piece.hole {
                    12
                } else {
                    8 + piece.length as usize
                }
        })
        .sum();
    let mut out = buffers.take(total);
    let last = pieces.len().saturating_sub(1);
    for (index, piece) in pieces.iter().enumerate() {
        let flags = if index == last {
            NBD_REPLY_FLAG_DONE
        } else {
            0
        };
        // Piece lengths are at most the request's length, a u32.
        let piece_len = piece.length as u32;
        if piece.hole {
            put_chunk_header(&mut out, cookie, flags, NBD_REPLY_TYPE_OFFSET_HOLE, 12);
            out.extend_from_slice(&piece.offset.to_be_bytes());
            out.extend_from_slice(&piece_len.to_be_bytes());
        } else {
            put_chunk_header(
                &mut out,
                cookie,
                flags,
                NBD_REPLY_TYPE_OFFSET_DATA,
                8 + piece_len,
            );
            out.extend_from_slice(&piece.offset.to_be_bytes());
            let start = out.len();
            out.resize(start + piece.length as usize, 0);
            sectors::read(export, piece.offset, &mut out[start..])?;
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// BLOCK_STATUS
// ---------------------------------------------------------------------------------------------

/// Turns extents from an export into `base:allocation` descriptors for a request of `length`
/// bytes: zero-length extents end the list, the total is clipped to `length`, neighbours with the
/// same flags merge, at most `MAX_BLOCK_STATUS_DESCRIPTORS` (1024) are kept, and every descriptor ends
/// on a 512-byte boundary (a misaligned answer is cut back to its last aligned boundary, or
/// replaced by one "allocated, contents unknown" descriptor). Always returns at least one
/// descriptor when `length > 0`. Pure and total.
pub fn block_status_descriptors(
    length: u32,
    extents: &[(u64, Allocation)],
    req_one: bool,
) -> Vec<(u32, u32)> {
    let block = u64::from(MIN_BLOCK_SIZE);
    let total = u64::from(length);
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut covered = 0u64;
    for &(extent_len, allocation) in extents {
        if extent_len == 0 || covered >= total {
            break;
        }
        let take = extent_len.min(total - covered);
        let flags = allocation.nbd_flags();
        match descriptors.last_mut() {
            Some(last) if last.1 == flags => last.0 += take as u32,
            _ => {
                if descriptors.len() == MAX_BLOCK_STATUS_DESCRIPTORS {
                    break;
                }
                descriptors.push((take as u32, flags));
            }
        }
        covered += take;
    }
    // Keep only descriptors ending on a block boundary.
    let mut end = 0u64;
    let mut keep = 0usize;
    for (index, &(len, _)) in descriptors.iter().enumerate() {
        end += u64::from(len);
        if end % block == 0 {
            keep = index + 1;
        } else {
            break;
        }
    }
    descriptors.truncate(keep);
    if descriptors.is_empty() && total > 0 {
        // Status 0 ("allocated, contents unknown") is always a truthful answer.
        let first = extents
            .first()
            .map_or(total, |&(len, _)| len.clamp(1, total));
        let rounded = first.div_ceil(block).saturating_mul(block).min(total);
        descriptors.push((rounded as u32, 0));
    }
    if req_one {
        descriptors.truncate(1);
    }
    descriptors
}

fn block_status_reply(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    req_one: bool,
    options: ReplyOptions,
) -> Vec<u8> {
    // An unaligned range (no negotiated block sizes) is asked for whole sectors, and the
    // answer cut back to the range.
    let (start, widened) = sectors::widen(offset, length);
    let extents = match export.block_status(start, u64::from(widened)) {
        Ok(extents) => extents,
        Err(error) => {
            return error_reply(
                cookie,
                NBD_CMD_BLOCK_STATUS,
                nbd_error_from_io(&error, false),
                &error.to_string(),
                options,
            )
        }
    };
    let descriptors = sectors::narrow_descriptors(
        block_status_descriptors(widened, &extents, req_one),
        (offset - start) as u32,
        length,
    );
    let payload_len = 4 + 8 * descriptors.len();
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_LEN + payload_len);
    put_chunk_header(
        &mut out,
        cookie,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_BLOCK_STATUS,
        payload_len as u32,
    );
    out.extend_from_slice(&BASE_ALLOCATION_CONTEXT_ID.to_be_bytes());
    for (len, flags) in descriptors {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Allocation::*;

    #[test]
    fn plan_read_merges_and_demotes() {
        let pieces = plan_read(
            0,
            65536,
            &[
                (4096, Data),
                (8192, Hole),
                (4096, Zero),
                (512, Hole),
                (1 << 20, Data),
            ],
        );
        assert_eq!(
            pieces,
            vec![
                ReadPiece {
                    offset: 0,
                    length: 4096,
                    hole: false
                },
                ReadPiece {
                    offset: 4096,
                    length: 12288,
                    hole: true
                },
                ReadPiece {
                    offset: 16384,
                    length: 65536 - 16384,
                    hole: false
                },
            ]
        );
        // Uncovered tail is data; zero-length extents stop the walk.
        assert_eq!(
            plan_read(4096, 16384, &[(8192, Hole), (0, Hole), (4096, Hole)]),
            vec![
                ReadPiece {
                    offset: 4096,
                    length: 8192,
                    hole: true
                },
                ReadPiece {
                    offset: 12288,
                    length: 8192,
                    hole: false
                },
            ]
        );
        // Unaligned holes become data.
        assert_eq!(
            plan_read(0, 16384, &[(100, Data), (8192, Hole)]),
            vec![ReadPiece {
                offset: 0,
                length: 16384,
                hole: false
            }]
        );
    }

    #[test]
    fn descriptors_are_clipped_merged_and_aligned() {
        assert_eq!(
            block_status_descriptors(
                8192,
                &[(4096, Data), (2048, Zero), (2048, Zero), (1 << 30, Hole)],
                false
            ),
            vec![(4096, 0), (4096, NBD_STATE_ZERO)]
        );
        assert_eq!(
            block_status_descriptors(8192, &[(1 << 40, Hole)], false),
            vec![(8192, 3)]
        );
        assert_eq!(block_status_descriptors(8192, &[], false), vec![(8192, 0)]);
        assert_eq!(
            block_status_descriptors(8192, &[(100, Hole)], false),
            vec![(512, 0)]
        );
        assert_eq!(
            block_status_descriptors(8192, &[(512, Hole), (100, Data), (4096, Hole)], false),
            vec![(512, 3)]
        );
        assert_eq!(
            block_status_descriptors(8192, &[(4096, Data), (4096, Hole)], true),
            vec![(4096, 0)]
        );
    }
}
