"""The report of bench/wear/wear_run.py: write amplification at the member disks.

This module owns the *presentation* of a wear run: what a measured phase's write
amplification is, which stack and workload each phase belongs to, the comparisons
against the targets and the published table, the markdown tables (wear.md) and the
chart (wear.svg). It runs nothing; the only files it writes are the report's, into
the folder it is given.

A phase (one line of results.jsonl, written in the guest by guest/wear.sh) holds the
stack ("zfs-raidz1", "md-raid5-journal", "lograid-p2", ...), its variant ("zvol-default",
"zvol-4k", "dataset", "block", "ext4", "file", "fs", "nbd"), the workload ("random-4k" with
its fill, or "many-files"), the bytes the workload wrote (user_bytes) and the bytes the
disks' counters say were written (member_bytes, every member disk and the md journal disk,
discards not included), read (member_read_bytes) and discarded.

    python3 bench/wear/wear_run.py --report-only DIR     rebuilds DIR's report
"""

import json
import math
import os

from steady_report import Svg

MiB, GiB = 1 << 20, 1 << 30

# Stacks in table order: key -> (label, family, parity).
STACKS = {
    "zfs-raidz1": ("OpenZFS raidz1", "zfs", 1),
    "md-raid5": ("md RAID 5", "md", 1),
    "md-raid5-journal": ("md RAID 5 + write journal", "md", 1),
    "btrfs-raid5": ("btrfs raid5", "btrfs", 1),
    "lograid-p1": ("lograid P=1", "lograid", 1),
    "zfs-raidz2": ("OpenZFS raidz2", "zfs", 2),
    "md-raid6": ("md RAID 6", "md", 2),
    "md-raid6-journal": ("md RAID 6 + write journal", "md", 2),
    "btrfs-raid6": ("btrfs raid6", "btrfs", 2),
    "lograid-p2": ("lograid P=2", "lograid", 2),
    "zfs-raidz3": ("OpenZFS raidz3", "zfs", 3),
    "lograid-p3": ("lograid P=3", "lograid", 3),
}
# ZFS measures three things per layout, each its own row; the other stacks' variants
# (a block device or file for the random writes, a filesystem for the files) share one row.
ZFS_VARIANTS = [("zvol-default", "zvol, default volblocksize"), ("zvol-4k", "zvol, volblocksize 4K"),
                ("dataset", "dataset (files, recordsize 128K)")]
# The published wear table (random writes of 512 B-64 KiB, measured at the drives).
PUBLISHED = {"zfs-raidz1": 11.5, "zfs-raidz2": 16.3, "zfs-raidz3": 23.0}
PUBLISHED_LINEAR = "1.3-1.5"
# Targets: lograid's WA against each peer at its parity level, at most this fraction of it.
TARGETS = [("zfs-raidz", 1 / 5), ("md-raid", 1 / 2)]
PARITY_PEERS = {1: {"zfs-raidz": "zfs-raidz1", "md-raid": "md-raid5"},
                2: {"zfs-raidz": "zfs-raidz2", "md-raid": "md-raid6"},
                3: {"zfs-raidz": "zfs-raidz3"}}
WORKLOAD_COLOURS = ["#6baed6", "#08519c", "#e6550d"]


