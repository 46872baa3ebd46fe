"""The run over time for the HTML report: CPU, GPU and memory as the system sampler saw them
(report `run.series`, analyze/runseries.py), on one time axis with the steps and the traced
window shaded, so a leak, a loader that starves, or a neighbour that arrives halfway is seen.

`run_charts(series)` -> (legend keys, <svg>) or ("", "") when there is nothing to draw. Every
string from the input goes through sanitize.html; the numbers are formatted here.
"""

from __future__ import annotations

from perfdoctor.report.sanitize import html as H
from perfdoctor.report.svg import FONT, LEFT, W, _axis, _f, byte_axis, byte_tick, nice_byte_top

# (series key, label, colour, stroke width)
CPU_LINES = (("cpu_cores", "machine, all processes", "#9aa0a6", 1.5), ("trainer_cpu_cores", "trainer", "#e39b26", 2),
             ("workers_cpu_cores", "loader workers", "#d64541", 2))
MEM_LINES = (("ram_used_bytes", "machine RAM in use", "#9aa0a6", 1.5), ("trainer_rss_bytes", "trainer RSS", "#3a7dc2", 2),
             ("workers_rss_bytes", "workers RSS", "#8fb3dd", 1.5), ("gpu_memory_bytes", "GPU memory in use", "#2e8b57", 2))
GPU_LINES = (("gpu_util", "GPU busy", "#2e8b57", 2),)
PANEL_H = 110
BANDS = (("steps", "#dcefdc"), ("traced", "#f6d58e"))
MIN_BAND = 3.0          # px: a trace window of a second in a run of minutes stays visible


def _polyline(t, vals, x_of, y_of, colour, width, label) -> str:
    # a value the sample did not measure breaks the line rather than drawing a made-up segment
    runs, cur = [], []
    for x, v in zip(t, vals):
        if v is None:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append(f"{_f(x_of(x))},{_f(y_of(v))}")
    if cur:
        runs.append(cur)
    return "".join(f'<polyline points="{" ".join(r)}" fill="none" stroke="{colour}" stroke-width="{width}">'
                   f'<title>{H(label)}</title></polyline>' for r in runs if len(r) >= 2)


def _panel(series: dict, lines, y0: float, title: str, top: float, tick) -> list[str]:
    t = series["t_s"]
    span = (t[-1] - t[0]) or 1.0
    width = W - LEFT - 20

    def x_of(x):
        return LEFT + width * (x - t[0]) / span

    def y_of(v):
        return y0 + PANEL_H * (1 - min(v, top) / top)

    out = [f'<text x="{LEFT}" y="{_f(y0 - 6)}" fill="#333" font-weight="600">{H(title)}</text>']
    for key, colour in BANDS:
        w = series.get(key)
        if w and w[1] > w[0]:
            a, b = max(t[0], w[0]), min(t[-1], w[1])
            if b > a:
                out.append(f'<rect x="{_f(x_of(a))}" y="{_f(y0)}" width="{_f(max(MIN_BAND, x_of(b) - x_of(a)))}" '
                           f'height="{PANEL_H}" fill="{colour}"><title>{H(key)}</title></rect>')
    for frac in (0, 0.5, 1):
        y = y0 + PANEL_H * (1 - frac)
        out.append(f'<line x1="{LEFT}" y1="{_f(y)}" x2="{LEFT + width}" y2="{_f(y)}" stroke="#e3e3e3"/>'
                   f'<text x="{LEFT - 8}" y="{_f(y + 4)}" text-anchor="end" fill="#555">{H(tick(top * frac))}</text>')
    for key, label, colour, sw in lines:
        if key in series:
            out.append(_polyline(t, series[key], x_of, y_of, colour, sw, label))
    return out


def _top(series: dict, keys, floor: float) -> float:
    vals = [v for k in keys for v in (series.get(k) or []) if v is not None]
    return max([floor, *vals])


def run_charts(series: dict | None) -> tuple[str, str]:
    if not series or len(series.get("t_s") or []) < 2:
        return "", ""
    panels = []
    if any(k in series for k, *_ in CPU_LINES):
        top = float(int(_top(series, [k for k, *_ in CPU_LINES], 1.0) + 0.999))
        cores = series.get("usable_cpus")
        title = "CPU, cores busy" + (f" (of {cores:g} usable)" if isinstance(cores, (int, float)) and cores > 0 else "")
        panels.append((CPU_LINES, title, top, lambda v: f"{v:g}"))
    if "gpu_util" in series:
        panels.append((GPU_LINES, "GPU busy", 1.0, lambda v: f"{100 * v:.0f}%"))
    if any(k in series for k, *_ in MEM_LINES):
        top = nice_byte_top(_top(series, [k for k, *_ in MEM_LINES], 2 ** 20))
        scale, unit = byte_axis(top)
        panels.append((MEM_LINES, "Memory", top, lambda v, s=scale, u=unit: byte_tick(v, s, u)))
    if not panels:
        return "", ""
    gap = 34
    height = len(panels) * (PANEL_H + gap) + 30
    parts = [f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" aria-label="the run over time" {FONT}>']
    y = gap - 10
    for lines, title, top, tick in panels:
        parts += _panel(series, lines, y, title, top, tick)
        y += PANEL_H + gap
    t = series["t_s"]
    parts += _axis(LEFT, W - LEFT - 20, (t[-1] - t[0]) or 1.0, y - gap + 2, "s")
    parts.append("</svg>")
    groups = [(title.split(",")[0], [(label, colour) for key, label, colour, _ in lines if key in series])
              for lines, title, *_ in panels]
    groups.append(("shaded", [(k, c) for k, c in BANDS if series.get(k)]))
    # each group one box (html.py's .kgroup) that wraps whole: "Memory:" had ended one line and
    # its keys begun the next
    legend = "".join(f'<span class="kgroup"><b>{H(name)}:</b> ' + "".join(f'<span class="key"><i style="background:{c}"></i>'
                                                                          f'{H(label)}</span>' for label, c in keys) + "</span>"
                     for name, keys in groups if keys)
    return legend, "".join(parts)
