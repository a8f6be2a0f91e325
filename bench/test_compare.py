"""Tests of bench/compare.py, the runner: planning, the ETA, which stacks run,
argument errors, memory settling and the sysctl bookkeeping. No root, no
devices, a few seconds.

    python3 -m unittest discover -s bench -p 'test_*.py'    (or: python3 bench/compare.py --self-test)
"""

import contextlib
import glob
import io
import json
import os
import signal
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import report  # noqa: E402
from test_report import PATH_REF_RUNS, run_rec, write_old_results_folder  # noqa: E402


class Planning(unittest.TestCase):
    def test_plan_interleaves_and_rotates(self):
        steps = compare.plan(2, ["many-files", "bonnie"], ["s1", "s2", "s3"])
        self.assertEqual(steps[:3], [(1, "many-files", "s1"), (1, "many-files", "s2"), (1, "many-files", "s3")])
        self.assertEqual([s for _, e, s in steps if e == "bonnie"], ["s1", "s2", "s3"])   # rep 1 only
        self.assertEqual([s for r, e, s in steps if r == 2], ["s2", "s3", "s1"])

    def test_eta(self):
        eta = compare.Eta({"many-files": 100, "random-writes": 50})
        steps = [(1, "many-files", "x"), (1, "many-files", "y"), (1, "random-writes", "x")]
        self.assertEqual(eta.remaining(steps), 250)
        eta.add("many-files", "x", 10)
        self.assertEqual(eta.remaining(steps), 10 + 10 + 50)      # y: mean of many-files so far
        eta.add("many-files", "y", 30)
        self.assertEqual(eta.estimate("many-files", "z"), 20)

    def test_available_stacks(self):
        keys, skipped = compare.available_stacks(3, zfs_check=lambda: (False, "zfs-fuse is not installed"),
                                                 nbdkit_check=lambda: (True, ""))
        self.assertEqual(keys, ["lograid-p1", "lograid-p0", "btrfs-raid5", "btrfs-raid0", "bare", "ram-ext4", "path-ref"])
        self.assertIn("4 members", skipped["lograid-p2"])
        self.assertEqual(compare.leave_out_opt_in(keys, skipped),
                         ["lograid-p1", "lograid-p0", "btrfs-raid5", "btrfs-raid0", "bare", "path-ref"])
        self.assertIn("named in --stacks", skipped["ram-ext4"])
        self.assertEqual(skipped["zfs-raidz1"], "zfs-fuse is not installed")
        keys, _ = compare.available_stacks(4, zfs_check=lambda: (True, ""))
        self.assertIn("lograid-p2", keys)
        self.assertIn("btrfs-raid6", keys)
        self.assertIn("zfs-stripe", keys)