def load_results(path):
    """The phases in a results.jsonl (later lines win over earlier ones for the same cell)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def wa(rec):
    """Member bytes written per byte the workload wrote (None without user bytes)."""
    if not rec or not rec.get("user_bytes"):
        return None
    return rec["member_bytes"] / rec["user_bytes"]


def read_ratio(rec):
    if not rec or not rec.get("user_bytes"):
        return None
    return rec.get("member_read_bytes", 0) / rec["user_bytes"]


def row_key(rec):
    """The table row a phase belongs to: (stack, ZFS variant or "")."""
    if rec["stack"].startswith("zfs-"):
        return (rec["stack"], rec["variant"])
    return (rec["stack"], "")


def column_key(rec):
    """The table column: ("random-4k", fill) or ("many-files", 0)."""
    if rec["workload"] == "random-4k":
        return ("random-4k", float(rec["fill"]))
    return (rec["workload"], 0.0)


def row_label(key):
    stack, variant = key
    label = STACKS.get(stack, (stack,))[0]
    if variant:
        label += ", " + dict(ZFS_VARIANTS).get(variant, variant)
    return label


def index(results):
    """{(row, column): phase}, the last phase measured for each cell."""
    cells = {}
    for rec in results:
        cells[(row_key(rec), column_key(rec))] = rec
    return cells


def rows_in(results):
    """The rows present, in table order (unknown stacks last, by name)."""
    present = {row_key(r) for r in results}
    order = []
    for stack in STACKS:
        if stack.startswith("zfs-"):
            order += [(stack, v) for v, _ in ZFS_VARIANTS]
        else:
            order.append((stack, ""))
    return [k for k in order if k in present] + sorted(present - set(order))


def columns_in(results):
    cols = {column_key(r) for r in results}
    return sorted(cols, key=lambda c: (c[0] != "random-4k", c[1], c[0]))


def column_label(col):
    if col[0] == "random-4k":
        return "random 4 KiB, %d%% full" % round(col[1] * 100)
    if col[0] == "many-files":
        return "many 14 MiB files"
    return col[0]


def fmt(v, digits=2):
    return "-" if v is None else "%.*f" % (digits, v)


def human(n):
    for unit, size in (("GiB", GiB), ("MiB", MiB)):
        if n >= size:
            return "%.2f %s" % (n / size, unit) if unit == "GiB" else "%.0f %s" % (n / size, unit)
    return "%d B" % n


def stack_wa(cells, stack, variant, col):
    """WA of one stack's cell; for ZFS the given variant, else the stack's one row."""
    key = (stack, variant if stack.startswith("zfs-") else "")
    return wa(cells.get((key, col)))


def comparisons(results):
    """lograid P=k against each peer at parity level k, per workload column:
    dicts with parity, column, peer (row key), lograid and peer WA, ratio, limit, met."""
    cells = index(results)
    out = []
    for col in columns_in(results):
        for parity, peers in sorted(PARITY_PEERS.items()):
            mine = wa(cells.get((("lograid-p%d" % parity, ""), col)))
            for family, limit in TARGETS:
                peer = peers.get(family)
                if not peer:
                    continue
                if family == "zfs-raidz":
                    variants = ["dataset"] if col[0] == "many-files" else ["zvol-default", "zvol-4k", "dataset"]
                    peer_rows = [(peer, v) for v in variants]
                else:
                    peer_rows = [(peer, ""), (peer + "-journal", "")]
                for prow in peer_rows:
                    theirs = wa(cells.get((prow, col)))
                    if mine is None or theirs is None:
                        continue
                    ratio = mine / theirs
                    out.append({"parity": parity, "column": col, "peer": prow, "lograid": mine, "peer_wa": theirs,
                                "ratio": ratio, "limit": limit, "met": ratio <= limit})
    return out


def wa_table(results):
    cells = index(results)
    cols = columns_in(results)
    L = ["| stack | " + " | ".join(column_label(c) for c in cols) + " |",
         "|---|" + "--:|" * len(cols)]
    for row in rows_in(results):
        vals = []
        for c in cols:
            rec = cells.get((row, c))
            vals.append("-" if rec is None else "**%s**" % fmt(wa(rec)))
        L.append("| %s | %s |" % (row_label(row), " | ".join(vals)))
    return L


def detail_table(results):
    """Every phase: sizes, bytes, reads, discards and the stack's own extras."""
    cells = index(results)
    L = ["| stack | workload | volume | user bytes | member writes | WA | member reads / user byte | discarded | notes |",
         "|---|---|--:|--:|--:|--:|--:|--:|---|"]
    for row in rows_in(results):
        for c in columns_in(results):
            rec = cells.get((row, c))
            if rec is None:
                continue
            notes = []
            if rec["workload"] == "random-4k":
                notes.append("%s of %s filled" % (human(rec["used_bytes"]), human(rec["volume_bytes"])))
                if rec.get("target_bytes") and rec["user_bytes"] < rec["target_bytes"]:
                    notes.append("stopped at the %s time cap (%s of %s)" % (
                        "%d s" % rec["cap_seconds"] if rec.get("cap_seconds") else "",
                        human(rec["user_bytes"]), human(rec["target_bytes"])))
            if rec.get("txgs") is not None:
                per = rec["user_bytes"] / rec["txgs"] if rec["txgs"] else None
                notes.append("%d txgs%s" % (rec["txgs"], ", %s user data per txg" % human(per) if per else ""))
            if rec.get("pool_capacity_before") is not None:
                notes.append("pool %d%% → %d%% allocated, fragmentation %d%%; %s available to the %s at the start" % (
                    rec["pool_capacity_before"], rec["pool_capacity_after"], rec.get("pool_fragmentation_after", 0),
                    human(rec.get("available_before", 0)), "dataset" if rec["variant"] == "dataset" else "zvol"))
            if rec.get("dmu_tx_quota") is not None:
                notes.append("%d transactions waited for a txg for want of space (dmu_tx_quota)" % rec["dmu_tx_quota"])
            if rec.get("engine_relocated_bytes") is not None:
                notes.append("cleaner relocated %s" % human(rec["engine_relocated_bytes"]))
                if rec.get("engine_member_bytes"):
                    notes.append("engine's own member counter %.2f x user" % (rec["engine_member_bytes"] / rec["user_bytes"]))
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                row_label(row), column_label(c), human(rec["volume_bytes"]), human(rec["user_bytes"]),
                human(rec["member_bytes"]), fmt(wa(rec)), fmt(read_ratio(rec)),
                human(rec.get("member_discard_bytes", 0)), "; ".join(notes)))
    return L


