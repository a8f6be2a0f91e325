#!/usr/bin/env python3
"""lograid beside its peers, in one command: many files, random writes, small files,
bonnie++ and degraded reads, on the same member files, interleaved and repeated.

This script owns the *comparison*: which stacks, which experiments in which
order, the measurements, and the report. Building and tearing down each stack
is bench/stacks.py's job; the workloads are those of ../shared/bench
(exp_a_manyfiles.sh, exp_b_randwrite.sh, exp_c_smallfiles.sh, exp_bonnie.sh),
re-implemented here so that one process owns every mount, device and setting.

Stacks (each on --members sparse files of --member-size in a private folder
under --dir, every member a `losetup --direct-io=on` loop device):

  lograid-p1, lograid-p0 (and lograid-p2 with >= 4 members): `lograid create`,
      `lograid serve --socket` in the work folder; for the filesystem
      experiments (A, C, bonnie) ext4 on the volume attached as a loop device
      (--lograid-attach fuse, the default: the server's own FUSE file,
      `serve --fuse` + `attach --file`; nbdfuse: `attach --socket`, nbdfuse
      over NBD), for the block experiments (B, D) fio's nbd engine straight to
      the server;
  btrfs-raid5 (-m raid1), btrfs-raid0 (and btrfs-raid6 -m raid1c3 with >= 4);
  zfs-raidz1, zfs-stripe: zfs-fuse, only where installed (else skipped, noted);
  bare: ext4 on one loop device;
  ram-ext4: ext4 on one loop device over a tmpfs file: ext4 with no disk under
      it (a reference; the loop's copy into tmpfs costs CPU, so not a ceiling);
  path-ref: no members; nbdkit's memory plugin attached exactly as lograid is
      (`lograid attach` + ext4): the ceiling of the attach path itself, for the
      filesystem experiments only (B and D use no attach path: skipped there).

Experiments (every stack freshly built for each experiment and repetition; the
stacks of one repetition run back to back, in an order rotated per repetition):

  A  --a-files files of 14 MiB into one directory, then one file of the same
     total, each timed including the final syncfs (total >= 3 x vm.dirty_bytes,
     which is lowered to --dirty-bytes for the whole run and restored after);
     before each phase the caches are dropped and the guest's free page
     reporting is let finish (settle_memory), so no stack starts on memory
     that the one before it happened to leave warm; --a-memory warm then
     writes and deletes --a-warm-bytes in tmpfs, so that every stack's phase
     starts on recently used memory instead (as on a machine with no balloon);
  B  fio random writes, O_DIRECT: 512 B-64 KiB (--bsrange, or --bssplit) at
     QD 1, 10, 100 and 4 KiB at QD 32, --b-seconds each, into a --b-size file
     laid out first (lograid: the first --b-size of the volume); write
     amplification = bytes written to the member loop devices during fio and the
     sync after it / bytes fio wrote;
  C  --c-files files of 4 and 8 KiB created, copied (cp -a --reflink=never) and
     deleted, each phase timed including syncfs;
  bonnie  one bonnie++ run per stack (first repetition only);
  D  sequential 1 MiB reads (QD16, O_DIRECT) of --d-size written just before,
     healthy, then with P members' loop devices detached (btrfs: mount -o
     degraded,ro; lograid: serve --read-only on the remaining members).

Results go to --out: raw/ (one JSON per run), fio/ (fio's final reports),
bonnie/, logs/ (lograid server logs), setup.json (machine, versions, options),
compare.md (absolute figures and ratios, median (min-max) over repetitions) and
one SVG chart per experiment. `--report-only DIR` rebuilds the report from DIR.

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
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stacks import (BtrfsStack, Ext4Stack, Interrupted, LograidStack, PathRefStack,  # noqa: E402
                    ZfsFuseStack, HOST_MARGIN, RECOMMENDED_METADATA, log, machine_cpu_seconds, parse_size, run)
from steady import fio_json_objects, loadavg, machine_string  # noqa: E402
from steady_report import Svg, nice_ticks, tick_label  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
A_FILE_BYTES = 14 * MiB
EXPERIMENTS = ["A", "B", "C", "bonnie", "D"]
EXP_TITLES = {
    "A": "A: many 14 MiB files vs one big file",
    "B": "B: random writes (O_DIRECT)",
    "C": "C: small files (4 and 8 KiB)",
    "bonnie": "bonnie++ (one run per stack)",
    "D": "D: sequential read, healthy and with P members failed",
}
# B's tests: (name, label, block sizes (None: the --bsrange/--bssplit mix), queue depth)
B_TESTS = [("mixed-qd1", "mixed QD1", None, 1), ("mixed-qd10", "mixed QD10", None, 10),
           ("mixed-qd100", "mixed QD100", None, 100), ("rand4k-qd32", "4 KiB QD32", "4k", 32)]

# Stacks, in table order: key -> (label, family, parity).
STACK_INFO = {
    "lograid-p1": ("lograid P=1", "lograid", 1),
    "lograid-p0": ("lograid P=0", "lograid", 0),
    "lograid-p2": ("lograid P=2", "lograid", 2),
    "btrfs-raid5": ("btrfs raid5", "btrfs", 1),
    "btrfs-raid0": ("btrfs raid0", "btrfs", 0),
    "btrfs-raid6": ("btrfs raid6", "btrfs", 2),
    "zfs-raidz1": ("zfs-fuse raidz1", "zfs", 1),
    "zfs-stripe": ("zfs-fuse stripe", "zfs", 0),
    "bare": ("bare ext4", "bare", 0),
    "ram-ext4": ("ext4 on RAM", "bare", 0),
    "path-ref": ("attach path over nbdkit memory", "ref", 0),
}
STACK_ORDER = list(STACK_INFO)
COLOURS = {"lograid-p1": "#1f77b4", "lograid-p0": "#9ecae1", "lograid-p2": "#08306b",
           "btrfs-raid5": "#d62728", "btrfs-raid0": "#ff9896", "btrfs-raid6": "#7f0000",
           "zfs-raidz1": "#2ca02c", "zfs-stripe": "#98df8a", "bare": "#7f7f7f",
           "ram-ext4": "#bcbd22", "path-ref": "#9467bd"}

# Where ram-ext4 keeps its one member file: tmpfs, so the ext4 under test has no disk
# under it at all (and where --a-memory warm touches memory).
RAM_DIR = "/dev/shm"
# Stacks left out unless --stacks names them (ram-ext4 holds up to a member's size of
# RAM while it runs).
OPT_IN_STACKS = ["ram-ext4"]

# Ratio columns: (numerator, denominator). Parity over its own stripe, then lograid
# P=1 (and P=2) over each peer.
STRIPE_PAIRS = [("lograid-p1", "lograid-p0"), ("lograid-p2", "lograid-p0"),
                ("btrfs-raid5", "btrfs-raid0"), ("btrfs-raid6", "btrfs-raid0"),
                ("zfs-raidz1", "zfs-stripe")]
PEER_PAIRS = [("lograid-p1", "btrfs-raid5"), ("lograid-p1", "btrfs-raid0"), ("lograid-p1", "zfs-raidz1"),
              ("lograid-p1", "zfs-stripe"), ("lograid-p1", "bare"), ("lograid-p2", "btrfs-raid6"),
              ("lograid-p1", "ram-ext4"), ("bare", "btrfs-raid5"), ("ram-ext4", "btrfs-raid5")]
# Against the attach path alone (path-ref): how much of its ceiling lograid reaches,
# and where a peer stands beside that ceiling.
REF_PAIRS = [("lograid-p1", "path-ref"), ("lograid-p0", "path-ref"), ("btrfs-raid5", "path-ref")]

# Experiments a stack does not run, and why (reported beside the skipped stacks).
EXP_SKIPS = {
    "path-ref": {e: "B and D do not use the attach path (lograid goes through fio's nbd engine there, "
                    "the others through their filesystem), so its ceiling does not apply" for e in ("B", "D")},
}


def exp_skip(key, exp):
    """Why `key` does not run experiment `exp`, or None if it does."""
    return EXP_SKIPS.get(key, {}).get(exp)


class Metric:
    """One figure of an experiment: key in a run's "metrics", label, unit, and
    whether higher is better (throughput) or lower (write amplification)."""

    def __init__(self, exp, key, label, unit, higher=True, digits=0):
        self.exp, self.key, self.label, self.unit, self.higher, self.digits = exp, key, label, unit, higher, digits


def _metrics():
    m = [Metric("A", "manyfiles_MBps", "many 14 MiB files", "MB/s"),
         Metric("A", "bigfile_MBps", "one big file", "MB/s"),
         Metric("A", "manyfiles_wa", "many files WA", "x", False, 2),
         Metric("A", "bigfile_wa", "big file WA", "x", False, 2)]
    for name, label, _, _ in B_TESTS:
        m.append(Metric("B", name + "_iops", label, "IOPS"))
    for name, label, _, _ in B_TESTS:
        m.append(Metric("B", name + "_MBps", label, "MB/s", True, 1))
    for name, label, _, _ in B_TESTS:
        m.append(Metric("B", name + "_wa", label + " WA", "x", False, 2))
    m += [Metric("C", "create_fps", "create", "files/s"),
          Metric("C", "copy_fps", "copy", "files/s"),
          Metric("C", "delete_fps", "delete", "files/s"),
          Metric("C", "create_wa", "create WA", "x", False, 2),
          Metric("C", "copy_wa", "copy WA", "x", False, 2),
          Metric("bonnie", "block_write_KBps", "block write", "KB/s"),
          Metric("bonnie", "rewrite_KBps", "rewrite", "KB/s"),
          Metric("bonnie", "block_read_KBps", "block read", "KB/s"),
          Metric("bonnie", "seeks_per_s", "random seeks", "/s"),
          Metric("bonnie", "seq_create_per_s", "seq create", "/s"),
          Metric("bonnie", "seq_delete_per_s", "seq delete", "/s"),
          Metric("bonnie", "rand_create_per_s", "random create", "/s"),
          Metric("bonnie", "rand_delete_per_s", "random delete", "/s"),
          Metric("D", "healthy_MBps", "healthy", "MB/s"),
          Metric("D", "degraded_MBps", "P members failed", "MB/s"),
          Metric("D", "degraded_ratio", "degraded / healthy", "x", True, 2)]
    return m


METRICS = _metrics()
METRIC_BY_KEY = {(m.exp, m.key): m for m in METRICS}

# Charts: per experiment, panels of (title, unit, metric keys, log scale).
CHARTS = {
    "A": [("MB/s including the final sync", "MB/s", ["manyfiles_MBps", "bigfile_MBps"], False),
          ("write amplification at the members", "x", ["manyfiles_wa", "bigfile_wa"], False)],
    "B": [("IOPS (log scale)", "IOPS", [t[0] + "_iops" for t in B_TESTS], True),
          ("write amplification at the members", "x", [t[0] + "_wa" for t in B_TESTS], False)],
    "C": [("files/s including the final sync", "files/s", ["create_fps", "copy_fps", "delete_fps"], False),
          ("write amplification at the members", "x", ["create_wa", "copy_wa"], False)],
    "bonnie": [("block I/O, KB/s", "KB/s", ["block_write_KBps", "rewrite_KBps"], False),
               ("file operations per second", "/s", ["seq_create_per_s", "rand_create_per_s",
                                                     "rand_delete_per_s"], False)],
    "D": [("sequential 1 MiB reads, MB/s", "MB/s", ["healthy_MBps", "degraded_MBps"], False)],
}

# The headline: lograid P=1 against btrfs raid5.
HEADLINE = [("A", "manyfiles_MBps"), ("A", "bigfile_MBps"), ("B", "rand4k-qd32_iops"),
            ("B", "mixed-qd1_iops"), ("B", "mixed-qd10_iops"), ("B", "mixed-qd100_iops"),
            ("C", "create_fps"), ("C", "copy_fps"), ("C", "delete_fps"),
            ("A", "manyfiles_wa"), ("B", "rand4k-qd32_wa"), ("B", "mixed-qd10_wa"), ("C", "create_wa"),
            ("D", "healthy_MBps"), ("D", "degraded_MBps"), ("D", "degraded_ratio")]


# ----- statistics and tables (pure functions; see test_compare.py) -------------------------

def summarize(values):
    """min / median / max / n of the numbers in `values` (None skipped); None if none."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}


