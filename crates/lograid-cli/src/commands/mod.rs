//! One module per command, plus how commands find and open a pool.

pub mod attach;
pub mod bench;
pub mod create;
pub mod members;
pub mod scrub;
pub mod serve;
pub mod status;
pub mod volume;

use anyhow::{bail, Context, Result};
use lograid::{Pool, PoolOptions};
use std::path::PathBuf;

/// Drives named on the command line; a directory stands for its `*.img` files.
pub fn expand_drives(args: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for a in args {
        if a.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(a)
                .with_context(|| format!("listing {}", a.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "img") && p.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("{} holds no member files (*.img)", a.display());
            }
            out.extend(files);
        } else {
            out.push(a.clone());
        }
    }
    if out.is_empty() {
        bail!("no drives given");
    }
    Ok(out)
}

/// Opens the pool on `drives` and reports what recovery did; drives it
/// cannot use are set aside and the pool opens degraded while the parity
/// covers what is missing.
pub fn open_pool(drives: &[PathBuf], read_only: bool) -> Result<Pool> {
    open_pool_with(drives, read_only, PoolOptions::default(), true)
}

/// Opens the pool on `drives`: a drive that cannot be opened or is not a
/// usable member of the pool is set aside with a log line; with members
/// missing the pool opens degraded (saying which, and how to replace
/// them), unless `allow_degraded` is false: then it refuses before
/// writing anything.
pub fn open_pool_with(
    drives: &[PathBuf],
    read_only: bool,
    options: PoolOptions,
    allow_degraded: bool,
) -> Result<Pool> {
    let paths = expand_drives(drives)?;
    let survey = lograid::survey_paths(&paths, read_only).map_err(anyhow::Error::new)?;
    for s in &survey.set_aside {
        tracing::warn!("{}: set aside: {}", s.drive, s.reason);
    }
    let missing = survey.missing.clone();
    if !missing.is_empty() && missing.len() <= survey.parity as usize {
        let hint = degraded_hint(&survey, drives);
        if !allow_degraded {
            bail!(
                "pool '{}' is degraded and --no-degraded was given: {hint}",
                survey.pool_name
            );
        }
        tracing::warn!("pool '{}' is DEGRADED: {hint}", survey.pool_name);
    }
    let set_aside = survey.set_aside.clone();
    let pool = lograid::open_members(survey.members, options, read_only).map_err(|e| {
        if set_aside.is_empty() {
            return anyhow::Error::new(e);
        }
        let list: Vec<String> = set_aside
            .iter()
            .map(|s| format!("{} ({})", s.drive, s.reason))
            .collect();
        anyhow::anyhow!("{e}; drives set aside: {}", list.join("; "))
    })?;
    report_recovery(&pool);
    Ok(pool)
}

/// Which members are missing and the command that replaces each.
fn degraded_hint(survey: &lograid::Survey, drives: &[PathBuf]) -> String {
    // `replace` names the pool as a folder or a comma-separated list.
    let named: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
    let pool = named.join(",");
    let which: Vec<String> = survey
        .missing
        .iter()
        .map(|m| {
            format!("member {m} is missing (to replace it: lograid replace {pool} {m} NEW-DRIVE)")
        })
        .collect();
    which.join("; ")
}

/// Prints what recovery did on open.
fn report_recovery(pool: &Pool) {
    if let Some(r) = pool.recovery_report() {
        eprintln!(
            "lograid: opened pool '{}': checkpoint {}, {} rows ({} blocks) replayed, recovery took {:.1} ms{}",
            pool.name(),
            r.checkpoint_id,
            r.rows_replayed,
            r.blocks_replayed,
            r.duration.as_secs_f64() * 1000.0,
            if r.missing_members.is_empty() {
                String::new()
            } else {
                format!("; DEGRADED, missing members {:?}", r.missing_members)
            }
        );
    }
}
