"""Storage stacks on sparse member files, built and torn down for a benchmark.

This module owns the *lifecycle* of one stack and nothing else:

  * a private work folder (``tempfile.mkdtemp`` under ``--dir``) holding the
    sparse member files, the mount point and, for lograid, the server's
    socket, run directory and attach records;
  * the loop devices attached to those files (``losetup --direct-io=on`` where
    the kernel accepts it, plain ``losetup`` otherwise);
  * what is built on them: ``mkfs.btrfs -d PROFILE -m METADATA`` (BtrfsStack),
    ``mkfs.ext4`` on one device (Ext4Stack, the "bare drive"), a lograid pool
    served over NBD on a Unix socket and, when a filesystem is wanted, attached
    as a kernel block device with ext4 on it (LograidStack), the same attach
    path over nbdkit's memory plugin instead of lograid, with no members
    (PathRefStack; both share NbdAttachedStack), a zfs-fuse pool (ZfsFuseStack);
  * the member write counters: field 7 of ``/sys/block/loopN/stat`` (sectors
    written, always 512-byte units) summed over the members, which is what
    write amplification is measured with (the same for every stack: lograid's
    members are loop devices too);
  * a degraded mode for read tests: ``degrade(n)`` detaches n member loop
    devices and brings the stack back without them (btrfs: ``mount -o
    degraded,ro``; lograid: ``lograid serve --read-only`` on the others);
  * teardown, which always runs (``with`` block / ``try``-``finally``, plus
    SIGINT/SIGTERM handlers that turn the signal into an exception so the
    ``finally`` runs): kill registered child processes, unmount, detach, stop
    servers and daemons, ``losetup -d``, delete the member files and the work
    folder.

It touches nothing it did not create: the loop devices it detaches are the ones
attached to its own files (``losetup -j FILE``), mounts it removes are under its
own work folder, the processes it stops are the ones it started, and the
kernel's dirty-page limits are left as they are (that is the caller's job).

Usage::

    with BtrfsStack("raid5", members=3, member_size=4 << 30, parent="/var/tmp") as st:
        st.mountpoint            # where to put files
        st.member_names          # ["loop3", "loop4", "loop5"]
        st.member_bytes_written()

``python3 bench/stacks.py up-down [--profile raid5] [--member-size 1G]`` builds one
btrfs stack, prints what it got and tears it down again (a smoke test);
``--kind bare|lograid|pathref|zfs`` does the same for the other kinds.
"""

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Minimum number of devices per btrfs profile.
MIN_MEMBERS = {"raid0": 2, "raid5": 2, "raid6": 3}

# Metadata profile btrfs recommends beside a data profile (raid5/6 metadata
# shares their write hole; `btrfs` itself warns about it).
RECOMMENDED_METADATA = {"raid0": "raid0", "raid5": "raid1", "raid6": "raid1c3"}

# Head-room on the host filesystem beyond the member files themselves (btrfs
# metadata, fio logs, results): refuse to start without it.
HOST_MARGIN = 1 << 30


def log(msg):
    """Progress line on stderr with a wall-clock stamp."""
    print(time.strftime("[%H:%M:%S] ") + msg, file=sys.stderr, flush=True)


def parse_size(text):
    """'4G' / '512M' / '1048576' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise ValueError("bad size: %r" % text)
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def run(cmd, check=True, quiet=False, env=None, timeout=None):
    """Run a command (list), return its stdout; raise with its stderr on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    if not quiet and p.returncode != 0:
        log("note: %s -> %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return p.stdout


class Interrupted(Exception):
    """Raised in the main thread by the SIGINT/SIGTERM handler."""


def mounts_under(prefix):
    """Mount points at or below `prefix` (from /proc/self/mounts), deepest first."""
    prefix = os.path.realpath(prefix)
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                mp = line.split(" ")[1].replace("\\040", " ").replace("\\011", "\t") \
                    .replace("\\012", "\n").replace("\\134", "\\")
                if mp == prefix or mp.startswith(prefix + "/"):
                    found.append(mp)
    except OSError:
        pass
    return sorted(set(found), key=len, reverse=True)


def process_cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat), None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def machine_cpu_seconds():
    """CPU seconds all CPUs spent busy so far (/proc/stat: all but idle and iowait),
    whoever's work it was."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def stop_process(proc, timeout=60, name="process"):
    """SIGTERM a Popen we started, wait up to `timeout` s, then SIGKILL. Never raises."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log("warning: %s (pid %d) did not stop in %d s; killing it" % (name, proc.pid, timeout))
        proc.kill()
        proc.wait()
    except OSError:
        pass


