"""Every step of the run for the HTML report: one bar per step (or per bin of k steps), its data
wait at the bottom, coloured by what the step-time estimator made of it (report `run.step_series`,
analyze/stepseries.py), with the steady window shaded. A bursty loader, an evaluation every N
steps, warm-up and the profiled window are seen at once, and so is how the step time was taken.

`step_chart(series)` -> (legend keys, <svg>) or ("", "") when there is nothing to draw. The axis
tops at the steady window's longest bar: a warm-up step of seconds (a first compile) would flatten
the rest, so a bar above it is cut, marked, and keeps its value in its title.
"""

from __future__ import annotations

from perfdoctor.report.sanitize import html as H
from perfdoctor.report.svg import FONT, LEFT, TICK_DY, W, _f, _rect, _ticks
from perfdoctor.stats.steptime import ms as fmt_ms

KIND = {"steady": ("#3a7dc2", "steady step"), "profiled": ("#e6a817", "profiled: traced"),
        "perturbed": ("#9aa0a6", "right after the trace export"), "outside": ("#c5c9ce", "warm-up, transient or partial cycle")}
WAIT = ("#d64541", "data wait")
BAND = "#e6f2e6"
H_PLOT = 150
TOP_PAD = 14


def _first(series: dict) -> int | None:
    """The first bar's step as the run line counts steps ("41 steps, 40 timed"): the series counts
    from 0 at the first step's end, which starts the clock, so its step 1 is the run's second step,
    the first timed one (the chart had numbered the timed steps 1-40 under "41 steps"); where the
    first step was timed from its own start ("4 steps, all timed": a closure optimizer's, the
    `all_timed` step_chart puts in the series) its step 1 is the first."""
    first = series.get("first_step")
    if not isinstance(first, int) or isinstance(first, bool):
        return None
    return first if series.get("all_timed") is True else first + 1


def _title(series: dict, i: int) -> str:
    k, first = series["k"], _first(series)
    where = (f"step {first + i * k}" if k == 1 else f"steps {first + i * k}-{first + i * k + k - 1}") \
        if isinstance(first, int) else f"bar {i + 1}"
    mean = "" if k == 1 else " mean"
    longest = f", longest {fmt_ms(series['max_ms'][i])} ms" if series.get("max_ms") else ""
    return (f"{where} ({KIND.get(series['kind'][i], ('', series['kind'][i]))[1]}):{mean} {fmt_ms(series['ms'][i])} ms, "
            f"data wait {fmt_ms(series['wait_ms'][i])} ms{longest}")


