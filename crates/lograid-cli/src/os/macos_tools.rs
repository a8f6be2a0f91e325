//! macOS's tools for showing a volume's file from `serve --nfs` as a disk: the command lines
//! of `mount_nfs`, `hdiutil attach`, `hdiutil info`, `hdiutil detach` and `umount`, and the
//! readers of what `hdiutil` prints (`-plist`). Called by `macos.rs`; pure, so compiled and
//! tested on every system, against outputs of the shape hdiutil prints.
//!
//! Must never: run anything (`macos.rs` does), or take a disk of an image for its image's own
//! disk when it cannot tell them apart (that is an error).

use super::plist::{self, Plist};
use super::tool::ToolCommand;
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The content hint of the disk that APFS synthesizes for a container found on an attached
/// image (a second whole disk in hdiutil's list, not the image's own).
const APFS_CONTAINER_HINT: &str = "EF57347C-0000-11AA-AA11-00306543ECAC";

/// `HOST:/` for a mount of the server's export `/`.
pub fn export_source(server: SocketAddr) -> String {
    match server {
        SocketAddr::V4(v4) => format!("{}:/", v4.ip()),
        SocketAddr::V6(v6) => format!("[{}]:/", v6.ip()),
    }
}

/// `mount_nfs` of the export of `lograid serve --nfs` on `dir`: NFSv3 over TCP with NFS and
/// MOUNT on the server's one port, no lock manager (the server has none), a hard mount
/// (requests wait for a server that restarts instead of failing), and not shown in the
/// Finder; `extra` (comma-separated options) is appended.
pub fn mount_nfs(server: SocketAddr, dir: &Path, extra: Option<&str>) -> ToolCommand {
    let port = server.port();
    let mut options = format!("vers=3,tcp,port={port},mountport={port},nolocks,hard,nobrowse");
    if let Some(extra) = extra.filter(|e| !e.is_empty()) {
        options.push(',');
        options.push_str(extra);
    }
    ToolCommand::new("/sbin/mount_nfs")
        .arg("-o")
        .arg(options)
        .arg(export_source(server))
        .arg(dir)
}

/// `hdiutil attach` of a raw image file (the volume's bytes, no header), printing a plist;
/// its filesystems are mounted only if `mount_volumes` (a fresh volume has none, and Disk
/// Arbitration would offer to initialize it).
pub fn hdiutil_attach(file: &Path, mount_volumes: bool) -> ToolCommand {
    let mut command = ToolCommand::new("/usr/bin/hdiutil")
        .arg("attach")
        .arg("-plist");
    if !mount_volumes {
        command = command.arg("-nomount");
    }
    command
        .arg("-imagekey")
        .arg("diskimage-class=CRawDiskImage")
        .arg(file)
}

/// `hdiutil info -plist`: the attached images and their disks.
pub fn hdiutil_info() -> ToolCommand {
    ToolCommand::new("/usr/bin/hdiutil")
        .arg("info")
        .arg("-plist")
}

/// `hdiutil detach DEVICE`: unmounts the image's filesystems and detaches it.
pub fn hdiutil_detach(device: &Path) -> ToolCommand {
    ToolCommand::new("/usr/bin/hdiutil")
        .arg("detach")
        .arg(device)
}

pub fn umount(dir: &Path) -> ToolCommand {
    ToolCommand::new("/sbin/umount").arg(dir)
}

/// A disk hdiutil lists: its node and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entity {
    dev_entry: String,
    content_hint: Option<String>,
}

impl Entity {
    /// `/dev/diskN`, not a slice (`/dev/diskNsM`).
    fn is_whole_disk(&self) -> bool {
        self.dev_entry
            .strip_prefix("/dev/disk")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }
}

fn entities(value: &Plist) -> Vec<Entity> {
    let Some(list) = value.get("system-entities") else {
        return Vec::new();
    };
    list.as_array()
        .iter()
        .filter_map(|entity| {
            Some(Entity {
                dev_entry: entity.get("dev-entry")?.as_str()?.to_string(),
                content_hint: entity
                    .get("content-hint")
                    .and_then(Plist::as_str)
                    .map(str::to_string),
            })
        })
        .collect()
}

/// The image's own disk among the entities hdiutil lists for one image: the whole disk that
/// is not an APFS container synthesized from a partition of it; of several, the one holding
/// a partition map.
fn image_disk(listed: &[Entity]) -> Result<PathBuf> {
    let whole: Vec<&Entity> = listed
        .iter()
        .filter(|e| e.is_whole_disk())
        .filter(|e| e.content_hint.as_deref() != Some(APFS_CONTAINER_HINT))
        .collect();
    let partitioned: Vec<&Entity> = whole
        .iter()
        .copied()
        .filter(|e| {
            e.content_hint
                .as_deref()
                .is_some_and(|hint| hint.ends_with("_partition_scheme"))
        })
        .collect();
    match (whole.as_slice(), partitioned.as_slice()) {
        ([only], _) | (_, [only]) => Ok(PathBuf::from(&only.dev_entry)),
        ([], _) => bail!("hdiutil listed no whole disk ({})", describe(listed.iter())),
        _ => bail!(
            "hdiutil listed several whole disks and which is the image's is unclear ({})",
            describe(whole.into_iter())
        ),
    }
}