def metric_values(runs, exp, stack, key):
    """{rep: value} of one metric of one stack (runs without it are left out)."""
    out = {}
    for r in runs:
        if r["exp"] == exp and r["stack"] == stack:
            v = (r.get("metrics") or {}).get(key)
            if v is not None:
                out[r["rep"]] = v
    return out


def rep_ratios(runs, exp, key, num, den):
    """Ratio num/den of a metric within each repetition that has both (the stacks of
    one repetition ran back to back, so these are the noise-robust figures)."""
    a, b = metric_values(runs, exp, num, key), metric_values(runs, exp, den, key)
    return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]


def fmt_num(v, digits=0):
    """A number for a table: thousands separators; 2 significant digits below 10
    when digits == 0."""
    if v is None:
        return "-"
    if digits == 0 and abs(v) < 10 and v != int(v):
        return "%.2g" % v if abs(v) >= 1 else "%.2f" % v
    return "{:,.{}f}".format(v, digits)


def fmt_compact(v, digits=0):
    """A short number for a bar label: 43k, 9.4k, 712, 1.52."""
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return "%.3gM" % (v / 1e6)
    if abs(v) >= 1e4:
        return "%.0fk" % (v / 1e3)
    if abs(v) >= 1e3:
        return "%.1fk" % (v / 1e3)
    return fmt_num(v, digits)


