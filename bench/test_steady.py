"""Tests of bench/steady.py's patterns without a stack: parsing, fio's job arguments,
the moving hot set's zones, MSR traces and their fio iolog, latency percentiles merged
across jobs. No root, no fio, under a second.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import steady  # noqa: E402

SAMPLE = os.path.join(HERE, "traces", "sample-msr.csv")


def opts(args):
    """{'--name': [...], ...} of fio arguments, values in order."""
    out = {}
    for a in args:
        k, _, v = a.partition("=")
        out.setdefault(k, []).append(v)
    return out


class Patterns(unittest.TestCase):
    def test_names_match_lograids(self):
        pats = steady.parse_patterns("uniform, skewed,zipf:0.99,moving:30,seqmix,seqmix:1M,trace:t.csv,sync:4")
        self.assertEqual([p["name"] for p in pats],
                         ["uniform", "skewed", "zipf:0.99", "moving:30s", "seqmix:256K", "seqmix:1024K",
                          "trace:t.csv", "sync:4"])

    def test_bad_patterns_say_what_is_wrong(self):
        for text, says in [("hot", "unknown pattern 'hot'"), ("zipf", "expected one of"),
                           ("zipf:0", "THETA"), ("moving:2x", "moving:Nx"), ("moving:0.5", "at least 1"),
                           ("seqmix:8M", "4K to 4M"), ("seqmix:big", "not a size"),
                           ("sync:0", "whole number"), ("trace:", "expected one of"), (" , ", "no pattern")]:
            with self.assertRaises(ValueError) as e:
                steady.parse_patterns(text)
            self.assertIn(says, str(e.exception), text)

    def test_moving_zones_put_90_percent_on_the_hot_tenth(self):
        seen = set()
        for t in range(10):
            spec = steady.zoned_hot_tenth(t)
            zones = [tuple(int(x) for x in z.split("/")) for z in spec[len("zoned:"):].split(":")]
            self.assertEqual(sum(p for p, _ in zones), 100, spec)
            self.assertEqual(sum(s for _, s in zones), 100, spec)
            start = 0
            for p, size in zones:
                if p == 90:
                    self.assertEqual((start, size), (10 * t, 10), spec)
                    seen.add(start)
                else:
                    # The cold 10 %: in proportion to the part's size, to a whole percent.
                    self.assertLessEqual(abs(p - 10 * size / 90), 0.5 + 1e-9, spec)
                start += size
        self.assertEqual(len(seen), 10)
        self.assertEqual(steady.zoned_hot_tenth(0), "zoned:90/10:10/90")   # = skewed


class Jobs(unittest.TestCase):
    def jobs(self, pattern, seconds=120):
        return steady.overwrite_jobs(steady.parse_pattern(pattern), "/mnt/f", 1 << 30, seconds, "libaio",
                                     "/w/trace.iolog")

    def test_single_job_patterns(self):
        for pattern, dist in [("uniform", None), ("skewed", "zoned:90/10:10/90"), ("zipf:0.9", "zipf:0.9")]:
            args, seq = self.jobs(pattern)
            o = opts(args)
            self.assertFalse(seq)
            self.assertEqual(o["--name"], ["overwrite"])
            self.assertEqual((o["--rw"], o["--bs"], o["--iodepth"], o["--runtime"]),
                             (["randwrite"], ["4k"], ["32"], ["120"]))
            self.assertEqual(o.get("--random_distribution"), None if dist is None else [dist])

    def test_moving_is_a_sequence_of_jobs_moving_the_hot_tenth(self):
        args, seq = self.jobs("moving:30", seconds=100)
        o = opts(args)
        self.assertTrue(seq)
        self.assertEqual(o["--name"], ["move0", "move1", "move2", "move3"])
        self.assertEqual(o["--runtime"], ["30", "30", "30", "10"])
        self.assertEqual(o["--random_distribution"],
                         [steady.zoned_hot_tenth(t) for t in (0, 3, 6, 9)])
        self.assertEqual(len(o["--stonewall"]), 3)     # every job but the first waits

    def test_seqmix_balances_bytes_with_flow(self):
        args, seq = self.jobs("seqmix:1M")
        o = opts(args)
        self.assertFalse(seq)
        self.assertEqual(o["--name"], ["random", "sequential"])
        self.assertEqual(o["--rw"], ["randwrite", "write"])
        self.assertEqual(o["--bs"], ["4k", str(1 << 20)])
        self.assertEqual(o["--iodepth"], ["16", "16"])
        # 256 random requests per sequential one: 1 MiB each way.
        self.assertEqual(o["--flow"], ["256", "1"])
        self.assertEqual(o["--flow_id"], ["1", "1"])

    def test_trace_replays_the_iolog_and_sync_flushes(self):
        o = opts(self.jobs("trace:x.csv")[0])
        self.assertEqual((o["--read_iolog"], o["--replay_no_stall"], o["--runtime"]),
                         (["/w/trace.iolog"], ["1"], ["120"]))
        self.assertNotIn("--time_based", o)            # ends with its log
        o = opts(self.jobs("sync:8")[0])
        self.assertEqual((o["--ioengine"], o["--iodepth"], o["--numjobs"], o["--fsync"]),
                         (["psync"], ["1"], ["32"], ["8"]))


class Traces(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def trace(self, text):
        p = os.path.join(self.tmp.name, "t.csv")
        with open(p, "w") as f:
            f.write(text)
        return p

    def test_the_sample_trace_and_the_mapping(self):
        writes, reads = steady.read_msr_trace(SAMPLE)
        self.assertGreater(len(writes), 1000)
        self.assertGreater(reads, 0)
        # The same mapping as lograid's bench: modulo, aligned down, rounded up, moved back.
        self.assertEqual(steady.trace_request(3154152448, 4096, 1 << 30), (1006665728, 4096))
        self.assertEqual(steady.trace_request(12800, 5000, 1 << 30), (12288, 8192))
        self.assertEqual(steady.trace_request(1048576000, 65536, 1048576000 + 8192),
                         (1048576000 + 8192 - 65536, 65536))

    def test_bad_lines_are_refused_with_their_number(self):
        for text, says in [("1,h,1,Write,0,4096\n", "line 1: expected 7 comma-separated fields"),
                           ("1,h,1,Write,0,4096,1\n2,h,1,Erase,0,4096,1\n", "line 2: Type 'Erase'"),
                           ("\n\n1,h,1,Write,-5,4096,1\n", "line 3: Offset '-5'"),
                           ("1,h,1,Write,0,0,1\n", "line 1: Size 0"),
                           ("", "no writes"), ("1,h,1,Read,0,4096,1\n", "no writes")]:
            with self.assertRaises(ValueError) as e:
                steady.read_msr_trace(self.trace(text))
            self.assertIn(says, str(e.exception), text)

    def test_iolog_repeats_the_trace_to_the_bytes_asked(self):
        writes = [(0, 4096), (8192, 6000), (1 << 40, 65536)]
        log = os.path.join(self.tmp.name, "t.iolog")
        n, total = steady.write_iolog(writes, "/mnt/f", 1 << 20, log, 200_000)
        with open(log) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[:3], ["fio version 2 iolog", "/mnt/f add", "/mnt/f open"])
        self.assertEqual(lines[-1], "/mnt/f close")
        body = lines[3:-1]
        self.assertEqual(len(body), n)
        self.assertEqual(body[:3], ["/mnt/f write 0 4096", "/mnt/f write 8192 8192",
                                    "/mnt/f write 0 65536"])
        self.assertEqual(n % 3, 0)                      # whole passes of the trace
        self.assertGreaterEqual(total, 200_000)
        n, _ = steady.write_iolog(writes, "/mnt/f", 1 << 20, log, 10 ** 12, max_requests=5)
        self.assertEqual(n, 5)


class SampleTrace(unittest.TestCase):
    def test_the_committed_sample_is_what_its_script_writes(self):
        sys.path.insert(0, os.path.join(HERE, "traces"))
        import make_sample
        with open(SAMPLE) as f:
            self.assertEqual(f.read(), "\n".join(make_sample.lines()) + "\n")


class Latency(unittest.TestCase):
    def test_one_job_uses_fios_percentiles_several_merge_bins(self):
        one = [{"write": {"clat_ns": {"percentile": {"50.000000": 1500, "99.000000": 9000,
                                                     "99.900000": 20000}}}}]
        self.assertEqual(steady.percentiles_us(one), [1.5, 9.0, 20.0])
        # 1000 calls at 1 µs in one job, 1000 at 3 µs and 10 at 1 ms in another.
        two = [{"write": {"clat_ns": {"bins": {"1000": 1000}}}},
               {"write": {"clat_ns": {"bins": {"3000": 1000, "1000000": 10}}}}]
        self.assertEqual(steady.percentiles_us(two), [3.0, 3.0, 1000.0])
        self.assertEqual(steady.percentiles_us([{"write": {"clat_ns": {}}}] * 2), [None, None, None])

    def test_written_sums_the_jobs(self):
        report = {"jobs": [{"write": {"io_bytes": 10, "total_ios": 2}},
                           {"write": {"io_bytes": 5, "total_ios": 1}}]}
        self.assertEqual(steady.written(report), (15, 3))


if __name__ == "__main__":
    unittest.main()
