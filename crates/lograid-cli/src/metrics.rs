//! `lograid serve --metrics ADDR:PORT`: the pool's and its volumes' numbers in the Prometheus
//! text exposition format (version 0.0.4), over a small HTTP/1.1 endpoint on threads of its own.
//!
//! Owns: every metric's name, type, labels and help (docs/OPERATIONS.md, "Metrics", lists
//! them), rendering them from `Pool::status`, `Pool::member_latency`, the server's scrub job,
//! the NBD server's per-export stats and the NFS server's counters (`serve --nfs` registers
//! its server here: `serve_nfs_stats`), and the endpoint: `GET /metrics` (or `HEAD`) answers 200,
//! any other path 404, any other method 405, anything unreadable 400; one request per
//! connection. Must never: panic or stop on what a client sends, hold more than
//! `MAX_CONNECTIONS` connections or `MAX_REQUEST_BYTES` of request each, wait on a client
//! longer than its timeouts, or hold an engine lock longer than a status snapshot does.
//!
//! The text format is written here, not by a client library: it is a few lines per sample, the
//! official Rust client (`prometheus-client`) writes OpenMetrics only (not 0.0.4), and every
//! number is already kept by the engine or the NBD server (a registry of metric objects would
//! only copy them).

use crate::live::{Jobs, ScrubProgress};
use anyhow::{Context, Result};
use lograid::pool::CleanerState;
use lograid::{Health, Pool, PoolStatus};
use lograid_nbd::{ExportStatsRegistry, ExportStatsValues};
use lograid_nfs::{NfsStats, StatsHandle};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The media type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Most bytes of request line and headers read from a client.
const MAX_REQUEST_BYTES: usize = 8192;
/// A client has this long to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// ... and to take the reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 8;
/// How often the accepting thread looks for a stop.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------------
// The text format
// ---------------------------------------------------------------------------------------------

/// A number in a sample: integers exactly, floats as Prometheus spells them.
trait Number {
    fn put(&self, out: &mut String);
}

