"""Showing the diagnosis: the HTML report (in a real headless browser), the annotated trace, the
markdown summary (golden file) and the one-screen terminal report."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tracegen as tg
from perfdoctor.report.sanitize import html as H

GOLDEN = Path(__file__).parent / "golden" / "report_input_bound.md"
HOSTILE = '<script>alert(1)</script><img src=x onerror="fetch(\'https://evil.example\')">&amp;'


def cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env={**os.environ, **(env or {})})


def _spec() -> tg.TraceSpec:
    """Input-bound: 6 ms data wait per step against ~2 ms of work, pageable copies, a sync after
    which the loop's own code (0.4 ms) leaves the drained device idle; memory events."""
    return tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=6000, pageable_h2d=1, syncs=1, kernels=16, kernel_us=80)] * 5,
                        memory_events=True, gap_us=400)


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "w.pt.trace.json"
    tg.write(_spec(), p)
    return p


@pytest.fixture
def hostile(tmp_path) -> Path:
    """The same trace with one kernel's name (all its launches) replaced by markup."""
    obj, _ = tg.build(_spec())
    ev = obj["traceEvents"]
    names = sorted({e["name"] for e in ev if e.get("cat") == "kernel"})
    for e in ev:
        if e.get("name") == names[0]:
            e["name"] = HOSTILE
    p = tmp_path / "hostile.json"
    p.write_text(json.dumps(obj))
    return p


# --- HTML --------------------------------------------------------------------------------------

def _html(path: Path, tmp_path: Path) -> str:
    out = tmp_path / "r.html"
    r = cli("report", path, "--format", "html", "-o", out)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    return out.read_text()


def test_html_is_self_contained_and_has_the_drawings(trace, tmp_path):
    page = _html(trace, tmp_path)
    assert page.startswith("<!DOCTYPE html>") and "INPUT-BOUND" in page
    assert "default-src 'none'" in page                     # the browser refuses any request
    # nothing to fetch: no script, no external resource, no URL anywhere in the page
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|https?://|src=", page, re.I)
    svgs = re.findall(r"<svg class=\"chart\"[^>]*aria-label=\"([^\"]+)\"", page)
    assert svgs == ["step breakdown per step", "one step as a timeline", "device memory over time"]
    # one stacked bar per step: a rect per (step, role) with time, titled with its milliseconds
    bars = page.split('aria-label="step breakdown per step"')[1].split("</svg>")[0]
    assert len(re.findall(r"<text[^>]*>step \d+</text>", bars)) == 5
    assert bars.count("data loading 6") == 5               # 6.0xx ms of data loading in every step
    lanes = page.split('aria-label="one step as a timeline"')[1].split("</svg>")[0]
    assert ">device<" in lanes and ">breakdown<" in lanes and ">host<" in lanes and "waiting for data" in lanes
    assert "Load batches in (more) parallel worker processes" in page and "at most" in page   # fix with its ceiling
    kernels = page.split("<h2>Top kernels</h2>")[1].split("</table>")[0]
    assert ">None<" not in kernels and re.search(r'<td class="num">\d+</td>', kernels)  # calls per kernel


def test_html_step_bars_are_at_most_thirty_evenly_spaced(tmp_path):
    """A trace of 100 traced steps: 30 bars, the first and the last steps among them, and the
    heading says so (a 240-step trace had drawn 240 bars, ~4000 px of rows alike)."""
    p = tmp_path / "long.pt.trace.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=600, kernels=2, kernel_us=50)] * 100), p)
    page = _html(p, tmp_path)
    bars = page.split('aria-label="step breakdown per step"')[1].split("</svg>")[0]
    named = re.findall(r"<text[^>]*>step (\d+)</text>", bars)
    assert len(named) == 30 and len(set(named)) == 30
    steps = json.loads(cli("report", p, "--format", "json").stdout)["traces"][0]["steps"]
    assert (named[0], named[-1]) == (str(steps[0]["label"]), str(steps[-1]["label"]))
    assert f"{len(steps)} step(s); bars: 30 of them, evenly spaced)</h2>" in page


def test_html_escapes_a_hostile_kernel_name(hostile, tmp_path):
    page = _html(hostile, tmp_path)
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=&quot;" in page    # shown as text
    assert "&amp;amp;" in page


def test_html_cuts_a_100_kb_name_and_keeps_its_start(tmp_path):
    obj, _ = tg.build(_spec())
    names = sorted({e["name"] for e in obj["traceEvents"] if e.get("cat") == "kernel"})
    for e in obj["traceEvents"]:
        if e.get("name") == names[0]:
            e["name"] = "void kernel<" + "L" * 100_000 + ">"
    p = tmp_path / "long.json"
    p.write_text(json.dumps(obj))
    page = _html(p, tmp_path)
    assert "L" * 100_000 not in page and len(page) < 400_000
    assert '<span title="void kernel&lt;LLL' in page and "L…</span>" in page


def _bars(card: str) -> dict[str, float]:
    """A fix card's gain bar: {'expected'|'ceiling'|'measured': width in %}."""
    return {m.group(2): float(m.group(1))
            for m in re.finditer(r'<i style="width:([0-9.]+)%[^"]*" title="(expected|ceiling|measured)', card)}


def _cards(page: str) -> list[str]:
    return page.split('<section class="card fix">')[1:]


def test_gain_bar_is_the_share_of_step_time_removed_on_one_scale(trace, tmp_path):
    """The bar had been stretched from 1x to the largest gain of the report: a fix listed alone
    filled it whatever its gain (1.48x drew as a full bar), and H100 `launch`'s first fix (1.89x)
    drew as a 7% sliver beside the second's 13x ceiling. Its length is now 1 - 1/speed-up."""
    from perfdoctor.report import html
    out = tmp_path / "r.json"
    assert cli("report", trace, "--format", "json", "-o", out).returncode == 0
    doc = json.loads(out.read_text())
    ranked = [f for f in doc["findings"] if f["ranked"] and (f.get("gain") or {}).get("expected")]
    assert ranked, "the input-bound trace has a fix with an expected gain"
    page = html.render(doc)
    for f, card in zip([f for f in doc["findings"] if f["ranked"]], _cards(page)):
        g, bars = f["gain"], _bars(card)
        if g.get("expected"):
            assert bars["expected"] == pytest.approx(100 * (1 - 1 / g["expected"]), abs=0.06)
        if g.get("ceiling"):
            assert bars["ceiling"] == pytest.approx(100 * (1 - 1 / g["ceiling"]), abs=0.06)
            assert bars["ceiling"] >= bars.get("expected", 0) and bars["ceiling"] < 100
    # one fix alone draws the same bar as among the others: the scale is not the report's largest gain
    alone = html.render({**doc, "findings": [ranked[0]]})
    assert _bars(_cards(alone)[0]) == _bars(_cards(page)[[f for f in doc["findings"] if f["ranked"]].index(ranked[0])])
    # a measured slowdown is a mark at the start, not a negative width
    tune = {"trials": [{"rule": ranked[0]["id"], "speedup": 0.8, "status": "ok", "label": "x"}]}
    assert _bars(_cards(html.render(doc, tune))[0])["measured"] == 0.0


