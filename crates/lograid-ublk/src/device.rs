//! One device's life: made new (add, parameters, queues, start) or recovered from a server that
//! died (start recovery, queues, end recovery), served, and stopped (the block device's page
//! cache written back if it still serves, stop, queues ended, the export flushed, delete).
//!
//! Owns: the order of those steps and undoing a half-made device. Must never: leave a device
//! it made behind after a failed start, or delete a device before its queues answered every
//! request in flight.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lograid_nbd::Export;

use crate::completion::{Completions, GroupCommit};
use crate::control::{Control, ANY_ID};
use crate::error::UblkError;
use crate::params::{self, CacheMode, MAX_IO_BYTES};
use crate::queue::{self, QueueSpec};
use crate::uapi::{self, DevInfo};
use crate::workers::{DeviceStats, WorkerContext, Workers};

/// How long a dead server's device may take to become recoverable, or its node to appear.
const SETTLE_WAIT: Duration = Duration::from_secs(10);
const SETTLE_POLL: Duration = Duration::from_millis(50);

/// The id asked for a new device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WantedId {
    /// The kernel chooses.
    Any,
    /// This one if free, else any (from a record).
    Preferred(u32),
    /// This one or fail (from --ublk-id-base).
    Required(u32),
}

/// What a device serves, and how.
pub struct DeviceConfig {
    pub export: Arc<dyn Export>,
    pub fingerprint: u64,
    pub queues: u16,
    pub depth: u16,
    pub workers: usize,
    pub cache: CacheMode,
}

pub struct Device {
    dev_id: u32,
    export: Arc<dyn Export>,
    cache: CacheMode,
    read_only: bool,
    recovered: bool,
    queues: Vec<JoinHandle<Result<(), UblkError>>>,
    workers: Workers,
    group_commit: Option<Arc<GroupCommit>>,
    stats: Arc<DeviceStats>,
}

/// The geometry the driver gave a device (it may lower the queue count to the CPUs').
#[derive(Clone, Copy)]
struct Shape {
    dev_id: u32,
    queues: u16,
    depth: u16,
    size_bytes: u64,
    read_only: bool,
    cache: CacheMode,
}

pub fn block_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkb{dev_id}"))
}

fn char_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkc{dev_id}"))
}

fn server_pid() -> i32 {
    std::process::id() as i32
}

