//! `lograid scrub`: reads every row of a pool, checks every block and the
//! parity, repairs what it can, and names by volume and offset what it
//! cannot. Progress and ETA on the terminal; the exit status is non-zero
//! when anything was lost. Runs on a pool that is not being served (a served
//! pool's drives are locked by its server).

use super::open_pool;
use crate::size::human;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ScrubArgs {
    /// Check only: report what is wrong, write nothing (the pool is opened read-only).
    #[arg(long)]
    pub check: bool,
    /// Machine-readable report on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
}

pub fn run(a: ScrubArgs) -> Result<()> {
    let pool = match open_pool(&a.drives, a.check) {
        Ok(p) => p,
        Err(e) if super::serve::is_locked(&e) => bail!(
            "{e:#}; the pool is being served: stop `lograid serve` to scrub it (scrubbing a served pool \
             is not supported yet)"
        ),
        Err(e) => return Err(e),
    };
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "scrub {bar:40} {pos}/{len} rows  {per_sec}  ETA {eta}",
        )
        .expect("template"),
    );
    if a.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    let report = pool.scrub(!a.check, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
        true
    });
    bar.finish_and_clear();
    let report = report?;
    pool.close()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "scrub of pool '{}': {} rows, {} read in {:.1} s ({}/s); {} blocks {}; {} lost; {} unreadable rows",
            pool.name(),
            report.rows_checked,
            human(report.bytes_read),
            report.duration.as_secs_f64(),
            human((report.bytes_read as f64 / report.duration.as_secs_f64().max(1e-3)) as u64),
            report.repaired_blocks,
            if a.check { "need repair" } else { "repaired" },
            report.lost_blocks.len(),
            report.unreadable_rows
        );
        for lost in &report.lost_blocks {
            println!(
                "  lost: volume '{}' offset {} (4 KiB): more damaged columns than parity",
                lost.volume, lost.offset
            );
        }
    }
    if !report.lost_blocks.is_empty() || report.unreadable_rows > 0 {
        bail!("scrub found data it could not repair");
    }
    Ok(())
}