def test_gain_bars_of_the_h100_launch_run_keep_the_first_fix_visible(shared_traces, tmp_path):
    from perfdoctor.report import html
    out = tmp_path / "launch.json"
    assert cli("report", shared_traces / "h100" / "launch", "--format", "json", "-o", out).returncode == 0
    doc = json.loads(out.read_text())
    ranked = [f for f in doc["findings"] if f["ranked"]]
    gains = [f["gain"]["expected"] for f in ranked[:2]]
    assert gains[0] > gains[1] and max(f["gain"]["ceiling"] for f in ranked) > 5     # 1.89x, then 1.47x of 13x
    first, second = (_bars(c) for c in _cards(html.render(doc))[:2])
    assert first["expected"] > second["expected"] and first["expected"] > 40          # was 7% of the bar


def _points(svg_part: str, title: str) -> list[tuple[float, float]]:
    pts = re.search(r'<polyline points="([^"]+)"[^>]*><title>' + title, svg_part).group(1)
    return [tuple(map(float, p.split(","))) for p in pts.split()]


def test_device_memory_is_a_step_line_held_until_the_next_event(trace, tmp_path):
    """The allocator's counters change at events only: a line between two events 100 ms apart
    had drawn an empty_cache's drop of 6 GiB as a slope over those 100 ms (H100 `alloc`)."""
    from perfdoctor.report import svg
    gib = 2 ** 30
    pic = svg.memory_lines({"t_ms": [0.0, 10.0, 110.0, 120.0], "reserved_bytes": [2 * gib, 7 * gib, 1 * gib, 1 * gib],
                            "allocated_bytes": [1 * gib, 6 * gib, 0.5 * gib, 0.5 * gib]})
    res = _points(pic, "reserved")
    top = min(y for _, y in res)                        # 7 GiB, the highest point
    x10, x110 = sorted({x for x, _ in res})[1:3]
    # 7 GiB holds from the event at 10 ms up to the one at 110 ms, and drops there, straight down
    assert (x10, top) in res and (x110, top) in res
    i = res.index((x110, top))
    assert res[i + 1][0] == x110 and res[i + 1][1] > top
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(res, res[1:]))
    # on a real trace's memory events too: every segment is flat or vertical
    page = _html(trace, tmp_path)
    mem = page.split('aria-label="device memory over time"')[1].split("</svg>")[0]
    for title in ("reserved", "allocated"):
        pts = _points(mem, title)
        assert len(pts) >= 3
        assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(pts, pts[1:])), title
        assert [x for x, _ in pts] == sorted(x for x, _ in pts)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _browser(*args, cwd: Path) -> subprocess.CompletedProcess:
    exe = _chromium()
    if exe is None:
        pytest.skip("no headless browser (apt-get install chromium; .ci/run installs it where apt works)")
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--user-data-dir={cwd / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_html_renders_in_a_headless_browser(hostile, tmp_path):
    out = tmp_path / "r.html"
    assert cli("report", hostile, "-f", "html", "-o", out).returncode == 0
    shot = tmp_path / "report.png"
    r = _browser(f"--screenshot={shot}", "--window-size=1100,2600", out.as_uri(), cwd=tmp_path)
    assert shot.is_file(), r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000        # a page, not a blank
    # the DOM the browser built: the hostile name is text, no element came from it
    dom = _browser("--dump-dom", out.as_uri(), cwd=tmp_path).stdout
    assert "<script" not in dom and "<img" not in dom and "alert(1)" in dom
    assert dom.count("<svg") >= 3 and "INPUT-BOUND" in dom
    print(f"screenshot: {shot}")


def test_a_narrow_window_scrolls_wide_tables_inside_their_card(tmp_path):
    """At phone width (420 px asked; Chromium lays out 500) the per-rank table of a two-rank
    directory ran past its card and the page scrolled sideways. Each card scrolls its own wide
    content now: no card reaches past the window, nor does the page, and the charts keep a
    readable width inside their cards. The browser measures it; a
    copy of the page without its script ban (CSP) runs the measurement."""
    runs = tmp_path / "ranks"
    runs.mkdir()
    for rank in (0, 1):
        steps = [tg.StepSpec(cpu_ops_us=1000, kernels=5, kernel_us=50, nccl_kernels=3, nccl_us=4000 + 900 * rank)] * 4
        tg.write(tg.TraceSpec(steps=steps, rank=rank, world_size=2), runs / f"rank{rank}.pt.trace.json")
    out = tmp_path / "r.html"
    assert cli("report", runs, "-f", "html", "-o", out).returncode == 0
    page = out.read_text()
    assert "Across 2 rank(s)" in page
    probe = tmp_path / "probe.html"
    measure = ("<script>var w=innerWidth,bad=[];document.querySelectorAll('section.card').forEach(function(c,i)"
               "{if(c.getBoundingClientRect().right>w+1)bad.push(i)});var s=1e9;document.querySelectorAll('svg.chart')"
               ".forEach(function(g){s=Math.min(s,g.getBoundingClientRect().width)});document.body.setAttribute('data-fit',"
               "document.documentElement.scrollWidth+' '+w+' '+bad.join(',')+' '+Math.round(s))</script></body>")
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace("</body>", measure))
    dom = _browser("--window-size=420,3000", "--dump-dom", probe.as_uri(), cwd=tmp_path).stdout
    fit = re.search(r'data-fit="(\d+) (\d+) ([\d,]*) (\d+)"', dom)
    assert fit, dom[-500:]
    page_w, window_w, cards, chart_w = int(fit.group(1)), int(fit.group(2)), fit.group(3), int(fit.group(4))
    assert window_w <= 520 and page_w <= window_w and cards == "", fit.group(0)
    # the charts (drawn 900 wide, 11 px text) keep 600 px and scroll in their card: scaled to the
    # phone's ~450 px their text was 5 px high
    assert 600 <= chart_w < 1e9, fit.group(0)


