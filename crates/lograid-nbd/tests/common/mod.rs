//! Shared test harness: a server on a free loopback port in a background thread, a raw
//! synchronous NBD client for protocol and hostile-client tests, and helpers to run external
//! tools with a deadline.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lograid_nbd::mem_export::MemExport;
use lograid_nbd::proto::*;
use lograid_nbd::{
    Export, ListenAddr, Server, ServerConfig, ServerError, ShutdownHandle, StatsHandle,
};

pub const MIB: u64 = 1024 * 1024;

/// A config for tests: loopback port 0, short timeouts.
pub fn test_config() -> ServerConfig {
    ServerConfig {
        listen: vec![ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())],
        handshake_timeout: Duration::from_secs(3),
        payload_timeout: Duration::from_secs(3),
        reply_write_timeout: Duration::from_secs(3),
        blocking_threads: 16,
        shutdown_grace: Duration::from_secs(10),
        ..ServerConfig::default()
    }
}

/// A running server; shut down and joined on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: ShutdownHandle,
    pub stats: StatsHandle,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    pub fn start(config: ServerConfig, exports: Vec<Arc<dyn Export>>) -> TestServer {
        let server = Server::bind(config, exports).expect("bind");
        let addr = match &server.local_addrs()[0] {
            ListenAddr::Tcp(addr) => *addr,
            other => panic!("unexpected address {other:?}"),
        };
        let shutdown = server.shutdown_handle();
        let stats = server.stats_handle();
        let thread = std::thread::spawn(move || server.serve());
        TestServer {
            addr,
            shutdown,
            stats,
            thread: Some(thread),
        }
    }

    /// One MemExport called "disk0" of `size` bytes, default test config.
    pub fn with_mem(size: u64) -> (TestServer, Arc<MemExport>) {
        let export = Arc::new(MemExport::new("disk0", size));
        (
            TestServer::start(test_config(), vec![export.clone()]),
            export,
        )
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.addr, export)
    }

    /// Shuts down and returns the server's result.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.shutdown.shutdown();
        self.thread
            .take()
            .expect("thread")
            .join()
            .expect("server thread panicked")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Deterministic test data.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Raw client
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

/// One complete reply to a transmission request.
#[derive(Debug, Default, Clone)]
pub struct Reply {
    pub cookie: u64,
    /// 0 on success.
    pub error: u32,
    pub structured: bool,
    /// READ data, reassembled (holes filled with zeroes).
    pub data: Vec<u8>,
    /// Chunk types received, in order.
    pub chunk_types: Vec<u16>,
    /// Block-status descriptors (length, flags).
    pub extents: Vec<(u32, u32)>,
    pub context_id: u32,
    pub message: String,
}

/// (minimum, preferred, maximum) of an `NBD_INFO_BLOCK_SIZE` reply.
pub type BlockSizes = (u32, u32, u32);

#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    pub size: u64,
    pub flags: u16,
}

pub struct RawClient {
    pub stream: TcpStream,
    pending: HashMap<u64, (u16, u64, u32)>,
    pub structured: bool,
    next_cookie: u64,
}

impl RawClient {
    /// Connects and reads the server greeting.
    pub fn connect(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut client = RawClient {
            stream,
            pending: HashMap::new(),
            structured: false,
            next_cookie: 1,
        };
        let mut greeting = [0u8; 18];
        client.stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[0..8], &NBDMAGIC.to_be_bytes());
        assert_eq!(&greeting[8..16], &IHAVEOPT.to_be_bytes());
        assert_eq!(
            u16::from_be_bytes([greeting[16], greeting[17]]),
            NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES
        );
        client
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn send_client_flags(&mut self, flags: u32) {
        self.send(&flags.to_be_bytes());
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut out = Vec::new();
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.send(&out);
    }

    pub fn read_option_reply(&mut self) -> OptionReply {
        let mut header = [0u8; 20];
        self.stream
            .read_exact(&mut header)
            .expect("option reply header");
        assert_eq!(
            &header[0..8],
            &NBD_REP_MAGIC.to_be_bytes(),
            "option reply magic"
        );
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut data = vec![0u8; length as usize];
        self.stream
            .read_exact(&mut data)
            .expect("option reply data");
        OptionReply {
            option,
            reply_type,
            data,
        }
    }

