"""The report of bench/compare.py: what its experiments measure and how the
results are shown.

This module owns the *presentation* of a comparison: the experiments' metrics
and titles, the stacks' labels and colours, the statistics over repetitions
(median, min-max, per-repetition ratios), the markdown tables (absolute
figures, ratios, the headline, CPU per GB), the SVG charts, the markdown
report, reading a results folder back and parsing bonnie++'s CSV. It runs
nothing and touches no device or setting: the only thing it writes is the
report (compare.md and the charts) into the folder it is given.

    python3 bench/compare.py --report-only DIR     rebuilds DIR's report
"""

import glob
import json
import math
import os
import statistics
from xml.sax.saxutils import escape

from steady_report import Svg, nice_ticks, tick_label

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# The experiments, in run and report order, named by what they measure.
EXPERIMENTS = ["many-files", "random-writes", "small-files", "bonnie", "degraded-reads"]
EXP_TITLES = {
    "many-files": "many-files: many 14 MiB files vs one big file",
    "random-writes": "random-writes: random writes (O_DIRECT)",
    "small-files": "small-files: small files (4 and 8 KiB)",
    "bonnie": "bonnie: bonnie++ (one run per stack)",
    "degraded-reads": "degraded-reads: sequential read, healthy and with P members failed",
}
# Results folders written before the experiments had names call them by letters (in
# each run's "exp" and file name, in setup.json's options and skipped experiments);
# loading maps them to the names.
OLD_EXPERIMENT_NAMES = {"A": "many-files", "B": "random-writes", "C": "small-files", "D": "degraded-reads"}
OLD_OPTION_NAMES = {"a_files": "many_files_count", "a_memory": "many_files_memory",
                    "a_warm_bytes": "many_files_warm_bytes", "b_size": "random_writes_size",
                    "b_seconds": "random_writes_seconds", "c_files": "small_files_count",
                    "d_size": "degraded_reads_size"}

# The size of each file many-files writes.
MANY_FILES_FILE_BYTES = 14 * MiB
# random-writes' tests: (name, label, block sizes (None: the --bsrange/--bssplit mix), queue depth)
RANDOM_WRITE_TESTS = [("mixed-qd1", "mixed QD1", None, 1), ("mixed-qd10", "mixed QD10", None, 10),
                      ("mixed-qd100", "mixed QD100", None, 100), ("rand4k-qd32", "4 KiB QD32", "4k", 32)]


# Stacks, in table order: key -> (label, family, parity).
STACK_INFO = {
    "lograid-p1": ("lograid P=1", "lograid", 1),
    "lograid-p0": ("lograid P=0", "lograid", 0),
    "lograid-p2": ("lograid P=2", "lograid", 2),
    "btrfs-raid5": ("btrfs raid5", "btrfs", 1),
    "btrfs-raid0": ("btrfs raid0", "btrfs", 0),
    "btrfs-raid6": ("btrfs raid6", "btrfs", 2),
    "zfs-raidz1": ("zfs-fuse raidz1", "zfs", 1),
    "zfs-stripe": ("zfs-fuse stripe", "zfs", 0),
    "bare": ("bare ext4", "bare", 0),
    "ram-ext4": ("ext4 on RAM", "bare", 0),
    "path-ref": ("attach path over nbdkit memory", "ref", 0),
}
STACK_ORDER = list(STACK_INFO)
COLOURS = {"lograid-p1": "#1f77b4", "lograid-p0": "#9ecae1", "lograid-p2": "#08306b",
           "btrfs-raid5": "#d62728", "btrfs-raid0": "#ff9896", "btrfs-raid6": "#7f0000",
           "zfs-raidz1": "#2ca02c", "zfs-stripe": "#98df8a", "bare": "#7f7f7f",
           "ram-ext4": "#bcbd22", "path-ref": "#9467bd"}

# Ratio columns: (numerator, denominator). Parity over its own stripe, then lograid
# P=1 (and P=2) over each peer.
STRIPE_PAIRS = [("lograid-p1", "lograid-p0"), ("lograid-p2", "lograid-p0"),
                ("btrfs-raid5", "btrfs-raid0"), ("btrfs-raid6", "btrfs-raid0"),
                ("zfs-raidz1", "zfs-stripe")]
PEER_PAIRS = [("lograid-p1", "btrfs-raid5"), ("lograid-p1", "btrfs-raid0"), ("lograid-p1", "zfs-raidz1"),
              ("lograid-p1", "zfs-stripe"), ("lograid-p1", "bare"), ("lograid-p2", "btrfs-raid6"),
              ("lograid-p1", "ram-ext4"), ("bare", "btrfs-raid5"), ("ram-ext4", "btrfs-raid5")]
