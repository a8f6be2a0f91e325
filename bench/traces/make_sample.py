#!/usr/bin/env python3
"""Writes sample-msr.csv: a small synthetic block trace in the SNIA / MSR
Cambridge CSV format (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime),
made up by this script for the tests of `lograid bench --patterns trace:PATH` and
of bench/steady.py; it is not a recording of any real system and nothing in it
was downloaded.

What it imitates: a server disk of 16 GiB with a few hot extents (small writes
concentrated there), sequential bursts (a log being appended, 64 KiB requests)
and scattered reads; 70% of the requests are writes; sizes from 512 bytes to
64 KiB, some not multiples of 4 KiB; timestamps in 100 ns units (Windows
FILETIME), as in the MSR traces.

    python3 bench/traces/make_sample.py            # rewrites bench/traces/sample-msr.csv
"""

import os
import random
import sys

DISK = 16 << 30
REQUESTS = 3000
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "sample-msr.csv")


def lines(seed=20261122):
    rng = random.Random(seed)
    hot = [rng.randrange(0, DISK - (64 << 20), 4096) for _ in range(4)]
    log_at = rng.randrange(0, DISK // 2, 1 << 20)
    t = 128166372000000000
    out = ["# synthetic trace written by bench/traces/make_sample.py (see there); not downloaded"]
    for _ in range(REQUESTS):
        t += rng.randrange(200, 20000)
        kind = rng.random()
        if kind < 0.15:                      # the log: sequential 64 KiB appends
            offset, size, op = log_at, 65536, "Write"
            log_at = (log_at + size) % DISK
        elif kind < 0.85:                    # hot extents: small reads and writes
            base = rng.choice(hot)
            offset = base + rng.randrange(0, 64 << 20, 512)
            size = rng.choice([512, 4096, 4096, 4096, 8192, 12288, 16384, 6144])
            op = "Write" if rng.random() < 0.75 else "Read"
        else:                                # anywhere: mostly reads
            offset = rng.randrange(0, DISK, 512)
            size = rng.choice([4096, 32768, 65536])
            op = "Read" if rng.random() < 0.8 else "Write"
        out.append("%d,sample,0,%s,%d,%d,%d" % (t, op, offset, size, rng.randrange(50, 40000)))
    return out


def main():
    text = "\n".join(lines()) + "\n"
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote %s (%d requests)" % (OUT, REQUESTS), file=sys.stderr)


if __name__ == "__main__":
    main()