def step_chart(series: dict | None, step_ms: float | None = None, all_timed: bool = False) -> tuple[str, str]:
    """`step_ms`: the run's step time (run.step_time_ms), drawn as a dashed line over the bars;
    `all_timed`: the run's first step was timed (run.first_step_timed), and numbers 1."""
    if not series or not series.get("ms"):
        return "", ""
    series = {**series, "all_timed": all_timed is True}
    vals, maxes, kinds = series["ms"], series.get("max_ms"), series["kind"]
    n = len(vals)
    tall = maxes or vals
    win = series.get("steady")
    inside = tall[win[0]:win[1] + 1] if win else tall
    top = max(inside) or max(tall) or 1.0
    ticks = _ticks(top, 5)
    if len(ticks) > 1 and ticks[-1] < top * 0.9999:         # round the axis up to the next tick
        ticks.append(ticks[-1] + ticks[1] - ticks[0])
    top = ticks[-1] if len(ticks) > 1 else top
    width = W - LEFT - 20
    bw = width / n
    y0 = TOP_PAD
    y_of = (lambda v: y0 + H_PLOT * (1 - min(v, top) / top))
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H_PLOT + TOP_PAD + 40}" role="img" aria-label="the time of every step" {FONT}>']
    if win:
        parts.append(f'<rect x="{_f(LEFT + win[0] * bw)}" y="{_f(y0)}" width="{_f((win[1] - win[0] + 1) * bw)}" '
                     f'height="{H_PLOT}" fill="{BAND}"><title>steady window</title></rect>')
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{LEFT}" y1="{_f(y)}" x2="{LEFT + width}" y2="{_f(y)}" stroke="#e3e3e3"/>'
                     f'<text x="{LEFT - 8}" y="{_f(y + 4)}" text-anchor="end" fill="#555">{_f(t)} ms</text>')
    bar_w = max(bw - (0.15 * bw if bw >= 3 else 0.0), 0.5)
    for i, (v, w, kind) in enumerate(zip(vals, series["wait_ms"], kinds)):
        # one title for the bar, its wait, its whisker and its cut mark: a group's (a 4000-step run's
        # chart had carried each title three times)
        x, title = LEFT + i * bw, H(_title(series, i))
        yv, yw = y_of(v), y_of(min(w, v))
        fill = KIND.get(kind, KIND["outside"])[0]
        parts.append(f'<g><title>{title}</title>' + _rect(x, yv, bar_w, yw - yv, fill, ""))
        if w > 0:
            parts.append(_rect(x, yw, bar_w, y0 + H_PLOT - yw, WAIT[0], ""))
        if maxes and maxes[i] > v:              # a bin's longest step: a whisker up to it, and a tick
            ym, xm = y_of(maxes[i]), x + bar_w / 2
            parts.append(f'<line x1="{_f(xm)}" y1="{_f(yv)}" x2="{_f(xm)}" y2="{_f(ym)}" stroke="#555" '
                         f'stroke-width="1"/><line x1="{_f(xm - 2)}" y1="{_f(ym)}" x2="{_f(xm + 2)}" y2="{_f(ym)}" '
                         f'stroke="#222" stroke-width="1.5"/>')
        if (maxes[i] if maxes else v) > top:     # cut at the top: marked
            parts.append(f'<path d="M{_f(x + bw / 2 - 4)},{_f(y0 - 2)} L{_f(x + bw / 2)},{_f(y0 - 9)} '
                         f'L{_f(x + bw / 2 + 4)},{_f(y0 - 2)} Z" fill="#333"><title>{title} (cut at the top of the '
                         f'axis)</title></path>')
        parts.append("</g>")
    if isinstance(step_ms, (int, float)) and 0 < step_ms <= top:
        y = y_of(step_ms)
        parts.append(f'<line x1="{LEFT}" y1="{_f(y)}" x2="{LEFT + width}" y2="{_f(y)}" stroke="#222" '
                     f'stroke-dasharray="5 3"><title>step time {fmt_ms(step_ms)} ms: the steady window\'s wall time '
                     f'over its steps</title></line>')
    parts += _x_axis(series, n, bw, y0 + H_PLOT)
    parts.append("</svg>")
    present = [k for k in KIND if k in kinds]
    keys = [KIND[k] for k in present] + ([WAIT] if any(w > 0 for w in series["wait_ms"]) else [])
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{H(label)}</span>' for c, label in keys) \
        + (f'<span class="key"><i style="background:{BAND}"></i>steady window</span>' if win else "") \
        + ('<span class="key">- - - step time (steady wall time / steps)</span>'
           if isinstance(step_ms, (int, float)) and 0 < step_ms <= top else "") \
        + (f'<span class="key">bars of {series["k"]} steps: their mean; the whisker reaches their longest</span>'
           if maxes else "")
    return legend, "".join(parts)


def step_ticks(first: int, count: int) -> list[int]:
    """The step numbers to mark on the axis of `count` steps from step `first`: the first step and
    round numbers after it (1, 10, 20, 30, 40 of steps 1-40), each a step that is on the chart: a
    tick after the last bar (41 of 40 steps) had named a step the run did not have."""
    ticks = _ticks(float(count))
    d = max(1, round(ticks[1] - ticks[0])) if len(ticks) > 1 else 1
    last = first + count - 1
    start = -(-first // d) * d                         # the first multiple of d from `first` on
    return [first] + [t for t in range(start, last + 1, d) if t - first >= d / 2]


DIGIT_W = 7.0       # a digit's width at the charts' 12 px font (svg.FONT), a little over


def _x_axis(series: dict, n: int, bw: float, y: float) -> list[str]:
    k, first = series["k"], _first(series)
    first = first if first is not None else 1
    out = [f'<line x1="{LEFT}" y1="{_f(y)}" x2="{_f(LEFT + n * bw)}" y2="{_f(y)}" stroke="#999"/>']
    for step in step_ticks(first, n * k):
        x = LEFT + bw * (step - first + 0.5) / k           # the middle of that step's place on the axis
        out.append(f'<line x1="{_f(x)}" y1="{_f(y)}" x2="{_f(x)}" y2="{_f(y + 4)}" stroke="#999"/>'
                   f'<text x="{_f(x)}" y="{_f(y + TICK_DY)}" text-anchor="middle" fill="#555">{step}</text>')
    # the axis's name ends short of the first tick's number (step `first`, at bw / 2k): "step22" read
    # as one word when a run's steps began at 22
    first_left = LEFT + bw * 0.5 / k - DIGIT_W / 2 * len(str(first))
    out.append(f'<text x="{_f(min(LEFT - 8, first_left - 6))}" y="{_f(y + TICK_DY)}" text-anchor="end" '
               f'fill="#555">step</text>')
    return out
