#!/usr/bin/env python3
"""lograid beside its peers, in one command: many files, random writes, small files,
bonnie++ and degraded reads, on the same member files, interleaved and repeated.

This script owns the *run* of a comparison: the options, which stacks and
experiments in which order, the kernel settings and memory state around them,
the workloads and their measurements, and the results folder. Building and
tearing down each stack is bench/stacks.py's job; the report (tables, charts,
compare.md, reading a results folder back) is bench/report.py's. The
workloads are those of ../shared/bench (exp_a_manyfiles.sh, exp_b_randwrite.sh,
exp_c_smallfiles.sh, exp_bonnie.sh), re-implemented here so that one process
owns every mount, device and setting.

Stacks (each on --members sparse files of --member-size in a private folder
under --dir, every member a `losetup --direct-io=on` loop device):

  lograid-p1, lograid-p0 (and lograid-p2 with >= 4 members): `lograid create`,
      `lograid serve --socket` in the work folder; for the filesystem
      experiments (many-files, small-files, bonnie) ext4 on the volume attached
      as a loop device (--lograid-attach fuse, the default: the server's own
      FUSE file, `serve --fuse` + `attach --file`; nbdfuse: `attach --socket`,
      nbdfuse over NBD), for the block experiments (random-writes,
      degraded-reads) fio's nbd engine straight to the server;
  btrfs-raid5 (-m raid1), btrfs-raid0 (and btrfs-raid6 -m raid1c3 with >= 4);
  zfs-raidz1, zfs-stripe: zfs-fuse, only where installed (else skipped, noted);
  bare: ext4 on one loop device;
  ram-ext4: ext4 on one loop device over a tmpfs file: ext4 with no disk under
      it (a reference; the loop's copy into tmpfs costs CPU, so not a ceiling);
  path-ref: no members; nbdkit's memory plugin attached exactly as lograid is
      (`lograid attach` + ext4): the ceiling of the attach path itself, for the
      filesystem experiments only (random-writes and degraded-reads use no
      attach path: skipped there).

Experiments (every stack freshly built for each experiment and repetition; the
stacks of one repetition run back to back, in an order rotated per repetition):

  many-files  --many-files-count files of 14 MiB into one directory, then one
     file of the same total, each timed including the final syncfs (total >= 3 x
     vm.dirty_bytes, which is lowered to --dirty-bytes for the whole run and
     restored after); before each phase the caches are dropped and the guest's
     free page reporting is let finish (settle_memory), so no stack starts on
     memory that the one before it happened to leave warm;
     --many-files-memory warm then writes and deletes --many-files-warm-bytes
     in tmpfs, so that every stack's phase starts on recently used memory
     instead (as on a machine with no balloon);
  random-writes  fio random writes, O_DIRECT: 512 B-64 KiB (--bsrange, or
     --bssplit) at QD 1, 10, 100 and 4 KiB at QD 32, --random-writes-seconds
     each, into a --random-writes-size file laid out first (lograid: the first
     --random-writes-size of the volume); write amplification = bytes written
     to the member loop devices during fio and the sync after it / bytes fio
     wrote;
  small-files  --small-files-count files of 4 and 8 KiB created, copied
     (cp -a --reflink=never) and deleted, each phase timed including syncfs;
  bonnie  one bonnie++ run per stack (first repetition only);
  degraded-reads  sequential 1 MiB reads (QD16, O_DIRECT) of
     --degraded-reads-size written just before, healthy, then with P members'
     loop devices detached (btrfs: mount -o degraded,ro; lograid: serve
     --read-only on the remaining members).

Results go to --out: raw/ (one JSON per run), fio/ (fio's final reports),
bonnie/, logs/ (lograid server logs), setup.json (machine, versions, options),
compare.md (absolute figures and ratios, median (min-max) over repetitions) and
one SVG chart per experiment (EXPERIMENT.svg). `--report-only DIR` rebuilds the
report from DIR, also from a folder written when the experiments were letters
(A, B, C, D).

Run as root:   python3 bench/compare.py [--reps 3] [--member-size 4G]
Smoke test:    python3 bench/compare.py --quick --out /tmp/compare-quick
Self-test:     python3 bench/compare.py --self-test     (no root, seconds)
"""

import argparse
import glob
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import (EXPERIMENTS, GiB, MANY_FILES_FILE_BYTES, MiB, RANDOM_WRITE_TESTS,  # noqa: E402
                    STACK_INFO, STACK_ORDER, bonnie_too_fast, fmt_duration, fmt_num, human, label, load_runs,
                    load_setup, parse_bonnie_csv, write_report)
from stacks import (BtrfsStack, Ext4Stack, Interrupted, LograidStack, PathRefStack,  # noqa: E402
                    ZfsFuseStack, HOST_MARGIN, RECOMMENDED_METADATA, log, machine_cpu_seconds, parse_size, run)
from steady import fio_json_objects, loadavg, machine_string  # noqa: E402

# Where ram-ext4 keeps its one member file: tmpfs, so the ext4 under test has no disk
# under it at all (and where --many-files-memory warm touches memory).
RAM_DIR = "/dev/shm"
# Stacks left out unless --stacks names them (ram-ext4 holds up to a member's size of
# RAM while it runs).
OPT_IN_STACKS = ["ram-ext4"]

# The experiments that write to a block device, not to a filesystem: lograid's volume
# through fio's nbd engine, the other stacks through a file in their filesystem.
BLOCK_EXPERIMENTS = ("random-writes", "degraded-reads")

# Experiments a stack does not run, and why (reported beside the skipped stacks).
EXP_SKIPS = {
    "path-ref": {e: "random-writes and degraded-reads do not use the attach path (lograid goes through "
                    "fio's nbd engine there, the others through their filesystem), so its ceiling does not "
                    "apply" for e in BLOCK_EXPERIMENTS},
}


def exp_skip(key, exp):
    """Why `key` does not run experiment `exp`, or None if it does."""
    return EXP_SKIPS.get(key, {}).get(exp)


class Eta:
    """Remaining time from the durations seen so far: per (experiment, stack) if
    measured, else the experiment's mean over stacks, else the prior guess."""

    def __init__(self, priors):
        self.priors = priors       # {exp: seconds}
        self.seen = {}             # (exp, stack) -> [seconds]

    def add(self, exp, stack, seconds):
        self.seen.setdefault((exp, stack), []).append(seconds)

    def estimate(self, exp, stack):
        if (exp, stack) in self.seen:
            return statistics.mean(self.seen[(exp, stack)])
        same = [statistics.mean(v) for (e, _), v in self.seen.items() if e == exp]
        return statistics.mean(same) if same else self.priors.get(exp, 60)

    def remaining(self, steps):
        return sum(self.estimate(e, s) for _, e, s in steps)


