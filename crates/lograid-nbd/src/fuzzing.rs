//! One entry point that drives every parser of network bytes with arbitrary input: used by the
//! cargo-fuzz target `fuzz/fuzz_targets/nbd_proto.rs` and by a random-input test; and one for
//! the attachments state file (`fuzz/fuzz_targets/attach_state.rs`).
//!
//! Owns nothing of the server; it only strings together the pure pieces (client flags, option
//! headers and data, the negotiation state machine, request validation, and reply building
//! against a stub export) the way a connection would. Must never do I/O.

use crate::buffers::{KeptBudget, PayloadBuffers};
use std::io;
use std::sync::Arc;

use crate::dispatch::{block_status_descriptors, execute, plan_read, ReplyOptions};
use crate::export::{Allocation, Export};
use crate::negotiate::{ExportRegistry, Negotiation, NegotiationPolicy, Session, Step};
use crate::proto::*;
use crate::tls::TlsMode;

/// Requests longer than this are validated but not executed (keeps each run fast).
const MAX_EXECUTED_LEN: u32 = 1 << 20;

/// An export whose answers come from the fuzz input.
struct StubExport {
    name: &'static str,
    size_bytes: u64,
    extents: Vec<(u64, Allocation)>,
    read_only: bool,
}

impl Export for StubExport {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "stub export for fuzzing"
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        assert!(
            offset % 512 == 0 && buf.len() % 512 == 0,
            "unaligned read reached the export"
        );
        assert!(
            offset + buf.len() as u64 <= self.size_bytes,
            "read past the end reached the export"
        );
        buf.fill(0xa5);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        assert!(
            offset % 512 == 0 && data.len() % 512 == 0,
            "unaligned write reached the export"
        );
        assert!(
            offset + data.len() as u64 <= self.size_bytes,
            "write past the end reached the export"
        );
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, length: u64, _fua: bool) -> io::Result<()> {
        assert!(
            offset + length <= self.size_bytes,
            "trim past the end reached the export"
        );
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, length: u64, _no_hole: bool, _fua: bool) -> io::Result<()> {
        assert!(
            offset + length <= self.size_bytes,
            "zeroing past the end reached the export"
        );
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<(u64, Allocation)>> {
        assert!(
            offset + length <= self.size_bytes,
            "block status past the end reached the export"
        );
        Ok(self.extents.clone())
    }
}

fn take<'a>(data: &mut &'a [u8], count: usize) -> Option<&'a [u8]> {
    if data.len() < count {
        return None;
    }
    let (head, tail) = data.split_at(count);
    *data = tail;
    Some(head)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |raw| {
        u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]])
    })
}

fn extents_from(bytes: &[u8]) -> Vec<(u64, Allocation)> {
    bytes
        .chunks(3)
        .take(64)
        .map(|chunk| {
            let length =
                u64::from(u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)])) * 64;
            let allocation = match chunk.get(2).copied().unwrap_or(0) % 3 {
                0 => Allocation::Data,
                1 => Allocation::Zero,
                _ => Allocation::Hole,
            };
            (length, allocation)
        })
        .collect()
}

/// How far one input got (lets the random-input test check its own coverage).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuzzReach {
    pub reached_transmission: bool,
    pub requests_validated: u32,
    pub requests_executed: u32,
}

/// Feeds `input` through every parser and state machine a connection uses. Panics only on a bug.
pub fn fuzz_protocol(input: &[u8]) -> FuzzReach {
    let mut reach = FuzzReach::default();
    parse_alone(input);

    // A whole session: a header byte string picks the export shape, then options, then requests.
    let mut data = input;
    let Some(SessionSetup {
        mut negotiation,
        sparse_reads,
    }) = set_up_session(&mut data)
    else {
        return reach;
    };
    let Some(session) = haggle(&mut data, &mut negotiation) else {
        return reach;
    };
    reach.reached_transmission = true;
    let options = ReplyOptions {
        structured_replies: session.limits.structured_replies,
        sparse_reads,
    };
    transmit(&mut data, &session, options, &mut reach);
    reach
}

/// The stand-alone parsers over the raw input.
fn parse_alone(input: &[u8]) {
    if let Some(raw) = input.get(0..4) {
        let _ = parse_client_flags(&[raw[0], raw[1], raw[2], raw[3]]);
    }
    if let Some(raw) = input.get(0..OPTION_HEADER_LEN) {
        let mut header = [0u8; OPTION_HEADER_LEN];
        header.copy_from_slice(raw);
        let _ = parse_option_header(&header);
    }
    if let Some(raw) = input.get(0..REQUEST_HEADER_LEN) {
        let mut header = [0u8; REQUEST_HEADER_LEN];
        header.copy_from_slice(raw);
        let _ = parse_request(&header);
    }
    for option in [
        NBD_OPT_EXPORT_NAME,
        NBD_OPT_INFO,
        NBD_OPT_GO,
        NBD_OPT_LIST,
        NBD_OPT_LIST_META_CONTEXT,
        NBD_OPT_SET_META_CONTEXT,
        NBD_OPT_STRUCTURED_REPLY,
    ] {
        let _ = parse_option(
            option,
            input
                .get(..input.len().min(MAX_OPTION_LEN as usize))
                .unwrap_or(&[]),
        );
    }
}

/// A session ready for option haggling.
struct SessionSetup {
    negotiation: Negotiation,
    sparse_reads: bool,
}

