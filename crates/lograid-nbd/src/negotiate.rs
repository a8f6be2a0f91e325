//! Option haggling as a pure state machine: options in, reply bytes and a next step out.
//!
//! Owns: which options this server accepts and how it answers them (export list, INFO/GO with
//! `NBD_INFO_*`, structured replies, `base:allocation` metadata context), and the transmission
//! flags it advertises. Must never: do I/O or block (the connection code feeds it whole options
//! and writes out what it returns), or trust a length it did not check.

use std::sync::Arc;

use crate::export::Export;
use crate::proto::*;
use crate::sectors::SectorLocks;
use crate::tls::TlsMode;

/// Most options one client may send before the server gives up on it.
pub const MAX_OPTIONS_PER_HANDSHAKE: u32 = 1024;
/// Longest oversized option payload the server reads and discards to stay in step with the
/// client; anything longer ends the connection after the `NBD_REP_ERR_TOO_BIG` reply.
pub const MAX_DISCARDED_OPTION_LEN: u32 = 1024 * 1024;

/// The exports a server offers; the first one is the default export (empty name).
#[derive(Clone)]
pub struct ExportRegistry {
    exports: Vec<Arc<dyn Export>>,
    /// Per export (same index): the stripe locks every connection to it writes under.
    locks: Vec<Arc<SectorLocks>>,
}

/// Why a list of exports cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("no exports given")]
    Empty,
    #[error("export name {0:?} is empty, longer than 4096 bytes or contains NUL")]
    BadName(String),
    #[error("export name {0:?} is used twice")]
    Duplicate(String),
}

impl ExportRegistry {
    pub fn new(exports: Vec<Arc<dyn Export>>) -> Result<Self, RegistryError> {
        if exports.is_empty() {
            return Err(RegistryError::Empty);
        }
        for (index, export) in exports.iter().enumerate() {
            let name = export.name();
            if name.is_empty() || name.len() > MAX_STRING_LEN || name.contains('\0') {
                return Err(RegistryError::BadName(name.to_owned()));
            }
            if exports[..index].iter().any(|other| other.name() == name) {
                return Err(RegistryError::Duplicate(name.to_owned()));
            }
        }
        let locks = exports.iter().map(|_| Arc::default()).collect();
        Ok(ExportRegistry { exports, locks })
    }

    /// Index of the export a client means by `name` (empty: the default, the first one).
    pub fn find(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return Some(0);
        }
        self.exports.iter().position(|export| export.name() == name)
    }

    pub fn get(&self, index: usize) -> Option<&Arc<dyn Export>> {
        self.exports.get(index)
    }

    pub fn exports(&self) -> &[Arc<dyn Export>] {
        &self.exports
    }
}

/// Server-wide settings that shape what the handshake advertises.
#[derive(Clone, Copy, Debug)]
pub struct NegotiationPolicy {
    /// Serve every export read-only.
    pub read_only: bool,
    /// Maximum block size advertised, and largest READ/WRITE accepted, for a client that asks
    /// for block sizes.
    pub max_payload: u32,
    /// Largest READ/WRITE accepted from a client that does not ask for block sizes (at least
    /// `max_payload`).
    pub default_max_payload: u32,
    /// Whether `NBD_OPT_STARTTLS` is offered or required.
    pub tls: TlsMode,
}

/// What the transmission phase needs to know about the negotiated session.
#[derive(Clone)]
pub struct Session {
    pub export: Arc<dyn Export>,
    pub limits: SessionLimits,
    pub transmission_flags: u16,
    /// The export's stripe locks (shared with every other session on it).
    pub(crate) locks: Arc<SectorLocks>,
}

impl Session {
    /// The client asked for block sizes in its `NBD_OPT_GO`, and so keeps to 512-byte
    /// alignment and the advertised maximum payload.
    pub fn block_sizes_negotiated(&self) -> bool {
        self.limits.min_block_size > DEFAULT_MIN_BLOCK_SIZE
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("export", &self.export.name())
            .field("limits", &self.limits)
            .field("transmission_flags", &self.transmission_flags)
            .finish()
    }
}

