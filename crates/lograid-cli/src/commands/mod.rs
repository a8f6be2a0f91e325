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

/// Opens the pool on `drives` and reports what recovery did.
pub fn open_pool(drives: &[PathBuf], read_only: bool) -> Result<Pool> {
    open_pool_with(drives, read_only, PoolOptions::default())
}

pub fn open_pool_with(drives: &[PathBuf], read_only: bool, options: PoolOptions) -> Result<Pool> {
    let paths = expand_drives(drives)?;
    let pool = lograid::open_paths(&paths, options, read_only).map_err(anyhow::Error::new)?;
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
    Ok(pool)
}