def plan(reps, exps, stacks, skip=None):
    """The steps (rep, exp, stack): repetitions outermost, then experiments, then the
    stacks, whose order rotates by one each repetition; bonnie++ in repetition 1 only;
    (stack, exp) pairs for which skip(stack, exp) is true are left out."""
    steps = []
    for rep in range(1, reps + 1):
        k = (rep - 1) % len(stacks) if stacks else 0
        order = stacks[k:] + stacks[:k]
        for e in exps:
            if e == "bonnie" and rep != 1:
                continue
            steps += [(rep, e, s) for s in order if not (skip and skip(s, e))]
    return steps


def exp_skips(keys, exps):
    """{stack: {exp: reason}} of the planned stacks and experiments not run together."""
    out = {}
    for k in keys:
        for e in exps:
            why = exp_skip(k, e)
            if why:
                out.setdefault(k, {})[e] = why
    return out


# ----- kernel settings -------------------------------------------------------------------

class Sysctls:
    """Sets vm.dirty_* and puts every one back. The kernel couples each *_bytes with
    its *_ratio (writing one zeroes the other), so all four are saved and restored
    as the pair that was in use."""

    KEYS = ["vm/dirty_bytes", "vm/dirty_background_bytes", "vm/dirty_ratio", "vm/dirty_background_ratio"]
    PAIRS = [("vm/dirty_bytes", "vm/dirty_ratio"), ("vm/dirty_background_bytes", "vm/dirty_background_ratio")]

    def __init__(self, root="/proc/sys"):
        self.root = root
        self.saved = None

    def read(self, key):
        with open(os.path.join(self.root, key)) as f:
            return f.read().strip()

    def write(self, key, value):
        with open(os.path.join(self.root, key), "w") as f:
            f.write(str(value))

    def set_dirty(self, dirty_bytes, background_bytes):
        if self.saved is None:
            self.saved = {k: self.read(k) for k in self.KEYS}
        # Background first: the kernel refuses nothing here, but keep bg < limit throughout.
        self.write("vm/dirty_background_bytes", background_bytes)
        self.write("vm/dirty_bytes", dirty_bytes)
        log("sysctl: vm.dirty_bytes=%s vm.dirty_background_bytes=%s (saved: %s)" % (
            self.read("vm/dirty_bytes"), self.read("vm/dirty_background_bytes"),
            ", ".join("%s=%s" % (k[3:], v) for k, v in self.saved.items())))

    def restore(self):
        """Put the saved values back; returns the keys that still differ (empty: all restored)."""
        if self.saved is None:
            return []
        for b, r in self.PAIRS:
            try:
                if self.saved[b] not in ("0", ""):
                    self.write(b, self.saved[b])
                else:
                    self.write(r, self.saved[r])
            except OSError as e:
                log("warning: restoring %s/%s: %s" % (b, r, e))
        bad = [k for k in self.KEYS if self.read(k) != self.saved[k]]
        if bad:
            log("warning: not restored: %s" % ", ".join("%s=%s (was %s)" % (k, self.read(k), self.saved[k])
                                                         for k in bad))
        else:
            log("sysctl: restored %s" % ", ".join("%s=%s" % (k[3:], v) for k, v in self.saved.items()))
            self.saved = None
        return bad


def drop_caches():
    run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


# A guest with free page reporting (virtio-balloon) hands freed memory back to the
# host, and the first touch of such a page afterwards is slow. A page-cache-bound phase
# that starts right after a teardown freed gigabytes therefore runs on warm memory, and
# one that starts later on cold memory: measured here, the same stack wrote many files
# at 426 and at 1,937 MB/s depending on what ran before it. settle_memory() puts every
# stack in the same state before such a phase: caches dropped, and reporting finished.
PAGE_REPORTING_KIB = "/sys/module/page_reporting/parameters/reported_kib"


def settle_memory(quiet_s=2.0, limit_s=30.0, path=PAGE_REPORTING_KIB, drop=drop_caches):
    """Drop the caches, then wait until the guest has stopped reporting free pages to
    the host (the counter at `path` unchanged for quiet_s; at most limit_s). Without
    page reporting, just drop the caches. Returns the seconds waited."""
    drop()
    t0 = time.time()

    def counter():
        with open(path) as f:
            return f.read().strip()
    try:
        last = counter()
    except OSError:
        return 0.0
    still = time.time()
    while True:
        if time.time() - t0 >= limit_s:
            log("note: free page reporting still moving after %.0f s; going on" % limit_s)
            break
        time.sleep(0.25)
        try:
            now = counter()
        except OSError:
            break
        if now != last:
            last, still = now, time.time()
        elif time.time() - still >= quiet_s:
            break
    return time.time() - t0


def warm_memory(nbytes, where=RAM_DIR):
    """Write nbytes of zeroes to a file in tmpfs and delete it: the pages just freed are
    resident, and the page cache of the phase that follows gets them (a machine without
    a memory balloon is always in this state). Returns the seconds it took."""
    t0 = time.time()
    chunk = b"\0" * (64 << 20)
    fd, path = tempfile.mkstemp(prefix="lograid-warm-", dir=where)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            left = nbytes
            while left > 0:
                left -= f.write(chunk[:min(left, len(chunk))])
    finally:
        os.unlink(path)
    return time.time() - t0


# ----- fio -------------------------------------------------------------------------------

def run_fio(ctx, stack, args, tag, timeout):
    """fio with JSON output, as a child of the stack (killed at teardown); its final
    report goes to OUT/fio/TAG.json (compact). Returns the job's dict."""
    cmd = ["fio", "--output-format=json"] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stack.children.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate()
        err = (err or "") + "\n(fio killed after %d s)" % timeout
    finally:
        if proc in stack.children:
            stack.children.remove(proc)
    objs = fio_json_objects(out or "")
    if not objs:
        raise RuntimeError("fio %s printed no JSON (rc %s): %s %s" % (tag, proc.returncode, (err or "").strip(),
                                                                       (out or "")[-300:]))
    with open(os.path.join(ctx.out, "fio", tag + ".json"), "w") as f:
        json.dump(objs[-1], f, separators=(",", ":"))
    job = objs[-1]["jobs"][0]
    if job.get("error"):
        raise RuntimeError("fio %s: error %d (%s) %s" % (tag, job["error"], os.strerror(job["error"]),
                                                        (err or "").strip()[-300:]))
    return job