class LoopStack:
    """The common part: a private folder, sparse member files, their loop devices,
    teardown and the signal handlers. Subclasses build storage on self.devices
    in build() and undo it in unbuild()."""

    kind = "loop"

    def __init__(self, members, member_size, parent, name):
        self.members = members
        self.member_size = member_size
        self.parent = parent
        self.name = name
        # Everything below is filled in as it is created, and undone in teardown().
        self.workdir = None
        self.files = []
        self.devices = []          # "/dev/loopN", in member order (detached ones removed)
        self.failed = []           # member files whose loop devices degrade() detached
        self.direct_io = None      # whether losetup --direct-io=on was accepted
        self.mountpoint = None
        self.mounted = False
        self.children = []         # subprocess.Popen objects to kill before unmounting
        self._old_handlers = {}

    # ----- bring-up ---------------------------------------------------------------

    def space_needed(self):
        return self.members * self.member_size + HOST_MARGIN

    def check_space(self):
        """Refuse to start if the host folder could not hold the member files filled."""
        st = os.statvfs(self.parent)
        free = st.f_bavail * st.f_frsize
        if free < self.space_needed():
            raise RuntimeError("not enough space in %s: %.1f GiB free, %d x %.1f GiB members "
                               "+ %.1f GiB margin needed" % (self.parent, free / 2**30, self.members,
                                                            self.member_size / 2**30, HOST_MARGIN / 2**30))

    def up(self):
        self.check_space()
        self._install_signal_handlers()
        self.workdir = tempfile.mkdtemp(prefix="lograid-stack-", dir=self.parent)
        for i in range(self.members):
            path = os.path.join(self.workdir, "d%d.img" % i)
            with open(path, "wb") as f:
                f.truncate(self.member_size)          # sparse
            self.files.append(path)
            self.devices.append(self._attach(path))
        self.mountpoint = os.path.join(self.workdir, "mnt")
        os.mkdir(self.mountpoint)
        self.build()
        log("up: %s on %s (%s, direct-io=%s) in %s" % (self.name, " ".join(self.member_names),
                                                      self.describe(),
                                                      "on" if self.direct_io else "off", self.workdir))
        return self

    def build(self):
        raise NotImplementedError

    def describe(self):
        return self.kind

    def _attach(self, path):
        """losetup a file, with --direct-io=on if the kernel takes it; return /dev/loopN."""
        if self.direct_io is not False:
            p = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", path],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            dev = p.stdout.strip()
            if p.returncode == 0 and dev:
                self.direct_io = True
                return dev
            if dev:                      # attached, but direct I/O refused: keep it, note it
                self.direct_io = False
                return dev
            log("note: losetup --direct-io=on failed (%s); using buffered loop" % p.stderr.strip())
            self.direct_io = False
        return run(["losetup", "-f", "--show", path]).strip()

    def mount(self, device, options=None, fstype=None):
        cmd = ["mount"] + (["-t", fstype] if fstype else []) + (["-o", options] if options else [])
        run(cmd + [device, self.mountpoint])
        self.mounted = True

    def unmount(self):
        """Unmount self.mountpoint (retrying while busy, lazily as a last resort)."""
        if not (self.mountpoint and os.path.ismount(self.mountpoint)):
            self.mounted = False
            return
        for _ in range(10):
            if subprocess.run(["umount", self.mountpoint], stderr=subprocess.DEVNULL).returncode == 0:
                self.mounted = False
                return
            time.sleep(1)
        log("warning: %s busy, lazy unmount" % self.mountpoint)
        subprocess.run(["umount", "-l", self.mountpoint])
        self.mounted = False

    def detach_members(self, count):
        """Detach the loop devices of the last `count` members (their files stay, for
        teardown to delete): the members are gone as far as the stack can see."""
        for _ in range(count):
            dev = self.devices.pop()
            self.failed.append(self.files[len(self.devices)])
            run(["losetup", "-d", dev])
        # losetup -d is asynchronous while something still holds the device.
        time.sleep(0.5)

    # ----- what callers read --------------------------------------------------------

    @property
    def member_names(self):
        """Kernel names of the member block devices, e.g. ['loop0', 'loop1', 'loop2']."""
        return [os.path.basename(d) for d in self.devices]

    def member_bytes_written(self):
        """Bytes written to all members so far (field 7 of /sys/block/X/stat, x 512)."""
        total = 0
        for name in self.member_names:
            with open("/sys/block/%s/stat" % name) as f:
                total += int(f.read().split()[6]) * 512
        return total

    def member_bytes_read(self):
        """Bytes read from all members so far (field 3 of /sys/block/X/stat, x 512)."""
        total = 0
        for name in self.member_names:
            with open("/sys/block/%s/stat" % name) as f:
                total += int(f.read().split()[2]) * 512
        return total

    def sync(self):
        """Make everything written to this stack's filesystem durable (syncfs via `sync -f`)."""
        run(["sync", "-f", self.mountpoint])

    def trim(self):
        """Give freed space back to the sparse member files (untimed housekeeping)."""
        if self.mounted:
            run(["fstrim", self.mountpoint], check=False, quiet=True)

    def degrade(self, count):
        raise NotImplementedError("%s has no degraded mode here" % self.name)

    # ----- teardown -----------------------------------------------------------------

    def unbuild(self):
        """Undo build() (subclasses extend); must not raise."""
        self.unmount()

    def teardown(self):
        """Undo everything up() did, in reverse; never raises, tries every step."""
        # A second Ctrl-C while tearing down must not leave loops behind.
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except ValueError:           # not in the main thread
                pass
        for child in self.children:
            stop_process(child, 10, "child")
        self.children = []
        try:
            self.unbuild()
        except Exception as e:           # keep going: loops and files must still go
            log("warning: %s teardown: %s" % (self.name, e))
        if self.workdir:
            for mp in mounts_under(self.workdir):
                log("warning: still mounted: %s; unmounting" % mp)
                if subprocess.run(["umount", mp], stderr=subprocess.DEVNULL).returncode != 0:
                    subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
        self.mounted = False
        for dev in reversed(self.devices):
            if subprocess.run(["losetup", "-d", dev], stderr=subprocess.DEVNULL).returncode != 0:
                log("warning: losetup -d %s failed" % dev)
        self.devices = []
        # Loop devices on our files that we lost track of (e.g. a signal between
        # `losetup --show` returning and us recording its answer).
        for path in self.files:
            out = subprocess.run(["losetup", "-j", path], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True).stdout
            for line in out.splitlines():
                dev = line.split(":", 1)[0]
                if dev.startswith("/dev/loop"):
                    subprocess.run(["losetup", "-d", dev], stderr=subprocess.DEVNULL)
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.files = []
        if self.workdir:
            if mounts_under(self.workdir):
                log("warning: %s still has mounts; not removing it" % self.workdir)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
                log("down: %s, removed %s" % (self.name, self.workdir))
            self.workdir = None
        self._restore_signal_handlers()

    def _install_signal_handlers(self):
        def handler(signum, frame):
            raise Interrupted("signal %d" % signum)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def __enter__(self):
        try:
            return self.up()
        except BaseException:
            self.teardown()
            raise

    def __exit__(self, *exc):
        self.teardown()
        return False