def comparison_table(results):
    L = ["| parity | workload | lograid | peer | lograid WA | peer WA | lograid / peer | target | met |",
         "|--:|---|---|---|--:|--:|--:|--:|---|"]
    for c in comparisons(results):
        L.append("| %d | %s | P=%d | %s | %s | %s | %.2f | ≤ %s | %s |" % (
            c["parity"], column_label(c["column"]), c["parity"], row_label(c["peer"]), fmt(c["lograid"]),
            fmt(c["peer_wa"]), c["ratio"], "1/5" if c["limit"] < 0.3 else "1/2", "yes" if c["met"] else "**no**"))
    return L


def published_table(results):
    """The published raidz figures beside every random-write cell measured on raidz."""
    cells = index(results)
    cols = [c for c in columns_in(results) if c[0] == "random-4k"]
    pairs = [(v, c) for v, _ in ZFS_VARIANTS for c in cols
             if any(stack_wa(cells, s, v, c) is not None for s in PUBLISHED)]
    names = {"zvol-default": "zvol default", "zvol-4k": "zvol 4K", "dataset": "file in a dataset"}
    L = ["| layout | published (512 B-64 KiB random) | " + " | ".join(
        "%s, %d%% full" % (names[v], round(c[1] * 100)) for v, c in pairs) + " |",
        "|---|--:|" + "--:|" * len(pairs)]
    for stack, pub in PUBLISHED.items():
        vals = [fmt(stack_wa(cells, stack, v, c)) for v, c in pairs]
        L.append("| %s | %.1f | %s |" % (STACKS[stack][0], pub, " | ".join(vals)))
    return L


def markdown(results, setup):
    s = setup or {}
    L = ["# Write amplification at the member disks", ""]
    if s:
        L += ["Run: %s, %s. %s" % (s.get("date", "?"), s.get("build", "?"), s.get("machine", "")), "",
              "    " + s.get("command", ""), ""]
        L += ["%s member disks of %s (virtio, sparse files on the host) plus one disk of the same size for "
              "md's write journal; guest: %s, %s MiB, TCG. Random phase: %s x the filled bytes in 4 KiB "
              "writes (fio, O_DIRECT, libaio, QD32, uniform with repeats), capped at %s s (into a file in a ZFS "
              "dataset: at the first fill only, capped at %s s); many-files: %s files of 14 MiB. The whole run "
              "took %s." % (
                  s.get("members", "?"), s.get("disk_size", "?"), s.get("guest_kernel", "?"), s.get("memory_mib", "?"),
                  s.get("random_factor", "?"), s.get("random_max_seconds", "?"), s.get("file_random_max_seconds", "-"),
                  s.get("files", "?"), s.get("duration", "?")), ""]
    L += ["WA = bytes written to the member disks (and the journal disk), from the start of a phase to the",
          "end of its final flush and the quiet period after it, / bytes the workload wrote. Discards are",
          "not counted. Times under TCG are not comparable with anything and are not reported.", ""]
    L += ["![write amplification](wear.svg)", ""] + wa_table(results) + [""]
    L += ["## Against the targets", "", "lograid's WA at most 1/5 of raidz's and 1/2 of md's at the same parity level:", ""]
    L += comparison_table(results) + [""]
    L += ["## Against the published table", ""] + published_table(results) + [""]
    L += ["Published: a linear-write engine at %s." % PUBLISHED_LINEAR, ""]
    L += ["## Every phase", ""] + detail_table(results) + [""]
    for stack_setup in sorted({(r["stack"], r["variant"], r.get("setup", "")) for r in results}):
        L.append("- `%s` %s: %s" % stack_setup)
    problems = (s.get("problems") or [])
    if problems:
        L += ["", "## Problems", ""] + ["- " + p for p in problems]
    return "\n".join(L) + "\n"


