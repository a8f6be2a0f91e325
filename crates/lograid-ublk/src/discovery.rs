//! Finding this server's devices again: after a restart, the devices a dead server left (to
//! recover them), and the ids the volumes had before (so /dev/ublkbN keeps its name).
//!
//! Every device is marked with a fingerprint of its pool's UUID and its volume's id, kept by
//! the driver in `ublksrv_ctrl_dev_info.ublksrv_flags` (a field the driver stores for the
//! server and never reads): a device is this pool's volume's exactly when its fingerprint
//! matches, whatever its id, whatever the records say. The records (one small file per volume
//! in a state directory, /run/lograid/ublk by default) only say which id to ask for next time.
//!
//! Owns: the fingerprint, scanning the driver's devices, and the records. Must never: take a
//! device whose fingerprint is not ours, or fail serving because a record cannot be written.

use std::path::{Path, PathBuf};

use crate::control::Control;
use crate::error::UblkError;
use crate::uapi::DevInfo;

/// Where the records are kept unless told otherwise (a tmpfs: devices do not outlive a boot).
pub const DEFAULT_STATE_DIR: &str = "/run/lograid/ublk";

/// The top 16 bits of every fingerprint ("LR"), so that no small flag word another ublk
/// server keeps there is ever taken for one.
const FINGERPRINT_MARK: u64 = 0x4c52 << 48;

/// The mark of pool `pool_uuid`'s volume `volume_id` on its device.
pub fn fingerprint(pool_uuid: u128, volume_id: u32) -> u64 {
    // FNV-1a over a domain tag, the UUID and the volume id: stable across builds and versions.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let tag: &[u8] = b"lograid-ublk";
    let bytes = tag
        .iter()
        .copied()
        .chain(pool_uuid.to_le_bytes())
        .chain(volume_id.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    FINGERPRINT_MARK | (hash & 0x0000_ffff_ffff_ffff)
}

/// The ids of every ublk device the driver has (from /sys/class/ublk-char).
fn device_ids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/sys/class/ublk-char") else {
        return Vec::new();
    };
    let mut ids: Vec<u32> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()?.strip_prefix("ublkc")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// Every device the driver has, as it describes them (devices that vanish meanwhile are
/// left out).
pub fn scan(control: &mut Control) -> Result<Vec<DevInfo>, UblkError> {
    let mut found = Vec::new();
    for id in device_ids() {
        if let Some(info) = control.info(id)? {
            found.push(info);
        }
    }
    Ok(found)
}

/// Whether process `pid` exists.
pub fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn record_path(dir: &Path, pool_uuid: u128, volume_id: u32) -> PathBuf {
    dir.join(format!("{pool_uuid:032x}-{volume_id}"))
}

/// The id the volume's device had last time, if recorded.
pub fn recorded_id(dir: &Path, pool_uuid: u128, volume_id: u32) -> Option<u32> {
    let text = std::fs::read_to_string(record_path(dir, pool_uuid, volume_id)).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Records the volume's device id (a warning, not an error, when it cannot).
pub fn record_id(dir: &Path, pool_uuid: u128, volume_id: u32, volume: &str, dev_id: u32) {
    let path = record_path(dir, pool_uuid, volume_id);
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, format!("{dev_id}\n{volume}\n")));
    if let Err(e) = written {
        tracing::warn!(
            path = %path.display(),
            "cannot record the device id of volume '{volume}' (the next start may choose another /dev/ublkbN): {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_marked_and_distinct() {
        let a = fingerprint(1, 1);
        assert_eq!(a >> 48, 0x4c52);
        assert_eq!(a, fingerprint(1, 1));
        assert_ne!(a, fingerprint(1, 2));
        assert_ne!(a, fingerprint(2, 1));
    }

    #[test]
    fn records_round_trip() {
        let dir = std::env::temp_dir().join(format!("lograid-ublk-test-{}", std::process::id()));
        let uuid = 0x1234_5678_9abc_def0_1122_3344_5566_7788u128;
        assert_eq!(recorded_id(&dir, uuid, 3), None);
        record_id(&dir, uuid, 3, "vol0", 7);
        assert_eq!(recorded_id(&dir, uuid, 3), Some(7));
        assert_eq!(recorded_id(&dir, uuid, 4), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!process_alive(0));
        assert!(process_alive(std::process::id() as i32));
    }
}