class BtrfsStack(LoopStack):
    """One btrfs filesystem over `members` loop devices on sparse files.

    `profile` is the data profile (raid0, raid5, raid6); `metadata` defaults to
    the same profile (so "raid5" is mkfs.btrfs -d raid5 -m raid5).
    """

    kind = "btrfs"

    def __init__(self, profile="raid5", members=3, member_size=4 << 30, parent="/var/tmp",
                 metadata=None):
        if profile not in MIN_MEMBERS:
            raise ValueError("unknown profile %r (have %s)" % (profile, ", ".join(MIN_MEMBERS)))
        if members < MIN_MEMBERS[profile]:
            raise ValueError("%s needs at least %d members" % (profile, MIN_MEMBERS[profile]))
        self.profile = profile
        self.metadata = metadata or profile
        super().__init__(members, member_size, parent,
                         "btrfs-" + profile + ("" if self.metadata == profile else "-m" + self.metadata))
        self.mkfs_args = ["-d", profile, "-m", self.metadata]
        self.uuid = None           # filesystem UUID, for /sys/fs/btrfs/UUID/
        self.parity = {"raid0": 0, "raid5": 1, "raid6": 2}[profile]

    def describe(self):
        return "mkfs.btrfs " + " ".join(self.mkfs_args)

    def build(self):
        run(["mkfs.btrfs", "-q", "-f"] + self.mkfs_args + self.devices)
        self.mount(self.devices[0], fstype="btrfs")
        m = re.search(r"uuid:\s*([0-9a-f-]{36})", run(["btrfs", "filesystem", "show", self.mountpoint]))
        self.uuid = m.group(1) if m else None

    def usage(self):
        """`btrfs filesystem usage -b` as a dict of the 'Overall' section, in bytes.

        Keys include 'Device size', 'Device unallocated', 'Used', 'Free (estimated)',
        'Data ratio', 'Metadata ratio'.
        """
        out = run(["btrfs", "filesystem", "usage", "-b", self.mountpoint])
        vals = {}
        for line in out.splitlines():
            m = re.match(r"\s+([A-Za-z][A-Za-z ()]*?):\s+([0-9.]+)", line)
            if m and m.group(1) not in vals:
                vals[m.group(1)] = float(m.group(2))
            if line.startswith("Data,"):
                break
        return vals

    def capacity_bytes(self):
        """Usable capacity for file data: 'Free (estimated)' of `btrfs filesystem
        usage -b`, read on the fresh, empty filesystem (it is unallocated space
        divided by the data profile's ratio plus free space in data chunks).
        statvfs is not used: for raid5/6 btrfs reports f_blocks as the raw size
        of all members (12 GiB for 3 x 4 GiB), parity included."""
        return int(self.usage()["Free (estimated)"])

    def commit_stats(self):
        """Transaction commits so far: /sys/fs/btrfs/UUID/commit_stats as a dict
        ('commits', 'total_commit_ms', ...); empty if the kernel lacks it."""
        try:
            with open("/sys/fs/btrfs/%s/commit_stats" % self.uuid) as f:
                return {k: int(v) for k, v in (line.split() for line in f if line.strip())}
        except (OSError, ValueError, TypeError):
            return {}

    def degrade(self, count):
        """Unmount, detach `count` members, mount the rest with -o degraded,ro.
        (Registering the remaining devices is enough; `btrfs device scan --forget`
        would also drop them from the kernel's list, and the mount then fails.)"""
        if count > self.parity:
            raise RuntimeError("%s survives %d missing members, not %d" % (self.name, self.parity, count))
        self.unmount()
        self.detach_members(count)
        for dev in self.devices:
            run(["btrfs", "device", "scan", dev], check=False, quiet=True)
        self.mount(self.devices[0], options="degraded,ro", fstype="btrfs")


