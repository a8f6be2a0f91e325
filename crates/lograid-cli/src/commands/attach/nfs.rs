//! `lograid attach --nfs ADDR`: a volume's file from `lograid serve --nfs ADDR` as a disk. The
//! server's export is mounted on a directory of its own under the state directory, the
//! volume's file there is attached as a disk (macOS: `hdiutil`, /dev/diskN; Linux: a loop
//! device with direct I/O), and the attachment is recorded so that `lograid detach DEVICE`
//! (another process) can undo both. The same on both systems; the system's tools are
//! `crate::os`'s.
//!
//! Owns: the records (`nfs-attachments` in the state directory, one line per attachment,
//! changed under a lock; one whose mount and disk are both gone is forgotten at the next
//! attach), the order of the steps and their undoing when one fails. Must never:
//! detach a disk it has no record of, or one that no longer shows its record's file (a disk
//! number reused by another disk); stat anything on a mount whose server may be down while
//! detaching (the mount table is read instead).

use anyhow::{bail, Context, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const RECORDS: &str = "nfs-attachments";
const LOCK: &str = "nfs-attachments.lock";
const HEADER: &str = "lograid-nfs-attachments-v1";
/// Longest volume name (a file name on the NFS mount).
const MAX_VOLUME_NAME_BYTES: usize = 255;

/// One attachment of a volume's file from an NFS mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsRecord {
    /// The disk: /dev/diskN (macOS) or /dev/loopN (Linux).
    pub device: PathBuf,
    /// Where the server's export is mounted (ours, under the state directory).
    pub mount_dir: PathBuf,
    pub server: SocketAddr,
    pub volume: String,
}

impl NfsRecord {
    pub fn file(&self) -> PathBuf {
        self.mount_dir.join(&self.volume)
    }

    pub fn uri(&self) -> String {
        format!("nfs://{}/{}", self.server, self.volume)
    }

    /// Whether `image` (as the system names the file behind the disk) is this record's file:
    /// the same last two components (the system may name the directory by another path, e.g.
    /// /private/var/run for /var/run).
    fn is_file(&self, image: &Path) -> bool {
        let tail = match self.mount_dir.file_name() {
            Some(dir) => Path::new(dir).join(&self.volume),
            None => return false,
        };
        image.ends_with(tail)
    }
}

/// What `attach --nfs` asks for.
pub struct NfsAttach<'a> {
    pub server: SocketAddr,
    /// None: the only file the export has.
    pub volume: Option<&'a str>,
    pub state_dir: &'a Path,
    /// macOS: let hdiutil mount the filesystems it finds on the disk.
    pub mount_volumes: bool,
    /// More mount options, appended to lograid's.
    pub mount_options: Option<&'a str>,
}

fn check_volume_name(volume: &str) -> Result<()> {
    if volume.is_empty()
        || volume == "."
        || volume == ".."
        || volume.contains(['/', '\0', '\t', '\n', '\r'])
    {
        bail!("--export {volume:?}: not a volume name");
    }
    if volume.len() > MAX_VOLUME_NAME_BYTES {
        bail!(
            "--export: a volume name of more than {MAX_VOLUME_NAME_BYTES} bytes cannot be attached"
        );
    }
    Ok(())
}

/// The records' text: a version line, then one line per record, fields separated by tabs
/// (device, mount directory, server, volume).
fn format_records(records: &[NfsRecord]) -> String {
    let mut text = format!("{HEADER}\n");
    for r in records {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            r.device.display(),
            r.mount_dir.display(),
            r.server,
            r.volume
        ));
    }
    text
}

fn parse_records(text: &str) -> Result<Vec<NfsRecord>> {
    let mut lines = text.lines();
    match lines.next() {
        Some(HEADER) | None => {}
        Some(other) => bail!("unknown header {other:?}"),
    }
    lines
        .filter(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [device, mount_dir, server, volume] = fields[..] else {
                bail!("malformed line {line:?}");
            };
            Ok(NfsRecord {
                device: device.into(),
                mount_dir: mount_dir.into(),
                server: server
                    .parse()
                    .with_context(|| format!("bad server address in {line:?}"))?,
                volume: volume.to_string(),
            })
        })
        .collect()
}

/// The records of a state directory, held under its lock while this lives.
struct Records {
    dir: PathBuf,
    list: Vec<NfsRecord>,
    _lock: File,
}

impl Records {
    /// Locks and reads the records of `dir` (which exists).
    fn open(dir: &Path) -> Result<Records> {
        let lock_path = dir.join(LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor we own; released when the file is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("locking {}", lock_path.display()));
        }
        let path = dir.join(RECORDS);
        let list = match fs::read_to_string(&path) {
            Ok(text) => parse_records(&text).with_context(|| format!("{}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Records {
            dir: dir.to_path_buf(),
            list,
            _lock: lock,
        })
    }

