//! `lograid status`: members, geometry, capacity, counters.

use super::open_pool;
use crate::size::human;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct StatusArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
}

pub fn run(a: StatusArgs) -> Result<()> {
    let pool = open_pool(&a.drives, true)?;
    let st = pool.status();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    println!("pool:      {} ({})", st.name, st.uuid);
    println!("state:     {}", st.state);
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
    println!(
        "segments:  {} total, {} free, {} sealed, {} awaiting flush",
        st.segments_total, st.segments_free, st.segments_sealed, st.segments_pending_free
    );
    println!(
        "writes:    {} by volumes, {} to members: write amplification {:.2}",
        human(st.counters.user_bytes_written),
        human(st.member_bytes_written),
        st.write_amplification
    );
    println!(
        "integrity: {} checksum errors found, {} blocks repaired",
        st.checksum_errors, st.repaired_blocks
    );
    println!(
        "map:       {} in memory, {:.1} bytes per stored block",
        human(st.map_memory_bytes),
        st.map_bytes_per_stored_block
    );
    println!();
    println!(
        "{:<3} {:<8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7}  PATH",
        "#", "STATE", "SIZE", "READ", "WRITTEN", "CKSUM", "REPAIRED", "IOERR"
    );
    for m in &st.members {
        println!(
            "{:<3} {:<8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7}  {}",
            m.index,
            m.state,
            human(m.size_bytes),
            human(m.counters.bytes_read),
            human(m.counters.bytes_written),
            m.counters.checksum_errors,
            m.counters.repaired_blocks,
            m.counters.io_errors,
            m.path
        );
    }
    println!();
    print_volumes(&st.volumes);
    Ok(())
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