def fmt_cell(summary, digits=0):
    """'median (min-max)', or the value alone for one repetition; '-' for none."""
    if summary is None:
        return "-"
    med = fmt_num(summary["median"], digits)
    if summary["n"] == 1 or summary["min"] == summary["max"]:
        return med
    return "%s (%s–%s)" % (med, fmt_num(summary["min"], digits), fmt_num(summary["max"], digits))


def fmt_ratio(summary):
    if summary is None:
        return "-"
    if summary["n"] == 1 or summary["min"] == summary["max"]:
        return "%.2f" % summary["median"]
    return "%.2f (%.2f–%.2f)" % (summary["median"], summary["min"], summary["max"])


def stacks_in(runs):
    """Stack keys that have runs, in table order."""
    have = {r["stack"] for r in runs}
    return [s for s in STACK_ORDER if s in have] + sorted(have - set(STACK_ORDER))


def label(stack):
    return STACK_INFO.get(stack, (stack,))[0]


def absolute_table(runs, exp):
    """Markdown: one row per metric of `exp`, one column per stack, median (min-max)."""
    stacks = stacks_in([r for r in runs if r["exp"] == exp])
    if not stacks:
        return ""
    lines = ["| metric | " + " | ".join(label(s) for s in stacks) + " |",
             "|---|" + "--:|" * len(stacks)]
    for m in METRICS:
        if m.exp != exp:
            continue
        cells = [fmt_cell(summarize(metric_values(runs, exp, s, m.key).values()), m.digits) for s in stacks]
        cells = ["too fast" if c == "-" and too_fast(runs, exp, s, m.key) else c for c, s in zip(cells, stacks)]
        if all(c == "-" for c in cells):
            continue
        lines.append("| %s (%s) | %s |" % (m.label, m.unit, " | ".join(cells)))
    return "\n".join(lines) + "\n"


def ratio_pairs(runs, exp):
    """The ratio columns that apply: both stacks have runs of `exp`."""
    have = {r["stack"] for r in runs if r["exp"] == exp}
    return [p for p in STRIPE_PAIRS + PEER_PAIRS + REF_PAIRS if p[0] in have and p[1] in have]


def ratio_table(runs, exp):
    """Markdown: one row per metric, one column per pair, per-repetition ratios as
    median (min-max)."""
    pairs = ratio_pairs(runs, exp)
    if not pairs:
        return ""
    lines = ["| metric | " + " | ".join("%s / %s" % (label(a), label(b)) for a, b in pairs) + " |",
             "|---|" + "--:|" * len(pairs)]
    for m in METRICS:
        if m.exp != exp:
            continue
        cells = [fmt_ratio(summarize(rep_ratios(runs, exp, m.key, a, b))) for a, b in pairs]
        if all(c == "-" for c in cells):
            continue
        lines.append("| %s (%s) | %s |" % (m.label, "lower is better" if not m.higher else m.unit,
                                           " | ".join(cells)))
    return "\n".join(lines) + "\n"


def headline_table(runs, num="lograid-p1", den="btrfs-raid5"):
    """Markdown: the key figures of `num` against `den`, absolute and as ratios."""
    lines = ["| figure | %s | %s | %s / %s | better |" % (label(num), label(den), label(num), label(den)),
             "|---|--:|--:|--:|---|"]
    rows = 0
    for exp, key in HEADLINE:
        m = METRIC_BY_KEY[(exp, key)]
        a = summarize(metric_values(runs, exp, num, key).values())
        b = summarize(metric_values(runs, exp, den, key).values())
        if a is None and b is None:
            continue
        q = summarize(rep_ratios(runs, exp, key, num, den))
        lines.append("| %s %s (%s) | %s | %s | %s | %s |" % (
            exp, m.label, m.unit, fmt_cell(a, m.digits), fmt_cell(b, m.digits), fmt_ratio(q),
            "higher" if m.higher else "lower"))
        rows += 1
    return "\n".join(lines) + "\n" if rows else ""


BONNIE_FIELDS = {"block_write_KBps": 11, "rewrite_KBps": 13, "block_read_KBps": 17, "seeks_per_s": 19,
                 "seq_create_per_s": 26, "seq_read_per_s": 28, "seq_delete_per_s": 30,
                 "rand_create_per_s": 32, "rand_read_per_s": 34, "rand_delete_per_s": 36}


def bonnie_too_fast(text):
    """The bonnie++ figures reported as '+++++' (too fast to measure)."""
    line = next((ln for ln in text.splitlines() if ln.count(",") > 30), None)
    if line is None:
        return []
    f = line.split(",")
    return sorted(k for k, i in BONNIE_FIELDS.items() if i < len(f) and f[i].startswith("+"))


def parse_bonnie_csv(text):
    """bonnie++ 1.98+/2.x CSV line -> metrics (None for '+++++' or missing fields)."""
    line = next((ln for ln in text.splitlines() if ln.count(",") > 30), None)
    if line is None:
        return {}
    f = line.split(",")

    def num(i):
        try:
            return float(f[i]) if f[i].strip() and "+" not in f[i] else None
        except (IndexError, ValueError):
            return None
    return {k: num(i) for k, i in BONNIE_FIELDS.items()}


def too_fast(runs, exp, stack, key):
    """Whether a run of `stack` reported `key` as too fast to measure (bonnie++'s '+++++')."""
    return any(r["exp"] == exp and r["stack"] == stack and key in ((r.get("details") or {}).get("too_fast") or [])
               for r in runs)


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


def fmt_duration(seconds):
    seconds = int(round(seconds))
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%ds" % seconds


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


