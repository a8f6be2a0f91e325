//! Linux's tools for showing a volume's file from `serve --nfs` as a disk: the command lines
//! of `mount -t nfs`, `losetup` and `umount`, and the reader of what `losetup` prints. Called
//! by `linux.rs`; pure, so compiled and tested on every system.
//!
//! Must never: run anything (`linux.rs` does).

use super::macos_tools::export_source;
use super::tool::ToolCommand;
use anyhow::{bail, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// `mount -t nfs` of the export of `lograid serve --nfs` on `dir`: NFSv3 over TCP with NFS and
/// MOUNT on the server's one port (no portmapper), no lock manager, a hard mount; `extra`
/// (comma-separated options) is appended.
pub fn mount_nfs(server: SocketAddr, dir: &Path, extra: Option<&str>) -> ToolCommand {
    let port = server.port();
    let mut options =
        format!("vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock,hard");
    if let Some(extra) = extra.filter(|e| !e.is_empty()) {
        options.push(',');
        options.push_str(extra);
    }
    ToolCommand::new("mount")
        .arg("-t")
        .arg("nfs")
        .arg("-o")
        .arg(options)
        .arg(export_source(server))
        .arg(dir)
}

/// A free loop device with direct I/O on `file` (the NFS client's page cache bypassed: every
/// write and flush of the device reaches the server).
pub fn losetup_attach(file: &Path) -> ToolCommand {
    ToolCommand::new("losetup")
        .arg("--find")
        .arg("--show")
        .arg("--direct-io=on")
        .arg(file)
}

/// The file behind a loop device.
pub fn losetup_backing(device: &Path) -> ToolCommand {
    ToolCommand::new("losetup")
        .arg("--noheadings")
        .arg("--output")
        .arg("BACK-FILE")
        .arg(device)
}

pub fn losetup_detach(device: &Path) -> ToolCommand {
    ToolCommand::new("losetup").arg("--detach").arg(device)
}

pub fn umount(dir: &Path) -> ToolCommand {
    ToolCommand::new("umount").arg(dir)
}

/// The device `losetup --find --show` printed.
pub fn attached_loop(output: &str) -> Result<PathBuf> {
    match output.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(device) if device.starts_with("/dev/") => Ok(PathBuf::from(device)),
        _ => bail!("losetup printed no device: {:?}", output.trim()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_commands_name_the_server_port_file_and_device() {
        let dir = Path::new("/run/lograid/nfs-20490-vol0");
        assert_eq!(
            mount_nfs("127.0.0.1:20490".parse().unwrap(), dir, None).to_string(),
            "mount -t nfs -o vers=3,proto=tcp,port=20490,mountport=20490,mountproto=tcp,nolock,hard \
             127.0.0.1:/ /run/lograid/nfs-20490-vol0"
        );
        assert_eq!(
            losetup_attach(&dir.join("vol0")).to_string(),
            "losetup --find --show --direct-io=on /run/lograid/nfs-20490-vol0/vol0"
        );
        assert_eq!(
            losetup_backing(Path::new("/dev/loop3")).to_string(),
            "losetup --noheadings --output BACK-FILE /dev/loop3"
        );
        assert_eq!(
            attached_loop("/dev/loop3\n").unwrap(),
            Path::new("/dev/loop3")
        );
        assert!(attached_loop("").is_err());
        assert!(attached_loop("losetup: oops\n").is_err());
    }
}