impl Device {
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }
    pub fn name(&self) -> &str {
        self.export.name()
    }
    pub fn cache(&self) -> CacheMode {
        self.cache
    }
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    pub fn recovered(&self) -> bool {
        self.recovered
    }
    pub fn export_size_bytes(&self) -> u64 {
        self.export.size_bytes()
    }

    /// Makes and starts a new device for `config`.
    pub fn create(
        control: &mut Control,
        config: &DeviceConfig,
        wanted: WantedId,
    ) -> Result<Device, UblkError> {
        let export = &config.export;
        let read_only = export.read_only();
        let device_params = params::device_params(export.size_bytes(), read_only, config.cache)
            .map_err(|unfit| UblkError::VolumeUnfit {
                volume: export.name().to_string(),
                size_bytes: export.size_bytes(),
                reason: unfit.reason(),
            })?;
        let mut info = new_device_info(config);
        add_device(control, &mut info, wanted)?;
        let shape = Shape {
            dev_id: info.dev_id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            size_bytes: export.size_bytes(),
            read_only,
            cache: config.cache,
        };
        match Device::start_new(control, config, shape, &info, &device_params) {
            Ok(device) => Ok(device),
            Err(e) => {
                // Whatever was made goes: stop and delete end the queues' fetches too.
                let _ = control.stop(info.dev_id);
                let _ = control.delete(info.dev_id);
                Err(e)
            }
        }
    }

    /// The steps after ADD_DEV: parameters, queues, START_DEV.
    fn start_new(
        control: &mut Control,
        config: &DeviceConfig,
        shape: Shape,
        info: &DevInfo,
        device_params: &uapi::Params,
    ) -> Result<Device, UblkError> {
        check_negotiated(info, config.cache)?;
        control.set_params(info.dev_id, device_params)?;
        let device = Device::serve(shape, config, false)?;
        match control.start(info.dev_id, server_pid()) {
            Ok(()) => Ok(device),
            Err(e) => Err(device.abandon(control, e)),
        }
    }

    /// Takes over `info`, a device of this volume whose server died with the device quiesced
    /// (I/O held): the same /dev/ublkbN, the held requests reissued to this server. `Ok(None)`
    /// when it cannot be recovered (its size no longer matches the volume).
    pub fn recover(
        control: &mut Control,
        config: &DeviceConfig,
        info: &DevInfo,
    ) -> Result<Option<Device>, UblkError> {
        let dev_id = info.dev_id;
        let device_params = control.params(dev_id)?;
        let size_bytes = config.export.size_bytes();
        if params::size_bytes_of(&device_params) != size_bytes {
            tracing::warn!(
                dev_id,
                device_bytes = params::size_bytes_of(&device_params),
                volume_bytes = size_bytes,
                "the volume's size changed since its device was made: the device cannot be recovered"
            );
            return Ok(None);
        }
        let cache = params::cache_mode_of(&device_params);
        let read_only = params::read_only_of(&device_params) || config.export.read_only();
        warn_if_different(config, cache, params::read_only_of(&device_params), dev_id);
        match start_recovery(control, dev_id) {
            // A recovery that died half-way leaves a device the driver will not recover again.
            Err(e) if e.errno() == Some(libc::EINVAL) => {
                tracing::warn!(dev_id, "the driver refuses to recover the device: {e}");
                return Ok(None);
            }
            other => other?,
        }
        let shape = Shape {
            dev_id,
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            size_bytes,
            read_only,
            cache,
        };
        let device = Device::serve(shape, config, true)?;
        match control.end_recovery(dev_id, server_pid()) {
            Ok(()) => Ok(Some(device)),
            Err(e) => Err(device.abandon(control, e)),
        }
    }

    /// Opens /dev/ublkcN and starts the workers, the group commit and the queue threads (their
    /// fetches with the driver when this returns).
    fn serve(shape: Shape, config: &DeviceConfig, recovered: bool) -> Result<Device, UblkError> {
        let char_device = Arc::new(open_char_device(shape.dev_id)?);
        let export = config.export.clone();
        let group_commit = match shape.cache {
            CacheMode::WriteThrough if !shape.read_only => Some(Arc::new(GroupCommit::start(
                export.clone(),
                format!("{}", shape.dev_id),
            )?)),
            _ => None,
        };
        let stats = Arc::new(DeviceStats::default());
        let context = Arc::new(WorkerContext {
            export: export.clone(),
            char_device: char_device.clone(),
            group_commit: group_commit.clone(),
            stats: stats.clone(),
        });
        let workers = Workers::start(config.workers, &shape.dev_id.to_string(), context)?;
        let mut device = Device {
            dev_id: shape.dev_id,
            export,
            cache: shape.cache,
            read_only: shape.read_only,
            recovered,
            queues: Vec::with_capacity(usize::from(shape.queues)),
            workers,
            group_commit,
            stats,
        };
        for q_id in 0..shape.queues {
            let spec = QueueSpec {
                dev_id: shape.dev_id,
                q_id,
                depth: shape.depth,
                size_bytes: shape.size_bytes,
                read_only: shape.read_only,
            };
            let completions = Arc::new(Completions::new()?);
            let thread = queue::spawn(
                spec,
                char_device.clone(),
                device.workers.jobs(),
                completions,
            )?;
            device.queues.push(thread);
        }
        Ok(device)
    }

    /// Stops and deletes a device that failed to start, returning `error`.
    fn abandon(self, control: &mut Control, error: UblkError) -> UblkError {
        let _ = self.stop(control);
        error
    }

    /// Stops the device cleanly: its page cache written back through the queues, the block
    /// device removed (requests in flight answered first), the export flushed, the device
    /// deleted. A mounted filesystem loses its device: warned about, not refused.
    pub fn stop(mut self, control: &mut Control) -> Result<(), UblkError> {
        let dev_id = self.dev_id;
        // Only a live device answers: one the driver has quiesced (a queue thread of ours
        // ended, or a recovery did not finish) holds its I/O until a server recovers it, so
        // writing its cache back would wait for ever. STOP fails what it holds instead.
        match control.info(dev_id) {
            Ok(Some(info)) if info.state == uapi::S_DEV_LIVE => write_back_page_cache(dev_id),
            Ok(Some(info)) if info.state == uapi::S_DEV_QUIESCED => tracing::warn!(
                dev_id,
                "/dev/ublkb{dev_id} is not serving (the driver holds its I/O): its page cache and a \
                 filesystem on it are not written back, and what it holds fails"
            ),
            _ => {}
        }
        let stopped = control.stop(dev_id);
        if stopped.is_ok() {
            for thread in self.queues.drain(..) {
                match thread.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(dev_id, "queue thread: {e}"),
                    Err(_) => tracing::warn!(dev_id, "a queue thread panicked"),
                }
            }
        }
        self.workers.stop();
        if let Some(commit) = &self.group_commit {
            commit.stop();
        }
        let flushed = if self.read_only {
            Ok(())
        } else {
            self.export.flush()
        };
        let deleted = control.delete(dev_id);
        self.log_stats();
        stopped?;
        deleted?;
        flushed.map_err(|e| UblkError::io(format!("flushing volume '{}'", self.export.name()), e))
    }

    fn log_stats(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.stats;
        tracing::info!(
            dev_id = self.dev_id,
            volume = self.export.name(),
            reads = s.reads.load(Relaxed),
            read_bytes = s.read_bytes.load(Relaxed),
            writes = s.writes.load(Relaxed),
            written_bytes = s.written_bytes.load(Relaxed),
            flushes = s.flushes.load(Relaxed),
            discards = s.discards.load(Relaxed),
            write_zeroes = s.zeroes.load(Relaxed),
            errors = s.errors.load(Relaxed),
            "ublk device stopped"
        );
    }
}

