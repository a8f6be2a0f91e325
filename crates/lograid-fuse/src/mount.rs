//! The lifecycle of one mount: made on a directory, ended by [`FuseMount::unmount`] (or drop).
//!
//! Owns: [`FuseOptions`], [`mount`] (checking /dev/fuse, resolving the directory, replacing a
//! mount a dead lograid server left there, mounting, starting fuser's session on our descriptor,
//! identifying our connection), [`FuseMount`], and ending it: the clean unmount, else closing
//! the gate, aborting the connection and detaching the mount lazily, then joining the session;
//! [`Unmounted`] says which. Each step that ends something first proves the directory's mount
//! ours (`connection`); fuser is given no handle to unmount with. Must never: take over a mount
//! it did not make (any other mount on the directory, or a live lograid server's, is refused),
//! unmount, abort or detach a mount or connection not proved ours at that moment, let a request
//! reach an export once unmounting returns, or wait without bound for a file's holder or for the
//! server of a mount already on the directory.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lograid_nbd::Export;

use crate::connection::{Connection, Probe};
use crate::detach::unmount;
use crate::device::mount_fuse;
use crate::error::{FuseError, MountPointTaken, UnmountError};
use crate::files::VolumeFiles;
use crate::gate::Gate;
use crate::mount_point::{is_dead, mount_at, resolve, MountEntry};
use crate::stats::Stats;

/// How long a clean unmount may take to end our connection (the kernel tears the mount down
/// before umount2 returns unless the mount is reachable elsewhere too).
const TEARDOWN_WAIT: Duration = Duration::from_secs(5);

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
    /// Our connection, to prove the directory's mount ours before unmounting or aborting it.
    connection: Connection,
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
    let probe = Arc::new(Probe::new());
    let files = VolumeFiles::new(exports, gate.clone(), stats.clone(), probe.clone());
    let device = mount_fuse(&dir).map_err(mount_error)?;
    let watch = device.try_clone().map_err(mount_error)?;
    let session = start_session(files, device, options).map_err(mount_error)?;
    let connection = Connection::identify(watch, &dir, &probe);
    tracing::info!(dir = %dir.display(), "volumes mounted as FUSE files");
    Ok(FuseMount {
        dir,
        session: Some(session),
        connection,
        stats,
        gate,
    })
}

/// Serves `files` through `device` (the kernel's INIT request waiting on it) on a thread of its
/// own. If that fails, the descriptors are closed, which ends the connection: the mount is left
/// dead, and the next mount on the directory replaces it.
fn start_session(
    files: VolumeFiles,
    device: OwnedFd,
    options: &FuseOptions,
) -> io::Result<std::thread::JoinHandle<io::Result<()>>> {
    let session = fuser::Session::from_fd(
        files,
        device,
        fuser::SessionACL::Owner,
        session_config(options),
    )?;
    std::thread::Builder::new()
        .name("lograid-fuse".into())
        .spawn(move || session.run())
}

/// `dir` resolved (see [`resolve`]) and ready to mount on: a dead lograid mount on it replaced,
/// any other mount refused, the directory created if missing. Nothing here asks the server of a
/// mount already on `dir` (one that does not answer would hold this up without end) but
/// [`is_dead`], which waits for it at most its `PROBE_TIMEOUT`.
fn prepare_dir(dir: &Path) -> Result<PathBuf, FuseError> {
    let mount_error = |dir: &Path, source| FuseError::Mount {
        dir: dir.to_owned(),
        source,
    };
    // Made first so that it resolves whole (symlinks in its parents too).
    create_dir_path(dir).map_err(|e| mount_error(dir, e))?;
    let dir = resolve(dir).map_err(|e| mount_error(dir, e))?;
    if let Some(existing) = mount_at(&dir) {
        replace_dead_mount(&dir, &existing)?;
    }
    Ok(dir)
}