# Against the attach path alone (path-ref): how much of its ceiling lograid reaches,
# and where a peer stands beside that ceiling.
REF_PAIRS = [("lograid-p1", "path-ref"), ("lograid-p0", "path-ref"), ("btrfs-raid5", "path-ref")]


class Metric:
    """One figure of an experiment: key in a run's "metrics", label, unit, and
    whether higher is better (throughput) or lower (write amplification)."""

    def __init__(self, exp, key, label, unit, higher=True, digits=0):
        self.exp, self.key, self.label, self.unit, self.higher, self.digits = exp, key, label, unit, higher, digits


def _metrics():
    m = [Metric("many-files", "manyfiles_MBps", "many 14 MiB files", "MB/s"),
         Metric("many-files", "bigfile_MBps", "one big file", "MB/s"),
         Metric("many-files", "manyfiles_wa", "many files WA", "x", False, 2),
         Metric("many-files", "bigfile_wa", "big file WA", "x", False, 2)]
    for name, label, _, _ in RANDOM_WRITE_TESTS:
        m.append(Metric("random-writes", name + "_iops", label, "IOPS"))
    for name, label, _, _ in RANDOM_WRITE_TESTS:
        m.append(Metric("random-writes", name + "_MBps", label, "MB/s", True, 1))
    for name, label, _, _ in RANDOM_WRITE_TESTS:
        m.append(Metric("random-writes", name + "_wa", label + " WA", "x", False, 2))
    m += [Metric("small-files", "create_fps", "create", "files/s"),
          Metric("small-files", "copy_fps", "copy", "files/s"),
          Metric("small-files", "delete_fps", "delete", "files/s"),
          Metric("small-files", "create_wa", "create WA", "x", False, 2),
          Metric("small-files", "copy_wa", "copy WA", "x", False, 2),
          Metric("bonnie", "block_write_KBps", "block write", "KB/s"),
          Metric("bonnie", "rewrite_KBps", "rewrite", "KB/s"),
          Metric("bonnie", "block_read_KBps", "block read", "KB/s"),
          Metric("bonnie", "seeks_per_s", "random seeks", "/s"),
          Metric("bonnie", "seq_create_per_s", "seq create", "/s"),
          Metric("bonnie", "seq_delete_per_s", "seq delete", "/s"),
          Metric("bonnie", "rand_create_per_s", "random create", "/s"),
          Metric("bonnie", "rand_delete_per_s", "random delete", "/s"),
          Metric("degraded-reads", "healthy_MBps", "healthy", "MB/s"),
          Metric("degraded-reads", "degraded_MBps", "P members failed", "MB/s"),
          Metric("degraded-reads", "degraded_ratio", "degraded / healthy", "x", True, 2)]
    return m


METRICS = _metrics()
METRIC_BY_KEY = {(m.exp, m.key): m for m in METRICS}

# Charts: per experiment, panels of (title, unit, metric keys, log scale).
CHARTS = {
    "many-files": [
        ("MB/s including the final sync", "MB/s", ["manyfiles_MBps", "bigfile_MBps"], False),
        ("write amplification at the members", "x", ["manyfiles_wa", "bigfile_wa"], False)],
    "random-writes": [
        ("IOPS (log scale)", "IOPS", [t[0] + "_iops" for t in RANDOM_WRITE_TESTS], True),
        ("write amplification at the members", "x", [t[0] + "_wa" for t in RANDOM_WRITE_TESTS], False)],
    "small-files": [
        ("files/s including the final sync", "files/s", ["create_fps", "copy_fps", "delete_fps"], False),
        ("write amplification at the members", "x", ["create_wa", "copy_wa"], False)],
    "bonnie": [
        ("block I/O, KB/s", "KB/s", ["block_write_KBps", "rewrite_KBps"], False),
        ("file operations per second", "/s", ["seq_create_per_s", "rand_create_per_s", "rand_delete_per_s"], False)],
    "degraded-reads": [
        ("sequential 1 MiB reads, MB/s", "MB/s", ["healthy_MBps", "degraded_MBps"], False)],
}

