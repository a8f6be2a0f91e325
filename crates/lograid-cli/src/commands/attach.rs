//! `lograid attach` / `lograid detach`: a volume as a kernel block device. Three ways:
//! an NBD export on hosts without the nbd driver (nbdfuse + a direct-I/O loop device, see
//! `lograid_nbd::attach`), a `serve --fuse` file (a loop device), both Linux only
//! (`crate::os::attach_supported`); and a volume's file from `serve --nfs` (`nfs.rs`: on
//! macOS a disk image, /dev/diskN; on Linux a loop device).
//!
//! Owns: the command-line form of attach, detach and listing. Must never: detach a device it
//! has no record of (the records live in the state directory).

mod nfs;

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

pub const DEFAULT_STATE_DIR: &str = crate::os::RUN_DIR;

#[derive(Args)]
pub struct AttachArgs {
    /// NBD server URI (nbd://HOST:PORT or nbd+unix:///?socket=PATH).
    #[arg(
        long,
        default_value = "nbd://127.0.0.1:10809",
        conflicts_with_all = ["socket", "nfs"]
    )]
    pub server: String,
    /// Connect to a `lograid serve --socket PATH` Unix socket instead.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export (volume) name; default: the server's default export (its first volume), or
    /// with --nfs the only volume served.
    #[arg(long, value_name = "NAME")]
    pub export: Option<String>,
    /// Attach a volume's file from `lograid serve --fuse DIR` (DIR/VOLUME) instead of an NBD
    /// export: only a loop device, no NBD client in between.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["socket", "export", "nfs"])]
    pub file: Option<PathBuf>,
    /// Attach a volume's file from `lograid serve --nfs ADDR:PORT` (or PORT on 127.0.0.1):
    /// the export is mounted under the state directory and the file attached as a disk
    /// (macOS: /dev/diskN through hdiutil; Linux: /dev/loopN with direct I/O).
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "socket")]
    pub nfs: Option<String>,
    /// With --nfs on macOS: mount the filesystems found on the disk (an APFS volume made on it
    /// before); by default none is mounted (a fresh volume has none to mount).
    #[arg(long, requires = "nfs")]
    pub mount: bool,
    /// With --nfs: more NFS mount options, appended to lograid's (e.g. rsize=65536).
    #[arg(long, value_name = "OPTIONS", requires = "nfs")]
    pub nfs_options: Option<String>,
    /// Where attachments are recorded (and nbdfuse is mounted).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// List the recorded attachments instead of attaching.
    #[arg(long)]
    pub list: bool,
}

#[derive(Args)]
pub struct DetachArgs {
    /// The device to detach (as printed by `lograid attach`).
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
    if a.list {
        return print_attachments(&a.state_dir);
    }
    let detach_hint = if a.state_dir.as_os_str() == DEFAULT_STATE_DIR {
        String::new()
    } else {
        format!(" --state-dir {}", a.state_dir.display())
    };
    if let Some(addr) = &a.nfs {
        return attach_nfs(&a, addr, &detach_hint);
    }
    crate::os::attach_supported()?;
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

/// `attach --nfs ADDR`: the volume's file from the NFS export as a disk.
fn attach_nfs(a: &AttachArgs, addr: &str, detach_hint: &str) -> Result<()> {
    let server = super::serve::parse_nfs_addr(addr)?;
    let record = nfs::attach(&nfs::NfsAttach {
        server,
        volume: a.export.as_deref(),
        state_dir: &a.state_dir,
        mount_volumes: a.mount,
        mount_options: a.nfs_options.as_deref(),
    })
    .with_context(|| format!("attaching a volume of the NFS server at {server}"))?;
    let device = record.device.display();
    eprintln!(
        "lograid: attached {} as {device} (NFS mount {}); detach with `lograid detach {device}{detach_hint}`",
        record.uri(),
        record.mount_dir.display()
    );
    if !a.mount {
        eprintln!(
            "lograid: new volume? {}",
            crate::os::format_hint(&record.device)
        );
    }
    println!("{device}");
    Ok(())
}

/// `attach --list`: the attachments recorded in `state_dir`, one a line.
fn print_attachments(state_dir: &Path) -> Result<()> {
    let from_nfs = nfs::list(state_dir)?;
    for r in &from_nfs {
        println!(
            "{}\t{}\t(NFS mount {})",
            r.device.display(),
            r.uri(),
            r.mount_dir.display()
        );
    }
    let records = if crate::os::attach_supported().is_ok() {
        lograid_nbd::list_attachments(state_dir)?
    } else {
        Vec::new()
    };
    if records.is_empty() && from_nfs.is_empty() {
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

/// Detaches `device`: an NFS attachment if one is recorded, else (Linux) an NBD or FUSE
/// file one.
fn detach_any(state_dir: &Path, device: &Path) -> Result<()> {
    if nfs::detach(state_dir, device)? {
        return Ok(());
    }
    if crate::os::attach_supported().is_err() {
        bail!(
            "no attachment of {} is recorded in {}",
            device.display(),
            state_dir.display()
        );
    }
    detach_one(state_dir, device)
}

pub fn run_detach(a: DetachArgs) -> Result<()> {
    if a.all {
        let mut devices: Vec<PathBuf> = nfs::list(&a.state_dir)?
            .into_iter()
            .map(|r| r.device)
            .collect();
        if crate::os::attach_supported().is_ok() {
            devices.extend(
                lograid_nbd::list_attachments(&a.state_dir)?
                    .into_iter()
                    .map(|r| r.loop_device),
            );
        }
        let mut failed = 0;
        for device in &devices {
            match detach_any(&a.state_dir, device) {
                Ok(()) => eprintln!("lograid: detached {}", device.display()),
                Err(e) => {
                    failed += 1;
                    eprintln!("lograid: error: detaching {}: {e:#}", device.display());
                }
            }
        }
        if failed > 0 {
            bail!(
                "{failed} of {} devices could not be detached",
                devices.len()
            );
        }
        if devices.is_empty() {
            eprintln!(
                "lograid: nothing attached (state directory {})",
                a.state_dir.display()
            );
        }
        return Ok(());
    }
    let Some(device) = a.device else {
        bail!("name the device to detach, or --all");
    };
    detach_any(&a.state_dir, &device).with_context(|| format!("detaching {}", device.display()))?;
    eprintln!("lograid: detached {}", device.display());
    Ok(())
}
