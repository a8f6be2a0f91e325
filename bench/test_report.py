"""Tests of bench/report.py: statistics, ratios, tables, charts, the markdown
report and bonnie++'s CSV. No root, no devices, under a second.

    python3 -m unittest discover -s bench -p 'test_*.py'    (or: python3 bench/report.py --self-test)
"""

import json
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

def run_rec(exp, stack, rep, **metrics):
    return {"exp": exp, "stack": stack, "rep": rep, "metrics": metrics, "error": None}


# Three repetitions of many-files and random-writes on three stacks, with a missing value and a failed run.
RUNS = [
    run_rec("many-files", "lograid-p1", 1, manyfiles_MBps=500.0, manyfiles_wa=1.53),
    run_rec("many-files", "lograid-p1", 2, manyfiles_MBps=400.0, manyfiles_wa=1.54),
    run_rec("many-files", "lograid-p1", 3, manyfiles_MBps=450.0, manyfiles_wa=1.52),
    run_rec("many-files", "btrfs-raid5", 1, manyfiles_MBps=250.0, manyfiles_wa=1.50),
    run_rec("many-files", "btrfs-raid5", 2, manyfiles_MBps=400.0, manyfiles_wa=1.50),
    run_rec("many-files", "btrfs-raid5", 3, manyfiles_MBps=300.0, manyfiles_wa=1.51),
    run_rec("many-files", "btrfs-raid0", 1, manyfiles_MBps=600.0, manyfiles_wa=1.0),
    run_rec("many-files", "btrfs-raid0", 2, manyfiles_MBps=None, manyfiles_wa=None),   # failed run
    run_rec("many-files", "btrfs-raid0", 3, manyfiles_MBps=500.0, manyfiles_wa=1.0),
    run_rec("random-writes", "lograid-p1", 1, **{"rand4k-qd32_iops": 50000.0}),
    run_rec("random-writes", "btrfs-raid5", 1, **{"rand4k-qd32_iops": 4000.0}),
]
RUNS[7]["error"] = "RuntimeError: mkfs failed"


class Statistics(unittest.TestCase):
    def test_summarize(self):
        s = report.summarize([3, 1, None, 2, 10])
        self.assertEqual(s, {"min": 1, "median": 2.5, "max": 10, "n": 4})
        self.assertEqual(report.summarize([7])["median"], 7)
        self.assertIsNone(report.summarize([]))
        self.assertIsNone(report.summarize([None, float("nan")]))

    def test_odd_median(self):
        self.assertEqual(report.summarize([5, 1, 3])["median"], 3)

    def test_metric_values_skips_missing(self):
        self.assertEqual(report.metric_values(RUNS, "many-files", "btrfs-raid0", "manyfiles_MBps"),
                         {1: 600.0, 3: 500.0})

    def test_rep_ratios_pair_within_repetition(self):
        r = report.rep_ratios(RUNS, "many-files", "manyfiles_MBps", "lograid-p1", "btrfs-raid5")
        self.assertEqual(r, [2.0, 1.0, 1.5])
        s = report.summarize(r)
        self.assertEqual((s["min"], s["median"], s["max"]), (1.0, 1.5, 2.0))
        # Repetition 2 of raid0 failed: only 1 and 3 pair up.
        r = report.rep_ratios(RUNS, "many-files", "manyfiles_MBps", "btrfs-raid5", "btrfs-raid0")
        self.assertEqual(r, [250 / 600, 300 / 500])

    def test_ratio_of_zero_denominator_is_skipped(self):
        runs = [run_rec("many-files", "x", 1, m=1.0), run_rec("many-files", "y", 1, m=0.0)]
        self.assertEqual(report.rep_ratios(runs, "many-files", "m", "x", "y"), [])


class Formatting(unittest.TestCase):
    def test_cells(self):
        self.assertEqual(report.fmt_cell(report.summarize([400, 500, 450])), "450 (400–500)")
        self.assertEqual(report.fmt_cell(report.summarize([1.5, 1.52]), 2), "1.51 (1.50–1.52)")
        self.assertEqual(report.fmt_cell(report.summarize([12345.6])), "12,346")
        self.assertEqual(report.fmt_cell(None), "-")
        self.assertEqual(report.fmt_ratio(report.summarize([2.0, 1.0, 1.5])), "1.50 (1.00–2.00)")
        self.assertEqual(report.fmt_ratio(report.summarize([12.5])), "12.50")

    def test_duration(self):
        self.assertEqual(report.fmt_duration(42), "42s")
        self.assertEqual(report.fmt_duration(125), "2m05s")
        self.assertEqual(report.fmt_duration(3725), "1h02m")