/// Integers, written exactly (a float would round those past 2^53).
macro_rules! integer_numbers {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn put(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_numbers!(u64, usize, u8, i32);

impl Number for f64 {
    fn put(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

impl Number for bool {
    fn put(&self, out: &mut String) {
        out.push(if *self { '1' } else { '0' });
    }
}

/// A latency histogram as kept by the engine or the NBD server: calls per bucket (not
/// cumulative; one more than `bounds_us`, for what took longer) and their total time.
struct Histogram<'a> {
    bounds_us: &'a [u64],
    buckets: &'a [u64],
    sum_ns: u64,
}

/// An exposition being written: families one after the other, each with its samples. A
/// family's HELP and TYPE lines are written with its first sample, so a family with no samples
/// leaves no trace.
#[derive(Default)]
struct Text {
    out: String,
    /// The family being written, and its header while not written yet.
    name: &'static str,
    header: Option<(&'static str, &'static str)>,
}

type Labels<'a> = [(&'a str, &'a str)];

impl Text {
    /// Starts the family `name` of type `kind`; its samples follow.
    fn family(&mut self, name: &'static str, kind: &'static str, help: &'static str) {
        self.name = name;
        self.header = Some((kind, help));
    }

    /// A family with one sample.
    fn one(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        labels: &Labels<'_>,
        value: impl Number,
    ) {
        self.family(name, kind, help);
        self.sample(labels, value);
    }

    /// A sample of the current family.
    fn sample(&mut self, labels: &Labels<'_>, value: impl Number) {
        self.sample_of("", labels, value);
    }

    /// A sample of the current family, its name followed by `suffix` (`_bucket`, ...).
    fn sample_of(&mut self, suffix: &str, labels: &Labels<'_>, value: impl Number) {
        if let Some((kind, help)) = self.header.take() {
            let name = self.name;
            let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
        }
        self.out.push_str(self.name);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{key}=\"{}\"", escape_label(value));
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.put(&mut self.out);
        self.out.push('\n');
    }

    /// The samples of a histogram of the current family: `_bucket` (cumulative, `le` in
    /// seconds, up to `+Inf`), `_sum` (seconds) and `_count`.
    fn histogram(&mut self, labels: &Labels<'_>, h: &Histogram<'_>) {
        let mut cumulative = 0u64;
        for (i, &bound) in h.bounds_us.iter().enumerate() {
            cumulative += h.buckets.get(i).copied().unwrap_or(0);
            let le = format!("{}", bound as f64 / 1e6);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample_of("_bucket", &with_le, cumulative);
        }
        cumulative += h.buckets.iter().skip(h.bounds_us.len()).sum::<u64>();
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample_of("_bucket", &with_le, cumulative);
        self.sample_of("_sum", labels, h.sum_ns as f64 / 1e9);
        self.sample_of("_count", labels, cumulative);
    }
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

// ---------------------------------------------------------------------------------------------
// The metrics
// ---------------------------------------------------------------------------------------------

/// Where the numbers come from.
pub struct Sources {
    pub pool: Pool,
    pub jobs: Arc<Jobs>,
    pub volumes: &'static ExportStatsRegistry,
}

impl Sources {
    /// The exposition, now.
    pub fn render(&self) -> String {
        // The latencies after the status: the members' histograms then count at least the
        // calls the status counted.
        let status = self.pool.status();
        let latency = self.pool.member_latency();
        let scrub = self.jobs.scrub.lock().clone();
        let volumes = self.volumes.values();
        let nfs = NFS_SERVER.lock().as_ref().map(StatsHandle::snapshot);
        let mut text = render(&status, &latency, scrub.as_ref(), &volumes);
        if let Some(nfs) = nfs {
            let mut t = Text::default();
            render_nfs(&mut t, &status.name, &nfs);
            text.push_str(&t.out);
        }
        text
    }
}

/// The NFS server this process runs (`serve --nfs`), if any.
static NFS_SERVER: parking_lot::Mutex<Option<StatsHandle>> = parking_lot::const_mutex(None);

/// Shows the counters of the NFS server this process runs (Some) from now on, or no longer
/// (None, when it stops).
pub fn serve_nfs_stats(stats: Option<StatsHandle>) {
    *NFS_SERVER.lock() = stats;
}

const HEALTH: [(Health, &str); 6] = [
    (Health::Healthy, "healthy"),
    (Health::LowSpace, "low_space"),
    (Health::Rebuilding, "rebuilding"),
    (Health::Degraded, "degraded"),
    (Health::DataLost, "data_lost"),
    (Health::Stopped, "stopped"),
];

const CLEANER_STATES: [CleanerState; 3] = [
    CleanerState::Idle,
    CleanerState::Background,
    CleanerState::Urgent,
];

/// The states `lograid status` gives a member.
const MEMBER_STATES: [&str; 7] = [
    "online",
    "rebuilding",
    "joining",
    "leaving",
    "leaving (missing)",
    "faulted",
    "missing",
];

const SCRUB_STATES: [&str; 5] = ["running", "paused", "finished", "cancelled", "failed"];

const RESHAPE_KINDS: [&str; 2] = ["rebuild", "rebalance"];

/// A counter family over members or volumes: name, help, and its value in their numbers.
type Counter<T> = (&'static str, &'static str, fn(&T) -> u64);
/// A histogram family over members or volumes: name, help, and the histogram in their numbers.
type Latency<T, H> = (&'static str, &'static str, for<'a> fn(&'a T) -> &'a H);
/// A volume, its labels, and what the NBD server served of it.
type VolumeRow<'a> = (
    &'a lograid::pool::VolumeStatus,
    [(&'a str, &'a str); 2],
    &'a ExportStatsValues,
);

/// Writes every metric (docs/OPERATIONS.md, "Metrics", lists them).
fn render(
    status: &PoolStatus,
    latency: &[(usize, lograid::device::MemberLatencyValues)],
    scrub: Option<&ScrubProgress>,
    volumes: &[(String, ExportStatsValues)],
) -> String {
    let mut t = Text::default();
    render_pool(&mut t, status);
    render_jobs(&mut t, status, scrub);
    render_members(&mut t, status, latency);
    render_volumes(&mut t, status, volumes);
    t.out
}

/// The pool: health, space, totals, write amplification.
fn render_pool(t: &mut Text, status: &PoolStatus) {
    let pool = status.name.as_str();
    let p: &Labels<'_> = &[("pool", pool)];
    t.one(
        "lograid_pool_info",
        "gauge",
        "The pool being served (always 1), with its UUID.",
        &[("pool", pool), ("uuid", &status.uuid)],
        1u64,
    );
    t.one(
        "lograid_pool_health",
        "gauge",
        "Pool health as `lograid status -x` exits: 0 healthy; 1 low on space, rebuilding or degraded; 2 data lost or stopped.",
        p,
        status.health.exit_code(),
    );
    t.family(
        "lograid_pool_health_state",
        "gauge",
        "1 for the pool's health (the worst that applies), 0 for the others.",
    );
    for (health, name) in HEALTH {
        t.sample(&[("pool", pool), ("state", name)], status.health == health);
    }
    t.one(
        "lograid_pool_read_only",
        "gauge",
        "1 if the pool refuses writes (opened read-only, or stopped writing).",
        p,
        status.read_only,
    );
    t.one(
        "lograid_pool_members",
        "gauge",
        "Members of the pool (not removed), present or not.",
        p,
        status.members_total,
    );
    t.one(
        "lograid_pool_parity",
        "gauge",
        "Parity columns of new rows.",
        p,
        status.parity,
    );
    t.one(
        "lograid_pool_capacity_bytes",
        "gauge",
        "Bytes of data the segments hold at the width new rows are written with (parity not counted).",
        p,
        status.capacity_bytes,
    );
    t.one(
        "lograid_pool_usable_bytes",
        "gauge",
        "Bytes the volumes can store: the capacity less the reserve the log and the cleaner need.",
        p,
        status.usable_bytes,
    );
    t.one(
        "lograid_pool_free_bytes",
        "gauge",
        "Usable bytes that can still be written.",
        p,
        status.free_bytes,
    );
    t.one(
        "lograid_pool_used_bytes",
        "gauge",
        "Usable bytes not free: live data, and sub-block writes held in memory and not stored yet.",
        p,
        status.usable_bytes.saturating_sub(status.free_bytes),
    );
    t.one(
        "lograid_pool_live_bytes",
        "gauge",
        "Bytes of live data stored for the volumes (what their maps point to).",
        p,
        status.stored_bytes,
    );
    t.family(
        "lograid_pool_segments",
        "gauge",
        "Segments by state: free; sealed (full); pending_free (freed, reusable after the next flush); in_use (holding data: sealed, open, or the checkpoint's).",
    );
    for (state, n) in [
        ("free", status.segments_free),
        ("sealed", status.segments_sealed),
        ("pending_free", status.segments_pending_free),
        ("in_use", status.segments_in_use),
    ] {
        t.sample(&[("pool", pool), ("state", state)], n);
    }
    t.family(
        "lograid_pool_memory_bytes",
        "gauge",
        "The engine's memory by kind: map (the volume maps); open_rows, in_flight_rows, kept_rows (row buffers being filled, being written, kept for reuse); held_writes (sub-block writes held until merged); column_buffers (whole-column buffers kept for the cleaner's, scrub's and rebuild's row reads); scratch (buffers threads keep for rebuilding blocks from parity).",
    );
    let m = &status.memory;
    for (kind, bytes) in [
        ("map", m.map_bytes),
        ("open_rows", m.open_row_bytes),
        ("in_flight_rows", m.in_flight_row_bytes),
        ("kept_rows", m.kept_row_bytes),
        ("held_writes", m.held_write_bytes),
        ("column_buffers", m.column_buffer_bytes),
        ("scratch", m.scratch_bytes),
    ] {
        t.sample(&[("pool", pool), ("kind", kind)], bytes);
    }
    t.one(
        "lograid_pool_user_written_bytes_total",
        "counter",
        "Bytes written by the volumes' users, since the pool was created.",
        p,
        status.counters.user_bytes_written,
    );
    t.one(
        "lograid_pool_user_read_bytes_total",
        "counter",
        "Bytes read by the volumes' users, since the pool was created.",
        p,
        status.counters.user_bytes_read,
    );
    t.one(
        "lograid_pool_rows_written_total",
        "counter",
        "Parity rows written, since the pool was created.",
        p,
        status.counters.rows_written,
    );
    t.one(
        "lograid_pool_checkpoints_total",
        "counter",
        "Checkpoints written, since the pool was created.",
        p,
        status.counters.checkpoints,
    );
    t.one(
        "lograid_pool_lost_blocks_total",
        "counter",
        "Live blocks reads and scrubs found lost (more bad columns than parity), since the pool was opened.",
        p,
        status.lost_blocks_seen,
    );
    t.one(
        "lograid_pool_write_amplification",
        "gauge",
        "Member bytes written per volume byte written, since the pool was created (0 before any).",
        p,
        status.write_amplification,
    );
    t.family(
        "lograid_pool_write_amplification_last_minute",
        "gauge",
        "Member bytes written per volume byte written over the last minute (absent while nothing was written).",
    );
    if let Some(wa) = status.cleaner.write_amplification_last_minute {
        t.sample(p, wa);
    }
}

/// The cleaner, a rebuild or rebalance, the server's scrub.
fn render_jobs(t: &mut Text, status: &PoolStatus, scrub: Option<&ScrubProgress>) {
    let pool = status.name.as_str();
    let p: &Labels<'_> = &[("pool", pool)];
    let c = &status.cleaner;
    t.family(
        "lograid_cleaner_state",
        "gauge",
        "1 for the cleaner's state (idle; background: below the watermark; urgent: a writer waits), 0 for the others.",
    );
    for state in CLEANER_STATES {
        t.sample(&[("pool", pool), ("state", state.name())], c.state == state);
    }
    t.one(
        "lograid_cleaner_segments_cleaned_total",
        "counter",
        "Segments the cleaner emptied, since the pool was opened.",
        p,
        c.segments_cleaned,
    );
    t.one(
        "lograid_cleaner_relocated_bytes_total",
        "counter",
        "Live bytes the cleaner moved, since the pool was created.",
        p,
        c.relocated_bytes,
    );
    t.one(
        "lograid_cleaner_discarded_bytes_total",
        "counter",
        "Bytes discarded on the members (serve --discard) as segments were freed, since the pool was opened.",
        p,
        c.discarded_bytes,
    );
    t.one(
        "lograid_cleaner_write_stalls_total",
        "counter",
        "Writes that waited for the cleaner, since the pool was opened.",
        p,
        c.write_stalls,
    );
    t.one(
        "lograid_cleaner_write_stall_seconds_total",
        "counter",
        "Time writes waited for the cleaner, since the pool was opened.",
        p,
        c.write_stall_seconds,
    );
    t.one(
        "lograid_cleaner_foreground_relocated_bytes_total",
        "counter",
        "Bytes writers out of room relocated themselves (the rest of the cleaner's moves ran in the background), since the pool was opened.",
        p,
        c.foreground_relocated_bytes,
    );
    t.one(
        "lograid_cleaner_relocated_again_bytes_total",
        "counter",
        "Bytes relocated from segments the cleaner's own head had written (cold data moved again), since the pool was opened.",
        p,
        c.relocated_again_bytes,
    );
    t.one(
        "lograid_long_lived_written_bytes_total",
        "counter",
        "User bytes written beside the relocated data as likely to live long (their previous version had), since the pool was opened.",
        p,
        c.long_lived_written_bytes,
    );
    t.one(
        "lograid_cleaner_cold_written_bytes_total",
        "counter",
        "Bytes the cleaner moved again, written to the cold head apart from data moved once, since the pool was opened.",
        p,
        c.cold_written_bytes,
    );

    let reshape = status.reshape.as_ref();
    t.family(
        "lograid_reshape_running",
        "gauge",
        "1 while a rebuild (a member replaced) or a rebalance (members added or removed, parity changed) runs, by kind.",
    );
    for kind in RESHAPE_KINDS {
        t.sample(
            &[("pool", pool), ("kind", kind)],
            reshape.is_some_and(|r| r.kind == kind),
        );
    }
    t.one(
        "lograid_reshape_paused",
        "gauge",
        "1 while the running rebuild or rebalance is paused.",
        p,
        reshape.is_some_and(|r| r.paused),
    );
    t.one(
        "lograid_reshape_left_segments",
        "gauge",
        "Segments the running rebuild or rebalance still has to move (0 when none runs).",
        p,
        reshape.map_or(0, |r| r.segments_left),
    );
    t.one(
        "lograid_reshape_left_bytes",
        "gauge",
        "Live bytes in those segments (0 when none runs).",
        p,
        reshape.map_or(0, |r| r.bytes_left),
    );
    if let Some(r) = reshape {
        t.one(
            "lograid_reshape_done_segments",
            "gauge",
            "Segments moved since the pool was opened (only while a rebuild or rebalance runs).",
            p,
            r.segments_done,
        );
        t.one(
            "lograid_reshape_moved_bytes",
            "gauge",
            "Live bytes moved since the pool was opened (only while a rebuild or rebalance runs).",
            p,
            r.bytes_moved,
        );
        t.family(
            "lograid_reshape_eta_seconds",
            "gauge",
            "Estimated time left of the running rebuild or rebalance (once it has a rate).",
        );
        if let Some(eta) = r.eta_seconds {
            t.sample(p, eta);
        }
    }

    t.family(
        "lograid_scrub_state",
        "gauge",
        "1 for the state of the server's scrub, running or last run (all 0 before the first), 0 for the others.",
    );
    for state in SCRUB_STATES {
        t.sample(
            &[("pool", pool), ("state", state)],
            scrub.is_some_and(|s| s.state == state),
        );
    }
    t.one(
        "lograid_scrub_checked_rows",
        "gauge",
        "Rows the running (or last) scrub has checked.",
        p,
        scrub.map_or(0, |s| s.rows_done),
    );
    t.one(
        "lograid_scrub_rows",
        "gauge",
        "Rows the running (or last) scrub checks in all (0 until its first progress report).",
        p,
        scrub.map_or(0, |s| s.rows_total),
    );
    if let Some(s) = scrub {
        t.one(
            "lograid_scrub_started_timestamp_seconds",
            "gauge",
            "When the running (or last) scrub started, in seconds since the Unix epoch.",
            p,
            s.started_unix,
        );
        t.one(
            "lograid_scrub_duration_seconds",
            "gauge",
            "How long the running (or last) scrub has run.",
            p,
            s.seconds,
        );
        if let Some(report) = &s.report {
            t.one(
                "lograid_scrub_last_repaired_blocks",
                "gauge",
                "Blocks the last finished scrub found wrong and rewrote.",
                p,
                report.repaired_blocks,
            );
            t.one(
                "lograid_scrub_last_lost_blocks",
                "gauge",
                "Live blocks the last finished scrub found lost.",
                p,
                report.lost_blocks.len(),
            );
        }
    }
}

/// Each member: state, size, counters (since the pool was created) and latency histograms
/// (since it was opened).
fn render_members(
    t: &mut Text,
    status: &PoolStatus,
    latency: &[(usize, lograid::device::MemberLatencyValues)],
) {
    use lograid::device::{CounterValues, LatencyValues, MemberLatencyValues};
    let pool = status.name.as_str();
    let indexes: Vec<String> = status.members.iter().map(|m| m.index.to_string()).collect();
    let members: Vec<(&lograid::pool::MemberStatus, [(&str, &str); 3])> = status
        .members
        .iter()
        .zip(&indexes)
        .map(|(m, index)| {
            (
                m,
                [
                    ("pool", pool),
                    ("member", index.as_str()),
                    ("path", m.path.as_str()),
                ],
            )
        })
        .collect();
    t.family(
        "lograid_member_state",
        "gauge",
        "1 for each member's state (online, rebuilding, joining, leaving, leaving (missing), faulted, missing), 0 for the others.",
    );
    for (m, labels) in &members {
        let known = MEMBER_STATES.contains(&m.state.as_str());
        let states = MEMBER_STATES
            .iter()
            .copied()
            .chain((!known).then_some(m.state.as_str()));
        for state in states {
            let mut with_state = labels.to_vec();
            with_state.push(("state", state));
            t.sample(&with_state, m.state == state);
        }
    }
    t.family(
        "lograid_member_size_bytes",
        "gauge",
        "Bytes of the member the pool uses.",
    );
    for (m, labels) in &members {
        t.sample(labels, m.size_bytes);
    }
    let counters: [Counter<CounterValues>; 8] = [
        (
            "lograid_member_read_bytes_total",
            "Bytes read from the member, since the pool was created.",
            |c| c.bytes_read,
        ),
        (
            "lograid_member_written_bytes_total",
            "Bytes written to the member, since the pool was created.",
            |c| c.bytes_written,
        ),
        (
            "lograid_member_reads_total",
            "Reads from the member, since the pool was created.",
            |c| c.reads,
        ),
        (
            "lograid_member_writes_total",
            "Writes to the member, since the pool was created.",
            |c| c.writes,
        ),
        (
            "lograid_member_flushes_total",
            "Cache flushes of the member, since the pool was created.",
            |c| c.flushes,
        ),
        (
            "lograid_member_io_errors_total",
            "Reads, writes, flushes and discards of the member that failed (and reads slower than 30 s), since the pool was created.",
            |c| c.io_errors,
        ),
        (
            "lograid_member_checksum_errors_total",
            "Blocks on the member found bad by reads and scrubs, since the pool was created.",
            |c| c.checksum_errors,
        ),
        (
            "lograid_member_repaired_blocks_total",
            "Of those, blocks rewritten with what parity rebuilt, since the pool was created.",
            |c| c.repaired_blocks,
        ),
    ];
    for (name, help, get) in counters {
        t.family(name, "counter", help);
        for (m, labels) in &members {
            t.sample(labels, get(&m.counters));
        }
    }
    let histograms: [Latency<MemberLatencyValues, LatencyValues>; 3] = [
        (
            "lograid_member_read_duration_seconds",
            "How long the member's reads took, since the pool was opened.",
            |v| &v.reads,
        ),
        (
            "lograid_member_write_duration_seconds",
            "How long the member's writes took, since the pool was opened.",
            |v| &v.writes,
        ),
        (
            "lograid_member_flush_duration_seconds",
            "How long the member's cache flushes took, since the pool was opened.",
            |v| &v.flushes,
        ),
    ];
    for (name, help, pick) in histograms {
        t.family(name, "histogram", help);
        for (m, labels) in &members {
            // A missing member has no histograms.
            let Some((_, values)) = latency.iter().find(|(i, _)| *i == m.index) else {
                continue;
            };
            let v = pick(values);
            t.histogram(
                labels,
                &Histogram {
                    bounds_us: &lograid::device::LATENCY_BUCKETS_US,
                    buckets: &v.buckets,
                    sum_ns: v.sum_ns,
                },
            );
        }
    }
}

/// Each volume: size, live bytes, and what the NBD server served of it (since it started).
fn render_volumes(t: &mut Text, status: &PoolStatus, served: &[(String, ExportStatsValues)]) {
    use lograid_nbd::stats::LatencyValues;
    let pool = status.name.as_str();
    let zero = ExportStatsValues::default();
    let volumes: Vec<VolumeRow<'_>> = status
        .volumes
        .iter()
        .map(|v| {
            let stats = served
                .iter()
                .find(|(name, _)| *name == v.name)
                .map_or(&zero, |(_, s)| s);
            (v, [("pool", pool), ("volume", v.name.as_str())], stats)
        })
        .collect();
    t.family("lograid_volume_size_bytes", "gauge", "The volume's size.");
    for (v, labels, _) in &volumes {
        t.sample(labels, v.size_bytes);
    }
    t.family(
        "lograid_volume_live_bytes",
        "gauge",
        "Bytes of the volume stored in the pool (blocks written and not trimmed).",
    );
    for (v, labels, _) in &volumes {
        t.sample(labels, v.stored_bytes);
    }
    let counters: [Counter<ExportStatsValues>; 10] = [
        (
            "lograid_volume_reads_total",
            "NBD read requests served, since the server started.",
            |s| s.reads,
        ),
        (
            "lograid_volume_read_bytes_total",
            "Bytes NBD read requests asked for, since the server started.",
            |s| s.read_bytes,
        ),
        (
            "lograid_volume_writes_total",
            "NBD write requests served, since the server started.",
            |s| s.writes,
        ),
        (
            "lograid_volume_written_bytes_total",
            "Bytes of NBD write requests, since the server started.",
            |s| s.written_bytes,
        ),
        (
            "lograid_volume_flushes_total",
            "NBD flush requests served, since the server started.",
            |s| s.flushes,
        ),
        (
            "lograid_volume_trims_total",
            "NBD trim requests served, since the server started.",
            |s| s.trims,
        ),
        (
            "lograid_volume_trimmed_bytes_total",
            "Bytes NBD trim requests covered, since the server started.",
            |s| s.trimmed_bytes,
        ),
        (
            "lograid_volume_write_zeroes_total",
            "NBD write-zeroes requests served, since the server started.",
            |s| s.write_zeroes,
        ),
        (
            "lograid_volume_zeroed_bytes_total",
            "Bytes NBD write-zeroes requests covered, since the server started.",
            |s| s.zeroed_bytes,
        ),
        (
            "lograid_volume_request_errors_total",
            "NBD requests answered with an error, since the server started.",
            |s| s.errors,
        ),
    ];
    for (name, help, get) in counters {
        t.family(name, "counter", help);
        for (_, labels, stats) in &volumes {
            t.sample(labels, get(stats));
        }
    }
    let histograms: [Latency<ExportStatsValues, LatencyValues>; 3] = [
        (
            "lograid_volume_read_duration_seconds",
            "How long NBD read requests took in the server (the volume's work and encoding the reply), since the server started.",
            |s| &s.read_latency,
        ),
        (
            "lograid_volume_write_duration_seconds",
            "How long NBD write requests took in the server, since the server started.",
            |s| &s.write_latency,
        ),
        (
            "lograid_volume_flush_duration_seconds",
            "How long NBD flush requests took in the server, since the server started.",
            |s| &s.flush_latency,
        ),
    ];
    for (name, help, pick) in histograms {
        t.family(name, "histogram", help);
        for (_, labels, stats) in &volumes {
            let v = pick(stats);
            t.histogram(
                labels,
                &Histogram {
                    bounds_us: &lograid_nbd::stats::LATENCY_BUCKETS_US,
                    buckets: &v.buckets,
                    sum_ns: v.sum_ns,
                },
            );
        }
    }
}

/// The NFS server (`serve --nfs`): its calls by procedure, bytes, commits, errors and
/// connections, since it started.
fn render_nfs(t: &mut Text, pool: &str, s: &NfsStats) {
    let p: &Labels<'_> = &[("pool", pool)];
    t.family(
        "lograid_nfs_calls_total",
        "counter",
        "NFS and MOUNT calls answered, by program and procedure (errors included), since the server started.",
    );
    for (name, count) in lograid_nfs::NFS_PROCEDURE_NAMES.iter().zip(s.nfs_calls) {
        t.sample(
            &[("pool", pool), ("program", "nfs"), ("procedure", name)],
            count,
        );
    }
    for (name, count) in lograid_nfs::MOUNT_PROCEDURE_NAMES.iter().zip(s.mount_calls) {
        t.sample(
            &[("pool", pool), ("program", "mount"), ("procedure", name)],
            count,
        );
    }
    let counters: [(&'static str, &'static str, u64); 9] = [
        (
            "lograid_nfs_unserved_calls_total",
            "Calls to programs, versions or procedures not served (NFSACL, NLM, the portmapper), since the server started.",
            s.unserved_calls,
        ),
        (
            "lograid_nfs_call_errors_total",
            "Calls answered with an NFS error status or refused at the RPC level, since the server started.",
            s.call_errors,
        ),
        (
            "lograid_nfs_read_bytes_total",
            "Bytes NFS READs returned, since the server started.",
            s.read_bytes,
        ),
        (
            "lograid_nfs_written_bytes_total",
            "Bytes of NFS WRITEs taken, since the server started.",
            s.written_bytes,
        ),
        (
            "lograid_nfs_commits_total",
            "NFS COMMITs answered (each a flush of the volume), since the server started.",
            s.commits,
        ),
        (
            "lograid_nfs_connections_accepted_total",
            "NFS connections served, since the server started.",
            s.connections_accepted,
        ),
        (
            "lograid_nfs_connections_refused_total",
            "NFS connections closed at once (not in the allow-list, or over the connection limit), since the server started.",
            s.connections_refused,
        ),
        (
            "lograid_nfs_protocol_errors_total",
            "NFS connections closed for bytes that are not ONC RPC calls within the limits, since the server started.",
            s.protocol_errors,
        ),
        (
            "lograid_nfs_stalled_replies_total",
            "NFS connections closed because the client did not take a reply within 30 s, since the server started.",
            s.stalled_writers,
        ),
    ];
    for (name, help, value) in counters {
        t.one(name, "counter", help, p, value);
    }
    let gauges: [(&'static str, &'static str, u64); 4] = [
        (
            "lograid_nfs_connections",
            "NFS connections open now.",
            s.connections_active,
        ),
        (
            "lograid_nfs_in_flight_calls",
            "NFS calls received and not yet answered.",
            s.in_flight_calls,
        ),
        (
            "lograid_nfs_in_flight_bytes",
            "Bytes of call and reply buffers held now (at most 1 GiB).",
            s.in_flight_bytes,
        ),
        (
            "lograid_nfs_in_flight_bytes_peak",
            "The most bytes of call and reply buffers held at once, since the server started.",
            s.peak_in_flight_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        t.one(name, "gauge", help, p, value);
    }
}

// ---------------------------------------------------------------------------------------------
// The HTTP endpoint
// ---------------------------------------------------------------------------------------------

/// A bound metrics listener, not serving yet (bound before the pool is opened, so that a bad
/// address fails before anything else happens).
pub struct Endpoint {
    listener: TcpListener,
    addr: SocketAddr,
}

/// A metrics endpoint being served; stops (and waits for its accepting thread) when dropped.
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `ADDR:PORT` (an IP address or a name that resolves).
fn parse_addr(text: &str) -> Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .with_context(|| {
            format!("--metrics '{text}': expected ADDR:PORT (e.g. 127.0.0.1:9450 or [::1]:9450)")
        })?
        .next()
        .with_context(|| format!("--metrics '{text}': the name resolves to no address"))
}

impl Endpoint {
    /// Binds `text` (`ADDR:PORT`); an error says which address and why.
    pub fn bind(text: &str) -> Result<Endpoint> {
        let addr = parse_addr(text)?;
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
        let addr = listener
            .local_addr()
            .with_context(|| format!("--metrics {addr}"))?;
        listener
            .set_nonblocking(true)
            .with_context(|| format!("--metrics {addr}"))?;
        if !addr.ip().is_loopback() {
            eprintln!(
                "lograid: warning: metrics on {addr} can be read by anyone who can reach this address \
                 (the pool's name, its drives' paths and the volumes' names and sizes)"
            );
        }
        Ok(Endpoint { listener, addr })
    }

    /// Serves `render`'s text at /metrics until the returned value is dropped.
    pub fn start(self, render: impl Fn() -> String + Send + Sync + 'static) -> Result<Running> {
        let stop = Arc::new(AtomicBool::new(false));
        let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(render);
        let thread = {
            let stop = stop.clone();
            let listener = self.listener;
            std::thread::Builder::new()
                .name("lograid-metrics".into())
                .spawn(move || accept_loop(&listener, &stop, &render))
                .context("starting the metrics thread")?
        };
        eprintln!(
            "lograid: metrics on http://{}/metrics (Prometheus text format)",
            self.addr
        );
        Ok(Running {
            stop,
            thread: Some(thread),
        })
    }
}

/// Starts serving `pool`'s metrics on `endpoint` (if any) for `lograid serve`; a failure to
/// start is a warning (the pool is open by then, and serves on without metrics).
pub fn serve(endpoint: Option<Endpoint>, pool: &Pool, jobs: &Arc<Jobs>) -> Option<Running> {
    let sources = Sources {
        pool: pool.clone(),
        jobs: jobs.clone(),
        volumes: ExportStatsRegistry::global(),
    };
    match endpoint?.start(move || sources.render()) {
        Ok(running) => Some(running),
        Err(e) => {
            eprintln!("lograid: warning: no metrics: {e:#}");
            None
        }
    }
}

/// Connections being served; the guard gives its slot back when the connection ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    render: &Arc<dyn Fn() -> String + Send + Sync>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            Err(e) => {
                // Out of descriptors, a connection reset before it was taken: try again later.
                tracing::debug!("metrics: accept: {e}");
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!("metrics: {MAX_CONNECTIONS} connections already open; one closed");
            continue;
        }
        let slot = Slot(active.clone());
        let render = render.clone();
        let spawned = std::thread::Builder::new()
            .name("lograid-metrics-conn".into())
            .spawn(move || {
                let _slot = slot;
                serve_connection(stream, render.as_ref());
            });
        if let Err(e) = spawned {
            tracing::debug!("metrics: cannot start a connection thread: {e}");
        }
    }
}

