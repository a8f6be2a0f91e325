"""Self-test of bench/compare.py: statistics, ratios, tables, charts, argument
errors and the sysctl bookkeeping. No root, no devices, a few seconds.

    python3 -m unittest bench/test_compare.py      (or: python3 bench/compare.py --self-test)
"""

import contextlib
import io
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def run_rec(exp, stack, rep, **metrics):
    return {"exp": exp, "stack": stack, "rep": rep, "metrics": metrics, "error": None}


# Three repetitions of A and B on three stacks, with a missing value and a failed run.
RUNS = [
    run_rec("A", "lograid-p1", 1, manyfiles_MBps=500.0, manyfiles_wa=1.53),
    run_rec("A", "lograid-p1", 2, manyfiles_MBps=400.0, manyfiles_wa=1.54),
    run_rec("A", "lograid-p1", 3, manyfiles_MBps=450.0, manyfiles_wa=1.52),
    run_rec("A", "btrfs-raid5", 1, manyfiles_MBps=250.0, manyfiles_wa=1.50),
    run_rec("A", "btrfs-raid5", 2, manyfiles_MBps=400.0, manyfiles_wa=1.50),
    run_rec("A", "btrfs-raid5", 3, manyfiles_MBps=300.0, manyfiles_wa=1.51),
    run_rec("A", "btrfs-raid0", 1, manyfiles_MBps=600.0, manyfiles_wa=1.0),
    run_rec("A", "btrfs-raid0", 2, manyfiles_MBps=None, manyfiles_wa=None),   # failed run
    run_rec("A", "btrfs-raid0", 3, manyfiles_MBps=500.0, manyfiles_wa=1.0),
    run_rec("B", "lograid-p1", 1, **{"rand4k-qd32_iops": 50000.0}),
    run_rec("B", "btrfs-raid5", 1, **{"rand4k-qd32_iops": 4000.0}),
]
RUNS[7]["error"] = "RuntimeError: mkfs failed"


class Statistics(unittest.TestCase):
    def test_summarize(self):
        s = compare.summarize([3, 1, None, 2, 10])
        self.assertEqual(s, {"min": 1, "median": 2.5, "max": 10, "n": 4})
        self.assertEqual(compare.summarize([7])["median"], 7)
        self.assertIsNone(compare.summarize([]))
        self.assertIsNone(compare.summarize([None, float("nan")]))

    def test_odd_median(self):
        self.assertEqual(compare.summarize([5, 1, 3])["median"], 3)

    def test_metric_values_skips_missing(self):
        self.assertEqual(compare.metric_values(RUNS, "A", "btrfs-raid0", "manyfiles_MBps"), {1: 600.0, 3: 500.0})

    def test_rep_ratios_pair_within_repetition(self):
        r = compare.rep_ratios(RUNS, "A", "manyfiles_MBps", "lograid-p1", "btrfs-raid5")
        self.assertEqual(r, [2.0, 1.0, 1.5])
        s = compare.summarize(r)
        self.assertEqual((s["min"], s["median"], s["max"]), (1.0, 1.5, 2.0))
        # Repetition 2 of raid0 failed: only 1 and 3 pair up.
        r = compare.rep_ratios(RUNS, "A", "manyfiles_MBps", "btrfs-raid5", "btrfs-raid0")
        self.assertEqual(r, [250 / 600, 300 / 500])

    def test_ratio_of_zero_denominator_is_skipped(self):
        runs = [run_rec("A", "x", 1, m=1.0), run_rec("A", "y", 1, m=0.0)]
        self.assertEqual(compare.rep_ratios(runs, "A", "m", "x", "y"), [])


class Formatting(unittest.TestCase):
    def test_cells(self):
        self.assertEqual(compare.fmt_cell(compare.summarize([400, 500, 450])), "450 (400–500)")
        self.assertEqual(compare.fmt_cell(compare.summarize([1.5, 1.52]), 2), "1.51 (1.50–1.52)")
        self.assertEqual(compare.fmt_cell(compare.summarize([12345.6])), "12,346")
        self.assertEqual(compare.fmt_cell(None), "-")
        self.assertEqual(compare.fmt_ratio(compare.summarize([2.0, 1.0, 1.5])), "1.50 (1.00–2.00)")
        self.assertEqual(compare.fmt_ratio(compare.summarize([12.5])), "12.50")

    def test_duration(self):
        self.assertEqual(compare.fmt_duration(42), "42s")
        self.assertEqual(compare.fmt_duration(125), "2m05s")
        self.assertEqual(compare.fmt_duration(3725), "1h02m")