/// Creates `dir` and its missing parents. An existing `dir` is taken as it is, without a look
/// inside: mkdir(2) says it exists without going through a mount on it, where `stat` (as
/// `fs::create_dir_all` does then) would wait for that mount's server.
fn create_dir_path(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
                return Err(e);
            };
            create_dir_path(parent)?;
            match fs::create_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            }
        }
        Err(e) => Err(e),
    }
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
    crate::connection::detach_dead(dir, existing.dev).map_err(|e| FuseError::unmount(dir, e))
}

/// fuser's settings for a session (the mount's own are made in `device`): `options.threads`
/// request threads, each with its own /dev/fuse descriptor.
fn session_config(options: &FuseOptions) -> fuser::Config {
    let mut config = fuser::Config::default();
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
    /// the holder). Nothing is unmounted or aborted unless proved ours (see `connection`): a
    /// directory whose mount is not ours is left alone, and our connection, if still live, is
    /// refused. Only the first call does anything: the drop after [`FuseMount::unmount`] finds
    /// the session gone.
    fn finish(&mut self) -> Result<Unmounted, FuseError> {
        let Some(session) = self.session.take() else {
            return Ok(Unmounted::Clean);
        };
        let ended = match self.unmount_cleanly() {
            Ok(()) => Unmounted::Clean,
            Err(UnmountError::ConnectionEnded) => {
                // Unmounted or aborted by someone else: nothing of ours is left to end.
                tracing::warn!(dir = %self.dir.display(), "the FUSE mount's connection had already ended (unmounted or aborted by someone else)");
                Unmounted::Clean
            }
            Err(detail @ (UnmountError::NotOnItsDirectory | UnmountError::ConnectionUnknown)) => {
                return Ok(self.refuse(&detail));
            }
            Err(detail) => {
                tracing::warn!(dir = %self.dir.display(), "unmounting: {detail}; detaching the mount lazily and aborting its connection");
                match self.abort_and_detach() {
                    Ok(()) | Err(UnmountError::ConnectionEnded) => Unmounted::Aborted,
                    Err(detail) => return Ok(self.refuse(&detail)),
                }
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

    /// Leaves our connection as it is, `detail` saying why: the gate answers every request EIO
    /// until the process exits and its /dev/fuse descriptors close. Not joined: joining would
    /// wait for the holder.
    fn refuse(&self, detail: &UnmountError) -> Unmounted {
        self.gate.close();
        tracing::warn!(
            "cannot abort the FUSE connection of {}: {detail}",
            self.dir.display()
        );
        Unmounted::Refusing
    }

    /// Unmounts the directory's mount once proved ours; fails while a file is in use (e.g. by a
    /// loop device), and with the reason when it is not ours.
    fn unmount_cleanly(&self) -> Result<(), UnmountError> {
        // Proved ours, then the pin let go of: an unmount fails while anything holds the mount.
        drop(self.connection.pin(&self.dir)?);
        unmount(&self.dir)?;
        if !self.connection.wait_ended(TEARDOWN_WAIT) {
            // Our mount lives on elsewhere (e.g. a bind mount of it): end it the busy way.
            return Err(UnmountError::Unmount(io::Error::from_raw_os_error(
                libc::EBUSY,
            )));
        }
        Ok(())
    }

    /// Ends a mount whose files are still in use: closes the gate, then, the mount pinned and
    /// proved ours, aborts its connection and detaches it lazily. An error says why the
    /// connection was not aborted (nothing was touched then).
    fn abort_and_detach(&self) -> Result<(), UnmountError> {
        // From here on requests get EIO from us, whatever happens to the connection.
        self.gate.close();
        // The pin keeps our mount, and so its number, ours until both steps are done.
        let pinned = self.connection.pin(&self.dir)?;
        pinned.abort()?;
        if let Err(detail) = pinned.detach() {
            tracing::warn!(dir = %self.dir.display(), "{detail}");
        }
        Ok(())
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
    /// The connection could not be aborted (a file was still in use), or could not be proved
    /// ours (our mount had left its directory, or something is mounted over it), so nothing was
    /// touched: the holder's requests get I/O errors from this process until it exits (then from
    /// the kernel).
    Refusing,
}