fn describe<'a>(entities: impl Iterator<Item = &'a Entity>) -> String {
    let listed: Vec<String> = entities
        .map(|e| match &e.content_hint {
            Some(hint) => format!("{} {hint}", e.dev_entry),
            None => e.dev_entry.clone(),
        })
        .collect();
    if listed.is_empty() {
        "nothing".into()
    } else {
        listed.join(", ")
    }
}

/// The disk `hdiutil attach -plist` made for the image (`/dev/diskN`).
pub fn attached_disk(attach_output: &str) -> Result<PathBuf> {
    let value = plist::parse(attach_output).context("reading hdiutil attach's output")?;
    image_disk(&entities(&value))
}

/// The image file behind `device` per `hdiutil info -plist`, or None if no attached image
/// has that disk.
pub fn image_of_device(info_output: &str, device: &Path) -> Result<Option<PathBuf>> {
    let value = plist::parse(info_output).context("reading hdiutil info's output")?;
    let Some(images) = value.get("images") else {
        bail!("hdiutil info listed no images array");
    };
    for image in images.as_array() {
        let listed = entities(image);
        if !listed.iter().any(|e| Path::new(&e.dev_entry) == device) {
            continue;
        }
        let path = image
            .get("image-path")
            .and_then(Plist::as_str)
            .context("hdiutil info: an image without an image-path")?;
        return Ok(Some(PathBuf::from(path)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What `hdiutil attach -plist -nomount` prints for a blank raw image: one disk.
    const ATTACH_BLANK: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>system-entities</key>
	<array>
		<dict>
			<key>dev-entry</key>
			<string>/dev/disk4</string>
			<key>potentially-mountable</key>
			<false/>
		</dict>
	</array>
</dict>
</plist>
"#;

    /// An image holding a GPT with an APFS container (after `diskutil eraseDisk APFS ...`),
    /// attached again: the image's disk, its slices, the synthesized container disk and its
    /// volume, listed slices first.
    const ATTACH_APFS: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>system-entities</key>
	<array>
		<dict>
			<key>content-hint</key>
			<string>EFI</string>
			<key>dev-entry</key>
			<string>/dev/disk12s1</string>
			<key>potentially-mountable</key>
			<true/>
			<key>unmapped-content-hint</key>
			<string>C12A7328-F81F-11D2-BA4B-00A0C93EC93B</string>
		</dict>
		<dict>
			<key>content-hint</key>
			<string>GUID_partition_scheme</string>
			<key>dev-entry</key>
			<string>/dev/disk12</string>
			<key>potentially-mountable</key>
			<false/>
			<key>unmapped-content-hint</key>
			<string>GUID_partition_scheme</string>
		</dict>
		<dict>
			<key>content-hint</key>
			<string>Apple_APFS</string>
			<key>dev-entry</key>
			<string>/dev/disk12s2</string>
			<key>potentially-mountable</key>
			<false/>
			<key>unmapped-content-hint</key>
			<string>7C3457EF-0000-11AA-AA11-00306543ECAC</string>
		</dict>
		<dict>
			<key>content-hint</key>
			<string>EF57347C-0000-11AA-AA11-00306543ECAC</string>
			<key>dev-entry</key>
			<string>/dev/disk9</string>
			<key>potentially-mountable</key>
			<false/>
		</dict>
		<dict>
			<key>content-hint</key>
			<string>41504653-0000-11AA-AA11-00306543ECAC</string>
			<key>dev-entry</key>
			<string>/dev/disk9s1</string>
			<key>mount-point</key>
			<string>/Volumes/Photos</string>
			<key>potentially-mountable</key>
			<true/>
			<key>volume-kind</key>
			<string>apfs</string>
		</dict>
	</array>
</dict>
</plist>
"#;

    const INFO: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>framework</key>
	<string>671.100.2</string>
	<key>images</key>
	<array>
		<dict>
			<key>autodiskmount</key>
			<false/>
			<key>blockcount</key>
			<integer>2147483648</integer>
			<key>blocksize</key>
			<integer>512</integer>
			<key>hdid-pid</key>
			<integer>912</integer>
			<key>image-alias</key>
			<data>
			AAAAAAFWAAIAAA==
			</data>
			<key>image-encrypted</key>
			<false/>
			<key>image-path</key>
			<string>/private/var/run/lograid/nfs-20490-vol0/vol0</string>
			<key>image-type</key>
			<string>raw read/write image</string>
			<key>removable</key>
			<true/>
			<key>system-entities</key>
			<array>
				<dict>
					<key>content-hint</key>
					<string>GUID_partition_scheme</string>
					<key>dev-entry</key>
					<string>/dev/disk4</string>
				</dict>
				<dict>
					<key>content-hint</key>
					<string>Apple_APFS</string>
					<key>dev-entry</key>
					<string>/dev/disk4s2</string>
				</dict>
			</array>
			<key>writeable</key>
			<true/>
		</dict>
		<dict>
			<key>image-path</key>
			<string>/Users/someone/Downloads/App &amp; Co.dmg</string>
			<key>system-entities</key>
			<array>
				<dict>
					<key>dev-entry</key>
					<string>/dev/disk6</string>
				</dict>
				<dict>
					<key>dev-entry</key>
					<string>/dev/disk6s1</string>
					<key>mount-point</key>
					<string>/Volumes/App</string>
				</dict>
			</array>
		</dict>
	</array>
</dict>
</plist>
"#;

    #[test]
    fn the_commands_name_the_server_port_file_and_disk() {
        let dir = Path::new("/private/var/run/lograid/nfs-20490-vol0");
        let mount = mount_nfs("127.0.0.1:20490".parse().unwrap(), dir, None);
        assert_eq!(mount.program, "/sbin/mount_nfs");
        assert_eq!(
            mount.args_text(),
            [
                "-o",
                "vers=3,tcp,port=20490,mountport=20490,nolocks,hard,nobrowse",
                "127.0.0.1:/",
                "/private/var/run/lograid/nfs-20490-vol0",
            ]
        );
        let tuned = mount_nfs("[::1]:7".parse().unwrap(), dir, Some("rsize=65536"));
        assert_eq!(
            tuned.args_text()[1],
            "vers=3,tcp,port=7,mountport=7,nolocks,hard,nobrowse,rsize=65536"
        );
        assert_eq!(tuned.args_text()[2], "[::1]:/");

        let file = dir.join("vol0");
        assert_eq!(
            hdiutil_attach(&file, false).to_string(),
            "/usr/bin/hdiutil attach -plist -nomount -imagekey diskimage-class=CRawDiskImage \
             /private/var/run/lograid/nfs-20490-vol0/vol0"
        );
        assert!(!hdiutil_attach(&file, true)
            .args_text()
            .contains(&"-nomount".to_string()));
        assert_eq!(
            hdiutil_detach(Path::new("/dev/disk4")).to_string(),
            "/usr/bin/hdiutil detach /dev/disk4"
        );
        assert_eq!(hdiutil_info().to_string(), "/usr/bin/hdiutil info -plist");
        assert_eq!(
            umount(dir).to_string(),
            format!("/sbin/umount {}", dir.display())
        );
    }

    #[test]
    fn the_attached_disk_is_the_images_own_whole_disk() {
        assert_eq!(
            attached_disk(ATTACH_BLANK).unwrap(),
            Path::new("/dev/disk4")
        );
        // Slices listed first, and a synthesized APFS container disk: still the image's.
        assert_eq!(
            attached_disk(ATTACH_APFS).unwrap(),
            Path::new("/dev/disk12")
        );
        // Two whole disks that cannot be told apart: refused, naming them.
        let two = ATTACH_BLANK.replace(
            "</array>",
            "<dict><key>dev-entry</key><string>/dev/disk5</string></dict></array>",
        );
        let error = attached_disk(&two).unwrap_err().to_string();
        assert!(error.contains("/dev/disk4, /dev/disk5"), "{error}");
        // Only slices, or nothing: refused.
        let slices = ATTACH_BLANK.replace("/dev/disk4", "/dev/disk4s1");
        assert!(attached_disk(&slices).is_err());
        assert!(attached_disk("hdiutil: attach failed - Read-only file system").is_err());
        assert!(attached_disk("<plist><dict/></plist>").is_err());
    }

    #[test]
    fn hdiutil_info_tells_which_image_a_disk_belongs_to() {
        assert_eq!(
            image_of_device(INFO, Path::new("/dev/disk4")).unwrap(),
            Some(PathBuf::from(
                "/private/var/run/lograid/nfs-20490-vol0/vol0"
            ))
        );
        assert_eq!(
            image_of_device(INFO, Path::new("/dev/disk4s2")).unwrap(),
            Some(PathBuf::from(
                "/private/var/run/lograid/nfs-20490-vol0/vol0"
            ))
        );
        assert_eq!(
            image_of_device(INFO, Path::new("/dev/disk6")).unwrap(),
            Some(PathBuf::from("/Users/someone/Downloads/App & Co.dmg"))
        );
        assert_eq!(
            image_of_device(INFO, Path::new("/dev/disk5")).unwrap(),
            None
        );
        let none = r#"<plist version="1.0"><dict><key>framework</key><string>1</string><key>images</key><array/></dict></plist>"#;
        assert_eq!(
            image_of_device(none, Path::new("/dev/disk4")).unwrap(),
            None
        );
        assert!(image_of_device("<plist><dict/></plist>", Path::new("/dev/disk4")).is_err());
    }
}