class PathRef(unittest.TestCase):
    """The attach path over nbdkit memory: planned for the filesystem experiments only,
    skipped without nbdkit, in the ratio tables beside lograid and btrfs, no WA."""

    RUNS = PATH_REF_RUNS

    def test_available_needs_nbdkit(self):
        keys, skipped = compare.available_stacks(3, zfs_check=lambda: (False, "no"),
                                                 nbdkit_check=lambda: (False, "nbdkit is not installed"))
        self.assertNotIn("path-ref", keys)
        self.assertEqual(skipped["path-ref"], "nbdkit is not installed")
        # It has no members: it does not depend on --members.
        keys, _ = compare.available_stacks(2, zfs_check=lambda: (False, "no"), nbdkit_check=lambda: (True, ""))
        self.assertIn("path-ref", keys)

    def test_skips_block_experiments(self):
        for exp in ("random-writes", "degraded-reads"):
            self.assertIn("attach path", compare.exp_skip("path-ref", exp))
        for exp in ("many-files", "small-files", "bonnie"):
            self.assertIsNone(compare.exp_skip("path-ref", exp))
        for key in ("lograid-p1", "btrfs-raid5", "bare"):
            for exp in compare.EXPERIMENTS:
                self.assertIsNone(compare.exp_skip(key, exp))

    def test_plan_leaves_out_skipped_pairs(self):
        stacks = ["lograid-p1", "path-ref", "btrfs-raid5"]
        exps = ["many-files", "random-writes", "small-files", "degraded-reads"]
        steps = compare.plan(2, exps, stacks, skip=compare.exp_skip)
        ref = [(r, e) for r, e, s in steps if s == "path-ref"]
        self.assertEqual(ref, [(1, "many-files"), (1, "small-files"), (2, "many-files"), (2, "small-files")])
        self.assertEqual(len([1 for _, e, _ in steps if e == "random-writes"]), 4)          # the other two, twice
        # Rotation is that of the full list: rep 2 starts with path-ref in many-files, with btrfs
        # in random-writes.
        self.assertEqual([s for r, e, s in steps if r == 2 and e == "many-files"],
                         ["path-ref", "btrfs-raid5", "lograid-p1"])
        self.assertEqual([s for r, e, s in steps if r == 2 and e == "random-writes"], ["btrfs-raid5", "lograid-p1"])
        self.assertEqual(compare.plan(2, ["many-files"], stacks),
                         compare.plan(2, ["many-files"], stacks, skip=compare.exp_skip))

    def test_exp_skips_and_grouping(self):
        per = compare.exp_skips(["lograid-p1", "path-ref"],
                                ["many-files", "random-writes", "small-files", "degraded-reads"])
        self.assertEqual(list(per), ["path-ref"])
        self.assertEqual(sorted(per["path-ref"]), ["degraded-reads", "random-writes"])
        groups = report.group_reasons(per["path-ref"])
        self.assertEqual(len(groups), 1)
        self.assertEqual(groups[0][1], ["random-writes", "degraded-reads"])
        self.assertEqual(compare.exp_skips(["path-ref"], ["many-files"]), {})

    def test_size_is_the_raw_member_size(self):
        self.assertEqual(compare.path_ref_size(3, 4 << 30), 12 << 30)
        self.assertEqual(compare.path_ref_size(3, (1 << 30) + 123), 3 << 30)       # whole MiB

    def test_report_names_the_skip(self):
        with tempfile.TemporaryDirectory() as d:
            setup = {"options": {"members": 3, "member_size": 4 << 30, "reps": 2, "many_files_count": 150,
                                 "dirty_bytes": 512 << 20, "dirty_background_bytes": 128 << 20},
                     "stacks": [{"key": "path-ref", "describe": "nbdkit memory"}], "skipped": {},
                     "skipped_exps": compare.exp_skips(["path-ref"], compare.EXPERIMENTS),
                     "machine": {"summary": "test", "versions": {}}}
            runs = self.RUNS + [run_rec("random-writes", "lograid-p1", 1, **{"rand4k-qd32_iops": 5.0})]
            md = report.write_report(d, setup, runs)
            self.assertEqual(md.count("| attach path over nbdkit memory | not run in random-writes, degraded-reads: "),
                             1)
            b = md[md.index("## random-writes:"):]
            self.assertIn("Not run here: attach path over nbdkit memory (random-writes and degraded-reads do not "
                          "use", b)
            a = md[md.index("## many-files:"):md.index("## random-writes:")]
            self.assertNotIn("Not run here", a)
            with open(os.path.join(d, "many-files.svg")) as f:
                svg = f.read()
            self.assertIn(report.COLOURS["path-ref"], svg)
            self.assertIn("attach path over nbdkit memory", svg)


class CpuTable(unittest.TestCase):
    def test_delta(self):
        d = compare.cpu_delta({"machine": 10.0, "server": 1.0, "nbdfuse": None},
                              {"machine": 13.5, "server": 2.25, "nbdfuse": 4.0})
        self.assertEqual(d, {"machine": 3.5, "server": 1.25, "nbdfuse": None})