/// Takes the 8 setup bytes and the extents from the front of `data`: the shape of the export
/// "disk" (beside a fixed "other"), the client flags and the TLS policy.
fn set_up_session(data: &mut &[u8]) -> Option<SessionSetup> {
    let setup = take(data, 8)?;
    let size_bytes = u64::from(u32_at(setup, 0)) * 512 + u64::from(setup[4] & 0x7f);
    let read_only = setup[5] & 1 != 0;
    let sparse_reads = setup[5] & 2 != 0;
    let client = ClientFlags {
        fixed_newstyle: setup[6] & 1 != 0,
        no_zeroes: setup[6] & 2 != 0,
    };
    let extent_bytes = usize::from(setup[7] % 64) * 3;
    let extent_bytes = extent_bytes.min(data.len());
    let extents = extents_from(take(data, extent_bytes).unwrap_or(&[]));
    let _ = plan_read(512, u64::from(u32_at(setup, 0)), &extents);
    let _ = block_status_descriptors(u32_at(setup, 0), &extents, setup[7] & 1 != 0);

    let exports: Vec<Arc<dyn Export>> = vec![
        Arc::new(StubExport {
            name: "disk",
            size_bytes,
            extents: extents.clone(),
            read_only,
        }),
        Arc::new(StubExport {
            name: "other",
            size_bytes: 1 << 20,
            extents,
            read_only: false,
        }),
    ];
    let registry = ExportRegistry::new(exports).ok()?;
    let policy = NegotiationPolicy {
        read_only: false,
        max_payload: DEFAULT_MAX_PAYLOAD,
        default_max_payload: UNNEGOTIATED_MAX_PAYLOAD,
        // Mostly off, so that most sessions reach transmission.
        tls: match setup[6] >> 5 {
            6 => TlsMode::Optional,
            7 => TlsMode::Required,
            _ => TlsMode::Off,
        },
    };
    Some(SessionSetup {
        negotiation: Negotiation::new(registry, policy, client),
        sparse_reads,
    })
}

/// Options from `data` until the negotiation picks an export (`None`: it closed, or the input
/// ended).
fn haggle(data: &mut &[u8], negotiation: &mut Negotiation) -> Option<Session> {
    loop {
        let header = take(data, 8)?;
        let option = u32_at(header, 0) % 16;
        let announced = u32_at(header, 4);
        let step = if announced > MAX_OPTION_LEN {
            let (step, discard) = negotiation.oversized_option(OptionHeader {
                option,
                length: announced,
            });
            if discard {
                let skip = (announced as usize).min(data.len());
                let _ = take(data, skip);
            }
            step
        } else {
            let length = (announced as usize) % 512;
            let length = length.min(data.len());
            let body = take(data, length)?;
            negotiation.handle_option(option, body)
        };
        match step {
            Step::Reply(_) => continue,
            // As if the TLS handshake succeeded.
            Step::StartTls(_) => negotiation.tls_started(),
            Step::Close { .. } => return None,
            Step::Transmit { session, .. } => return Some(session),
        }
    }
}

/// Requests from `data` (without their magic) until it ends or one does not parse: each is
/// validated, and executed against the stub export unless longer than [`MAX_EXECUTED_LEN`].
fn transmit(data: &mut &[u8], session: &Session, options: ReplyOptions, reach: &mut FuzzReach) {
    // Replies go back to one pool for the whole input, as on a connection, so reused buffers
    // are fuzzed too.
    let buffers = PayloadBuffers::new(1 << 20, KeptBudget::new(1 << 20));
    while let Some(raw) = take(data, REQUEST_HEADER_LEN - 4) {
        let mut bytes = [0u8; REQUEST_HEADER_LEN];
        bytes[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        bytes[4..].copy_from_slice(raw);
        let Ok(header) = parse_request(&bytes) else {
            return;
        };
        reach.requests_validated += 1;
        match validate_request(&header, &session.limits) {
            Ok(command) => {
                let length = match command {
                    Command::Read { length, .. }
                    | Command::Write { length, .. }
                    | Command::Trim { length, .. }
                    | Command::Cache { length, .. }
                    | Command::WriteZeroes { length, .. }
                    | Command::BlockStatus { length, .. } => length,
                    Command::Disconnect | Command::Flush => 0,
                };
                if length <= MAX_EXECUTED_LEN {
                    let payload = match command {
                        Command::Write { length, .. } => vec![0u8; length as usize],
                        _ => Vec::new(),
                    };
                    reach.requests_executed += 1;
                    let reply = execute(
                        session.export.as_ref(),
                        &session.locks,
                        header.cookie,
                        command,
                        &payload,
                        options,
                        &buffers,
                    );
                    assert!(
                        reply.len() >= SIMPLE_REPLY_HEADER_LEN,
                        "reply shorter than a header"
                    );
                    buffers.give_back(reply);
                }
            }
            Err(rejection) => {
                assert!(rejection.error != 0, "rejection without an error value");
            }
        }
    }
}

/// Parses `text` as an attachments state file; whatever parses must format and parse back to
/// the same records (panics otherwise: a finding).
pub fn fuzz_attach_state(text: &str) {
    if let Ok(records) = crate::attach::parse_records(text) {
        let again = crate::attach::parse_records(&crate::attach::format_records(&records))
            .expect("formatted records parse");
        assert_eq!(again, records, "records changed in a round trip");
    }
}
