//! `lograid create`: make a pool on drives.

use crate::size::{human, parse_size};
use anyhow::{Context, Result};
use clap::Args;
use lograid::{CreateOptions, PoolOptions};
use std::path::PathBuf;

#[derive(Args)]
pub struct CreateArgs {
    /// Parity columns per row: 0 (stripe) to 3; the pool survives that many failed drives.
    #[arg(short, long, default_value_t = 1)]
    pub parity: u8,
    /// Column height of a full row (power of two, 4K to 1M).
    #[arg(long, default_value = "512K", value_parser = parse_size)]
    pub chunk: u64,
    /// Segment size per drive (allocation and cleaning unit); default from the drive sizes.
    #[arg(long, value_parser = parse_size)]
    pub segment: Option<u64>,
    /// Create missing drive files as sparse files of this size.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Pool name.
    #[arg(long, default_value = "lograid")]
    pub name: String,
    /// Create a volume at once: NAME:SIZE (e.g. vol0:100G).
    #[arg(long)]
    pub volume: Option<String>,
    /// Overwrite drives that hold a filesystem, partition table or another pool.
    #[arg(long)]
    pub force: bool,
    /// The drives (files or block devices).
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
}

pub fn parse_volume_spec(spec: &str) -> Result<(String, u64)> {
    let (name, size) = spec
        .split_once(':')
        .with_context(|| format!("--volume '{spec}': expected NAME:SIZE"))?;
    Ok((
        name.to_string(),
        parse_size(size).map_err(anyhow::Error::msg)?,
    ))
}

pub fn run(a: CreateArgs) -> Result<()> {
    let initial_volume = a.volume.as_deref().map(parse_volume_spec).transpose()?;
    let chunk_bytes = u32::try_from(a.chunk).context("chunk size too large")?;
    let opts = CreateOptions {
        name: a.name,
        parity: a.parity,
        chunk_bytes,
        segment_bytes: a.segment,
        force: a.force,
        initial_volume,
    };
    opts.validate(a.drives.len())?;
    let members = lograid::open_new_members(&a.drives, a.size, a.force)?;
    let pool = lograid::create_pool(
        members,
        &opts,
        PoolOptions {
            background_cleaner: false,
            ..Default::default()
        },
    )?;
    let st = pool.status();
    println!(
        "created pool '{}' ({}) on {} drives, parity {}: {} usable",
        st.name,
        st.uuid,
        st.members_total,
        st.parity,
        human(st.usable_bytes)
    );
    for v in &st.volumes {
        println!("  volume '{}' ({})", v.name, human(v.size_bytes));
    }
    pool.close()?;
    Ok(())
}