/// The outcome of one option.
#[derive(Debug)]
pub enum Step {
    /// Send these bytes and read the next option.
    Reply(Vec<u8>),
    /// Send these bytes, then enter the transmission phase.
    Transmit { reply: Vec<u8>, session: Session },
    /// Send these bytes (possibly none), then close the connection.
    Close { reply: Vec<u8>, reason: String },
    /// Send these bytes (the `NBD_OPT_STARTTLS` acknowledgement), then run the TLS handshake as
    /// the server, call [`Negotiation::tls_started`] and read the next option over TLS.
    StartTls(Vec<u8>),
}

/// Size advertised for an export: rounded down to the minimum block size, so that every byte a
/// client can address is reachable with aligned requests.
pub fn advertised_size(export: &dyn Export) -> u64 {
    export.size_bytes() / u64::from(MIN_BLOCK_SIZE) * u64::from(MIN_BLOCK_SIZE)
}

/// Transmission flags for a session.
pub fn transmission_flags(read_only: bool, structured_replies: bool) -> u16 {
    let mut flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_CAN_MULTI_CONN;
    if read_only {
        flags |= NBD_FLAG_READ_ONLY;
    } else {
        flags |= NBD_FLAG_SEND_FUA
            | NBD_FLAG_SEND_TRIM
            | NBD_FLAG_SEND_WRITE_ZEROES
            | NBD_FLAG_SEND_FAST_ZERO;
    }
    if structured_replies {
        flags |= NBD_FLAG_SEND_DF;
    }
    flags
}

/// One client's haggling state.
pub struct Negotiation {
    registry: ExportRegistry,
    policy: NegotiationPolicy,
    client: ClientFlags,
    structured_replies: bool,
    /// Export index for which `base:allocation` is selected.
    meta_context_export: Option<usize>,
    options_seen: u32,
    /// The connection is encrypted.
    tls_active: bool,
}

impl Negotiation {
    pub fn new(registry: ExportRegistry, policy: NegotiationPolicy, client: ClientFlags) -> Self {
        Negotiation {
            registry,
            policy,
            client,
            structured_replies: false,
            meta_context_export: None,
            options_seen: 0,
            tls_active: false,
        }
    }

    /// Records that the TLS handshake succeeded. Everything negotiated in plaintext is forgotten
    /// (a man in the middle could have injected it; compare nbdkit's CVE-2021-3716).
    pub fn tls_started(&mut self) {
        debug_assert!(!self.tls_active, "TLS started twice");
        self.tls_active = true;
        self.structured_replies = false;
        self.meta_context_export = None;
    }

    /// Whether the connection is encrypted.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// With TLS required and not yet active: the answer to any option but STARTTLS and ABORT.
    fn tls_required(&self, option: u32) -> Option<Step> {
        if self.policy.tls != TlsMode::Required || self.tls_active {
            return None;
        }
        match option {
            NBD_OPT_STARTTLS | NBD_OPT_ABORT => None,
            // EXPORT_NAME cannot be answered with an error.
            NBD_OPT_EXPORT_NAME => Some(Step::Close {
                reply: Vec::new(),
                reason: "NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS; this server requires TLS"
                    .into(),
            }),
            _ => Some(Step::Reply(error_reply(
                option,
                NBD_REP_ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            ))),
        }
    }

    /// Handles an option whose announced length exceeds [`MAX_OPTION_LEN`]; the data has not been
    /// read. Returns the step and whether the caller must read and discard `length` bytes before
    /// continuing (only with `Step::Reply`).
    pub fn oversized_option(&mut self, header: OptionHeader) -> (Step, bool) {
        if header.option == NBD_OPT_EXPORT_NAME {
            // EXPORT_NAME cannot be answered with an error.
            return (
                Step::Close {
                    reply: Vec::new(),
                    reason: format!("NBD_OPT_EXPORT_NAME of {} bytes", header.length),
                },
                false,
            );
        }
        let reply = error_reply(
            header.option,
            NBD_REP_ERR_TOO_BIG,
            &format!(
                "option data of {} bytes; at most {MAX_OPTION_LEN} accepted",
                header.length
            ),
        );
        if header.length <= MAX_DISCARDED_OPTION_LEN {
            (Step::Reply(reply), true)
        } else {
            (
                Step::Close {
                    reply,
                    reason: format!("option data of {} bytes", header.length),
                },
                false,
            )
        }
    }