# The headline: lograid P=1 against btrfs raid5.
HEADLINE = [("many-files", "manyfiles_MBps"), ("many-files", "bigfile_MBps"),
            ("random-writes", "rand4k-qd32_iops"), ("random-writes", "mixed-qd1_iops"),
            ("random-writes", "mixed-qd10_iops"), ("random-writes", "mixed-qd100_iops"),
            ("small-files", "create_fps"), ("small-files", "copy_fps"), ("small-files", "delete_fps"),
            ("many-files", "manyfiles_wa"), ("random-writes", "rand4k-qd32_wa"), ("random-writes", "mixed-qd10_wa"),
            ("small-files", "create_wa"),
            ("degraded-reads", "healthy_MBps"), ("degraded-reads", "degraded_MBps"),
            ("degraded-reads", "degraded_ratio")]


# ----- statistics and tables (pure functions; see test_report.py) --------------------------

def summarize(values):
    """min / median / max / n of the numbers in `values` (None skipped); None if none."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}


def metric_values(runs, exp, stack, key):
    """{rep: value} of one metric of one stack (runs without it are left out)."""
    out = {}
    for r in runs:
        if r["exp"] == exp and r["stack"] == stack:
            v = (r.get("metrics") or {}).get(key)
            if v is not None:
                out[r["rep"]] = v
    return out


def rep_ratios(runs, exp, key, num, den):
    """Ratio num/den of a metric within each repetition that has both (the stacks of
    one repetition ran back to back, so these are the noise-robust figures)."""
    a, b = metric_values(runs, exp, num, key), metric_values(runs, exp, den, key)
    return [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]


def fmt_num(v, digits=0):
    """A number for a table: thousands separators; 2 significant digits below 10
    when digits == 0."""
    if v is None:
        return "-"
    if digits == 0 and abs(v) < 10 and v != int(v):
        return "%.2g" % v if abs(v) >= 1 else "%.2f" % v
    return "{:,.{}f}".format(v, digits)


def fmt_compact(v, digits=0):
    """A short number for a bar label: 43k, 9.4k, 712, 1.52."""
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return "%.3gM" % (v / 1e6)
    if abs(v) >= 1e4:
        return "%.0fk" % (v / 1e3)
    if abs(v) >= 1e3:
        return "%.1fk" % (v / 1e3)
    return fmt_num(v, digits)


def fmt_cell(summary, digits=0):
    """'median (min-max)', or the value alone for one repetition; '-' for none."""
    if summary is None:
        return "-"
    med = fmt_num(summary["median"], digits)
    if summary["n"] == 1 or summary["min"] == summary["max"]:
        return med
    return "%s (%s–%s)" % (med, fmt_num(summary["min"], digits), fmt_num(summary["max"], digits))


def fmt_ratio(summary):
    if summary is None:
        return "-"
    if summary["n"] == 1 or summary["min"] == summary["max"]:
        return "%.2f" % summary["median"]
    return "%.2f (%.2f–%.2f)" % (summary["median"], summary["min"], summary["max"])


def stacks_in(runs):
    """Stack keys that have runs, in table order."""
    have = {r["stack"] for r in runs}
    return [s for s in STACK_ORDER if s in have] + sorted(have - set(STACK_ORDER))


def label(stack):
    return STACK_INFO.get(stack, (stack,))[0]


def absolute_table(runs, exp):
    """Markdown: one row per metric of `exp`, one column per stack, median (min-max)."""
    stacks = stacks_in([r for r in runs if r["exp"] == exp])
    if not stacks:
        return ""
    lines = ["| metric | " + " | ".join(label(s) for s in stacks) + " |",
             "|---|" + "--:|" * len(stacks)]
    for m in METRICS:
        if m.exp != exp:
            continue
        cells = [fmt_cell(summarize(metric_values(runs, exp, s, m.key).values()), m.digits) for s in stacks]
        cells = ["too fast" if c == "-" and too_fast(runs, exp, s, m.key) else c for c, s in zip(cells, stacks)]
        if all(c == "-" for c in cells):
            continue
        lines.append("| %s (%s) | %s |" % (m.label, m.unit, " | ".join(cells)))
    return "\n".join(lines) + "\n"


def ratio_pairs(runs, exp):
    """The ratio columns that apply: both stacks have runs of `exp`."""
    have = {r["stack"] for r in runs if r["exp"] == exp}
    return [p for p in STRIPE_PAIRS + PEER_PAIRS + REF_PAIRS if p[0] in have and p[1] in have]


def ratio_table(runs, exp):
    """Markdown: one row per metric, one column per pair, per-repetition ratios as
    median (min-max)."""
    pairs = ratio_pairs(runs, exp)
    if not pairs:
        return ""
    lines = ["| metric | " + " | ".join("%s / %s" % (label(a), label(b)) for a, b in pairs) + " |",
             "|---|" + "--:|" * len(pairs)]
    for m in METRICS:
        if m.exp != exp:
            continue
        cells = [fmt_ratio(summarize(rep_ratios(runs, exp, m.key, a, b))) for a, b in pairs]
        if all(c == "-" for c in cells):
            continue
        lines.append("| %s (%s) | %s |" % (m.label, "lower is better" if not m.higher else m.unit,
                                           " | ".join(cells)))
    return "\n".join(lines) + "\n"


def headline_table(runs, num="lograid-p1", den="btrfs-raid5"):
    """Markdown: the key figures of `num` against `den`, absolute and as ratios."""
    lines = ["| figure | %s | %s | %s / %s | better |" % (label(num), label(den), label(num), label(den)),
             "|---|--:|--:|--:|---|"]
    rows = 0
    for exp, key in HEADLINE:
        m = METRIC_BY_KEY[(exp, key)]
        a = summarize(metric_values(runs, exp, num, key).values())
        b = summarize(metric_values(runs, exp, den, key).values())
        if a is None and b is None:
            continue
        q = summarize(rep_ratios(runs, exp, key, num, den))
        lines.append("| %s: %s (%s) | %s | %s | %s | %s |" % (
            exp, m.label, m.unit, fmt_cell(a, m.digits), fmt_cell(b, m.digits), fmt_ratio(q),
            "higher" if m.higher else "lower"))
        rows += 1
    return "\n".join(lines) + "\n" if rows else ""


BONNIE_FIELDS = {"block_write_KBps": 11, "rewrite_KBps": 13, "block_read_KBps": 17, "seeks_per_s": 19,
                 "seq_create_per_s": 26, "seq_read_per_s": 28, "seq_delete_per_s": 30,
                 "rand_create_per_s": 32, "rand_read_per_s": 34, "rand_delete_per_s": 36}


def bonnie_too_fast(text):
    """The bonnie++ figures reported as '+++++' (too fast to measure)."""
    line = next((ln for ln in text.splitlines() if ln.count(",") > 30), None)
    if line is None:
        return []
    f = line.split(",")
    return sorted(k for k, i in BONNIE_FIELDS.items() if i < len(f) and f[i].startswith("+"))


def parse_bonnie_csv(text):
    """bonnie++ 1.98+/2.x CSV line -> metrics (None for '+++++' or missing fields)."""
    line = next((ln for ln in text.splitlines() if ln.count(",") > 30), None)
    if line is None:
        return {}
    f = line.split(",")

    def num(i):
        try:
            return float(f[i]) if f[i].strip() and "+" not in f[i] else None
        except (IndexError, ValueError):
            return None
    return {k: num(i) for k, i in BONNIE_FIELDS.items()}


def too_fast(runs, exp, stack, key):
    """Whether a run of `stack` reported `key` as too fast to measure (bonnie++'s '+++++')."""
    return any(r["exp"] == exp and r["stack"] == stack and key in ((r.get("details") or {}).get("too_fast") or [])
               for r in runs)


def fmt_duration(seconds):
    seconds = int(round(seconds))
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%ds" % seconds


# ----- SVG --------------------------------------------------------------------------------

# Chart layout, in pixels: panel width and height, left margin (axis labels), space
# above a panel (its title) and below it (group labels).
PANEL_W, PANEL_H, MARGIN_L, PANEL_TOP, PANEL_BOTTOM = 620, 250, 80, 40, 60


def chart(runs, exp, title):
    """Grouped bars: one group per metric, one bar per stack (median), a whisker from
    min to max over the repetitions; one panel per unit."""
    panels = [p for p in CHARTS.get(exp, []) if any(
        metric_values(runs, exp, s, k) for s in stacks_in(runs) for k in p[2])]
    stacks = stacks_in([r for r in runs if r["exp"] == exp])
    W = MARGIN_L + PANEL_W + 200
    H = 50 + max(len(panels), 1) * (PANEL_TOP + PANEL_H + PANEL_BOTTOM)
    svg = Svg(W, H)
    svg.text(W / 2, 26, title, size=15, anchor="middle", weight="bold")
    if not panels or not stacks:
        svg.text(W / 2, 70, "no data", anchor="middle")
        return svg.render()
    for pi, panel in enumerate(panels):
        y0 = 50 + pi * (PANEL_TOP + PANEL_H + PANEL_BOTTOM) + PANEL_TOP
        chart_panel(svg, runs, exp, stacks, panel, MARGIN_L, y0)
    chart_legend(svg, stacks, MARGIN_L + PANEL_W + 20, 60)
    return svg.render()


def y_scale(cells, logscale, y0):
    """(ticks, value -> y) of a panel at y0 that shows the summaries `cells`: powers of
    ten on a log scale, else round steps from 0."""
    top = max([c["max"] for c in cells.values() if c] + [1e-9])
    if logscale:
        low = min([c["min"] for c in cells.values() if c and c["min"] > 0] + [top])
        lo_e, hi_e = math.floor(math.log10(low)), math.ceil(math.log10(top * 1.05))
        if hi_e == lo_e:
            hi_e += 1
        yt = [10 ** e for e in range(lo_e, hi_e + 1)]

        def ymap(v):
            v = max(v, yt[0])
            return y0 + PANEL_H - (math.log10(v) - lo_e) / (hi_e - lo_e) * PANEL_H
    else:
        yt = nice_ticks(0, top * 1.08, 5)

        def ymap(v):
            return y0 + PANEL_H - v / yt[-1] * PANEL_H
    return yt, ymap


def chart_panel(svg, runs, exp, stacks, panel, x0, y0):
    """One panel (title, unit, metric keys, log scale) with its top left corner at
    (x0, y0): grid, axis, and a group of bars per metric."""
    ptitle, unit, keys, logscale = panel
    keys = [k for k in keys if any(metric_values(runs, exp, s, k) for s in stacks)]
    cells = {(k, s): summarize(metric_values(runs, exp, s, k).values()) for k in keys for s in stacks}
    yt, ymap = y_scale(cells, logscale, y0)
    for v in yt:
        y = ymap(v)
        svg.line(x0, y, x0 + PANEL_W, y, "#e4e4e4")
        svg.line(x0 - 4, y, x0, y)
        svg.text(x0 - 7, y + 4, tick_label(v), size=11, anchor="end")
    svg.text(x0 + PANEL_W / 2, y0 - 10, ptitle, size=13, anchor="middle", weight="bold")
    svg.text(x0 - 58, y0 + PANEL_H / 2, unit, size=12, anchor="middle", rotate=-90)
    gw = PANEL_W / max(len(keys), 1)
    bw = min(34.0, gw * 0.8 / max(len(stacks), 1))
    base = ymap(yt[0]) if logscale else ymap(0)
    for gi, k in enumerate(keys):
        gx = x0 + gi * gw + (gw - bw * len(stacks)) / 2
        m = METRIC_BY_KEY.get((exp, k))
        svg.text(x0 + gi * gw + gw / 2, y0 + PANEL_H + 18, m.label if m else k, size=12, anchor="middle")
        for si, s in enumerate(stacks):
            x = gx + si * bw
            if not cells[(k, s)]:
                svg.text(x + bw / 2, y0 + PANEL_H - 4, "fast" if too_fast(runs, exp, s, k) else "n/a", size=8,
                         anchor="middle", colour="#999")
                continue
            chart_bar(svg, s, m.label if m else k, m.digits if m else 0, cells[(k, s)], x, bw, base, ymap)
    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#222"/>'
            % (x0, y0, PANEL_W, PANEL_H))