# --- annotated trace ---------------------------------------------------------------------------

def test_annotated_trace_keeps_every_event_and_reports_the_same(trace, tmp_path):
    out = tmp_path / "a.json.gz"
    r = cli("report", trace, "-f", "json", "--annotate", out)
    assert r.returncode == 0, r.stderr
    before = json.loads(r.stdout)
    orig = json.loads(trace.read_text())["traceEvents"]
    ann = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    added = [e for e in ann if e.get("pid") == ann[0].get("pid")]   # spliced in first
    assert ann[len(added):] == orig                                  # every original event, unchanged
    xs = [e for e in added if e["ph"] == "X"]
    assert all(e["cat"] == "perfdoctor" for e in xs) and len({e["pid"] for e in added}) == 1
    assert added[0]["pid"] not in {e.get("pid") for e in orig}
    names = {e["args"]["name"] for e in added if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert {"perfdoctor", "verdict", "steps", "idle gaps"} <= names and any(n.startswith("flag PD201") for n in names)
    by_tid = {}
    for e in xs:
        by_tid.setdefault(e["tid"], []).append(e)
    assert by_tid[1][0]["name"].startswith("INPUT-BOUND") and len(by_tid[2]) == 5
    want = [f"step {s['label']}: input {100 * s['dominant']['share']:.0f}%" for s in before["traces"][0]["steps"]]
    assert [e["name"] for e in by_tid[2]] == want and all(s["dominant"]["share"] > 0.6 for s in before["traces"][0]["steps"])
    gaps = by_tid[3]
    assert gaps and all(e["name"].startswith("idle ") and "host wait" in e["name"] for e in gaps[:5])
    # the gaps lie on the trace's own time line, inside its steps
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in orig if e.get("name", "").startswith("ProfilerStep"))
    assert all(steps[0][0] - 1 <= g["ts"] <= steps[-1][1] + 5000 for g in gaps)
    after = json.loads(cli("report", out, "-f", "json").stdout)
    assert after["verdict"] == before["verdict"]
    assert [f["id"] for f in after["findings"]] == [f["id"] for f in before["findings"]]
    assert [f["id"] for f in after["flags"]] == [f["id"] for f in before["flags"]]


# --- markdown ----------------------------------------------------------------------------------

