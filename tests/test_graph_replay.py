"""Kernels replayed from CUDA graphs (analyze/device.py) and the fixes that must not offer what
the trace shows done: compile (PD311, PD344), graph replay (PD311, PD361, PD315); where the host
time left lies instead (PD219)."""

from __future__ import annotations

import pytest
import tracegen as tg

from perfdoctor.diagnose.offline import diagnose_path

S = tg.StepSpec


def _diagnose(tmp_path, steps, name="t.json", **kw):
    path = tmp_path / name
    truth = tg.write(tg.TraceSpec(steps=steps, compute_major=kw.pop("compute_major", 9), **kw), path)
    doc = diagnose_path(str(path))
    return doc, doc["traces"][0]["metrics"], truth


def _ids(doc) -> tuple[set, set]:
    return {f["id"] for f in doc["findings"]}, {f["id"] for f in doc["flags"]}


def test_replayed_kernels_are_not_launched_one_by_one(analyze_spec):
    """8 us kernels: longer than their own ~5 us launch call, shorter than the ~15 us graph launch
    that replays 30 of them. Only the two kernels launched one by one count for launch-boundness
    (neither is launch-bound); counting each replayed kernel against the graph launch would call
    60 of 62 kernels launch-bound."""
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(kernels=2, kernel_us=8, graph_launches=2, graph_kernels=30)] * 3))
    m = a.metrics
    assert truth.graph_kernels == [60] * 3
    assert m["gpu.kernels_per_step"] == 62
    assert m["gpu.graph_kernel_share"] == pytest.approx(60 / 62, abs=1e-12)
    assert m["gpu.graph_launches_per_step"] == 2
    assert m["gpu.launch_bound_kernel_fraction"] == 0.0


def test_no_graphs_and_nothing_one_by_one(analyze_spec):
    """An eager trace: no graph launch, share 0. All kernels from graphs: launch-boundness has no
    kernel to judge (None), not 0."""
    m = analyze_spec(tg.TraceSpec(steps=[S(kernels=12, kernel_us=3)] * 3))[0].metrics
    # kernels=0: the step's ops are kernel-less views, and every kernel is replayed
    n = analyze_spec(tg.TraceSpec(steps=[S(kernels=0, kernel_us=3, graph_launches=1, graph_kernels=20)] * 3),
                     name="only.json")[0].metrics
    assert m["gpu.graph_kernel_share"] == 0.0 and m["gpu.graph_launches_per_step"] == 0
    assert m["gpu.launch_bound_kernel_fraction"] == 1.0
    assert n["gpu.graph_kernel_share"] == 1.0 and n["gpu.launch_bound_kernel_fraction"] is None


HOST_BOUND = dict(cpu_ops_us=3000, kernel_us=3)


def test_eager_launch_bound_step_gets_compile_and_graph_replay(tmp_path):
    doc, m, _ = _diagnose(tmp_path, [S(kernels=60, **HOST_BOUND)] * 4)
    fixes, flags = _ids(doc)
    assert doc["verdict"]["bound"] == "host" and m["fusion.compiled"] is False
    assert "PD311" in fixes and "PD361" not in fixes and "PD219" not in flags
    pd311 = next(f for f in doc["findings"] if f["id"] == "PD311")
    assert "100.0% of the kernels launched one by one finish faster" in pd311["summary"]


def test_reduce_overhead_step_is_offered_neither_compile_nor_graph_replay(tmp_path):
    """torch.compile(mode="reduce-overhead"): forward and backward each one graph launch of 30
    Triton kernels, two kernels launched one by one (an optimizer's), host-bound under the
    profiler. No compile or graph fix; the flag says the host time is outside the graphs."""
    doc, m, _ = _diagnose(tmp_path, [S(kernels=2, graph_launches=2, graph_kernels=30, compiled=True, **HOST_BOUND)] * 4)
    fixes, flags = _ids(doc)
    assert doc["verdict"]["bound"] == "host" and m["share.host"] > 0.9
    assert m["fusion.compiled"] is True
    assert m["gpu.graph_kernel_share"] == pytest.approx(60 / 62, abs=1e-6)     # JSON: 6 digits
    assert not fixes & {"PD311", "PD361", "PD344", "PD315"}, fixes
    flag = next(f for f in doc["flags"] if f["id"] == "PD219")
    assert flag["summary"].startswith("96.8% of the kernels replay from CUDA graphs (2 graph launches per step)")
    assert f"idles {100 * m['share.host']:.1f}% of each step" in flag["summary"]