    /// Handles one complete option (`data.len() <= MAX_OPTION_LEN`).
    pub fn handle_option(&mut self, option: u32, data: &[u8]) -> Step {
        self.options_seen = self.options_seen.saturating_add(1);
        if self.options_seen > MAX_OPTIONS_PER_HANDSHAKE {
            return Step::Close {
                reply: Vec::new(),
                reason: format!("more than {MAX_OPTIONS_PER_HANDSHAKE} options"),
            };
        }
        if let Some(step) = self.tls_required(option) {
            return step;
        }
        let parsed = match parse_option(option, data) {
            Ok(parsed) => parsed,
            Err(error) => {
                if option == NBD_OPT_EXPORT_NAME {
                    return Step::Close {
                        reply: Vec::new(),
                        reason: format!("bad NBD_OPT_EXPORT_NAME: {}", error.message),
                    };
                }
                if option == NBD_OPT_SET_META_CONTEXT {
                    // A failed SET still replaces the selection.
                    self.meta_context_export = None;
                }
                return Step::Reply(error_reply(option, error.reply, &error.message));
            }
        };
        match parsed {
            ClientOption::ExportName(name) => self.export_name(&name),
            ClientOption::Abort => Step::Close {
                reply: option_reply(option, NBD_REP_ACK, &[]),
                reason: "client sent NBD_OPT_ABORT".into(),
            },
            ClientOption::List => Step::Reply(self.list(option)),
            ClientOption::StartTls if self.policy.tls == TlsMode::Off => Step::Reply(error_reply(
                option,
                NBD_REP_ERR_UNSUP,
                "TLS is not configured on this server",
            )),
            ClientOption::StartTls if self.tls_active => Step::Reply(error_reply(
                option,
                NBD_REP_ERR_INVALID,
                "TLS is already active on this connection",
            )),
            ClientOption::StartTls => Step::StartTls(option_reply(option, NBD_REP_ACK, &[])),
            ClientOption::Info { go, name, requests } => self.info(option, go, &name, &requests),
            ClientOption::StructuredReply => {
                self.structured_replies = true;
                Step::Reply(option_reply(option, NBD_REP_ACK, &[]))
            }
            ClientOption::MetaContext {
                set,
                export,
                queries,
            } => Step::Reply(self.meta_context(option, set, &export, &queries)),
            ClientOption::Unsupported(code) => Step::Reply(error_reply(
                code,
                NBD_REP_ERR_UNSUP,
                &format!("option {code} ({}) is not supported", option_name(code)),
            )),
        }
    }

    /// The size constraints of a session: the advertised ones if the client asked for block
    /// sizes (`block_sizes`), the protocol's defaults (as far as this server goes) if not.
    /// Returns (minimum, maximum payload).
    fn size_constraints(&self, block_sizes: bool) -> (u32, u32) {
        if block_sizes {
            (MIN_BLOCK_SIZE, self.policy.max_payload)
        } else {
            (
                DEFAULT_MIN_BLOCK_SIZE,
                self.policy.default_max_payload.max(self.policy.max_payload),
            )
        }
    }

    fn session(&self, index: usize, block_sizes: bool) -> Option<Session> {
        let export = self.registry.get(index)?.clone();
        let locks = self.registry.locks.get(index)?.clone();
        let read_only = self.policy.read_only || export.read_only();
        let (min_block_size, max_payload) = self.size_constraints(block_sizes);
        let limits = SessionLimits {
            size_bytes: advertised_size(export.as_ref()),
            read_only,
            structured_replies: self.structured_replies,
            block_status: self.structured_replies && self.meta_context_export == Some(index),
            max_payload,
            min_block_size,
        };
        Some(Session {
            export,
            limits,
            transmission_flags: transmission_flags(read_only, self.structured_replies),
            locks,
        })
    }

