//! `lograid scrub`: reads every row of a pool, checks every block and the
//! parity, repairs what it can, and names by volume and offset what it
//! cannot. Progress and ETA on the terminal; the exit status is non-zero
//! when anything was lost. On a served pool the server scrubs, in the
//! background, while it serves; this command starts it and follows it
//! (`--pause`, `--resume`, `--cancel` control it; Ctrl-C only stops following).

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
    /// Served pool: pause its scrub.
    #[arg(long, conflicts_with_all = ["resume", "cancel"])]
    pub pause: bool,
    /// Served pool: resume a paused scrub.
    #[arg(long, conflicts_with = "cancel")]
    pub resume: bool,
    /// Served pool: stop its scrub.
    #[arg(long)]
    pub cancel: bool,
    /// Served pool: start the scrub and return.
    #[arg(long)]
    pub no_wait: bool,
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
}

pub fn run(a: ScrubArgs) -> Result<()> {
    let drives = super::expand_drives(&a.drives)?;
    if let Some(uuid) = super::members::served_uuid(&drives) {
        return served(&a, &uuid);
    }
    if a.pause || a.resume || a.cancel {
        bail!("no server holds this pool, so no scrub runs in the background to control");
    }
    let pool = open_pool(&a.drives, a.check)?;
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
    print_report(pool.name(), &report, a.check, a.json)
}

fn print_report(name: &str, report: &lograid::ScrubReport, check: bool, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!(
            "scrub of pool '{}': {} rows, {} read in {:.1} s ({}/s); {} blocks {}; {} lost; {} unreadable rows",
            name,
            report.rows_checked,
            human(report.bytes_read),
            report.duration.as_secs_f64(),
            human((report.bytes_read as f64 / report.duration.as_secs_f64().max(1e-3)) as u64),
            report.repaired_blocks,
            if check { "need repair" } else { "repaired" },
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
    if !report.complete {
        bail!("the scrub was stopped before the end");
    }
    Ok(())
}

/// The pool is served: its server scrubs; start, control or follow it.
fn served(a: &ScrubArgs, uuid: &str) -> Result<()> {
    use crate::live::{self, Request};
    let req = if a.pause {
        Request::PauseScrub(true)
    } else if a.resume {
        Request::PauseScrub(false)
    } else if a.cancel {
        Request::CancelScrub
    } else {
        Request::Scrub { repair: !a.check }
    };
    let starting = matches!(req, Request::Scrub { .. });
    // The server stamps the scrub it starts; older reports are not this one.
    let sent_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let reply = live::send(uuid, &req)?;
    if !reply.ok {
        bail!("{}", reply.message);
    }
    eprintln!("lograid: {}", reply.message);
    if !starting || a.no_wait {
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("scrub {msg} {bar:40} {pos}/{len} rows  ETA {eta}")
            .expect("template"),
    );
    if a.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let Some((doc, _)) = live::read(uuid) else {
            bar.abandon();
            bail!("the server stopped during the scrub");
        };
        let Some(p) = doc.scrub.filter(|p| p.started_unix >= sent_unix) else {
            continue;
        };
        bar.set_message(p.state.clone());
        bar.set_length(p.rows_total);
        bar.set_position(p.rows_done);
        match (p.state.as_str(), p.report) {
            ("finished" | "cancelled", Some(report)) => {
                bar.finish_and_clear();
                return print_report(&doc.status.name, &report, !p.repair, a.json);
            }
            ("failed", _) => {
                bar.abandon();
                bail!("scrub failed: {}", p.error.unwrap_or_default());
            }
            _ => {}
        }
    }
}