def test_markdown_report_matches_the_golden_file(tmp_path):
    tg.write(_spec(), tmp_path / "w.pt.trace.json")
    r = cli("report", "w.pt.trace.json", "--format", "markdown", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = re.sub(r"perfdoctor \d+\.\d+\.\S+?:", "perfdoctor VERSION:", r.stdout)
    if os.environ.get("PERFDOCTOR_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text()


def test_markdown_escapes_a_hostile_name(tmp_path):
    from perfdoctor.report.markdown import report
    doc = {"verdict": {"bound": "device", "confidence_label": "high", "confidence": 0.9, "summary": HOSTILE,
                       "evidence": {"x": HOSTILE}, "notes": [HOSTILE]},
           "traces": [{"metrics": {"trace.platform": "cuda", "trace.device_name": "[a](https://evil.example)"},
                       "steps": [], "warnings": [HOSTILE, HOSTILE, "second"]}],
           "input": "`x`", "findings": [], "flags": [{"severity": "high", "title": "**b**", "id": "PD1"}]}
    md = report(doc)
    quoted = [x for x in md.splitlines() if x.startswith("> **warning:**")]
    assert len(quoted) == 2 and quoted[1] == "> **warning:** second"     # each once, each its own quote
    assert md.splitlines()[md.splitlines().index(quoted[0]) + 1] == ""
    own = re.sub(r"</?(details|summary|sub)>", "", md)
    assert not re.search(r"(?<!\\)<", own) and "](https" not in md and "**b**" not in md   # every < escaped
    assert "\\<script\\>" in md


# --- terminal ----------------------------------------------------------------------------------

def _screen(path) -> list[str]:
    r = cli("report", path, env={"COLUMNS": "100", "LINES": "50"})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_terminal_report_fits_one_screen(trace):
    lines = _screen(trace)
    assert len(lines) <= 45 and max(map(len, lines)) <= 100
    text = "\n".join(lines)
    assert "INPUT-BOUND" in text and "Top fixes" in text and "Flags" in text
    first = next(line for line in lines if line.startswith(" 1. "))
    assert re.match(r" 1\. ~\d+\.\d\dx \(max \d+\.\d\dx\) +PD301 ", first), first   # the gain before the title


def test_terminal_report_of_shared_traces_fits_one_screen(shared_traces):
    for p in (shared_traces / "h100" / "loader", shared_traces / "h100" / "sync" / "trace"):
        lines = _screen(p)
        assert len(lines) <= 45, (p, len(lines))


def test_details_keep_indentation_and_never_wrap_code(trace):
    r = cli("report", trace, "--details", env={"COLUMNS": "60"})
    out = r.stdout.splitlines()
    i = next(k for k, line in enumerate(out) if line.startswith(" 1. Load batches"))
    para = []
    for line in out[i + 1:]:
        if not line.startswith("    "):
            break
        para.append(line)
    assert len(para) >= 4                        # the summary and fix text wrapped at 60 columns ...
    assert all(line.startswith("    ") for line in para)      # ... keep their indentation
    code = [line for line in out if line.startswith("      ") and ("DataLoader(" in line or "num_workers=" in line)]
    assert code and all(len(line) <= 60 for line in code)
    assert any(line.rstrip().endswith("…") for line in code)   # cut, not wrapped onto the next line


def test_not_a_terminal_no_line_is_cut(trace):
    """stdout to a file or pipe, no COLUMNS: the one-line items (fix titles, the --details hint, code)
    run as long as they are instead of ending in '…' at 80 columns, and nothing is padded."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(trace)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "--details: evidence, the fixes in full with code, gaps and tables; --format html: the pictures"
    doc = json.loads(cli("report", trace, "--format", "json").stdout)
    titles = [f["title"] for f in doc["findings"] if f["ranked"]][:3]
    assert any(len(t) > 50 for t in titles)                 # past 80 columns after the gain column
    for t in titles:
        assert any(line.endswith(t) for line in lines), t
    assert not any(line.endswith("…") for line in lines) and max(map(len, lines)) < 400
    d = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(trace), "--details"], capture_output=True,
                       text=True, timeout=180, env=env).stdout.splitlines()
    code = [line for line in d if line.startswith("      ") and "DataLoader(" in line]
    assert code and not any(line.endswith("…") for line in code) and max(map(len, d)) < 1000


def _run_dir(d: Path, durs, wall_s: float, runq=None) -> Path:
    """A run directory of `perfdoctor run --no-trace` from step records (runq: the training
    thread's run-queue wait per step)."""
    d.mkdir()
    ends = 1.7e9 + np.cumsum(durs)
    (d / "steps.jsonl").write_text("".join(json.dumps({"step": i + 1, "end": float(e), "dur": float(x), "wait": 0.0,
                                                       "mode": "optimizer", "profiled": False, "perturbed": False,
                                                       **({"runq": float(runq[i])} if runq is not None else {})}) + "\n"
                                           for i, (e, x) in enumerate(zip(ends, durs))))
    (d / "child.json").write_text(json.dumps({"outcome": "completed", "exit_code": 0, "torch_imported": True,
                                              "trace_enabled": False, "cuda_available": False, "notes": []}))
    (d / "run.json").write_text(json.dumps({"argv": ["train.py"], "exit_code": 0, "signal": None, "wall_s": wall_s,
                                            "stopped_by": None, "notes": []}))
    return d


def test_a_run_of_too_few_steps_still_says_how_many(tmp_path):
    """A --duration run that ended after one 3-s step printed no step count at all (a user trial)."""
    import io

    from perfdoctor.diagnose.live import diagnose_dir
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render

    doc = diagnose_dir(_run_dir(tmp_path / "run", [3.0], 12.0))
    assert doc["traces"][0]["metrics"]["run.step_time_ms"] is None and doc["run"]["steps"] == 1
    c = console(file=io.StringIO())
    render(doc, c)
    assert "2 steps, 1 timed: too few for a step time" in c.file.getvalue()


def test_a_loop_no_dataloader_feeds_is_not_given_a_measured_data_wait():
    """nanoGPT's get_batch slices a memmap inside the step: no DataLoader batch in the steps, and
    "data wait 0.0%" read as a measured wait; a loop a DataLoader feeds keeps its figure."""
    from perfdoctor.report.labels import data_wait_text

    none = {"loop.batches_per_step": 0.0, "run.data_wait_share": 0.0}
    assert data_wait_text(none) == "no DataLoader batch in these steps (data the loop makes itself is step time)"
    assert data_wait_text({**none, "stacks.producer_wait_share": 0.3}).endswith(
        "is step time); waiting on its own producers 30.0% (Python stacks)")
    assert data_wait_text({"loop.batches_per_step": 1.0, "run.data_wait_share": 0.0}) == "data wait 0.0% of that time"
    assert data_wait_text({"loop.batches_per_step": None, "run.data_wait_share": 0.25}) == "data wait 25.0% of that time"


def test_a_runs_header_names_its_median_the_traced_steps_one(mlp_run):
    """A run's header gives the median of its traced (profiled) steps, its run line that of the
    steady ones: "median step" beside "median" read as two answers to one question (nanoGPT:
    89.4 ms over 5 profiled steps, 80.9 ms over 288 steady ones). A trace alone keeps "median step"."""
    import io

    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report import html
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render
    from perfdoctor.stats.steptime import ms

    doc = json.loads((mlp_run("a") / "report.json").read_text())
    m = doc["traces"][0]["metrics"]
    c = console(file=io.StringIO(), width=300)
    render(doc, c)
    out = c.file.getvalue()
    assert f"· median traced step {ms(m['steps.time_median_ms'])} ms" in out
    assert f"median {ms(m['run.step_time_median_ms'])} ms;" in out and "median step" not in out
    assert f"median traced step {ms(m['steps.time_median_ms'])} ms" in html.render(doc)
    alone = diagnose_path(str(mlp_run("a") / "trace"))
    c = console(file=io.StringIO(), width=300)
    render(alone, c)
    assert "median step" in c.file.getvalue() and "median traced step" not in c.file.getvalue()


def test_run_line_gives_the_run_wall_time_and_sub_millisecond_steps(tmp_path):
    """The user trial's line: the 4.2 s is the whole run's (not the steps': 200 x 0.31 ms), and a
    0.31 ms step prints with 3 significant figures, its interval and median too (not '0.3-0.3')."""
    import io

    from perfdoctor.diagnose.live import diagnose_dir
    from perfdoctor.report.markdown import report as md_report
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render

    durs = 0.000312 * np.exp(np.random.default_rng(1).normal(0, 0.05, 200))
    doc = diagnose_dir(_run_dir(tmp_path / "run", durs, 4.2))
    m = doc["traces"][0]["metrics"]
    assert m["run.step_time_ms"] == pytest.approx(1e3 * durs[2:].mean(), rel=1e-3)      # 0.311 ms
    c = console(file=io.StringIO())
    render(doc, c)
    out = c.file.getvalue()
    assert ("201 steps, 200 timed, in a 4.2 s run: 0.311 ms/step (95% CI 0.310-0.312) over 198 steady steps "
            "(left out: 2 warm-up); "
            "median 0.312 ms; data wait 0.0% of that time") in out
    assert "steps measured in" not in out and "median step 0.312 ms" in out
    assert "run: 201 steps, 200 timed: **0.311 ms/step** (95% CI 0.310-0.312) over 198 steady steps (left out: 2 warm-up)" in md_report(doc)


def test_run_line_says_what_a_step_is_when_no_optimizer_stepped(tmp_path):
    """A hand-written update (pytorch/examples word_language_model): steps are backward passes,
    and the run line says so where the user reads the step time (the note saying it was shown
    with --details only); optimizer steps, the usual source, are not named."""
    import io

    from perfdoctor.diagnose.live import diagnose_dir
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render

    durs = 0.02 * np.exp(np.random.default_rng(2).normal(0, 0.05, 60))
    lines = {}
    for source in ("backward passes (a step from one gradient reset to the next)", "optimizer steps"):
        d = _run_dir(tmp_path / source.split()[0], durs, 3.4)
        child = json.loads((d / "child.json").read_text())
        (d / "child.json").write_text(json.dumps({**child, "step_source": source}))
        c = console(file=io.StringIO())
        render(diagnose_dir(d), c)
        lines[source] = next(ln for ln in c.file.getvalue().splitlines() if " ms/step" in ln)
    assert lines["backward passes (a step from one gradient reset to the next)"].startswith(
        "61 steps of backward passes (a step from one gradient reset to the next), 60 timed, in a 3.4 s run: ")
    assert lines["optimizer steps"].startswith("61 steps, 60 timed, in a 3.4 s run: ")
    from perfdoctor.report import html
    assert "61 steps of backward passes (a step from one gradient reset to the next), 60 timed: " in \
        html.render(diagnose_dir(tmp_path / "backward"))


def test_steps_that_grow_through_the_run_are_told(tmp_path):
    """An RL loop whose episodes grow (actor_critic: 4 ms to 54 ms a step): a time per step depends
    on the run's length, and a note says so; a steady loop with noise gets none."""
    from perfdoctor.diagnose.live import diagnose_dir

    grow = diagnose_dir(_run_dir(tmp_path / "grow", np.linspace(0.004, 0.054, 60), 5.0))
    notes = [n for n in grow["run"]["notes"] if "drifts" in n]
    assert len(notes) == 1 and notes[0].startswith("the steady steps' length drifts: median ")
    assert "do more work as the run goes on" in notes[0]
    assert grow["run"]["notes"][0] == notes[0]      # the default screen shows the first: it leads
    from perfdoctor.report import markdown
    from perfdoctor.report.sanitize import markdown as M
    summary = markdown.report(grow)                # and the markdown summary too, under the run line
    assert f"_note: {M(notes[0])}_" in summary
    assert all(M(n) in summary for n in grow["run"]["notes"][1:])      # the others with the evidence
    flat = 0.02 * np.exp(np.random.default_rng(3).normal(0, 0.2, 60))
    assert not any("drifts" in n for n in diagnose_dir(_run_dir(tmp_path / "flat", flat, 3.0))["run"]["notes"])


def test_a_drift_the_run_queue_explains_is_told_as_the_machine_not_the_work(tmp_path):
    """The user trial's gradient accumulation (fixed work a step): 346 ms a step while another job
    held the cores, 7.6 ms after it left; the 'less work' note had blamed the script."""
    from perfdoctor.diagnose.live import diagnose_dir

    def notes(name, durs, runq):
        doc = diagnose_dir(_run_dir(tmp_path / name, durs, 9.0, runq))
        return [n for n in doc["run"]["notes"] if "drifts" in n]

    # the thread's own time stays 8 ms; the rest of each early step is run-queue wait
    durs = np.r_[np.full(20, 0.10), np.full(40, 0.008)]
    [note] = notes("queued", durs, np.maximum(0, durs - 0.008))
    assert "(0.08x)" in note and "not waiting for a CPU stays 8.00 -> 8.00 ms" in note
    assert "waited in the run queue 92% of the first third and 0% of the last" in note and "less work" not in note
    # parked intra-op threads: the own time drifts too, but the queueing changed by half the step
    [note] = notes("parked", durs, np.where(durs > 0.05, 0.05, 0.0))
    assert "for a CPU 50% of the first third against 0% of the last" in note and "less work" not in note
    # queued alike through the run (pytorch/examples vae on a loaded 2-core VM: 65% in both thirds)
    # while the own time fell: spinning threads burn CPU as the load changes, so the work is not
    # blamed for it
    [note] = notes("loaded", durs, 0.65 * durs)
    assert "65% of the first third and 65% of the last" in note and "The steps do less work" not in note
    assert "may do less work as the run goes on, or the other work on the machine changed" in note
    # a little queueing (5%, under PD214's 10%) leaves the own time a measure of the work
    [note] = notes("light", durs, 0.05 * durs)
    assert "The steps do less work as the run goes on (episodes that get shorter" in note
    # the same drift with no queueing at all is the work's
    [note] = notes("work", durs, np.zeros(60))
    assert "The steps do less work as the run goes on (episodes that get shorter" in note


def test_a_crash_of_many_lines_is_told_in_its_first_line(tmp_path):
    """torch.load's weights_only error: 1,200 characters over a dozen lines, with terminal bold
    codes. The header, markdown and HTML say its first line without the codes (they printed it
    whole, with literal \\x1b[1m and \\n\\t); report.json keeps it whole."""
    import io

    from perfdoctor.diagnose.live import diagnose_dir
    from perfdoctor.report import html, markdown
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render

    error = ("UnpicklingError: Weights only load failed. Two options, \x1b[1mdo those steps only if you trust "
             "the source\x1b[0m. \n\t(1) In PyTorch 2.6, we changed the default.\n\t(2) Alternatively ...")
    d = _run_dir(tmp_path / "run", 0.02 * np.ones(30), 3.0)
    child = json.loads((d / "child.json").read_text())
    (d / "child.json").write_text(json.dumps({**child, "outcome": "crashed", "exit_code": 1, "error": error}))
    run = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**run, "exit_code": 1}))
    doc = diagnose_dir(d)
    assert doc["run"]["error"] == error
    first = "UnpicklingError: Weights only load failed. Two options, do those steps only if you trust the source. ..."
    assert doc["run"]["error_line"] == first
    c = console(file=io.StringIO(), width=400)
    render(doc, c)
    header = c.file.getvalue().splitlines()[0]
    assert header.endswith("· the script crashed · exit code 1 · " + first)
    assert "x1b" not in header and "\\n" not in header
    assert f"The script crashed \\(exit code 1\\): {first}" in markdown.report(doc).replace("\\.", ".")
    assert f"<b>The script crashed (exit code 1): {first}</b>" in html.render(doc)