def exp_a(ctx, stack, tag):
    n, buf = ctx.a.a_files, ctx.src14
    total = n * len(buf)
    d = os.path.join(stack.mountpoint, "expA")
    os.mkdir(d)
    stack.sync()
    m, det = {}, {"files": n, "file_bytes": len(buf), "total_bytes": total}

    def many():
        for i in range(n):
            with open(os.path.join(d, "f%d" % i), "wb", buffering=0) as f:
                f.write(buf)
    det["memory"] = ctx.a.a_memory
    det["settle_seconds"] = [round(settle_memory(), 1)]
    if ctx.a.a_memory == "warm":
        det["warm_seconds"] = [round(warm_memory(ctx.a.a_warm_bytes), 1)]
    c0 = cpu_snapshot(stack)
    secs, write_part, dev = timed_phase(stack, many)
    det["manyfiles_cpu_s"] = cpu_delta(c0, cpu_snapshot(stack))
    m["manyfiles_MBps"] = round(total / secs / 1e6, 1)
    m["manyfiles_wa"] = round(dev / total, 4) if dev is not None else None
    det.update(manyfiles_seconds=round(secs, 3), manyfiles_write_part_seconds=round(write_part, 3),
               manyfiles_member_bytes=dev)
    log("  A %s: %d x 14 MiB in %.1f s = %.0f MB/s, WA %s" % (stack.name, n, secs, m["manyfiles_MBps"],
                                                            fmt_num(m["manyfiles_wa"], 2)))
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
    if ctx.a.a_memory == "warm":
        det["warm_seconds"].append(round(warm_memory(ctx.a.a_warm_bytes), 1))
    c0 = cpu_snapshot(stack)
    secs, write_part, dev = timed_phase(stack, big)
    det["bigfile_cpu_s"] = cpu_delta(c0, cpu_snapshot(stack))
    m["bigfile_MBps"] = round(total / secs / 1e6, 1)
    m["bigfile_wa"] = round(dev / total, 4) if dev is not None else None
    det.update(bigfile_seconds=round(secs, 3), bigfile_write_part_seconds=round(write_part, 3),
               bigfile_member_bytes=dev)
    log("  A %s: one file of %.2f GB in %.1f s = %.0f MB/s, WA %s" % (stack.name, total / 1e9, secs,
                                                                    m["bigfile_MBps"], fmt_num(m["bigfile_wa"], 2)))
    shutil.rmtree(d)
    stack.sync()
    return m, det


def engine_counters(stack, after):
    """(member bytes written, user bytes written) from lograid's published status."""
    st = stack.engine_status(after=after)
    if not st:
        return None
    return st["member_bytes_written"], st["counters"]["user_bytes_written"]


def exp_b(ctx, stack, tag):
    a = ctx.a
    size = a.b_size
    target = fio_target(stack, "fio-B.dat")
    common = ["--size=%d" % size, "--randrepeat=0", "--group_reporting"]
    run_fio(ctx, stack, ["--name=layout", "--rw=write", "--bs=1M", "--iodepth=8", "--end_fsync=1"]
            + target + common, tag + "-layout", timeout=1800)
    stack.sync()
    m, det = {}, {"size_bytes": size, "seconds_per_test": a.b_seconds,
                  "sizes": ("bssplit=" + a.bssplit) if a.bssplit else ("bsrange=" + a.bsrange)}
    is_lograid = isinstance(stack, LograidStack)
    for name, lab, bs, qd in B_TESTS:
        if bs:
            sizes = ["--bs=" + bs]
        elif a.bssplit:
            sizes = ["--bssplit=" + a.bssplit]
        else:
            sizes = ["--bsrange=" + a.bsrange]
        eng0 = engine_counters(stack, time.time()) if is_lograid else None
        b0 = stack.member_bytes_written()
        job = run_fio(ctx, stack, ["--name=" + name, "--rw=randwrite", "--iodepth=%d" % qd, "--time_based",
                                   "--runtime=%d" % a.b_seconds, "--end_fsync=1",
                                   "--percentile_list=50:99:99.9"] + sizes + target + common,
                      tag + "-" + name, timeout=a.b_seconds + 900)
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
        log("  B %s %s: %.0f IOPS, %.1f MB/s, WA %.2f" % (stack.name, name, w["iops"], w["bw_bytes"] / 1e6,
                                                         m[name + "_wa"] or 0))
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


