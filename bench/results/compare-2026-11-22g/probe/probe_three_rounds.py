"""Experiment A three times in a row on one path-ref stack (malloc, then sparse): is
the first round slow because nbdkit's memory is fresh? Output: probe-three-rounds.jsonl."""
import sys, os, json
sys.path.insert(0, "/work/wt-pathref/bench")
import compare, stacks
LOGRAID = "/work/main/target/release/lograid"
class Ctx: pass
a = compare.parse_args(["--lograid", LOGRAID])
ctx = Ctx(); ctx.a = a; ctx.out = "/tmp/pathref-probe/out"; ctx.src14 = os.urandom(compare.A_FILE_BYTES)
s = compare.Sysctls(); s.set_dirty(512 << 20, 128 << 20)
try:
    for alloc in ("malloc", "sparse"):
        st = stacks.PathRefStack(12 << 30, "/var/tmp", LOGRAID, allocator=alloc)
        with st:
            for i in range(3):
                m, det = compare.exp_a(ctx, st, "t")
                print(json.dumps({"alloc": alloc, "round": i + 1, "many": m["manyfiles_MBps"], "big": m["bigfile_MBps"],
                                  "many_cpu": det["manyfiles_cpu_s"], "big_cpu": det["bigfile_cpu_s"],
                                  "load": open("/proc/loadavg").read().split()[0]}), flush=True)
finally:
    s.restore()