def fio_target(stack, name):
    """fio arguments that point at the stack: lograid without a filesystem through
    fio's nbd engine, everything else a file (O_DIRECT, libaio) in its filesystem."""
    if isinstance(stack, LograidStack) and not stack.filesystem:
        return ["--ioengine=nbd", "--uri=" + stack.nbd_uri]
    return ["--filename=" + os.path.join(stack.mountpoint, name), "--ioengine=libaio", "--direct=1"]


def clat_us(rw, pct):
    p = rw.get("clat_ns", {}).get("percentile", {})
    v = p.get("%.6f" % pct)
    return round(v / 1000.0, 1) if v is not None else None


# ----- experiments ------------------------------------------------------------------------

def timed_phase(stack, fn):
    """Run fn(), then sync the stack; returns (seconds incl. sync, seconds of fn alone,
    member bytes written in all, None for a stack without members)."""
    b0, t0 = stack.member_bytes_written(), time.time()
    fn()
    t1 = time.time()
    stack.sync()
    t2 = time.time()
    b1 = stack.member_bytes_written()
    return t2 - t0, t1 - t0, (b1 - b0 if b0 is not None and b1 is not None else None)


def cpu_snapshot(stack):
    """CPU seconds so far: the whole machine, and the NBD server and nbdfuse of an
    attached stack."""
    snap = {"machine": machine_cpu_seconds()}
    if hasattr(stack, "cpu_seconds"):
        snap.update(stack.cpu_seconds())
    return snap


def cpu_delta(before, after):
    """{what: CPU seconds between two snapshots} (None where either is missing)."""
    return {k: (round(after[k] - before[k], 2) if before.get(k) is not None and after.get(k) is not None else None)
            for k in before}


def exp_many_files(ctx, stack, tag):
    n, buf = ctx.a.many_files_count, ctx.src14
    total = n * len(buf)
    d = os.path.join(stack.mountpoint, "many-files")
    os.mkdir(d)
    stack.sync()
    m, det = {}, {"files": n, "file_bytes": len(buf), "total_bytes": total}

    def many():
        for i in range(n):
            with open(os.path.join(d, "f%d" % i), "wb", buffering=0) as f:
                f.write(buf)
    det["memory"] = ctx.a.many_files_memory
    det["settle_seconds"] = [round(settle_memory(), 1)]
    if ctx.a.many_files_memory == "warm":
        det["warm_seconds"] = [round(warm_memory(ctx.a.many_files_warm_bytes), 1)]
    c0 = cpu_snapshot(stack)
    secs, write_part, dev = timed_phase(stack, many)
    det["manyfiles_cpu_s"] = cpu_delta(c0, cpu_snapshot(stack))
    m["manyfiles_MBps"] = round(total / secs / 1e6, 1)
    m["manyfiles_wa"] = round(dev / total, 4) if dev is not None else None
    det.update(manyfiles_seconds=round(secs, 3), manyfiles_write_part_seconds=round(write_part, 3),
               manyfiles_member_bytes=dev)
    log("  many-files %s: %d x 14 MiB in %.1f s = %.0f MB/s, WA %s" % (
        stack.name, n, secs, m["manyfiles_MBps"], fmt_num(m["manyfiles_wa"], 2)))
    t0 = time.time()
    shutil.rmtree(d)
    stack.sync()
    det["delete_seconds"] = round(time.time() - t0, 3)
    os.mkdir(d)
    stack.sync()

    def big():
        with open(os.path.join(d, "big"), "wb", buffering=0) as f:
            for _ in range(n):
                f.write(buf)
    det["settle_seconds"].append(round(settle_memory(), 1))
    if ctx.a.many_files_memory == "warm":
        det["warm_seconds"].append(round(warm_memory(ctx.a.many_files_warm_bytes), 1))
    c0 = cpu_snapshot(stack)
    secs, write_part, dev = timed_phase(stack, big)
    det["bigfile_cpu_s"] = cpu_delta(c0, cpu_snapshot(stack))
    m["bigfile_MBps"] = round(total / secs / 1e6, 1)
    m["bigfile_wa"] = round(dev / total, 4) if dev is not None else None
    det.update(bigfile_seconds=round(secs, 3), bigfile_write_part_seconds=round(write_part, 3),
               bigfile_member_bytes=dev)
    log("  many-files %s: one file of %.2f GB in %.1f s = %.0f MB/s, WA %s" % (
        stack.name, total / 1e9, secs, m["bigfile_MBps"], fmt_num(m["bigfile_wa"], 2)))
    shutil.rmtree(d)
    stack.sync()
    return m, det


def engine_counters(stack, after):
    """(member bytes written, user bytes written) from lograid's published status."""
    st = stack.engine_status(after=after)
    if not st:
        return None
    return st["member_bytes_written"], st["counters"]["user_bytes_written"]


def exp_random_writes(ctx, stack, tag):
    a = ctx.a
    size = a.random_writes_size
    target = fio_target(stack, "random-writes.dat")
    common = ["--size=%d" % size, "--randrepeat=0", "--group_reporting"]
    run_fio(ctx, stack, ["--name=layout", "--rw=write", "--bs=1M", "--iodepth=8", "--end_fsync=1"]
            + target + common, tag + "-layout", timeout=1800)
    stack.sync()
    m, det = {}, {"size_bytes": size, "seconds_per_test": a.random_writes_seconds,
                  "sizes": ("bssplit=" + a.bssplit) if a.bssplit else ("bsrange=" + a.bsrange)}
    is_lograid = isinstance(stack, LograidStack)
    for name, lab, bs, qd in RANDOM_WRITE_TESTS:
        if bs:
            sizes = ["--bs=" + bs]
        elif a.bssplit:
            sizes = ["--bssplit=" + a.bssplit]
        else:
            sizes = ["--bsrange=" + a.bsrange]
        eng0 = engine_counters(stack, time.time()) if is_lograid else None
        b0 = stack.member_bytes_written()
        job = run_fio(ctx, stack, ["--name=" + name, "--rw=randwrite", "--iodepth=%d" % qd, "--time_based",
                                   "--runtime=%d" % a.random_writes_seconds, "--end_fsync=1",
                                   "--percentile_list=50:99:99.9"] + sizes + target + common,
                      tag + "-" + name, timeout=a.random_writes_seconds + 900)
        stack.sync()
        dev = stack.member_bytes_written() - b0
        w = job["write"]
        user = w["io_bytes"]
        m[name + "_iops"] = round(w["iops"], 1)
        m[name + "_MBps"] = round(w["bw_bytes"] / 1e6, 2)
        m[name + "_wa"] = round(dev / user, 4) if user else None
        d = {"fio_bytes": user, "member_bytes": dev, "runtime_s": w["runtime"] / 1000.0,
             "p50_us": clat_us(w, 50), "p99_us": clat_us(w, 99), "p999_us": clat_us(w, 99.9)}
        if eng0:
            eng1 = engine_counters(stack, time.time())
            if eng1:
                d["engine_member_bytes"] = eng1[0] - eng0[0]
                d["engine_user_bytes"] = eng1[1] - eng0[1]
                if d["engine_user_bytes"]:
                    d["engine_wa"] = round(d["engine_member_bytes"] / d["engine_user_bytes"], 4)
        det[name] = d
        log("  random-writes %s %s: %.0f IOPS, %.1f MB/s, WA %.2f" % (
            stack.name, name, w["iops"], w["bw_bytes"] / 1e6, m[name + "_wa"] or 0))
    return m, det


