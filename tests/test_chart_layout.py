"""The HTML report's charts as a reader sees them: labels that do not print over each other (the
idle-gap numbers, the axes' units), axis numbers that say what the data holds (a memory tick of
0.75 GiB, not 0.8; no tick for a step the run did not have), a trace without step markers not
called a step, and the fixes' key naming tune's mark only where a card draws one. The overlap
checks run in a real headless browser, which measures every <text> of every chart."""

from __future__ import annotations

import json
import re

import pytest

from perfdoctor.report import svg
from perfdoctor.report.fixcards import fixes_section
from perfdoctor.report.runcharts import run_charts
from perfdoctor.report.stepchart import step_chart
from test_show import _browser, cli

GIB = 2 ** 30


def _crowded_view() -> tuple[dict, list[dict]]:
    """A 100 ms step whose six marked gaps (0.5 ms each) lie 1 ms apart: drawn about 800 units
    wide, their numbers were 8 units apart on one line, and printed over each other."""
    gaps = [{"offset_ms": 40.0 + 1.0 * i, "duration_ms": 0.5, "kind": "host_wait",
             "host_activity": "cpu_ops", "host_event": f"op{i}", "step": 3} for i in range(6)]
    view = {"step": 3, "duration_ms": 100.0, "device": [(0.0, 40.0), (60.0, 40.0)],
            "breakdown": [(0.0, 40.0, "kernel"), (40.0, 20.0, "cpu_exec"), (60.0, 40.0, "kernel")],
            "host": [(0.0, 100.0, "cpu_ops")]}
    return view, gaps


