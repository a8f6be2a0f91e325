#!/usr/bin/env python3
"""Steady-state write amplification of a peer stack (btrfs raid5 by default).

This script owns the *experiment*; building and tearing down the stack is
bench/stacks.py's job. For every fill level x access pattern it:

  1. builds a fresh stack (3 sparse members of --member-size, loop devices,
     mkfs.btrfs -d raid5 -m raid5, mounted in a private folder under --dir);
  2. reads the usable capacity: 'Free (estimated)' of `btrfs filesystem usage -b`
     on the empty filesystem (statvfs is not used: for raid5 btrfs reports the
     raw size of all members there, parity included);
  3. fills one file sequentially to fill x capacity (fio, 1 MiB writes,
     direct=1, fallocate=none, end_fsync) and syncs the filesystem;
  4. overwrites it with random 4 KiB writes for --seconds (fio, direct=1,
     libaio, iodepth 32, numjobs 1, time_based, norandommap, randrepeat=0;
     pattern "uniform", or "skewed" = random_distribution=zoned:90/10:10/90,
     i.e. 90 % of the writes on the first 10 % of the file), then syncs;
     meanwhile a timer thread samples the members' "sectors written" counters
     (/sys/block/loopN/stat field 7) every 0.5 s and fio prints its cumulative
     counters every second (--status-interval=1, JSON, wall-clock stamped);
  5. reports write amplification WA = member bytes written from the start of
     the overwrite phase to the end of the sync after it / bytes fio wrote;
     the same over the last third of the run (to see whether it settled);
     IOPS; p50/p99/p99.9 completion latency (fio clat); and a timeline per 5 s
     of IOPS and WA (the two counter series interpolated at each 5 s mark).

Plus one "empty" run on a fresh stack: a 1 GiB file (at most a quarter of the
capacity) laid out the same way, then random 4 KiB QD32 writes for --seconds/4:
the stack's IOPS and latency baseline.

One JSON file per stack goes to --out (schema in bench/README.md), with fio's
final JSON report of each phase beside it in OUT/fio/. bench/steady_report.py
turns such files (from here and from `lograid bench --workloads steady`) into
tables and charts.

Run as root:  python3 bench/steady.py --member-size 4G --seconds 120 --out DIR
Smoke test:   python3 bench/steady.py --quick --out /tmp/steady-quick
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stacks import BtrfsStack, Interrupted, MIN_MEMBERS, log, parse_size  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
PATTERNS = {
    "uniform": [],
    "skewed": ["--random_distribution=zoned:90/10:10/90"],
}
TIMELINE_STEP = 5.0     # seconds per timeline point
SAMPLE_EVERY = 0.5      # member counter sampling period, seconds


# ----- machine description ---------------------------------------------------------

def machine_string():
    """'CPU model, N cores, X GiB RAM', as `lograid bench` writes it."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return "%s, %d cores, %.1f GiB RAM" % (model, os.cpu_count(), mem / GiB)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# ----- fio ---------------------------------------------------------------------------

def fio_json_objects(text):
    """All top-level JSON objects in fio's stdout (status reports, then the final one).

    fio may print warnings between them; every object starts with '{' at the
    start of a line."""
    dec = json.JSONDecoder()
    objs, i = [], 0
    while True:
        j = text.find("{", i)
        if j < 0:
            return objs
        if j > 0 and text[j - 1] != "\n":
            i = j + 1
            continue
        try:
            obj, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        if isinstance(obj, dict) and "jobs" in obj:
            objs.append(obj)