/// How reading a request ended.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    /// The request line and headers (up to the blank line, or all there was).
    Head(Vec<u8>),
    /// More than `MAX_REQUEST_BYTES` without the end of the headers.
    TooLarge,
    /// The time ran out with part of a request read.
    TimedOut,
    /// Closed (or failed) before sending anything.
    Nothing,
}

fn serve_connection(mut stream: TcpStream, render: &(dyn Fn() -> String + Send + Sync)) {
    // Accepted sockets do not inherit non-blocking mode on Linux; make sure.
    if stream.set_nonblocking(false).is_err()
        || stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err()
    {
        return;
    }
    let request = read_request(&mut stream, Instant::now() + REQUEST_TIMEOUT);
    let reply = match request {
        Request::Head(head) => respond(&head, render),
        Request::TooLarge => plain(
            431,
            "Request Header Fields Too Large",
            "request too large\n",
        ),
        Request::TimedOut => plain(408, "Request Timeout", "request not sent in time\n"),
        Request::Nothing => return,
    };
    let _ = stream.write_all(&reply);
    let _ = stream.flush();
    // Say we are done, then take (a bounded amount of) what the client still sends, so that
    // closing with unread bytes does not reset the connection before it read the reply.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = std::io::copy(&mut (&mut stream).take(64 * 1024), &mut std::io::sink());
}

