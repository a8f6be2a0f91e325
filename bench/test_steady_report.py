"""Tests of bench/steady_report.py on synthetic result files: lograid's windowed runs
(converged, not converged, sync:N) beside a time-based peer run. No root, under a second.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

import json
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steady_report  # noqa: E402

GiB = 1 << 30
SVG = "{http://www.w3.org/2000/svg}"


def window(i, wa, steady=False, volume=4 * GiB, frac=0.25, eligible=None, fg=0.5, again=0.1):
    relocated = 100 << 20
    return {"index": i, "t_start": 5.0 * i, "t_end": 5.0 * (i + 1),
            "start_bytes": int(i * frac * volume), "end_bytes": int((i + 1) * frac * volume),
            "user_bytes": int(frac * volume), "member_bytes": int(wa * frac * volume), "wa": wa,
            "iops": 40000.0 + i, "mb_per_s": 160.0, "free_segments": 5, "segments_cleaned": 3,
            "relocated_bytes": relocated, "foreground_relocated_bytes": int(fg * relocated),
            "relocated_again_bytes": int(again * relocated), "foreground_share": fg,
            "relocated_again_share": again, "long_lived_written_bytes": 0, "write_stall_seconds": 0.0,
            "flushes_per_s": None, "member_flushes_per_flush": None,
            "eligible": (i * frac >= 1.0) if eligible is None else eligible, "steady": steady,
            "p50_us": 2.0, "p99_us": 300.0, "p999_us": 2000.0}


def lograid_file():
    uniform = [window(i, wa, steady=i >= 5) for i, wa in enumerate([1.5, 2.0, 2.6, 3.0, 3.2, 3.21, 3.25, 3.3])]
    zipf = [window(i, 2.0 + 0.2 * i) for i in range(6)]
    for w in zipf[3:]:
        w["steady"] = True
    sync = [window(i, 2.25, steady=True, volume=6 * GiB, frac=1 / 48, eligible=True, fg=0.0, again=0.0)
            for i in range(3)]
    for w in sync:
        w.update(relocated_bytes=0, foreground_share=None, relocated_again_share=None,
                 flushes_per_s=9000.0, member_flushes_per_flush=2.5)

    def run(fill, pattern, windows, **kw):
        r = {"fill": fill, "pattern": pattern, "volume_bytes": 4 * GiB, "window_bytes": GiB,
             "warmup_bytes": 4 * GiB, "converged": True, "stopped_by": "steady",
             "steady_windows": [w["index"] for w in windows if w["steady"]],
             "wa_steady": 3.2533, "iops_steady": 40006.0, "mb_per_s_steady": 160.0,
             "p50_us": 2.0, "p99_us": 300.0, "p999_us": 2500.0, "max_us": 1.5e6,
             "max_us_after_windows": 4e6, "foreground_share": 0.5,
             "relocated_again_share": 0.1, "free_segments_steady": 5.0, "seconds": 40.0,
             "user_bytes": 8 * GiB, "member_bytes": 22 * GiB, "wa": 2.75, "iops": 52000.0,
             "relocated_bytes": 5 * GiB, "segments_cleaned": 900, "write_stalls": 3,
             "map_bytes_per_block_sequential": 4.3, "map_bytes_per_block_random": 10.1,
             "windows": windows}
        r.update(kw)
        return r
    return {
        "stack": "lograid-p1-greedy", "policy": "greedy", "date": "2026-11-24 10:00 UTC",
        "machine": "test", "members": 3, "parity": 1, "member_size": 4 * GiB,
        "capacity_bytes": 8 * GiB, "queue_depth": 32,
        "setup": {"window_fraction": 0.25, "sync_window_bytes": 256 << 20, "windows_needed": 3,
                  "tolerance": 0.05, "warmup": "one overwrite", "max_seconds": 600.0, "block_size": 4096},
        "empty": {"iops": 100000.0, "p50_us": 1.0, "p99_us": 50.0, "p999_us": 25000.0},
        "runs": [
            run(0.75, "uniform", uniform),
            run(0.75, "zipf:0.99", zipf, converged=False, stopped_by="time_limit",
                wa_steady=2.8, foreground_share=None, relocated_again_share=0.25),
            run(None, "sync:4", sync, warmup_bytes=0, volume_bytes=6 * GiB, wa_steady=2.25,
                iops_steady=36000.0, flush_every=4, flushes_per_s=9000.0, member_flushes_per_flush=2.5,
                foreground_share=None, relocated_again_share=None),
        ],
    }


def btrfs_file():
    return {
        "stack": "btrfs-raid5", "date": "2026-11-22 06:31 UTC", "machine": "test", "members": 3,
        "member_size": 4 * GiB, "capacity_bytes": 8 * GiB,
        "setup": {"mkfs": "mkfs.btrfs -d raid5 -m raid1", "seconds": 120},
        "empty": {"iops": 5000.0, "p50_us": 5000.0, "p99_us": 11000.0, "p999_us": 16000.0, "wa": 2.0},
        "runs": [{"fill": 0.75, "pattern": "uniform", "user_bytes": 2 * GiB, "member_bytes": 13 * GiB,
                  "wa": 6.5, "wa_last_third": 22.7, "iops": 3600.0, "p50_us": 6000.0, "p99_us": 20000.0,
                  "p999_us": 53000.0, "commits": 40,
                  "timeline": [{"t": 5.0 * (k + 1), "iops": 3600.0, "wa": 5.0, "commits": 1}
                               for k in range(24)]}],
    }


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.paths = []
        for name, d in (("lograid.json", lograid_file()), ("btrfs.json", btrfs_file())):
            p = os.path.join(self.tmp.name, name)
            with open(p, "w") as f:
                json.dump(d, f)
            self.paths.append(p)
        self.results = steady_report.load(self.paths)

    def tearDown(self):
        self.tmp.cleanup()

    def row(self, md, stack, pattern):
        rows = [line for line in md.splitlines()
                if line.startswith("| %s |" % stack) and "| %s |" % pattern in line]
        self.assertEqual(len(rows), 1, md)
        return [c.strip() for c in rows[0].strip("|").split("|")]

    def test_table_has_steady_figures_convergence_and_the_cleaners_split(self):
        md = steady_report.markdown(self.results)
        r = self.row(md, "lograid-p1-greedy", "uniform")
        # stack, fill, pattern, GiB written, WA steady, converged, WA whole run, IOPS steady,
        # x empty, p99.9, x empty, longest (after the windows), foreground, again
        self.assertEqual(r[3:14], ["8.00", "3.25", "yes", "2.75", "40,006", "0.40", "2,500", "0.10",
                                   "1,500 (4,000)", "50%", "10%"])
        z = self.row(md, "lograid-p1-greedy", "zipf:0.99")
        self.assertEqual(z[4:6], ["2.80", "no (time limit)"])
        self.assertEqual(z[12:14], ["-", "25%"])
        # The peer's time-based run: its last third, marked, and explained once.
        b = self.row(md, "btrfs-raid5", "uniform")
        self.assertEqual(b[4:8], ["22.70 †", "-", "6.50", "3,600 †"])
        self.assertEqual(b[11], "-")
        self.assertIn("† a time-based run without windows", md)
        self.assertIn("to steady state: windows of 0.25 x the volume, 3 within 5%, at most 600 s", md)
        self.assertIn("| btrfs-raid5 | 2026-11-22 06:31 UTC | test | 3 x 4.00 GiB | 8.00 GiB | 120 s |", md)

    def test_sync_runs_have_their_own_table_with_flushes(self):
        md = steady_report.markdown(self.results)
        self.assertIn("Synchronous writers on an empty volume", md)
        s = self.row(md, "lograid-p1-greedy", "sync:4")
        self.assertEqual(s[1:9], ["sync:4", "8.00", "2.25", "yes", "36,000", "0.36", "9,000", "2.50"])
        # Not in the overwrite table: the fill column would be empty.
        self.assertNotIn("| None |", md)

    def test_windows_chart_has_a_panel_per_windowed_pattern(self):
        svg = ET.fromstring(steady_report.windows_chart(self.results))
        texts = [t.text for t in svg.iter(SVG + "text")]
        for pattern in ("uniform", "zipf:0.99", "sync:4"):
            self.assertEqual(texts.count(pattern), 1, texts)
        self.assertIn("not converged", texts)
        self.assertIn("fill 0.75", texts)
        self.assertIn("empty volume (sync:N)", texts)
        # Overwrites by volumes written (after the warm-up of one), sync:N by GiB.
        self.assertEqual(texts.count("volume overwrites written"), 2)
        self.assertEqual(texts.count("GiB written"), 1)
        # A filled marker per steady window (3 + 3 + 3), hollow small circles for the others.
        filled = [c for c in svg.iter(SVG + "circle") if c.get("r") == "4.5"]
        hollow = [c for c in svg.iter(SVG + "circle") if c.get("r") == "2"]
        self.assertEqual((len(filled), len(hollow)), (9, 5 + 3))
        # The peer has no windows: no panel for it beyond the shared pattern name.
        self.assertNotIn("btrfs-raid5", texts)

    def test_steady_wa_prefers_windows_and_marks_unconverged_runs(self):
        lo, bt = self.results[1], self.results[0]
        self.assertEqual(bt["stack"], "btrfs-raid5")
        self.assertEqual(steady_report.steady(lo["runs"][0])[:2], (3.2533, 40006.0))
        self.assertEqual(steady_report.steady(bt["runs"][0]), (22.7, 3600.0, 53000.0, False))
        svg = ET.fromstring(steady_report.wa_chart(self.results))
        hollow = [e for e in svg.iter() if e.get("fill") == "white" and e.tag != SVG + "rect"]
        # zipf's point (not converged) is hollow, and so is the legend's marker saying so;
        # the sync run has no fill and is not plotted.
        self.assertEqual(len(hollow), 2)

    def test_timeline_falls_back_to_windows(self):
        tl = steady_report.timeline_of(lograid_file()["runs"][0])
        self.assertEqual(len(tl), 8)
        self.assertEqual((tl[0]["t"], tl[0]["wa"]), (5.0, 1.5))
        self.assertEqual(steady_report.timeline_of(btrfs_file()["runs"][0])[0]["t"], 5.0)
        ET.fromstring(steady_report.timeline_chart(self.results))

    def test_main_writes_the_report_and_four_charts(self):
        out = os.path.join(self.tmp.name, "out")
        stdout = sys.stdout
        sys.stdout = open(os.devnull, "w")
        try:
            steady_report.main(["--out", out] + self.paths)
        finally:
            sys.stdout.close()
            sys.stdout = stdout
        self.assertEqual(sorted(os.listdir(out)), ["steady-timeline.svg", "steady-wa.svg",
                                                   "steady-windows.svg", "steady.md"])

    def test_pattern_order_and_styles(self):
        pats = ["trace:x.csv", "zipf:0.9", "skewed", "sync:1", "uniform", "moving:30s", "seqmix:256K", "odd"]
        self.assertEqual(sorted(pats, key=steady_report.pattern_rank),
                         ["uniform", "skewed", "zipf:0.9", "moving:30s", "seqmix:256K", "trace:x.csv",
                          "sync:1", "odd"])
        self.assertEqual(steady_report.dash("zipf:0.99"), steady_report.DASH["zipf"])
        self.assertEqual(steady_report.marker_kind("odd"), "circle")
        self.assertEqual(steady_report.short("trace:bench/traces/a.csv"), "trace:a.csv")
        self.assertEqual(steady_report.short("zipf:0.9"), "zipf:0.9")


if __name__ == "__main__":
    unittest.main()
