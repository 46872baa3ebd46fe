"""Every step of a run (analyze/stepseries.py) and its chart in the HTML report (report/stepchart.py)."""

from __future__ import annotations

import re

import pytest

from perfdoctor.analyze.stepseries import MAX_BARS, step_series
from perfdoctor.report.stepchart import step_chart


def _steps(n, long_every=None, first=1, wait=0.0):
    return [{"step": first + i, "dur": 0.050 if long_every and i % long_every == long_every - 1 else 0.002,
             "wait": wait, "profiled": 5 <= i < 8, "perturbed": i == 8} for i in range(n)]


def test_each_step_is_a_bar_with_what_the_estimator_made_of_it():
    s = step_series(_steps(40, wait=0.0005), first=10, n=25)
    assert s["k"] == 1 and s["max_ms"] is None and s["first_step"] == 1 and len(s["ms"]) == 40
    assert s["ms"][0] == 2.0 and s["wait_ms"][0] == 0.5
    assert s["kind"][5:9] == ["profiled"] * 3 + ["perturbed"]
    assert s["kind"][9] == "outside" and s["kind"][10:35] == ["steady"] * 25 and s["kind"][35] == "outside"
    assert s["steady"] == [10, 34]


def test_a_long_run_is_binned_by_mean_and_keeps_its_longest_step():
    steps = _steps(3000, long_every=20)
    s = step_series(steps, first=20, n=2900)
    assert s["k"] == 5 and len(s["ms"]) == MAX_BARS
    # a bin of 5 steps holding one 50 ms step: the mean of the bin, and the long step as its max
    assert s["max_ms"][3] == 50.0 and s["ms"][3] == pytest.approx((50 + 4 * 2) / 5)
    assert s["ms"][0] == 2.0 and s["max_ms"][0] == 2.0
    assert s["kind"][1] == "profiled" and s["kind"][3] == "outside" and s["kind"][4] == "steady"
    # the mean of the bars is the mean step: wall time over steps, the long steps in it
    assert sum(s["ms"]) / len(s["ms"]) == pytest.approx(1e3 * sum(x["dur"] for x in steps) / 3000)


def test_no_timed_step_no_series():
    assert step_series([], 0, 0) is None
    assert step_series([{"step": 1, "dur": 0}], 0, 0) is None


def test_the_chart_cuts_a_warm_up_step_above_the_steady_ones_and_says_so():
    steps = _steps(40, long_every=10)
    steps[0]["dur"] = 2.5                                      # a first compile: 2.5 s
    s = step_series(steps, first=10, n=30)
    legend, pic = step_chart(s)
    assert pic.startswith('<svg class="chart"') and 'aria-label="the time of every step"' in pic
    ticks = [float(t) for t in re.findall(r'>([\d.]+) ms</text>', pic)]
    assert max(ticks) == 50.0                                  # the steady window's longest step
    assert "step 2 (warm-up, transient or partial cycle): 2500 ms, data wait 0.0 ms (cut at the top" in pic
    assert "step 21 (steady step): 50.0 ms" in pic      # the 20th timed step, the run's 21st
    assert "profiled: traced" in legend and "steady window" in legend and "data wait" not in legend
    assert step_chart(None) == ("", "")


def test_the_chart_marks_a_bins_longest_step():
    legend, pic = step_chart(step_series(_steps(3000, long_every=20), first=20, n=2900))
    assert "bars of 5 steps: their mean; the whisker reaches their longest" in legend
    assert "steps 37-41 (steady step): mean 11.6 ms, data wait 0.0 ms, longest 50.0 ms" in pic
    assert pic.count("(cut at the top") == 0


def test_the_step_time_is_a_dashed_line_at_its_height():
    s = step_series(_steps(40, long_every=10), first=10, n=30)
    legend, pic = step_chart(s, 6.8)
    line = re.search(r'<line x1="\d+" y1="([\d.]+)"[^>]*stroke-dasharray="5 3"><title>step time 6.80 ms', pic)
    assert line and "step time (steady wall time / steps)" in legend
    assert float(line.group(1)) == pytest.approx(14 + 150 * (1 - 6.8 / 50))     # TOP_PAD + H_PLOT scaled
    assert "stroke-dasharray" not in step_chart(s, None)[1]
