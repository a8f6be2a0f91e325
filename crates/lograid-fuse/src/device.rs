//! Making the mount: /dev/fuse opened and mounted on the directory with mount(2) when the
//! process may (root), else by `fusermount3`, which hands the descriptor back over a socket.
//! The mount is made here, not by fuser, so that fuser holds no handle that unmounts the
//! directory by its path when its session ends (by then another mount may be there).
//!
//! Owns: the mount's options (name and type "lograid", no setuid, device or executable files,
//! permissions checked by the kernel) and the `fusermount3` exchange. Must never: mount anywhere
//! but the directory it is given, or unmount anything.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The mount's name (its source in mountinfo) and, through `fusermount3`, its subtype.
const NAME: &str = "lograid";

/// Mounts a FUSE filesystem on `dir` (absolute, resolved); returns the /dev/fuse descriptor it
/// is served through. The kernel's INIT request is waiting on it.
pub(crate) fn mount_fuse(dir: &Path) -> io::Result<OwnedFd> {
    match mount_directly(dir)? {
        Some(device) => Ok(device),
        None => mount_with_fusermount(dir),
    }
}

/// mount(2) with a /dev/fuse descriptor of our own; `None` if not allowed (not root).
fn mount_directly(dir: &Path) -> io::Result<Option<OwnedFd>> {
    let root_mode = std::fs::metadata(dir)?.permissions().mode();
    // SAFETY: open(2) of a NUL-terminated constant path; the descriptor is owned below.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let device = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain getters without side effects.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let options = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},default_permissions",
        device.as_raw_fd()
    );
    let c_dir = c_path(dir)?;
    let c_options = CString::new(options).map_err(io::Error::other)?;
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"lograid".as_ptr(),
            c_dir.as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c_options.as_ptr().cast(),
        )
    };
    if rc == 0 {
        return Ok(Some(device));
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EPERM) {
        return Ok(None);
    }
    Err(error)
}

/// `fusermount3 -o OPTIONS -- DIR` with one end of a socket pair named in `_FUSE_COMMFD`: it
/// opens /dev/fuse, mounts, and sends the descriptor back over the socket.
fn mount_with_fusermount(dir: &Path) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let their_fd = theirs.as_raw_fd();
    let mut command = Command::new("fusermount3");
    command
        .arg("-o")
        .arg(format!(
            "default_permissions,nosuid,nodev,noexec,fsname={NAME},subtype={NAME}"
        ))
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: fcntl is async-signal-safe; it only clears close-on-exec on the socket end the
    // helper is told about.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    drop(theirs);
    let received = receive_fd(&ours);
    drop(ours);
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait()?;
    match received? {
        Some(device) => Ok(device),
        None => Err(io::Error::other(format!(
            "fusermount3 ({status}): {}",
            stderr.trim()
        ))),
    }
}

/// The descriptor `fusermount3` sends over `socket` (SCM_RIGHTS); `None` if it closed the socket
/// without sending one (it failed, and said why on stderr).
fn receive_fd(socket: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to live buffers.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    let received = loop {
        // SAFETY: recvmsg into the buffers `message` points to, which outlive the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    if received == 0 {
        return Ok(None);
    }
    // SAFETY: walking the control messages recvmsg filled in, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&message);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return Ok(Some(OwnedFd::from_raw_fd(fd)));
            }
            cmsg = libc::CMSG_NXTHDR(&message, cmsg);
        }
    }
    Ok(None)
}

/// `path` as a C string (for mount and umount).
pub(crate) fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}