def chart_bar(svg, stack, metric_label, digits, c, x, bw, base, ymap):
    """One stack's bar at x, bw wide, from y `base` to its median; a whisker from min
    to max if they differ; the median above it."""
    yb, yv = base, ymap(c["median"])
    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>'
            % (x + 1, min(yv, yb), bw - 2, abs(yb - yv), COLOURS.get(stack, "#555"),
               escape("%s, %s: %s" % (label(stack), metric_label, fmt_cell(c, digits)))))
    if c["n"] > 1 and c["max"] > c["min"]:
        xm = x + bw / 2
        svg.line(xm, ymap(c["min"]), xm, ymap(c["max"]), "#222", 1.2)
        svg.line(xm - 4, ymap(c["min"]), xm + 4, ymap(c["min"]), "#222", 1.2)
        svg.line(xm - 4, ymap(c["max"]), xm + 4, ymap(c["max"]), "#222", 1.2)
    svg.text(x + bw / 2, min(yv, ymap(c["max"])) - 4, fmt_compact(c["median"], digits),
             size=8, anchor="middle", colour="#333")


def chart_legend(svg, stacks, lx, ly):
    """The colour of each stack, from (lx, ly) down."""
    svg.text(lx, ly, "stack (bar: median;", size=11, weight="bold")
    svg.text(lx, ly + 14, "whisker: min-max)", size=11, weight="bold")
    for i, s in enumerate(stacks):
        y = ly + 36 + i * 20
        svg.add('<rect x="%.1f" y="%.1f" width="14" height="12" fill="%s"/>' % (lx, y - 10, COLOURS.get(s, "#555")))
        svg.text(lx + 20, y, label(s), size=12)


