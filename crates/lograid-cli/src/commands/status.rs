//! `lograid status`: members, geometry, capacity, counters.

use crate::size::human;
use anyhow::Result;
use clap::Args;
use lograid::device::{FileMember, OpenMode};
use lograid::PoolStatus;
use std::path::PathBuf;

#[derive(Args)]
pub struct StatusArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Fail (without opening it) if the pool has members missing.
    #[arg(long)]
    pub no_degraded: bool,
    /// One line of health, for scripts; exits 0 if healthy, 1 if degraded,
    /// rebuilding or short of space, 2 if data was lost, the pool stopped
    /// writing or it cannot be opened.
    #[arg(short = 'x', long = "health", conflicts_with = "json")]
    pub health: bool,
    /// The pool's drives (files or block devices, any order; a directory
    /// stands for its *.img files). Drives that are missing or not members
    /// of the pool are set aside, and the pool opens degraded while its
    /// parity covers the members they leave out.
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
}

pub fn run(a: StatusArgs) -> Result<()> {
    let opened = super::open_pool_with(&a.drives, true, Default::default(), !a.no_degraded);
    let (st, live, scrub) = match opened {
        Ok(pool) => (pool.status(), None, None),
        // Held by a running server: show what it publishes.
        Err(e) if super::serve::is_locked(&e) => match served_status(&a.drives)? {
            Some((doc, age)) => (doc.status, Some((doc.pid, age)), doc.scrub),
            None => return Err(e),
        },
        Err(e) if a.health => {
            println!("pool cannot be opened: {e:#}");
            std::process::exit(2);
        }
        Err(e) => return Err(e),
    };
    if a.health {
        println!("{}", health_line(&st));
        std::process::exit(st.health.exit_code());
    }
    if a.json {
        if let Some(scrub) = scrub {
            // The server's scrub, beside the pool's status.
            let mut doc = serde_json::to_value(&st)?;
            doc["scrub"] = serde_json::to_value(&scrub)?;
            println!("{}", serde_json::to_string_pretty(&doc)?);
            return Ok(());
        }
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    if let Some((pid, age)) = live {
        println!("(live status from `lograid serve`, pid {pid}, {age:.0} s ago)");
    }
    print_human(&st);
    if let Some(p) = scrub {
        println!(
            "scrub:     {} ({}), {} of {} rows, {:.0} s{}",
            p.state,
            if p.repair { "repairing" } else { "check only" },
            p.rows_done,
            p.rows_total,
            p.seconds,
            p.report
                .map(|r| format!(
                    "; {} blocks repaired, {} lost",
                    r.repaired_blocks,
                    r.lost_blocks.len()
                ))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The status published by the server holding `drives`, if any.
fn served_status(drives: &[PathBuf]) -> Result<Option<(crate::live::Published, f64)>> {
    for path in super::expand_drives(drives)? {
        let Ok(member) = FileMember::open(&path, OpenMode::Peek) else {
            continue;
        };
        if let Ok(sb) = lograid::read_superblock(&member) {
            return Ok(crate::live::read(&format!("{:032x}", sb.pool_uuid)));
        }
    }
    Ok(None)
}

fn print_human(st: &PoolStatus) {
    print_capacity(st);
    print_activity(st);
    for e in st.events.iter().rev().take(5).rev() {
        println!("event:     {} (unix time {})", e.message, e.unix_time);
    }
    println!();
    print_members(st);
    println!();
    print_volumes(&st.volumes);
}

/// Name, state, geometry, capacity and segments.
fn print_capacity(st: &PoolStatus) {
    println!("pool:      {} ({})", st.name, st.uuid);
    println!("state:     {}", st.state);
    println!("health:    {}", health_line(st));
    println!(
        "geometry:  {} members, parity {}, chunk {}, segment {} per member",
        st.members_total,
        st.parity,
        human(st.chunk_bytes),
        human(st.segment_bytes_per_member)
    );
    println!(
        "capacity:  {} usable ({} raw data capacity); {} stored, {} free",
        human(st.usable_bytes),
        human(st.capacity_bytes),
        human(st.stored_bytes),
        human(st.free_bytes)
    );
    if st.stored_bytes > st.usable_bytes {
        println!(
            "           {} more than the pool can hold now (degraded: rows are narrower); \
             writes of new data get 'no space' until a replacement is added",
            human(st.stored_bytes - st.usable_bytes)
        );
    }
    println!(
        "segments:  {} total, {} free, {} in use, {} awaiting flush",
        st.segments_total, st.segments_free, st.segments_in_use, st.segments_pending_free
    );
}

/// Writes, held sub-block writes, integrity, the cleaner, the map, and a rebuild or rebalance
/// under way.
fn print_activity(st: &PoolStatus) {
    println!(
        "writes:    {} by volumes, {} to members: write amplification {:.2}",
        human(st.counters.user_bytes_written),
        human(st.member_bytes_written),
        st.write_amplification
    );
    if st.overlay_blocks > 0 {
        println!(
            "held:      sub-block writes to {} blocks in memory (merged by the next flush)",
            st.overlay_blocks
        );
    }
    println!(
        "integrity: {} bad blocks found (by reads and scrubs), {} repaired, {} lost since opened",
        st.checksum_errors, st.repaired_blocks, st.lost_blocks_seen
    );
    let c = &st.cleaner;
    println!(
        "cleaner:   {} ({}), {} segments cleaned since open, {} relocated in all{}",
        c.state.name(),
        c.policy.name(),
        c.segments_cleaned,
        human(c.relocated_bytes),
        if c.discard {
            format!(", {} discarded on the members", human(c.discarded_bytes))
        } else {
            String::new()
        }
    );
    println!(
        "           write amplification over the last {:.0} s: {}; writes that waited for the cleaner: {} ({:.1} s)",
        c.window_seconds,
        c.write_amplification_last_minute
            .map(|w| format!("{w:.2}"))
            .unwrap_or_else(|| "- (no writes)".into()),
        c.write_stalls,
        c.write_stall_seconds
    );
    println!(
        "           since open: {} relocated by writers out of room, {} cold data moved again ({} to the cold head), {} written as long-lived",
        human(c.foreground_relocated_bytes),
        human(c.relocated_again_bytes),
        human(c.cold_written_bytes),
        human(c.long_lived_written_bytes)
    );
    println!(
        "map:       {} in memory, {:.1} bytes per stored block",
        human(st.map_memory_bytes),
        st.map_bytes_per_stored_block
    );
    println!("memory:    {}", memory_by_kind(&st.memory));
    if let Some(r) = &st.reshape {
        println!(
            "{:<10} {}{}: {} segments ({}) left, {} done ({} moved){}{}",
            format!("{}:", r.kind),
            r.kind,
            if r.paused { " (paused)" } else { "" },
            r.segments_left,
            human(r.bytes_left),
            r.segments_done,
            human(r.bytes_moved),
            r.rate_bytes_per_second
                .map(|x| format!(", {}/s", human(x as u64)))
                .unwrap_or_default(),
            r.eta_seconds
                .map(|x| format!(", about {x:.0} s to go"))
                .unwrap_or_default()
        );
    }
}

/// The member table.
fn print_members(st: &PoolStatus) {
    println!(
        "{:<3} {:<8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>6}  PATH",
        "#", "STATE", "SIZE", "READ", "WRITTEN", "CKSUM", "REPAIRED", "IOERR", "SLOW"
    );
    for m in &st.members {
        println!(
            "{:<3} {:<8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>6}  {}",
            m.index,
            m.state,
            human(m.size_bytes),
            human(m.counters.bytes_read),
            human(m.counters.bytes_written),
            m.counters.checksum_errors,
            m.counters.repaired_blocks,
            m.counters.io_errors,
            m.slow_ios,
            m.path
        );
    }
}

/// The volume table of `status` and `volume list`.
pub fn print_volumes(volumes: &[lograid::pool::VolumeStatus]) {
    println!("{:<24} {:>12} {:>12}", "VOLUME", "SIZE", "STORED");
    for v in volumes {
        println!(
            "{:<24} {:>12} {:>12}",
            v.name,
            human(v.size_bytes),
            human(v.stored_bytes)
        );
    }
}

/// `status -x`: the pool's health in one line.
fn health_line(st: &PoolStatus) -> String {
    if st.health_reasons.is_empty() {
        return format!("pool '{}' is healthy", st.name);
    }
    let health = serde_json::to_value(st.health)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "pool '{}' is {health}: {}",
        st.name,
        st.health_reasons.join("; ")
    )
}

/// The engine's memory by kind, on one line (`status`, `bench`).
pub(crate) fn memory_by_kind(m: &lograid::MemoryUse) -> String {
    format!(
        "{} in all: map {}, rows open {}, in flight {}, kept {}, sub-block writes {}, \
         column buffers {}, scratch {}",
        human(m.total_bytes),
        human(m.map_bytes),
        human(m.open_row_bytes),
        human(m.in_flight_row_bytes),
        human(m.kept_row_bytes),
        human(m.held_write_bytes),
        human(m.column_buffer_bytes),
        human(m.scratch_bytes)
    )
}
