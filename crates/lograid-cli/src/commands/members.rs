//! `lograid replace`, `lograid add`, `lograid remove`, `lograid parity` and
//! `lograid reshape`: change a pool's members. On a served pool the request goes to the server over its control
//! socket and the rebuild or rebalance runs there, in the background; this
//! command then follows its progress from the published status (Ctrl-C stops
//! following, not the rebuild). On a pool that is not served, the command
//! opens it and does the work itself, in the foreground; if stopped, the
//! rebuild goes on the next time the pool is opened.

use super::open_pool;
use crate::live::{self, Request};
use crate::size::{human, parse_size};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use lograid::device::{FileMember, OpenMode};
use lograid::{Pool, PoolStatus};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct ReplaceArgs {
    /// The pool: a folder of member files (*.img) or a comma-separated list of its drives.
    pub pool: String,
    /// The member to replace: its index (as `lograid status` shows), path or UUID.
    pub old: String,
    /// The new drive (a file is created, sparse, if missing). May be the old drive, back again.
    pub new: PathBuf,
    #[command(flatten)]
    pub new_drives: NewDriveArgs,
}

/// How new drives are taken, for replace and add.
#[derive(Args)]
pub struct NewDriveArgs {
    /// Size of a new file if it is created (default: the old member's size for
    /// replace, the first member's for add).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Use a drive even if it holds a filesystem or another pool.
    #[arg(long)]
    pub force: bool,
    /// Return once the change has started (served pools only).
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Args)]
pub struct AddArgs {
    /// The pool: a folder of member files (*.img) or a comma-separated list of its drives.
    pub pool: String,
    /// Drives to add (files are created, sparse, with --size if missing).
    #[arg(required = true)]
    pub drives: Vec<PathBuf>,
    #[command(flatten)]
    pub new_drives: NewDriveArgs,
}

#[derive(Args)]
pub struct RemoveArgs {
    /// The pool: a folder of member files (*.img) or a comma-separated list of its drives.
    pub pool: String,
    /// The member to remove: its index (as `lograid status` shows), path or UUID.
    pub member: String,
    /// Return once the removal has started (served pools only).
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Args)]
pub struct ParityArgs {
    /// The pool: a folder of member files (*.img) or a comma-separated list of its drives.
    pub pool: String,
    /// Parity columns per row from now on (0-3, fewer than the members).
    pub parity: u8,
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Subcommand)]
pub enum ReshapeCommand {
    /// Pause a served pool's rebuild or rebalance.
    Pause { pool: String },
    /// Resume it.
    Resume { pool: String },
}

fn pool_drives(pool: &str) -> Result<Vec<PathBuf>> {
    let paths: Vec<PathBuf> = pool.split(',').map(PathBuf::from).collect();
    super::expand_drives(&paths)
}

/// The UUID of the pool on `drives`, if a running server holds it.
pub fn served_uuid(drives: &[PathBuf]) -> Option<String> {
    for path in drives {
        let Ok(member) = FileMember::open(path, OpenMode::Peek) else {
            continue;
        };
        if let Ok(sb) = lograid::read_superblock(&member) {
            let uuid = format!("{:032x}", sb.pool_uuid);
            return live::read(&uuid).map(|_| uuid);
        }
    }
    None
}

/// Member index named by `old`: an index, a path or a UUID (prefix).
fn resolve_member(st: &PoolStatus, old: &str) -> Result<usize> {
    if let Ok(i) = old.parse::<usize>() {
        if st.members.iter().any(|m| m.index == i) {
            return Ok(i);
        }
        bail!("pool '{}' has no member {i}", st.name);
    }
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let wanted = canon(old);
    st.members
        .iter()
        .find(|m| (m.path != "-" && canon(&m.path) == wanted) || (old.len() >= 8 && m.uuid.starts_with(old)))
        .map(|m| m.index)
        .with_context(|| {
            format!(
                "'{old}' is not a member of pool '{}' (give its index, path or UUID; see `lograid status`)",
                st.name
            )
        })
}

pub fn run_replace(a: ReplaceArgs) -> Result<()> {
    let drives = pool_drives(&a.pool)?;
    let st_for = |st: &PoolStatus| -> Result<(usize, Option<u64>)> {
        let old = resolve_member(st, &a.old)?;
        let size = a.new_drives.size.or_else(|| {
            st.members
                .iter()
                .find(|m| m.index == old)
                .map(|m| m.size_bytes)
        });
        Ok((old, size))
    };
    let new = absolute(&a.new)?;
    if let Some(uuid) = served_uuid(&drives) {
        let (published, _) = live::read(&uuid).context("the server stopped")?;
        let (old, size) = st_for(&published.status)?;
        let req = Request::Replace {
            old,
            new,
            size,
            force: a.new_drives.force,
        };
        return remote(&uuid, &req, a.new_drives.no_wait);
    }
    let pool = open_pool(&drives, false)?;
    let (old, size) = st_for(&pool.status())?;
    let req = Request::Replace {
        old,
        new,
        size,
        force: a.new_drives.force,
    };
    local(&pool, &req)
}

