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
  4. overwrites it for --seconds with the pattern (fio, direct=1, libaio,
     queue depth 32 in all, norandommap, randrepeat=0, 4 KiB writes), then
     syncs; meanwhile a timer thread samples the members' "sectors written"
     counters (/sys/block/loopN/stat field 7) every 0.5 s and fio prints its
     cumulative counters every second (--status-interval=1, JSON, wall-clock
     stamped). The patterns, as fio can express them:
       uniform      fio's default random offsets
       skewed       random_distribution=zoned:90/10:10/90 (90 % of the writes on
                    the first 10 % of the file)
       zipf:THETA   random_distribution=zipf:THETA (fio hashes the ranks over the file)
       moving:S     skewed's hot tenth moved every S seconds: one fio job per S
                    seconds, one after the other (stonewall), the hot tenth of job k
                    being tenth 3k mod 10 as in lograid's bench; the other 10 % of
                    the writes split between the parts before and after it in whole
                    percent (fio's zoned takes integers). moving:Nx (moves by bytes
                    written) is not supported: these runs are time-based.
       seqmix[:RUN] two jobs at once, random 4 KiB writes and sequential writes of
                    RUN bytes (256K) wrapping around the file, each queue depth 16,
                    their requests in the ratio RUN/4K : 1 (fio's flow), so that
                    each writes half the bytes; RUN at most 4M (flow weights <= 1000)
       trace:PATH   the writes of an MSR Cambridge CSV trace turned into a fio iolog
                    (offsets modulo the file's size aligned down to 4 KiB, sizes
                    rounded up, as lograid's bench does), repeated up to 4 x the
                    file's size (at most 2 million requests), replayed with
                    replay_no_stall at queue depth 32 until --seconds or its end
       sync:N       no fill: a sparse file of 0.75 x capacity, 32 writers (psync,
                    one request each in flight) of random 4 KiB writes, each with an
                    fsync after every N of its writes; flushes/s reported
  5. reports write amplification WA = member bytes written from the start of
     the overwrite phase to the end of the sync after it / bytes fio wrote;
     the same over the last third of the run (to see whether it settled);
     IOPS; p50/p99/p99.9 completion latency (fio clat, from the merged
     latency bins when the pattern has several jobs); and a timeline per 5 s
     of IOPS and WA (the two counter series interpolated at each 5 s mark).
     Unlike `lograid bench --workloads steady` these runs are time-based:
     there are no windows and no convergence rule.

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
KiB4 = 4096
PATTERN_FORMS = "uniform, skewed, zipf:THETA, moving:SECONDS, seqmix, seqmix:RUN, trace:PATH, sync:N"
SKEWED = "zoned:90/10:10/90"
TRACE_FIELDS = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime"
TRACE_MAX_REQUESTS = 2_000_000
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


# ----- patterns ------------------------------------------------------------------------

def parse_pattern(text):
    """{'name', 'kind', ...} of one --patterns item; ValueError saying what is wrong."""
    kind, _, arg = text.partition(":")
    has_arg = ":" in text
    if kind in ("uniform", "skewed") and not has_arg:
        return {"name": kind, "kind": kind}
    if kind == "zipf" and has_arg:
        try:
            theta = float(arg)
        except ValueError:
            theta = 0.0
        if not 0 < theta <= 10:
            raise ValueError("%r: THETA must be a number above 0 and at most 10 (e.g. zipf:0.99)" % text)
        return {"name": "zipf:%g" % theta, "kind": "zipf", "theta": theta}
    if kind == "moving" and has_arg:
        if arg.endswith("x"):
            raise ValueError("%r: moving:Nx (moves by bytes written) is not supported here: these runs "
                             "are time-based; use moving:SECONDS" % text)
        try:
            secs = float(arg[:-1] if arg.endswith("s") else arg)
        except ValueError:
            secs = 0.0
        if not secs >= 1:
            raise ValueError("%r: SECONDS must be a number of at least 1" % text)
        return {"name": "moving:%gs" % secs, "kind": "moving", "seconds": secs}
    if kind == "seqmix":
        try:
            run = parse_size(arg) if has_arg else 256 << 10
        except ValueError:
            raise ValueError("%r: RUN is not a size (e.g. seqmix:1M)" % text) from None
        if run < KiB4 or run % KiB4 or run > 4 * MiB:
            raise ValueError("%r: RUN must be a multiple of 4K from 4K to 4M here (fio's flow weights "
                             "go to 1000)" % text)
        return {"name": "seqmix:%dK" % (run >> 10), "kind": "seqmix", "run": run}
    if kind == "trace" and arg:
        return {"name": "trace:" + arg, "kind": "trace", "path": arg}
    if kind == "sync" and has_arg:
        if not (arg.isdigit() and int(arg) >= 1):
            raise ValueError("%r: N (writes per fsync) must be a whole number from 1" % text)
        return {"name": "sync:%d" % int(arg), "kind": "sync", "every": int(arg)}
    if kind in ("uniform", "skewed", "zipf", "moving", "trace", "sync"):
        raise ValueError("%r: expected one of %s" % (text, PATTERN_FORMS))
    raise ValueError("unknown pattern %r (%s)" % (text, PATTERN_FORMS))


def parse_patterns(text):
    pats = [parse_pattern(p.strip()) for p in text.split(",") if p.strip()]
    if not pats:
        raise ValueError("no pattern given (%s)" % PATTERN_FORMS)
    return pats


def zoned_hot_tenth(tenth):
    """fio's zoned distribution with 90 % of the accesses on tenth `tenth` (0-9) of the
    file and 10 % on the rest, split in whole percent between the parts before and
    after it in proportion to their sizes."""
    before, after = 10 * tenth, 90 - 10 * tenth
    p_before = round(10 * before / 90)
    zones = []
    if before:
        zones.append("%d/%d" % (p_before, before))
    zones.append("90/10")
    if after:
        zones.append("%d/%d" % (10 - p_before, after))
    return "zoned:" + ":".join(zones)


def random_job(name, path, size, engine, iodepth=32):
    return ["--name=" + name, "--filename=" + path, "--size=%d" % size, "--rw=randwrite", "--bs=4k",
            "--direct=1", "--ioengine=" + engine, "--iodepth=%d" % iodepth, "--norandommap",
            "--randrepeat=0", "--fallocate=none"]


def overwrite_jobs(pattern, path, size, seconds, engine, iolog=None):
    """fio's arguments for the pattern's overwrite of the first `size` bytes of `path`
    (job options only; the caller adds the global ones). Returns (args, jobs_in_sequence):
    True when the jobs run one after the other (their runtimes add up)."""
    k = pattern["kind"]
    timed = ["--time_based", "--runtime=%d" % seconds]
    if k in ("uniform", "skewed", "zipf"):
        dist = {"uniform": [], "skewed": ["--random_distribution=" + SKEWED],
                "zipf": ["--random_distribution=zipf:%g" % pattern.get("theta", 0)]}[k]
        return random_job("overwrite", path, size, engine) + dist + timed, False
    if k == "moving":
        args, left, j = [], float(seconds), 0
        while left > 1e-9:
            run = min(pattern["seconds"], left)
            args += random_job("move%d" % j, path, size, engine) + [
                "--random_distribution=" + zoned_hot_tenth(j * 3 % 10), "--time_based",
                "--runtime=%d" % max(1, round(run))] + (["--stonewall"] if j else [])
            left -= run
            j += 1
        return args, True
    if k == "seqmix":
        run = pattern["run"]
        return (random_job("random", path, size, engine, 16) + timed
                + ["--flow_id=1", "--flow=%d" % (run // KiB4)]
                + ["--name=sequential", "--filename=" + path, "--size=%d" % size, "--rw=write",
                   "--bs=%d" % run, "--direct=1", "--ioengine=" + engine, "--iodepth=16",
                   "--fallocate=none", "--flow_id=1", "--flow=1"] + timed), False
    if k == "trace":
        return ["--name=trace", "--read_iolog=" + iolog, "--replay_no_stall=1", "--direct=1",
                "--ioengine=" + engine, "--iodepth=32", "--runtime=%d" % seconds], False
    if k == "sync":
        return (random_job("sync", path, size, "psync", 1)
                + ["--numjobs=32", "--fsync=%d" % pattern["every"]] + timed), False
    raise ValueError("no fio jobs for %r" % pattern["name"])


def read_msr_trace(path):
    """The writes [(offset, size)] of an MSR Cambridge CSV trace and its read count;
    ValueError naming the line of a malformed one (the rules of lograid's bench:
    '#' lines, blank lines and a first line of column names are skipped)."""
    writes, reads = [], 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = [x.strip() for x in line.split(",")]
            if not writes and not reads and fields[0].lower() == "timestamp":
                continue
            if len(fields) != 7:
                raise ValueError("trace %s line %d: expected 7 comma-separated fields (%s), found %d"
                                 % (path, n, TRACE_FIELDS, len(fields)))
            nums = {}
            for i, name in ((0, "Timestamp"), (2, "DiskNumber"), (4, "Offset"), (5, "Size"),
                            (6, "ResponseTime")):
                if not fields[i].isdigit():
                    raise ValueError("trace %s line %d: %s %r is not a whole number"
                                     % (path, n, name, fields[i]))
                nums[name] = int(fields[i])
            if not 0 < nums["Size"] <= GiB:
                raise ValueError("trace %s line %d: Size %d is not between 1 byte and 1 GiB"
                                 % (path, n, nums["Size"]))
            op = fields[3].lower()
            if op == "write":
                writes.append((nums["Offset"], nums["Size"]))
            elif op == "read":
                reads += 1
            else:
                raise ValueError("trace %s line %d: Type %r is neither Read nor Write" % (path, n, fields[3]))
    if not writes:
        raise ValueError("trace %s: no writes in it (an empty file, or reads only: %d read(s))" % (path, reads))
    return writes, reads


def trace_request(offset, size, file_size):
    """Where a trace write goes in a file of file_size bytes: offset modulo the size,
    aligned down to 4 KiB; size rounded up to 4 KiB; moved back to fit."""
    volume = max(file_size // KiB4 * KiB4, KiB4)
    length = min(-(-size // KiB4) * KiB4, volume)
    return min(offset % volume // KiB4 * KiB4, volume - length), length


def write_iolog(writes, target, file_size, out_path, min_bytes, max_requests=TRACE_MAX_REQUESTS):
    """A fio iolog (version 2) of the writes on `target`, repeated until min_bytes are
    written or max_requests are in it. Returns (requests, bytes)."""
    n, total = 0, 0
    with open(out_path, "w") as f:
        f.write("fio version 2 iolog\n%s add\n%s open\n" % (target, target))
        while total < min_bytes and n < max_requests:
            for off, size in writes:
                o, length = trace_request(off, size, file_size)
                f.write("%s write %d %d\n" % (target, o, length))
                n, total = n + 1, total + length
                if n >= max_requests:
                    break
        f.write("%s close\n" % target)
    return n, total


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


def run_fio(stack, args, out_path, timeout, fmt="json"):
    """Run fio under the stack (so teardown kills it on a signal); keep its final
    JSON report in out_path; return (status reports, final report, fio's stderr).
    Raises if fio printed no JSON."""
    cmd = ["fio", "--output-format=" + fmt] + args
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
    """fio's error for the first job that failed, or None."""
    for job in final["jobs"]:
        if job.get("error"):
            return "fio error %d (%s)" % (job["error"], os.strerror(job["error"]))
    return None


def written(report):
    """(bytes, requests) written by all the jobs of one fio report."""
    return (sum(j["write"]["io_bytes"] for j in report["jobs"]),
            sum(j["write"]["total_ios"] for j in report["jobs"]))


def percentiles_us(jobs, points=(50, 99, 99.9)):
    """Completion latency percentiles in µs of the jobs' writes: fio's own for one job,
    else from their merged latency bins (json+ output); None where missing."""
    if len(jobs) == 1:
        pct = jobs[0]["write"]["clat_ns"].get("percentile", {})
        return [round(pct["%f" % p] / 1000.0, 1) if "%f" % p in pct else None for p in points]
    bins = {}
    for j in jobs:
        for ns, count in j["write"]["clat_ns"].get("bins", {}).items():
            bins[int(ns)] = bins.get(int(ns), 0) + count
    total = sum(bins.values())
    out = []
    for p in points:
        if not total:
            out.append(None)
            continue
        rank, seen = (total - 1) * p / 100.0, 0
        for ns in sorted(bins):
            seen += bins[ns]
            if seen > rank:
                out.append(round(ns / 1000.0, 1))
                break
    return out


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


def overwrite(stack, path, size, seconds, pattern, engine, fio_dir, tag, iolog=None):
    """The pattern's overwrite of the first `size` bytes of `path` for `seconds`, then
    syncfs; returns the measured figures (schema of a run)."""
    jobs, in_sequence = overwrite_jobs(pattern, path, size, seconds, engine, iolog)
    sampler = Sampler(stack)
    sampler.sample()                         # baseline, just before fio starts
    sampler.start()
    try:
        status, final, err = run_fio(stack, jobs + [
            "--status-interval=1", "--percentile_list=50:99:99.9"],
            os.path.join(fio_dir, tag + ".json"), timeout=seconds + 600, fmt="json+")
    finally:
        sampler.stop()
    t_fio_end = time.time()
    stack.sync()
    m_end = stack.member_bytes_written()
    c_end = stack.commit_stats()
    t_sync = time.time() - t_fio_end

    runtimes = [j["job_runtime"] / 1000.0 for j in final["jobs"]]
    runtime = sum(runtimes) if in_sequence else max(runtimes)
    user, ios = written(final)
    # fio's clock: every JSON report has a wall-clock stamp and the jobs' counters so far.
    t0 = final["timestamp_ms"] / 1000.0 - runtime
    fio_series = [(t0, 0, 0)] + [(o["timestamp_ms"] / 1000.0,) + written(o) for o in status]
    fio_series.append((t0 + runtime, user, ios))
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
    p50, p99, p999 = percentiles_us(final["jobs"])
    res = {
        "user_bytes": user,
        "member_bytes": member,
        "wa": round(member / user, 4) if user else None,
        "wa_last_third": round(m_last / u_last, 4) if u_last > 0 else None,
        "iops": round(ios / runtime, 1) if runtime else 0,
        "p50_us": p50, "p99_us": p99, "p999_us": p999,
        "seconds": round(runtime, 2),
        "sync_seconds": round(t_sync, 2),
        "commits": c_end.get("commits", 0) - sampler.samples[0][2],
        "timeline": timeline,
    }
    if pattern["kind"] == "sync":
        flushes = sum(j.get("sync", {}).get("total_ios", 0) for j in final["jobs"])
        res.update(flush_every=pattern["every"], flushes=flushes,
                   flushes_per_s=round(flushes / runtime, 1) if runtime else 0)
    e = job_error(final)
    if e:
        res["error"] = "%s after %.1f s%s" % (e, runtime, (": " + err) if err else "")
    return res


# ----- the experiment ----------------------------------------------------------------

def one_run(a, fill_frac, pattern, seconds, size_for):
    """Fresh stack; a file of size_for(capacity) bytes, filled (not for sync:N, whose
    file stays sparse); the pattern's overwrite; teardown. Returns (capacity, loop
    direct-io flag, run dict)."""
    with BtrfsStack(a.profile, a.members, a.member_size, a.dir, a.metadata) as st:
        cap = st.capacity_bytes()
        file_size = size_for(cap) // MiB * MiB
        name = pattern["name"]
        tag = "%s-%s-%s" % (st.name, "empty" if fill_frac is None else "fill%g" % fill_frac,
                            name.replace("/", "_").replace(":", "_"))
        log("%s: capacity %.2f GiB, file %.2f GiB, %d s of %s writes"
            % (tag, cap / GiB, file_size / GiB, seconds, name))
        path = os.path.join(st.mountpoint, "steady.dat")
        run = {"fill": fill_frac, "pattern": name, "file_bytes": file_size,
               "load_before": loadavg()}
        if pattern["kind"] == "sync":
            with open(path, "w") as f:
                f.truncate(file_size)           # empty: nothing written before the writers
        else:
            try:
                run.update(fill(st, path, file_size, a.ioengine, a.fio_dir, tag))
            except RuntimeError as e:
                log("  fill failed: %s" % e)
                run["error"] = "fill: %s" % e
                return cap, st.direct_io, run
        iolog = None
        if pattern["kind"] == "trace":
            iolog = os.path.join(st.workdir, "trace.iolog")
            n, total = write_iolog(a.traces[name], path, file_size, iolog, 4 * file_size)
            run["trace_requests"], run["trace_bytes"] = n, total
        run.update(overwrite(st, path, file_size, seconds, pattern, a.ioengine, a.fio_dir, tag, iolog))
        run["load_after"] = loadavg()
        u = st.usage()
        run["usage_after"] = {k: u.get(k) for k in ("Used", "Free (estimated)", "Device allocated")}
        flushes = ", %.0f flushes/s" % run["flushes_per_s"] if "flushes_per_s" in run else ""
        log("  %s: WA %.3f (last third %s), %.0f IOPS%s, p50/p99/p99.9 %s/%s/%s us%s"
            % (tag, run["wa"] or 0, run["wa_last_third"], run["iops"], flushes, run["p50_us"],
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
    ap.add_argument("--patterns", default="uniform,skewed",
                    help="comma separated: " + PATTERN_FORMS + " (see above)")
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
    try:
        patterns = parse_patterns(a.patterns)
        a.traces = {p["name"]: read_msr_trace(p["path"])[0] for p in patterns if p["kind"] == "trace"}
    except (ValueError, OSError) as e:
        ap.error("--patterns: %s" % e)
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
            "skewed": "random_distribution=" + SKEWED,
            "patterns": [p["name"] for p in patterns],
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
        cap, dio, run = one_run(a, None, parse_pattern("uniform"), result["setup"]["empty_seconds"],
                                lambda c: min(GiB, c // 4))
        result["capacity_bytes"] = cap
        result["setup"]["loop_direct_io"] = dio
        result["empty"] = {k: run.get(k) for k in ("iops", "p50_us", "p99_us", "p999_us", "wa",
                                                   "user_bytes", "member_bytes", "file_bytes",
                                                   "seconds", "error") if k in run}
        save()
    # Overwrites at each fill, then sync:N once each on an empty file of 0.75 x capacity.
    points = [(f, p) for f in fills for p in patterns if p["kind"] != "sync"]
    points += [(None, p) for p in patterns if p["kind"] == "sync"]
    for f, p in points:
        size_for = (lambda c: int(c * 0.75)) if f is None else (lambda c, f=f: int(c * f))
        cap, dio, run = one_run(a, f, p, a.seconds, size_for)
        result["capacity_bytes"] = result["capacity_bytes"] or cap
        result["setup"]["loop_direct_io"] = dio
        if cap != result["capacity_bytes"]:
            run["capacity_bytes"] = cap
        result["runs"].append(run)
        save()                               # keep what we have if a later run dies
    log("done in %.0f s: %s" % (time.time() - t_start, out_file))


if __name__ == "__main__":
    try:
        main()
    except (Interrupted, KeyboardInterrupt) as e:
        # The stack was already torn down by its `with` block; results so far are saved.
        log("interrupted (%s); stack torn down" % (e or "SIGINT"))
        sys.exit(130)