def test_graphs_captured_by_hand_on_an_eager_model(tmp_path):
    """torch.cuda.graph on an eager model: nothing compiled, but the launches are replayed. No
    graph replay fix; compile's fusion is still news where the device is the critical path."""
    doc, m, _ = _diagnose(tmp_path, [S(kernels=2, graph_launches=2, graph_kernels=30, **HOST_BOUND)] * 4)
    fixes, flags = _ids(doc)
    assert m["fusion.compiled"] is False and m["gpu.graph_kernel_share"] > 0.9
    assert "PD311" not in fixes and "PD361" not in fixes and "PD219" in flags


def test_compiled_without_graphs_is_told_graph_replay_is_what_is_left(tmp_path):
    """torch.compile in the default mode, launch-bound: PD361 (reduce-overhead on the compiled
    model), not PD311's "compile the model"; same gain model."""
    doc, m, _ = _diagnose(tmp_path, [S(kernels=60, compiled=True, **HOST_BOUND)] * 4)
    eager, _, _ = _diagnose(tmp_path, [S(kernels=60, **HOST_BOUND)] * 4, name="eager.json")
    fixes, _ = _ids(doc)
    assert m["fusion.compiled"] is True and m["gpu.graph_kernel_share"] == 0.0
    assert "PD361" in fixes and "PD311" not in fixes and "PD344" not in fixes
    fix = next(f for f in doc["findings"] if f["id"] == "PD361")
    assert fix["ranked"] and fix["summary"].startswith("The steps already run compiled code")
    assert "Replaying the compiled graphs is the step left" in fix["summary"]
    assert fix["title"].startswith("Replay the compiled model as a CUDA graph")
    assert fix["fix"]["text"].startswith("The model is compiled already; pass mode=\"reduce-overhead\"")
    pd311 = next(f for f in eager["findings"] if f["id"] == "PD311")
    assert fix["gain"]["expected"] == pytest.approx(pd311["gain"]["expected"], rel=1e-6)


def test_pre_volta_graphs_not_offered_when_replayed(tmp_path):
    """PD315 (CUDA graphs by hand on cc < 7.0) fires on an eager Pascal step, not on one whose
    kernels already replay from graphs."""
    eager, _, _ = _diagnose(tmp_path, [S(kernels=60, **HOST_BOUND)] * 4, compute_major=6)
    graphed, _, _ = _diagnose(tmp_path, [S(kernels=2, graph_launches=2, graph_kernels=30, **HOST_BOUND)] * 4,
                              name="g.json", compute_major=6)
    assert "PD315" in _ids(eager)[0] and "PD315" not in _ids(graphed)[0]


def test_h100_launch_compiled(shared_traces):
    """The corpus run compiled with reduce-overhead + fused Adam: two graph launches a step
    replay 95% of the kernels. It used to be told "~2.60x PD311 Compile the model and replay it
    as a graph"; now no compile or graph fix, the flag names where the host time goes, and the
    eager `launch` run keeps PD311."""
    root = shared_traces / "h100"
    if not (root / "launch_compiled").is_dir():
        pytest.skip("../shared/traces/h100/launch_compiled is absent")
    doc = diagnose_path(str(root / "launch_compiled"))
    m = doc["traces"][0]["metrics"]
    fixes, flags = _ids(doc)
    assert m["fusion.compiled"] is True and m["gpu.graph_launches_per_step"] == 2
    assert m["gpu.graph_kernel_share"] == pytest.approx(0.948, abs=0.005)      # 221 of 233 kernels a step
    assert not fixes & {"PD311", "PD361", "PD344", "PD315"}, fixes
    assert not any(f["ranked"] for f in doc["findings"])
    flag = next(f for f in doc["flags"] if f["id"] == "PD219")
    assert "inside Optimizer.step: 21.4%" in flag["summary"]      # its range cut at the step's host end
    assert "PD311" in _ids(diagnose_path(str(root / "launch")))[0]
