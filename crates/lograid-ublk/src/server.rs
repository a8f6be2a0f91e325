//! [`UblkServer`]: every volume of a pool as a device, started together and stopped together.
//!
//! Owns: checking the driver and the options before anything is made, finding each volume's
//! device left by a server that died (recovering it, or replacing it when it cannot be
//! recovered), choosing ids (a recorded one, or `id_base` + the volume's index), and stopping
//! every device at the end, also after a failed start or when dropped. Must never: serve a
//! device whose fingerprint is not this pool's volume's, or return from a failed start with a
//! device of its own still there.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lograid_nbd::Export;

use crate::control::Control;
use crate::device::{block_path, Device, DeviceConfig, WantedId};
use crate::discovery::{self, fingerprint};
use crate::error::UblkError;
use crate::params::CacheMode;
use crate::uapi::{self, DevInfo};

/// Worker threads per hardware queue (each holds one request at a time, and one buffer of at
/// most 1 MiB), and per device at most.
const WORKERS_PER_QUEUE: usize = 4;
const MAX_WORKERS: usize = 16;
/// Hardware queues per device at most (each is a thread and an io_uring).
pub const MAX_QUEUES: u16 = 64;
/// How long a dead server's device may stay LIVE before the driver quiesces or stops it.
const DEAD_SERVER_WAIT: Duration = Duration::from_secs(10);

/// How the devices are made.
#[derive(Clone, Debug)]
pub struct UblkOptions {
    /// Hardware queues per device (1 to [`MAX_QUEUES`]; the driver caps it at the CPU count).
    pub queues: u16,
    /// Requests in flight per queue (1 to 4096).
    pub depth: u16,
    /// Volume `i` gets /dev/ublkb(`id_base` + i), or the start fails; `None`: the id it had
    /// last time if free, else the lowest free one.
    pub id_base: Option<u32>,
    pub cache: CacheMode,
    /// Where device ids are recorded (default [`discovery::DEFAULT_STATE_DIR`]).
    pub state_dir: PathBuf,
}

impl Default for UblkOptions {
    fn default() -> UblkOptions {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        UblkOptions {
            queues: cores.min(4) as u16,
            depth: 64,
            id_base: None,
            cache: CacheMode::WriteThrough,
            state_dir: PathBuf::from(discovery::DEFAULT_STATE_DIR),
        }
    }
}

/// One volume to serve, and who it is (for finding its device again).
#[derive(Clone)]
pub struct UblkVolume {
    pub export: Arc<dyn Export>,
    pub pool_uuid: u128,
    pub volume_id: u32,
}

/// What is served where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSummary {
    pub volume: String,
    pub dev_id: u32,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub cache: CacheMode,
    pub read_only: bool,
    /// Taken over from a server that died (a filesystem on it saw only a pause).
    pub recovered: bool,
}

pub struct UblkServer {
    control: Control,
    devices: Vec<Device>,
}

impl UblkServer {
    /// Checks the options, the driver and our permission to use it, without making anything
    /// (for a server that wants to fail before it opens its pool).
    pub fn check_available(options: &UblkOptions) -> Result<(), UblkError> {
        check_options(options)?;
        let mut control = Control::open()?;
        check_features(&mut control, options.cache)
    }

    /// Makes (or recovers) one device per volume and serves them until [`UblkServer::stop`].
    pub fn start(options: &UblkOptions, volumes: &[UblkVolume]) -> Result<UblkServer, UblkError> {
        check_options(options)?;
        let mut control = Control::open()?;
        check_features(&mut control, options.cache)?;
        let mut server = UblkServer {
            control,
            devices: Vec::with_capacity(volumes.len()),
        };
        for (index, volume) in volumes.iter().enumerate() {
            // On an error, dropping `server` stops the devices started so far.
            let device = server.start_one(options, volume, index)?;
            discovery::record_id(
                &options.state_dir,
                volume.pool_uuid,
                volume.volume_id,
                volume.export.name(),
                device.dev_id(),
            );
            server.devices.push(device);
        }
        Ok(server)
    }

    pub fn devices(&self) -> Vec<DeviceSummary> {
        self.devices
            .iter()
            .map(|device| DeviceSummary {
                volume: device.name().to_string(),
                dev_id: device.dev_id(),
                path: block_path(device.dev_id()),
                size_bytes: device.export_size_bytes(),
                cache: device.cache(),
                read_only: device.read_only(),
                recovered: device.recovered(),
            })
            .collect()
    }

