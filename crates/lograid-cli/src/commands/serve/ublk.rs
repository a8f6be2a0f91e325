//! `serve --ublk`: each volume of the pool as a Linux block device /dev/ublkbN served by this
//! process through ublk (crate lograid-ublk), beside the NBD exports.
//!
//! Owns: the `--ublk*` options as device options, checking the driver before the pool is
//! opened (so a missing ublk_drv fails first), starting the devices (recovering those a killed
//! server left for this pool), saying where they are, and stopping them before the pool
//! closes. Must never: outlive the pool, or serve on macOS (ublk is a Linux driver: the error
//! says what to use there).

use anyhow::Result;
use lograid::Pool;
use lograid_nbd::Export;
use std::sync::Arc;

use super::ServeArgs;

/// The devices being served; stop them with [`Running::stop`] (dropped, they are stopped too).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct Running {
    #[cfg(target_os = "linux")]
    server: lograid_ublk::UblkServer,
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use crate::size::human;
    use anyhow::Context;
    use lograid_ublk::{CacheMode, UblkOptions, UblkServer, UblkVolume};

    fn options(a: &ServeArgs) -> UblkOptions {
        let defaults = UblkOptions::default();
        UblkOptions {
            queues: a.ublk_queues.unwrap_or(defaults.queues),
            depth: a.ublk_depth,
            id_base: a.ublk_id_base,
            cache: if a.ublk_write_cache {
                CacheMode::WriteBack
            } else {
                CacheMode::WriteThrough
            },
            ..defaults
        }
    }

    /// Fails now if devices cannot be made (bad options, no driver, no permission).
    pub fn check(a: &ServeArgs) -> Result<()> {
        UblkServer::check_available(&options(a)).context("--ublk")
    }

    /// One device per export (the volumes of `pool`, as NBD serves them).
    pub fn start(pool: &Pool, exports: &[Arc<dyn Export>], a: &ServeArgs) -> Result<Running> {
        let ids: Vec<(String, u32)> = pool
            .volumes()
            .iter()
            .map(|v| (v.name().to_string(), v.id()))
            .collect();
        let volumes: Vec<UblkVolume> = exports
            .iter()
            .filter_map(|export| {
                let volume_id = ids.iter().find(|(name, _)| name == export.name())?.1;
                Some(UblkVolume {
                    export: export.clone(),
                    pool_uuid: pool.uuid(),
                    volume_id,
                })
            })
            .collect();
        let server = UblkServer::start(&options(a), &volumes).context("--ublk")?;
        for device in server.devices() {
            tracing::info!(
                device = %device.path.display(),
                volume = %device.volume,
                size_bytes = device.size_bytes,
                cache = ?device.cache,
                read_only = device.read_only,
                recovered = device.recovered,
                "serving the volume as a ublk block device"
            );
        }
        Ok(Running { server })
    }

    impl Running {
        /// Where each volume is, for the "how to connect" text.
        pub fn connect_lines(&self) -> String {
            let mut out =
                String::from("volumes as block devices (ublk, served by this process):\n");
            for device in self.server.devices() {
                let mut notes = vec![match device.cache {
                    CacheMode::WriteThrough => "write-through",
                    CacheMode::WriteBack => "write cache",
                }];
                if device.read_only {
                    notes.push("read-only");
                }
                if device.recovered {
                    notes.push("recovered from the previous server");
                }
                out.push_str(&format!(
                    "  {}      volume '{}', {} ({})\n",
                    device.path.display(),
                    device.volume,
                    human(device.size_bytes),
                    notes.join(", ")
                ));
            }
            out
        }

        /// Stops the devices: written back, removed, the volumes flushed.
        pub fn stop(self) -> Result<()> {
            self.server.stop().context("stopping the ublk devices")
        }
    }
}

#[cfg(target_os = "linux")]
pub use linux::{check, start};

#[cfg(not(target_os = "linux"))]
mod other {
    use super::*;

    const NOT_HERE: &str =
        "--ublk: ublk block devices are a Linux kernel driver; on macOS serve the volumes with --nfs (docs/MACOS.md)";

    pub fn check(_a: &ServeArgs) -> Result<()> {
        anyhow::bail!(NOT_HERE)
    }

    pub fn start(_pool: &Pool, _exports: &[Arc<dyn Export>], _a: &ServeArgs) -> Result<Running> {
        anyhow::bail!(NOT_HERE)
    }

    impl Running {
        pub fn connect_lines(&self) -> String {
            String::new()
        }

        pub fn stop(self) -> Result<()> {
            Ok(())
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub use other::{check, start};
