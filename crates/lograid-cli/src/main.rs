//! `lograid`: create, inspect, serve and benchmark lograid pools.
//!
//! Every command names its pool by its drives (files or block devices, in
//! any order); a directory stands for the member files (`*.img`) in it.

mod commands;
mod export;
mod live;
mod metrics;
mod os;
mod size;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "lograid",
    version,
    about = "Log-structured parity RAID: pools of drives served as block volumes"
)]
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a pool on drives (their contents are destroyed).
    Create(commands::create::CreateArgs),
    /// Show a pool's members, geometry, capacity and counters.
    Status(commands::status::StatusArgs),
    /// Read and check every block and the parity; repair what can be rebuilt.
    Scrub(commands::scrub::ScrubArgs),
    /// Create, list, resize or delete volumes.
    #[command(subcommand)]
    Volume(commands::volume::VolumeCommand),
    /// Benchmark the engine on file-backed drives beside the raw disk.
    Bench(commands::bench::BenchArgs),
    /// Serve every volume of a pool over NBD (no drives: a default pool in ./lograid-data).
    Serve(commands::serve::ServeArgs),
    /// Attach a volume as a disk (needs root): a `serve --nfs` file (macOS: hdiutil, /dev/diskN;
    /// Linux: loop), or on Linux an NBD export (nbdfuse + loop) or a `serve --fuse` file (loop).
    Attach(commands::attach::AttachArgs),
    /// Detach a device made by `lograid attach`.
    Detach(commands::attach::DetachArgs),
    /// Replace a member (failed, missing, or healthy) and rebuild its live data.
    Replace(commands::members::ReplaceArgs),
    /// Add drives to a pool; old rows are rebalanced to the new width.
    Add(commands::members::AddArgs),
    /// Remove a member (failed, missing or healthy) with no replacement; its rows move to the others.
    Remove(commands::members::RemoveArgs),
    /// Change a pool's parity count (e.g. 1 to 2 after adding a drive); old rows follow.
    Parity(commands::members::ParityArgs),
    /// Pause or resume a served pool's rebuild or rebalance.
    #[command(subcommand)]
    Reshape(commands::members::ReshapeCommand),
}

fn main() -> ExitCode {
    os::pin_allocator_thresholds();
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "lograid={level},lograid_cli={level},lograid_nbd={level},lograid_nfs={level}"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let result: Result<()> = match cli.command {
        Command::Create(a) => commands::create::run(a),
        Command::Status(a) => commands::status::run(a),
        Command::Scrub(a) => commands::scrub::run(a),
        Command::Volume(c) => commands::volume::run(c),
        Command::Bench(a) => commands::bench::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Attach(a) => commands::attach::run_attach(a),
        Command::Detach(a) => commands::attach::run_detach(a),
        Command::Replace(a) => commands::members::run_replace(a),
        Command::Add(a) => commands::members::run_add(a),
        Command::Remove(a) => commands::members::run_remove(a),
        Command::Parity(a) => commands::members::run_parity(a),
        Command::Reshape(c) => commands::members::run_reshape(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lograid: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