    /// Reads option replies until a final one (ACK or error).
    pub fn read_option_replies(&mut self) -> Vec<OptionReply> {
        let mut replies = Vec::new();
        loop {
            let reply = self.read_option_reply();
            let last = reply.reply_type == NBD_REP_ACK || reply.reply_type & (1 << 31) != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    pub fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for request in requests {
            data.extend_from_slice(&request.to_be_bytes());
        }
        data
    }

    pub fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&(export.len() as u32).to_be_bytes());
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for query in queries {
            data.extend_from_slice(&(query.len() as u32).to_be_bytes());
            data.extend_from_slice(query.as_bytes());
        }
        data
    }

    /// Full handshake: fixed newstyle + no zeroes, optional structured replies and
    /// base:allocation, then NBD_OPT_GO asking for block sizes.
    pub fn open(
        addr: SocketAddr,
        export: &str,
        structured: bool,
        block_status: bool,
    ) -> (RawClient, Negotiated) {
        let (client, negotiated, _) = Self::open_go(
            addr,
            export,
            structured,
            block_status,
            &[NBD_INFO_BLOCK_SIZE],
        );
        (client, negotiated)
    }

    /// Like [`RawClient::open`], but NBD_OPT_GO does not ask for block sizes: the session gets
    /// the protocol's defaults. Also returns the (minimum, preferred, maximum) the server sent
    /// unasked, if it did.
    pub fn open_without_block_sizes(
        addr: SocketAddr,
        export: &str,
        structured: bool,
        block_status: bool,
    ) -> (RawClient, Negotiated, Option<BlockSizes>) {
        Self::open_go(addr, export, structured, block_status, &[])
    }

    /// Old-style negotiation: fixed newstyle + no zeroes, then NBD_OPT_EXPORT_NAME (simple
    /// replies only; no way to ask for block sizes).
    pub fn open_export_name(addr: SocketAddr, export: &str) -> (RawClient, Negotiated) {
        let mut client = RawClient::connect(addr);
        client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
        client.send_option(NBD_OPT_EXPORT_NAME, export.as_bytes());
        let mut reply = [0u8; 10];
        client
            .stream
            .read_exact(&mut reply)
            .expect("EXPORT_NAME reply");
        let size = u64::from_be_bytes(reply[0..8].try_into().unwrap());
        let flags = u16::from_be_bytes(reply[8..10].try_into().unwrap());
        (client, Negotiated { size, flags })
    }

    /// The handshake of [`RawClient::open`] with `requests` in NBD_OPT_GO; also returns the
    /// NBD_INFO_BLOCK_SIZE values received, if any.
    pub fn open_go(
        addr: SocketAddr,
        export: &str,
        structured: bool,
        block_status: bool,
        requests: &[u16],
    ) -> (RawClient, Negotiated, Option<BlockSizes>) {
        let mut client = RawClient::connect(addr);
        client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
        if structured {
            client.send_option(NBD_OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(client.read_option_reply().reply_type, NBD_REP_ACK);
            client.structured = true;
            if block_status {
                client.send_option(
                    NBD_OPT_SET_META_CONTEXT,
                    &Self::meta_data(export, &[BASE_ALLOCATION]),
                );
                let replies = client.read_option_replies();
                assert_eq!(replies.len(), 2, "{replies:?}");
                assert_eq!(replies[0].reply_type, NBD_REP_META_CONTEXT);
            }
        }
        client.send_option(NBD_OPT_GO, &Self::info_data(export, requests));
        let replies = client.read_option_replies();
        let last = replies.last().unwrap();
        assert_eq!(last.reply_type, NBD_REP_ACK, "GO failed: {replies:?}");
        let export_info = replies
            .iter()
            .find(|reply| {
                reply.reply_type == NBD_REP_INFO
                    && reply.data[0..2] == NBD_INFO_EXPORT.to_be_bytes()
            })
            .expect("NBD_INFO_EXPORT");
        let size = u64::from_be_bytes(export_info.data[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(export_info.data[10..12].try_into().unwrap());
        let block_sizes = replies
            .iter()
            .find(|reply| {
                reply.reply_type == NBD_REP_INFO
                    && reply.data[0..2] == NBD_INFO_BLOCK_SIZE.to_be_bytes()
            })
            .map(|reply| {
                let at = |i: usize| u32::from_be_bytes(reply.data[i..i + 4].try_into().unwrap());
                (at(2), at(6), at(10))
            });
        (client, Negotiated { size, flags }, block_sizes)
    }

    pub fn request_bytes(
        flags: u16,
        command: u16,
        cookie: u64,
        offset: u64,
        length: u32,
    ) -> [u8; 28] {
        encode_request(&RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        })
    }

    /// Sends a request (and its payload); returns the cookie.
    pub fn submit(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.pending.insert(cookie, (command, offset, length));
        let mut out = Self::request_bytes(flags, command, cookie, offset, length).to_vec();
        out.extend_from_slice(payload);
        self.send(&out);
        cookie
    }

    /// Reads one complete reply (all chunks of a structured reply).
    pub fn read_reply(&mut self) -> Reply {
        let mut magic = [0u8; 4];
        self.stream.read_exact(&mut magic).expect("reply magic");
        let magic = u32::from_be_bytes(magic);
        if magic == NBD_SIMPLE_REPLY_MAGIC {
            return self.read_simple_reply();
        }
        assert_eq!(magic, NBD_STRUCTURED_REPLY_MAGIC, "reply magic");
        assert!(self.structured, "structured reply without negotiation");
        self.read_structured_reply()
    }

    /// The rest of a simple reply, after its magic (and the data of a successful READ).
    fn read_simple_reply(&mut self) -> Reply {
        let mut rest = [0u8; 12];
        self.stream.read_exact(&mut rest).expect("simple reply");
        let error = u32::from_be_bytes(rest[0..4].try_into().unwrap());
        let cookie = u64::from_be_bytes(rest[4..12].try_into().unwrap());
        let (command, _, length) = self
            .pending
            .remove(&cookie)
            .expect("reply for an unknown cookie");
        let mut data = Vec::new();
        if command == NBD_CMD_READ && error == 0 {
            assert!(
                !self.structured,
                "simple reply to a READ after structured replies were negotiated"
            );
            data = vec![0u8; length as usize];
            self.stream.read_exact(&mut data).expect("read data");
        }
        Reply {
            cookie,
            error,
            data,
            ..Reply::default()
        }
    }

    /// The chunks of a structured reply, the first one after its magic.
    fn read_structured_reply(&mut self) -> Reply {
        let mut reply = Reply {
            structured: true,
            ..Reply::default()
        };
        let mut first = true;
        loop {
            if !first {
                let mut magic = [0u8; 4];
                self.stream.read_exact(&mut magic).expect("chunk magic");
                assert_eq!(u32::from_be_bytes(magic), NBD_STRUCTURED_REPLY_MAGIC);
            }
            let mut header = [0u8; 16];
            self.stream.read_exact(&mut header).expect("chunk header");
            let flags = u16::from_be_bytes(header[0..2].try_into().unwrap());
            let chunk_type = u16::from_be_bytes(header[2..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(header[4..12].try_into().unwrap());
            let length = u32::from_be_bytes(header[12..16].try_into().unwrap());
            if first {
                reply.cookie = cookie;
                let (_, _, len) = *self
                    .pending
                    .get(&cookie)
                    .expect("reply for an unknown cookie");
                reply.data = vec![0u8; len as usize];
            } else {
                assert_eq!(
                    cookie, reply.cookie,
                    "interleaved chunks are not expected in these tests"
                );
            }
            first = false;
            let mut payload = vec![0u8; length as usize];
            self.stream.read_exact(&mut payload).expect("chunk payload");
            reply.chunk_types.push(chunk_type);
            let (_, request_offset, request_len) = self.pending[&reply.cookie];
            apply_chunk(
                &mut reply,
                chunk_type,
                length,
                &payload,
                request_offset,
                request_len,
            );
            if flags & NBD_REPLY_FLAG_DONE != 0 {
                break;
            }
        }
        self.pending.remove(&reply.cookie);
        if reply.error != 0 {
            reply.data.clear();
        }
        reply
    }

    pub fn call(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = self.submit(flags, command, offset, length, payload);
        let reply = self.read_reply();
        assert_eq!(reply.cookie, cookie);
        reply
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Reply {
        self.call(0, NBD_CMD_READ, offset, length, &[])
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Reply {
        self.call(0, NBD_CMD_WRITE, offset, data.len() as u32, data)
    }

    pub fn flush(&mut self) -> Reply {
        self.call(0, NBD_CMD_FLUSH, 0, 0, &[])
    }

    pub fn disconnect(mut self) {
        let bytes = Self::request_bytes(0, NBD_CMD_DISC, 0, 0, 0);
        let _ = self.stream.write_all(&bytes);
        assert!(
            self.wait_closed(Duration::from_secs(5)),
            "server did not close after NBD_CMD_DISC"
        );
    }

    /// Whether the server closes the connection within `limit` (reads and discards until then).
    pub fn wait_closed(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}

/// Adds one chunk (of `chunk_type`, `length` bytes of `payload`) of the reply to a request for
/// `request_len` bytes at `request_offset` to `reply`.
fn apply_chunk(
    reply: &mut Reply,
    chunk_type: u16,
    length: u32,
    payload: &[u8],
    request_offset: u64,
    request_len: u32,
) {
    match chunk_type {
        NBD_REPLY_TYPE_NONE => assert_eq!(length, 0),
        NBD_REPLY_TYPE_OFFSET_DATA => {
            let offset = u64::from_be_bytes(payload[0..8].try_into().unwrap());
            let start = (offset - request_offset) as usize;
            let bytes = &payload[8..];
            assert!(
                start + bytes.len() <= request_len as usize,
                "data chunk outside the request"
            );
            reply.data[start..start + bytes.len()].copy_from_slice(bytes);
        }
        NBD_REPLY_TYPE_OFFSET_HOLE => {
            assert_eq!(length, 12);
            let offset = u64::from_be_bytes(payload[0..8].try_into().unwrap());
            let size = u32::from_be_bytes(payload[8..12].try_into().unwrap());
            assert!(size > 0);
            let start = (offset - request_offset) as usize;
            assert!(
                start + size as usize <= request_len as usize,
                "hole chunk outside the request"
            );
            reply.data[start..start + size as usize].fill(0);
        }
        NBD_REPLY_TYPE_BLOCK_STATUS => {
            assert!(length >= 12 && (length - 4) % 8 == 0);
            reply.context_id = u32::from_be_bytes(payload[0..4].try_into().unwrap());
            for descriptor in payload[4..].chunks(8) {
                reply.extents.push((
                    u32::from_be_bytes(descriptor[0..4].try_into().unwrap()),
                    u32::from_be_bytes(descriptor[4..8].try_into().unwrap()),
                ));
            }
        }
        NBD_REPLY_TYPE_ERROR | NBD_REPLY_TYPE_ERROR_OFFSET => {
            reply.error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
            let message_len = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
            reply.message =
                String::from_utf8(payload[6..6 + message_len].to_vec()).expect("UTF-8 message");
        }
        other => panic!("unexpected chunk type {other}"),
    }
}

/// A well-behaved client can still read and write `scratch` (a 64 KiB region) and the sentinel
/// region `[sentinel_offset, +sentinel.len())` still holds `sentinel`.
pub fn assert_healthy(
    addr: SocketAddr,
    export: &str,
    scratch: u64,
    sentinel_offset: u64,
    sentinel: &[u8],
) {
    let (mut client, _) = RawClient::open(addr, export, true, false);
    let data = pattern(scratch, 65536);
    assert_eq!(client.write(scratch, &data).error, 0);
    let back = client.read(scratch, 65536);
    assert_eq!(back.error, 0);
    assert!(back.data == data, "scratch data mismatch");
    if !sentinel.is_empty() {
        let back = client.read(sentinel_offset, sentinel.len() as u32);
        assert_eq!(back.error, 0);
        assert!(back.data == sentinel, "sentinel region changed");
    }
    client.disconnect();
}

// ---------------------------------------------------------------------------------------------
// External tools
// ---------------------------------------------------------------------------------------------

/// Whether `tool` can be used. A missing tool fails the test unless LOGRAID_SKIP_EXTERNAL=1.
pub fn require_tool(tool: &str, package: &str) -> bool {
    if lograid_nbd::attach::find_tool(tool).is_some() {
        return true;
    }
    if std::env::var("LOGRAID_SKIP_EXTERNAL").as_deref() == Ok("1") {
        eprintln!("SKIPPED: `{tool}` is not installed (LOGRAID_SKIP_EXTERNAL=1)");
        return false;
    }
    panic!("`{tool}` is not installed: apt-get install -y {package} (or set LOGRAID_SKIP_EXTERNAL=1 to skip)");
}

/// Kills the child on drop unless it was waited for.
pub struct ChildGuard(pub Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a command to completion within `limit`, killing it if it takes longer (then panics).
pub fn run_tool(command: &mut Command, limit: Duration) -> Output {
    let rendered = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {rendered}: {error}"));
    let mut guard = ChildGuard(Some(child));
    let deadline = Instant::now() + limit;
    // Drain output in threads so a chatty child cannot block on a full pipe.
    let mut stdout = guard.0.as_mut().unwrap().stdout.take().unwrap();
    let mut stderr = guard.0.as_mut().unwrap().stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let status = loop {
        if let Some(status) = guard.0.as_mut().unwrap().try_wait().expect("wait") {
            guard.0 = None;
            break status;
        }
        if Instant::now() >= deadline {
            drop(guard);
            panic!("{rendered} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
    }
}

/// Runs a tool and asserts success; returns stdout as text.
pub fn run_ok(command: &mut Command, limit: Duration) -> String {
    let rendered = format!("{command:?}");
    let output = run_tool(command, limit);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{rendered} failed ({}):\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A temporary directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path =
            std::env::temp_dir().join(format!("lograid-nbd-{tag}-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