    /// Writes the records (a new file renamed over the old one).
    fn save(&self) -> Result<()> {
        let path = self.dir.join(RECORDS);
        let temporary = self.dir.join(format!("{RECORDS}.tmp"));
        let mut file = File::create(&temporary)
            .with_context(|| format!("creating {}", temporary.display()))?;
        file.write_all(format_records(&self.list).as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", temporary.display()))?;
        fs::rename(&temporary, &path).with_context(|| format!("replacing {}", path.display()))
    }
}

/// The recorded attachments in `state_dir` (none if it does not exist).
pub fn list(state_dir: &Path) -> Result<Vec<NfsRecord>> {
    if !state_dir.exists() {
        return Ok(Vec::new());
    }
    Ok(Records::open(state_dir)?.list)
}

/// Makes `state_dir` (root's only) and resolves it: its path goes into the records and into
/// the mount table, both of which name directories without symbolic links.
fn prepare_state_dir(state_dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(state_dir).with_context(|| format!("creating {}", state_dir.display()))?;
    let dir = state_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", state_dir.display()))?;
    if dir.to_string_lossy().contains(['\t', '\n', '\r']) {
        bail!(
            "state directory {}: a tab or newline in its path",
            dir.display()
        );
    }
    Ok(dir)
}

/// Mounts the export, attaches the volume's file and records it; undoes what it did if a
/// step fails.
pub fn attach(request: &NfsAttach<'_>) -> Result<NfsRecord> {
    if let Some(volume) = request.volume {
        check_volume_name(volume)?;
    }
    let state_dir = prepare_state_dir(request.state_dir)?;
    let mut records = Records::open(&state_dir)?;
    forget_dead(&mut records)?;
    let mount_dir = free_mount_dir(&state_dir, request.server.port(), &records.list)?;
    fs::create_dir_all(&mount_dir).with_context(|| format!("creating {}", mount_dir.display()))?;
    if let Err(e) = crate::os::mount_nfs(request.server, &mount_dir, request.mount_options) {
        let _ = fs::remove_dir(&mount_dir);
        return Err(e).context(format!(
            "mounting the NFS export of {} (served by `lograid serve --nfs {}`)",
            request.server, request.server
        ));
    }
    let undo_mount = || match crate::os::unmount(&mount_dir) {
        Ok(()) => {
            let _ = fs::remove_dir(&mount_dir);
        }
        Err(e) => eprintln!(
            "lograid: warning: {e:#}; unmount {} by hand",
            mount_dir.display()
        ),
    };
    let record = match attach_mounted(request, &mount_dir, &records.list) {
        Ok(record) => record,
        Err(e) => {
            undo_mount();
            return Err(e);
        }
    };
    records.list.push(record.clone());
    if let Err(e) = records.save() {
        let _ = crate::os::detach_image(&record.device);
        undo_mount();
        return Err(e);
    }
    Ok(record)
}

/// Forgets the records whose mount and disk are both gone (a crash, or a restart that
/// kept the state directory), so that their volumes can be attached again. A record with
/// either still there is kept.
fn forget_dead(records: &mut Records) -> Result<()> {
    let before = records.list.len();
    records.list.retain(|r| {
        let mounted = lograid::device::is_mount_point(&r.mount_dir).unwrap_or(true);
        let shows_file = crate::os::image_backing(&r.device)
            .map(|image| image.is_some_and(|image| r.is_file(&image)))
            .unwrap_or(true);
        if !mounted && !shows_file {
            eprintln!(
                "lograid: forgetting the attachment of {} as {}: its mount and its disk are gone",
                r.uri(),
                r.device.display()
            );
            let _ = fs::remove_dir(&r.mount_dir);
        }
        mounted || shows_file
    });
    if records.list.len() != before {
        records.save()?;
    }
    Ok(())
}

/// Most attachments from NFS mounts of one server at once.
const MAX_MOUNTS_PER_SERVER: u32 = 64;

/// A directory for a new mount of the export of the server on `port`: `nfs-PORT-N` with the
/// first N that no record uses and nothing is mounted on (one left by a crash stays as it is).
fn free_mount_dir(state_dir: &Path, port: u16, recorded: &[NfsRecord]) -> Result<PathBuf> {
    (1..=MAX_MOUNTS_PER_SERVER)
        .map(|n| state_dir.join(format!("nfs-{port}-{n}")))
        .find(|dir| {
            !recorded.iter().any(|r| r.mount_dir == *dir)
                && !lograid::device::is_mount_point(dir).unwrap_or(true)
        })
        .with_context(|| {
            format!(
                "{MAX_MOUNTS_PER_SERVER} mounts of port {port} under {} already",
                state_dir.display()
            )
        })
}

/// With the export mounted on `mount_dir`: picks the volume and attaches its file.
fn attach_mounted(
    request: &NfsAttach<'_>,
    mount_dir: &Path,
    recorded: &[NfsRecord],
) -> Result<NfsRecord> {
    let volume = match request.volume {
        Some(volume) => volume.to_string(),
        None => only_volume(mount_dir)?,
    };
    check_volume_name(&volume)?;
    if let Some(r) = recorded
        .iter()
        .find(|r| r.server == request.server && r.volume == volume)
    {
        bail!(
            "{} is already attached as {} (detach it with `lograid detach {}`)",
            r.uri(),
            r.device.display(),
            r.device.display()
        );
    }
    let file = mount_dir.join(&volume);
    let metadata = fs::metadata(&file).with_context(|| {
        format!(
            "the server at {} has no volume {volume:?} ({})",
            request.server,
            listing(mount_dir)
        )
    })?;
    if !metadata.is_file() {
        bail!("{} is not a regular file", file.display());
    }
    let device = crate::os::attach_image(&file, request.mount_volumes)
        .with_context(|| format!("attaching {}", file.display()))?;
    Ok(NfsRecord {
        device,
        mount_dir: mount_dir.to_path_buf(),
        server: request.server,
        volume,
    })
}

/// The files of the export, for a message.
fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "it serves no volumes".into()
    } else {
        format!("its volumes: {}", names.join(", "))
    }
}