def exp_c(ctx, stack, tag):
    count = ctx.a.c_files
    d = os.path.join(stack.mountpoint, "expC")
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
        log("  C %s %s: %d files in %.1f s = %.0f files/s, %s MiB to members" % (
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


def exp_d(ctx, stack, tag):
    a = ctx.a
    size = a.d_size
    target = fio_target(stack, "fio-D.dat")
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
    log("  D %s healthy: %.0f MB/s" % (stack.name, m["healthy_MBps"]))
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
        log("  D %s with %d member(s) missing: %.0f MB/s (%.2f x healthy)" % (
            stack.name, p, m["degraded_MBps"], m["degraded_ratio"] or 0))
    return m, det


EXP_FUNCS = {"A": exp_a, "B": exp_b, "C": exp_c, "bonnie": exp_bonnie, "D": exp_d}


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
                            filesystem=exp not in ("B", "D"),
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


# ----- SVG --------------------------------------------------------------------------------

def chart(runs, exp, title):
    """Grouped bars: one group per metric, one bar per stack (median), a whisker from
    min to max over the repetitions; one panel per unit."""
    panels = [p for p in CHARTS.get(exp, []) if any(
        metric_values(runs, exp, s, k) for s in stacks_in(runs) for k in p[2])]
    stacks = stacks_in([r for r in runs if r["exp"] == exp])
    PW, PH, ML, MT, MB = 620, 250, 80, 40, 60
    W = ML + PW + 200
    H = 50 + max(len(panels), 1) * (MT + PH + MB)
    svg = Svg(W, H)
    svg.text(W / 2, 26, title, size=15, anchor="middle", weight="bold")
    if not panels or not stacks:
        svg.text(W / 2, 70, "no data", anchor="middle")
        return svg.render()
    for pi, (ptitle, unit, keys, logscale) in enumerate(panels):
        x0, y0 = ML, 50 + pi * (MT + PH + MB) + MT
        keys = [k for k in keys if any(metric_values(runs, exp, s, k) for s in stacks)]
        cells = {(k, s): summarize(metric_values(runs, exp, s, k).values()) for k in keys for s in stacks}
        top = max([c["max"] for c in cells.values() if c] + [1e-9])
        if logscale:
            low = min([c["min"] for c in cells.values() if c and c["min"] > 0] + [top])
            lo_e, hi_e = math.floor(math.log10(low)), math.ceil(math.log10(top * 1.05))
            if hi_e == lo_e:
                hi_e += 1
            yt = [10 ** e for e in range(lo_e, hi_e + 1)]

            def ymap(v):
                v = max(v, yt[0])
                return y0 + PH - (math.log10(v) - lo_e) / (hi_e - lo_e) * PH
        else:
            yt = nice_ticks(0, top * 1.08, 5)

            def ymap(v):
                return y0 + PH - v / yt[-1] * PH
        for v in yt:
            y = ymap(v)
            svg.line(x0, y, x0 + PW, y, "#e4e4e4")
            svg.line(x0 - 4, y, x0, y)
            svg.text(x0 - 7, y + 4, tick_label(v), size=11, anchor="end")
        svg.text(x0 + PW / 2, y0 - 10, ptitle, size=13, anchor="middle", weight="bold")
        svg.text(x0 - 58, y0 + PH / 2, unit, size=12, anchor="middle", rotate=-90)
        gw = PW / max(len(keys), 1)
        bw = min(34.0, gw * 0.8 / max(len(stacks), 1))
        for gi, k in enumerate(keys):
            gx = x0 + gi * gw + (gw - bw * len(stacks)) / 2
            m = METRIC_BY_KEY.get((exp, k))
            svg.text(x0 + gi * gw + gw / 2, y0 + PH + 18, m.label if m else k, size=12, anchor="middle")
            for si, s in enumerate(stacks):
                c = cells[(k, s)]
                x = gx + si * bw
                if not c:
                    svg.text(x + bw / 2, y0 + PH - 4, "fast" if too_fast(runs, exp, s, k) else "n/a", size=8,
                             anchor="middle", colour="#999")
                    continue
                yb, yv = ymap(yt[0]) if logscale else ymap(0), ymap(c["median"])
                svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>'
                        % (x + 1, min(yv, yb), bw - 2, abs(yb - yv), COLOURS.get(s, "#555"),
                           escape("%s, %s: %s" % (label(s), m.label if m else k, fmt_cell(c, m.digits if m else 0)))))
                if c["n"] > 1 and c["max"] > c["min"]:
                    xm = x + bw / 2
                    svg.line(xm, ymap(c["min"]), xm, ymap(c["max"]), "#222", 1.2)
                    svg.line(xm - 4, ymap(c["min"]), xm + 4, ymap(c["min"]), "#222", 1.2)
                    svg.line(xm - 4, ymap(c["max"]), xm + 4, ymap(c["max"]), "#222", 1.2)
                svg.text(x + bw / 2, min(yv, ymap(c["max"])) - 4, fmt_compact(c["median"], m.digits if m else 0),
                         size=8, anchor="middle", colour="#333")
        svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#222"/>'
                % (x0, y0, PW, PH))
    lx, ly = ML + PW + 20, 60
    svg.text(lx, ly, "stack (bar: median;", size=11, weight="bold")
    svg.text(lx, ly + 14, "whisker: min-max)", size=11, weight="bold")
    for i, s in enumerate(stacks):
        y = ly + 36 + i * 20
        svg.add('<rect x="%.1f" y="%.1f" width="14" height="12" fill="%s"/>' % (lx, y - 10, COLOURS.get(s, "#555")))
        svg.text(lx + 20, y, label(s), size=12)
    return svg.render()


# ----- report ------------------------------------------------------------------------------

def load_runs(out):
    runs = []
    for p in sorted(glob.glob(os.path.join(out, "raw", "*.json"))):
        with open(p) as f:
            runs.append(json.load(f))
    return runs


def report(out, setup, runs):
    """Write compare.md and the SVG charts into `out`; returns the markdown."""
    a = setup.get("options", {})
    mach = setup.get("machine", {})
    L = ["# lograid beside its peers (bench/compare.py)", ""]
    L.append("Date: %s to %s. Machine: %s; kernel %s; member files on %s (%s)." % (
        setup.get("started", "?"), setup.get("finished", "(unfinished)"), mach.get("summary", "?"),
        mach.get("kernel", "?"), (mach.get("dir") or {}).get("mount", "?"), mach.get("disk", "?")))
    loads = summarize([r["load_before"][0] for r in runs if r.get("load_before")])
    if loads:
        L.append("Load average (1 min) before each run: median %.1f (%.1f–%.1f) on %s CPUs; other work "
                 "shares this machine, so trust the within-repetition ratios more than absolute figures." % (
                     loads["median"], loads["min"], loads["max"], mach.get("cpus", "?")))
    L.append("")
    L.append("Setup: %d member files of %s per stack (sparse, `losetup --direct-io=on`), %d repetition(s), "
             "stacks interleaved within each repetition (order rotated per repetition), every stack "
             "built fresh for every experiment. vm.dirty_bytes %s, vm.dirty_background_bytes %s during the "
             "run (restored after). Elapsed: %s." % (
                 a.get("members", 0), human(a.get("member_size")), a.get("reps", 0),
                 human(a.get("dirty_bytes")), human(a.get("dirty_background_bytes")),
                 fmt_duration(setup.get("elapsed_seconds", 0))))
    L.append("")
    L.append("| stack | how it is built |")
    L.append("|---|---|")
    for s in setup.get("stacks", []):
        L.append("| %s | %s |" % (label(s["key"]), s["describe"]))
    for k, why in sorted((setup.get("skipped") or {}).items()):
        L.append("| %s | skipped: %s |" % (label(k), why))
    for k, per in sorted((setup.get("skipped_exps") or {}).items()):
        for why, exps_ in group_reasons(per):
            L.append("| %s | not run in %s: %s |" % (label(k), ", ".join(exps_), why))
    L.append("")
    L.append("Figures are median (min–max) over the repetitions; ratios are computed within each "
             "repetition (the stacks of one repetition ran back to back) and then summarised the same way. "
             "WA = bytes written to the member loop devices (`/sys/block/loopN/stat` field 7 x 512) during "
             "the phase and the sync after it / bytes the workload wrote.")
    L.append("")
    head = headline_table(runs)
    if head:
        L += ["## lograid P=1 against btrfs raid5", "", head]
    for exp in EXPERIMENTS:
        ers = [r for r in runs if r["exp"] == exp]
        if not ers:
            continue
        L += ["## " + EXP_TITLES[exp], "", exp_description(exp, a), ""]
        not_here = [(k, per[exp]) for k, per in sorted((setup.get("skipped_exps") or {}).items()) if exp in per]
        if not_here:
            L += ["Not run here: %s." % "; ".join("%s (%s)" % (label(k), why) for k, why in not_here), ""]
        L += ["![%s](%s.svg)" % (EXP_TITLES[exp], exp), ""]
        L += [absolute_table(runs, exp)]
        if exp == "B":
            L += [engine_note(runs)]
        if exp == "A":
            L += [cpu_table(runs)]
        rt = ratio_table(runs, exp)
        if rt:
            L += ["Ratios (per repetition, then median (min–max)):", "", rt]
        with open(os.path.join(out, exp + ".svg"), "w") as f:
            f.write(chart(runs, exp, EXP_TITLES[exp]))
    errs = [r for r in runs if r.get("error")]
    notes = list(setup.get("notes") or [])
    if errs or notes:
        L += ["## Problems and notes", ""]
        L += ["- %s" % n for n in notes]
        L += ["- %s on %s, repetition %d: %s" % (r["exp"], label(r["stack"]), r["rep"], r["error"]) for r in errs]
        L.append("")
    L += ["## Versions", ""]
    for k, v in sorted((mach.get("versions") or {}).items()):
        L.append("- %s: %s" % (k, v if v else "not installed"))
    L.append("")
    md = "\n".join(L)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(md)
    return md