# ----- report ------------------------------------------------------------------------------

def experiment_name(exp):
    """The name of an experiment, also of one an old results folder calls by its letter."""
    return OLD_EXPERIMENT_NAMES.get(exp, exp)


def load_runs(out):
    """The runs of a results folder (OUT/raw/*.json, in file name order), each with its
    experiment by name."""
    runs = []
    for p in sorted(glob.glob(os.path.join(out, "raw", "*.json"))):
        with open(p) as f:
            run = json.load(f)
        run["exp"] = experiment_name(run["exp"])
        runs.append(run)
    return runs


def upgrade_setup(setup):
    """setup.json's contents with the experiments (and the options named after them)
    by name, also from an old results folder that has letters; a new dict."""
    setup = dict(setup)
    opts = {OLD_OPTION_NAMES.get(k, k): v for k, v in (setup.get("options") or {}).items()}
    if isinstance(opts.get("exps"), list):
        opts["exps"] = [experiment_name(e) for e in opts["exps"]]
    if isinstance(opts.get("experiments"), str):
        opts["experiments"] = ",".join(experiment_name(e.strip()) for e in opts["experiments"].split(","))
    setup["options"] = opts
    if setup.get("skipped_exps"):
        setup["skipped_exps"] = {k: {experiment_name(e): why for e, why in per.items()}
                                 for k, per in setup["skipped_exps"].items()}
    return setup