class Ext4Stack(LoopStack):
    """The bare drive: ext4 on one loop device (inode tables and journal written at
    mkfs, so no lazy initialisation runs in the background during the tests)."""

    kind = "ext4"

    def __init__(self, member_size=4 << 30, parent="/var/tmp", name="bare"):
        super().__init__(1, member_size, parent, name)
        self.parity = 0

    def describe(self):
        return "mkfs.ext4 -E lazy_itable_init=0,lazy_journal_init=0"

    def build(self):
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.devices[0]])
        self.mount(self.devices[0])


class NbdAttachedStack(LoopStack):
    """The part of a stack that an NBD server on a Unix socket in the work folder
    provides, made a kernel block device with `lograid attach` (nbdfuse + a
    direct-I/O loop device; attach records in WORK/attach) and ext4 on it, mounted
    at self.mountpoint. Subclasses say which server (server_command()) and what
    it serves; LOGRAID_RUN_DIR = WORK/run for every lograid command, so nothing
    is written to /run/lograid."""

    server_name = "server"

    def __init__(self, members, member_size, parent, name, binary="lograid", volume="vol0", log_dir=None):
        super().__init__(members, member_size, parent, name)
        self.binary = binary       # the lograid binary (attach, detach; serve for LograidStack)
        self.volume = volume       # the export name asked for
        self.log_dir = log_dir     # server logs are copied here at teardown, if set
        self.server = None         # Popen of the server
        self.server_logs = []
        self.attached = None       # /dev/loopN from `lograid attach`
        self.volume_bytes = None

    # paths inside the work folder
    @property
    def socket_path(self):
        return os.path.join(self.workdir, "nbd.sock")

    @property
    def run_dir(self):
        return os.path.join(self.workdir, "run")

    @property
    def state_dir(self):
        return os.path.join(self.workdir, "attach")

    @property
    def nbd_uri(self):
        return "nbd+unix:///%s?socket=%s" % (self.volume, self.socket_path)

    def env(self):
        e = dict(os.environ)
        e["LOGRAID_RUN_DIR"] = self.run_dir
        return e

    def lograid(self, *args, timeout=600):
        return run([self.binary] + list(args), env=self.env(), timeout=timeout)

    def server_command(self, devices, read_only=False):
        raise NotImplementedError

    def start_server(self, devices, read_only=False):
        """server_command() in its own session (so a Ctrl-C meant for us does not stop
        it before we unmount), output to WORK/serve-N.log; waits until the socket
        accepts connections."""
        logpath = os.path.join(self.workdir, "serve-%d.log" % (len(self.server_logs) + 1))
        self.server_logs.append(logpath)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        cmd = self.server_command(devices, read_only)
        with open(logpath, "w") as logf:
            self.server = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=self.env(),
                                           start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError("%s exited (%d): %s" % (self.server_name, self.server.returncode,
                                                           self._log_tail(logpath)))
            if os.path.exists(self.socket_path):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.socket_path)
                    s.close()
                    return
                except OSError:
                    s.close()
            time.sleep(0.1)
        raise RuntimeError("%s did not listen within 60 s: %s" % (self.server_name, self._log_tail(logpath)))

    @staticmethod
    def _log_tail(path, n=6):
        try:
            with open(path) as f:
                return " | ".join(line.strip() for line in f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def stop_server(self):
        """SIGTERM (lograid serve finishes requests, flushes and checkpoints, then exits)."""
        if self.server is not None:
            stop_process(self.server, 120, self.server_name)
            if self.server.returncode not in (0, None):
                log("note: %s exited %s: %s" % (self.server_name, self.server.returncode,
                                                self._log_tail(self.server_logs[-1])))
            self.server = None

    def attach_command(self):
        """The `lograid attach` arguments that make the volume a /dev/loopN."""
        return ["attach", "--socket", self.socket_path, "--export", self.volume, "--state-dir", self.state_dir]

    def attach_and_mount(self, read_only=False):
        self.attached = self.lograid(*self.attach_command()).strip()
        if not read_only:
            run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.attached])
        self.mount(self.attached, options="ro" if read_only else None)

    def detach(self):
        if self.attached:
            p = subprocess.run([self.binary, "detach", self.attached, "--state-dir", self.state_dir],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env())
            if p.returncode != 0:
                log("note: lograid detach %s: %s" % (self.attached, p.stderr.strip()))
            self.attached = None
        if self.workdir and os.path.isdir(self.state_dir):
            # Anything else recorded in *our* state directory (never /run/lograid).
            subprocess.run([self.binary, "detach", "--all", "--state-dir", self.state_dir],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env())

    def sync(self):
        if self.mounted:
            run(["sync", "-f", self.mountpoint])

    def cpu_seconds(self):
        """CPU seconds so far of the server and of the attach's nbdfuse (pid file in
        the state folder): {"server": s, "nbdfuse": s}, None for one not running."""
        out = {"server": process_cpu_seconds(self.server.pid) if self.server else None, "nbdfuse": None}
        pids = glob.glob(os.path.join(self.state_dir, "fuse-*.pid")) if self.workdir and self.attached else []
        if len(pids) == 1:
            try:
                with open(pids[0]) as f:
                    out["nbdfuse"] = process_cpu_seconds(int(f.read().strip()))
            except (OSError, ValueError):
                pass
        return out

    def unbuild(self):
        self.unmount()
        self.detach()
        self.stop_server()
        if self.log_dir and self.workdir:
            os.makedirs(self.log_dir, exist_ok=True)
            for p in self.server_logs:
                if os.path.exists(p):
                    shutil.copy(p, os.path.join(self.log_dir, os.path.basename(p)))