def test_details_give_the_fixes_worth_a_look_in_full(tmp_path):
    """--details promises every fix in full with its code: the fixes worth a look (no modelled
    gain) had one line of titles, their evidence and code only in `perfdoctor rules show`."""
    import io

    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render

    p = tmp_path / "input.pt.trace.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=4000, kernels=2, kernel_us=50)] * 20), p)
    doc = diagnose_path(str(p))
    rest = [f for f in doc["findings"] if not f["ranked"]]
    assert len(rest) >= 2
    c = console(file=io.StringIO(), width=400)
    render(doc, c, details=True)
    out = c.file.getvalue()
    assert "Also worth a look (no modelled gain, or none expected here):\n" in out
    for f in rest:
        assert f"  - {f['title']}" in out and f["summary"].split(". ")[0] in out and f"[{f['id']} · " in out
    ram = next(f for f in rest if f["id"] == "PD304")
    assert f"  - {ram['title']} (at most {ram['gain']['ceiling']:.2f}x)" in out
    assert ram["fix"]["snippet"].splitlines()[0] in out
    c = console(file=io.StringIO(), width=400)
    render(doc, c)                       # the one-screen report keeps its top three
    assert "Also worth a look" not in c.file.getvalue() and ram["summary"] not in c.file.getvalue()
    # the HTML page: each one's title a line, unfolded on a click into the same
    from html import escape

    from perfdoctor.report import html
    page = html.render(doc)
    assert page.count("<li><details><summary>") == len(rest)
    item = page[page.index(f"<li><details><summary>{escape(ram['title'])}"):]
    item = item[:item.index("</details></li>")]
    assert escape(ram["summary"]) in item and "<pre><code>" in item and "PD304 · article 003" in item