def load_setup(out):
    """OUT/setup.json, with the experiments by name (see upgrade_setup)."""
    with open(os.path.join(out, "setup.json")) as f:
        return upgrade_setup(json.load(f))


def write_report(out, setup, runs):
    """Write compare.md and the SVG charts into `out`; returns the markdown."""
    L = report_head(setup, runs)
    head = headline_table(runs)
    if head:
        L += ["## lograid P=1 against btrfs raid5", "", head]
    for exp in EXPERIMENTS:
        if any(r["exp"] == exp for r in runs):
            L += experiment_section(out, setup, runs, exp)
    L += problems_section(setup, runs)
    L += ["## Versions", ""]
    for k, v in sorted(((setup.get("machine") or {}).get("versions") or {}).items()):
        L.append("- %s: %s" % (k, v if v else "not installed"))
    L.append("")
    md = "\n".join(L)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(md)
    return md


def report_head(setup, runs):
    """The report's lines up to the headline: date, machine, load, setup, the stacks
    (how each is built, which are skipped and why) and how to read the figures."""
    a = setup.get("options", {})
    mach = setup.get("machine", {})
    L = ["# lograid beside its peers (bench/compare.py)", ""]
    L.append("Date: %s to %s. Machine: %s; kernel %s; member files on %s (%s)." % (
        setup.get("started", "?"), setup.get("finished", "(unfinished)"), mach.get("summary", "?"),
        mach.get("kernel", "?"), (mach.get("dir") or {}).get("mount", "?"), mach.get("disk", "?")))
    loads = summarize([r["load_before"][0] for r in runs if r.get("load_before")])
    if loads:
        L.append("Load average (1 min) before each run: median %.1f (%.1f–%.1f) on %s CPUs; other work "
                 "shares this machine, so trust the within-repetition ratios more than absolute figures." % (
                     loads["median"], loads["min"], loads["max"], mach.get("cpus", "?")))
    L.append("")
    L.append("Setup: %d member files of %s per stack (sparse, `losetup --direct-io=on`), %d repetition(s), "
             "stacks interleaved within each repetition (order rotated per repetition), every stack "
             "built fresh for every experiment. vm.dirty_bytes %s, vm.dirty_background_bytes %s during the "
             "run (restored after). Elapsed: %s." % (
                 a.get("members", 0), human(a.get("member_size")), a.get("reps", 0),
                 human(a.get("dirty_bytes")), human(a.get("dirty_background_bytes")),
                 fmt_duration(setup.get("elapsed_seconds", 0))))
    L.append("")
    L += stacks_table(setup)
    L.append("")
    L.append("Figures are median (min–max) over the repetitions; ratios are computed within each "
             "repetition (the stacks of one repetition ran back to back) and then summarised the same way. "
             "WA = bytes written to the member loop devices (`/sys/block/loopN/stat` field 7 x 512) during "
             "the phase and the sync after it / bytes the workload wrote.")
    L.append("")
    return L