class LograidStack(NbdAttachedStack):
    """A lograid pool on loop-device members, served over NBD on a Unix socket in the
    work folder, with one volume as large as the pool's usable capacity.

    With filesystem=True the volume is also attached as a kernel block device
    (`lograid attach`: nbdfuse + a direct-I/O loop device; attach records in the
    work folder) with ext4 on it, mounted at self.mountpoint. Without, clients
    use self.nbd_uri (fio's nbd engine). The server's live status goes to
    LOGRAID_RUN_DIR = WORK/run, so nothing is written to /run/lograid."""

    kind = "lograid"
    server_name = "lograid serve"

    ATTACH = ("fuse", "nbdfuse")

    def __init__(self, parity, members=3, member_size=4 << 30, parent="/var/tmp", binary="lograid",
                 chunk=None, filesystem=True, volume="vol0", log_dir=None, attach="fuse"):
        if members < parity + 1:
            raise ValueError("lograid P=%d needs at least %d members" % (parity, parity + 1))
        if attach not in self.ATTACH:
            raise ValueError("unknown attach mode %r" % attach)
        super().__init__(members, member_size, parent, "lograid-p%d" % parity, binary, volume, log_dir)
        self.parity = parity
        self.chunk = chunk
        self.filesystem = filesystem
        # fuse: the server's own FUSE file (`serve --fuse WORK/files`, `attach --file`);
        # nbdfuse: `attach --socket` (nbdfuse over NBD), as path-ref does.
        self.attach_mode = attach
        self.usable_bytes = None
        self.create_output = ""

    def describe(self):
        return "lograid create --parity %d%s; serve --socket; %s" % (
            self.parity, " --chunk %s" % self.chunk if self.chunk else "",
            ("attach (%s) + mkfs.ext4" % ("serve --fuse, attach --file" if self.attach_mode == "fuse"
                                           else "nbdfuse")) if self.filesystem else "fio nbd engine")

    @property
    def fuse_dir(self):
        return os.path.join(self.workdir, "files")

    def attach_command(self):
        if self.attach_mode == "fuse":
            return ["attach", "--file", os.path.join(self.fuse_dir, self.volume), "--state-dir", self.state_dir]
        return super().attach_command()

    def build(self):
        os.makedirs(self.run_dir, exist_ok=True)
        create = ["create", "--parity", str(self.parity)]
        if self.chunk:
            create += ["--chunk", str(self.chunk)]
        self.create_output = self.lograid(*(create + self.devices)).strip()
        st = json.loads(self.lograid("status", "--json", *self.devices))
        self.usable_bytes = st["usable_bytes"]
        self.volume_bytes = st["usable_bytes"] // (1 << 20) * (1 << 20)
        self.lograid("volume", "create", "--size", str(self.volume_bytes), self.volume, *self.devices)
        self.start_server(self.devices)
        if self.filesystem:
            self.attach_and_mount()

    def server_command(self, devices, read_only=False):
        fuse = ["--fuse", self.fuse_dir] if self.filesystem and self.attach_mode == "fuse" else []
        return [self.binary, "serve", "--socket", self.socket_path] + (["--read-only"] if read_only else []) \
            + fuse + list(devices)

    def engine_status(self, after=None, timeout=5.0):
        """The status the server publishes once a second (WORK/run/pool-*.json), the
        first one stamped at or after `after` (unix time) if given; None if none."""
        deadline = time.time() + timeout
        while True:
            for path in glob.glob(os.path.join(self.run_dir, "pool-*.json")):
                try:
                    with open(path) as f:
                        doc = json.load(f)
                except (OSError, ValueError):
                    continue
                if after is None or doc.get("updated_unix", 0) >= after:
                    return doc["status"]
            if time.time() > deadline:
                return None
            time.sleep(0.2)

    def degrade(self, count):
        """Stop the server, detach `count` member loop devices, and serve the rest
        read-only (the pool opens degraded); re-attach and mount read-only if this
        stack has a filesystem."""
        if count > self.parity:
            raise RuntimeError("%s survives %d missing members, not %d" % (self.name, self.parity, count))
        had_fs = self.mounted
        self.unmount()
        self.detach()
        self.stop_server()
        self.detach_members(count)
        self.start_server(self.devices, read_only=True)
        if had_fs:
            self.attach_and_mount(read_only=True)