def make_small_files(d, count):
    """COUNT files under d, alternating 4 and 8 KiB, in 100 subdirectories
    (../shared/bench/mkfiles.py)."""
    buf = os.urandom(8192)
    for k in range(100):
        os.makedirs(os.path.join(d, "d%03d" % k), exist_ok=True)
    for i in range(count):
        fd = os.open(os.path.join(d, "d%03d" % (i % 100), "f%06d" % i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o644)
        os.write(fd, buf[: 4096 if i % 2 == 0 else 8192])
        os.close(fd)


def exp_small_files(ctx, stack, tag):
    count = ctx.a.small_files_count
    d = os.path.join(stack.mountpoint, "small-files")
    os.mkdir(d)
    stack.sync()
    app = count // 2 * 4096 + (count - count // 2) * 8192
    src, dst = os.path.join(d, "src"), os.path.join(d, "copy")
    m, det = {}, {"files": count, "bytes": app}
    phases = [("create", lambda: make_small_files(src, count)),
              ("copy", lambda: run(["cp", "-a", "--reflink=never", src, dst])),
              ("delete", lambda: run(["rm", "-rf", src]))]
    for name, fn in phases:
        secs, _, dev = timed_phase(stack, fn)
        m[name + "_fps"] = round(count / secs, 1)
        if name != "delete":
            m[name + "_wa"] = round(dev / app, 4) if dev is not None else None
        det[name] = {"seconds": round(secs, 3), "member_bytes": dev}
        log("  small-files %s %s: %d files in %.1f s = %.0f files/s, %s MiB to members" % (
            stack.name, name, count, secs, count / secs, "-" if dev is None else "%.0f" % (dev / MiB)))
    run(["rm", "-rf", d])
    stack.sync()
    return m, det


def exp_bonnie(ctx, stack, tag):
    a = ctx.a
    d = os.path.join(stack.mountpoint, "bonnie")
    os.mkdir(d)
    cmd = ["bonnie++", "-q", "-d", d, "-s", str(a.bonnie_mb), "-r", str(a.bonnie_mb // 2),
           "-n", a.bonnie_files, "-f", "-u", "root", "-m", stack.name]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stack.children.append(proc)
    try:
        out, err = proc.communicate(timeout=a.bonnie_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError("bonnie++ timed out after %d s" % a.bonnie_timeout)
    finally:
        if proc in stack.children:
            stack.children.remove(proc)
    with open(os.path.join(ctx.out, "bonnie", stack.name + ".csv"), "w") as f:
        f.write(out)
    if proc.returncode != 0:
        raise RuntimeError("bonnie++ exited %d: %s" % (proc.returncode, err.strip()[-300:]))
    m = parse_bonnie_csv(out)
    log("  bonnie %s: block write %s KB/s, seq create %s/s (%.0f s)" % (
        stack.name, m.get("block_write_KBps"), m.get("seq_create_per_s"), time.time() - t0))
    run(["rm", "-rf", d])
    return m, {"command": " ".join(cmd[:2] + ["-d", "DIR"] + cmd[4:]), "seconds": round(time.time() - t0, 1),
               "csv": "bonnie/%s.csv" % stack.name, "too_fast": bonnie_too_fast(out)}


def exp_degraded_reads(ctx, stack, tag):
    a = ctx.a
    size = a.degraded_reads_size
    target = fio_target(stack, "degraded-reads.dat")
    common = ["--size=%d" % size, "--bs=1M", "--iodepth=16"]
    run_fio(ctx, stack, ["--name=write", "--rw=write", "--end_fsync=1"] + target + common, tag + "-write",
            timeout=1800)
    stack.sync()
    m, det = {}, {"size_bytes": size}

    def read(label_):
        drop_caches()
        r0 = stack.member_bytes_read()
        job = run_fio(ctx, stack, ["--name=" + label_, "--rw=read"] + target + common, tag + "-" + label_,
                      timeout=1800)
        r = job["read"]
        det[label_] = {"bytes": r["io_bytes"], "member_bytes_read": stack.member_bytes_read() - r0,
                       "runtime_s": r["runtime"] / 1000.0}
        return round(r["bw_bytes"] / 1e6, 1)
    m["healthy_MBps"] = read("healthy")
    log("  degraded-reads %s healthy: %.0f MB/s" % (stack.name, m["healthy_MBps"]))
    p = stack.parity
    if p == 0:
        det["degraded"] = "no parity: a failed member loses data"
    elif not isinstance(stack, (BtrfsStack, LograidStack)):
        det["degraded"] = "not measured for this stack"
    else:
        stack.degrade(p)
        det["failed_members"] = p
        m["degraded_MBps"] = read("degraded")
        m["degraded_ratio"] = round(m["degraded_MBps"] / m["healthy_MBps"], 3) if m["healthy_MBps"] else None
        log("  degraded-reads %s with %d member(s) missing: %.0f MB/s (%.2f x healthy)" % (
            stack.name, p, m["degraded_MBps"], m["degraded_ratio"] or 0))
    return m, det


EXP_FUNCS = {"many-files": exp_many_files, "random-writes": exp_random_writes, "small-files": exp_small_files,
             "bonnie": exp_bonnie, "degraded-reads": exp_degraded_reads}


# ----- stacks ----------------------------------------------------------------------------

def available_stacks(members, zfs_check=None, nbdkit_check=None):
    """([stack keys], {skipped key: reason}) for this many members on this host."""
    keys, skipped = [], {}
    for key in STACK_ORDER:
        _, family, parity = STACK_INFO[key]
        if family == "bare":
            if key == "ram-ext4" and not os.path.isdir(RAM_DIR):
                skipped[key] = "%s does not exist" % RAM_DIR
                continue
            keys.append(key)
            continue
        if family == "ref":
            ok, why = (nbdkit_check or PathRefStack.available)()
            if ok:
                keys.append(key)
            else:
                skipped[key] = why
            continue
        need = 4 if parity == 2 else 2
        if members < need:
            skipped[key] = "needs at least %d members (--members %d)" % (need, members)
            continue
        if family == "zfs":
            ok, why = (zfs_check or ZfsFuseStack.available)()
            if not ok:
                skipped[key] = why
                continue
        keys.append(key)
    return keys, skipped


def leave_out_opt_in(keys, skipped):
    """The default stacks: `keys` without OPT_IN_STACKS (noted in `skipped`)."""
    for k in OPT_IN_STACKS:
        if k in keys:
            skipped[k] = "a reference run only when named in --stacks"
    return [k for k in keys if k not in OPT_IN_STACKS]


def make_stack(ctx, key, exp, tag):
    """A fresh stack object for one experiment (not yet up)."""
    a = ctx.a
    _, family, parity = STACK_INFO[key]
    if family == "lograid":
        return LograidStack(parity, a.members, a.member_size, a.dir, a.lograid, chunk=a.lograid_chunk,
                            attach=a.lograid_attach,
                            filesystem=exp not in BLOCK_EXPERIMENTS,
                            log_dir=os.path.join(ctx.out, "logs", tag))
    if family == "btrfs":
        profile = {0: "raid0", 1: "raid5", 2: "raid6"}[parity]
        meta = RECOMMENDED_METADATA[profile] if a.btrfs_metadata == "recommended" else profile
        return BtrfsStack(profile, a.members, a.member_size, a.dir, meta)
    if family == "zfs":
        return ZfsFuseStack("stripe" if parity == 0 else "raidz1", a.members, a.member_size, a.dir)
    if family == "ref":
        return PathRefStack(path_ref_size(a.members, a.member_size), a.dir, a.lograid,
                            log_dir=os.path.join(ctx.out, "logs", tag), allocator=a.path_ref_allocator)
    if key == "ram-ext4":
        return Ext4Stack(a.member_size, RAM_DIR, name="ram-ext4")
    return Ext4Stack(a.member_size, a.dir)


def path_ref_size(members, member_size):
    """The size of the path-ref export: the raw size of the members (what a lograid
    P=0 pool of them holds, at most; 12 GiB for 3 x 4 GiB), in whole MiB."""
    return members * member_size // MiB * MiB


# ----- machine ---------------------------------------------------------------------------

def first_line(cmd):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
        if p.returncode != 0:
            return None
        return (p.stdout.strip().splitlines() or [""])[0]
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_details(a):
    """CPU, memory, kernel, the disk under --dir, tool versions."""
    d = {"summary": machine_string(), "kernel": platform.release(), "hostname": platform.node(),
         "cpus": os.cpu_count(),
         "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
        d["cpu_flags"] = [x for x in ("avx2", "avx512f", "avx512bw", "gfni", "vaes") if x in flags]
    except OSError:
        pass
    src = first_line(["findmnt", "-no", "SOURCE,FSTYPE", "-T", a.dir])
    d["dir"] = {"path": a.dir, "mount": src}
    if src:
        dev = src.split()[0]
        base = os.path.basename(dev)
        d["disk"] = first_line(["lsblk", "-dno", "NAME,SIZE,ROTA,TYPE,MODEL", dev])
        for key, path in (("rotational", "/sys/block/%s/queue/rotational" % base),
                          ("scheduler", "/sys/block/%s/queue/scheduler" % base)):
            try:
                with open(path) as f:
                    d[key] = f.read().strip()
            except OSError:
                pass
    st = os.statvfs(a.dir)
    d["dir"]["free_bytes"] = st.f_bavail * st.f_frsize
    d["versions"] = {
        "fio": first_line(["fio", "--version"]),
        "btrfs-progs": first_line(["btrfs", "--version"]),
        "e2fsprogs": first_line(["mkfs.ext4", "-V"]),
        "lograid": ("%s (%s, built %s)" % (first_line([a.lograid, "--version"]), a.lograid,
                                           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(a.lograid))))
                    if a.lograid and os.path.exists(a.lograid) else None),
        "bonnie++": first_line(["dpkg-query", "-W", "-f", "${Version}", "bonnie++"]),
        "zfs-fuse": first_line(["dpkg-query", "-W", "-f", "${Version}", "zfs-fuse"]),
        "nbdfuse": first_line(["nbdfuse", "--version"]),
        "nbdkit": first_line(["nbdkit", "--version"]),
        "python": platform.python_version(),
    }
    return d


# ----- arguments ---------------------------------------------------------------------------

def default_lograid():
    for p in (os.path.join(HERE, "..", "target", "release", "lograid"), "/work/target-bench/release/lograid"):
        if os.access(p, os.X_OK):
            return os.path.normpath(p)
    return shutil.which("lograid")


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--members", type=int, default=3, help="member files per stack (default 3)")
    ap.add_argument("--member-size", default=None, help="size of each member file (default 4G; --quick 1G)")
    ap.add_argument("--dir", default="/var/tmp", help="where the private folder of member files goes")
    ap.add_argument("--out", default=None, help="results folder (default bench/results/compare-DATE)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 repetition, 1G members and small workloads (a few minutes)")
    ap.add_argument("--stacks", default=None, help="comma-separated subset of: " + ",".join(STACK_ORDER))
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS),
                    help="comma-separated subset of %s (default all)" % ",".join(EXPERIMENTS))
    ap.add_argument("--lograid", default=None, help="lograid binary (default target/release/lograid, "
                                                    "/work/target-bench/release/lograid, or PATH)")
    ap.add_argument("--lograid-chunk", default=None, help="lograid create --chunk (default: lograid's)")
    ap.add_argument("--lograid-attach", default="fuse", choices=list(LograidStack.ATTACH),
                    help="how lograid's volume becomes a loop device for many-files, small-files and bonnie: "
                         "fuse (default; "
                         "`serve --fuse` + `attach --file`) or nbdfuse (`attach --socket`)")
    ap.add_argument("--path-ref-allocator", default="sparse", choices=list(PathRefStack.ALLOCATORS),
                    help="path-ref: nbdkit memory plugin allocator (default sparse, nbdkit's own default; "
                         "malloc takes the whole size up front and locks less)")
    ap.add_argument("--path-ref-warmup", type=int, default=0,
                    help="path-ref: untimed runs of the experiment's workload on the stack before the timed "
                         "one (default 0: nbdkit's memory cold), meant to let nbdkit allocate its memory "
                         "first (fresh memory costs it about 1 CPU s/GB more); one run did not do that "
                         "reliably (results/compare-2026-11-22j)")
    ap.add_argument("--btrfs-metadata", default="recommended", choices=["recommended", "same"],
                    help="recommended: raid0 / raid1 / raid1c3 beside raid0 / raid5 / raid6 (default); "
                         "same: the data profile")
    ap.add_argument("--dirty-bytes", default=None, help="vm.dirty_bytes during the run (default 512M; --quick 64M)")
    ap.add_argument("--dirty-background-bytes", default=None,
                    help="vm.dirty_background_bytes (default a quarter of --dirty-bytes)")
    ap.add_argument("--many-files-count", type=int, default=None,
                    help="many-files: number of 14 MiB files (default: 4 x dirty bytes worth; at least 3 x)")
    ap.add_argument("--many-files-memory", default="cold", choices=["cold", "warm"],
                    help="many-files: the memory each timed phase starts on (default cold: caches dropped "
                         "and the guest's free page reporting settled; warm: then --many-files-warm-bytes "
                         "written to and "
                         "deleted from tmpfs, so the page cache gets recently used memory, as on a machine "
                         "without a memory balloon)")
    ap.add_argument("--many-files-warm-bytes", default="6G",
                    help="many-files, --many-files-memory warm: how much memory to touch (default 6G)")
    ap.add_argument("--random-writes-size", default=None,
                    help="random-writes: file (or volume range) size (default 2G; --quick 256M)")
    ap.add_argument("--random-writes-seconds", type=int, default=None,
                    help="random-writes: seconds per test (default 10; --quick 3)")
    ap.add_argument("--bsrange", default="512-64k", help="random-writes: mixed sizes, fio bsrange (default 512-64k, "
                                                         "as ../shared/bench/exp_b_randwrite.sh)")
    ap.add_argument("--bssplit", default=None, help="random-writes: mixed sizes as fio bssplit instead (e.g. "
                                                    "512/10:4k/40:16k/30:64k/20)")
    ap.add_argument("--small-files-count", type=int, default=None,
                    help="small-files: number of files (default 102400; --quick 10240)")
    ap.add_argument("--bonnie-mb", type=int, default=None, help="bonnie++ -s in MiB (default 2048; --quick 256)")
    ap.add_argument("--bonnie-files", default=None, help="bonnie++ -n (default 16:8192:4096:16; --quick 2:8192:4096:16)")
    ap.add_argument("--bonnie-timeout", type=int, default=900, help="seconds (default 900)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install bonnie++ if missing")
    ap.add_argument("--degraded-reads-size", default=None,
                    help="degraded-reads: bytes written then read (default 2G; --quick 256M)")
    ap.add_argument("--device", action="append", default=[], help="(not implemented) use real block devices")
    ap.add_argument("--report-only", metavar="DIR", default=None, help="rebuild the report of DIR and exit")
    ap.add_argument("--self-test", action="store_true", help="run bench/test_*.py (no root) and exit")
    return ap