fn new_device_info(config: &DeviceConfig) -> DevInfo {
    let mut flags = uapi::F_USER_COPY | uapi::F_CMD_IOCTL_ENCODE;
    if config.cache == CacheMode::WriteThrough {
        flags |= uapi::F_USER_RECOVERY | uapi::F_USER_RECOVERY_REISSUE;
    }
    DevInfo {
        nr_hw_queues: config.queues,
        queue_depth: config.depth,
        max_io_buf_bytes: MAX_IO_BYTES,
        dev_id: ANY_ID,
        flags,
        ublksrv_flags: config.fingerprint,
        ..DevInfo::default()
    }
}

/// Adds the device under the wanted id: a preferred id that is taken gives way to any; a
/// required one is an error that names who has it.
fn add_device(
    control: &mut Control,
    info: &mut DevInfo,
    wanted: WantedId,
) -> Result<(), UblkError> {
    let template = *info;
    info.dev_id = match wanted {
        WantedId::Any => ANY_ID,
        WantedId::Preferred(id) | WantedId::Required(id) => id,
    };
    match control.add(info) {
        Err(e) if e.errno() == Some(libc::EEXIST) => match wanted {
            WantedId::Required(dev_id) => {
                let pid = control.info(dev_id).ok().flatten().map(|i| i.ublksrv_pid);
                Err(UblkError::IdTaken {
                    dev_id,
                    pid: pid.filter(|p| *p > 0),
                })
            }
            _ => {
                *info = template;
                info.dev_id = ANY_ID;
                control.add(info)
            }
        },
        other => other,
    }
}

