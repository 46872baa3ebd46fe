"""tune holds each measured trial to the report's model of the fix it tests (tune/modelcheck.py):
a measurement above a fix's ceiling says the bound is wrong there; one wholly above or below the
model says it under- or over-predicts; a gain the report did not raise is a bottleneck it missed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

import tracegen as tg
from perfdoctor.rules.gain import combined, stacked
from perfdoctor.tune.modelcheck import check


@pytest.fixture(scope="module")
def fixes(tmp_path_factory) -> dict:
    """The fixes of a real report: an input-bound CUDA trace (6 ms data wait against ~2 ms of
    work, pageable copies, a sync per step), diagnosed by `perfdoctor report`."""
    d = tmp_path_factory.mktemp("mc")
    trace, out = d / "w.pt.trace.json", d / "r.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=6000, pageable_h2d=1, syncs=1, kernels=16, kernel_us=80)] * 5,
                          memory_events=True, gap_us=400), trace)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(trace), "--format", "json", "-o", str(out)],
                       capture_output=True, text=True, timeout=180, env=os.environ)
    assert r.returncode == 0, r.stderr
    return {f["id"]: f for f in json.loads(out.read_text())["findings"]}


def _modelled(fixes: dict) -> tuple[str, dict]:
    """A fix of the report with an expected gain below a finite ceiling."""
    for fid, f in fixes.items():
        g = f.get("gain") or {}
        if g.get("expected") and g.get("ceiling") and g["ceiling"] > g["expected"] * 1.05:
            return fid, g
    pytest.fail("the input-bound report has a fix with an expected gain and a ceiling above it")


def test_a_trial_is_held_to_its_fixs_expected_gain_and_ceiling(fixes):
    fid, g = _modelled(fixes)
    e, c = g["expected"], g["ceiling"]
    lo_e, hi_e = g["range"] if g.get("range") else (e, e)
    # an interval that holds the expected gain agrees
    got = check(fid, True, "faster", e, (e * 0.97, e * 1.03), fixes)
    assert got["verdict"] == "agrees" and got["rule"] == fid and got["expected"] == pytest.approx(e, rel=1e-3)
    assert got["text"].endswith("agrees") and f"measured {e:.2f}x" in got["text"]
    # wholly above the model (below its ceiling): the model under-predicts
    mid = (max(hi_e, e) + c) / 2
    if mid * 0.99 > max(hi_e, e):
        got = check(fid, True, "faster", mid, (mid * 0.99, mid * 1.0), fixes)
        assert got["verdict"] == "above" and "under-predicts" in got["text"]
    # wholly above the ceiling: the bound is wrong here
    got = check(fid, True, "faster", c * 1.5, (c * 1.2, c * 1.8), fixes)
    assert got["verdict"] == "beats-ceiling" and f"at most {c:.2f}x" in got["text"]
    assert "bound is wrong here" in got["text"] and got["ceiling"] == pytest.approx(c, rel=1e-3)
    # an interval touching the ceiling does not beat it (it lies above the model, or inside a range
    # that reaches the ceiling: PD301's, from no overlap to the wait removed)
    touching = check(fid, True, "faster", c * 1.5, (c * 0.999, c * 1.8), fixes)["verdict"]
    assert touching == ("agrees" if hi_e >= c * 0.999 else "above"), touching
    # a model with room under its bound: wholly above it is "above", not a broken bound
    room = {"PD338": {"gain": {"expected": 1.5, "range": [1.4, 1.6], "ceiling": 3.0}}}
    assert check("PD338", True, "faster", 2.0, (1.9, 2.1), room)["verdict"] == "above"
    assert check("PD338", True, "faster", 3.3, (3.01, 3.6), room)["verdict"] == "beats-ceiling"
    # measured slower than the model's low end: it over-predicts
    got = check(fid, True, "slower", 0.9, (0.85, 0.95), fixes)
    assert got["verdict"] == "below" and "over-predicts" in got["text"] and lo_e > 0.95


def test_undecided_or_unmodelled_trials(fixes):
    fid, g = _modelled(fixes)
    # an inconclusive interval agrees with every model: nothing is checked
    assert check(fid, True, "inconclusive", 1.2, (0.1, 40.0), fixes) is None
    assert check(fid, True, "failed", None, None, fixes) is None
    assert check(None, False, "faster", 1.5, (1.4, 1.6), fixes) is None      # no rule tests the change
    # a fix the report did not raise that measured faster: a gain it did not see; not faster: agreement
    got = check("PD341", False, "faster", 1.08, (1.04, 1.11), fixes)
    assert got["verdict"] == "missed" and "not raised by the report" in got["text"]
    assert check("PD341", False, "no change", 1.0, (0.97, 1.03), fixes) is None
    # offered without a model: unmodelled, still held to a ceiling
    f = {"PDX": {"gain": {"expected": None, "ceiling": 1.2}}}
    assert check("PDX", True, "faster", 1.1, (1.05, 1.15), f)["verdict"] == "unmodelled"
    assert check("PDX", True, "faster", 1.5, (1.4, 1.6), f)["verdict"] == "beats-ceiling"
    assert check("PDX", True, "faster", 1.5, (1.4, 1.6), {"PDX": {"gain": {}}})["text"].startswith("no model of its gain")


def test_a_combined_trial_is_held_to_its_fixes_combined():
    """Savings add (gain.stacked) for the expected gain and the range; ceilings combine as the
    union of the shares, at most their sum (gain.combined)."""
    f = {"PD345": {"slug": "a", "gain": {"expected": 1.10, "range": [1.05, 1.2], "ceiling": 1.3}},
         "PD346": {"slug": "b", "gain": {"expected": 1.50, "range": [1.3, 1.6], "ceiling": 2.0}}}
    e = stacked({r: f[r]["gain"] for r in f}, lambda g: g["expected"])
    c = combined([1.3, 2.0])
    got = check("PD345+PD346", True, "faster", e, (e * 0.95, e * 1.05), f)
    assert got["verdict"] == "agrees" and got["expected"] == pytest.approx(e, rel=1e-3)
    assert got["ceiling"] == pytest.approx(c, rel=1e-3)
    assert got["range"] == [pytest.approx(combined([1.05, 1.3]), rel=1e-3), pytest.approx(combined([1.2, 1.6]), rel=1e-3)]
    assert check("PD345+PD346", True, "faster", c * 2, (c * 1.5, c * 2.5), f)["verdict"] == "beats-ceiling"
    # a range without an upper end (null) is unbounded above: nothing is "above" it
    f["PD346"]["gain"]["range"] = [1.3, None]
    f["PD346"]["gain"]["ceiling"] = None
    assert check("PD345+PD346", True, "faster", 9.0, (8.0, 10.0), f)["verdict"] == "agrees"


def test_the_check_is_shown_under_the_table_in_markdown_and_on_the_fix_card(fixes):
    from rich.console import Console

    from perfdoctor.report import fixcards, markdown
    from perfdoctor.tune.result import render
    fid, g = _modelled(fixes)
    c = g["ceiling"]

    def trial(label, rule, ratio, ci, status, offered=True):
        return {"label": label, "changes": {label: 1}, "rule": rule, "predicted": g["expected"], "step_time_s": 0.01,
                "baseline_step_time_s": [0.01 * ratio], "speedup": ratio, "ci95": list(ci), "status": status,
                "reason": None, "confirm": None, "offered": offered,
                "model_check": check(rule, offered, status, ratio, ci, fixes)}
    trials = [trial("a=1", fid, g["expected"], (g["expected"] * 0.98, g["expected"] * 1.02), "faster"),
              trial("b=2", fid, c * 1.5, (c * 1.3, c * 1.7), "faster"),
              trial("threads=2", "PD341", 1.08, (1.04, 1.11), "faster", offered=False),
              trial("c=3", fid, 1.3, (0.2, 9.0), "inconclusive")]
    doc = {"command": "train.py", "noise": "", "trials": trials, "best": None, "skipped_for_budget": [],
           "untested": [], "budget_s": 75, "dir": "runs", "elapsed_s": 70,
           "baseline": {"step_time_s": 0.01, "ci95": [0.0099, 0.0101], "steps": 50, "verdict": "input_cpu", "repeats": []}}
    buf = io.StringIO()
    render(doc, Console(file=buf, width=400))
    md = markdown.tune(doc).replace("\\", "")
    for out in (buf.getvalue(), md):
        assert f"the report's gains against these runs: 1 of 3 agree ({fid})" in out
        assert f"b=2 ({fid}): " in out and "beats its ceiling" in out
        assert "threads=2 (PD341): not raised by the report" in out
        assert "c=3 (" not in out                       # inconclusive: not checked
    # the fix card's measured line carries the check of the best trial of its rule
    card_doc = {"findings": [dict(fixes[fid], ranked=True)], "verdict": {}, "traces": [{}]}
    body = fixcards.fixes_section(card_doc, {"trials": trials})
    assert "model check: " in body and "beats its ceiling" in body     # b=2 measured the most for this rule


def test_a_baseline_without_python_stacks_says_what_the_untested_list_lacks():
    """Where py-spy found no idle core at the baseline's first step, the fixes only the stacks
    find (PD369, PD371, ...) are neither in the report nor in "not measured by tune": tune says so."""
    from rich.console import Console

    from perfdoctor.collect.stacks import skipped_note
    from perfdoctor.report import markdown
    from perfdoctor.tune.result import _stacks_note, render
    note = skipped_note(0.1, 2)
    assert _stacks_note({"run": {"notes": ["the trace stopped inside a step", note]}}) == note
    assert _stacks_note({"run": {"notes": ["no NVIDIA GPU found"]}}) is None and _stacks_note({}) is None
    base = {"step_time_s": 0.01, "ci95": [0.0099, 0.0101], "steps": 50, "verdict": "host", "repeats": [],
            "stacks_note": note}
    doc = {"command": "train.py", "noise": "", "trials": [], "best": None, "skipped_for_budget": [], "untested": [],
           "budget_s": 75, "dir": "runs", "elapsed_s": 70, "baseline": base}
    buf = io.StringIO()
    render(doc, Console(file=buf, width=400))
    for out in (buf.getvalue(), markdown.tune(doc).replace("\\", "")):
        assert "Python stacks not recorded: no idle CPU for py-spy" in out and "fixes only the stacks find" in out
    buf = io.StringIO()
    render({**doc, "baseline": {**base, "stacks_note": None}}, Console(file=buf, width=400))
    assert "Python stacks" not in buf.getvalue()


def test_a_foreach_trial_on_the_cpu_is_not_held_to_the_fused_model():
    """A GAN on the CPU (two Adams): PD338 expected the fused step's ~1.06x (1.03-1.08x), at most
    1.12x; tune's optimizer=foreach trial, which PD338 does not advise on the CPU ("use fused
    only"), was shown that 1.06x as its prediction and, at 1.00x [0.95, 1.06], counted as
    "agrees". It still tests PD338 (for --only), with no model: only the ceiling holds it."""
    from perfdoctor.tune import plan, predict
    fixes = {"PD338": {"ranked": True, "slug": "fused-optimizer",
                       "gain": {"expected": 1.06, "range": [1.03, 1.08], "ceiling": 1.12}}}
    foreach, fused = plan.Trial({"optimizer": "foreach"}, "optimizer"), plan.Trial({"optimizer": "fused"}, "optimizer")
    assert predict.prediction(foreach, fixes, None, cuda=False) == ("PD338", None)
    assert predict.prediction(fused, fixes, None, cuda=False) == ("PD338", 1.06)
    assert predict.prediction(foreach, fixes, None, cuda=True) == ("PD338", 1.06)     # on a GPU PD338 covers it
    unmodelled = check("PD338", True, "no change", 1.00, (0.95, 1.06), fixes, modelled=False)
    assert unmodelled["verdict"] == "unmodelled" and unmodelled["expected"] is None
    assert unmodelled["text"] == "no model of its gain, at most 1.12x, measured 1.00x [0.95-1.06]"
    # its ceiling still holds it: a foreach step above the whole optimizer share is a wrong bound
    assert check("PD338", True, "faster", 1.3, (1.2, 1.4), fixes, modelled=False)["verdict"] == "beats-ceiling"
    assert check("PD338", True, "no change", 1.00, (0.95, 1.06), fixes)["verdict"] == "agrees"     # the fused model


def test_a_trial_without_a_model_is_listed_not_counted():
    """foreach on a CPU tests PD338 without its model (PD338 models fused there): "0 of 1 agree"
    stood over "no model of its gain, at most 1.57x, measured 1.38x" (a user trial)."""
    from perfdoctor.report.tune_labels import tune_model_check
    fixes = {"PD338": {"id": "PD338", "gain": {"expected": 1.27, "range": [1.1, 1.4], "ceiling": 1.57}}}
    foreach = {"label": "optimizer=foreach",
               "model_check": check("PD338", True, "faster", 1.38, (1.2, 1.5), fixes, modelled=False)}
    assert foreach["model_check"]["verdict"] == "unmodelled"
    lines = tune_model_check([foreach])
    assert lines == ["optimizer=foreach (PD338): no model of its gain, at most 1.57x, measured 1.38x [1.20-1.50]"], lines
    fused = {"label": "optimizer=fused", "model_check": check("PD338", True, "faster", 1.3, (1.2, 1.4), fixes)}
    lines = tune_model_check([foreach, fused])
    assert lines[0] == "the report's gains against these runs: 1 of 1 agree (PD338)" and len(lines) == 2