class Tables(unittest.TestCase):
    def test_absolute_table(self):
        t = report.absolute_table(RUNS, "many-files")
        lines = t.strip().splitlines()
        self.assertEqual(lines[0], "| metric | lograid P=1 | btrfs raid5 | btrfs raid0 |")
        row = next(ln for ln in lines if ln.startswith("| many 14 MiB files"))
        self.assertIn("450 (400–500)", row)
        self.assertIn("300 (250–400)", row)
        self.assertIn("550 (500–600)", row)
        # Metrics nobody measured are left out.
        self.assertNotIn("one big file", t)

    def test_ratio_table(self):
        t = report.ratio_table(RUNS, "many-files")
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
        t = report.headline_table(RUNS)
        row = next(ln for ln in t.splitlines() if "4 KiB QD32 (IOPS)" in ln)
        self.assertIn("50,000", row)
        self.assertIn("12.50", row)
        self.assertTrue(row.rstrip().endswith("higher |"))

    def test_report_and_charts(self):
        with tempfile.TemporaryDirectory() as d:
            setup = {"options": {"members": 3, "member_size": 4 << 30, "reps": 3, "many_files_count": 150,
                                 "dirty_bytes": 512 << 20, "dirty_background_bytes": 128 << 20},
                     "stacks": [{"key": "lograid-p1", "describe": "x"}], "skipped": {"zfs-raidz1": "not installed"},
                     "machine": {"summary": "test", "versions": {"fio": "fio-3.33"}}}
            md = report.write_report(d, setup, RUNS)
            self.assertIn("## lograid P=1 against btrfs raid5", md)
            self.assertIn("skipped: not installed", md)
            self.assertIn("mkfs failed", md)
            for exp in ("many-files", "random-writes"):
                root = ET.parse(os.path.join(d, exp + ".svg")).getroot()     # well-formed XML
                self.assertTrue(root.tag.endswith("svg"))
            self.assertFalse(os.path.exists(os.path.join(d, "small-files.svg")))

    def test_bonnie_csv(self):
        line = ("1.98,2.00a,bare,1,1700000000,2G,,8192,5,,,262407,20,136894,10,,,356405,15,7210,99,16,8192,4096,"
                "16,,17676,60,+++++,+++,29000,50,14873,40,+++++,+++,29113,45,,,,,,,,,,,,,")
        m = report.parse_bonnie_csv("junk\n" + line + "\n")
        self.assertEqual(m["block_write_KBps"], 262407)
        self.assertEqual(m["rewrite_KBps"], 136894)
        self.assertEqual(m["seeks_per_s"], 7210)
        self.assertEqual(m["seq_create_per_s"], 17676)
        self.assertIsNone(m["seq_read_per_s"])              # '+++++': too fast to measure
        self.assertEqual(m["rand_delete_per_s"], 29113)
        self.assertEqual(report.parse_bonnie_csv("nothing"), {})
        self.assertEqual(report.bonnie_too_fast(line), ["rand_read_per_s", "seq_read_per_s"])

    def test_too_fast_cell(self):
        runs = [run_rec("bonnie", "bare", 1, seq_create_per_s=None, block_write_KBps=1000.0)]
        runs[0]["details"] = {"too_fast": ["seq_create_per_s"]}
        t = report.absolute_table(runs, "bonnie")
        self.assertIn("| seq create (/s) | too fast |", t)



# The attach path over nbdkit memory beside lograid P=1, P=0 and btrfs raid5: two
# repetitions of many-files, no WA for path-ref (it has no members).
PATH_REF_RUNS = [run_rec("many-files", s, r, manyfiles_MBps=v * r, bigfile_MBps=2 * v,
                         manyfiles_wa=None if s == "path-ref" else 1.5)
                 for r in (1, 2) for s, v in (("lograid-p1", 300.0), ("lograid-p0", 400.0), ("btrfs-raid5", 200.0),
                                              ("path-ref", 500.0))]