def test_unranked_fixes_say_what_their_model_expects():
    """A fix ranked out because its model expects ~1.00x is not called one without a model: the
    details and the HTML give its expected gain and ceiling (nanoGPT on the CPU: PD338, the
    optimizer 0.9% of the step)."""
    import io

    from perfdoctor.report import fixcards
    from perfdoctor.report.labels import unranked_gain
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal_fixes import fixes as _fixes

    small = {"id": "PD338", "title": "Use the fused optimizer", "ranked": False,
             "gain": {"expected": 1.004, "ceiling": 1.0095}}
    capped = {"id": "PD348", "title": "Run on cores of your own", "ranked": False,
              "gain": {"expected": None, "ceiling": 1.3}}
    bare = {"id": "PD319", "title": "Label the step", "ranked": False, "gain": {}}
    assert unranked_gain(small) == ", expected ~1.00x"
    assert unranked_gain(capped) == ", at most 1.30x"
    assert unranked_gain(bare) == ""
    c = console(file=io.StringIO(), width=400)
    doc = {"findings": [small, capped, bare], "traces": [{}], "verdict": {}}
    _fixes(c, doc, "this trace")
    out = c.file.getvalue()
    assert "No fix with a measurable speed-up applies to this trace." in out
    assert ("Also worth a look (no modelled gain, or none expected here): Use the fused optimizer (PD338, "
            "expected ~1.00x); Run on cores of your own (PD348, at most 1.30x); Label the step (PD319)") in out
    assert "no model of their expected gain" not in out
    page = fixcards.fixes_section(doc, None)
    assert "Also worth a look (no modelled gain, or none expected here)" in page
    assert "(PD338, expected ~1.00x)" in page and "(PD348, at most 1.30x)" in page and "(PD319)<" in page


def test_fixes_off_a_bottleneck_that_holds_most_of_the_step_say_what_they_can_gain():
    """A user's tabular loop waited 78% of its steps for samples built from Python values: the
    ranked fixes (sparse embeddings ~1.20x, fused optimizer ~1.12x) are off the input, and the
    input's own (preprocessing: 3.5x by hand) had no model. Every output names the input's own,
    with no bound on the others (Amdahl on the other 22%, 1.29x, was beaten by sparse embeddings
    at 1.32-1.46x on the CPU); not where a ranked fix is on the bottleneck, nor where the
    bottleneck holds under half the step."""
    import io

    from perfdoctor.report import fixcards, markdown
    from perfdoctor.report.labels import off_bottleneck_note
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal_fixes import top_fixes

    sparse = {"id": "PD383", "title": "Sparse embedding gradients", "ranked": True, "on_bottleneck": False,
              "gain": {"expected": 1.20, "text": "expected ~1.20x"}, "summary": "s", "fix": {"text": "t"},
              "source": {"article": "x"}}
    pre = {"id": "PD306", "title": "Preprocess once", "ranked": False, "on_bottleneck": True, "gain": {}}
    doc = {"findings": [sparse, pre], "verdict": {"bound": "input_cpu"},
           "traces": [{"metrics": {"share.input": 0.776}}]}
    note = off_bottleneck_note(doc)
    assert note.startswith("the data wait holds 77.6% of the step, and the fixes ranked here are off it") \
        and "(PD306)" in note and "at most" not in note
    c = console(file=io.StringIO(), width=400)
    top_fixes(c, doc, "this trace")
    out = c.file.getvalue()
    assert out.index("the data wait holds 77.6%") < out.index(" 1. ~1.20x") < out.index(" 2. ?")
    assert "the data wait holds 77.6%" in fixcards.fixes_section(doc, None)
    assert "the data wait holds 77.6%" in "\n".join(markdown._fixes(doc, None))
    assert off_bottleneck_note({**doc, "findings": [dict(sparse, on_bottleneck=True), pre]}) is None
    assert off_bottleneck_note({**doc, "traces": [{"metrics": {"share.input": 0.4}}]}) is None
    assert off_bottleneck_note({**doc, "findings": [sparse]}) is None
    # a CPU run's compute-bound step: its ops' time, not a device's (a user read "the device's time" there)
    cpu = {**doc, "verdict": {"bound": "device"},
           "traces": [{"metrics": {"share.device": 0.85, "trace.platform": "cpu"}}]}
    assert off_bottleneck_note(cpu).startswith("the CPU ops' time holds 85.0% of the step")
    gpu = {**cpu, "traces": [{"metrics": {"share.device": 0.85, "trace.platform": "cuda"}}]}
    assert off_bottleneck_note(gpu).startswith("the device's time holds 85.0%")


# --- perfdoctor run ----------------------------------------------------------------------------