class PathRefStack(NbdAttachedStack):
    """The attach path alone: nbdkit's memory plugin (`nbdkit --unix WORK/nbd.sock -f
    memory SIZE`, RAM that costs next to nothing) attached exactly as LograidStack
    attaches its volume (the same NbdAttachedStack code: `lograid attach`, ext4,
    mount; detach and SIGTERM at teardown). It has no member files and so no
    member counters (member_bytes_written() is None: no WA). What it reaches is
    the ceiling the NBD -> nbdfuse -> loop path puts on anything behind it.
    The memory plugin keeps what is written (up to SIZE) in RAM until nbdkit exits."""

    kind = "path-ref"
    server_name = "nbdkit memory"

    ALLOCATORS = ("sparse", "malloc")

    def __init__(self, size, parent="/var/tmp", binary="lograid", volume="vol0", log_dir=None,
                 name="path-ref", allocator="sparse"):
        if allocator not in self.ALLOCATORS:
            raise ValueError("unknown nbdkit memory allocator %r" % allocator)
        super().__init__(0, 0, parent, name, binary, volume, log_dir)
        self.parity = 0
        self.filesystem = True
        self.size = size // (1 << 20) * (1 << 20)
        self.volume_bytes = self.size
        # sparse: nbdkit's default (a two-level page table, pages allocated on first
        # write); malloc: one allocation of SIZE up front, "can be faster because the
        # implementation is simpler and the locking strategy allows more concurrency".
        self.allocator = allocator

    @staticmethod
    def available():
        """(True, "") if nbdkit can be used here, else (False, why)."""
        if not shutil.which("nbdkit"):
            return False, "nbdkit is not installed"
        return True, ""

    def space_needed(self):
        return HOST_MARGIN

    def describe(self):
        return "nbdkit --unix SOCKET -f memory %d allocator=%s (%.1f GiB, RAM); lograid attach + mkfs.ext4 " \
            "as lograid's" % (self.size, self.allocator, self.size / 2**30)

    def server_command(self, devices, read_only=False):
        return ["nbdkit", "--unix", self.socket_path, "-f"] + (["-r"] if read_only else []) \
            + ["memory", str(self.size), "allocator=" + self.allocator]

    def build(self):
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        os.makedirs(self.run_dir, exist_ok=True)
        self.start_server([])
        self.attach_and_mount()

    def member_bytes_written(self):
        return None

    def member_bytes_read(self):
        return None