class PathRef(unittest.TestCase):
    """The attach path over nbdkit memory: in the ratio tables beside lograid and btrfs, no WA."""

    RUNS = PATH_REF_RUNS

    def test_columns_and_ratios(self):
        t = report.absolute_table(self.RUNS, "many-files")
        header = t.splitlines()[0]
        self.assertTrue(header.endswith("| btrfs raid5 | attach path over nbdkit memory |"))
        wa = next(ln for ln in t.splitlines() if ln.startswith("| many files WA"))
        self.assertTrue(wa.rstrip().endswith("| - |"))                            # no members, no WA
        r = report.ratio_table(self.RUNS, "many-files")
        cols = [c.strip() for c in r.splitlines()[0].strip("|").split("|")]
        for col in ("lograid P=1 / attach path over nbdkit memory", "lograid P=0 / attach path over nbdkit memory",
                    "btrfs raid5 / attach path over nbdkit memory", "lograid P=1 / btrfs raid5",
                    "lograid P=1 / lograid P=0"):
            self.assertIn(col, cols)
        row = next(ln for ln in r.splitlines() if ln.startswith("| many 14 MiB files"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[cols.index("lograid P=1 / attach path over nbdkit memory")], "0.60")
        self.assertEqual(cells[cols.index("btrfs raid5 / attach path over nbdkit memory")], "0.40")
        self.assertEqual(report.rep_ratios(self.RUNS, "many-files", "manyfiles_wa", "lograid-p1", "path-ref"), [])
        self.assertIn("path-ref", report.COLOURS)


class CpuTable(unittest.TestCase):
    def test_table_per_gb(self):
        runs = []
        for rep, (srv, fuse) in enumerate([(4.0, 2.0), (6.0, 2.0)], 1):
            r = run_rec("many-files", "path-ref", rep, manyfiles_MBps=300.0)
            r["details"] = {"total_bytes": 2e9, "manyfiles_cpu_s": {"machine": 20.0, "server": srv, "nbdfuse": fuse}}
            runs.append(r)
        r = run_rec("many-files", "btrfs-raid5", 1, manyfiles_MBps=500.0)
        r["details"] = {"total_bytes": 2e9, "manyfiles_cpu_s": {"machine": 8.0}}
        runs.append(r)
        t = report.cpu_table(runs)
        self.assertIn("| phase: process | btrfs raid5 | attach path over nbdkit memory |", t)
        self.assertIn("| many files: NBD server | - | 2.50 (2.00–3.00) |", t)
        self.assertIn("| many files: nbdfuse | - | 1.00 |", t)
        self.assertIn("| many files: whole machine | 4.00 | 10.00 |", t)
        self.assertNotIn("big file", t)
        self.assertEqual(report.cpu_table(RUNS), "")           # runs without CPU details: no table


class Sections(unittest.TestCase):
    """The parts of the report and of a chart on their own."""

    def test_stacks_table(self):
        setup = {"stacks": [{"key": "lograid-p1", "describe": "lograid create"}],
                 "skipped": {"zfs-raidz1": "zfs-fuse is not installed"},
                 "skipped_exps": {"path-ref": {"random-writes": "no attach path", "degraded-reads": "no attach path"}}}
        self.assertEqual(report.stacks_table(setup), [
            "| stack | how it is built |", "|---|---|",
            "| lograid P=1 | lograid create |",
            "| zfs-fuse raidz1 | skipped: zfs-fuse is not installed |",
            "| attach path over nbdkit memory | not run in random-writes, degraded-reads: no attach path |"])

    def test_problems_section(self):
        self.assertEqual(report.problems_section({"notes": []}, RUNS[:3]), [])
        lines = report.problems_section({"notes": ["bonnie++ is not installed"]}, RUNS)
        self.assertEqual(lines, ["## Problems and notes", "", "- bonnie++ is not installed",
                                 "- many-files on btrfs raid0, repetition 2: RuntimeError: mkfs failed", ""])

    def test_linear_scale(self):
        cells = {("m", "s"): report.summarize([40.0, 90.0])}
        ticks, ymap = report.y_scale(cells, False, 100)
        self.assertEqual(ticks[0], 0)
        self.assertGreaterEqual(ticks[-1], 90.0)
        self.assertEqual(ymap(0), 100 + report.PANEL_H)
        self.assertEqual(ymap(ticks[-1]), 100)

    def test_log_scale(self):
        cells = {("m", "a"): report.summarize([300.0]), ("m", "b"): report.summarize([45000.0]), ("m", "c"): None}
        ticks, ymap = report.y_scale(cells, True, 0)
        self.assertEqual(ticks, [100, 1000, 10000, 100000])
        self.assertEqual(ymap(100), report.PANEL_H)
        self.assertEqual(ymap(1), report.PANEL_H)              # below the lowest tick: at the bottom
        self.assertAlmostEqual(ymap(100000), 0)


def write_old_results_folder(d):
    """A small results folder as compare.py wrote them when the experiments were
    letters (A, B, C, D): in each run's "exp" and file name, and in setup.json's
    options and skipped experiments."""
    setup = {"started": "2026-11-22 10:00 UTC", "finished": "2026-11-22 10:30 UTC", "elapsed_seconds": 1800,
             "options": {"members": 3, "member_size": 4 << 30, "reps": 1, "dirty_bytes": 512 << 20,
                         "dirty_background_bytes": 128 << 20, "experiments": "A,B,D", "exps": ["A", "B", "D"],
                         "a_files": 147, "a_memory": "warm", "a_warm_bytes": 6 << 30, "b_size": 2 << 30,
                         "b_seconds": 10, "bsrange": "512-64k", "bssplit": None, "c_files": 102400,
                         "d_size": 1 << 30},
             "skipped": {}, "skipped_exps": {"path-ref": {"B": "no attach path", "D": "no attach path"}},
             "notes": [], "machine": {"summary": "test", "versions": {}},
             "stacks": [{"key": "lograid-p1", "describe": "lograid"}, {"key": "btrfs-raid5", "describe": "btrfs"}]}
    os.makedirs(os.path.join(d, "raw"))
    with open(os.path.join(d, "setup.json"), "w") as f:
        json.dump(setup, f)
    runs = [run_rec("A", "lograid-p1", 1, manyfiles_MBps=450.0), run_rec("A", "btrfs-raid5", 1, manyfiles_MBps=300.0),
            run_rec("B", "lograid-p1", 1, **{"rand4k-qd32_iops": 50000.0}),
            run_rec("B", "btrfs-raid5", 1, **{"rand4k-qd32_iops": 4000.0}),
            run_rec("D", "btrfs-raid5", 1, healthy_MBps=700.0)]
    runs[-1]["error"] = "RuntimeError: degrade failed"
    for r in runs:
        with open(os.path.join(d, "raw", "%s-%s-r%d.json" % (r["exp"], r["stack"], r["rep"])), "w") as f:
            json.dump(r, f)


class OldResultsFolders(unittest.TestCase):
    """Folders written with the experiments as letters load with the names."""

    def test_runs_get_the_names(self):
        with tempfile.TemporaryDirectory() as d:
            write_old_results_folder(d)
            runs = report.load_runs(d)
            self.assertEqual(sorted({r["exp"] for r in runs}), ["degraded-reads", "many-files", "random-writes"])
            self.assertEqual(report.metric_values(runs, "random-writes", "btrfs-raid5", "rand4k-qd32_iops"),
                             {1: 4000.0})

    def test_setup_gets_the_names(self):
        with tempfile.TemporaryDirectory() as d:
            write_old_results_folder(d)
            setup = report.load_setup(d)
        opts = setup["options"]
        self.assertEqual((opts["many_files_count"], opts["many_files_memory"], opts["many_files_warm_bytes"]),
                         (147, "warm", 6 << 30))
        self.assertEqual((opts["random_writes_size"], opts["random_writes_seconds"]), (2 << 30, 10))
        self.assertEqual((opts["small_files_count"], opts["degraded_reads_size"]), (102400, 1 << 30))
        self.assertFalse(set(report.OLD_OPTION_NAMES) & set(opts))
        self.assertEqual(opts["exps"], ["many-files", "random-writes", "degraded-reads"])
        self.assertEqual(opts["experiments"], "many-files,random-writes,degraded-reads")
        self.assertEqual(setup["skipped_exps"], {"path-ref": {"random-writes": "no attach path",
                                                              "degraded-reads": "no attach path"}})

    def test_every_old_letter_has_a_name(self):
        self.assertEqual(sorted(report.OLD_EXPERIMENT_NAMES.values()),
                         sorted(e for e in report.EXPERIMENTS if e != "bonnie"))
        self.assertEqual(report.experiment_name("bonnie"), "bonnie")
        self.assertEqual(report.experiment_name("many-files"), "many-files")

    def test_new_setup_is_unchanged(self):
        setup = {"options": {"many_files_count": 10, "exps": ["many-files"], "experiments": "many-files"},
                 "skipped_exps": {}}
        self.assertEqual(report.upgrade_setup(setup), setup)

    def test_report(self):
        with tempfile.TemporaryDirectory() as d:
            write_old_results_folder(d)
            md = report.write_report(d, report.load_setup(d), report.load_runs(d))
            svgs = sorted(f for f in os.listdir(d) if f.endswith(".svg"))
        self.assertEqual(svgs, ["degraded-reads.svg", "many-files.svg", "random-writes.svg"])
        self.assertIn("## many-files: many 14 MiB files vs one big file", md)
        self.assertIn("147 files of 14 MiB", md)
        self.assertIn("(--many-files-memory warm)", md)
        self.assertIn("10 s per test, into a 2 GiB file", md)
        self.assertIn("1 GiB written sequentially", md)
        self.assertIn("| attach path over nbdkit memory | not run in random-writes, degraded-reads: no attach path |",
                      md)
        self.assertIn("| random-writes: 4 KiB QD32 (IOPS) | 50,000 | 4,000 | 12.50 | higher |", md)
        self.assertIn("- degraded-reads on btrfs raid5, repetition 1: RuntimeError: degrade failed", md)
        self.assertNotIn("## A", md)


if __name__ == "__main__":
    unittest.main()