CPU_PHASES = [("manyfiles", "many files"), ("bigfile", "big file")]
CPU_WHO = [("server", "NBD server"), ("nbdfuse", "nbdfuse"), ("machine", "whole machine")]


def cpu_table(runs):
    """Markdown: CPU seconds per GB written in each phase of A (median (min-max)), for
    the NBD server, nbdfuse and the whole machine (which includes other work)."""
    stacks = stacks_in([r for r in runs if r["exp"] == "A"])
    rows = []
    for phase, plabel in CPU_PHASES:
        for who, wlabel in CPU_WHO:
            cells, any_ = [], False
            for s in stacks:
                vals = []
                for r in runs:
                    d = r.get("details") or {}
                    c = (d.get(phase + "_cpu_s") or {}).get(who)
                    if r["exp"] == "A" and r["stack"] == s and c is not None and d.get("total_bytes"):
                        vals.append(c / (d["total_bytes"] / 1e9))
                any_ = any_ or bool(vals)
                cells.append(fmt_cell(summarize(vals), 2))
            if any_:
                rows.append("| %s: %s | %s |" % (plabel, wlabel, " | ".join(cells)))
    if not rows:
        return ""
    return ("CPU seconds per GB written, phase including its sync (`/proc/PID/stat` of the NBD server "
            "and of the attach's nbdfuse; whole machine from `/proc/stat`, other work included; kernel "
            "threads doing the loop and FUSE work count only there; on a machine kept busy by other work "
            "it is close to the CPUs x the phase's seconds, so it does not attribute anything):\n\n"
            "| phase: process | " + " | ".join(label(s) for s in stacks) + " |\n"
            "|---|" + "--:|" * len(stacks) + "\n" + "\n".join(rows) + "\n")


def group_reasons(per_exp):
    """{exp: reason} -> [(reason, [exps in experiment order])], one entry per reason."""
    out = {}
    for e in EXPERIMENTS + sorted(set(per_exp) - set(EXPERIMENTS)):
        if e in per_exp:
            out.setdefault(per_exp[e], []).append(e)
    return list(out.items())


def engine_note(runs):
    """How lograid's own member counters compare with the loop devices', and its WA
    per engine block (whole 4 KiB blocks) beside the WA per fio byte."""
    same = total = 0
    per_stack = {}
    for r in runs:
        if r["exp"] != "B" or not r["stack"].startswith("lograid") or not r.get("details"):
            continue
        for name, _, _, _ in B_TESTS:
            d = r["details"].get(name)
            if not isinstance(d, dict) or "engine_member_bytes" not in d:
                continue
            total += 1
            same += d["engine_member_bytes"] == d["member_bytes"]
            if d.get("engine_wa") is not None:
                per_stack.setdefault((r["stack"], name), []).append(d["engine_wa"])
    if not total:
        return ""
    parts = ["%s %s %s" % (label(s), n, fmt_cell(summarize(v), 2)) for (s, n), v in sorted(per_stack.items())]
    return ("lograid's own member counters (`lograid status --json`, published by the server) equalled the "
            "loop devices' in %d of %d tests. Its WA per engine block (member bytes / the engine's "
            "`user_bytes_written`, which counts partly written 4 KiB blocks whole): %s.\n" % (
                same, total, "; ".join(parts)))


def human(n):
    if not n:
        return "-"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % n


