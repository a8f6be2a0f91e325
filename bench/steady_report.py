#!/usr/bin/env python3
"""Tables and charts from steady-state write-amplification results.

This script owns the *presentation* of steady-state results. It reads any
number of JSON files in the schema written by bench/steady.py (peer stacks)
and by `lograid bench --workloads steady --steady-out DIR` (lograid, one file
per cleaner policy), and writes into --out:

  steady.md            markdown: one line per stack x fill x pattern with WA
                       (steady), whether it converged, WA over the whole run,
                       IOPS steady and / the stack's empty IOPS, p99.9 and /
                       empty p99.9, the cleaner's foreground and relocated-again
                       shares; the sync:N runs (flushes/s); the empty baselines
                       and the setup of each file
  steady-wa.svg        steady write amplification (y) against fill (x), one line
                       per stack x pattern
  steady-windows.svg   WA per window against the volume overwrites written, one
                       panel per pattern, one line per stack x fill (runs with
                       windows: lograid's)
  steady-timeline.svg  IOPS (and WA) over time, one panel per run

"Steady" figures: for runs with windows (lograid), the means over the windows
the run reports as steady (three successive windows within 5% after one
overwrite, or the last three when it did not converge); for time-based runs
without windows (bench/steady.py, older lograid files), WA over the last third
and IOPS and latency over the whole run, marked with a dagger.

The SVG is written by hand (stdlib only). Usage:

    python3 bench/steady_report.py --out DIR RESULT.json [RESULT.json ...]
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

# Colours per stack (cycled), dash per pattern.
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
DASH = {"uniform": "", "skewed": "7,4", "zipf": "2,3", "moving": "10,3,2,3", "seqmix": "4,2",
        "trace": "1,3", "sync": "6,2,1,2"}
MARKER = {"uniform": "circle", "skewed": "square", "zipf": "diamond", "moving": "triangle",
          "seqmix": "square", "trace": "diamond", "sync": "triangle"}
FILL_DASH = ["", "7,4", "2,3", "10,3,2,3", "4,2"]
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


# ----- loading -----------------------------------------------------------------------

def load(paths):
    """The result files, each a dict of the steady schema; sorted by stack name."""
    out = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        for key in ("stack", "runs"):
            if key not in d:
                sys.exit("%s: not a steady result (no %r)" % (p, key))
        d["_path"] = p
        out.append(d)
    return sorted(out, key=lambda d: d["stack"])


KINDS = ["uniform", "skewed", "zipf", "moving", "seqmix", "trace", "sync"]


def kind(pattern):
    """The pattern's kind: 'zipf' of 'zipf:0.99'."""
    return (pattern or "").split(":", 1)[0]


def pattern_rank(p):
    """In the order of KINDS (uniform, skewed, zipf, ...), then alphabetically."""
    k = kind(p)
    return (KINDS.index(k) if k in KINDS else len(KINDS), p or "")


def short(pattern):
    """A pattern's name for a chart: a trace by its file name."""
    if kind(pattern) == "trace":
        return "trace:" + os.path.basename(pattern.split(":", 1)[1])
    return pattern


def dash(pattern):
    return DASH.get(kind(pattern), "2,3")


def marker_kind(pattern):
    return MARKER.get(kind(pattern), "circle")


def steady(r):
    """(WA, IOPS, p99.9, from_windows) of a run: the steady figures where the run has
    windows, else WA and IOPS over the last third where the file has them (else over
    the whole run), and its p99.9."""
    if r.get("windows") is not None:
        return r.get("wa_steady"), r.get("iops_steady"), r.get("p999_us"), True
    wa = r.get("wa_last_third")
    iops = r.get("iops_last_third")
    return ((wa if wa is not None else r.get("wa")), (iops if iops is not None else r.get("iops")),
            r.get("p999_us"), False)


def converged(r):
    if "converged" not in r:
        return "-"
    return "yes" if r["converged"] else "no (%s)" % (r.get("stopped_by") or "limit").replace("_", " ")


def stack_colours(results):
    return {d["stack"]: PALETTE[i % len(PALETTE)] for i, d in enumerate(results)}


# ----- formatting ----------------------------------------------------------------------

def num(v, digits=0):
    """Number for a table cell; '-' for missing."""
    if v is None:
        return "-"
    if digits == 0:
        return "{:,.0f}".format(v)
    return "{:,.{}f}".format(v, digits)


def lat(v):
    if v is None:
        return "-"
    return "%.1f" % v if v < 10 else "{:,.0f}".format(v)