def parse_args(argv, stat_free=None):
    """Parse and check the options; fills in the defaults (which depend on --quick).
    Errors exit through argparse (status 2) with a message."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.self_test or a.report_only:
        return a
    if a.device:
        ap.error("--device is not implemented: compare.py only uses member files it creates itself in a "
                 "private folder under --dir (give --dir to choose the disk)")
    fill_defaults(ap, a)
    check_limits(ap, a)
    check_workloads_fit(ap, a)
    a.exps = chosen_experiments(ap, a.experiments)
    a.want_stacks = chosen_stacks(ap, a.stacks)
    if a.bssplit and a.bsrange != "512-64k":
        ap.error("give --bsrange or --bssplit, not both")
    a.lograid = a.lograid or default_lograid()
    if a.out is None:
        a.out = os.path.join(HERE, "results", "compare-" + time.strftime("%Y-%m-%d"))
    check_space(ap, a, stat_free(a.dir) if stat_free else None)
    return a


def fill_defaults(ap, a):
    """Sizes parsed to bytes, and the defaults of what was not given (smaller with --quick)."""
    q = a.quick
    try:
        a.member_size = parse_size(a.member_size or ("1G" if q else "4G"))
        a.dirty_bytes = parse_size(a.dirty_bytes or ("64M" if q else "512M"))
        a.dirty_background_bytes = parse_size(a.dirty_background_bytes) if a.dirty_background_bytes \
            else a.dirty_bytes // 4
        a.many_files_warm_bytes = parse_size(a.many_files_warm_bytes)
        a.random_writes_size = parse_size(a.random_writes_size or ("256M" if q else "2G"))
        a.degraded_reads_size = parse_size(a.degraded_reads_size or ("256M" if q else "2G"))
        a.lograid_chunk = a.lograid_chunk and str(parse_size(a.lograid_chunk))
    except ValueError as e:
        ap.error(str(e))
    a.reps = a.reps if a.reps is not None else (1 if q else 3)
    a.random_writes_seconds = a.random_writes_seconds or (3 if q else 10)
    a.small_files_count = a.small_files_count or (10240 if q else 102400)
    a.bonnie_mb = a.bonnie_mb or (256 if q else 2048)
    a.bonnie_files = a.bonnie_files or ("2:8192:4096:16" if q else "16:8192:4096:16")


def check_limits(ap, a):
    """The bounds of the counts and sizes that stand alone."""
    if a.members < 2:
        ap.error("--members must be at least 2 (got %d)" % a.members)
    if a.members > 16:
        ap.error("--members at most 16 (got %d)" % a.members)
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    if a.path_ref_warmup < 0:
        ap.error("--path-ref-warmup must be at least 0")
    if a.random_writes_seconds < 1:
        ap.error("--random-writes-seconds must be at least 1")
    if a.member_size < 256 * MiB:
        ap.error("--member-size must be at least 256M")
    if a.dirty_background_bytes >= a.dirty_bytes:
        ap.error("--dirty-background-bytes must be below --dirty-bytes")


def check_workloads_fit(ap, a):
    """many-files' file count (default: 4 x dirty bytes worth; at least 3 x, or the page
    cache would hide the stack), and every workload on the smallest stack: the bare
    drive, one member."""
    if a.many_files_count is None:
        a.many_files_count = max(1, math.ceil(4 * a.dirty_bytes / MANY_FILES_FILE_BYTES))
    many_files_bytes = a.many_files_count * MANY_FILES_FILE_BYTES
    if many_files_bytes < 3 * a.dirty_bytes:
        ap.error("--many-files-count %d x 14 MiB = %s is less than 3 x --dirty-bytes (%s): the page cache "
                 "would hide the stack" % (a.many_files_count, human(many_files_bytes), human(3 * a.dirty_bytes)))
    room = a.member_size * 0.8
    for what, size in (("many-files (--many-files-count x 14 MiB)", many_files_bytes),
                       ("--random-writes-size", a.random_writes_size), ("--degraded-reads-size", a.degraded_reads_size),
                       ("bonnie++ -s", a.bonnie_mb * MiB)):
        if size > room:
            ap.error("%s = %s does not fit on one %s member (the bare drive) with room to spare; "
                     "raise --member-size or lower it" % (what, human(size), human(a.member_size)))


def chosen_experiments(ap, text):
    """--experiments as a list in run order; exits on an unknown name or none."""
    exps = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in exps if e not in EXPERIMENTS]
    if bad or not exps:
        ap.error("unknown experiment(s) %s (have %s)" % (",".join(bad) or "(none)", ",".join(EXPERIMENTS)))
    return [e for e in EXPERIMENTS if e in exps]


def chosen_stacks(ap, text):
    """--stacks as a list, or None for the default; exits on an unknown key or none."""
    if not text:
        return None
    want = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in want if s not in STACK_INFO]
    if bad or not want:
        ap.error("unknown stack(s) %s (have %s)" % (",".join(bad) or "(none)", ",".join(STACK_ORDER)))
    return want


def check_space(ap, a, free):
    """Exit if `free` bytes under --dir (None: not checked) cannot hold one stack's
    member files filled, plus a margin."""
    if free is None:
        return
    need = a.members * a.member_size + HOST_MARGIN
    if free < need:
        ap.error("not enough space in %s: %.1f GiB free, the member files filled need %.1f GiB "
                 "(%d x %s + %s margin)" % (a.dir, free / GiB, need / GiB, a.members, human(a.member_size),
                                            human(HOST_MARGIN)))


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ----- main --------------------------------------------------------------------------------

class Context:
    """What every experiment gets: the options, the results folder and the 14 MiB of
    random bytes that many-files writes."""

    def __init__(self, a, out):
        self.a, self.out = a, out
        self.src14 = os.urandom(MANY_FILES_FILE_BYTES)


def ensure_bonnie(a, notes):
    if shutil.which("bonnie++"):
        return True
    if a.no_install:
        notes.append("bonnie++ is not installed (--no-install): skipped")
        return False
    log("bonnie++ is missing: apt-get update && apt-get install -y bonnie++")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "bonnie++"]):
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if p.returncode != 0:
            notes.append("bonnie++ could not be installed (%s: %s): skipped" % (" ".join(cmd), p.stdout[-200:]))
            return False
    return bool(shutil.which("bonnie++"))


def self_test():
    """Run the benchmark scripts' tests (bench/test_*.py); the exit status."""
    import unittest
    suite = unittest.defaultTestLoader.discover(HERE, pattern="test_*.py")
    ok = unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful()
    return 0 if ok else 1