class Tables(unittest.TestCase):
    def test_absolute_table(self):
        t = compare.absolute_table(RUNS, "A")
        lines = t.strip().splitlines()
        self.assertEqual(lines[0], "| metric | lograid P=1 | btrfs raid5 | btrfs raid0 |")
        row = next(ln for ln in lines if ln.startswith("| many 14 MiB files"))
        self.assertIn("450 (400–500)", row)
        self.assertIn("300 (250–400)", row)
        self.assertIn("550 (500–600)", row)
        # Metrics nobody measured are left out.
        self.assertNotIn("one big file", t)

    def test_ratio_table(self):
        t = compare.ratio_table(RUNS, "A")
        header = t.splitlines()[0]
        self.assertIn("btrfs raid5 / btrfs raid0", header)
        self.assertIn("lograid P=1 / btrfs raid5", header)
        self.assertNotIn("lograid P=0", header)           # no runs of P=0: no column
        row = next(ln for ln in t.splitlines() if ln.startswith("| many 14 MiB files"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        cols = [c.strip() for c in header.strip("|").split("|")]
        self.assertEqual(cells[cols.index("lograid P=1 / btrfs raid5")], "1.50 (1.00–2.00)")
        wa = next(ln for ln in t.splitlines() if ln.startswith("| many files WA"))
        self.assertIn("lower is better", wa)

    def test_headline(self):
        t = compare.headline_table(RUNS)
        row = next(ln for ln in t.splitlines() if "4 KiB QD32 (IOPS)" in ln)
        self.assertIn("50,000", row)
        self.assertIn("12.50", row)
        self.assertTrue(row.rstrip().endswith("higher |"))

    def test_report_and_charts(self):
        with tempfile.TemporaryDirectory() as d:
            setup = {"options": {"members": 3, "member_size": 4 << 30, "reps": 3, "a_files": 150,
                                 "dirty_bytes": 512 << 20, "dirty_background_bytes": 128 << 20},
                     "stacks": [{"key": "lograid-p1", "describe": "x"}], "skipped": {"zfs-raidz1": "not installed"},
                     "machine": {"summary": "test", "versions": {"fio": "fio-3.33"}}}
            md = compare.report(d, setup, RUNS)
            self.assertIn("## lograid P=1 against btrfs raid5", md)
            self.assertIn("skipped: not installed", md)
            self.assertIn("mkfs failed", md)
            for exp in ("A", "B"):
                root = ET.parse(os.path.join(d, exp + ".svg")).getroot()     # well-formed XML
                self.assertTrue(root.tag.endswith("svg"))
            self.assertFalse(os.path.exists(os.path.join(d, "C.svg")))

    def test_bonnie_csv(self):
        line = ("1.98,2.00a,bare,1,1700000000,2G,,8192,5,,,262407,20,136894,10,,,356405,15,7210,99,16,8192,4096,"
                "16,,17676,60,+++++,+++,29000,50,14873,40,+++++,+++,29113,45,,,,,,,,,,,,,")
        m = compare.parse_bonnie_csv("junk\n" + line + "\n")
        self.assertEqual(m["block_write_KBps"], 262407)
        self.assertEqual(m["rewrite_KBps"], 136894)
        self.assertEqual(m["seeks_per_s"], 7210)
        self.assertEqual(m["seq_create_per_s"], 17676)
        self.assertIsNone(m["seq_read_per_s"])              # '+++++': too fast to measure
        self.assertEqual(m["rand_delete_per_s"], 29113)
        self.assertEqual(compare.parse_bonnie_csv("nothing"), {})
        self.assertEqual(compare.bonnie_too_fast(line), ["rand_read_per_s", "seq_read_per_s"])

    def test_too_fast_cell(self):
        runs = [run_rec("bonnie", "bare", 1, seq_create_per_s=None, block_write_KBps=1000.0)]
        runs[0]["details"] = {"too_fast": ["seq_create_per_s"]}
        t = compare.absolute_table(runs, "bonnie")
        self.assertIn("| seq create (/s) | too fast |", t)


class Planning(unittest.TestCase):
    def test_plan_interleaves_and_rotates(self):
        steps = compare.plan(2, ["A", "bonnie"], ["s1", "s2", "s3"])
        self.assertEqual(steps[:3], [(1, "A", "s1"), (1, "A", "s2"), (1, "A", "s3")])
        self.assertEqual([s for _, e, s in steps if e == "bonnie"], ["s1", "s2", "s3"])   # rep 1 only
        self.assertEqual([s for r, e, s in steps if r == 2], ["s2", "s3", "s1"])

    def test_eta(self):
        eta = compare.Eta({"A": 100, "B": 50})
        steps = [(1, "A", "x"), (1, "A", "y"), (1, "B", "x")]
        self.assertEqual(eta.remaining(steps), 250)
        eta.add("A", "x", 10)
        self.assertEqual(eta.remaining(steps), 10 + 10 + 50)      # y: mean of A so far
        eta.add("A", "y", 30)
        self.assertEqual(eta.estimate("A", "z"), 20)

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

    RUNS = [run_rec("A", s, r, manyfiles_MBps=v * r, bigfile_MBps=2 * v,
                    manyfiles_wa=None if s == "path-ref" else 1.5)
            for r in (1, 2) for s, v in (("lograid-p1", 300.0), ("lograid-p0", 400.0), ("btrfs-raid5", 200.0),
                                         ("path-ref", 500.0))]

    def test_available_needs_nbdkit(self):
        keys, skipped = compare.available_stacks(3, zfs_check=lambda: (False, "no"),
                                                 nbdkit_check=lambda: (False, "nbdkit is not installed"))
        self.assertNotIn("path-ref", keys)
        self.assertEqual(skipped["path-ref"], "nbdkit is not installed")
        # It has no members: it does not depend on --members.
        keys, _ = compare.available_stacks(2, zfs_check=lambda: (False, "no"), nbdkit_check=lambda: (True, ""))
        self.assertIn("path-ref", keys)

    def test_skips_block_experiments(self):
        for exp in ("B", "D"):
            self.assertIn("attach path", compare.exp_skip("path-ref", exp))
        for exp in ("A", "C", "bonnie"):
            self.assertIsNone(compare.exp_skip("path-ref", exp))
        for key in ("lograid-p1", "btrfs-raid5", "bare"):
            for exp in compare.EXPERIMENTS:
                self.assertIsNone(compare.exp_skip(key, exp))

    def test_plan_leaves_out_skipped_pairs(self):
        stacks = ["lograid-p1", "path-ref", "btrfs-raid5"]
        steps = compare.plan(2, ["A", "B", "C", "D"], stacks, skip=compare.exp_skip)
        ref = [(r, e) for r, e, s in steps if s == "path-ref"]
        self.assertEqual(ref, [(1, "A"), (1, "C"), (2, "A"), (2, "C")])
        self.assertEqual(len([1 for _, e, _ in steps if e == "B"]), 4)          # the other two, twice
        # Rotation is that of the full list: rep 2 starts with path-ref in A, with btrfs in B.
        self.assertEqual([s for r, e, s in steps if r == 2 and e == "A"], ["path-ref", "btrfs-raid5", "lograid-p1"])
        self.assertEqual([s for r, e, s in steps if r == 2 and e == "B"], ["btrfs-raid5", "lograid-p1"])
        self.assertEqual(compare.plan(2, ["A"], stacks), compare.plan(2, ["A"], stacks, skip=compare.exp_skip))

    def test_exp_skips_and_grouping(self):
        per = compare.exp_skips(["lograid-p1", "path-ref"], ["A", "B", "C", "D"])
        self.assertEqual(list(per), ["path-ref"])
        self.assertEqual(sorted(per["path-ref"]), ["B", "D"])
        groups = compare.group_reasons(per["path-ref"])
        self.assertEqual(len(groups), 1)
        self.assertEqual(groups[0][1], ["B", "D"])
        self.assertEqual(compare.exp_skips(["path-ref"], ["A"]), {})

    def test_size_is_the_raw_member_size(self):
        self.assertEqual(compare.path_ref_size(3, 4 << 30), 12 << 30)
        self.assertEqual(compare.path_ref_size(3, (1 << 30) + 123), 3 << 30)       # whole MiB

    def test_columns_and_ratios(self):
        t = compare.absolute_table(self.RUNS, "A")
        header = t.splitlines()[0]
        self.assertTrue(header.endswith("| btrfs raid5 | attach path over nbdkit memory |"))
        wa = next(ln for ln in t.splitlines() if ln.startswith("| many files WA"))
        self.assertTrue(wa.rstrip().endswith("| - |"))                            # no members, no WA
        r = compare.ratio_table(self.RUNS, "A")
        cols = [c.strip() for c in r.splitlines()[0].strip("|").split("|")]
        for col in ("lograid P=1 / attach path over nbdkit memory", "lograid P=0 / attach path over nbdkit memory",
                    "btrfs raid5 / attach path over nbdkit memory", "lograid P=1 / btrfs raid5",
                    "lograid P=1 / lograid P=0"):
            self.assertIn(col, cols)
        row = next(ln for ln in r.splitlines() if ln.startswith("| many 14 MiB files"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[cols.index("lograid P=1 / attach path over nbdkit memory")], "0.60")
        self.assertEqual(cells[cols.index("btrfs raid5 / attach path over nbdkit memory")], "0.40")
        self.assertEqual(compare.rep_ratios(self.RUNS, "A", "manyfiles_wa", "lograid-p1", "path-ref"), [])
        self.assertIn("path-ref", compare.COLOURS)

    def test_report_names_the_skip(self):
        with tempfile.TemporaryDirectory() as d:
            setup = {"options": {"members": 3, "member_size": 4 << 30, "reps": 2, "a_files": 150,
                                 "dirty_bytes": 512 << 20, "dirty_background_bytes": 128 << 20},
                     "stacks": [{"key": "path-ref", "describe": "nbdkit memory"}], "skipped": {},
                     "skipped_exps": compare.exp_skips(["path-ref"], compare.EXPERIMENTS),
                     "machine": {"summary": "test", "versions": {}}}
            runs = self.RUNS + [run_rec("B", "lograid-p1", 1, **{"rand4k-qd32_iops": 5.0})]
            md = compare.report(d, setup, runs)
            self.assertEqual(md.count("| attach path over nbdkit memory | not run in B, D: "), 1)
            b = md[md.index("## B:"):]
            self.assertIn("Not run here: attach path over nbdkit memory (B and D do not use", b)
            a = md[md.index("## A:"):md.index("## B:")]
            self.assertNotIn("Not run here", a)
            with open(os.path.join(d, "A.svg")) as f:
                svg = f.read()
            self.assertIn(compare.COLOURS["path-ref"], svg)
            self.assertIn("attach path over nbdkit memory", svg)


class CpuTable(unittest.TestCase):
    def test_delta(self):
        d = compare.cpu_delta({"machine": 10.0, "server": 1.0, "nbdfuse": None},
                              {"machine": 13.5, "server": 2.25, "nbdfuse": 4.0})
        self.assertEqual(d, {"machine": 3.5, "server": 1.25, "nbdfuse": None})

    def test_table_per_gb(self):
        runs = []
        for rep, (srv, fuse) in enumerate([(4.0, 2.0), (6.0, 2.0)], 1):
            r = run_rec("A", "path-ref", rep, manyfiles_MBps=300.0)
            r["details"] = {"total_bytes": 2e9, "manyfiles_cpu_s": {"machine": 20.0, "server": srv, "nbdfuse": fuse}}
            runs.append(r)
        r = run_rec("A", "btrfs-raid5", 1, manyfiles_MBps=500.0)
        r["details"] = {"total_bytes": 2e9, "manyfiles_cpu_s": {"machine": 8.0}}
        runs.append(r)
        t = compare.cpu_table(runs)
        self.assertIn("| phase: process | btrfs raid5 | attach path over nbdkit memory |", t)
        self.assertIn("| many files: NBD server | - | 2.50 (2.00–3.00) |", t)
        self.assertIn("| many files: nbdfuse | - | 1.00 |", t)
        self.assertIn("| many files: whole machine | 4.00 | 10.00 |", t)
        self.assertNotIn("big file", t)
        self.assertEqual(compare.cpu_table(RUNS), "")           # runs without CPU details: no table


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
        self.assertGreaterEqual(a.a_files * compare.A_FILE_BYTES, 3 * a.dirty_bytes)
        self.assertEqual(a.exps, compare.EXPERIMENTS)
        self.assertEqual((a.path_ref_allocator, a.path_ref_warmup), ("sparse", 0))
        self.assertTrue(a.out.endswith(os.path.join("results", "compare-" + __import__("time").strftime("%Y-%m-%d"))))

    def test_quick(self):
        a = compare.parse_args(["--quick"])
        self.assertEqual((a.reps, a.member_size, a.b_seconds), (1, 1 << 30, 3))
        self.assertGreaterEqual(a.a_files * compare.A_FILE_BYTES, 3 * a.dirty_bytes)

    def test_errors(self):
        self.assertIn("--device is not implemented", self.parse_error(["--device", "/dev/sdb"]))
        self.assertIn("--members must be at least 2", self.parse_error(["--members", "1"]))
        self.assertIn("unknown stack", self.parse_error(["--stacks", "lograid-p1,md-raid5"]))
        self.assertIn("unknown experiment", self.parse_error(["--experiments", "A,Z"]))
        self.assertIn("less than 3 x --dirty-bytes", self.parse_error(["--a-files", "10"]))
        self.assertIn("bad size", self.parse_error(["--member-size", "lots"]))
        self.assertIn("does not fit", self.parse_error(["--member-size", "1G", "--b-size", "2G"]))
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


if __name__ == "__main__":
    unittest.main()