def stacks_table(setup):
    """Markdown lines: how each stack is built, which were skipped and which did not
    run some experiments, with the reasons."""
    L = ["| stack | how it is built |", "|---|---|"]
    for s in setup.get("stacks", []):
        L.append("| %s | %s |" % (label(s["key"]), s["describe"]))
    for k, why in sorted((setup.get("skipped") or {}).items()):
        L.append("| %s | skipped: %s |" % (label(k), why))
    for k, per in sorted((setup.get("skipped_exps") or {}).items()):
        for why, exps_ in group_reasons(per):
            L.append("| %s | not run in %s: %s |" % (label(k), ", ".join(exps_), why))
    return L


def experiment_section(out, setup, runs, exp):
    """The lines of one experiment's section (what it does, who skipped it, its chart,
    absolute figures, notes, ratios); writes its chart into `out`."""
    a = setup.get("options", {})
    L = ["## " + EXP_TITLES[exp], "", exp_description(exp, a), ""]
    not_here = [(k, per[exp]) for k, per in sorted((setup.get("skipped_exps") or {}).items()) if exp in per]
    if not_here:
        L += ["Not run here: %s." % "; ".join("%s (%s)" % (label(k), why) for k, why in not_here), ""]
    L += ["![%s](%s.svg)" % (EXP_TITLES[exp], exp), ""]
    L += [absolute_table(runs, exp)]
    if exp == "random-writes":
        L += [engine_note(runs)]
    if exp == "many-files":
        L += [cpu_table(runs)]
    rt = ratio_table(runs, exp)
    if rt:
        L += ["Ratios (per repetition, then median (min–max)):", "", rt]
    with open(os.path.join(out, exp + ".svg"), "w") as f:
        f.write(chart(runs, exp, EXP_TITLES[exp]))
    return L


def problems_section(setup, runs):
    """The notes of the run and the failed runs, if any."""
    errs = [r for r in runs if r.get("error")]
    notes = list(setup.get("notes") or [])
    if not errs and not notes:
        return []
    L = ["## Problems and notes", ""]
    L += ["- %s" % n for n in notes]
    L += ["- %s on %s, repetition %d: %s" % (r["exp"], label(r["stack"]), r["rep"], r["error"]) for r in errs]
    L.append("")
    return L


CPU_PHASES = [("manyfiles", "many files"), ("bigfile", "big file")]
CPU_WHO = [("server", "NBD server"), ("nbdfuse", "nbdfuse"), ("machine", "whole machine")]


def cpu_table(runs):
    """Markdown: CPU seconds per GB written in each phase of many-files (median (min-max)), for
    the NBD server, nbdfuse and the whole machine (which includes other work)."""
    stacks = stacks_in([r for r in runs if r["exp"] == "many-files"])
    rows = []
    for phase, plabel in CPU_PHASES:
        for who, wlabel in CPU_WHO:
            cells, any_ = [], False
            for s in stacks:
                vals = []
                for r in runs:
                    d = r.get("details") or {}
                    c = (d.get(phase + "_cpu_s") or {}).get(who)
                    if r["exp"] == "many-files" and r["stack"] == s and c is not None and d.get("total_bytes"):
                        vals.append(c / (d["total_bytes"] / 1e9))
                any_ = any_ or bool(vals)
                cells.append(fmt_cell(summarize(vals), 2))
            if any_:
                rows.append("| %s: %s | %s |" % (plabel, wlabel, " | ".join(cells)))
    if not rows:
        return ""
    return ("CPU seconds per GB written, phase including its sync (`/proc/PID/stat` of the NBD server "
            "and of the attach's nbdfuse; whole machine from `/proc/stat`, other work included; kernel "
            "threads doing the loop and FUSE work count only there; on a machine kept busy by other work "
            "it is close to the CPUs x the phase's seconds, so it does not attribute anything):\n\n"
            "| phase: process | " + " | ".join(label(s) for s in stacks) + " |\n"
            "|---|" + "--:|" * len(stacks) + "\n" + "\n".join(rows) + "\n")


def group_reasons(per_exp):
    """{exp: reason} -> [(reason, [exps in experiment order])], one entry per reason."""
    out = {}
    for e in EXPERIMENTS + sorted(set(per_exp) - set(EXPERIMENTS)):
        if e in per_exp:
            out.setdefault(per_exp[e], []).append(e)
    return list(out.items())