def exp_description(exp, a):
    if exp == "A":
        return ("%d files of 14 MiB (%s, %.1f x vm.dirty_bytes) written into one directory, then one file "
                "of the same total; MB/s include the final syncfs; before each phase the caches are dropped and "
                "the guest's free page reporting is let finish, so every stack starts on the same (cold) "
                "memory%s. lograid: ext4 on `lograid attach` "
                "(%s + loop); btrfs, zfs: their own filesystem; bare: ext4; attach path over nbdkit "
                "memory: ext4 on `lograid attach` of nbdkit's memory plugin (RAM: the path's own ceiling; "
                "no members, so no WA; %d untimed run(s) of the workload first); ext4 on RAM: ext4 on a loop "
                "device over a tmpfs file (no disk at all; the loop copies into tmpfs, so not a ceiling)." % (
                    a.get("a_files", 0), human(a.get("a_files", 0) * A_FILE_BYTES),
                    a.get("a_files", 0) * A_FILE_BYTES / max(a.get("dirty_bytes") or 1, 1),
                    "" if a.get("a_memory", "cold") != "warm" else
                    (", then %s is written to tmpfs and deleted (--a-memory warm), so the phase's page "
                     "cache gets recently used memory" % human(a.get("a_warm_bytes") or 0)),
                    "its own FUSE file" if a.get("lograid_attach", "nbdfuse") == "fuse" else "nbdfuse",
                    a.get("path_ref_warmup", 0)))
    if exp == "B":
        return ("fio randwrite, O_DIRECT, %s (mixed) and 4 KiB, %d s per test, into a %s file laid out first "
                "(lograid: the first %s of the volume through fio's nbd engine; others: libaio on a file in "
                "the filesystem); end_fsync=1. IOPS and MB/s are fio's; WA includes the sync after fio. "
                "lograid writes a partly covered 4 KiB block whole, so its WA per fio byte for mixed sizes "
                "is above its per-block figure (`engine_wa` in raw/)." % (
                    ("bssplit " + a["bssplit"]) if a.get("bssplit") else ("bsrange " + a.get("bsrange", "?")),
                    a.get("b_seconds", 0), human(a.get("b_size")), human(a.get("b_size"))))
    if exp == "C":
        return ("%d files, half 4 KiB and half 8 KiB, in 100 directories: created, copied "
                "(`cp -a --reflink=never`), the originals deleted (`rm -rf`); each phase timed including "
                "syncfs. Filesystems as in A." % a.get("c_files", 0))
    if exp == "bonnie":
        return ("`bonnie++ -s %d -r %d -n %s -f -u root`, once per stack (repetition 1). With this much RAM "
                "its read and rewrite figures come largely from the page cache; block write and the file "
                "operations are the meaningful ones; \"too fast\" is bonnie++'s +++++ (under its timer's "
                "resolution; \"fast\" in the chart). Filesystems as in A." % (
                    a.get("bonnie_mb", 0), a.get("bonnie_mb", 0) // 2, a.get("bonnie_files", "?")))
    if exp == "D":
        return ("%s written sequentially (1 MiB, QD16, O_DIRECT), page cache dropped, read back the same "
                "way; then P member loop devices detached and read again (btrfs: unmount, `mount -o "
                "degraded,ro` on the rest; lograid: server stopped and started `--read-only` on the "
                "remaining members: the pool opens degraded). lograid through fio's nbd engine, the "
                "others from a file in their filesystem. Stacks without parity have no degraded figure." % (
                    human(a.get("d_size"))))
    return ""


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
                    help="comma-separated subset of A,B,C,bonnie,D (default all)")
    ap.add_argument("--lograid", default=None, help="lograid binary (default target/release/lograid, "
                                                    "/work/target-bench/release/lograid, or PATH)")
    ap.add_argument("--lograid-chunk", default=None, help="lograid create --chunk (default: lograid's)")
    ap.add_argument("--lograid-attach", default="fuse", choices=list(LograidStack.ATTACH),
                    help="how lograid's volume becomes a loop device for A, C and bonnie: fuse (default; "
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
    ap.add_argument("--a-files", type=int, default=None,
                    help="A: number of 14 MiB files (default: 4 x dirty bytes worth; at least 3 x)")
    ap.add_argument("--a-memory", default="cold", choices=["cold", "warm"],
                    help="A: the memory each timed phase starts on (default cold: caches dropped and the "
                         "guest's free page reporting settled; warm: then --a-warm-bytes written to and "
                         "deleted from tmpfs, so the page cache gets recently used memory, as on a machine "
                         "without a memory balloon)")
    ap.add_argument("--a-warm-bytes", default="6G", help="A, --a-memory warm: how much memory to touch (default 6G)")
    ap.add_argument("--b-size", default=None, help="B: file (or volume range) size (default 2G; --quick 256M)")
    ap.add_argument("--b-seconds", type=int, default=None, help="B: seconds per test (default 10; --quick 3)")
    ap.add_argument("--bsrange", default="512-64k", help="B: mixed sizes, fio bsrange (default 512-64k, "
                                                         "as ../shared/bench/exp_b_randwrite.sh)")
    ap.add_argument("--bssplit", default=None, help="B: mixed sizes as fio bssplit instead (e.g. "
                                                    "512/10:4k/40:16k/30:64k/20)")
    ap.add_argument("--c-files", type=int, default=None, help="C: number of files (default 102400; --quick 10240)")
    ap.add_argument("--bonnie-mb", type=int, default=None, help="bonnie++ -s in MiB (default 2048; --quick 256)")
    ap.add_argument("--bonnie-files", default=None, help="bonnie++ -n (default 16:8192:4096:16; --quick 2:8192:4096:16)")
    ap.add_argument("--bonnie-timeout", type=int, default=900, help="seconds (default 900)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install bonnie++ if missing")
    ap.add_argument("--d-size", default=None, help="D: bytes written then read (default 2G; --quick 256M)")
    ap.add_argument("--device", action="append", default=[], help="(not implemented) use real block devices")
    ap.add_argument("--report-only", metavar="DIR", default=None, help="rebuild the report of DIR and exit")
    ap.add_argument("--self-test", action="store_true", help="run bench/test_compare.py and exit")
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
    q = a.quick
    try:
        a.member_size = parse_size(a.member_size or ("1G" if q else "4G"))
        a.dirty_bytes = parse_size(a.dirty_bytes or ("64M" if q else "512M"))
        a.dirty_background_bytes = parse_size(a.dirty_background_bytes) if a.dirty_background_bytes \
            else a.dirty_bytes // 4
        a.a_warm_bytes = parse_size(a.a_warm_bytes)
        a.b_size = parse_size(a.b_size or ("256M" if q else "2G"))
        a.d_size = parse_size(a.d_size or ("256M" if q else "2G"))
        a.lograid_chunk = a.lograid_chunk and str(parse_size(a.lograid_chunk))
    except ValueError as e:
        ap.error(str(e))
    a.reps = a.reps if a.reps is not None else (1 if q else 3)
    a.b_seconds = a.b_seconds or (3 if q else 10)
    a.c_files = a.c_files or (10240 if q else 102400)
    a.bonnie_mb = a.bonnie_mb or (256 if q else 2048)
    a.bonnie_files = a.bonnie_files or ("2:8192:4096:16" if q else "16:8192:4096:16")
    if a.members < 2:
        ap.error("--members must be at least 2 (got %d)" % a.members)
    if a.members > 16:
        ap.error("--members at most 16 (got %d)" % a.members)
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    if a.path_ref_warmup < 0:
        ap.error("--path-ref-warmup must be at least 0")
    if a.b_seconds < 1:
        ap.error("--b-seconds must be at least 1")
    if a.member_size < 256 * MiB:
        ap.error("--member-size must be at least 256M")
    if a.dirty_background_bytes >= a.dirty_bytes:
        ap.error("--dirty-background-bytes must be below --dirty-bytes")
    if a.a_files is None:
        a.a_files = max(1, math.ceil(4 * a.dirty_bytes / A_FILE_BYTES))
    if a.a_files * A_FILE_BYTES < 3 * a.dirty_bytes:
        ap.error("--a-files %d x 14 MiB = %s is less than 3 x --dirty-bytes (%s): the page cache would hide "
                 "the stack" % (a.a_files, human(a.a_files * A_FILE_BYTES), human(3 * a.dirty_bytes)))
    # Everything must fit on the smallest stack: the bare drive, one member.
    room = a.member_size * 0.8
    for what, size in (("A (--a-files x 14 MiB)", a.a_files * A_FILE_BYTES), ("--b-size", a.b_size),
                       ("--d-size", a.d_size), ("bonnie++ -s", a.bonnie_mb * MiB)):
        if size > room:
            ap.error("%s = %s does not fit on one %s member (the bare drive) with room to spare; "
                     "raise --member-size or lower it" % (what, human(size), human(a.member_size)))
    exps = [e.strip() for e in a.experiments.split(",") if e.strip()]
    bad = [e for e in exps if e not in EXPERIMENTS]
    if bad or not exps:
        ap.error("unknown experiment(s) %s (have %s)" % (",".join(bad) or "(none)", ",".join(EXPERIMENTS)))
    a.exps = [e for e in EXPERIMENTS if e in exps]
    if a.stacks:
        want = [s.strip() for s in a.stacks.split(",") if s.strip()]
        bad = [s for s in want if s not in STACK_INFO]
        if bad or not want:
            ap.error("unknown stack(s) %s (have %s)" % (",".join(bad) or "(none)", ",".join(STACK_ORDER)))
        a.want_stacks = want
    else:
        a.want_stacks = None
    if a.bssplit and a.bsrange != "512-64k":
        ap.error("give --bsrange or --bssplit, not both")
    a.lograid = a.lograid or default_lograid()
    if a.out is None:
        a.out = os.path.join(HERE, "results", "compare-" + time.strftime("%Y-%m-%d"))
    free = stat_free(a.dir) if stat_free else None
    if free is not None:
        need = a.members * a.member_size + HOST_MARGIN
        if free < need:
            ap.error("not enough space in %s: %.1f GiB free, the member files filled need %.1f GiB "
                     "(%d x %s + %s margin)" % (a.dir, free / GiB, need / GiB, a.members, human(a.member_size),
                                                human(HOST_MARGIN)))
    return a


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ----- main --------------------------------------------------------------------------------

class Context:
    pass


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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv, stat_free=free_bytes)
    if a.self_test:
        import unittest
        suite = unittest.defaultTestLoader.discover(HERE, pattern="test_compare.py")
        ok = unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful()
        return 0 if ok else 1
    if a.report_only:
        with open(os.path.join(a.report_only, "setup.json")) as f:
            setup = json.load(f)
        sys.stdout.write(report(a.report_only, setup, load_runs(a.report_only)))
        return 0
    if os.geteuid() != 0:
        build_parser().error("run as root (losetup, mkfs, mount, sysctl)")
    for tool in ("fio", "losetup", "mkfs.ext4", "mkfs.btrfs", "btrfs", "fstrim"):
        if not shutil.which(tool):
            build_parser().error("%s is not installed" % tool)

    notes = []
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
    exps = list(a.exps)
    if "bonnie" in exps and not ensure_bonnie(a, notes):
        exps.remove("bonnie")

    out = a.out
    if glob.glob(os.path.join(out, "raw", "*.json")):
        build_parser().error("%s already holds results (raw/*.json): choose another --out or remove it" % out)
    for sub in ("raw", "fio", "bonnie", "logs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    ctx = Context()
    ctx.a, ctx.out = a, out
    ctx.src14 = os.urandom(A_FILE_BYTES)
    opts = {k: v for k, v in vars(a).items() if isinstance(v, (int, float, str, list, type(None)))}
    setup = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "options": opts,
             "command": "python3 bench/compare.py " + " ".join(argv),
             "machine": machine_details(a), "skipped": skipped, "skipped_exps": exp_skips(keys, exps),
             "notes": notes,
             "load": {"start": loadavg()}, "stacks": []}
    for k in keys:
        proto = make_stack(ctx, k, "A", "probe")
        setup["stacks"].append({"key": k, "describe": proto.describe()})

    def save_setup():
        with open(os.path.join(out, "setup.json"), "w") as f:
            json.dump(setup, f, indent=1)
            f.write("\n")
    save_setup()
    for k, why in skipped.items():
        log("skipping %s: %s" % (k, why))
    for k, per in setup["skipped_exps"].items():
        for e, why in per.items():
            log("skipping %s in %s: %s" % (k, e, why))

    steps = plan(a.reps, exps, keys, skip=exp_skip)
    # First guesses (seconds per step), from the full run on this machine; replaced by
    # measured durations as steps finish.
    priors = {"A": 2 * a.a_files * A_FILE_BYTES / 500e6 + 8,
              "B": a.b_size / 500e6 + 4 * (a.b_seconds + 2.5) + 5,
              "C": a.c_files / 7000 + 5, "bonnie": 10 + a.bonnie_mb / 200,
              "D": 2 * a.d_size / 700e6 + 5}
    eta = Eta(priors)
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
        for i, (rep, exp, key) in enumerate(steps):
            log("[%d/%d] rep %d, %s, %s  (elapsed %s, ETA %s)" % (
                i + 1, len(steps), rep, exp, label(key), fmt_duration(time.time() - t_start),
                fmt_duration(eta.remaining(steps[i:]))))
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
                    warm = []
                    for w in range(a.path_ref_warmup if isinstance(stack, PathRefStack) else 0):
                        log("  warm-up %d of %s (untimed)" % (w + 1, stack.name))
                        warm.append(EXP_FUNCS[exp](ctx, stack, "%s-warmup%d" % (tag, w + 1))[0])
                    rec["metrics"], rec["details"] = EXP_FUNCS[exp](ctx, stack, tag)
                    if warm:
                        rec["details"]["warmup_metrics"] = warm
            except Interrupted:
                rec["error"] = "interrupted"
                raise
            except Exception as e:           # one failed run must not stop the others
                rec["error"] = "%s: %s" % (type(e).__name__, e)
                log("  FAILED %s: %s" % (tag, rec["error"]))
            finally:
                rec["seconds"] = round(time.time() - t0, 1)
                rec["load_after"] = loadavg()
                with open(os.path.join(out, "raw", tag + ".json"), "w") as f:
                    json.dump(rec, f, indent=1)
                    f.write("\n")
            eta.add(exp, key, rec["seconds"])
    except Interrupted as e:
        log("interrupted (%s): stacks torn down; writing what was measured" % e)
        notes.append("run interrupted (%s) before it finished" % e)
        status = 130
    finally:
        bad = sysctls.restore()
        if bad:
            notes.append("kernel settings not restored: %s" % ", ".join(bad))
            status = status or 1
        for s, h in old.items():
            signal.signal(s, h)
        setup["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        setup["elapsed_seconds"] = round(time.time() - t_start)
        setup["load"]["end"] = loadavg()
        save_setup()
        md = report(out, setup, load_runs(out))
        log("report: %s (%s elapsed)" % (os.path.join(out, "compare.md"), fmt_duration(time.time() - t_start)))
        if status == 0:
            sys.stdout.write(md)
    return status


if __name__ == "__main__":
    sys.exit(main())