class Sampler(threading.Thread):
    """Timer thread: (wall time, member bytes written, btrfs transaction commits so
    far) every SAMPLE_EVERY seconds."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack = stack
        self.samples = []
        self.stop_event = threading.Event()

    def sample(self):
        self.samples.append((time.time(), self.stack.member_bytes_written(),
                             self.stack.commit_stats().get("commits", 0)))

    def run(self):
        while not self.stop_event.wait(SAMPLE_EVERY):
            self.sample()

    def stop(self):
        self.stop_event.set()
        self.join()
        self.sample()


def run_fio(stack, args, out_path, timeout):
    """Run fio under the stack (so teardown kills it on a signal); keep its final
    JSON report in out_path; return (status reports, final report, fio's stderr).
    Raises if fio printed no JSON."""
    cmd = ["fio", "--output-format=json"] + args
    with open(out_path + ".stdout", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        stack.children.append(proc)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            _, err = proc.communicate()
            err = (err or "") + "\n(fio killed after %d s)" % timeout
        stack.children.remove(proc)
    with open(out_path + ".stdout") as f:
        text = f.read()
    os.unlink(out_path + ".stdout")
    objs = fio_json_objects(text)
    if not objs:
        raise RuntimeError("fio printed no JSON (rc %s): %s %s" % (proc.returncode, err.strip(), text[-500:]))
    with open(out_path, "w") as f:
        json.dump(objs[-1], f, indent=1)
    return objs[:-1], objs[-1], (err or "").strip()


def job_error(final):
    """fio's error for the (single) job, or None."""
    job = final["jobs"][0]
    if job.get("error"):
        return "fio error %d (%s)" % (job["error"], os.strerror(job["error"]))
    return None


def fill(stack, path, size, engine, fio_dir, tag):
    """Sequential 1 MiB O_DIRECT writes of `size` bytes into `path`, then syncfs.
    Returns a dict with the phase's time, bytes and WA (or raises on failure)."""
    m0, t0 = stack.member_bytes_written(), time.time()
    _, final, err = run_fio(stack, [
        "--name=fill", "--filename=" + path, "--size=%d" % size, "--rw=write", "--bs=1M",
        "--direct=1", "--ioengine=" + engine, "--iodepth=8", "--fallocate=none",
        "--end_fsync=1"], os.path.join(fio_dir, tag + "-fill.json"), timeout=3600)
    stack.sync()
    secs, member = time.time() - t0, stack.member_bytes_written() - m0
    written = final["jobs"][0]["write"]["io_bytes"]
    e = job_error(final)
    if e or written < size:
        raise RuntimeError("fill stopped at %d of %d bytes: %s %s" % (written, size, e or "", err))
    log("  filled %.2f GiB in %.1f s (%.0f MB/s), fill WA %.3f"
        % (written / GiB, secs, written / secs / 1e6, member / written))
    return {"fill_seconds": round(secs, 2), "fill_bytes": written, "fill_wa": round(member / written, 4)}


def interp(series, t):
    """Linear interpolation in [(t, value), ...] sorted by t; clamps at both ends."""
    if t <= series[0][0]:
        return series[0][1]
    for (ta, va), (tb, vb) in zip(series, series[1:]):
        if t <= tb:
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
    return series[-1][1]


def last_before(series, t):
    """Value of the last sample at or before t in [(t, value), ...] (the first if none)."""
    v = series[0][1]
    for ts, vs in series:
        if ts > t:
            break
        v = vs
    return v


def overwrite(stack, path, size, seconds, pattern, engine, fio_dir, tag):
    """Random 4 KiB QD32 overwrites of the first `size` bytes of `path` for
    `seconds`, then syncfs; returns the measured figures (schema of a run)."""
    sampler = Sampler(stack)
    sampler.sample()                         # baseline, just before fio starts
    sampler.start()
    try:
        status, final, err = run_fio(stack, [
            "--name=overwrite", "--filename=" + path, "--size=%d" % size, "--rw=randwrite",
            "--bs=4k", "--direct=1", "--ioengine=" + engine, "--iodepth=32", "--numjobs=1",
            "--time_based", "--runtime=%d" % seconds, "--norandommap", "--randrepeat=0",
            "--fallocate=none", "--status-interval=1", "--percentile_list=50:99:99.9",
        ] + PATTERNS[pattern], os.path.join(fio_dir, tag + ".json"), timeout=seconds + 600)
    finally:
        sampler.stop()
    t_fio_end = time.time()
    stack.sync()
    m_end = stack.member_bytes_written()
    c_end = stack.commit_stats()
    t_sync = time.time() - t_fio_end

    job = final["jobs"][0]
    w = job["write"]
    runtime = job["job_runtime"] / 1000.0
    user = w["io_bytes"]
    # fio's clock: every JSON report has a wall-clock stamp and the job's runtime so far.
    t0 = final["timestamp_ms"] / 1000.0 - runtime
    fio_series = [(t0, 0, 0)] + [(o["timestamp_ms"] / 1000.0, o["jobs"][0]["write"]["io_bytes"],
                                  o["jobs"][0]["write"]["total_ios"]) for o in status]
    fio_series.append((t0 + runtime, user, w["total_ios"]))
    fio_bytes = [(t, b) for t, b, _ in fio_series]
    fio_ios = [(t, n) for t, _, n in fio_series]
    members = [(t, b) for t, b, _ in sampler.samples]
    commits = [(t, c) for t, _, c in sampler.samples]
    member = m_end - members[0][1]           # from just before fio until after the sync

    timeline = []
    k = 1
    while k * TIMELINE_STEP <= runtime + 1e-6:
        a, b = t0 + (k - 1) * TIMELINE_STEP, t0 + k * TIMELINE_STEP
        du = interp(fio_bytes, b) - interp(fio_bytes, a)
        dm = interp(members, b) - interp(members, a)
        dn = interp(fio_ios, b) - interp(fio_ios, a)
        # commits: btrfs transaction commits that ended in the interval (by the
        # 0.5 s samples; metadata reaches the members at commits).
        dc = last_before(commits, b) - last_before(commits, a)
        timeline.append({"t": k * TIMELINE_STEP, "iops": round(dn / TIMELINE_STEP, 1),
                         "wa": round(dm / du, 4) if du > 0 else None, "commits": dc})
        k += 1

    # Last third: from 2/3 of the run to its end (members: to the end of the sync).
    t_2_3 = t0 + runtime * 2 / 3
    u_last = user - interp(fio_bytes, t_2_3)
    m_last = m_end - interp(members, t_2_3)
    pct = w["clat_ns"].get("percentile", {})

    def us(key):
        return round(pct[key] / 1000.0, 1) if key in pct else None

    res = {
        "user_bytes": user,
        "member_bytes": member,
        "wa": round(member / user, 4) if user else None,
        "wa_last_third": round(m_last / u_last, 4) if u_last > 0 else None,
        "iops": round(w["total_ios"] / runtime, 1) if runtime else 0,
        "p50_us": us("50.000000"), "p99_us": us("99.000000"), "p999_us": us("99.900000"),
        "seconds": round(runtime, 2),
        "sync_seconds": round(t_sync, 2),
        "commits": c_end.get("commits", 0) - sampler.samples[0][2],
        "timeline": timeline,
    }
    e = job_error(final)
    if e:
        res["error"] = "%s after %.1f s%s" % (e, runtime, (": " + err) if err else "")
    return res


# ----- the experiment ----------------------------------------------------------------

def one_run(a, fill_frac, pattern, seconds, size_for):
    """Fresh stack; fill a file of size_for(capacity) bytes; overwrite; teardown.
    Returns (capacity, loop direct-io flag, run dict)."""
    with BtrfsStack(a.profile, a.members, a.member_size, a.dir, a.metadata) as st:
        cap = st.capacity_bytes()
        file_size = size_for(cap) // MiB * MiB
        tag = "%s-%s-%s" % (st.name, "empty" if fill_frac is None else "fill%g" % fill_frac, pattern)
        log("%s: capacity %.2f GiB, file %.2f GiB, %d s of random 4 KiB writes"
            % (tag, cap / GiB, file_size / GiB, seconds))
        path = os.path.join(st.mountpoint, "steady.dat")
        run = {"fill": fill_frac, "pattern": pattern, "file_bytes": file_size,
               "load_before": loadavg()}
        try:
            run.update(fill(st, path, file_size, a.ioengine, a.fio_dir, tag))
        except RuntimeError as e:
            log("  fill failed: %s" % e)
            run["error"] = "fill: %s" % e
            return cap, st.direct_io, run
        run.update(overwrite(st, path, file_size, seconds, pattern, a.ioengine, a.fio_dir, tag))
        run["load_after"] = loadavg()
        u = st.usage()
        run["usage_after"] = {k: u.get(k) for k in ("Used", "Free (estimated)", "Device allocated")}
        log("  %s: WA %.3f (last third %s), %.0f IOPS, p50/p99/p99.9 %s/%s/%s us%s"
            % (tag, run["wa"] or 0, run["wa_last_third"], run["iops"], run["p50_us"],
               run["p99_us"], run["p999_us"], ("  [" + run["error"] + "]") if "error" in run else ""))
        return cap, st.direct_io, run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="raid5", choices=sorted(MIN_MEMBERS),
                    help="btrfs data (and metadata) profile (default raid5)")
    ap.add_argument("--metadata", default=None, help="metadata profile (default: same as --profile)")
    ap.add_argument("--member-size", default=None, help="size of each member file (default 4G)")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--fills", default=None, help="fill levels, comma separated (default 0.5,0.75,0.9)")
    ap.add_argument("--patterns", default="uniform,skewed", help="comma separated: uniform,skewed")
    ap.add_argument("--seconds", type=int, default=None, help="overwrite phase length (default 120)")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary member files go")
    ap.add_argument("--out", required=True, help="folder for the JSON results")
    ap.add_argument("--ioengine", default="libaio", choices=["libaio", "io_uring"])
    ap.add_argument("--no-empty", action="store_true", help="skip the empty baseline run")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1G members, 6 s runs, fills 0.5,0.9 (unless given)")
    a = ap.parse_args(argv)

    a.member_size = parse_size(a.member_size or ("1G" if a.quick else "4G"))
    a.seconds = a.seconds or (6 if a.quick else 120)
    fills = [float(x) for x in (a.fills or ("0.5,0.9" if a.quick else "0.5,0.75,0.9")).split(",")]
    patterns = a.patterns.split(",")
    for p in patterns:
        if p not in PATTERNS:
            ap.error("unknown pattern %r" % p)
    if os.geteuid() != 0:
        ap.error("run as root (losetup, mkfs, mount)")
    os.makedirs(a.out, exist_ok=True)
    a.fio_dir = os.path.join(a.out, "fio")
    os.makedirs(a.fio_dir, exist_ok=True)

    fio_version = subprocess.run(["fio", "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    probe = BtrfsStack(a.profile, a.members, a.member_size, a.dir, a.metadata)
    probe.check_space()                      # refuse before doing anything
    result = {
        "stack": probe.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_string(), "members": a.members, "member_size": a.member_size,
        "capacity_bytes": None, "empty": None, "runs": [],
        "setup": {
            "mkfs": "mkfs.btrfs " + " ".join(probe.mkfs_args), "kernel": platform.release(),
            "fio": fio_version, "ioengine": a.ioengine, "iodepth": 32, "block_size": 4096,
            "seconds": a.seconds, "empty_seconds": max(a.seconds // 4, 2),
            "capacity_source": "btrfs filesystem usage -b: 'Free (estimated)' on the fresh filesystem",
            "wa_definition": "member sectors written (/sys/block/loopN/stat field 7 x 512) from the "
                             "start of fio to the end of the syncfs after it / bytes fio wrote",
            "skewed": PATTERNS["skewed"][0],
        },
    }
    out_file = os.path.join(a.out, probe.name + ".json")

    def save():
        with open(out_file, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

    t_start = time.time()
    if not a.no_empty:
        # Baseline: 1 GiB (at most a quarter of the capacity), laid out, then overwritten.
        cap, dio, run = one_run(a, None, "uniform", result["setup"]["empty_seconds"],
                                lambda c: min(GiB, c // 4))
        result["capacity_bytes"] = cap
        result["setup"]["loop_direct_io"] = dio
        result["empty"] = {k: run.get(k) for k in ("iops", "p50_us", "p99_us", "p999_us", "wa",
                                                   "user_bytes", "member_bytes", "file_bytes",
                                                   "seconds", "error") if k in run}
        save()
    for f in fills:
        for p in patterns:
            cap, dio, run = one_run(a, f, p, a.seconds, lambda c, f=f: int(c * f))
            result["capacity_bytes"] = result["capacity_bytes"] or cap
            result["setup"]["loop_direct_io"] = dio
            if cap != result["capacity_bytes"]:
                run["capacity_bytes"] = cap
            result["runs"].append(run)
            save()                           # keep what we have if a later run dies
    log("done in %.0f s: %s" % (time.time() - t_start, out_file))


if __name__ == "__main__":
    try:
        main()
    except (Interrupted, KeyboardInterrupt) as e:
        # The stack was already torn down by its `with` block; results so far are saved.
        log("interrupted (%s); stack torn down" % (e or "SIGINT"))
        sys.exit(130)
