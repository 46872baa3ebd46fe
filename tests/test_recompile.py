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
