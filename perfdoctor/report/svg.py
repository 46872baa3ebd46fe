"""Hand-written SVG drawings of a report document for the HTML report (report/html.py).

Three pictures, each a function from document parts to an <svg> string:
- `step_bars`: one stacked horizontal bar per step (the step breakdown, BREAKDOWN order), on a
  common millisecond axis, so a slow step and what made it slow are both visible;
- `step_lanes`: the representative step (traces[].timeline) as lanes over time: device busy/idle,
  the breakdown role, the host's activity, with the step's longest idle gaps marked and numbered;
- `memory_lines`: reserved and allocated device memory over time, as step lines (each value
  holds until the next memory event).
Every string from the input goes through sanitize.html (element text and attributes alike).
"""

from __future__ import annotations

import math

from perfdoctor.report.sanitize import html as H
from perfdoctor.stats.steptime import ms as fmt_ms

ROLE_COLOUR = {"kernel": "#2e8b57", "memcpy": "#3a7dc2", "memset": "#8fb3dd", "communication": "#8e5bb5",
               "runtime": "#e39b26", "data_loading": "#d64541", "cpu_exec": "#e8c547", "other": "#b8bcc2"}
# synchronising in slate, not a second red beside "waiting for data" (the two read as one)
HOST_COLOUR = {"data_wait": "#d64541", "sync": "#34495e", "runtime": "#e39b26", "communication": "#8e5bb5",
               "cpu_ops": "#e8c547", "untraced": "#b8bcc2"}
HOST_LABEL = {"data_wait": "waiting for data", "sync": "synchronising", "runtime": "runtime calls",
              "communication": "collectives", "cpu_ops": "CPU ops", "untraced": "untraced"}
FONT = 'font-family="system-ui,-apple-system,Segoe UI,Roboto,sans-serif" font-size="12"'
W = 900            # drawing width (the page scales it: viewBox)
LEFT = 86          # room for the row labels


def _f(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _ticks(span: float, n: int = 6) -> list[float]:
    """Round axis ticks over [0, span]."""
    if span <= 0:
        return [0.0]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, x = [], 0.0
    while x <= span * 1.0001:
        out.append(x)
        x += step
    return out


# the baseline of an x axis's numbers below the axis line: clear of the lowest y-axis number, whose
# baseline is 4 under that line (at 16 the unit left of "0" printed into the "0 ms" above it)
TICK_DY = 19


def _axis(x0: float, width: float, span: float, y: float, unit: str = "ms") -> list[str]:
    out = [f'<line x1="{_f(x0)}" y1="{_f(y)}" x2="{_f(x0 + width)}" y2="{_f(y)}" stroke="#999"/>']
    for v in _ticks(span):
        x = x0 + width * v / span if span > 0 else x0
        out.append(f'<line x1="{_f(x)}" y1="{_f(y)}" x2="{_f(x)}" y2="{_f(y + 4)}" stroke="#999"/>'
                   f'<text x="{_f(x)}" y="{_f(y + TICK_DY)}" text-anchor="middle" fill="#555">{_f(v)}</text>')
    out.append(f'<text x="{_f(x0 - 8)}" y="{_f(y + TICK_DY)}" text-anchor="end" fill="#555">{H(unit)}</text>')
    return out


def _rect(x, y, w, h, fill, title: str, extra: str = "") -> str:
    """A rect with its title; title "" for one inside a group that carries the title."""
    head = f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0.4))}" height="{_f(h)}" fill="{fill}"{extra}'
    return f'{head}><title>{H(title)}</title></rect>' if title else f'{head}/>'


def step_name(label, whole: bool = False) -> str:
    """A step's name on a chart: "step 3"; the pseudo-step of a trace without step markers (its
    label "all") is "whole trace", not "step all"."""
    return "whole trace" if whole else f"step {label}"