# ---- the chart --------------------------------------------------------------------------------

def chart_svg(results):
    """WA per stack, one panel per parity level, one bar per workload column, log scale;
    the published raidz figure as a dashed line in its panel."""
    cells = index(results)
    cols = columns_in(results)
    panels = []
    for parity in (1, 2, 3):
        rows = [r for r in rows_in(results) if STACKS.get(r[0], ("", "", 0))[2] == parity]
        if rows:
            panels.append((parity, rows))
    bar_w, gap, panel_gap, left, top, plot_h = 13, 14, 50, 70, 60, 300
    widths = [len(rows) * (len(cols) * bar_w + gap) + gap for _, rows in panels]
    W = left + sum(widths) + panel_gap * max(0, len(panels) - 1) + 30
    H = top + plot_h + 140
    svg = Svg(max(W, 500), H)
    svg.text(max(W, 500) / 2, 24, "Write amplification at the member disks (log scale)", size=15, anchor="middle",
             weight="bold")
    vals = [wa(r) for r in results if wa(r)] + list(PUBLISHED.values())
    lo, hi = 1.0, max(vals + [2.0]) * 1.3
    lo = min(lo, min(vals + [1.0]) / 1.1)

    def y(v):
        return top + plot_h - (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * plot_h

    ticks = [t for t in (1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100) if lo <= t <= hi]
    x0 = left
    for (parity, rows), w in zip(panels, widths):
        for t in ticks:
            svg.line(x0, y(t), x0 + w, y(t), "#e4e4e4")
            svg.text(x0 - 5, y(t) + 4, "%g" % t, size=10, anchor="end")
        svg.text(x0 + w / 2, top - 10, "%d parit%s" % (parity, "y" if parity == 1 else "ies"), size=13,
                 anchor="middle", weight="bold")
        pub = [PUBLISHED[r[0]] for r in rows if r[0] in PUBLISHED]
        if pub:
            svg.line(x0, y(pub[0]), x0 + w, y(pub[0]), "#2ca02c", 1.5, "6,4")
            svg.text(x0 + 4, y(pub[0]) - 4, "published raidz%d: %.1f" % (parity, pub[0]), size=10,
                     colour="#2ca02c")
        x = x0 + gap
        for row in rows:
            for ci, col in enumerate(cols):
                v = wa(cells.get((row, col)))
                if v is not None:
                    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %.2f</title>'
                            '</rect>' % (x + ci * bar_w, y(v), bar_w - 1, top + plot_h - y(v),
                                         WORKLOAD_COLOURS[ci % len(WORKLOAD_COLOURS)], row_label(row),
                                         column_label(col), v))
                    svg.text(x + ci * bar_w + bar_w / 2, y(v) - 3, "%.1f" % v, size=8, anchor="middle")
            cx = x + len(cols) * bar_w / 2
            svg.text(cx, top + plot_h + 12, short_label(row), size=10, anchor="end", rotate=-40)
            x += len(cols) * bar_w + gap
        svg.add('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="none" stroke="#222"/>' % (x0, top, w, plot_h))
        x0 += w + panel_gap
    svg.text(22, top + plot_h / 2, "member bytes / user bytes", size=12, anchor="middle", rotate=-90)
    ly = H - 22
    lx = left
    for ci, col in enumerate(cols):
        svg.add('<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>'
                % (lx, ly - 10, WORKLOAD_COLOURS[ci % len(WORKLOAD_COLOURS)]))
        svg.text(lx + 17, ly, column_label(col), size=11)
        lx += 190
    return svg.render()


def short_label(row):
    stack, variant = row
    label = STACKS.get(stack, (stack,))[0].replace("OpenZFS ", "").replace(" + write journal", " +journal")
    return label + {"zvol-default": " zvol", "zvol-4k": " zvol 4K", "dataset": " dataset"}.get(variant, "")


def write_report(out, setup, results):
    with open(os.path.join(out, "wear.md"), "w") as f:
        f.write(markdown(results, setup))
    with open(os.path.join(out, "wear.svg"), "w") as f:
        f.write(chart_svg(results))
