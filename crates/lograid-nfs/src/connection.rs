//! One client connection: reading RPC records, handing each to the blocking pool, and writing
//! the replies in the order they complete.
//!
//! Owns: record marking on the socket and every per-connection bound: calls in flight, buffer
//! bytes in flight (a record counts from its first mark; a READ also counts the data it will
//! send), the largest record, the time a started record may take to arrive, and the time a
//! reply may take to be taken. Must never: hold more than its budgets of buffers, let one
//! connection's failure reach another, or panic on anything a client sends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::timeout;

use crate::nfs3::{PROC_READ, PROGRAM, VERSION};
use crate::rpc::{parse_call, parse_record_mark, CallError};
use crate::service::{Outcome, Service, MAX_IO_BYTES};
use crate::xdr::XdrReader;

/// Largest record taken: a WRITE of [`MAX_IO_BYTES`] with the largest RPC header (credential
/// and verifier of 400 bytes each) and handle, with room to spare.
pub const MAX_RECORD_BYTES: u32 = MAX_IO_BYTES + 8192;
/// Most fragments one record may come in.
const MAX_FRAGMENTS: u32 = 1024;
const READ_BUFFER_BYTES: usize = 256 * 1024;
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// Per-connection limits and timeouts (from the server configuration).
#[derive(Clone, Debug)]
pub(crate) struct ConnectionLimits {
    pub max_in_flight: usize,
    pub max_in_flight_bytes: u32,
    pub record_timeout: Duration,
    pub reply_write_timeout: Duration,
}

/// Counters shared by all connections of one server.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_active: AtomicU64,
    pub in_flight_calls: AtomicU64,
    pub in_flight_bytes: AtomicU64,
    pub peak_in_flight_bytes: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub stalled_writers: AtomicU64,
}

/// What every connection of a server shares.
pub(crate) struct Shared {
    pub service: Arc<Service>,
    pub limits: ConnectionLimits,
    pub counters: Arc<Counters>,
    pub global_bytes: Arc<Semaphore>,
    pub shutdown: watch::Receiver<bool>,
}

/// Buffer bytes and the slot one call holds until its reply is written (or dropped).
struct InFlight {
    _slot: OwnedSemaphorePermit,
    permits: Vec<OwnedSemaphorePermit>,
    bytes: u64,
    counters: Arc<Counters>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counters
            .in_flight_calls
            .fetch_sub(1, Ordering::Relaxed);
        self.counters
            .in_flight_bytes
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// One reply, complete, waiting for the writer.
struct Outgoing {
    bytes: Vec<u8>,
    _in_flight: InFlight,
}

/// Why the reader stopped.
#[derive(Debug)]
enum ReaderEnd {
    Clean,
    Shutdown,
    WriterGone,
    Broken(String),
}

async fn wait_true(receiver: &mut watch::Receiver<bool>) {
    let _ = receiver.wait_for(|value| *value).await;
}

/// Serves one accepted connection to its end. `peer` is only used in logs.
pub(crate) async fn serve(stream: tokio::net::TcpStream, peer: String, shared: Arc<Shared>) {
    let (reader, writer) = stream.into_split();
    let (reply_tx, reply_rx) = mpsc::unbounded_channel::<Outgoing>();
    let (abort_tx, abort_rx) = watch::channel(false);
    let writer_task = tokio::spawn(write_replies(
        BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer),
        reply_rx,
        abort_tx,
        shared.limits.reply_write_timeout,
        shared.counters.clone(),
    ));
    let mut records = RecordReader {
        reader: BufReader::with_capacity(READ_BUFFER_BYTES, reader),
        reply_tx,
        stops: Stops {
            abort: abort_rx,
            shutdown: shared.shutdown.clone(),
        },
        slots: Arc::new(Semaphore::new(shared.limits.max_in_flight)),
        conn_bytes: Arc::new(Semaphore::new(shared.limits.max_in_flight_bytes as usize)),
        shared: shared.clone(),
    };
    let end = loop {
        if let Err(end) = records.serve_next().await {
            break end;
        }
    };
    drop(records);
    match end {
        ReaderEnd::Clean => tracing::debug!(%peer, "client disconnected"),
        ReaderEnd::Shutdown => tracing::debug!(%peer, "closing for server shutdown"),
        ReaderEnd::WriterGone => tracing::info!(%peer, "closing: replies cannot be delivered"),
        ReaderEnd::Broken(reason) => {
            shared
                .counters
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, %reason, "closing after a protocol violation");
        }
    }
    // The writer ends once every call in flight has replied (each holds a sender clone).
    let _ = writer_task.await;
}

