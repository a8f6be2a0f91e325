"""Tests of bench/cleaner_model.py: the properties the model's figures in docs/BENCHMARKS.md
rest on, at a small scale (64 segments of 128 blocks), a few seconds in all.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cleaner_model  # noqa: E402

SKEWED = (0.1, 0.9)


def relocated(util=0.667, hot=SKEWED, policy="cost-benefit", heads=2, checkpoint_blocks=0,
              overwrites=16, measured=4):
    m = cleaner_model.Model(64, 128, util, hot, policy, heads, 5, 3, checkpoint_blocks, seed=3)
    return m.run(overwrites, measured)


class Model(unittest.TestCase):
    def test_a_fuller_volume_moves_more(self):
        low, _ = relocated(util=0.5, hot=None, overwrites=6, measured=2)
        high, _ = relocated(util=0.75, hot=None, overwrites=6, measured=2)
        self.assertGreater(low, 0.05)
        self.assertGreater(high, 1.5 * low)

    def test_cost_benefit_leaves_cold_segments_alone_where_greedy_does_not(self):
        cb, _ = relocated()
        greedy, _ = relocated(policy="greedy")
        self.assertLess(cb, 0.75 * greedy)

    def test_a_third_head_for_blocks_moved_again_moves_less_under_skew(self):
        two, _ = relocated()
        three, _ = relocated(heads=3)
        self.assertLess(three, 0.9 * two)

    def test_checkpoint_waits_hold_segments_and_never_lose_blocks(self):
        m = cleaner_model.Model(64, 128, 0.667, SKEWED, "cost-benefit", 2, 5, 3, 64 * 40, seed=3)
        m.run(8, 2)
        # Every block of the volume is mapped exactly once, in a segment that is not free.
        free = set(m.free) | set(m.pending)
        self.assertEqual(sorted(lba for lba in m.owner if lba >= 0), list(range(m.nlba)))
        self.assertTrue(all(m.loc[lba] // m.segb not in free for lba in range(m.nlba)))
        self.assertEqual(sum(m.live), m.nlba)


if __name__ == "__main__":
    unittest.main()