def step_bars(steps: list[dict], labels: dict[str, str], whole: bool = False) -> str:
    """Stacked bars, one per step: milliseconds of each breakdown role; `whole`: the one bar is the
    whole trace (no step markers)."""
    if not steps:
        return ""
    span = max(s["duration_ms"] for s in steps) or 1.0
    row, bar = 22, 16
    width = W - LEFT - 70
    h = row * len(steps) + 31
    parts = [f'<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="step breakdown per step" {FONT}>']
    for i, s in enumerate(steps):
        y = 4 + i * row
        parts.append(f'<text x="{LEFT - 8}" y="{_f(y + bar - 4)}" text-anchor="end" fill="#333">{H(step_name(s["label"], whole))}</text>')
        x = LEFT
        for role, ms in s["breakdown_ms"].items():
            if not ms or ms <= 0:
                continue
            w = width * ms / span
            parts.append(_rect(x, y, w, bar, ROLE_COLOUR.get(role, "#999"),
                               f"{step_name(s['label'], whole)}: {labels.get(role, role)} {ms:.2f} ms "
                               f"({100 * ms / s['duration_ms']:.1f}%)" if s["duration_ms"] else role))
            x += w
        parts.append(f'<text x="{_f(x + 6)}" y="{_f(y + bar - 4)}" fill="#333">{fmt_ms(s["duration_ms"])} ms</text>')
    parts += _axis(LEFT, width, span, 4 + len(steps) * row)
    parts.append("</svg>")
    return "".join(parts)


def legend(colours: dict[str, str], labels: dict[str, str], present: set[str] | None = None, title: str = "") -> str:
    items = ([f'<b class="key">{H(title)}</b>'] if title else []) + [f'<span class="key"><i style="background:{c}"></i>{H(labels.get(k, k))}</span>'
             for k, c in colours.items() if present is None or k in present]
    return f'<div class="legend">{"".join(items)}</div>'


def step_lanes(view: dict, gaps: list[dict], labels: dict[str, str]) -> str:
    """The representative step as lanes; `gaps` are its idle gaps to mark (numbered 1..n)."""
    span = view["duration_ms"] or 1.0
    width = W - LEFT - 20
    lanes = [("device", view.get("device")), ("breakdown", view["breakdown"]), ("host", view["host"])]
    lanes = [(n, v) for n, v in lanes if v is not None]
    lane_h, gap = 22, 10
    x_of = (lambda ms: LEFT + width * ms / span)
    rows = label_rows([x_of(g["offset_ms"] + g["duration_ms"] / 2) for g in gaps])
    top = (20 + LABEL_ROW * max(rows)) if gaps else 4
    h = top + len(lanes) * (lane_h + gap) + 25
    parts = [f'<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="one step as a timeline" {FONT}>']
    for j, (name, runs) in enumerate(lanes):
        y = top + j * (lane_h + gap)
        parts.append(f'<text x="{LEFT - 8}" y="{_f(y + lane_h - 7)}" text-anchor="end" fill="#333">{name}</text>')
        if name == "device":
            parts.append(_rect(LEFT, y, width, lane_h, "#eceef0", "device idle"))
            for off, dur in runs:
                parts.append(_rect(x_of(off), y, width * dur / span, lane_h, ROLE_COLOUR["kernel"],
                                   f"device busy +{off:.3f} ms for {dur:.3f} ms"))
            continue
        colours, names = (ROLE_COLOUR, labels) if name == "breakdown" else (HOST_COLOUR, HOST_LABEL)
        for off, dur, what in runs:
            parts.append(_rect(x_of(off), y, width * dur / span, lane_h, colours.get(what, "#999"),
                               f"{names.get(what, what)} +{off:.3f} ms for {dur:.3f} ms"))
    bottom = top + len(lanes) * (lane_h + gap) - gap
    for n, (g, row) in enumerate(zip(gaps, rows), 1):
        x0, x1 = x_of(g["offset_ms"]), x_of(g["offset_ms"] + g["duration_ms"])
        parts.append(f'<rect x="{_f(x0)}" y="{_f(top - 3)}" width="{_f(max(x1 - x0, 1))}" height="{_f(bottom - top + 6)}" '
                     f'fill="none" stroke="#222" stroke-dasharray="3 2"><title>{H(_gap_title(n, g))}</title></rect>'
                     f'<text x="{_f((x0 + x1) / 2)}" y="{_f(top - 6 - LABEL_ROW * row)}" text-anchor="middle" '
                     f'font-weight="bold" fill="#222">{n}</text>')
    parts += _axis(LEFT, width, span, bottom + 6, "ms")
    parts.append("</svg>")
    return "".join(parts)