def _numbers(pic: str) -> list[tuple[float, float, str]]:
    return [(float(x), float(y), n) for x, y, n in
            re.findall(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="middle" font-weight="bold" fill="#222">(\d+)</text>', pic)]


def test_gap_numbers_close_together_go_on_rows_of_their_own():
    view, gaps = _crowded_view()
    pic = svg.step_lanes(view, gaps, {})
    nums = _numbers(pic)
    assert [n for *_, n in nums] == ["1", "2", "3", "4", "5", "6"]
    for i, (xa, ya, _) in enumerate(nums):
        for xb, yb, _ in nums[i + 1:]:
            assert abs(xa - xb) >= 14 or abs(ya - yb) >= 12, nums
    # each number stays over its own gap, and every row lies inside the drawing
    for (x, y, n), g in zip(nums, gaps):
        centre = svg.LEFT + (svg.W - svg.LEFT - 20) * (g["offset_ms"] + g["duration_ms"] / 2) / 100.0
        assert x == pytest.approx(centre, abs=0.01) and y >= 12, (n, x, centre)
    # gaps far apart keep one row (the picture does not grow for nothing)
    apart = [dict(g, offset_ms=10.0 + 15.0 * i, duration_ms=1.0 + i % 2) for i, g in enumerate(gaps)]
    assert len({y for _, y, _ in _numbers(svg.step_lanes(view, apart, {}))}) == 1
    assert svg.label_rows([0, 5, 10, 20, 40, 41]) == [0, 1, 2, 0, 0, 1]


@pytest.mark.parametrize("top, mid", [(1.5 * GIB, "0.75 GiB"), (2.5 * GIB, "1.25 GiB"), (12 * GIB, "6 GiB"),
                                      (300 * 2 ** 20, "150 MiB")])
def test_memory_axis_numbers_are_not_rounded_to_another_value(top, mid):
    """Half of a 1.5 GiB axis read "0.8 GiB" (one decimal), on both memory charts."""
    series = {"t_s": [0.0, 1.0, 2.0], "ram_used_bytes": [top * 0.9, top, top * 0.95]}
    _, pic = run_charts(series)
    assert f">{mid}</text>" in pic, re.findall(r">[\d.]+ [MG]iB<", pic)
    mem = svg.memory_lines({"t_ms": [0.0, 1.0, 2.0], "reserved_bytes": [top * 0.9, top, top / 2], "allocated_bytes": [0, 0, 0]})
    assert f">{mid}</text>" in mem


def test_every_step_axis_names_only_steps_the_run_had():
    """40 timed steps of a 41-step run: the axis read 1, 11, 21, 31, 41 (41 at the right edge, after
    the last bar), then 1, 10, ..., 40 under "41 steps, 40 timed"; it reads 2, 10, 20, 30, 40, each
    tick in the middle of its step's bar, the first timed step being the run's second."""
    from perfdoctor.report.stepchart import step_ticks
    assert step_ticks(1, 40) == [1, 10, 20, 30, 40]
    assert step_ticks(100, 7) == [100, 102, 104, 106] and step_ticks(5, 1) == [5]
    n = 40
    series = {"k": 1, "first_step": 1, "ms": [10.0] * n, "wait_ms": [0.0] * n, "kind": ["steady"] * n, "steady": [0, n - 1]}
    _, pic = step_chart(series, 10.0)
    ticks = {int(t): float(x) for x, t in re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle" fill="#555">(\d+)</text>', pic)}
    # the series' step 1 is the run's second step, the first timed one ("41 steps, 40 timed")
    assert sorted(ticks) == [2, 10, 20, 30, 40]
    assert "<title>step 2 (steady step): 10.0 ms" in pic and "<title>step 41 (steady step)" in pic
    assert "<title>step 1 " not in pic and "<title>step 42 " not in pic
    bars = [float(x) for x in re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="#3a7dc2"', pic)]
    bw = (svg.W - svg.LEFT - 20) / n
    assert ticks[40] == pytest.approx(bars[38] + bw / 2, abs=0.02) and ticks[2] == pytest.approx(bars[0] + bw / 2, abs=0.02)
    # a closure optimizer's first step is timed from its own start ("40 steps, all timed"): 1-40
    _, pic = step_chart(series, 10.0, all_timed=True)
    assert "<title>step 1 (steady step): 10.0 ms" in pic and "<title>step 40 (steady step)" in pic
    assert "<title>step 41 " not in pic


@pytest.mark.parametrize("first", [1, 22, 12345])
def test_the_step_axis_name_ends_short_of_the_first_steps_number(first):
    """A run whose steps began at 22 (an evaluation of 20 calls before the first optimizer step: a
    nanoGPT-style loop) read "step22" under its chart: the name ends 6 px short of that number."""
    from perfdoctor.report.stepchart import DIGIT_W
    n = 300
    series = {"k": 1, "first_step": first, "ms": [10.0] * n, "wait_ms": [0.0] * n, "kind": ["steady"] * n,
              "steady": [0, n - 1]}
    _, pic = step_chart(series, 10.0, all_timed=True)
    tick = rf'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle" fill="#555">{first}</text>'
    x0 = float(re.search(tick, pic).group(1))
    name = float(re.search(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" fill="#555">step</text>', pic).group(1))
    assert name <= x0 - DIGIT_W / 2 * len(str(first)) - 6 + 0.01 and name <= svg.LEFT - 8


def test_a_trace_without_steps_is_called_the_whole_trace(shared_traces, tmp_path):
    """HTA's alexnet trace marks no steps: its pseudo-step read "step all" and its timeline "the
    steady step closest to the median"."""
    out = tmp_path / "a.html"
    assert cli("report", shared_traces / "hta/critical_path/alexnet", "-f", "html", "-o", out).returncode == 0
    page = out.read_text()
    assert "step all" not in page and "closest to their median" not in page
    assert "<h2>The whole trace as a timeline (" in page and "One step as a timeline" not in page and ">whole trace</text>" in page
    assert "<td>whole trace</td>" in page


def test_the_fixes_name_tunes_mark_only_where_a_card_draws_it():
    doc = {"traces": [{"label": "a"}], "verdict": {}, "findings": [{"id": "PD348", "ranked": True, "title": "t", "summary": "s", "fix": {"text": "f"},
                         "gain": {"expected": 1.1, "ceiling": 1.1, "text": "expected ~1.10x"}, "source": {}}]}
    other = {"trials": [{"rule": "PD301", "speedup": 1.3, "status": "ok", "label": "num_workers=2"}]}
    mine = {"trials": [{"rule": "PD348", "speedup": 1.07, "status": "ok", "label": "threads=2"}]}
    assert "black mark" not in fixes_section(doc, other) and "measured by tune" not in fixes_section(doc, other)
    page = fixes_section(doc, mine)
    assert "black mark" in page and "measured by tune: 1.07x" in page and "border-right:3px" in page


_PROBE = ("<script>var out=[];document.querySelectorAll('svg.chart').forEach(function(s,si){var ts=[].slice.call("
          "s.querySelectorAll('text')).map(function(t){return [t.textContent,t.getBoundingClientRect()]});"
          "for(var i=0;i<ts.length;i++)for(var j=i+1;j<ts.length;j++){var a=ts[i][1],b=ts[j][1];"
          "var ox=Math.min(a.right,b.right)-Math.max(a.left,b.left),oy=Math.min(a.bottom,b.bottom)-Math.max(a.top,b.top);"
          "if(ox>0.5&&oy>0.5)out.push(si+':'+ts[i][0]+'|'+ts[j][0])}});document.body.setAttribute('data-ov',"
          "document.querySelectorAll('svg.chart text').length+' '+out.join(';'))</script></body>")


def _overlaps(page: str, tmp_path, width: int) -> tuple[int, str]:
    probe = tmp_path / f"probe{width}.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace("</body>", _PROBE))
    dom = _browser(f"--window-size={width},3000", "--dump-dom", probe.as_uri(), cwd=tmp_path).stdout
    found = re.search(r'data-ov="(\d+) ([^"]*)"', dom)
    assert found, dom[-500:]
    return int(found.group(1)), found.group(2)


@pytest.mark.parametrize("width", [1280, 800])
def test_no_chart_label_prints_over_another_in_a_browser(shared_traces, tmp_path, width):
    """Every text of every chart, measured by the browser at 1280 and 800 px: on the H100 loader
    page the x axis's "step" printed into the "0 ms" above it, and the crowded gaps' numbers into
    each other."""
    out = tmp_path / "loader.html"
    assert cli("report", shared_traces / "h100/loader", "-f", "html", "-o", out).returncode == 0
    page = out.read_text()
    view, gaps = _crowded_view()
    page = page.replace("</main>", "<section class=\"card\">" + svg.step_lanes(view, gaps, {}) + "</section></main>")
    count, bad = _overlaps(page, tmp_path, width)
    assert count > 60 and bad == "", bad


def test_a_tune_json_beside_a_run_is_its_tune_only_if_the_tune_made_that_run(tmp_path):
    """`perfdoctor tune -o runs/tune.json` beside `runs/my-run`: the report of my-run took that tune's
    measurements as its own ("the black mark is the speed-up tune measured", on another script's
    fixes). A tune directory's own baseline/ and trials still find it; --tune FILE is always read."""
    from perfdoctor.report.outputs import tune_for
    tune = {"trials": [{"rule": "PD301", "speedup": 1.3, "status": "ok", "dir": "/elsewhere/t/01-num_workers=2"}],
            "baseline": {"dir": "/elsewhere/t/baseline", "repeats": [{"dir": "/elsewhere/t/baseline-2"}]}}
    (tmp_path / "tune.json").write_text(json.dumps(tune))
    for name in ("my-run", "baseline", "baseline-2", "01-num_workers=2"):
        (tmp_path / name).mkdir()
    assert tune_for(tmp_path / "my-run", None) is None
    assert tune_for(tmp_path / "my-run", tmp_path / "tune.json") == tune
    for name in ("baseline", "baseline-2", "01-num_workers=2"):
        assert tune_for(tmp_path / name, None) == tune, name


_GROUPS = ("<script>var n=0,bad=[];document.querySelectorAll('.legend .kgroup').forEach(function(g){n++;"
           "var tops=[].map.call(g.children,function(c){return Math.round(c.getBoundingClientRect().top)});"
           "if(Math.max.apply(null,tops)!==Math.min.apply(null,tops))bad.push(g.textContent)});"
           "document.body.setAttribute('data-groups',n+' '+bad.join(';'))</script></body>")


@pytest.mark.parametrize("width", [1280, 800])
def test_a_legend_group_of_the_run_over_time_stays_on_one_line(shared_traces, tmp_path, width):
    """The run-over-time legend (CPU: ..., GPU busy: ..., Memory: ..., shaded: ...) wrapped
    anywhere: at 800 px "Memory:" ended a line and its keys began the next (H100 lightning), at
    1280 "traced" sat alone under "shaded: steps" (H100 loader). Each group wraps whole."""
    out = tmp_path / "lightning.html"
    assert cli("report", shared_traces / "h100/lightning", "-f", "html", "-o", out).returncode == 0
    probe = tmp_path / "groups.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", out.read_text()).replace("</body>", _GROUPS))
    dom = _browser(f"--window-size={width},3000", "--dump-dom", probe.as_uri(), cwd=tmp_path).stdout
    found = re.search(r'data-groups="(\d+) ([^"]*)"', dom)
    assert found and int(found.group(1)) == 4 and found.group(2) == "", found and found.group(0)


def test_the_step_breakdown_legend_keys_the_rows_of_its_table(shared_traces, tmp_path):
    """H100 `launch`: the legend had a key for memset (0.01 ms of 24 ms, no visible bar) that the
    table under it left out (under its 0.05% cut)."""
    out = tmp_path / "launch.html"
    assert cli("report", shared_traces / "h100/launch", "-f", "html", "-o", out).returncode == 0
    sec = out.read_text().split("<h2>Step breakdown")[1].split("<h2>")[0]
    legend, table = sec.split("<svg")[0], sec.split("<table")[1]
    keys = re.findall(r"</i>([^<]+)</span>", legend)
    rows = re.findall(r"</i>([^<]+)</span></td>", table)
    assert keys == rows and "GPU kernels" in keys and "memset" not in keys, (keys, rows)