def engine_note(runs):
    """How lograid's own member counters compare with the loop devices', and its WA
    per engine block (whole 4 KiB blocks) beside the WA per fio byte."""
    same = total = 0
    per_stack = {}
    for r in runs:
        if r["exp"] != "random-writes" or not r["stack"].startswith("lograid") or not r.get("details"):
            continue
        for name, _, _, _ in RANDOM_WRITE_TESTS:
            d = r["details"].get(name)
            if not isinstance(d, dict) or "engine_member_bytes" not in d:
                continue
            total += 1
            same += d["engine_member_bytes"] == d["member_bytes"]
            if d.get("engine_wa") is not None:
                per_stack.setdefault((r["stack"], name), []).append(d["engine_wa"])
    if not total:
        return ""
    parts = ["%s %s %s" % (label(s), n, fmt_cell(summarize(v), 2)) for (s, n), v in sorted(per_stack.items())]
    return ("lograid's own member counters (`lograid status --json`, published by the server) equalled the "
            "loop devices' in %d of %d tests. Its WA per engine block (member bytes / the engine's "
            "`user_bytes_written`, which counts partly written 4 KiB blocks whole): %s.\n" % (
                same, total, "; ".join(parts)))


def human(n):
    if not n:
        return "-"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % n


def exp_description(exp, a):
    if exp == "many-files":
        return ("%d files of 14 MiB (%s, %.1f x vm.dirty_bytes) written into one directory, then one file "
                "of the same total; MB/s include the final syncfs; before each phase the caches are dropped and "
                "the guest's free page reporting is let finish, so every stack starts on the same (cold) "
                "memory%s. lograid: ext4 on `lograid attach` "
                "(%s + loop); btrfs, zfs: their own filesystem; bare: ext4; attach path over nbdkit "
                "memory: ext4 on `lograid attach` of nbdkit's memory plugin (RAM: the path's own ceiling; "
                "no members, so no WA; %d untimed run(s) of the workload first); ext4 on RAM: ext4 on a loop "
                "device over a tmpfs file (no disk at all; the loop copies into tmpfs, so not a ceiling)." % (
                    a.get("many_files_count", 0), human(a.get("many_files_count", 0) * MANY_FILES_FILE_BYTES),
                    a.get("many_files_count", 0) * MANY_FILES_FILE_BYTES / max(a.get("dirty_bytes") or 1, 1),
                    "" if a.get("many_files_memory", "cold") != "warm" else
                    (", then %s is written to tmpfs and deleted (--many-files-memory warm), so the phase's "
                     "page cache gets recently used memory" % human(a.get("many_files_warm_bytes") or 0)),
                    "its own FUSE file" if a.get("lograid_attach", "nbdfuse") == "fuse" else "nbdfuse",
                    a.get("path_ref_warmup", 0)))
    if exp == "random-writes":
        return ("fio randwrite, O_DIRECT, %s (mixed) and 4 KiB, %d s per test, into a %s file laid out first "
                "(lograid: the first %s of the volume through fio's nbd engine; others: libaio on a file in "
                "the filesystem); end_fsync=1. IOPS and MB/s are fio's; WA includes the sync after fio. "
                "lograid writes a partly covered 4 KiB block whole, so its WA per fio byte for mixed sizes "
                "is above its per-block figure (`engine_wa` in raw/)." % (
                    ("bssplit " + a["bssplit"]) if a.get("bssplit") else ("bsrange " + a.get("bsrange", "?")),
                    a.get("random_writes_seconds", 0), human(a.get("random_writes_size")),
                    human(a.get("random_writes_size"))))
    if exp == "small-files":
        return ("%d files, half 4 KiB and half 8 KiB, in 100 directories: created, copied "
                "(`cp -a --reflink=never`), the originals deleted (`rm -rf`); each phase timed including "
                "syncfs. Filesystems as in many-files." % a.get("small_files_count", 0))
    if exp == "bonnie":
        return ("`bonnie++ -s %d -r %d -n %s -f -u root`, once per stack (repetition 1). With this much RAM "
                "its read and rewrite figures come largely from the page cache; block write and the file "
                "operations are the meaningful ones; \"too fast\" is bonnie++'s +++++ (under its timer's "
                "resolution; \"fast\" in the chart). Filesystems as in many-files." % (
                    a.get("bonnie_mb", 0), a.get("bonnie_mb", 0) // 2, a.get("bonnie_files", "?")))
    if exp == "degraded-reads":
        return ("%s written sequentially (1 MiB, QD16, O_DIRECT), page cache dropped, read back the same "
                "way; then P member loop devices detached and read again (btrfs: unmount, `mount -o "
                "degraded,ro` on the rest; lograid: server stopped and started `--read-only` on the "
                "remaining members: the pool opens degraded). lograid through fio's nbd engine, the "
                "others from a file in their filesystem. Stacks without parity have no degraded figure." % (
                    human(a.get("degraded_reads_size"))))
    return ""
