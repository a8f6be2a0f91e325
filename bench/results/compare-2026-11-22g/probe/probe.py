"""Where does the time go in experiment A on the attach path? CPU seconds of the server
(nbdkit / lograid serve) and of nbdfuse, and of the whole machine, per phase."""
import glob, os, sys, time, json
sys.path.insert(0, "/work/wt-pathref/bench")
import compare, stacks

LOGRAID = "/work/main/target/release/lograid"
TICK = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except OSError:
        return None

def machine():
    f = open("/proc/stat").readline().split()[1:]
    v = [int(x) for x in f]
    return (sum(v) - v[3] - v[4]) / TICK, v[4] / TICK   # busy, iowait

class Ctx: pass

def probe(kind, arg):
    a = compare.parse_args(["--lograid", LOGRAID])
    ctx = Ctx(); ctx.a = a; ctx.out = "/tmp/pathref-probe/out"; ctx.src14 = os.urandom(compare.A_FILE_BYTES)
    if kind == "ref":
        st = stacks.PathRefStack(12 << 30, "/var/tmp", LOGRAID, allocator=arg)
    else:
        st = stacks.LograidStack(arg, 3, 4 << 30, "/var/tmp", LOGRAID)
    with st:
        fuse_pid = int(open(glob.glob(os.path.join(st.state_dir, "fuse-*.pid"))[0]).read().strip())
        srv = st.server.pid
        orig = st.sync
        marks = []
        def mark(name):
            marks.append((name, time.time(), cpu(srv), cpu(fuse_pid), machine()))
        mark("start")
        m, det = compare.exp_a(ctx, st, "probe")
        mark("end")
        rss = open("/proc/%d/status" % srv).read().split("VmRSS:")[1].split("\n")[0].strip()
    (_, t0, s0, f0, (b0, w0)), (_, t1, s1, f1, (b1, w1)) = marks
    print(json.dumps({"stack": "%s-%s" % (kind, arg), "many_MBps": m["manyfiles_MBps"], "big_MBps": m["bigfile_MBps"],
                      "many_s": det["manyfiles_seconds"], "many_write_part_s": det["manyfiles_write_part_seconds"],
                      "big_s": det["bigfile_seconds"], "big_write_part_s": det["bigfile_write_part_seconds"],
                      "wall_s": round(t1 - t0, 1), "server_cpu_s": round(s1 - s0, 1), "nbdfuse_cpu_s": round(f1 - f0, 1),
                      "machine_busy_cpu_s": round(b1 - b0, 1), "iowait_s": round(w1 - w0, 1), "server_rss": rss,
                      "load": open("/proc/loadavg").read().split()[0]}), flush=True)

if __name__ == "__main__":
    os.makedirs("/tmp/pathref-probe/out", exist_ok=True)
    s = compare.Sysctls(); s.set_dirty(512 << 20, 128 << 20)
    try:
        for spec in sys.argv[1:]:
            kind, arg = spec.split(":")
            probe(kind, int(arg) if kind == "lograid" else arg)
    finally:
        s.restore()
