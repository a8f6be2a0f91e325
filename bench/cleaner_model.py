#!/usr/bin/env python3
"""A block-level model of lograid's cleaner: how many blocks it relocates per user block
written at steady state, under the engine's rules, and what a rule changed would do.

Segments of `--segment-blocks` data blocks; a volume of `--util` x all of them written
sequentially, then overwritten at random (uniform, or `--hot FRACTION:SHARE` of the writes
on the first FRACTION of the blocks). Modelled from the engine (pool/cleaner.rs,
pool/lifetime.rs):

- two log heads: users' writes and the cleaner's moves; a user overwrite whose previous
  version outlived the segments the cleaner empties goes to the cleaner's head, but only
  while free segments are more than one above the users' floor;
- a writer that needs a segment with free segments at its floor + 1 cleans until two more
  are free; the victim is the best (free x age) / (live + 1) among the segments that gain at
  least half what the emptiest would and whose live blocks fit the room the cleaner's head
  has (or the emptiest, `--policy greedy`); ages on the clock of all appends;
- with `--checkpoint-blocks N`, a segment emptied that was written since the last
  checkpoint (every N appends) waits for the next before it is free.

`--oracle` puts user writes on the hot blocks on the users' head and the others on the
cleaner's (knowing which are hot: a bound for any rule that guesses). `--heads 3` adds a third head: blocks moved from segments the cleaner's heads wrote (moved
before) go apart from blocks moved for the first time. Not modelled: rows, parity, headers,
short rows, concurrency. Compare the model's figure with the engine's `relocated_bytes /
user_bytes` per window (`lograid bench --workloads steady`), not with WA.

    python3 bench/cleaner_model.py --util 0.667 --hot 0.1:0.9 --overwrites 20
"""
import argparse
import random