/// Reads up to the end of the headers (a blank line), at most `MAX_REQUEST_BYTES`, by
/// `deadline`.
fn read_request(stream: &mut impl ReadWithTimeout, deadline: Instant) -> Request {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = header_end(&head) {
            head.truncate(end);
            return Request::Head(head);
        }
        if head.len() > MAX_REQUEST_BYTES {
            return Request::TooLarge;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_timeout(left).is_err() {
            return if head.is_empty() {
                Request::Nothing
            } else {
                Request::TimedOut
            };
        }
        match stream.read(&mut chunk) {
            // Closed: whatever came is the request (a client may half-close after it).
            Ok(0) => {
                return if head.is_empty() {
                    Request::Nothing
                } else {
                    Request::Head(head)
                }
            }
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return if head.is_empty() {
                    Request::Nothing
                } else {
                    Request::TimedOut
                };
            }
            Err(_) => return Request::Nothing,
        }
    }
}

/// A reader whose reads can be given a time limit (a socket; a fake in tests).
trait ReadWithTimeout: Read {
    fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()>;
}

impl ReadWithTimeout for TcpStream {
    fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(timeout))
    }
}

/// Where the headers end (just past the blank line), if they do.
fn header_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The reply to a request whose head is `head`.
fn respond(head: &[u8], render: &(dyn Fn() -> String + Send + Sync)) -> Vec<u8> {
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = first.strip_suffix(b"\r").unwrap_or(first);
    let Ok(line) = std::str::from_utf8(line) else {
        return plain(400, "Bad Request", "not an HTTP request\n");
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return plain(400, "Bad Request", "not an HTTP request\n");
    };
    if !version.starts_with("HTTP/1.") {
        return plain(400, "Bad Request", "not an HTTP/1.x request\n");
    }
    if method != "GET" && method != "HEAD" {
        let body = "only GET and HEAD\n";
        let mut reply = headers(
            405,
            "Method Not Allowed",
            "text/plain; charset=utf-8",
            body.len(),
            "Allow: GET, HEAD\r\n",
        );
        reply.extend_from_slice(body.as_bytes());
        return reply;
    }
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return plain(404, "Not Found", "not found: the metrics are at /metrics\n");
    }
    let body = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(render)) {
        Ok(body) => body,
        Err(_) => {
            return plain(
                500,
                "Internal Server Error",
                "collecting the metrics failed\n",
            );
        }
    };
    let mut reply = headers(200, "OK", CONTENT_TYPE, body.len(), "");
    if method == "GET" {
        reply.extend_from_slice(body.as_bytes());
    }
    reply
}

