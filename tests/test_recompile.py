"""torch.compile recompiling inside the steps (analyze/compiletime.py): the host time in the
"(dynamo_timed)" compile ranges, counted once however deep they nest; PD362 (stop recompiling)
first, and no compile or graph-replay fix (PD311, PD361) built on a host share that is mostly
compilation."""

from __future__ import annotations

import pytest
import tracegen as tg

from perfdoctor.diagnose.offline import diagnose_path

S = tg.StepSpec
# compiled, launch-bound: 60 short kernels under ~3 ms of host ops (PD361's case in test_graph_replay)
COMPILED = dict(kernels=60, cpu_ops_us=3000, kernel_us=3, compiled=True)


def _diagnose(tmp_path, steps, name="t.json"):
    path = tmp_path / name
    truth = tg.write(tg.TraceSpec(steps=steps, compute_major=9), path)
    doc = diagnose_path(str(path))
    return doc, doc["traces"][0]["metrics"], truth


def _fixes(doc) -> list[str]:
    return [f["id"] for f in doc["findings"]]


def test_compile_share_counts_nested_ranges_once(analyze_spec):
    """Three nested compile ranges of 40, 39.998 and 39.996 ms in two of three steps: the
    outermost's time, not their sum (~3x)."""
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(compile_us=40_000, **COMPILED)] * 2 + [S(**COMPILED)],
                                         compute_major=9))
    m = a.metrics
    assert truth.compile_us == [40_000, 40_000, 0]
    total = float(a.steps.duration.sum())
    assert m["compile.share"] == pytest.approx(80_000 / total, rel=1e-9)
    assert m["compile.steps"] == 2
    assert m["compile.region_ids"] == 0          # no graph launches: no "Torch-Compiled Region" op


def test_recompiling_every_step_gets_stop_recompiling_first(tmp_path):
    """40 ms of compiling in every step of ~3 ms of work: PD362 ranks first, its ceiling the
    share the device idles while compiling; PD361 (graph replay: a capture per new shape) and
    PD311 are not offered."""
    doc, m, truth = _diagnose(tmp_path, [S(compile_us=40_000, **COMPILED)] * 4)
    fixes = _fixes(doc)
    assert fixes[0] == "PD362", fixes
    assert not {"PD361", "PD311", "PD344"} & set(fixes), fixes
    assert m["compile.steps"] == 4 and m["compile.share"] > 0.9
    f = doc["findings"][0]
    assert f["ranked"] and f["gain"]["ceiling"] == pytest.approx(1 / (1 - min(m["compile.share"], m["share.host"])),
                                                                 rel=1e-4)


def test_compiled_run_without_recompiles_unchanged(tmp_path):
    """The same compiled launch-bound steps without compile ranges: PD361 as before, no PD362;
    one compile in one step of four (the first compile inside the window) is no recompile loop."""
    doc, m, _ = _diagnose(tmp_path, [S(**COMPILED)] * 4)
    assert m["compile.share"] == 0.0 and m["compile.steps"] == 0
    assert "PD361" in _fixes(doc) and "PD362" not in _fixes(doc)
    once, m1, _ = _diagnose(tmp_path, [S(compile_us=40_000, **COMPILED)] + [S(**COMPILED)] * 3, name="once.json")
    assert m1["compile.steps"] == 1 and "PD362" not in _fixes(once)


def test_h100_launch_compiled_has_no_compile_time(shared_traces):
    """The corpus's compiled run (reduce-overhead, profiled after warm-up): one compiled version,
    no compile ranges in the steps, no PD362."""
    root = shared_traces / "h100" / "launch_compiled"
    if not root.is_dir():
        pytest.skip("../shared/traces/h100/launch_compiled is absent")
    doc = diagnose_path(str(root))
    m = doc["traces"][0]["metrics"]
    assert m["compile.share"] == 0.0 and m["compile.steps"] == 0 and m["compile.region_ids"] == 1
    assert "PD362" not in _fixes(doc)


def test_a_recompile_every_n_steps_is_taken_at_the_runs_rate(analyze_spec):
    """A shape that grows every 10 steps under static shapes recompiles in one traced step of five:
    no recompile loop by the window (one compile step is a first compile as often), but the live
    run's long steps recur every 10 steps and the traced long step is the compile: the run's
    share of it is the long steps' share times the part of the long step that compiles, and
    PD362 is offered on it. A trace alone, or a run whose long steps show no period, keeps the
    window's reading (no PD362)."""
    from perfdoctor.analyze.compiletime import compile_run_share
    from perfdoctor.rules.engine import evaluate
    from perfdoctor.rules.loader import load_rules
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(**COMPILED)] * 3 + [S(compile_us=40_000, **COMPILED), S(**COMPILED)],
                                         compute_major=9))
    m = dict(a.metrics)
    assert truth.compile_us == [0, 0, 0, 40_000, 0] and m["compile.steps"] == 1
    # all of the window's compile is in its long step, and nearly all of that step's excess is it
    assert m["compile.long_steps_share"] == pytest.approx(m["compile.share"], rel=1e-9)
    d = a.steps.duration
    assert m["compile.long_steps_fraction"] == pytest.approx(40_000 / (d[3] - sorted(d)[2]), rel=1e-3)
    assert 0.9 < m["compile.long_steps_fraction"] <= 1.0
    assert compile_run_share(m) == {"compile.run_share": None}          # a trace alone: no run to rate it by
    rules = load_rules()
    assert "PD362" not in {f.rule.id for f in evaluate(rules, {**m, "compile.run_share": None}).fixes}
    run = {"loop.long_steps_share": 0.5, "loop.long_steps_every": 10, "loop.long_steps_traced": 1}
    m.update(run)
    m.update(compile_run_share(m))
    assert m["compile.run_share"] == pytest.approx(m["compile.long_steps_fraction"] * 0.5, rel=1e-9)
    found = {f.rule.id: f for f in evaluate(rules, m).fixes}
    assert found["PD362"].ceiling == pytest.approx(1 / (1 - m["compile.run_share"]), rel=1e-6)
    # the same long steps without a period (too few to show one): the window's reading stands
    m.update({"loop.long_steps_every": None, **compile_run_share({**m, "loop.long_steps_every": None})})
    assert m["compile.run_share"] is None