    fn export_name(&self, name: &str) -> Step {
        let Some(session) = self
            .registry
            .find(name)
            // No block sizes asked for: the protocol's defaults.
            .and_then(|index| self.session(index, false))
        else {
            return Step::Close {
                reply: Vec::new(),
                reason: format!("NBD_OPT_EXPORT_NAME for unknown export {name:?}"),
            };
        };
        let mut reply = Vec::with_capacity(134);
        reply.extend_from_slice(&session.limits.size_bytes.to_be_bytes());
        reply.extend_from_slice(&session.transmission_flags.to_be_bytes());
        if !self.client.no_zeroes {
            reply.extend_from_slice(&[0u8; 124]);
        }
        Step::Transmit { reply, session }
    }

    fn list(&self, option: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for export in self.registry.exports() {
            let name = export.name().as_bytes();
            let description = description_string(export.as_ref());
            let description = description.as_bytes();
            let mut data = Vec::with_capacity(4 + name.len() + description.len());
            data.extend_from_slice(&(name.len() as u32).to_be_bytes());
            data.extend_from_slice(name);
            data.extend_from_slice(description);
            out.extend_from_slice(&option_reply(option, NBD_REP_SERVER, &data));
        }
        out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
        out
    }

    fn info(&self, option: u32, go: bool, name: &str, requests: &[u16]) -> Step {
        let Some(index) = self.registry.find(name) else {
            return Step::Reply(error_reply(
                option,
                NBD_REP_ERR_UNKNOWN,
                &format!("no export named {name:?}"),
            ));
        };
        // Only a GO that asks for block sizes commits the client to them (an INFO asking does
        // not, nor a GO that does not ask).
        let block_sizes = requests.contains(&NBD_INFO_BLOCK_SIZE);
        let Some(session) = self.session(index, go && block_sizes) else {
            return Step::Reply(error_reply(option, NBD_REP_ERR_UNKNOWN, "export vanished"));
        };
        let mut out = Vec::new();
        let mut export_info = Vec::with_capacity(12);
        export_info.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
        export_info.extend_from_slice(&session.limits.size_bytes.to_be_bytes());
        export_info.extend_from_slice(&session.transmission_flags.to_be_bytes());
        out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &export_info));

        if requests.contains(&NBD_INFO_NAME) {
            let mut data = NBD_INFO_NAME.to_be_bytes().to_vec();
            data.extend_from_slice(session.export.name().as_bytes());
            out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &data));
        }
        let description = description_string(session.export.as_ref());
        if requests.contains(&NBD_INFO_DESCRIPTION) && !description.is_empty() {
            let mut data = NBD_INFO_DESCRIPTION.to_be_bytes().to_vec();
            data.extend_from_slice(description.as_bytes());
            out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &data));
        }
        // Always sent. Asked for: 512 / 4096 / the maximum payload, which a GO commits the
        // client to. Not asked for: what this server takes from such a client (any alignment,
        // the larger maximum), which it need not read.
        let (minimum, maximum) = self.size_constraints(block_sizes);
        let mut block_size = NBD_INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        block_size.extend_from_slice(&minimum.to_be_bytes());
        block_size.extend_from_slice(&PREFERRED_BLOCK_SIZE.to_be_bytes());
        block_size.extend_from_slice(&maximum.to_be_bytes());
        out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &block_size));

        out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
        if go {
            Step::Transmit {
                reply: out,
                session,
            }
        } else {
            Step::Reply(out)
        }
    }

    fn meta_context(
        &mut self,
        option: u32,
        set: bool,
        export: &str,
        queries: &[String],
    ) -> Vec<u8> {
        if set {
            self.meta_context_export = None;
        }
        if !self.structured_replies {
            return error_reply(
                option,
                NBD_REP_ERR_INVALID,
                "negotiate NBD_OPT_STRUCTURED_REPLY first",
            );
        }
        let Some(index) = self.registry.find(export) else {
            return error_reply(
                option,
                NBD_REP_ERR_UNKNOWN,
                &format!("no export named {export:?}"),
            );
        };
        let matches = if set {
            // Only the full name selects; "base:" is a wildcard for listing only.
            queries.iter().any(|query| query == BASE_ALLOCATION)
        } else {
            queries.is_empty()
                || queries
                    .iter()
                    .any(|query| query == BASE_ALLOCATION || query == "base:")
        };
        let mut out = Vec::new();
        if matches {
            let context_id = if set { BASE_ALLOCATION_CONTEXT_ID } else { 0 };
            let mut data = context_id.to_be_bytes().to_vec();
            data.extend_from_slice(BASE_ALLOCATION.as_bytes());
            out.extend_from_slice(&option_reply(option, NBD_REP_META_CONTEXT, &data));
            if set {
                self.meta_context_export = Some(index);
            }
        }
        out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
        out
    }
}