pub fn run_add(a: AddArgs) -> Result<()> {
    let drives = pool_drives(&a.pool)?;
    let new: Vec<PathBuf> = a
        .drives
        .iter()
        .map(|d| absolute(d))
        .collect::<Result<_>>()?;
    if let Some(uuid) = served_uuid(&drives) {
        let req = Request::Add {
            drives: new,
            size: a.new_drives.size,
            force: a.new_drives.force,
        };
        return remote(&uuid, &req, a.new_drives.no_wait);
    }
    let pool = open_pool(&drives, false)?;
    let size = a
        .new_drives
        .size
        .or_else(|| pool.status().members.first().map(|m| m.size_bytes));
    let req = Request::Add {
        drives: new,
        size,
        force: a.new_drives.force,
    };
    local(&pool, &req)
}

pub fn run_remove(a: RemoveArgs) -> Result<()> {
    let drives = pool_drives(&a.pool)?;
    if let Some(uuid) = served_uuid(&drives) {
        let (published, _) = live::read(&uuid).context("the server stopped")?;
        let old = resolve_member(&published.status, &a.member)?;
        return remote(&uuid, &Request::Remove { old }, a.no_wait);
    }
    let pool = open_pool(&drives, false)?;
    let old = resolve_member(&pool.status(), &a.member)?;
    local(&pool, &Request::Remove { old })
}

pub fn run_parity(a: ParityArgs) -> Result<()> {
    let drives = pool_drives(&a.pool)?;
    let req = Request::SetParity(a.parity);
    if let Some(uuid) = served_uuid(&drives) {
        return remote(&uuid, &req, a.no_wait);
    }
    let pool = open_pool(&drives, false)?;
    local(&pool, &req)
}

pub fn run_reshape(c: ReshapeCommand) -> Result<()> {
    let (pool, pause) = match &c {
        ReshapeCommand::Pause { pool } => (pool, true),
        ReshapeCommand::Resume { pool } => (pool, false),
    };
    let drives = pool_drives(pool)?;
    let Some(uuid) = served_uuid(&drives) else {
        bail!("the pool is not being served; a rebuild or rebalance runs when it is opened (`lograid serve`)");
    };
    let reply = live::send(&uuid, &Request::PauseReshape(pause))?;
    if !reply.ok {
        bail!("{}", reply.message);
    }
    println!("lograid: {}", reply.message);
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

fn bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {pos}/{len} segments  {elapsed_precise}  ETA {eta}",
        )
        .expect("template"),
    );
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Asks the server, then follows the rebuild in its published status.
fn remote(uuid: &str, req: &Request, no_wait: bool) -> Result<()> {
    let reply = live::send(uuid, req)?;
    if !reply.ok {
        bail!("{}", reply.message);
    }
    eprintln!("lograid: {}", reply.message);
    if no_wait {
        return Ok(());
    }
    let bar = bar();
    // The server publishes once a second.
    std::thread::sleep(Duration::from_millis(1500));
    loop {
        let Some((doc, _)) = live::read(uuid) else {
            bar.abandon();
            bail!("the server stopped; the rebuild goes on when the pool is served again");
        };
        match doc.status.reshape {
            None => break,
            Some(r) => {
                bar.set_message(r.kind.clone());
                bar.set_length(r.segments_done + r.segments_left);
                bar.set_position(r.segments_done);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bar.finish_and_clear();
    eprintln!(
        "lograid: done; the pool is {}",
        live::read(uuid)
            .map(|(d, _)| d.status.state)
            .unwrap_or_default()
    );
    Ok(())
}

/// Does the change and the whole rebuild here, then closes the pool.
fn local(pool: &Pool, req: &Request) -> Result<()> {
    let message = live::apply(pool, &Default::default(), req)?;
    eprintln!("lograid: {}", message.replace(" in the background", ""));
    let bar = bar();
    let started = std::time::Instant::now();
    // "rebuild" (replace, remove) or "rebalance" (add, parity).
    let kind = pool
        .status()
        .reshape
        .map(|r| r.kind)
        .unwrap_or_else(|| "moving".into());
    pool.reshape(|done, left| {
        bar.set_message(kind.clone());
        bar.set_length(done + left);
        bar.set_position(done);
        true
    })?;
    bar.finish_and_clear();
    let st = pool.status();
    pool.close()?;
    eprintln!(
        "lograid: done in {:.1} s; pool '{}' is {} ({} stored)",
        started.elapsed().as_secs_f64(),
        st.name,
        st.state,
        human(st.stored_bytes)
    );
    Ok(())
}