/// The one volume the export has; more than one must be named.
fn only_volume(dir: &Path) -> Result<String> {
    let names: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    match names.as_slice() {
        [only] => Ok(only.clone()),
        _ => bail!("name the volume to attach with --export ({})", listing(dir)),
    }
}

/// Undoes the attachment of `device` recorded in `state_dir`: detaches the disk (if it still
/// shows the record's file), unmounts the export, forgets the record. `Ok(false)` if no NFS
/// attachment of `device` is recorded there.
pub fn detach(state_dir: &Path, device: &Path) -> Result<bool> {
    if !state_dir.exists() {
        return Ok(false);
    }
    let mut records = Records::open(state_dir)?;
    let Some(index) = records.list.iter().position(|r| r.device == device) else {
        return Ok(false);
    };
    let record = records.list[index].clone();
    match crate::os::image_backing(device)? {
        Some(image) if record.is_file(&image) => crate::os::detach_image(device)?,
        Some(image) => eprintln!(
            "lograid: warning: {} now shows {}, not {}: left attached (the record was stale)",
            device.display(),
            image.display(),
            record.file().display()
        ),
        None => eprintln!("lograid: {} was detached already", device.display()),
    }
    if lograid::device::is_mount_point(&record.mount_dir).unwrap_or(true) {
        crate::os::unmount(&record.mount_dir).with_context(|| {
            format!(
                "detached {}, but the NFS mount {} stays",
                device.display(),
                record.mount_dir.display()
            )
        })?;
    }
    let _ = fs::remove_dir(&record.mount_dir);
    records.list.remove(index);
    records.save()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(device: &str, dir: &str, volume: &str) -> NfsRecord {
        NfsRecord {
            device: device.into(),
            mount_dir: dir.into(),
            server: "127.0.0.1:20490".parse().unwrap(),
            volume: volume.into(),
        }
    }

    #[test]
    fn records_round_trip_and_refuse_what_they_never_write() {
        let records = vec![
            record("/dev/disk4", "/private/var/run/lograid/nfs-20490-1", "vol0"),
            NfsRecord {
                server: "[::1]:7".parse().unwrap(),
                ..record("/dev/loop2", "/run/lograid/nfs-7-2", "a b")
            },
        ];
        let text = format_records(&records);
        assert_eq!(parse_records(&text).unwrap(), records);
        assert_eq!(parse_records("").unwrap(), Vec::new());
        assert!(parse_records("lograid-attachments-v1\n").is_err());
        assert!(parse_records(&format!("{HEADER}\n/dev/disk4\tx\n")).is_err());
        assert!(parse_records(&format!("{HEADER}\n/dev/disk4\t/d\tnot-an-address\tv\n")).is_err());
    }

    #[test]
    fn a_record_knows_its_file_by_the_last_two_names() {
        let r = record("/dev/disk4", "/var/run/lograid/nfs-20490-1", "vol0");
        assert_eq!(r.file(), Path::new("/var/run/lograid/nfs-20490-1/vol0"));
        assert_eq!(r.uri(), "nfs://127.0.0.1:20490/vol0");
        assert!(r.is_file(Path::new("/private/var/run/lograid/nfs-20490-1/vol0")));
        assert!(r.is_file(Path::new("/var/run/lograid/nfs-20490-1/vol0")));
        assert!(!r.is_file(Path::new("/var/run/lograid/nfs-20490-2/vol0")));
        assert!(!r.is_file(Path::new("/var/run/lograid/nfs-20490-1/vol1")));
        assert!(!r.is_file(Path::new("/Users/x/Downloads/vol0")));
        assert!(!r.is_file(Path::new("/x/anfs-20490-1/vol0")));
    }

    #[test]
    fn volume_names_that_cannot_be_files_are_refused() {
        assert!(check_volume_name("vol0").is_ok());
        for bad in ["", ".", "..", "a/b", "a\tb", "a\nb"] {
            assert!(check_volume_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_volume_name(&"v".repeat(256)).is_err());
    }
}