/// The reading side of one connection, with its in-flight budgets.
struct RecordReader<R> {
    reader: BufReader<R>,
    reply_tx: mpsc::UnboundedSender<Outgoing>,
    stops: Stops,
    /// Calls in flight on this connection.
    slots: Arc<Semaphore>,
    /// Buffer bytes in flight on this connection.
    conn_bytes: Arc<Semaphore>,
    shared: Arc<Shared>,
}

/// What ends the reader while it waits on anything: the writer failing, or the server
/// shutting down.
struct Stops {
    abort: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
}

impl Stops {
    /// Runs `work` unless the writer fails or the server shuts down first.
    async fn race<F: std::future::Future>(&mut self, work: F) -> Result<F::Output, ReaderEnd> {
        tokio::select! {
            output = work => Ok(output),
            _ = wait_true(&mut self.abort) => Err(ReaderEnd::WriterGone),
            _ = wait_true(&mut self.shutdown) => Err(ReaderEnd::Shutdown),
        }
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> RecordReader<R> {
    /// Reads one record and hands it to the blocking pool. `Err`: why the reader stops.
    async fn serve_next(&mut self) -> Result<(), ReaderEnd> {
        let slots = self.slots.clone();
        let slot = self
            .stops
            .race(slots.acquire_owned())
            .await?
            .map_err(|_| ReaderEnd::WriterGone)?;
        let mut in_flight = self.begin(slot);
        let first_mark = match self.stops.race(read_mark(&mut self.reader, true)).await? {
            Ok(Some(mark)) => mark,
            Ok(None) => return Err(ReaderEnd::Clean),
            Err(error) => return Err(ReaderEnd::Broken(format!("reading a record mark: {error}"))),
        };
        let record = self.read_record(first_mark, &mut in_flight).await?;
        match parse_call(&record) {
            Err(error @ (CallError::TooShort(_) | CallError::NotACall(_))) => {
                return Err(ReaderEnd::Broken(error.to_string()))
            }
            Ok(_) | Err(CallError::Refused { .. }) => {}
        }
        let reply_bytes = read_reply_bytes(&record);
        if reply_bytes > record.len() {
            self.reserve(&mut in_flight, (reply_bytes - record.len()) as u32)
                .await?;
        }
        self.execute(record, in_flight);
        Ok(())
    }

    fn begin(&self, slot: OwnedSemaphorePermit) -> InFlight {
        self.shared
            .counters
            .in_flight_calls
            .fetch_add(1, Ordering::Relaxed);
        InFlight {
            _slot: slot,
            permits: Vec::new(),
            bytes: 0,
            counters: self.shared.counters.clone(),
        }
    }

    /// Takes `bytes` more from this connection's and the server's buffer budgets (waiting for
    /// replies to free them).
    async fn reserve(&mut self, in_flight: &mut InFlight, bytes: u32) -> Result<(), ReaderEnd> {
        let conn = self.conn_bytes.clone();
        let global = self.shared.global_bytes.clone();
        let permits = self
            .stops
            .race(async move {
                let conn = conn.acquire_many_owned(bytes).await.ok()?;
                let global = global.acquire_many_owned(bytes).await.ok()?;
                Some((conn, global))
            })
            .await?;
        let Some((conn, global)) = permits else {
            return Err(ReaderEnd::WriterGone);
        };
        in_flight.permits.push(conn);
        in_flight.permits.push(global);
        in_flight.bytes += u64::from(bytes);
        let counters = &self.shared.counters;
        let now = counters
            .in_flight_bytes
            .fetch_add(u64::from(bytes), Ordering::Relaxed)
            + u64::from(bytes);
        counters
            .peak_in_flight_bytes
            .fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the fragments of one record, the first announced by `mark`, within the record
    /// size limit and the record timeout.
    async fn read_record(
        &mut self,
        mut mark: (bool, u32),
        in_flight: &mut InFlight,
    ) -> Result<Vec<u8>, ReaderEnd> {
        let mut record: Vec<u8> = Vec::new();
        let deadline = tokio::time::Instant::now() + self.shared.limits.record_timeout;
        for _ in 0..MAX_FRAGMENTS {
            let (last, length) = mark;
            let total = record.len() as u64 + u64::from(length);
            if total > u64::from(MAX_RECORD_BYTES) {
                return Err(ReaderEnd::Broken(format!(
                    "record of more than {MAX_RECORD_BYTES} bytes"
                )));
            }
            self.reserve(in_flight, length).await?;
            let start = record.len();
            record.resize(start + length as usize, 0);
            let read =
                tokio::time::timeout_at(deadline, self.reader.read_exact(&mut record[start..]));
            match self.stops.race(read).await? {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    return Err(ReaderEnd::Broken(format!("reading a record: {error}")))
                }
                Err(_) => return Err(ReaderEnd::Broken("record not sent in time".into())),
            }
            if last {
                return Ok(record);
            }
            let next = tokio::time::timeout_at(deadline, read_mark(&mut self.reader, false));
            mark = match self.stops.race(next).await? {
                Ok(Ok(Some(mark))) => mark,
                Ok(Ok(None)) | Ok(Err(_)) => {
                    return Err(ReaderEnd::Broken(
                        "connection closed inside a record".into(),
                    ))
                }
                Err(_) => return Err(ReaderEnd::Broken("record not sent in time".into())),
            };
        }
        Err(ReaderEnd::Broken(format!(
            "record in more than {MAX_FRAGMENTS} fragments"
        )))
    }

    /// Answers `record` on the blocking pool; the reply goes to the writer when ready.
    fn execute(&self, record: Vec<u8>, in_flight: InFlight) {
        let service = self.shared.service.clone();
        let reply_tx = self.reply_tx.clone();
        tokio::task::spawn_blocking(move || match service.handle_record(&record) {
            Outcome::Reply(bytes) => {
                drop(record);
                let _ = reply_tx.send(Outgoing {
                    bytes,
                    _in_flight: in_flight,
                });
            }
            Outcome::Close(reason) => tracing::info!(%reason, "record not answered"),
        });
    }
}

/// Buffer bytes the reply to `record` will take: a READ's data and headers, else nothing
/// beyond the record itself.
fn read_reply_bytes(record: &[u8]) -> usize {
    let Ok(call) = parse_call(record) else {
        return 0;
    };
    if (call.program, call.version, call.procedure) != (PROGRAM, VERSION, PROC_READ) {
        return 0;
    }
    let count =
        crate::nfs3::range_args(&mut XdrReader::new(call.args)).map_or(0, |args| args.count);
    count.min(MAX_IO_BYTES) as usize + 256
}

/// Reads a record mark. `Ok(None)`: a clean end of stream, or a reset, before its first byte
/// (only taken as the client's going at a record boundary, `at_boundary`).
async fn read_mark<R: AsyncRead + Unpin>(
    reader: &mut R,
    at_boundary: bool,
) -> std::io::Result<Option<(bool, u32)>> {
    let mut raw = [0u8; 4];
    let mut filled = 0;
    while filled < raw.len() {
        let count = match reader.read(&mut raw[filled..]).await {
            Ok(count) => count,
            // A client that resets its connection between records has gone away (libnfs
            // does, on close), like one that closes it.
            Err(error)
                if filled == 0
                    && at_boundary
                    && matches!(
                        error.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                    ) =>
            {
                return Ok(None)
            }
            Err(error) => return Err(error),
        };
        if count == 0 {
            if filled == 0 && at_boundary {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        filled += count;
    }
    Ok(Some(parse_record_mark(raw)))
}

/// Writes replies in the order they complete; on a write error or a write that takes longer
/// than `write_timeout` it raises `abort` and returns.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut writer: BufWriter<W>,
    mut replies: mpsc::UnboundedReceiver<Outgoing>,
    abort: watch::Sender<bool>,
    write_timeout: Duration,
    counters: Arc<Counters>,
) {
    let fail = |stalled: bool| {
        if stalled {
            counters.stalled_writers.fetch_add(1, Ordering::Relaxed);
        }
        abort.send_replace(true);
    };
    while let Some(first) = replies.recv().await {
        let mut next = Some(first);
        while let Some(reply) = next.take() {
            match timeout(write_timeout, writer.write_all(&reply.bytes)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return fail(false),
                Err(_) => return fail(true),
            }
            drop(reply);
            next = replies.try_recv().ok();
        }
        match timeout(write_timeout, writer.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return fail(false),
            Err(_) => return fail(true),
        }
    }
    let _ = timeout(write_timeout, writer.shutdown()).await;
}
