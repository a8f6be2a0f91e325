//! The lifecycle of one mount: made on a directory, ended by [`FuseMount::unmount`] (or drop).
//!
//! Owns: [`FuseOptions`], [`mount`] (checking /dev/fuse, resolving the directory, replacing a
//! mount a dead lograid server left there, starting fuser's session), [`FuseMount`], and ending
//! it: the clean unmount through fuser's own handle, else closing the gate, aborting the
//! connection and detaching the mount lazily, then joining the session; [`Unmounted`] says which.
//! Must never: take over a mount it did not make (any other mount on the directory, or a live
//! lograid server's, is refused), abort a connection number its mount no longer holds, let a
//! request reach an export once unmounting returns, or wait without bound for a file's holder.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::MountOption;
use lograid_nbd::Export;

use crate::detach::{abort_connection, lazy_unmount};
use crate::error::{FuseError, MountPointTaken, UnmountError};
use crate::files::VolumeFiles;
use crate::gate::Gate;
use crate::mount_point::{is_dead, mount_at, resolve, MountEntry};
use crate::stats::Stats;

/// How a mount is made.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Threads that take requests from the kernel (each blocks in the export while its request
    /// runs, so this bounds the requests served at once).
    pub threads: usize,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions { threads: 16 }
    }
}

// How a session ends: once our connection ends (the mount torn down by the unmount, or the
// connection aborted), the kernel answers each request thread's read with ENODEV, and fuser ends
// the session without error. But a thread that had just taken a request off the kernel's queue
// when the connection ended is answered ECONNABORTED instead ("Software caused connection
// abort": fuse_dev_do_read will not queue the request for an answer on an ended connection),
// whoever ended it, and fuser ends the session with that as its error. `FuseMount::finish`
// takes ECONNABORTED, after it ended the connection itself, as the end it is.

/// A live mount. [`FuseMount::unmount`] ends it; dropping it unmounts too (without reporting).
pub struct FuseMount {
    dir: PathBuf,
    /// The thread running fuser's session (it starts and joins the request threads).
    session: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// Unmounts through fuser's own handle, so that fuser does not unmount the path again later
    /// (by then it may be someone else's mount).
    unmounter: Option<fuser::SessionUnmounter>,
    /// The FUSE connection's number (the mount's device minor), for aborting it.
    connection: Option<u32>,
    stats: Arc<Stats>,
    gate: Arc<Gate>,
}

/// Mounts `exports` as files `dir/NAME` (creating `dir` if needed). A lograid FUSE mount left
/// there by a server that died is unmounted first; any other mount on `dir` (a live server's, or
/// another filesystem) is refused. Needs /dev/fuse and, unless running as root, `fusermount3`.
pub fn mount(
    dir: &Path,
    exports: Vec<Arc<dyn Export>>,
    options: &FuseOptions,
) -> Result<FuseMount, FuseError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(FuseError::NoFuse);
    }
    let dir = prepare_dir(dir)?;
    let mount_error = |source: io::Error| FuseError::Mount {
        dir: dir.clone(),
        source,
    };
    let (stats, gate) = (Arc::<Stats>::default(), Arc::<Gate>::default());
    let files = VolumeFiles::new(exports, gate.clone(), stats.clone());
    let mut session =
        fuser::Session::new(files, &dir, &session_config(options)).map_err(mount_error)?;
    let unmounter = session.unmount_callable();
    let connection = mount_at(&dir).filter(MountEntry::is_ours).map(|m| m.minor);
    let session = std::thread::Builder::new()
        .name("lograid-fuse".into())
        .spawn(move || session.run())
        .map_err(mount_error)?;
    tracing::info!(dir = %dir.display(), "volumes mounted as FUSE files");
    Ok(FuseMount {
        dir,
        session: Some(session),
        unmounter: Some(unmounter),
        connection,
        stats,
        gate,
    })
}

/// `dir` resolved (see [`resolve`]) and ready to mount on: a dead lograid mount on it replaced,
/// any other mount refused, the directory created if missing.
fn prepare_dir(dir: &Path) -> Result<PathBuf, FuseError> {
    // Fails on a dead mount point (it exists); resolved and created again below.
    let _ = fs::create_dir_all(dir);
    let dir = resolve(dir).map_err(|source| FuseError::Mount {
        dir: dir.to_owned(),
        source,
    })?;
    if let Some(existing) = mount_at(&dir) {
        replace_dead_mount(&dir, &existing)?;
    }
    fs::create_dir_all(&dir).map_err(|source| FuseError::Mount {
        dir: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Unmounts `existing`, the mount on `dir`, if it is a lograid mount whose server died; refuses
/// any other (another filesystem's, or a live server's).
fn replace_dead_mount(dir: &Path, existing: &MountEntry) -> Result<(), FuseError> {
    if !existing.is_ours() || !is_dead(dir) {
        return Err(FuseError::Mount {
            dir: dir.to_owned(),
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                MountPointTaken {
                    fstype: existing.fstype.clone(),
                    lograid: existing.is_ours(),
                },
            ),
        });
    }
    // What a killed server leaves: "Transport endpoint is not connected".
    tracing::warn!(dir = %dir.display(), "a FUSE mount left by a server that died is on the directory; unmounting it (lazily)");
    lazy_unmount(dir).map_err(|e| FuseError::unmount(dir, e))
}

/// fuser's settings for a mount: its name and type "lograid", no setuid, device or executable
/// files, permissions checked by the kernel, and `options.threads` request threads, each with
/// its own /dev/fuse descriptor.
fn session_config(options: &FuseOptions) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("lograid".into()),
        MountOption::Subtype("lograid".into()),
        MountOption::DefaultPermissions,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoExec,
    ];
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    config
}