class ZfsFuseStack(LoopStack):
    """A zfs-fuse pool ("stripe" or "raidz1"/"raidz2") over loop devices, with its own
    zfs-fuse daemon (pid file in the work folder). Refuses to start if a zfs-fuse
    daemon it did not start is running (there can be only one, and it is not ours
    to stop). zfs-fuse has no syncfs and no `zpool sync`: sync() takes and destroys
    a snapshot, which waits for the open transaction group to commit."""

    kind = "zfs"

    def __init__(self, vdev="raidz1", members=3, member_size=4 << 30, parent="/var/tmp"):
        if vdev not in ("stripe", "raidz1", "raidz2"):
            raise ValueError("unknown zfs layout %r" % vdev)
        super().__init__(members, member_size, parent, "zfs-" + vdev)
        self.vdev = vdev
        self.parity = {"stripe": 0, "raidz1": 1, "raidz2": 2}[vdev]
        self.pool = "lgcmp%d%s" % (os.getpid(), vdev)
        self.daemon_pidfile = None
        self.created = False

    @staticmethod
    def available():
        """(True, "") if zfs-fuse can be used here, else (False, why)."""
        for tool in ("zfs-fuse", "zpool", "zfs"):
            if not shutil.which(tool):
                return False, "%s is not installed" % tool
        if subprocess.run(["pgrep", "-x", "zfs-fuse"], stdout=subprocess.DEVNULL).returncode == 0:
            return False, "a zfs-fuse daemon not started by this script is running"
        return True, ""

    def describe(self):
        return "zpool create %s %s (zfs-fuse)" % (self.pool, "" if self.vdev == "stripe" else self.vdev)

    def build(self):
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        self.daemon_pidfile = os.path.join(self.workdir, "zfs-fuse.pid")
        run(["zfs-fuse", "-p", self.daemon_pidfile])
        for _ in range(100):
            if subprocess.run(["zpool", "list"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("zfs-fuse did not come up")
        vtype = [] if self.vdev == "stripe" else [self.vdev]
        run(["zpool", "create", "-f", "-m", self.mountpoint, self.pool] + vtype + self.devices)
        self.created = True
        self.mounted = True

    def sync(self):
        run(["sync"])
        snap = "%s@cmpsync" % self.pool
        run(["zfs", "snapshot", snap])
        run(["zfs", "destroy", snap])

    def trim(self):
        pass

    def unbuild(self):
        if self.created:
            if subprocess.run(["zpool", "destroy", "-f", self.pool], stderr=subprocess.DEVNULL).returncode != 0:
                subprocess.run(["zpool", "export", "-f", self.pool], stderr=subprocess.DEVNULL)
            self.created = False
        self.mounted = False
        if self.daemon_pidfile and os.path.exists(self.daemon_pidfile):
            try:
                with open(self.daemon_pidfile) as f:
                    pid = int(f.read().strip())
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.2)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
            self.daemon_pidfile = None


def _main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="build one stack, print it, tear it down")
    ap.add_argument("action", choices=["up-down"])
    ap.add_argument("--kind", default="btrfs", choices=["btrfs", "bare", "lograid", "pathref", "zfs"])
    ap.add_argument("--profile", default="raid5", choices=sorted(MIN_MEMBERS))
    ap.add_argument("--parity", type=int, default=1, help="lograid parity")
    ap.add_argument("--lograid", default="lograid", help="lograid binary")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--member-size", default="1G")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args(argv)
    size = parse_size(a.member_size)
    if a.kind == "btrfs":
        st = BtrfsStack(a.profile, a.members, size, a.dir)
    elif a.kind == "bare":
        st = Ext4Stack(size, a.dir)
    elif a.kind == "lograid":
        st = LograidStack(a.parity, a.members, size, a.dir, a.lograid)
    elif a.kind == "pathref":
        st = PathRefStack(a.members * size, a.dir, a.lograid)
    else:
        st = ZfsFuseStack("raidz1", a.members, size, a.dir)
    with st:
        st.sync()
        print("stack", st.name, "members", st.member_names, "mount", st.mountpoint)
        if isinstance(st, BtrfsStack):
            print("usage", st.usage())
            print("capacity_bytes", st.capacity_bytes(), "statvfs",
                  os.statvfs(st.mountpoint).f_blocks * os.statvfs(st.mountpoint).f_frsize)
        print("member bytes written", st.member_bytes_written())


if __name__ == "__main__":
    _main(sys.argv[1:])