/// The driver clears the features it lacks: make sure the ones served on are there.
fn check_negotiated(info: &DevInfo, cache: CacheMode) -> Result<(), UblkError> {
    let mut needed = vec![(uapi::F_USER_COPY, "user copy (UBLK_F_USER_COPY)")];
    if cache == CacheMode::WriteThrough {
        needed.push((
            uapi::F_USER_RECOVERY_REISSUE,
            "user recovery with reissue (UBLK_F_USER_RECOVERY_REISSUE)",
        ));
    }
    match needed.into_iter().find(|(flag, _)| info.flags & flag == 0) {
        Some((_, missing)) => Err(UblkError::KernelTooOld {
            missing,
            offered: info.flags,
        }),
        None => Ok(()),
    }
}

fn warn_if_different(config: &DeviceConfig, cache: CacheMode, read_only: bool, dev_id: u32) {
    if cache != config.cache {
        tracing::warn!(
            dev_id,
            "recovering /dev/ublkb{dev_id} as it was made ({cache:?}), not {:?} as asked: a device's cache mode is fixed while it exists",
            config.cache
        );
    }
    if read_only != config.export.read_only() {
        tracing::warn!(
            dev_id,
            device_read_only = read_only,
            volume_read_only = config.export.read_only(),
            "recovering /dev/ublkb{dev_id}: the device and the volume differ in read-only; writes are refused if either is"
        );
    }
}

/// START_USER_RECOVERY, retried while the dead server's files are still closing (EBUSY).
fn start_recovery(control: &mut Control, dev_id: u32) -> Result<(), UblkError> {
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        match control.start_recovery(dev_id) {
            Err(e) if e.errno() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(SETTLE_POLL)
            }
            other => return other,
        }
    }
}

/// /dev/ublkcN, waiting a little for its node to appear (udev may make it).
fn open_char_device(dev_id: u32) -> Result<File, UblkError> {
    let path = char_path(dev_id);
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(SETTLE_POLL)
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(UblkError::io(
                    format!("opening {} (another process has it open)", path.display()),
                    e,
                ))
            }
            Err(e) => return Err(UblkError::io(format!("opening {}", path.display()), e)),
        }
    }
}

/// Writes back what the kernel caches for /dev/ublkbN itself (not a filesystem mounted on
/// it: a mount is warned about), while the queues still serve, so stopping loses nothing
/// written to the block device.
fn write_back_page_cache(dev_id: u32) {
    let path = block_path(dev_id);
    if let Some(mount_point) = mount_point_of(dev_id) {
        tracing::warn!(
            device = %path.display(),
            mount_point,
            "stopping a device with a filesystem mounted on it: unmount it first next time (the filesystem is \
             synced now, but sees its device go, and what it writes after this is lost)"
        );
        sync_filesystem(&mount_point);
    }
    match File::open(&path) {
        Ok(file) => {
            if let Err(e) = file.sync_all() {
                tracing::warn!(device = %path.display(), "writing back the device's page cache: {e}");
            }
        }
        Err(e) => tracing::debug!(device = %path.display(), "not written back: {e}"),
    }
}

/// syncfs(2) on the filesystem mounted at `mount_point`, so what it holds is written while the
/// device still serves.
fn sync_filesystem(mount_point: &str) {
    let synced = File::open(mount_point).and_then(|dir| {
        // SAFETY: syncfs takes a descriptor this function holds open.
        match unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    });
    if let Err(e) = synced {
        tracing::warn!(
            mount_point,
            "syncing the filesystem before its device stops: {e}"
        );
    }
}

/// Where /dev/ublkbN (or a partition of it) is mounted in this process's view, if it is.
fn mount_point_of(dev_id: u32) -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let disk = format!("/dev/ublkb{dev_id}");
    let partition = format!("{disk}p");
    mountinfo.lines().find_map(|line| {
        let mount_point = line.split_whitespace().nth(4)?;
        // After " - ": the filesystem type, then the source.
        let source = line.split(" - ").nth(1)?.split_whitespace().nth(1)?;
        (source == disk || source.starts_with(&partition)).then(|| mount_point.to_string())
    })
}
