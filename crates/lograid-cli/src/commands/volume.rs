//! `lograid volume`: manage the thin volumes of a pool.

use super::open_pool;
use crate::size::{human, parse_size};
use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume.
    Create {
        /// Volume size (e.g. 100G).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        name: String,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
    },
    /// List volumes.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
    },
    /// Grow a volume.
    Resize {
        #[arg(long, value_parser = parse_size)]
        size: u64,
        name: String,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
    },
    /// Delete a volume and free its space.
    Delete {
        name: String,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
    },
}

pub fn run(c: VolumeCommand) -> Result<()> {
    match c {
        VolumeCommand::Create { size, name, drives } => {
            let pool = open_pool(&drives, false)?;
            pool.create_volume(&name, size)?;
            println!("created volume '{name}' ({})", human(size));
            pool.close()?;
        }
        VolumeCommand::List { json, drives } => {
            let pool = open_pool(&drives, true)?;
            let st = pool.status();
            if json {
                println!("{}", serde_json::to_string_pretty(&st.volumes)?);
            } else {
                super::status::print_volumes(&st.volumes);
            }
        }
        VolumeCommand::Resize { size, name, drives } => {
            let pool = open_pool(&drives, false)?;
            pool.resize_volume(&name, size)?;
            println!("volume '{name}' is now {}", human(size));
            pool.close()?;
        }
        VolumeCommand::Delete { name, drives } => {
            let pool = open_pool(&drives, false)?;
            pool.delete_volume(&name)?;
            println!("deleted volume '{name}'");
            pool.close()?;
        }
    }
    Ok(())
}
