//! What the export holds: the root directory `/` and one regular file per volume, named after
//! it, with the volume's size.
//!
//! Owns: the list of files and the lookups by handle and by name, each file's attributes
//! (type, mode, owner, size, times), its stripe locks for unaligned writes, and the write
//! verifier of this server run. Must never: change a file's size, or give two files one handle
//! or one file id.
//!
//! Times are the server's own and are not stored: every file starts a run with the time the
//! server started, and its modification (and change) time moves to the current second on each
//! write, or to what a client sets. The write verifier is drawn anew each time a [`Namespace`]
//! is made (once per server start), so a client that wrote UNSTABLE data before a restart sees
//! a different verifier in its COMMIT reply and sends that data again.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use lograid_nbd::sectors::SectorLocks;
use lograid_nbd::Export;

use crate::handle::{self, Node, HANDLE_BYTES};

/// Longest file name (`name_max` in PATHCONF).
pub const NAME_MAX: u32 = 255;
/// File id of the root directory; a volume's file has its volume id plus this.
const ROOT_FILE_ID: u64 = 1;

/// One volume to serve as a file.
#[derive(Clone)]
pub struct NfsVolume {
    pub export: Arc<dyn Export>,
    /// The engine's id of the volume: stable for its life, never reused; it goes into the
    /// file's handle.
    pub volume_id: u32,
}

/// The pool's capacity and free space, for FSSTAT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// Reports the pool's space when a client asks (FSSTAT).
pub type SpaceReporter = Arc<dyn Fn() -> Space + Send + Sync>;

/// Why a list of volumes cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error("no volumes to serve")]
    Empty,
    #[error("volume name {0:?} cannot be a file name (empty, '.', '..', longer than 255 bytes, or with '/' or NUL)")]
    BadName(String),
    #[error("volume name {0:?} is used twice")]
    DuplicateName(String),
    #[error("volume id {0} is 0 or used twice")]
    BadId(u32),
}

/// A volume's file.
pub(crate) struct VolumeFile {
    pub export: Arc<dyn Export>,
    pub volume_id: u32,
    pub read_only: bool,
    /// Serialise read-modify-writes of partly covered sectors (this server's own locks).
    pub locks: SectorLocks,
    modified_secs: AtomicU32,
}

impl VolumeFile {
    pub fn name(&self) -> &str {
        self.export.name()
    }

    pub fn size_bytes(&self) -> u64 {
        self.export.size_bytes()
    }

    pub fn modified_secs(&self) -> u32 {
        self.modified_secs.load(Ordering::Relaxed)
    }

    /// The file was written: its modification time is now (never earlier than it was).
    pub fn touch(&self) {
        self.modified_secs.fetch_max(now_secs(), Ordering::Relaxed);
    }

    /// A client set the modification time.
    pub fn set_modified(&self, secs: u32) {
        self.modified_secs.store(secs, Ordering::Relaxed);
    }
}

/// The root directory and its files, for one server run.
pub struct Namespace {
    pool_uuid: u128,
    pub(crate) files: Vec<VolumeFile>,
    verifier: [u8; 8],
    started_secs: u32,
    owner: (u32, u32),
    space: Option<SpaceReporter>,
}

/// Seconds since the epoch as NFSv3 carries them (32 bits, until 2106).
pub fn now_secs() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// Eight bytes that differ from one server run to the next: the clock, the process id and
/// the standard library's per-process random hash keys.
fn new_verifier() -> [u8; 8] {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    hasher.finish().to_be_bytes()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= NAME_MAX as usize
        && !name.contains(['/', '\0'])
}

impl Namespace {
    /// The files of `volumes` (read-only where their export is, or all with `read_only`) in
    /// the pool `pool_uuid`, with a fresh write verifier.
    pub fn new(
        pool_uuid: u128,
        volumes: Vec<NfsVolume>,
        read_only: bool,
        space: Option<SpaceReporter>,
    ) -> Result<Namespace, NamespaceError> {
        if volumes.is_empty() {
            return Err(NamespaceError::Empty);
        }
        let started_secs = now_secs();
        let mut files: Vec<VolumeFile> = Vec::with_capacity(volumes.len());
        for volume in volumes {
            let name = volume.export.name();
            if !valid_name(name) {
                return Err(NamespaceError::BadName(name.to_owned()));
            }
            if files.iter().any(|file| file.name() == name) {
                return Err(NamespaceError::DuplicateName(name.to_owned()));
            }
            if volume.volume_id == 0 || files.iter().any(|file| file.volume_id == volume.volume_id)
            {
                return Err(NamespaceError::BadId(volume.volume_id));
            }
            files.push(VolumeFile {
                read_only: read_only || volume.export.read_only(),
                export: volume.export,
                volume_id: volume.volume_id,
                locks: SectorLocks::default(),
                modified_secs: AtomicU32::new(started_secs),
            });
        }
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let owner = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(Namespace {
            pool_uuid,
            files,
            verifier: new_verifier(),
            started_secs,
            owner,
            space,
        })
    }

    pub fn verifier(&self) -> [u8; 8] {
        self.verifier
    }

    pub fn started_secs(&self) -> u32 {
        self.started_secs
    }

    pub fn owner(&self) -> (u32, u32) {
        self.owner
    }

    pub fn pool_uuid(&self) -> u128 {
        self.pool_uuid
    }

    /// The file system id: the pool's UUID folded to 64 bits.
    pub fn fsid(&self) -> u64 {
        (self.pool_uuid >> 64) as u64 ^ self.pool_uuid as u64
    }

    pub fn handle_of(&self, node: Node) -> [u8; HANDLE_BYTES] {
        handle::encode(self.pool_uuid, node)
    }

    pub fn file_id(node: Node) -> u64 {
        match node {
            Node::Root => ROOT_FILE_ID,
            Node::Volume(id) => u64::from(id) + ROOT_FILE_ID,
        }
    }

    /// The file of the volume with id `volume_id`.
    pub(crate) fn file(&self, volume_id: u32) -> Option<&VolumeFile> {
        self.files.iter().find(|file| file.volume_id == volume_id)
    }

    /// What `name` in the root directory is.
    pub(crate) fn lookup(&self, name: &[u8]) -> Option<Node> {
        match name {
            b"." | b".." => Some(Node::Root),
            _ => self
                .files
                .iter()
                .find(|file| file.name().as_bytes() == name)
                .map(|file| Node::Volume(file.volume_id)),
        }
    }

    /// The pool's space, if known.
    pub fn space(&self) -> Option<Space> {
        self.space.as_ref().map(|report| report())
    }

    /// The largest file.
    pub fn max_file_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(VolumeFile::size_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Every export, for the flush at shutdown.
    pub fn exports(&self) -> impl Iterator<Item = &Arc<dyn Export>> {
        self.files.iter().map(|file| &file.export)
    }

    /// The names of the files, in serving order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(VolumeFile::name)
    }
}