def ratio(a, b, digits=2):
    if a is None or not b:
        return "-"
    return "%.*f" % (digits, a / b)


def gib(b):
    return "-" if b is None else "%.2f GiB" % (b / 2**30)


def longest(r):
    """The longest write of the steady windows in ms, and in brackets the longest one
    that ended after them where that was longer (lograid's runs only)."""
    if r.get("max_us") is None:
        return "-"
    after = r.get("max_us_after_windows") or 0
    text = num(r["max_us"] / 1000.0)
    return text + (" (%s)" % num(after / 1000.0) if after > r["max_us"] else "")


def pct(v):
    return "-" if v is None else "%.0f%%" % (v * 100)


# ----- markdown ------------------------------------------------------------------------

def markdown(results):
    lines = ["# Steady-state write amplification", ""]
    lines.append("| stack | date | machine | members x size | capacity | overwrite | setup |")
    lines.append("|---|---|---|---|---|---|---|")
    for d in results:
        s = d.get("setup", {})
        setup = "; ".join(str(s[k]) for k in ("mkfs", "ioengine", "kernel") if k in s)
        if "window_fraction" in s:
            overwrite = "to steady state: windows of %g x the volume, %d within %.0f%%, at most %g s" % (
                s["window_fraction"], s.get("windows_needed", 3), s.get("tolerance", 0.05) * 100,
                s.get("max_seconds", 0))
        else:
            overwrite = "%s s" % s["seconds"] if "seconds" in s else "-"
        lines.append("| %s | %s | %s | %d x %s | %s | %s | %s |" % (
            d["stack"], d.get("date", "-"), d.get("machine", "-"), d.get("members", 0),
            gib(d.get("member_size")), gib(d.get("capacity_bytes")), overwrite, setup or "-"))
    lines += ["", "Empty baseline (random 4 KiB writes, QD32, into a fresh, empty volume or file):", ""]
    lines.append("| stack | IOPS | p50 µs | p99 µs | p99.9 µs | WA |")
    lines.append("|---|--:|--:|--:|--:|--:|")
    for d in results:
        e = d.get("empty") or {}
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            d["stack"], num(e.get("iops")), lat(e.get("p50_us")), lat(e.get("p99_us")),
            lat(e.get("p999_us")), num(e.get("wa"), 2)))
    lines += ["", "Overwrites of one volume or file filled to the given fraction of the usable capacity. "
              "WA = bytes written to the members / bytes written by the workload; steady = the mean "
              "over the run's steady windows; x empty = ratio to the same stack's empty baseline; "
              "longest = the longest write of the steady windows (in brackets: of the writes still in "
              "flight when the run stopped, where longer); "
              "foreground = share of the relocated bytes moved by writers out of room (the rest in the "
              "background); again = share moved from segments the cleaner had written (cold data moved "
              "again); GiB written = by the workload during the overwrites:", ""]
    lines.append("| stack | fill | pattern | GiB written | WA steady | converged | WA whole run | "
                 "IOPS steady | x empty | p99.9 µs | x empty | longest ms | foreground | again | note |")
    lines.append("|---|--:|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    notes, dagger = [], False
    syncs = []
    for d in results:
        e = d.get("empty") or {}
        for r in sorted(d["runs"], key=lambda r: (r.get("fill") or 0, pattern_rank(r.get("pattern")))):
            if kind(r.get("pattern")) == "sync":
                syncs.append((d, r))
                continue
            note = ""
            if r.get("error"):
                notes.append("%s fill %s %s: %s" % (d["stack"], r.get("fill"), r.get("pattern"),
                                                    r["error"]))
                note = "[%d]" % len(notes)
            wa, iops, p999, windowed = steady(r)
            mark = "" if windowed else " †"
            dagger = dagger or not windowed
            ub = r.get("user_bytes")
            lines.append("| %s | %s | %s | %s | %s%s | %s | %s | %s%s | %s | %s | %s | %s | %s | %s | %s |" % (
                d["stack"], r.get("fill"), r.get("pattern"),
                num(ub / 2**30 if ub is not None else None, 2), num(wa, 2), mark, converged(r),
                num(r.get("wa"), 2), num(iops), mark, ratio(iops, e.get("iops")), lat(p999),
                ratio(p999, e.get("p999_us")), longest(r), pct(r.get("foreground_share")),
                pct(r.get("relocated_again_share")), note))
    if syncs:
        lines += ["", "Synchronous writers on an empty volume (sync:N: each of the queue depth's writers "
                  "flushes after every N random 4 KiB writes):", ""]
        lines.append("| stack | pattern | GiB written | WA steady | converged | IOPS steady | x empty | "
                     "flushes/s | member flushes per flush | p99.9 µs |")
        lines.append("|---|---|--:|--:|---|--:|--:|--:|--:|--:|")
        for d, r in syncs:
            e = d.get("empty") or {}
            wa, iops, p999, windowed = steady(r)
            mark = "" if windowed else " †"
            dagger = dagger or not windowed
            ub = r.get("user_bytes")
            lines.append("| %s | %s | %s | %s%s | %s | %s%s | %s | %s | %s | %s |" % (
                d["stack"], r.get("pattern"), num(ub / 2**30 if ub is not None else None, 2),
                num(wa, 2), mark, converged(r), num(iops), mark, ratio(iops, e.get("iops")),
                num(r.get("flushes_per_s")), num(r.get("member_flushes_per_flush"), 2), lat(p999)))
    if dagger:
        lines += ["", "† a time-based run without windows: WA (and IOPS, where the file has it) over "
                  "its last third, else over the whole run."]
    if notes:
        lines.append("")
        lines += ["[%d] %s" % (i + 1, n) for i, n in enumerate(notes)]
    return "\n".join(lines) + "\n"


# ----- SVG helpers -----------------------------------------------------------------------

def nice_ticks(lo, hi, n=5):
    """About n 'nice' tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 10))
    return ticks


def tick_label(v):
    if v == 0:
        return "0"
    if abs(v) >= 10000:
        return "%gk" % (v / 1000)
    return "%g" % v


class Svg:
    """Collects SVG elements; text() escapes its content."""

    def __init__(self, w, h):
        self.w, self.h, self.parts = w, h, []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", colour="#222", rotate=None):
        rot = ' transform="rotate(%d %.1f %.1f)"' % (rotate, x, y) if rotate else ""
        self.add('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" '
                 'fill="%s" %s%s>%s</text>' % (x, y, size, anchor, weight, colour, FONT, rot, escape(str(s))))

    def line(self, x1, y1, x2, y2, colour="#222", width=1, dash=""):
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%g"%s/>'
                 % (x1, y1, x2, y2, colour, width, d))

    def polyline(self, pts, colour, width=2, dash=""):
        if len(pts) < 2:
            return
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<polyline fill="none" stroke="%s" stroke-width="%g"%s points="%s"/>'
                 % (colour, width, d, " ".join("%.1f,%.1f" % p for p in pts)))

    def marker(self, x, y, kind, colour, hollow=False):
        fill = "white" if hollow else colour
        if kind == "square":
            self.add('<rect x="%.1f" y="%.1f" width="8" height="8" fill="%s" stroke="%s" stroke-width="1.5"/>'
                     % (x - 4, y - 4, fill, colour))
        elif kind in ("diamond", "triangle"):
            pts = ([(x, y - 5.5), (x + 5.5, y), (x, y + 5.5), (x - 5.5, y)] if kind == "diamond"
                   else [(x, y - 5.5), (x + 5, y + 4), (x - 5, y + 4)])
            self.add('<polygon points="%s" fill="%s" stroke="%s" stroke-width="1.5"/>'
                     % (" ".join("%.1f,%.1f" % p for p in pts), fill, colour))
        else:
            self.add('<circle cx="%.1f" cy="%.1f" r="4.5" fill="%s" stroke="%s" stroke-width="1.5"/>'
                     % (x, y, fill, colour))

    def render(self):
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n'
                '<rect width="100%%" height="100%%" fill="white"/>\n%s\n</svg>\n'
                % (self.w, self.h, self.w, self.h, "\n".join(self.parts)))


def axes(svg, x0, y0, w, h, xt, yt, xmap, ymap, xfmt=tick_label, yfmt=tick_label, grid=True,
         size=11):
    """Frame, ticks, tick labels and light grid lines of a plot area (x0,y0 top left)."""
    for v in yt:
        y = ymap(v)
        if grid:
            svg.line(x0, y, x0 + w, y, "#e4e4e4")
        svg.line(x0 - 4, y, x0, y)
        svg.text(x0 - 7, y + 4, yfmt(v), size=size, anchor="end")
    for v in xt:
        x = xmap(v)
        if grid:
            svg.line(x, y0, x, y0 + h, "#f0f0f0")
        svg.line(x, y0 + h, x, y0 + h + 4)
        svg.text(x, y0 + h + 16, xfmt(v), size=size, anchor="middle")
    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#222"/>'
            % (x0, y0, w, h))


# ----- chart (b): WA against fill ----------------------------------------------------------

def wa_chart(results):
    series = []   # (label, colour, pattern, [(fill, wa, had_error)])
    colours = stack_colours(results)
    for d in results:
        by_pat = {}
        for r in d["runs"]:
            wa = steady(r)[0]
            if r.get("fill") is None or wa is None:
                continue
            # Hollow: stopped early by an error, or not converged.
            by_pat.setdefault(r["pattern"], []).append(
                (r["fill"], wa, bool(r.get("error")) or r.get("converged") is False))
        for pat in sorted(by_pat, key=pattern_rank):
            series.append(("%s, %s" % (d["stack"], short(pat)), colours[d["stack"]], pat,
                           sorted(by_pat[pat])))
    W, H = max(820, 640 + 7 * max([len(s[0]) for s in series] + [0])), max(480, 110 + 22 * len(series))
    x0, y0, pw, ph = 70, 50, 500, 360
    svg = Svg(W, H)
    svg.text(W / 2, 28, "Steady-state write amplification of overwrites (QD32)",
             size=16, anchor="middle", weight="bold")
    svg.text(W / 2, 44, "windowed runs: mean of the steady windows; others: last third of the run",
             size=11, anchor="middle")
    fills = [p[0] for s in series for p in s[3]] or [0.5, 1.0]
    was = [p[1] for s in series for p in s[3]] or [1.0]
    xt = nice_ticks(min(0.4, min(fills) - 0.05), max(1.0, max(fills)), 6)
    xt = [t for t in xt if t <= 1.0 + 1e-9] or xt
    yt = nice_ticks(0, max(was) * 1.1, 6)
    xmap = lambda v: x0 + (v - xt[0]) / (xt[-1] - xt[0]) * pw
    ymap = lambda v: y0 + ph - (v - yt[0]) / (yt[-1] - yt[0]) * ph
    axes(svg, x0, y0, pw, ph, xt, yt, xmap, ymap, xfmt=lambda v: "%g%%" % (v * 100))
    svg.text(x0 + pw / 2, y0 + ph + 38, "fill (fraction of usable capacity written before the overwrites)",
             size=12, anchor="middle")
    svg.text(24, y0 + ph / 2, "write amplification (member bytes / user bytes)", size=12,
             anchor="middle", rotate=-90)
    for label, colour, pat, pts in series:
        xy = [(xmap(f), ymap(w)) for f, w, _ in pts]
        svg.polyline(xy, colour, 2, dash(pat))
        for (x, y), (_, _, err) in zip(xy, pts):
            svg.marker(x, y, marker_kind(pat), colour, hollow=err)
    # legend
    lx, ly = x0 + pw + 20, y0 + 10
    svg.text(lx, ly, "stack, pattern", size=12, weight="bold")
    for i, (label, colour, pat, _) in enumerate(series):
        y = ly + 22 + i * 22
        svg.line(lx, y - 4, lx + 30, y - 4, colour, 2, dash(pat))
        svg.marker(lx + 15, y - 4, marker_kind(pat), colour)
        svg.text(lx + 38, y, label, size=12)
    if any(p[2] for s in series for p in s[3]):
        y = ly + 22 + len(series) * 22 + 10
        svg.marker(lx + 15, y - 4, "circle", "#555", hollow=True)
        svg.text(lx + 38, y, "not converged, or stopped by an error", size=11)
    return svg.render()


# ----- chart (c): throughput over time -----------------------------------------------------

def timeline_of(r):
    """The run's timeline: its own (time-based runs), else one point per window."""
    if r.get("timeline"):
        return r["timeline"]
    return [{"t": w["t_end"], "iops": w.get("iops"), "wa": w.get("wa")} for w in r.get("windows") or []]


def timeline_chart(results):
    runs = [(d, dict(r, timeline=timeline_of(r))) for d in results
            for r in sorted(d["runs"], key=lambda r: (pattern_rank(r.get("pattern")), r.get("fill") or 0))
            if timeline_of(r)]
    fills = sorted({r.get("fill") for _, r in runs}, key=lambda f: f or 0)
    rows = []                                # one row per stack x pattern, one column per fill
    for d, r in runs:
        key = (d["stack"], r.get("pattern"))
        if key not in rows:
            rows.append(key)
    colours = stack_colours(results)
    PW, PH, ML, MR, MT, MB = 260, 150, 62, 46, 34, 36
    cw, rh = ML + PW + MR, MT + PH + MB
    W = max(len(fills), 1) * cw + 20
    H = 80 + max(len(rows), 1) * rh
    svg = Svg(W, H)
    svg.text(W / 2, 26, "Overwrites over time (IOPS per 5 s or per window, solid; WA, orange dots, "
             "right axis; grey dashes: the stack's empty IOPS)", size=13, anchor="middle", weight="bold")
    if not runs:
        svg.text(W / 2, 60, "no timeline data", anchor="middle")
        return svg.render()
    for d, r in runs:
        col = fills.index(r.get("fill"))
        row = rows.index((d["stack"], r.get("pattern")))
        x0, y0 = 10 + col * cw + ML, 50 + row * rh + MT
        tl = r["timeline"]
        empty_iops = (d.get("empty") or {}).get("iops")
        tmax = max(p["t"] for p in tl)
        imax = max([p["iops"] or 0 for p in tl] + [empty_iops or 0, 1])
        wmax = max([p["wa"] or 0 for p in tl] + [1])
        xt = nice_ticks(0, tmax, 5)
        yt = nice_ticks(0, imax * 1.05, 4)
        wt = nice_ticks(0, wmax * 1.05, 4)
        xmap = lambda v: x0 + v / xt[-1] * PW
        ymap = lambda v: y0 + PH - v / yt[-1] * PH
        wmap = lambda v: y0 + PH - v / wt[-1] * PH
        axes(svg, x0, y0, PW, PH, xt, yt, xmap, ymap, size=10)
        for v in wt:                         # right axis: WA
            svg.line(x0 + PW, wmap(v), x0 + PW + 4, wmap(v), "#e07000")
            svg.text(x0 + PW + 7, wmap(v) + 4, tick_label(v), size=10, colour="#e07000")
        title = "%s, %s, %s" % (d["stack"], short(r.get("pattern")),
                                "empty" if r.get("fill") is None else "fill %s" % r.get("fill"))
        if r.get("error"):
            title += " (stopped early)"
        svg.text(x0 + PW / 2, y0 - 8, title, size=11, anchor="middle", weight="bold")
        svg.text(x0 + PW / 2, y0 + PH + 30, "seconds", size=10, anchor="middle")
        svg.text(x0 - 46, y0 + PH / 2, "IOPS", size=10, anchor="middle", rotate=-90)
        if empty_iops:
            svg.line(x0, ymap(empty_iops), x0 + PW, ymap(empty_iops), "#888", 1, "5,4")
        # Each interval (previous t .. t) is drawn flat at its mean IOPS; its WA as a
        # dot at the interval's middle.
        steps, wpts, prev_t = [], [], 0.0
        for p in tl:
            steps += [(xmap(prev_t), ymap(p["iops"] or 0)), (xmap(p["t"]), ymap(p["iops"] or 0))]
            if p.get("wa") is not None:
                wpts.append((xmap((prev_t + p["t"]) / 2), wmap(p["wa"])))
            prev_t = p["t"]
        svg.polyline(steps, colours[d["stack"]], 1.8)
        svg.polyline(wpts, "#e07000", 1.2, "2,3")
        for x, y in wpts:
            svg.add('<circle cx="%.1f" cy="%.1f" r="1.8" fill="#e07000"/>' % (x, y))
    return svg.render()


# ----- chart (d): WA per window, one panel per pattern ------------------------------------

def windows_chart(results):
    """WA of each window (y) against the volume overwrites written at its end (x): one
    panel per pattern, one line per stack x fill; filled markers are the windows the
    steady figures come from, a dashed line the end of the warm-up (one overwrite)."""
    colours = stack_colours(results)
    runs = [(d, r) for d in results for r in d["runs"] if r.get("windows")]
    patterns = sorted({r["pattern"] for _, r in runs}, key=pattern_rank)
    fills = sorted({r.get("fill") for _, r in runs}, key=lambda f: -1 if f is None else f)
    PW, PH, ML, MR, MT, MB = 330, 190, 60, 20, 34, 44
    cols = 2 if len(patterns) > 1 else 1
    nrows = max(1, -(-len(patterns) // cols))
    cw, rh = ML + PW + MR, MT + PH + MB
    legend_h = 30 + 18 * (len(results) + len(fills))
    W, H = cols * cw + 20, 60 + nrows * rh + legend_h
    svg = Svg(W, H)
    svg.text(W / 2, 26, "Write amplification per window (a window = a fixed share of the volume written)",
             size=14, anchor="middle", weight="bold")
    if not runs:
        svg.text(W / 2, 60, "no windowed runs", anchor="middle")
        return svg.render()
    fill_dash = {f: FILL_DASH[i % len(FILL_DASH)] for i, f in enumerate(fills)}
    for k, pat in enumerate(patterns):
        x0 = 10 + (k % cols) * cw + ML
        y0 = 50 + (k // cols) * rh + MT
        mine = [(d, r) for d, r in runs if r["pattern"] == pat]

        # Overwrites: in volumes written (the warm-up is one); sync:N (no warm-up): in GiB.
        by_volume = any(r.get("warmup_bytes") for _, r in mine)

        def pos(r, w):
            return w["end_bytes"] / (max(r.get("volume_bytes") or 1, 1) if by_volume else 2**30)
        xs = [pos(r, w) for _, r in mine for w in r["windows"]]
        ys = [w["wa"] for _, r in mine for w in r["windows"] if w.get("wa") is not None]
        xt = nice_ticks(0, max(xs + [1.0 if by_volume else 0.1]), 5)
        yt = nice_ticks(0, max(ys + [1.0]) * 1.1, 4)
        xmap = lambda v, x0=x0, xt=xt: x0 + v / xt[-1] * PW
        ymap = lambda v, y0=y0, yt=yt: y0 + PH - v / yt[-1] * PH
        axes(svg, x0, y0, PW, PH, xt, yt, xmap, ymap, size=10)
        svg.text(x0 + PW / 2, y0 - 10, short(pat), size=12, anchor="middle", weight="bold")
        svg.text(x0 + PW / 2, y0 + PH + 32, "volume overwrites written" if by_volume else "GiB written",
                 size=10, anchor="middle")
        svg.text(x0 - 42, y0 + PH / 2, "WA", size=10, anchor="middle", rotate=-90)
        warm = {r.get("warmup_bytes", 0) / max(r.get("volume_bytes") or 1, 1) for _, r in mine}
        for wx in warm:
            if 0 < wx <= xt[-1]:
                svg.line(xmap(wx), y0, xmap(wx), y0 + PH, "#999", 1, "4,3")
        for d, r in mine:
            colour = colours[d["stack"]]
            pts = [(xmap(pos(r, w)), ymap(w["wa"]), w.get("steady")) for w in r["windows"]
                   if w.get("wa") is not None]
            svg.polyline([(x, y) for x, y, _ in pts], colour, 1.5, fill_dash[r.get("fill")])
            for x, y, st in pts:
                if st:
                    svg.marker(x, y, "circle", colour)
                else:
                    svg.add('<circle cx="%.1f" cy="%.1f" r="2" fill="white" stroke="%s"/>' % (x, y, colour))
            if r.get("converged") is False and pts:
                svg.text(pts[-1][0] - 3, pts[-1][1] - 8, "not converged", size=9, anchor="end", colour=colour)
    ly = 60 + nrows * rh
    svg.text(20, ly, "filled: the windows of the steady figures; dashed vertical line: one overwrite "
             "(windows before it do not count)", size=11)
    stacks = [d["stack"] for d in results if any(r.get("windows") for r in d["runs"])]
    for i, stack in enumerate(stacks):
        y = ly + 20 + 18 * i
        svg.line(20, y - 4, 50, y - 4, colours[stack], 2)
        svg.text(58, y, stack, size=11)
    for j, f in enumerate(fills):
        y = ly + 20 + 18 * (len(stacks) + j)
        svg.line(20, y - 4, 50, y - 4, "#444", 1.5, fill_dash[f])
        svg.text(58, y, "empty volume (sync:N)" if f is None else "fill %g" % f, size=11)
    return svg.render()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for steady.md and the SVG charts")
    ap.add_argument("files", nargs="+", help="steady result JSON files")
    a = ap.parse_args(argv)
    results = load(a.files)
    os.makedirs(a.out, exist_ok=True)
    md = markdown(results)
    outputs = {"steady.md": md, "steady-wa.svg": wa_chart(results),
               "steady-windows.svg": windows_chart(results),
               "steady-timeline.svg": timeline_chart(results)}
    for name, text in outputs.items():
        with open(os.path.join(a.out, name), "w") as f:
            f.write(text)
    sys.stdout.write(md)
    print("\nwrote " + ", ".join(os.path.join(a.out, n) for n in outputs), file=sys.stderr)


if __name__ == "__main__":
    main()