def test_annotated_copy_of_a_trace_with_odd_strings(trace, tmp_path):
    """A kernel name with a lone surrogate escape and a bidi override: the copy is written (the
    names read as the report read them) and holds no raw bidi character."""
    doc = json.loads(trace.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = "k\u202eevil"
    odd = tmp_path / "odd.pt.trace.json"
    odd.write_text(json.dumps(doc).replace("k\\u202eevil", "k\\udc80\\u202eevil"))
    out = tmp_path / "a.json"
    r = cli("report", odd, "--annotate", out)
    assert r.returncode == 0, r.stderr
    body = out.read_bytes()
    assert "\u202e".encode() not in body and body.count(b"\\u202e") >= 1
    names = [e["name"] for e in json.loads(body)["traceEvents"] if e.get("cat") == "kernel"]
    assert names and set(names) == {"k\ufffd\u202eevil"}

@pytest.mark.parametrize("layout", ["object", "bare list", "pid taken", "events late"])
def test_annotated_copy_spliced_into_any_layout(trace, tmp_path, layout):
    """The events go in after traceEvents' `[` without decoding the trace: a bare event list, a
    trace already using perfdoctor's pid (the next lower one is taken), and traceEvents after more
    than PREFIX_SCAN bytes of metadata (decoded and written back whole)."""
    from perfdoctor.report.annotate import PID, PREFIX_SCAN
    doc = json.loads(trace.read_text())
    if layout == "pid taken":
        doc["traceEvents"].append({"ph": "M", "name": "process_name", "pid": PID, "args": {"name": "x"}})
    if layout == "events late":
        doc = {"padding": "x" * PREFIX_SCAN, **doc}
    body = json.dumps(doc["traceEvents"] if layout == "bare list" else doc)
    src = tmp_path / "t.pt.trace.json"
    src.write_text(body)
    out = tmp_path / "a.json"
    r = cli("report", src, "--annotate", out)
    assert r.returncode == 0, r.stderr
    orig = json.loads(body)
    orig = orig if isinstance(orig, list) else orig["traceEvents"]
    got = json.loads(out.read_bytes())
    ann = got if isinstance(got, list) else got["traceEvents"]
    pid = PID - 1 if layout == "pid taken" else PID
    added = [e for e in ann if e.get("pid") == pid]
    assert len(added) > 10 and ann[:len(added)] == added and ann[len(added):] == orig


def test_run_writes_html_and_annotated_trace_and_markdown(tmp_path):
    pytest.importorskip("torch", reason="perfdoctor run trains with torch")
    ex = Path(__file__).resolve().parent.parent / "examples" / "compute_bound.py"
    out, md = tmp_path / "run", tmp_path / "summary.md"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), "--format", "markdown", "-o",
                        str(md), "--max-steps", "10", "--skip-steps", "2", "--trace-steps", "3", str(ex),
                        "--steps", "100000", "--width", "256", "--batch-size", "32"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    assert "The run" in page and "ms/step" in page and 'aria-label="one step as a timeline"' in page
    notes = doc["run"]["notes"] + [n for t in doc["traces"] for n in t["notes"]]
    assert notes and all(page.count(H(n)) == 1 for n in notes)      # a note shown once, not per section
    ann = json.loads(gzip.decompress((out / "annotated.pt.trace.json.gz").read_bytes()))["traceEvents"]
    assert sum(e.get("cat") == "perfdoctor" and e["tid"] == 2 for e in ann) == len(doc["traces"][0]["steps"]) == 3
    text = md.read_text()
    assert text.startswith("### perfdoctor: ") and "ms/step" in text
    assert "Step breakdown" in r.stderr                        # the terminal report still on stderr
    # --force clears the new files with the rest of the run
    from perfdoctor.collect.rundir import RUN_FILES
    assert {"report.html", "annotated.pt.trace.json.gz"} <= set(RUN_FILES)


def test_evidence_numbers_have_no_exponent_in_the_usual_range():
    """Evidence printed 1.126e+04 for a count of ops (user trial): 4 significant figures, whole
    numbers with separators from 10,000 up."""
    from perfdoctor.report.values import number

    assert [number(x) for x in (11260.4, 0.1234567, 5.96, 1234.5, 0.0, -11260.0, 99999.9)] == \
        ["11,260", "0.1235", "5.96", "1234", "0", "-11,260", "100,000"]
    assert number(3.2e12) == "3.2e+12" and number(1e-5) == "1e-05"


def test_run_with_a_format_but_no_output_file_says_where_that_report_is(monkeypatch, capsys):
    """`run --format json` without -o: stdout is the script's, so the JSON is not printed; the
    terminal report then says which file holds it (it had been silently ignored: user trial)."""
    import perfdoctor.report.terminal as term
    from perfdoctor.report.outputs import emit

    monkeypatch.setattr(term, "render", lambda doc, con, details=False, tune=None: None)
    emit({"run": {"dir": "runs/r1"}}, "json", None, stderr=True)
    emit({"run": {"dir": "runs/r1"}}, "html", None, stderr=True)
    emit({"run": {"dir": "runs/r1"}}, "terminal", None, stderr=True)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"the json report: {Path('runs/r1/report.json')} (-o FILE writes a copy)",
                   f"the html report: {Path('runs/r1/report.html')} (-o FILE writes a copy)"]


def test_the_run_over_time_names_the_shaded_steps_only_where_there_are_some():
    """A run that completed no step (a script that failed on its arguments) drew its samples with
    no shaded band, under a caption that said "the steps lie in the shaded part"."""
    from perfdoctor.report.html import _over_time
    series = {"t_s": [0.0, 0.5, 1.0, 1.5], "cpu_cores": [0.2, 1.0, 1.1, 0.3], "steps": None, "traced": None}
    none = _over_time({"series": series})
    assert "<svg" in none and "shaded" not in none
    some = _over_time({"series": {**series, "steps": [0.4, 1.2]}})
    assert "the steps lie in the shaded part" in some and 'fill="#dcefdc"' in some


def test_host_op_shares_past_the_step_are_explained(shared_traces, tmp_path):
    """HTA's cpu_only rank: gloo's ops on two threads at once, one op "of step 163.6%": the page
    says why the shares add past the step; a one-thread trace's page does not."""
    out = tmp_path / "c.html"
    assert cli("report", shared_traces / "hta/cpu_only", "-f", "html", "-o", out).returncode == 0
    page = out.read_text()
    shares = [float(x) for x in re.findall(r'<td class="num">([\d.]+)%</td></tr>', page.split("Top host ops")[1])]
    assert sum(shares) > 100 and "the shares add up past the step" in page
    assert cli("report", shared_traces / "h100/launch", "-f", "html", "-o", out).returncode == 0
    assert "Top host ops" in out.read_text() and "the shares add up past the step" not in out.read_text()


@pytest.mark.parametrize("peak, top", [(767.5 * 2 ** 20, 800 * 2 ** 20), (383.8 * 2 ** 20, 400 * 2 ** 20),
                                       (6.4 * 2 ** 30, 8 * 2 ** 30), (3.2 * 2 ** 30, 4 * 2 ** 30),
                                       (2 ** 30, 2 ** 30), (80 * 2 ** 30, 80 * 2 ** 30), (12 * 2 ** 20, 12 * 2 ** 20)])
