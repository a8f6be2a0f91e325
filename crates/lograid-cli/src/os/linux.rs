//! Linux's side of the command's system-specific parts (see `mod.rs`).

use super::linux_tools as tools;
use anyhow::{bail, Context, Result};
use lograid_nbd::Export;
use std::io;
use std::net::SocketAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr as UnixSocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The volumes as files in a FUSE mount (`serve --fuse`).
pub struct FilesMount(lograid_fuse::FuseMount);

impl FilesMount {
    /// The directory the volumes' files are in.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }
}

/// Mounts the volumes' files on `dir` (an absolute path).
pub fn mount_files(dir: &Path, exports: Vec<Arc<dyn Export>>) -> Result<FilesMount> {
    let mount = lograid_fuse::mount(dir, exports, &lograid_fuse::FuseOptions::default())
        .map_err(|e| anyhow::anyhow!("--fuse: {e}"))?;
    Ok(FilesMount(mount))
}

/// Unmounts the volumes' files, warning if one was still in use.
pub fn unmount_files(mount: FilesMount) {
    match mount.0.unmount() {
        Ok(lograid_fuse::Unmounted::Clean) => {}
        Ok(lograid_fuse::Unmounted::Aborted) => eprintln!(
            "lograid: warning: a volume's FUSE file was still in use (a loop device not detached?); \
             its connection was aborted, so its holder now gets I/O errors; detach it with `lograid detach`"
        ),
        Ok(lograid_fuse::Unmounted::Refusing) => eprintln!(
            "lograid: warning: the volumes' FUSE mount was left as it is (the line above says why: a file \
             still in use whose connection could not be aborted, or a mount on the directory not proved this \
             server's); requests through its files get I/O errors; detach a loop device on one with `lograid detach`"
        ),
        Err(e) => eprintln!("lograid: warning: {e}"),
    }
}

/// `attach` and `detach` of NBD exports and FUSE files work here (loop devices, nbdfuse, FUSE).
pub fn attach_supported() -> Result<()> {
    Ok(())
}

/// Where `lograid serve` publishes its status and `attach` keeps its records.
pub const RUN_DIR: &str = "/run/lograid";

/// Mounts the NFS export of `lograid serve --nfs` at `server` on `dir` (the kernel NFS client).
pub fn mount_nfs(server: SocketAddr, dir: &Path, extra: Option<&str>) -> Result<()> {
    tools::mount_nfs(server, dir, extra).run().map(drop)
}

pub fn unmount(dir: &Path) -> Result<()> {
    tools::umount(dir).run().map(drop)
}

/// A loop device with direct I/O on `file` (`mount_volumes` means nothing here: the loop
/// device's filesystems are the user's to mount).
pub fn attach_image(file: &Path, _mount_volumes: bool) -> Result<PathBuf> {
    tools::attached_loop(&tools::losetup_attach(file).run()?)
}

/// The file behind loop device `device`, or None if it has none (or is not a loop device).
pub fn image_backing(device: &Path) -> Result<Option<PathBuf>> {
    Ok(tools::losetup_backing(device)
        .run()
        .ok()
        .map(|out| out.trim().to_string())
        .filter(|file| !file.is_empty())
        .map(PathBuf::from))
}

pub fn detach_image(device: &Path) -> Result<()> {
    tools::losetup_detach(device).run().map(drop)
}

/// What to do with a newly attached device.
pub fn format_hint(device: &Path) -> String {
    format!(
        "make a filesystem on it, e.g. `mkfs.ext4 {}`",
        device.display()
    )
}

/// Whether something is mounted on `dir` (a FUSE mount that outlived nbdfuse, for `detach`).
pub fn is_fuse_mount_point(dir: &Path) -> bool {
    lograid_fuse::is_mount_point(dir)
}

/// The abstract Unix socket `name` (without the leading `@`).
pub fn abstract_socket(name: &[u8]) -> io::Result<UnixSocketAddr> {
    UnixSocketAddr::from_abstract_name(name)
}

/// Fixes glibc's threshold above which an allocation is a mapping of its own (returned to the
/// system when freed) at `MMAP_THRESHOLD_BYTES`, and the free space an arena keeps at its top
/// before giving it back at twice that (glibc's own ratio). Left to itself, glibc raises both
/// to the size of each mapped block freed (up to 32 and 64 MiB): after one checkpoint's
/// encoding (tens of MB) every later buffer below that size comes from per-thread arenas, each
/// of which keeps its own peak (a server held 0.3 GB with 75 MB in use). Fixing the first
/// alone left the second at 128 KiB: a freed 1 MiB buffer at an arena's top went back to the
/// system and the next was faulted in anew (sequential reads cost 2.5 x the system CPU).
pub fn pin_allocator_thresholds() {
    /// Row buffers (1 MiB) and parity buffers stay below it; checkpoint encodings and large
    /// request buffers are mapped.
    const MMAP_THRESHOLD_BYTES: libc::c_int = 4 << 20;
    // SAFETY: mallopt takes two integers; a refused setting changes nothing.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_BYTES);
    }
}