/// The status line and headers; `extra`: more header lines, each ending in CRLF.
fn headers(code: u16, reason: &str, content_type: &str, length: usize, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\
         {extra}Connection: close\r\n\r\n"
    )
    .into_bytes()
}

fn plain(code: u16, reason: &str, body: &str) -> Vec<u8> {
    let mut reply = headers(code, reason, "text/plain; charset=utf-8", body.len(), "");
    reply.extend_from_slice(body.as_bytes());
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_line(reply: &[u8]) -> String {
        let text = String::from_utf8_lossy(reply);
        text.lines().next().unwrap_or_default().to_string()
    }

    fn body() -> String {
        "x 1\n".to_string()
    }

    #[test]
    fn requests_are_answered_by_path_and_method() {
        let ok = respond(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &body);
        assert_eq!(status_line(&ok), "HTTP/1.1 200 OK");
        let text = String::from_utf8(ok).unwrap();
        assert!(text.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(text.ends_with("\r\n\r\nx 1\n"));
        let ok = respond(b"GET /metrics?x=1 HTTP/1.0\n\n", &body);
        assert_eq!(status_line(&ok), "HTTP/1.1 200 OK");
        let head = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", &body);
        assert!(String::from_utf8(head)
            .unwrap()
            .ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
        for (request, code) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], "404"),
            (b"GET /metricsx HTTP/1.1\r\n\r\n", "404"),
            (b"POST /metrics HTTP/1.1\r\n\r\n", "405"),
            (b"GET /metrics\r\n\r\n", "400"),
            (b"GET /metrics SPDY/3\r\n\r\n", "400"),
            (b"\xff\xfe\r\n\r\n", "400"),
            (b"\r\n\r\n", "400"),
            (b"garbage", "400"),
        ] {
            let reply = respond(request, &body);
            assert!(
                status_line(&reply).starts_with(&format!("HTTP/1.1 {code} ")),
                "{request:?}: {}",
                status_line(&reply)
            );
        }
        let not_allowed =
            String::from_utf8(respond(b"PUT /metrics HTTP/1.1\r\n\r\n", &body)).unwrap();
        assert!(
            not_allowed.contains("\r\nAllow: GET, HEAD\r\nConnection: close\r\n\r\nonly GET"),
            "{not_allowed}"
        );
        let panicking = respond(b"GET /metrics HTTP/1.1\r\n\r\n", &|| -> String {
            panic!("boom")
        });
        assert_eq!(
            status_line(&panicking),
            "HTTP/1.1 500 Internal Server Error"
        );
    }

    struct Fake(std::collections::VecDeque<std::io::Result<Vec<u8>>>);

    impl Read for Fake {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.pop_front() {
                None => Ok(0),
                Some(Ok(bytes)) => {
                    buf[..bytes.len()].copy_from_slice(&bytes);
                    Ok(bytes.len())
                }
                Some(Err(e)) => Err(e),
            }
        }
    }

    impl ReadWithTimeout for Fake {
        fn set_timeout(&mut self, _: Duration) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn read(parts: Vec<std::io::Result<Vec<u8>>>) -> Request {
        read_request(
            &mut Fake(parts.into()),
            Instant::now() + Duration::from_secs(5),
        )
    }

    #[test]
    fn requests_are_read_to_the_blank_line_within_bounds() {
        assert_eq!(
            read(vec![
                Ok(b"GET /metrics HT".to_vec()),
                Ok(b"TP/1.1\r\n\r\nrest".to_vec())
            ]),
            Request::Head(b"GET /metrics HTTP/1.1\r\n\r\n".to_vec())
        );
        assert_eq!(read(vec![]), Request::Nothing);
        assert_eq!(
            read(vec![Ok(b"GET /".to_vec())]),
            Request::Head(b"GET /".to_vec())
        );
        let timeout = || Err(std::io::Error::from(std::io::ErrorKind::WouldBlock));
        assert_eq!(
            read(vec![Ok(b"GET /".to_vec()), timeout()]),
            Request::TimedOut
        );
        assert_eq!(read(vec![timeout()]), Request::Nothing);
        let big: Vec<_> = (0..10).map(|_| Ok(vec![b'a'; 1024])).collect();
        assert_eq!(read(big), Request::TooLarge);
    }

    #[test]
    fn text_format_escapes_and_accumulates() {
        let mut t = Text::default();
        t.family("a_total", "counter", "never sampled");
        t.family("c", "gauge", "line\none \\ two");
        t.sample(&[("path", "a\"b\\c\nd")], f64::INFINITY);
        t.sample(&[], 2u64);
        t.family("h_seconds", "histogram", "h");
        t.histogram(
            &[("pool", "p")],
            &Histogram {
                bounds_us: &[50, 1_000_000],
                buckets: &[1, 2, 3],
                sum_ns: 1_500_000_000,
            },
        );
        assert_eq!(
            t.out,
            "# HELP c line\\none \\\\ two\n# TYPE c gauge\nc{path=\"a\\\"b\\\\c\\nd\"} +Inf\nc 2\n\
             # HELP h_seconds h\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{pool=\"p\",le=\"0.00005\"} 1\n\
             h_seconds_bucket{pool=\"p\",le=\"1\"} 3\n\
             h_seconds_bucket{pool=\"p\",le=\"+Inf\"} 6\n\
             h_seconds_sum{pool=\"p\"} 1.5\n\
             h_seconds_count{pool=\"p\"} 6\n"
        );
        assert_eq!(escape_help("a\nb\\"), "a\\nb\\\\");
    }
}