class Model:
    def __init__(self, segments, segment_blocks, util, hot, policy, heads, user_floor,
                 cleaner_floor, checkpoint_blocks, seed, oracle=False):
        self.rnd = random.Random(seed)
        self.segments, self.segb = segments, segment_blocks
        self.nlba = int(segments * segment_blocks * util)
        self.hot, self.policy, self.three, self.oracle = hot, policy, heads == 3, oracle
        self.user_floor, self.cleaner_floor = user_floor, cleaner_floor
        self.checkpoint_blocks = checkpoint_blocks
        self.loc = [-1] * self.nlba
        self.owner = [-1] * (segments * segment_blocks)
        self.live = [0] * segments
        self.sealed_at = [0] * segments
        self.birth = [0.0] * segments
        self.births = [0] * segments
        self.written_at = [0] * segments
        self.writer = [""] * segments
        self.free = list(range(segments))
        self.pending = []
        self.clock = 0  # every append
        self.user_clock = 0  # user appends
        self.checkpoint_at = 0
        self.threshold = None
        self.relocated = 0
        self.pending_seen = 0
        self.heads = {}
        for h in ("user", "cleaner", "again") if self.three else ("user", "cleaner"):
            s = self.free.pop(0)
            self.heads[h] = [s, 0]
            self.writer[s] = h

    def _next_segment(self, head, cleaning):
        h = self.heads[head]
        self.sealed_at[h[0]] = self.clock
        if head == "user" and not cleaning:
            while len(self.free) <= self.user_floor + 1:
                if not self._clean(self.user_floor + 3):
                    break
        h[0], h[1] = self.free.pop(0), 0
        s = h[0]
        self.live[s], self.birth[s], self.births[s], self.writer[s] = 0, 0.0, 0, head

    def _append(self, head, lba, birth, cleaning=False):
        if self.heads[head][1] == self.segb:
            self._next_segment(head, cleaning)
        h = self.heads[head]
        s = h[0]
        p = s * self.segb + h[1]
        h[1] += 1
        old = self.loc[lba]
        if old >= 0:
            self.owner[old] = -1
            self.live[old // self.segb] -= 1
        self.loc[lba], self.owner[p] = p, lba
        self.live[s] += 1
        self.births[s] += 1
        self.birth[s] += (birth - self.birth[s]) / self.births[s]
        self.clock += 1
        self.written_at[s] = self.clock
        if self.checkpoint_blocks and self.clock - self.checkpoint_at >= self.checkpoint_blocks:
            self.checkpoint_at = self.clock
            self.free.extend(self.pending)
            self.pending = []
        self.pending_seen += len(self.pending)

    def _victim(self):
        skip = {h[0] for h in self.heads.values()} | set(self.free) | set(self.pending)
        c = self.heads["cleaner"]
        room = (self.segb - c[1]) + max(0, len(self.free) - self.cleaner_floor) * self.segb
        cands = [s for s in range(self.segments)
                 if s not in skip and self.live[s] < self.segb and self.live[s] <= room]
        if not cands:
            return None
        if self.policy == "greedy":
            return min(cands, key=lambda s: self.live[s])
        best = max(self.segb - self.live[s] for s in cands)
        cands = [s for s in cands if 2 * (self.segb - self.live[s]) >= best]
        return max(cands, key=lambda s: (self.segb - self.live[s]) * (self.clock - self.sealed_at[s] + 1)
                   / (self.live[s] + 1))

    def _clean(self, target):
        while len(self.free) < target:
            v = self._victim()
            if v is None:
                return False
            age = self.user_clock - self.birth[v]
            self.threshold = age if self.threshold is None else (self.threshold * 15 + age) / 16
            head = "again" if self.three and self.writer[v] in ("cleaner", "again") else "cleaner"
            for i in range(self.segb):
                lba = self.owner[v * self.segb + i]
                if lba >= 0:
                    self._append(head, lba, self.birth[v], cleaning=True)
                    self.relocated += 1
            if self.checkpoint_blocks and self.written_at[v] > self.checkpoint_at:
                self.pending.append(v)
            else:
                self.free.append(v)
        return True

    def _pick(self):
        if self.hot is None:
            return self.rnd.randrange(self.nlba)
        fraction, share = self.hot
        nh = max(1, int(self.nlba * fraction))
        if self.rnd.random() < share:
            return self.rnd.randrange(nh)
        return nh + self.rnd.randrange(self.nlba - nh)

    def _user_write(self, lba):
        head = "user"
        if self.oracle and self.hot is not None:
            if lba >= int(self.nlba * self.hot[0]):
                head = "cleaner"
        elif self.threshold is not None:
            old = self.loc[lba] // self.segb
            long_lived = self.births[old] > 0 and self.user_clock - self.birth[old] >= self.threshold
            if long_lived and len(self.free) > self.user_floor + 1:
                head = "cleaner"
        self._append(head, lba, self.user_clock)
        self.user_clock += 1

    def run(self, overwrites, measured):
        """Relocations per user block over the last `measured` of `overwrites` overwrites."""
        for lba in range(self.nlba):
            self._user_write(lba)
        warm = int((overwrites - measured) * self.nlba)
        for _ in range(warm):
            self._user_write(self._pick())
        r0, u0, p0, c0 = self.relocated, self.user_clock, self.pending_seen, self.clock
        for _ in range(int(measured * self.nlba)):
            self._user_write(self._pick())
        return ((self.relocated - r0) / (self.user_clock - u0),
                (self.pending_seen - p0) / max(1, self.clock - c0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=255)
    ap.add_argument("--segment-blocks", type=int, default=512)
    ap.add_argument("--util", type=float, default=0.667, help="volume / all segments")
    ap.add_argument("--hot", default=None, help="FRACTION:SHARE, e.g. 0.1:0.9 (default uniform)")
    ap.add_argument("--policy", choices=["cost-benefit", "greedy"], default="cost-benefit")
    ap.add_argument("--heads", type=int, choices=[2, 3], default=2)
    ap.add_argument("--oracle", action="store_true", help="hot and cold user writes on separate heads")
    ap.add_argument("--user-floor", type=int, default=5)
    ap.add_argument("--cleaner-floor", type=int, default=3)
    ap.add_argument("--checkpoint-blocks", type=int, default=0)
    ap.add_argument("--overwrites", type=float, default=20)
    ap.add_argument("--measured", type=float, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    hot = tuple(float(x) for x in a.hot.split(":")) if a.hot else None
    m = Model(a.segments, a.segment_blocks, a.util, hot, a.policy, a.heads, a.user_floor,
              a.cleaner_floor, a.checkpoint_blocks, a.seed, a.oracle)
    relocated, pending = m.run(a.overwrites, a.measured)
    print(f"relocated per user block {relocated:.3f}; segments waiting for a checkpoint "
          f"{pending:.1f} on average")


if __name__ == "__main__":
    main()