class Arguments(unittest.TestCase):
    def parse_error(self, argv, free=None):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            compare.parse_args(argv, stat_free=(lambda _: free) if free is not None else None)
        self.assertEqual(cm.exception.code, 2)
        return err.getvalue()

    def test_defaults(self):
        a = compare.parse_args([])
        self.assertEqual((a.members, a.member_size, a.reps), (3, 4 << 30, 3))
        self.assertEqual(a.dirty_bytes, 512 << 20)
        self.assertGreaterEqual(a.many_files_count * compare.MANY_FILES_FILE_BYTES, 3 * a.dirty_bytes)
        self.assertEqual(a.exps, compare.EXPERIMENTS)
        self.assertEqual((a.path_ref_allocator, a.path_ref_warmup), ("sparse", 0))
        self.assertTrue(a.out.endswith(os.path.join("results", "compare-" + __import__("time").strftime("%Y-%m-%d"))))

    def test_quick(self):
        a = compare.parse_args(["--quick"])
        self.assertEqual((a.reps, a.member_size, a.random_writes_seconds), (1, 1 << 30, 3))
        self.assertGreaterEqual(a.many_files_count * compare.MANY_FILES_FILE_BYTES, 3 * a.dirty_bytes)

    def test_errors(self):
        self.assertIn("--device is not implemented", self.parse_error(["--device", "/dev/sdb"]))
        self.assertIn("--members must be at least 2", self.parse_error(["--members", "1"]))
        self.assertIn("unknown stack", self.parse_error(["--stacks", "lograid-p1,md-raid5"]))
        self.assertIn("unknown experiment", self.parse_error(["--experiments", "many-files,Z"]))
        self.assertIn("less than 3 x --dirty-bytes", self.parse_error(["--many-files-count", "10"]))
        self.assertIn("bad size", self.parse_error(["--member-size", "lots"]))
        self.assertIn("does not fit", self.parse_error(["--member-size", "1G", "--random-writes-size", "2G"]))
        self.assertIn("--reps must be at least 1", self.parse_error(["--reps", "0"]))
        self.assertIn("not enough space", self.parse_error([], free=5 << 30))
        self.assertIn("not both", self.parse_error(["--bsrange", "4k-64k", "--bssplit", "4k/100"]))
        self.assertIn("--path-ref-warmup must be at least 0", self.parse_error(["--path-ref-warmup", "-1"]))
        self.assertIn("invalid choice", self.parse_error(["--path-ref-allocator", "zstd"]))

    def test_space_ok(self):
        a = compare.parse_args(["--quick"], stat_free=lambda _: 100 << 30)
        self.assertEqual(a.members, 3)


class FakeSysctls(compare.Sysctls):
    """The kernel's coupling: writing dirty_bytes zeroes dirty_ratio and vice versa."""

    def __init__(self, values):
        super().__init__(root="/nonexistent")
        self.values = dict(values)
        self.writes = []

    def read(self, key):
        return str(self.values[key])

    def write(self, key, value):
        self.writes.append((key, str(value)))
        self.values[key] = str(value)
        partner = {b: r for b, r in self.PAIRS}
        partner.update({r: b for b, r in self.PAIRS})
        self.values[partner[key]] = "0"


class SettleMemory(unittest.TestCase):
    """settle_memory() waits for the page-reporting counter to stand still."""

    def test_without_page_reporting_it_only_drops_the_caches(self):
        dropped = []
        waited = compare.settle_memory(path="/nonexistent/reported_kib", drop=lambda: dropped.append(1))
        self.assertEqual((waited, dropped), (0.0, [1]))

    def test_waits_until_the_counter_stops_moving(self):
        import threading
        import time
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "reported_kib")
            with open(path, "w") as f:
                f.write("0\n")
            stop = time.time() + 1.0

            def report():
                n = 0
                while time.time() < stop:
                    n += 1
                    with open(path, "w") as f:
                        f.write("%d\n" % n)
                    time.sleep(0.1)
            t = threading.Thread(target=report)
            t.start()
            waited = compare.settle_memory(quiet_s=0.5, limit_s=10, path=path, drop=lambda: None)
            t.join()
            self.assertGreaterEqual(waited, 1.4)     # 1 s of reports, then 0.5 s still
            self.assertLess(waited, 5)
            # The limit holds even when the quiet time would be longer.
            self.assertLess(compare.settle_memory(quiet_s=5, limit_s=0.6, path=path, drop=lambda: None), 1.5)