LABEL_ROW = 15     # a row of gap numbers above the lanes (a 12 px line, ascent and descent: 14)
LABEL_SEP = 16     # the least distance between two numbers' centres in one row (two digits, bold, 12 px)


def label_rows(xs: list[float]) -> list[int]:
    """The row of each gap number (0: just above the lanes, 1 above that...): the lowest row whose
    last number lies LABEL_SEP or more to the left, so numbers of gaps close together do not print
    over each other (`xs` in drawing order, left to right)."""
    last: list[float] = []
    rows = []
    for x in xs:
        row = next((r for r, lx in enumerate(last) if x - lx >= LABEL_SEP), len(last))
        if row == len(last):
            last.append(x)
        last[row] = x
        rows.append(row)
    return rows


def _gap_title(n: int, g: dict) -> str:
    ev = f", host in {g['host_event']}" if g.get("host_event") else ""
    return (f"gap {n}: device idle {g['duration_ms']:.3f} ms ({g['kind'].replace('_', ' ')}; host "
            f"{HOST_LABEL.get(g['host_activity'], g['host_activity'])}{ev})")


def byte_axis(top: float) -> tuple[float, str]:
    """The unit of a memory axis whose top is `top` bytes: GiB from 1 GiB up, else MiB."""
    return (2 ** 30, "GiB") if top >= 2 ** 30 else (2 ** 20, "MiB")


def byte_tick(v: float, scale: float, unit: str) -> str:
    """A memory axis's number: as many decimals as it has, up to two (half of 1.5 GiB is 0.75 GiB,
    which one decimal printed as 0.8)."""
    return f"{_f(v / scale)} {unit}"


NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_byte_top(peak: float) -> float:
    """A memory axis's top in bytes: the peak rounded up to a round number of its unit (767.5 MiB
    -> 800 MiB, 6.4 GiB -> 8 GiB), so its ticks (0, half, top) read as round values too."""
    scale, _ = byte_axis(peak)
    v = peak / scale
    if v <= 0:
        return peak or 1.0
    tens = 10.0 ** math.floor(math.log10(v))
    return next(n * tens for n in NICE if n * tens >= v * (1 - 1e-9)) * scale


def memory_lines(mem: dict) -> str:
    t = mem.get("t_ms") or []
    if len(t) < 2:
        return ""
    res, alloc = mem.get("reserved_bytes") or [], mem.get("allocated_bytes") or []
    top = nice_byte_top(max(max(res, default=0), max(alloc, default=0)) or 1.0)
    scale, unit = byte_axis(top)
    span = (t[-1] - t[0]) or 1.0
    width, height, y0 = W - LEFT - 20, 140, 8

    def pts(vals):
        # a step line: the allocator's counters hold their value until the next event (an empty_cache
        # that hands back 6 GiB is one drop, not a slope over the 100 ms to the next allocation)
        xy = [(_f(LEFT + width * (x - t[0]) / span), _f(y0 + height * (1 - v / top))) for x, v in zip(t, vals)]
        out = [f"{xy[0][0]},{xy[0][1]}"]
        for (_, ya), (xb, yb) in zip(xy, xy[1:]):
            out.append(f"{xb},{ya}")
            if yb != ya:
                out.append(f"{xb},{yb}")
        return " ".join(out)

    parts = [f'<svg class="chart" viewBox="0 0 {W} {height + 50}" role="img" aria-label="device memory over time" {FONT}>']
    for frac in (0, 0.5, 1):
        y = y0 + height * (1 - frac)
        parts.append(f'<line x1="{LEFT}" y1="{_f(y)}" x2="{LEFT + width}" y2="{_f(y)}" stroke="#e3e3e3"/>'
                     f'<text x="{LEFT - 8}" y="{_f(y + 4)}" text-anchor="end" fill="#555">'
                     f'{byte_tick(top * frac, scale, unit)}</text>')
    parts.append(f'<polyline points="{pts(res)}" fill="none" stroke="#3a7dc2" stroke-width="2"><title>reserved</title></polyline>')
    if any(alloc):
        parts.append(f'<polyline points="{pts(alloc)}" fill="none" stroke="#2e8b57" stroke-width="1.5">'
                     f'<title>allocated</title></polyline>')
    parts += _axis(LEFT, width, span, y0 + height + 2, "ms")
    parts.append("</svg>")
    return "".join(parts)
