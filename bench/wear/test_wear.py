"""Tests of bench/wear's report and option handling: no root, no guest, a second or so."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import wear_run as wear  # noqa: E402
import wear_report as wr  # noqa: E402

MiB = 1 << 20


def phase(stack, variant, workload, fill, user, member, read=0, **extra):
    rec = {"stack": stack, "variant": variant, "workload": workload, "fill": fill, "volume_bytes": 1024 * MiB,
           "used_bytes": int(1024 * MiB * fill), "user_bytes": user, "member_bytes": member,
           "member_read_bytes": read, "member_discard_bytes": 0, "disks": {}, "guest_seconds": 1,
           "quiet_wait_seconds": 10, "setup": "x"}
    rec.update(extra)
    return rec


def sample():
    u = 100 * MiB
    return [
        phase("zfs-raidz1", "zvol-default", "random-4k", 0.5, u, 9 * u, txgs=10, pool_capacity_before=40,
              pool_capacity_after=41, pool_fragmentation_after=12, available_before=300 * MiB),
        phase("zfs-raidz1", "zvol-4k", "random-4k", 0.5, u, 4 * u),
        phase("zfs-raidz1", "dataset", "many-files", 0, u, int(1.3 * u)),
        phase("md-raid5", "block", "random-4k", 0.5, u, 2 * u, read=2 * u),
        phase("md-raid5", "ext4", "many-files", 0, u, int(1.25 * u)),
        phase("md-raid5-journal", "block", "random-4k", 0.5, u, 4 * u),
        phase("lograid-p1", "nbd", "random-4k", 0.5, u, int(1.25 * u), engine_relocated_bytes=0,
              engine_member_bytes=int(1.24 * u)),
        phase("lograid-p1", "ext4", "many-files", 0, u, int(1.3 * u)),
        phase("lograid-p1", "nbd", "random-4k", 0.75, u, int(2.5 * u)),
    ]


class ReportTest(unittest.TestCase):
    def test_wa_and_reads(self):
        rec = phase("md-raid5", "block", "random-4k", 0.5, 4096, 8192, read=8192)
        self.assertEqual(wr.wa(rec), 2.0)
        self.assertEqual(wr.read_ratio(rec), 2.0)
        self.assertIsNone(wr.wa(phase("md-raid5", "block", "random-4k", 0.5, 0, 8192)))

    def test_rows_and_columns(self):
        res = sample()
        rows = wr.rows_in(res)
        self.assertEqual(rows[:3], [("zfs-raidz1", "zvol-default"), ("zfs-raidz1", "zvol-4k"),
                                    ("zfs-raidz1", "dataset")])
        # md's block device and its ext4 share one row; lograid's too.
        self.assertIn(("md-raid5", ""), rows)
        self.assertEqual(rows[-1], ("lograid-p1", ""))
        self.assertEqual(wr.columns_in(res), [("random-4k", 0.5), ("random-4k", 0.75), ("many-files", 0.0)])
        self.assertEqual(wr.column_label(("random-4k", 0.75)), "random 4 KiB, 75% full")

    def test_last_phase_wins(self):
        res = sample() + [phase("md-raid5", "block", "random-4k", 0.5, 100, 300)]
        self.assertEqual(wr.wa(wr.index(res)[(("md-raid5", ""), ("random-4k", 0.5))]), 3.0)

    def test_comparisons(self):
        comps = wr.comparisons(sample())
        by = {(c["column"], c["peer"]): c for c in comps}
        z = by[(("random-4k", 0.5), ("zfs-raidz1", "zvol-default"))]
        self.assertAlmostEqual(z["ratio"], 1.25 / 9)
        self.assertTrue(z["met"])                      # <= 1/5
        z4 = by[(("random-4k", 0.5), ("zfs-raidz1", "zvol-4k"))]
        self.assertAlmostEqual(z4["ratio"], 1.25 / 4)
        self.assertFalse(z4["met"])
        md = by[(("random-4k", 0.5), ("md-raid5", ""))]
        self.assertAlmostEqual(md["ratio"], 0.625)
        self.assertFalse(md["met"])                    # > 1/2
        self.assertTrue(by[(("random-4k", 0.5), ("md-raid5-journal", ""))]["met"])
        # many-files compares with the ZFS dataset, not the zvols.
        self.assertIn((("many-files", 0.0), ("zfs-raidz1", "dataset")), by)
        self.assertNotIn((("many-files", 0.0), ("zfs-raidz1", "zvol-default")), by)
        # no raidz1 phase at 75%: no comparison there.
        self.assertNotIn((("random-4k", 0.75), ("zfs-raidz1", "zvol-default")), by)

    def test_markdown_and_chart(self):
        res = sample()
        md = wr.markdown(res, {"date": "d", "members": 6, "disk_size": "512M", "problems": ["p1"]})
        self.assertIn("| OpenZFS raidz1, zvol, default volblocksize | **9.00** | - | - |", md)
        self.assertIn("| lograid P=1 | **1.25** | **2.50** | **1.30** |", md)
        self.assertIn("10 txgs, 10 MiB user data per txg; pool 40% → 41% allocated, fragmentation 12%; "
                      "300 MiB available to the zvol at the start", md)
        self.assertIn("cleaner relocated", md)
        self.assertIn("## Problems", md)
        self.assertIn("| OpenZFS raidz1 | 11.5 | 9.00 | 4.00 |", md)
        svg = wr.chart_svg(res)
        self.assertTrue(svg.startswith("<?xml"))
        self.assertIn("published raidz1: 11.5", svg)
        self.assertIn("lograid P=1", svg)
        self.assertEqual(wr.chart_svg([]).count("<rect"), 1)   # the background only

    def test_write_and_reload(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "results.jsonl"), "w") as f:
                for rec in sample():
                    f.write(json.dumps(rec) + "\n")
            wear.report(d)
            self.assertTrue(os.path.exists(os.path.join(d, "wear.md")))
            self.assertTrue(os.path.exists(os.path.join(d, "wear.svg")))
            self.assertEqual(len(wr.load_results(os.path.join(d, "results.jsonl"))), len(sample()))


class OptionsTest(unittest.TestCase):
    def test_defaults_and_errors(self):
        a = wear.parse_args([])
        self.assertEqual(a.stack_list, wear.ALL_STACKS)
        self.assertEqual(a.fill_list, [0.5, 0.75])
        for bad in (["--stacks", "zfs-raidz9"], ["--fills", "1.5"], ["--members", "3", "--stacks", "lograid-p3"],
                    ["--zvol-fraction", "0"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                wear.parse_args(bad)

    def test_test_script_header(self):
        a = wear.parse_args(["--stacks", "md-raid6-journal", "--fills", "0.5", "--files", "3"])
        text = wear.test_script("md-raid6-journal", a)
        self.assertIn("WEAR_STACK=md-raid6-journal\n", text)
        self.assertIn('WEAR_FILLS="0.5"\n', text)
        self.assertIn("WEAR_FILES=3\n", text)
        self.assertIn(". \"$SHARE/lib.sh\"", text)


if __name__ == "__main__":
    unittest.main()