class WarmMemory(unittest.TestCase):
    def test_writes_the_bytes_and_leaves_nothing_behind(self):
        with tempfile.TemporaryDirectory() as d:
            seen = []
            real_unlink = os.unlink

            def unlink(path):
                seen.append(os.path.getsize(path))
                real_unlink(path)
            old, os.unlink = os.unlink, unlink
            try:
                compare.warm_memory(100 << 20 | 12345, where=d)
            finally:
                os.unlink = old
            self.assertEqual(seen, [100 << 20 | 12345])
            self.assertEqual(os.listdir(d), [])


class SysctlRestore(unittest.TestCase):
    def test_ratio_mode_restored(self):
        s = FakeSysctls({"vm/dirty_bytes": "0", "vm/dirty_background_bytes": "0",
                         "vm/dirty_ratio": "20", "vm/dirty_background_ratio": "10"})
        with contextlib.redirect_stderr(io.StringIO()):
            s.set_dirty(512 << 20, 128 << 20)
            self.assertEqual(s.values["vm/dirty_ratio"], "0")
            self.assertEqual(s.restore(), [])
        self.assertEqual(s.values, {"vm/dirty_bytes": "0", "vm/dirty_background_bytes": "0",
                                    "vm/dirty_ratio": "20", "vm/dirty_background_ratio": "10"})

    def test_bytes_mode_restored(self):
        orig = {"vm/dirty_bytes": "1000000", "vm/dirty_background_bytes": "0",
                "vm/dirty_ratio": "0", "vm/dirty_background_ratio": "7"}
        s = FakeSysctls(orig)
        with contextlib.redirect_stderr(io.StringIO()):
            s.set_dirty(64 << 20, 16 << 20)
            s.set_dirty(32 << 20, 8 << 20)          # a second set keeps the first saved values
            self.assertEqual(s.restore(), [])
        self.assertEqual(s.values, orig)

    def test_restore_without_set_is_a_no_op(self):
        s = FakeSysctls({k: "1" for k in compare.Sysctls.KEYS})
        self.assertEqual(s.restore(), [])
        self.assertEqual(s.writes, [])


class ChooseStacks(unittest.TestCase):
    """Which stacks run: what the host has, narrowed by --stacks, opt-in stacks only
    when named."""

    HAVE = (["lograid-p1", "btrfs-raid5", "bare", "ram-ext4"], {"zfs-raidz1": "zfs-fuse is not installed"})

    def choose(self, argv):
        a = compare.parse_args(argv + ["--lograid", "/bin/true"])
        with mock.patch.object(compare, "available_stacks", lambda members: (list(self.HAVE[0]),
                                                                             dict(self.HAVE[1]))):
            return compare.choose_stacks(a)

    def test_default_leaves_out_the_opt_in_stacks(self):
        keys, skipped = self.choose([])
        self.assertEqual(keys, ["lograid-p1", "btrfs-raid5", "bare"])
        self.assertIn("named in --stacks", skipped["ram-ext4"])

    def test_named_stacks(self):
        keys, skipped = self.choose(["--stacks", "ram-ext4,btrfs-raid5,zfs-raidz1,btrfs-raid6"])
        self.assertEqual(keys, ["btrfs-raid5", "ram-ext4"])
        self.assertEqual(skipped["lograid-p1"], "not in --stacks")
        self.assertEqual(skipped["zfs-raidz1"], "zfs-fuse is not installed")
        self.assertEqual(skipped["btrfs-raid6"], "not available")

    def test_lograid_needs_its_binary(self):
        a = compare.parse_args(["--lograid", "/nonexistent/lograid"])
        err = io.StringIO()
        with mock.patch.object(compare, "available_stacks", lambda members: (["lograid-p1"], {})), \
                contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            compare.choose_stacks(a)
        self.assertIn("no lograid binary", err.getvalue())


