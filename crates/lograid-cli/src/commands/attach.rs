//! `lograid attach` / `lograid detach`: an NBD export as a kernel block
//! device on hosts without the nbd driver (nbdfuse + a direct-I/O loop
//! device, see `lograid_nbd::attach`).
//!
//! Owns: the command-line form of attach, detach and listing (Linux only:
//! `crate::os::attach_supported`). Must never:
//! detach a device it has no record of (the record lives in the state
//! directory).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

pub const DEFAULT_STATE_DIR: &str = "/run/lograid";

#[derive(Args)]
pub struct AttachArgs {
    /// NBD server URI (nbd://HOST:PORT or nbd+unix:///?socket=PATH).
    #[arg(
        long,
        default_value = "nbd://127.0.0.1:10809",
        conflicts_with = "socket"
    )]
    pub server: String,
    /// Connect to a `lograid serve --socket PATH` Unix socket instead.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export (volume) name; default: the server's default export (its first volume).
    #[arg(long, value_name = "NAME")]
    pub export: Option<String>,
    /// Attach a volume's file from `lograid serve --fuse DIR` (DIR/VOLUME) instead of an NBD
    /// export: only a loop device, no NBD client in between.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["socket", "export"])]
    pub file: Option<PathBuf>,
    /// Where attachments are recorded (and nbdfuse is mounted).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// List the recorded attachments instead of attaching.
    #[arg(long)]
    pub list: bool,
}

#[derive(Args)]
pub struct DetachArgs {
    /// The loop device to detach (as printed by `lograid attach`).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub device: Option<PathBuf>,
    /// Detach every device recorded in the state directory.
    #[arg(long)]
    pub all: bool,
    /// Where attachments are recorded.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

pub fn run_attach(a: AttachArgs) -> Result<()> {
    crate::os::attach_supported()?;
    if a.list {
        return print_attachments(&a.state_dir);
    }
    let detach_hint = if a.state_dir.as_os_str() == DEFAULT_STATE_DIR {
        String::new()
    } else {
        format!(" --state-dir {}", a.state_dir.display())
    };
    if let Some(file) = &a.file {
        let attached = lograid_nbd::attach_file(file, &a.state_dir)
            .with_context(|| format!("attaching {}", file.display()))?;
        let device = attached.loop_device().display().to_string();
        eprintln!(
            "lograid: attached {} as {device} (direct I/O); detach with `lograid detach {device}{detach_hint}`",
            attached.record.uri
        );
        println!("{device}");
        return Ok(());
    }
    let uri = server_uri(&a)?;
    let export = a.export.as_deref().unwrap_or("");
    let attached = lograid_nbd::attach(&uri, export, &a.state_dir).with_context(|| {
        format!(
            "attaching {uri}{}",
            if export.is_empty() {
                String::new()
            } else {
                format!(" export '{export}'")
            }
        )
    })?;
    let device = attached.loop_device().display().to_string();
    eprintln!(
        "lograid: attached {} as {device} (direct I/O; nbdfuse pid {}); detach with `lograid detach {device}{detach_hint}`",
        attached.record.uri,
        attached.record.nbdfuse_pid,
    );
    println!("{device}");
    // Dropping the handle leaves the device attached; nbdfuse runs on in its own process group.
    drop(attached);
    Ok(())
}

/// `attach --list`: the attachments recorded in `state_dir`, one a line.
fn print_attachments(state_dir: &Path) -> Result<()> {
    let records = lograid_nbd::list_attachments(state_dir)?;
    if records.is_empty() {
        eprintln!(
            "lograid: no attachments recorded in {}",
            state_dir.display()
        );
    }
    for r in records {
        if r.owns_mount() {
            println!(
                "{}\t{}\t(nbdfuse pid {})",
                r.loop_device.display(),
                r.uri,
                r.nbdfuse_pid
            );
        } else {
            println!(
                "{}\t{}\t(lograid serve --fuse)",
                r.loop_device.display(),
                r.uri
            );
        }
    }
    Ok(())
}

/// The NBD URI to attach: the Unix socket's (made absolute), or `--server`.
fn server_uri(a: &AttachArgs) -> Result<String> {
    Ok(match &a.socket {
        Some(path) => {
            let path = std::path::absolute(path)
                .with_context(|| format!("resolving {}", path.display()))?;
            format!("nbd+unix:///?socket={}", path.display())
        }
        None => {
            if !a.server.starts_with("nbd") {
                bail!(
                    "--server '{}': expected an NBD URI such as nbd://127.0.0.1:10809",
                    a.server
                );
            }
            a.server.clone()
        }
    })
}

/// Detaches one recorded device, then removes its FUSE mount if it outlived
/// nbdfuse: when the server dies, nbdfuse exits but its mount stays behind
/// ("Transport endpoint is not connected"), and `lograid_nbd::detach` only
/// unmounts while nbdfuse runs.
fn detach_one(state_dir: &Path, device: &Path) -> Result<()> {
    let record = lograid_nbd::list_attachments(state_dir)?
        .into_iter()
        .find(|r| r.loop_device == device);
    lograid_nbd::detach(state_dir, device)?;
    if let Some(record) = record.filter(|r| r.owns_mount()) {
        if crate::os::is_fuse_mount_point(&record.mount_dir) {
            let status = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(&record.mount_dir)
                .stdin(std::process::Stdio::null())
                .status();
            if !status.is_ok_and(|s| s.success()) {
                bail!(
                    "detached {}, but could not unmount the stale FUSE mount {}",
                    device.display(),
                    record.mount_dir.display()
                );
            }
            let _ = std::fs::remove_dir(&record.mount_dir);
        }
    }
    Ok(())
}

pub fn run_detach(a: DetachArgs) -> Result<()> {
    crate::os::attach_supported()?;
    if a.all {
        let records = lograid_nbd::list_attachments(&a.state_dir)?;
        let mut failed = 0;
        for r in &records {
            match detach_one(&a.state_dir, &r.loop_device) {
                Ok(()) => eprintln!("lograid: detached {}", r.loop_device.display()),
                Err(e) => {
                    failed += 1;
                    eprintln!(
                        "lograid: error: detaching {}: {e:#}",
                        r.loop_device.display()
                    );
                }
            }
        }
        if failed > 0 {
            bail!(
                "{failed} of {} devices could not be detached",
                records.len()
            );
        }
        if records.is_empty() {
            eprintln!(
                "lograid: nothing attached (state directory {})",
                a.state_dir.display()
            );
        }
        return Ok(());
    }
    let device = a.device.expect("clap requires a device without --all");
    detach_one(&a.state_dir, &device).with_context(|| format!("detaching {}", device.display()))?;
    eprintln!("lograid: detached {}", device.display());
    Ok(())
}
