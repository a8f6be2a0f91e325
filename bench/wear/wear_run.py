#!/usr/bin/env python3
"""Write amplification of the kernel's parity RAID stacks and of lograid, measured at the
member disks of a Debian guest (qemu, TCG): OpenZFS raidz1-3, md RAID 5/6 with and without
a write journal, btrfs raid5/6 and lograid P=1-3, all on the same number of virtio disks.

This script owns the *run*: it assembles one in-guest test per stack from guest/wear.sh and
the options, boots the `peers` guest image through scripts/vm/run.sh (which builds and caches
the image, shares the lograid binary, and always stops qemu), collects the phases' results,
fio's reports and the guest logs into the results folder, deletes the guest's disks, and
writes the report (wear_report.py: wear.md and wear.svg). Timing figures from the guest are
not performance figures (TCG); only byte ratios are reported.

    sudo python3 bench/wear/wear_run.py --binary target/release/lograid --out bench/results/wear-DATE
    python3 bench/wear/wear_run.py --report-only bench/results/wear-DATE
    python3 bench/wear/wear_run.py --help
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))   # bench/, for steady_report
sys.path.insert(0, HERE)
import wear_report  # noqa: E402

# Run order: one parity level at a time, lograid first in each, so a cut-short run still has
# the comparisons of the levels it reached.
ALL_STACKS = ["lograid-p1", "md-raid5", "md-raid5-journal", "zfs-raidz1", "btrfs-raid5",
              "lograid-p2", "md-raid6", "md-raid6-journal", "zfs-raidz2", "btrfs-raid6",
              "lograid-p3", "zfs-raidz3"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")),
                                                    "release", "lograid"),
                   help="the lograid binary run in the guest (default: target/release/lograid)")
    p.add_argument("--out", help="results folder (default bench/results/wear-DATE; refused if it holds results)")
    p.add_argument("--stacks", default=",".join(ALL_STACKS), help="comma-separated, from: " + ", ".join(ALL_STACKS))
    p.add_argument("--members", type=int, default=6, help="member disks per stack (default 6)")
    p.add_argument("--disk-size", default="256M", help="size of each virtio disk (sparse; default 256M)")
    p.add_argument("--memory", type=int, default=3072, help="guest memory, MiB (default 3072)")
    p.add_argument("--fills", default="0.5,0.75", help="volume fill levels of the random phase")
    p.add_argument("--random-factor", type=float, default=0.5,
                   help="the random phase writes this x the filled bytes (default 0.5)")
    p.add_argument("--random-max-seconds", type=int, default=240,
                   help="... or stops after this many seconds (default 240)")
    p.add_argument("--file-random-max-seconds", type=int, default=120,
                   help="the same cap for random writes into a file in a ZFS dataset, measured at the first "
                        "fill only (default 120; 0 skips them)")
    p.add_argument("--files", type=int, default=24, help="many-files: 14 MiB files (default 24; 0 skips)")
    p.add_argument("--zfs-txg-timeout", type=int, default=0,
                   help="zfs_txg_timeout in the guest, s (default 0: ZFS's own, 5)")
    p.add_argument("--zvol-fraction", type=float, default=0.95,
                   help="a zvol's size as a fraction of the largest the pool can reserve (default 0.95)")
    p.add_argument("--quiet", type=int, default=8, help="seconds without disk writes that end a phase (default 8)")
    p.add_argument("--quiet-max", type=int, default=180, help="longest wait for that quiet (default 180)")
    p.add_argument("--test-timeout", type=int, default=3600, help="guest timeout per stack, s (default 3600)")
    p.add_argument("--run-timeout", type=int, default=4 * 3600, help="timeout of the whole guest run, s")
    p.add_argument("--image", default="peers", help="scripts/vm image variant (default peers)")
    p.add_argument("--report-only", metavar="DIR", help="rebuild DIR's report from its results and exit")
    a = p.parse_args(argv)
    a.stack_list = [s for s in a.stacks.split(",") if s]
    bad = [s for s in a.stack_list if s not in ALL_STACKS]
    if bad:
        p.error("unknown stack(s): %s" % ", ".join(bad))
    try:
        a.fill_list = [float(f) for f in a.fills.split(",") if f]
    except ValueError:
        p.error("--fills: numbers between 0 and 1")
    if not a.fill_list or not all(0 < f < 1 for f in a.fill_list):
        p.error("--fills: numbers between 0 and 1")
    if not 0 < a.zvol_fraction <= 1:
        p.error("--zvol-fraction: a number above 0, at most 1")
    if a.members < 4 and any(s.endswith(("raidz3", "p3")) for s in a.stack_list):
        p.error("raidz3 and lograid P=3 need at least 4 members")
    return a


def test_script(stack, a):
    """The in-guest test for one stack: the settings, then guest/wear.sh."""
    with open(os.path.join(HERE, "guest", "wear.sh")) as f:
        body = f.read()
    header = ["# Generated by bench/wear/wear_run.py for %s." % stack,
              "WEAR_STACK=%s" % stack,
              "WEAR_MEMBERS=%d" % a.members,
              'WEAR_FILLS="%s"' % " ".join("%g" % f for f in a.fill_list),
              "WEAR_RANDOM_FACTOR=%g" % a.random_factor,
              "WEAR_RANDOM_MAX_SECONDS=%d" % a.random_max_seconds,
              "WEAR_FILE_RANDOM_MAX_SECONDS=%d" % a.file_random_max_seconds,
              "WEAR_FILES=%d" % a.files,
              "WEAR_ZFS_TXG_TIMEOUT=%d" % a.zfs_txg_timeout,
              "WEAR_ZVOL_FRACTION=%g" % a.zvol_fraction,
              "WEAR_QUIET=%d" % a.quiet,
              "WEAR_QUIET_MAX=%d" % a.quiet_max]
    return "\n".join(header) + "\n" + body


def git(*args):
    try:
        return subprocess.run(["git", "-C", REPO] + list(args), capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def fmt_duration(seconds):
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return "%d h %02d min" % (h, m) if h else "%d min %02d s" % (m, s)


def run(a):
    if os.geteuid() != 0:
        sys.exit("wear: run as root (scripts/vm/run.sh builds the image and boots qemu)")
    binary = os.path.abspath(a.binary)
    if not os.access(binary, os.X_OK):
        sys.exit("wear: no lograid binary at %s (cargo build --release -p lograid-cli, or --binary)" % binary)
    out = os.path.abspath(a.out or os.path.join(REPO, "bench", "results",
                                                "wear-" + datetime.date.today().isoformat()))
    if os.path.exists(os.path.join(out, "results.jsonl")):
        sys.exit("wear: %s already holds results" % out)
    os.makedirs(out, exist_ok=True)
    tests = tempfile.mkdtemp(prefix="lograid-wear-tests.")
    names = []
    for stack in a.stack_list:
        name = "wear-" + stack
        with open(os.path.join(tests, name + ".sh"), "w") as f:
            f.write(test_script(stack, a))
        names.append(name)
    cmd = [os.path.join(REPO, "scripts", "vm", "run.sh"), "--image", a.image, "--tests-dir", tests,
           "--disks", str(a.members + 1), "--disk-size", a.disk_size, "--memory", str(a.memory),
           "--binary", binary, "--keep"] + names
    env = dict(os.environ, LOGRAID_VM_TEST_TIMEOUT=str(a.test_timeout), LOGRAID_VM_TIMEOUT=str(a.run_timeout))
    t0 = time.time()
    started = datetime.datetime.now(datetime.timezone.utc)
    print("wear: %s" % " ".join(cmd), flush=True)
    kept = None
    problems = []
    with open(os.path.join(out, "vm.log"), "w") as vmlog:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                vmlog.write(line)
                m = re.match(r"vm: kept (/\S+)", line)
                if m:
                    kept = m.group(1)
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        finally:
            shutil.rmtree(tests, ignore_errors=True)
    if rc != 0:
        problems.append("scripts/vm/run.sh exited with status %d (see vm.log and logs/)" % rc)
    guest_kernel = "?"
    if kept and re.match(r"^/var/tmp/lograid-vm\.\w+$", kept) and os.path.isdir(kept):
        share = os.path.join(kept, "share", "out")
        wear_dir = os.path.join(share, "wear")
        if os.path.exists(os.path.join(wear_dir, "results.jsonl")):
            shutil.copy(os.path.join(wear_dir, "results.jsonl"), out)
        if os.path.isdir(os.path.join(wear_dir, "fio")):
            shutil.copytree(os.path.join(wear_dir, "fio"), os.path.join(out, "fio"), dirs_exist_ok=True)
        os.makedirs(os.path.join(out, "logs"), exist_ok=True)
        for log in glob.glob(os.path.join(share, "*.log")):
            shutil.copy(log, os.path.join(out, "logs"))
        console = os.path.join(kept, "console.log")
        if os.path.exists(console):
            with open(console, errors="replace") as f:
                m = re.search(r"vm guest: kernel (\S+)", f.read())
                guest_kernel = m.group(1).rstrip(",;.") if m else guest_kernel
        shutil.rmtree(kept)   # the guest's disks (up to members+1 x disk size) and the share
    else:
        problems.append("no kept guest folder to collect results from")
    duration = time.time() - t0
    setup = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "build": "build of %s" % git("rev-parse", "--short", "HEAD"),
        "machine": "host: %s, %d cores" % (platform.node(), os.cpu_count() or 0),
        "command": "python3 bench/wear/wear_run.py " + " ".join(sys.argv[1:]),
        "members": a.members, "disk_size": a.disk_size, "memory_mib": a.memory,
        "fills": a.fill_list, "random_factor": a.random_factor, "random_max_seconds": a.random_max_seconds,
        "file_random_max_seconds": a.file_random_max_seconds,
        "files": a.files, "zfs_txg_timeout": a.zfs_txg_timeout, "zvol_fraction": a.zvol_fraction, "quiet": a.quiet, "quiet_max": a.quiet_max, "stacks": a.stack_list,
        "guest_kernel": guest_kernel, "duration_seconds": round(duration), "duration": fmt_duration(duration),
        "problems": problems,
    }
    with open(os.path.join(out, "setup.json"), "w") as f:
        json.dump(setup, f, indent=2)
    report(out)
    print("wear: %s in %s; report in %s" % ("done" if not problems else "FINISHED WITH PROBLEMS",
                                           fmt_duration(duration), os.path.join(out, "wear.md")))
    return 0 if not problems else 1


def report(out):
    results_path = os.path.join(out, "results.jsonl")
    results = wear_report.load_results(results_path) if os.path.exists(results_path) else []
    setup = {}
    if os.path.exists(os.path.join(out, "setup.json")):
        with open(os.path.join(out, "setup.json")) as f:
            setup = json.load(f)
    wear_report.write_report(out, setup, results)
    return results


def main(argv=None):
    a = parse_args(argv)
    if a.report_only:
        results = report(a.report_only)
        print(wear_report.markdown(results, None))
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