/// An export's description as a protocol string: NUL bytes replaced, at most 4096 bytes.
fn description_string(export: &dyn Export) -> String {
    bounded_message(export.description()).replace('\0', " ")
}

fn error_reply(option: u32, reply_type: u32, message: &str) -> Vec<u8> {
    option_reply(option, reply_type, bounded_message(message).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem_export::MemExport;

    fn negotiation(tls: TlsMode) -> Negotiation {
        let registry = ExportRegistry::new(vec![
            Arc::new(MemExport::new("disk", 1 << 20)) as Arc<dyn Export>
        ])
        .unwrap();
        let policy = NegotiationPolicy {
            read_only: false,
            max_payload: DEFAULT_MAX_PAYLOAD,
            default_max_payload: UNNEGOTIATED_MAX_PAYLOAD,
            tls,
        };
        let client = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        };
        Negotiation::new(registry, policy, client)
    }

    /// The reply type of the first option reply in `bytes`.
    fn reply_type(bytes: &[u8]) -> u32 {
        u32::from_be_bytes(bytes[12..16].try_into().unwrap())
    }

    fn info_data(requests: &[u16]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&4u32.to_be_bytes());
        data.extend_from_slice(b"disk");
        data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for request in requests {
            data.extend_from_slice(&request.to_be_bytes());
        }
        data
    }

    fn go(n: &mut Negotiation) -> Step {
        n.handle_option(NBD_OPT_GO, &info_data(&[]))
    }

    /// (minimum, preferred, maximum) of the `NBD_INFO_BLOCK_SIZE` reply in `bytes`.
    fn block_size_info(bytes: &[u8]) -> (u32, u32, u32) {
        let mut rest = bytes;
        while rest.len() >= 20 {
            let length = u32::from_be_bytes(rest[16..20].try_into().unwrap()) as usize;
            let data = &rest[20..20 + length];
            if reply_type(rest) == NBD_REP_INFO && data[0..2] == NBD_INFO_BLOCK_SIZE.to_be_bytes() {
                let at = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().unwrap());
                return (at(2), at(6), at(10));
            }
            rest = &rest[20 + length..];
        }
        panic!("no NBD_INFO_BLOCK_SIZE reply");
    }

    #[test]
    fn only_a_go_asking_for_block_sizes_commits_the_client() {
        // GO asking: 512 / 4096 / 32 MiB, held to them.
        let mut n = negotiation(TlsMode::Off);
        let Step::Transmit { reply, session } =
            n.handle_option(NBD_OPT_GO, &info_data(&[NBD_INFO_BLOCK_SIZE]))
        else {
            panic!("expected transmission");
        };
        assert_eq!(block_size_info(&reply), (512, 4096, DEFAULT_MAX_PAYLOAD));
        assert!(session.block_sizes_negotiated());
        assert_eq!(session.limits.min_block_size, MIN_BLOCK_SIZE);
        assert_eq!(session.limits.max_payload, DEFAULT_MAX_PAYLOAD);

        // GO not asking: the defaults (any alignment, 64 MiB), and says so.
        let mut n = negotiation(TlsMode::Off);
        let Step::Transmit { reply, session } = go(&mut n) else {
            panic!("expected transmission");
        };
        assert_eq!(block_size_info(&reply), (1, 4096, UNNEGOTIATED_MAX_PAYLOAD));
        assert!(!session.block_sizes_negotiated());
        assert_eq!(session.limits.min_block_size, 1);
        assert_eq!(session.limits.max_payload, UNNEGOTIATED_MAX_PAYLOAD);

        // INFO asking shows what a GO asking would commit to, but commits nothing.
        let mut n = negotiation(TlsMode::Off);
        let Step::Reply(reply) = n.handle_option(NBD_OPT_INFO, &info_data(&[NBD_INFO_BLOCK_SIZE]))
        else {
            panic!("expected a reply");
        };
        assert_eq!(block_size_info(&reply), (512, 4096, DEFAULT_MAX_PAYLOAD));
        let Step::Transmit { session, .. } = go(&mut n) else {
            panic!("expected transmission");
        };
        assert!(!session.block_sizes_negotiated());

        // EXPORT_NAME cannot ask.
        let mut n = negotiation(TlsMode::Off);
        let Step::Transmit { session, .. } = n.handle_option(NBD_OPT_EXPORT_NAME, b"disk") else {
            panic!("expected transmission");
        };
        assert!(!session.block_sizes_negotiated());
        assert_eq!(session.limits.max_payload, UNNEGOTIATED_MAX_PAYLOAD);
    }

    #[test]
    fn starttls_is_unsupported_when_off() {
        let mut n = negotiation(TlsMode::Off);
        let Step::Reply(bytes) = n.handle_option(NBD_OPT_STARTTLS, &[]) else {
            panic!("expected a reply");
        };
        assert_eq!(reply_type(&bytes), NBD_REP_ERR_UNSUP);
    }

    #[test]
    fn required_tls_refuses_everything_before_starttls() {
        let mut n = negotiation(TlsMode::Required);
        for option in [
            NBD_OPT_LIST,
            NBD_OPT_INFO,
            NBD_OPT_GO,
            NBD_OPT_STRUCTURED_REPLY,
            NBD_OPT_LIST_META_CONTEXT,
            NBD_OPT_SET_META_CONTEXT,
            99,
        ] {
            let Step::Reply(bytes) = n.handle_option(option, &[]) else {
                panic!("option {option}: expected a reply");
            };
            assert_eq!(reply_type(&bytes), NBD_REP_ERR_TLS_REQD, "option {option}");
        }
        assert!(matches!(
            n.handle_option(NBD_OPT_EXPORT_NAME, b"disk"),
            Step::Close { .. }
        ));
        let mut n = negotiation(TlsMode::Required);
        assert!(matches!(
            n.handle_option(NBD_OPT_ABORT, &[]),
            Step::Close { .. }
        ));
        let mut n = negotiation(TlsMode::Required);
        let Step::Reply(bytes) = n.handle_option(NBD_OPT_STARTTLS, b"x") else {
            panic!("STARTTLS with data: expected an error reply");
        };
        assert_eq!(reply_type(&bytes), NBD_REP_ERR_INVALID);
        let Step::StartTls(bytes) = n.handle_option(NBD_OPT_STARTTLS, &[]) else {
            panic!("STARTTLS: expected the switch to TLS");
        };
        assert_eq!(reply_type(&bytes), NBD_REP_ACK);
        n.tls_started();
        assert!(matches!(go(&mut n), Step::Transmit { .. }));
    }

    #[test]
    fn starttls_forgets_plaintext_state_and_is_refused_twice() {
        let mut n = negotiation(TlsMode::Optional);
        assert!(matches!(
            n.handle_option(NBD_OPT_STRUCTURED_REPLY, &[]),
            Step::Reply(_)
        ));
        assert!(matches!(
            n.handle_option(NBD_OPT_STARTTLS, &[]),
            Step::StartTls(_)
        ));
        n.tls_started();
        assert!(n.tls_active());
        let Step::Reply(bytes) = n.handle_option(NBD_OPT_STARTTLS, &[]) else {
            panic!("second STARTTLS: expected an error reply");
        };
        assert_eq!(reply_type(&bytes), NBD_REP_ERR_INVALID);
        // Structured replies negotiated in plaintext do not survive the upgrade.
        let Step::Transmit { session, .. } = go(&mut n) else {
            panic!("expected transmission");
        };
        assert!(!session.limits.structured_replies);
        assert_eq!(session.transmission_flags & NBD_FLAG_SEND_DF, 0);
        // In optional mode a plaintext client is served.
        let mut n = negotiation(TlsMode::Optional);
        assert!(matches!(go(&mut n), Step::Transmit { .. }));
    }
}