def report_only(folder):
    """Rebuild the report of a results folder (old ones with the experiments as
    letters too) and print it; the exit status."""
    sys.stdout.write(write_report(folder, load_setup(folder), load_runs(folder)))
    return 0


def check_host():
    """Exit (through argparse) unless run as root with the tools every run needs."""
    if os.geteuid() != 0:
        build_parser().error("run as root (losetup, mkfs, mount, sysctl)")
    for tool in ("fio", "losetup", "mkfs.ext4", "mkfs.btrfs", "btrfs", "fstrim"):
        if not shutil.which(tool):
            build_parser().error("%s is not installed" % tool)


def choose_stacks(a):
    """([stack keys to run], {skipped key: reason}): what this host has, narrowed to
    --stacks (or without the opt-in stacks); exits if nothing is left to run."""
    keys, skipped = available_stacks(a.members)
    if a.want_stacks:
        for k in keys:
            if k not in a.want_stacks:
                skipped[k] = "not in --stacks"
        keys = [k for k in keys if k in a.want_stacks]
        for k in a.want_stacks:
            if k not in keys and k not in skipped:
                skipped[k] = "not available"
    else:
        keys = leave_out_opt_in(keys, skipped)
    if any(STACK_INFO[k][1] in ("lograid", "ref") for k in keys) and not (a.lograid and os.access(a.lograid, os.X_OK)):
        build_parser().error("no lograid binary: build it (cargo build --release -p lograid-cli) or give --lograid")
    if not keys:
        build_parser().error("no stack to run")
    return keys, skipped


