"""Peer storage stacks on sparse member files, built and torn down for a benchmark.

This module owns the *lifecycle* of one peer stack (today: btrfs raid0 /
raid5 / raid6) and nothing else:

  * a private work folder (``tempfile.mkdtemp`` under ``--dir``) holding the
    sparse member files and the mount point;
  * the loop devices attached to those files (``losetup --direct-io=on`` where
    the kernel accepts it, plain ``losetup`` otherwise);
  * ``mkfs.btrfs -d PROFILE -m PROFILE`` over the loop devices and the mount;
  * the member write counters: field 7 of ``/sys/block/loopN/stat`` (sectors
    written, always 512-byte units) summed over the members, which is what
    write amplification is measured with;
  * teardown, which always runs (``with`` block / ``try``-``finally``, plus
    SIGINT/SIGTERM handlers that turn the signal into an exception so the
    ``finally`` runs): kill registered child processes, unmount, ``losetup -d``,
    delete the member files and the work folder.

It touches nothing it did not create: the loop devices it detaches are the ones
``losetup --show`` gave it, the files it deletes are the ones it made, and the
kernel's dirty-page limits are left as they are (benchmarks here use O_DIRECT).

Usage::

    with BtrfsStack("raid5", members=3, member_size=4 << 30, parent="/var/tmp") as st:
        st.mountpoint            # where to put files
        st.member_names          # ["loop3", "loop4", "loop5"]
        st.member_bytes_written()

``python3 bench/stacks.py up-down [--profile raid5] [--member-size 1G]`` builds one
stack, prints what it got and tears it down again (a smoke test).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Minimum number of devices per btrfs profile.
MIN_MEMBERS = {"raid0": 2, "raid5": 2, "raid6": 3}

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


def run(cmd, check=True, quiet=False):
    """Run a command (list), return its stdout; raise with its stderr on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    if not quiet and p.returncode != 0:
        log("note: %s -> %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return p.stdout


class Interrupted(Exception):
    """Raised in the main thread by the SIGINT/SIGTERM handler."""


class BtrfsStack:
    """One btrfs filesystem over `members` loop devices on sparse files.

    `profile` is the data profile (raid0, raid5, raid6); `metadata` defaults to
    the same profile (so "raid5" is mkfs.btrfs -d raid5 -m raid5).
    """

    def __init__(self, profile="raid5", members=3, member_size=4 << 30, parent="/var/tmp",
                 metadata=None):
        if profile not in MIN_MEMBERS:
            raise ValueError("unknown profile %r (have %s)" % (profile, ", ".join(MIN_MEMBERS)))
        if members < MIN_MEMBERS[profile]:
            raise ValueError("%s needs at least %d members" % (profile, MIN_MEMBERS[profile]))
        self.profile = profile
        self.metadata = metadata or profile
        self.members = members
        self.member_size = member_size
        self.parent = parent
        self.name = "btrfs-" + profile + ("" if self.metadata == profile else "-m" + self.metadata)
        self.mkfs_args = ["-d", profile, "-m", self.metadata]
        # Everything below is filled in as it is created, and undone in teardown().
        self.workdir = None
        self.files = []
        self.devices = []          # "/dev/loopN", in member order
        self.direct_io = None      # whether losetup --direct-io=on was accepted
        self.mountpoint = None
        self.mounted = False
        self.uuid = None           # filesystem UUID, for /sys/fs/btrfs/UUID/
        self.children = []         # subprocess.Popen objects to kill before unmounting
        self._old_handlers = {}

    # ----- bring-up ---------------------------------------------------------------

    def check_space(self):
        """Refuse to start if the host folder could not hold the member files filled."""
        st = os.statvfs(self.parent)
        free = st.f_bavail * st.f_frsize
        need = self.members * self.member_size + HOST_MARGIN
        if free < need:
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
        run(["mkfs.btrfs", "-q", "-f"] + self.mkfs_args + self.devices)
        self.mountpoint = os.path.join(self.workdir, "mnt")
        os.mkdir(self.mountpoint)
        run(["mount", "-t", "btrfs", self.devices[0], self.mountpoint])
        self.mounted = True
        m = re.search(r"uuid:\s*([0-9a-f-]{36})", run(["btrfs", "filesystem", "show", self.mountpoint]))
        self.uuid = m.group(1) if m else None
        log("up: %s on %s (%s, direct-io=%s) at %s" % (self.name, " ".join(self.member_names),
                                                      " ".join(self.mkfs_args),
                                                      "on" if self.direct_io else "off", self.mountpoint))
        return self

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

    def sync(self):
        """Make everything written to this filesystem durable (syncfs via `sync -f`)."""
        run(["sync", "-f", self.mountpoint])

    # ----- teardown -----------------------------------------------------------------

    def teardown(self):
        """Undo everything up() did, in reverse; never raises, tries every step."""
        # A second Ctrl-C while tearing down must not leave loops behind.
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except ValueError:           # not in the main thread
                pass
        for child in self.children:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        self.children = []
        if self.mounted:
            for attempt in range(10):
                if subprocess.run(["umount", self.mountpoint], stderr=subprocess.DEVNULL).returncode == 0:
                    self.mounted = False
                    break
                time.sleep(1)
            if self.mounted:
                log("warning: %s busy, lazy unmount" % self.mountpoint)
                subprocess.run(["umount", "-l", self.mountpoint])
                self.mounted = False
        for dev in reversed(self.devices):
            if subprocess.run(["losetup", "-d", dev], stderr=subprocess.DEVNULL).returncode != 0:
                log("warning: losetup -d %s failed" % dev)
        self.devices = []
        for path in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.files = []
        if self.workdir:
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


def _main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="build one peer stack, print it, tear it down")
    ap.add_argument("action", choices=["up-down"])
    ap.add_argument("--profile", default="raid5", choices=sorted(MIN_MEMBERS))
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--member-size", default="1G")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args(argv)
    with BtrfsStack(a.profile, a.members, parse_size(a.member_size), a.dir) as st:
        st.sync()
        print("stack", st.name, "members", st.member_names, "mount", st.mountpoint)
        print("usage", st.usage())
        print("capacity_bytes", st.capacity_bytes(), "statvfs",
              os.statvfs(st.mountpoint).f_blocks * os.statvfs(st.mountpoint).f_frsize)
        print("member bytes written", st.member_bytes_written())


if __name__ == "__main__":
    _main(sys.argv[1:])