def test_memory_axes_top_out_at_round_values(peak, top):
    """The H100 pages' memory axes read 767.5 / 383.8 MiB and 6.4 / 3.2 GiB (the data's peak):
    the top is the peak rounded up to a round number of its unit, and the chart's labels say it."""
    from perfdoctor.report.svg import memory_lines, nice_byte_top
    assert nice_byte_top(peak) == pytest.approx(top) and nice_byte_top(peak) >= peak
    svg = memory_lines({"t_ms": [0.0, 1.0, 2.0], "reserved_bytes": [peak / 2, peak, peak / 3],
                        "allocated_bytes": [peak / 4, peak / 2, peak / 5]})
    unit, scale = ("GiB", 2 ** 30) if top >= 2 ** 30 else ("MiB", 2 ** 20)
    assert f">{top / scale:g} {unit}</text>" in svg and f">{top / scale / 2:g} {unit}</text>" in svg


def test_details_show_every_ranked_fix_with_its_summary_code_and_citation(shared_traces):
    """`--details` is the full report: the H100 sync run's fourth ranked fix (PD303, removing the
    .item() syncs, half of the fix measured there) had shown its gain line only."""
    doc = json.loads(cli("report", shared_traces / "h100" / "sync", "--format", "json").stdout)
    ranked = [f for f in doc["findings"] if f["ranked"]]
    assert len(ranked) >= 4
    r = cli("report", shared_traces / "h100" / "sync", "--details", env={"COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    for f in ranked:
        assert f"[{f['id']} · article" in r.stdout, f["id"]
        assert f["summary"][:60] in r.stdout, f["id"]
        if f["fix"]["snippet"]:
            assert f["fix"]["snippet"].splitlines()[0].strip() in r.stdout, f["id"]


def test_a_near_tie_broken_by_the_verdict_is_said_on_the_screen(shared_traces):
    """The top fixes are ranked by expected gain, near-ties (within 2%) by the verdict's bottleneck:
    a user read '2. ~1.13x' above '3. ~1.14x' as a mistake. A line says so where it happens, and
    only there."""
    paths = [shared_traces / "tb_plugin" / "resnet50_num_workers_0", *sorted((shared_traces / "h100").iterdir())]
    said = []
    for p in (p for p in paths if p.is_dir()):
        doc = json.loads(cli("report", p, "--format", "json").stdout)
        gains = [f["gain"]["expected"] for f in doc["findings"] if f["ranked"]][:3]
        inverted = any(b > a for a, b in zip(gains, gains[1:]))
        out = cli("report", p, env={"COLUMNS": "200"}).stdout
        assert ("gains within 2% of each other" in out) is inverted, (p, gains)
        said.append(inverted)
    assert False in said
    # a near-tie as the engine breaks it (the TensorBoard sample's loader workers at 1.129x ranked
    # above its fused optimizer at 1.137x, before workers were credited with overlap there)
    from rich.console import Console

    from perfdoctor.report.terminal import render

    doc = json.loads(cli("report", paths[0], "--format", "json").stdout)
    ranked = [f for f in doc["findings"] if f["ranked"]]
    ranked[1]["gain"]["expected"] = 0.99 * ranked[2]["gain"]["expected"]
    console = Console(record=True, width=200)
    render(doc, console)
    assert "gains within 2% of each other" in console.export_text()


def test_a_fix_whose_share_overlaps_one_above_it_says_their_gains_do_not_add():
    """PD341 (fit threads to the cores) and PD348 (cores of your own) both expect the step's
    queueing for a CPU to go: a user read them, ranked 1.78x each, as two gains."""
    import io

    from rich.console import Console

    from perfdoctor.report.labels import overlapping
    from perfdoctor.report.terminal_fixes import fixes, top_fixes

    def fix(i, slug, exp, overlaps=()):
        return {"id": i, "slug": slug, "kind": "fix", "title": f"title of {i}", "ranked": True, "summary": "s",
                "fix": {"text": "t", "snippet": None}, "evidence": {}, "source": {"article": "a", "section": "s"},
                "gain": {"expected": exp, "ceiling": exp, "overlaps": list(overlaps)}}
    a = fix("PD348", "threads-for-free-cores", 1.78, ["fit-threads-to-cores"])
    b = fix("PD341", "fit-threads-to-cores", 1.77, ["threads-for-free-cores"])
    c = fix("PD338", "fused-optimizer", 1.05)
    assert overlapping(b, [a]) == "PD348" and overlapping(a, []) is None and overlapping(c, [a, b]) is None
    assert overlapping(fix("X", "x", 1.1), [fix("Y", "y", 1.2, ["x"])]) == "Y"     # named the other way round
    doc = {"findings": [a, b, c], "traces": [{"label": "t", "findings": ["PD348", "PD341", "PD338"]}]}
    out = io.StringIO()
    shown = top_fixes(Console(file=out, width=200), doc, None)
    lines = out.getvalue().splitlines()
    assert shown == ["PD348", "PD341", "PD338"]
    assert next(x for x in lines if "PD341" in x).endswith("(its share overlaps PD348's: the gains do not add)")
    assert not next(x for x in lines if "PD348" in x).endswith(")")
    out = io.StringIO()
    fixes(Console(file=out, width=200), doc, None)
    assert " 2. title of PD341 (its share overlaps PD348's: the gains do not add)" in out.getvalue().splitlines()
    from perfdoctor.report.markdown import _fixes
    for f in (a, b):
        f["gain"]["text"] = "~1.78x"
    md = _fixes({**doc, "run": {}}, None)
    assert "2. **title of PD341**: \\~1.78x; its share overlaps PD348's: the gains do not add (PD341)" in md
    from perfdoctor.report.fixcards import fixes_section
    html = fixes_section(doc, None)
    assert html.count("the gains do not add") == 1 and "overlaps PD348&#x27;s" in html
    # a rule id from a user's rule directory reaches the terminal sanitised
    hostile = fix("PD9\x1b[31m", "hostile", 1.9, ["fit-threads-to-cores"])
    out = io.StringIO()
    top_fixes(Console(file=out, width=200), {**doc, "findings": [hostile, b]}, None)
    assert "\x1b[31m" not in out.getvalue() and "its share overlaps PD9" in out.getvalue()