def choose_experiments(a, notes):
    """The experiments to run: --experiments, without bonnie++ if it cannot be had."""
    exps = list(a.exps)
    if "bonnie" in exps and not ensure_bonnie(a, notes):
        exps.remove("bonnie")
    return exps


def prepare_out(out):
    """Create the results folder and its subfolders; exits if it already holds runs."""
    if glob.glob(os.path.join(out, "raw", "*.json")):
        build_parser().error("%s already holds results (raw/*.json): choose another --out or remove it" % out)
    for sub in ("raw", "fio", "bonnie", "logs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)


def start_setup(ctx, argv, keys, skipped, exps, notes):
    """setup.json's contents at the start: options, command, machine, the stacks (how
    each is built) and what is skipped."""
    a = ctx.a
    opts = {k: v for k, v in vars(a).items() if isinstance(v, (int, float, str, list, type(None)))}
    setup = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "options": opts,
             "command": "python3 bench/compare.py " + " ".join(argv),
             "machine": machine_details(a), "skipped": skipped, "skipped_exps": exp_skips(keys, exps),
             "notes": notes,
             "load": {"start": loadavg()}, "stacks": []}
    for k in keys:
        proto = make_stack(ctx, k, "many-files", "probe")
        setup["stacks"].append({"key": k, "describe": proto.describe()})
    return setup