    /// Stops every device (see [`Device::stop`]); the first error, after trying them all.
    pub fn stop(mut self) -> Result<(), UblkError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), UblkError> {
        let mut first_error = None;
        for device in self.devices.drain(..) {
            let dev_id = device.dev_id();
            if let Err(e) = device.stop(&mut self.control) {
                tracing::error!(dev_id, "stopping /dev/ublkb{dev_id}: {e}");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn start_one(
        &mut self,
        options: &UblkOptions,
        volume: &UblkVolume,
        index: usize,
    ) -> Result<Device, UblkError> {
        let config = DeviceConfig {
            export: volume.export.clone(),
            fingerprint: fingerprint(volume.pool_uuid, volume.volume_id),
            queues: options.queues,
            depth: options.depth,
            workers: (usize::from(options.queues) * WORKERS_PER_QUEUE).min(MAX_WORKERS),
            cache: options.cache,
        };
        let wanted = match options.id_base {
            Some(base) => WantedId::Required(base.saturating_add(index as u32)),
            None => discovery::recorded_id(&options.state_dir, volume.pool_uuid, volume.volume_id)
                .map_or(WantedId::Any, WantedId::Preferred),
        };
        let Some(left) = self.left_by_dead_server(config.fingerprint, volume.export.name())? else {
            return Device::create(&mut self.control, &config, wanted);
        };
        let old_id = left.dev_id;
        if left.state == uapi::S_DEV_QUIESCED {
            if let Some(device) = Device::recover(&mut self.control, &config, &left)? {
                return Ok(device);
            }
        }
        // Stopped by the driver (a write-back device: its lost writes make a recovery
        // unsafe), or its size changed: its held I/O fails, a new device takes its place.
        tracing::warn!(
            dev_id = old_id,
            volume = volume.export.name(),
            "the device a dead server left for this volume cannot be recovered: deleting it (I/O still held fails; \
             unmount and mount again what was on it) and making a new one"
        );
        self.control.delete(old_id)?;
        let wanted = match wanted {
            WantedId::Required(id) => WantedId::Required(id),
            _ => WantedId::Preferred(old_id),
        };
        Device::create(&mut self.control, &config, wanted)
    }

    /// The device a previous server left for the volume with `mark`, once the driver is done
    /// with that server (quiesced or stopped); an error if it is still live: served by a
    /// process alive here, or still live after [`DEAD_SERVER_WAIT`] though its process is not
    /// seen (a server in another PID namespace, say). A live device is never taken over.
    fn left_by_dead_server(
        &mut self,
        mark: u64,
        volume: &str,
    ) -> Result<Option<DevInfo>, UblkError> {
        let deadline = Instant::now() + DEAD_SERVER_WAIT;
        loop {
            let found = discovery::scan(&mut self.control)?
                .into_iter()
                .find(|info| info.ublksrv_flags == mark);
            let Some(info) = found else { return Ok(None) };
            let alive = discovery::process_alive(info.ublksrv_pid);
            match judge_left(&info, alive, Instant::now() >= deadline) {
                Left::Take => return Ok(Some(info)),
                Left::Wait => std::thread::sleep(Duration::from_millis(100)),
                Left::ServedElsewhere => {
                    return Err(UblkError::ServedElsewhere {
                        dev_id: info.dev_id,
                        volume: volume.to_string(),
                        pid: info.ublksrv_pid,
                    })
                }
                Left::StillLive => {
                    return Err(UblkError::StillLive {
                        dev_id: info.dev_id,
                        volume: volume.to_string(),
                        pid: info.ublksrv_pid,
                        waited_secs: DEAD_SERVER_WAIT.as_secs(),
                    })
                }
            }
        }
    }
}

/// What to do with a device marked as the volume's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Left {
    /// Its server is gone and the driver is done with it: recover or replace it.
    Take,
    /// Live, its server not seen: the driver may not have caught up with its death yet.
    Wait,
    /// Live, served by a process alive here.
    ServedElsewhere,
    /// Live long after its server was last seen: someone we cannot see serves it.
    StillLive,
}

fn judge_left(info: &DevInfo, server_alive: bool, waited_enough: bool) -> Left {
    match (info.state == uapi::S_DEV_LIVE, server_alive, waited_enough) {
        (false, _, _) => Left::Take,
        (true, true, _) => Left::ServedElsewhere,
        (true, false, false) => Left::Wait,
        (true, false, true) => Left::StillLive,
    }
}

impl Drop for UblkServer {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

fn check_options(options: &UblkOptions) -> Result<(), UblkError> {
    if options.queues == 0 || options.queues > MAX_QUEUES {
        return Err(UblkError::BadOption(format!(
            "--ublk-queues {}: from 1 to {MAX_QUEUES}",
            options.queues
        )));
    }
    if options.depth == 0 || options.depth > uapi::MAX_QUEUE_DEPTH {
        return Err(UblkError::BadOption(format!(
            "--ublk-depth {}: from 1 to {}",
            options.depth,
            uapi::MAX_QUEUE_DEPTH
        )));
    }
    Ok(())
}

/// The driver must copy data by pread/pwrite (user copy), and for write-through devices
/// reissue held requests to a recovering server.
fn check_features(control: &mut Control, cache: CacheMode) -> Result<(), UblkError> {
    let offered = control.features()?;
    if offered & uapi::F_USER_COPY == 0 {
        return Err(UblkError::KernelTooOld {
            missing: "user copy (UBLK_F_USER_COPY)",
            offered,
        });
    }
    if cache == CacheMode::WriteThrough && offered & uapi::F_USER_RECOVERY_REISSUE == 0 {
        return Err(UblkError::KernelTooOld {
            missing: "user recovery with reissue (UBLK_F_USER_RECOVERY_REISSUE)",
            offered,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_device_is_never_taken() {
        let info = |state| DevInfo {
            state,
            ublksrv_pid: 4242,
            ..DevInfo::default()
        };
        let live = info(uapi::S_DEV_LIVE);
        assert_eq!(judge_left(&live, true, false), Left::ServedElsewhere);
        assert_eq!(judge_left(&live, true, true), Left::ServedElsewhere);
        assert_eq!(judge_left(&live, false, false), Left::Wait);
        // Its server is not seen (another PID namespace?): still not ours to delete.
        assert_eq!(judge_left(&live, false, true), Left::StillLive);
        for state in [uapi::S_DEV_DEAD, uapi::S_DEV_QUIESCED, uapi::S_DEV_FAIL_IO] {
            assert_eq!(judge_left(&info(state), false, false), Left::Take);
        }
    }
}