/// Time the hypervisor ran something else on the CPUs this thread may run on (steal time,
/// `/proc/stat`), in seconds since boot, and how many CPUs that is; None where the kernel
/// does not say.
pub fn stolen_seconds() -> Option<(f64, usize)> {
    // SAFETY: a zeroed cpu_set_t is an empty set, filled by sched_getaffinity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is a valid cpu_set_t of the size given; pid 0 is the calling thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return None;
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (mut ticks, mut cpus) = (0u64, 0usize);
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(cpu) = fields.next().and_then(|f| f.strip_prefix("cpu")) else {
            continue;
        };
        let Ok(cpu) = cpu.parse::<usize>() else {
            continue; // the line of all CPUs
        };
        // SAFETY: CPU_ISSET reads within the set for cpu < CPU_SETSIZE.
        if cpu >= libc::CPU_SETSIZE as usize || !unsafe { libc::CPU_ISSET(cpu, &set) } {
            continue;
        }
        // user nice system idle iowait irq softirq steal
        ticks += fields.nth(7)?.parse::<u64>().ok()?;
        cpus += 1;
    }
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (cpus > 0 && per_second > 0).then(|| (ticks as f64 / per_second as f64, cpus))
}

/// Keeps this process (the calling thread, and every thread started after) on CPUs 0..n.
pub fn run_on_first_cpus(n: usize) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n == 0 || n > cores || n > libc::CPU_SETSIZE as usize {
        bail!("{n} CPUs asked for; this machine has {cores}");
    }
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it (n <= CPU_SETSIZE).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..n {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: the set is a valid cpu_set_t of the size given; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error()).context("sched_setaffinity");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// Steal time comes from /proc/stat for the CPUs this thread may run on.
    #[test]
    fn steal_time_is_read_for_the_cpus_this_thread_may_use() {
        let (stolen_s, cpus) = stolen_seconds().expect("/proc/stat has steal time");
        assert!(stolen_s >= 0.0, "{stolen_s}");
        assert!(
            (1..=libc::CPU_SETSIZE as usize).contains(&cpus),
            "{cpus} CPUs"
        );
    }

    /// The loop-device half of attaching a volume's file from an NFS mount, on a local file
    /// (this kernel has no NFS client): attached with direct I/O, its file found behind it,
    /// detached. Needs root and loop devices.
    #[test]
    fn a_file_becomes_a_loop_device_that_names_it_and_is_detached() {
        // SAFETY: geteuid has no failure mode.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/loop-control").exists() {
            eprintln!("SKIPPED: needs root and loop devices");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vol0");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let device = attach_image(&file, false).unwrap();
        let backing = image_backing(&device);
        let size = std::fs::read_to_string(format!(
            "/sys/block/{}/size",
            device.file_name().unwrap().to_string_lossy()
        ));
        let direct = std::fs::read_to_string(format!(
            "/sys/block/{}/loop/dio",
            device.file_name().unwrap().to_string_lossy()
        ));
        detach_image(&device).unwrap();
        assert_eq!(backing.unwrap(), Some(file.clone()));
        assert_eq!(size.unwrap().trim(), ((8 << 20) / 512).to_string());
        assert_eq!(direct.unwrap().trim(), "1", "direct I/O");
        // Detached: no file behind it any more (or another one, taken meanwhile).
        assert_ne!(image_backing(&device).unwrap(), Some(file));
        assert!(format_hint(&device).contains(&device.display().to_string()));
    }

    #[test]
    fn an_abstract_socket_takes_datagrams_by_its_name() {
        let name = format!("lograid-os-unit-{}", std::process::id());
        let addr = abstract_socket(name.as_bytes()).unwrap();
        assert_eq!(addr.as_abstract_name(), Some(name.as_bytes()));
        assert!(addr.as_pathname().is_none());
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        let client = UnixDatagram::unbound().unwrap();
        client.send_to_addr(b"READY=1\n", &addr).unwrap();
        let mut buf = [0u8; 16];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\n");
    }
}