def save_setup(out, setup):
    with open(os.path.join(out, "setup.json"), "w") as f:
        json.dump(setup, f, indent=1)
        f.write("\n")


def log_skips(setup):
    for k, why in setup["skipped"].items():
        log("skipping %s: %s" % (k, why))
    for k, per in setup["skipped_exps"].items():
        for e, why in per.items():
            log("skipping %s in %s: %s" % (k, e, why))


def first_estimates(a):
    """First guesses of the seconds per step of each experiment (from the full run on
    this machine); the ETA replaces them by measured durations as steps finish."""
    return {"many-files": 2 * a.many_files_count * MANY_FILES_FILE_BYTES / 500e6 + 8,
            "random-writes": a.random_writes_size / 500e6 + 4 * (a.random_writes_seconds + 2.5) + 5,
            "small-files": a.small_files_count / 7000 + 5, "bonnie": 10 + a.bonnie_mb / 200,
            "degraded-reads": 2 * a.degraded_reads_size / 700e6 + 5}


def measure(ctx, stack, exp, tag):
    """(metrics, details) of `exp` on a stack that is up; on path-ref after
    --path-ref-warmup untimed runs of the same workload (their metrics in the details)."""
    warm = []
    for w in range(ctx.a.path_ref_warmup if isinstance(stack, PathRefStack) else 0):
        log("  warm-up %d of %s (untimed)" % (w + 1, stack.name))
        warm.append(EXP_FUNCS[exp](ctx, stack, "%s-warmup%d" % (tag, w + 1))[0])
    metrics, details = EXP_FUNCS[exp](ctx, stack, tag)
    if warm:
        details["warmup_metrics"] = warm
    return metrics, details


def run_step(ctx, rep, exp, key):
    """One experiment on one freshly built stack, torn down after; its record goes to
    OUT/raw/TAG.json and is returned. A failed run is recorded and the run goes on; an
    interruption is recorded and raised."""
    tag = "%s-%s-r%d" % (exp, key, rep)
    rec = {"exp": exp, "stack": key, "rep": rep, "started": time.strftime("%H:%M:%S"),
           "load_before": loadavg(), "metrics": {}, "error": None}
    t0 = time.time()
    try:
        stack = make_stack(ctx, key, exp, tag)
        with stack:
            rec["setup"] = {"describe": stack.describe(), "members": stack.member_names,
                            "direct_io": stack.direct_io}
            if isinstance(stack, (LograidStack, PathRefStack)):
                rec["setup"]["volume_bytes"] = stack.volume_bytes
            rec["metrics"], rec["details"] = measure(ctx, stack, exp, tag)
    except Interrupted:
        rec["error"] = "interrupted"
        raise
    except Exception as e:           # one failed run must not stop the others
        rec["error"] = "%s: %s" % (type(e).__name__, e)
        log("  FAILED %s: %s" % (tag, rec["error"]))
    finally:
        rec["seconds"] = round(time.time() - t0, 1)
        rec["load_after"] = loadavg()
        with open(os.path.join(ctx.out, "raw", tag + ".json"), "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
    return rec


def run_steps(steps, ctx, eta, t_start):
    """Every step in turn, with progress and the ETA on stderr."""
    for i, (rep, exp, key) in enumerate(steps):
        log("[%d/%d] rep %d, %s, %s  (elapsed %s, ETA %s)" % (
            i + 1, len(steps), rep, exp, label(key), fmt_duration(time.time() - t_start),
            fmt_duration(eta.remaining(steps[i:]))))
        rec = run_step(ctx, rep, exp, key)
        eta.add(exp, key, rec["seconds"])


def restore_sysctls(sysctls, notes, status):
    """Put the kernel settings back; the exit status (1 if they could not be)."""
    bad = sysctls.restore()
    if bad:
        notes.append("kernel settings not restored: %s" % ", ".join(bad))
        status = status or 1
    return status


def finish_results(ctx, setup, t_start, status):
    """Complete setup.json and write the report (printed if the run succeeded)."""
    setup["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    setup["elapsed_seconds"] = round(time.time() - t_start)
    setup["load"]["end"] = loadavg()
    save_setup(ctx.out, setup)
    md = write_report(ctx.out, setup, load_runs(ctx.out))
    log("report: %s (%s elapsed)" % (os.path.join(ctx.out, "compare.md"), fmt_duration(time.time() - t_start)))
    if status == 0:
        sys.stdout.write(md)


def run_all(ctx, setup, steps, exps, keys):
    """Run the steps with vm.dirty_* lowered and SIGINT, SIGTERM and SIGHUP turned into
    Interrupted (stacks torn down, what was measured kept); then restore both and write
    the results. Returns the exit status (130 if interrupted)."""
    a = ctx.a
    eta = Eta(first_estimates(a))
    sysctls = Sysctls()
    t_start = time.time()

    def on_signal(signum, frame):
        raise Interrupted("signal %d" % signum)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    status = 0
    try:
        sysctls.set_dirty(a.dirty_bytes, a.dirty_background_bytes)
        log("%d steps: %d repetition(s) x %s x %s; first estimate %s" % (
            len(steps), a.reps, ",".join(exps), ",".join(keys), fmt_duration(eta.remaining(steps))))
        run_steps(steps, ctx, eta, t_start)
    except Interrupted as e:
        log("interrupted (%s): stacks torn down; writing what was measured" % e)
        setup["notes"].append("run interrupted (%s) before it finished" % e)
        status = 130
    finally:
        status = restore_sysctls(sysctls, setup["notes"], status)
        for s, h in old.items():
            signal.signal(s, h)
        finish_results(ctx, setup, t_start, status)
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv, stat_free=free_bytes)
    if a.self_test:
        return self_test()
    if a.report_only:
        return report_only(a.report_only)
    check_host()
    notes = []
    keys, skipped = choose_stacks(a)
    exps = choose_experiments(a, notes)
    prepare_out(a.out)
    ctx = Context(a, a.out)
    setup = start_setup(ctx, argv, keys, skipped, exps, notes)
    save_setup(ctx.out, setup)
    log_skips(setup)
    steps = plan(a.reps, exps, keys, skip=exp_skip)
    return run_all(ctx, setup, steps, exps, keys)


if __name__ == "__main__":
    sys.exit(main())