class FakeStack:
    """Stands in for a stacks.py stack: comes up and goes down, and says so."""

    def __init__(self, key, events):
        self.name, self.events = key, events
        self.member_names, self.direct_io = ["m0", "m1"], True

    def describe(self):
        return "fake " + self.name

    def __enter__(self):
        self.events.append(("up", self.name))
        return self

    def __exit__(self, *exc):
        self.events.append(("down", self.name))
        return False


class MainLoop(unittest.TestCase):
    """main() from the options to the report, with fake stacks, experiments and kernel
    settings: the steps run in order, each stack is torn down, every run is recorded,
    the settings and signal handlers are put back, and the report is written."""

    SYSCTLS = {"vm/dirty_bytes": "0", "vm/dirty_background_bytes": "0",
               "vm/dirty_ratio": "20", "vm/dirty_background_ratio": "10"}

    def run_main(self, out, experiment, stderr=None):
        self.events = []
        self.sysctls = FakeSysctls(self.SYSCTLS)
        fakes = {e: experiment for e in compare.EXPERIMENTS}
        argv = ["--quick", "--reps", "2", "--stacks", "bare,btrfs-raid5", "--experiments", "many-files,random-writes",
                "--out", out]
        stdout = io.StringIO()
        with contextlib.ExitStack() as patches:
            patches.enter_context(mock.patch("os.geteuid", return_value=0))
            patches.enter_context(mock.patch("shutil.which", return_value="/bin/true"))
            patches.enter_context(mock.patch.object(compare, "free_bytes", lambda _: 1 << 50))
            patches.enter_context(mock.patch.object(compare, "available_stacks",
                                                    lambda members: (["btrfs-raid5", "bare"], {})))
            patches.enter_context(mock.patch.object(compare, "machine_details",
                                                    lambda a: {"summary": "test", "versions": {}}))
            patches.enter_context(mock.patch.object(compare, "make_stack",
                                                    lambda ctx, key, exp, tag: FakeStack(key, self.events)))
            patches.enter_context(mock.patch.object(compare, "EXP_FUNCS", fakes))
            patches.enter_context(mock.patch.object(compare, "Sysctls", lambda: self.sysctls))
            patches.enter_context(contextlib.redirect_stderr(stderr or io.StringIO()))
            patches.enter_context(contextlib.redirect_stdout(stdout))
            status = compare.main(argv)
        with open(os.path.join(out, "setup.json")) as f:
            setup = json.load(f)
        runs = {}
        for p in glob.glob(os.path.join(out, "raw", "*.json")):
            with open(p) as f:
                runs[os.path.basename(p)[:-len(".json")]] = json.load(f)
        return status, setup, runs, stdout.getvalue()

    def check_restored(self):
        self.assertEqual(self.sysctls.values, self.SYSCTLS)
        self.assertIs(signal.getsignal(signal.SIGTERM), self.handler)

    def setUp(self):
        self.handler = signal.getsignal(signal.SIGTERM)

    def test_every_step_runs_and_is_reported(self):
        def experiment(ctx, stack, tag):
            return {"manyfiles_MBps": 100.0, "rand4k-qd32_iops": 5.0}, {"tag": tag}
        with tempfile.TemporaryDirectory() as out:
            status, setup, runs, stdout = self.run_main(out, experiment)
            self.assertEqual(status, 0)
            self.assertEqual(sorted(runs), ["%s-%s-r%d" % (e, s, r) for e in ("many-files", "random-writes")
                                            for s in ("bare", "btrfs-raid5") for r in (1, 2)])
            rec = runs["many-files-bare-r2"]
            self.assertEqual((rec["exp"], rec["stack"], rec["rep"], rec["error"]), ("many-files", "bare", 2, None))
            self.assertEqual(rec["details"], {"tag": "many-files-bare-r2"})
            self.assertEqual(rec["setup"]["describe"], "fake bare")
            # The stacks in table order, rotated by one in repetition 2; every one torn down.
            ups = [name for what, name in self.events if what == "up"]
            self.assertEqual(ups, ["btrfs-raid5", "bare"] * 2 + ["bare", "btrfs-raid5"] * 2)
            self.assertEqual(len([1 for what, _ in self.events if what == "down"]), 8)
            self.assertEqual([s["key"] for s in setup["stacks"]], ["btrfs-raid5", "bare"])
            self.assertIn("finished", setup)
            self.assertIn("end", setup["load"])
            self.assertEqual(setup["options"]["exps"], ["many-files", "random-writes"])
            self.assertTrue(os.path.exists(os.path.join(out, "compare.md")))
            self.assertTrue(stdout.startswith("# lograid beside its peers"))
            self.check_restored()

    def test_a_failed_run_is_recorded_and_the_others_go_on(self):
        def experiment(ctx, stack, tag):
            if tag == "random-writes-bare-r1":
                raise RuntimeError("mkfs failed")
            return {"manyfiles_MBps": 100.0}, {}
        with tempfile.TemporaryDirectory() as out:
            status, setup, runs, stdout = self.run_main(out, experiment)
            self.assertEqual(status, 0)
            self.assertEqual(len(runs), 8)
            self.assertEqual(runs["random-writes-bare-r1"]["error"], "RuntimeError: mkfs failed")
            self.assertEqual(runs["random-writes-bare-r1"]["metrics"], {})
            self.assertIn("mkfs failed", stdout)
            self.check_restored()

    def test_an_interruption_keeps_what_was_measured(self):
        def experiment(ctx, stack, tag):
            if tag == "many-files-bare-r1":
                raise compare.Interrupted("signal 15")
            return {"manyfiles_MBps": 100.0}, {}
        with tempfile.TemporaryDirectory() as out:
            status, setup, runs, stdout = self.run_main(out, experiment)
            self.assertEqual(status, 130)
            self.assertEqual(sorted(runs), ["many-files-bare-r1", "many-files-btrfs-raid5-r1"])
            self.assertEqual(runs["many-files-bare-r1"]["error"], "interrupted")
            self.assertIn("run interrupted (signal 15) before it finished", setup["notes"])
            self.assertEqual(stdout, "")
            self.assertTrue(os.path.exists(os.path.join(out, "compare.md")))
            self.check_restored()

    def test_an_existing_results_folder_is_refused(self):
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "raw"))
            open(os.path.join(out, "raw", "many-files-bare-r1.json"), "w").close()
            err = io.StringIO()
            with self.assertRaises(SystemExit):
                self.run_main(out, None, stderr=err)
            self.assertIn("already holds results", err.getvalue())


class ReportOnly(unittest.TestCase):
    def test_an_old_results_folder(self):
        """--report-only reads a folder written when the experiments were letters."""
        with tempfile.TemporaryDirectory() as d:
            write_old_results_folder(d)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(compare.main(["--report-only", d]), 0)
            self.assertTrue(os.path.exists(os.path.join(d, "many-files.svg")))
        md = out.getvalue()
        self.assertIn("## random-writes: random writes (O_DIRECT)", md)
        self.assertIn("![random-writes: random writes (O_DIRECT)](random-writes.svg)", md)


if __name__ == "__main__":
    unittest.main()