impl FuseMount {
    /// The mount's directory, resolved (absolute, symlinks followed).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Unmounts and waits for the request threads. If a loop device (or anything else) still
    /// holds a file, the mount is detached lazily and its connection aborted, so that the
    /// server can stop: the holder's later requests fail with an I/O error, as they would
    /// with the server gone. Once this returns no request reaches an export (unless one was
    /// stuck in an export call for `GATE_WAIT`, 30 s: it is not waited for longer). Returns how
    /// the mount ended.
    pub fn unmount(mut self) -> Result<Unmounted, FuseError> {
        self.finish()
    }

    /// Ends the mount: a clean unmount, else the abort and lazy detach of a busy one; then the
    /// gate closes and the session is joined (not after a refused abort: joining would wait for
    /// the holder). Only the first call does anything: the drop after [`FuseMount::unmount`]
    /// finds the session gone.
    fn finish(&mut self) -> Result<Unmounted, FuseError> {
        let Some(session) = self.session.take() else {
            return Ok(Unmounted::Clean);
        };
        let ended = match self.unmount_cleanly() {
            Ok(()) => Unmounted::Clean,
            Err(detail) => {
                tracing::warn!(dir = %self.dir.display(), "unmounting: {detail}; detaching the mount lazily and aborting its connection");
                if let Err(detail) = self.abort_and_detach() {
                    // Joining would wait for the holder to let go. The request threads answer
                    // EIO until the process exits and its /dev/fuse descriptors close.
                    tracing::warn!(
                        "cannot abort the FUSE connection of {}: {detail}",
                        self.dir.display()
                    );
                    return Ok(Unmounted::Refusing);
                }
                Unmounted::Aborted
            }
        };
        self.gate.close();
        // The kernel ends the session (ENODEV to every request thread) once unmounted or aborted;
        // ECONNABORTED too, see the comment above `FuseMount`.
        let joined = match session.join() {
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
            Ok(result) => result.map_err(UnmountError::Session),
            Err(_) => Err(UnmountError::SessionPanicked),
        };
        joined.map_err(|e| FuseError::unmount(&self.dir, e))?;
        tracing::info!(dir = %self.dir.display(), "FUSE files unmounted: {}", self.stats.summary());
        Ok(ended)
    }

    /// Unmounts through fuser's handle; fails while a file is in use (e.g. by a loop device).
    fn unmount_cleanly(&mut self) -> Result<(), UnmountError> {
        match self.unmounter.take() {
            Some(mut unmounter) => unmounter.unmount().map_err(UnmountError::Unmount),
            None => Err(UnmountError::NoUnmountHandle),
        }
    }

    /// Ends a mount whose files are still in use: closes the gate, aborts the connection and
    /// detaches the mount lazily. An error says why the connection was not aborted (the mount
    /// is detached all the same if it is still ours on the directory).
    fn abort_and_detach(&self) -> Result<(), UnmountError> {
        // From here on requests get EIO from us, whatever happens to the connection.
        self.gate.close();
        // Abort first, while the mount still holds its connection number: once the mount
        // is detached and its last user gone, the number is free, and the next FUSE mount
        // on the machine (another server's) may get it.
        let ours = mount_at(&self.dir).filter(MountEntry::is_ours);
        let aborted = match (self.connection, &ours) {
            (Some(connection), Some(m)) if m.minor == connection => abort_connection(connection),
            (Some(_), _) => Err(UnmountError::NotOnItsDirectory),
            (None, _) => Err(UnmountError::ConnectionUnknown),
        };
        if ours.is_some() {
            if let Err(detail) = lazy_unmount(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), "{detail}");
            }
        }
        aborted
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("{e}");
        }
    }
}

/// How a mount ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    Clean,
    /// A file was still in use (e.g. by a loop device); its connection was aborted, so its
    /// holder now gets I/O errors from the kernel.
    Aborted,
    /// A file was still in use and the connection could not be aborted: the holder's requests
    /// get I/O errors from this process until it exits (then from the kernel).
    Refusing,
}
