"""Host-device syncs: which ones a step makes, and what they cost it.

A sync after the last ProfilerStep (a timing call, the profiler's stop) waits for the last step's
device work, so it lies inside that step once the step is extended to its device work; no step
makes it. Ground truth is read from the trace's own events."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tracegen as tg
from kineto import HandTrace
from perfdoctor.analyze.pipeline import analyze
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.trace.loader import load_trace

S = tg.StepSpec
RULES = load_rules()
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_METRICS = ("sync.per_step", "sync.share", "sync.scalar_dtoh_per_step", "gpu.idle_while_sync_share")


def events(path) -> list[dict]:
    return [e for e in json.loads(open(path).read())["traceEvents"] if e.get("ph") == "X"]


def diagnosis(a):
    d = evaluate(RULES, a.metrics)
    return {f.rule.slug for f in d.flags}, {f.rule.slug: f for f in d.fixes}


def test_a_sync_after_the_last_step_is_no_steps(tmp_path):
    """The H100 `alloc` and `compute` traces: one cudaDeviceSynchronize after the last step's host
    range read as 0.2 syncs per step blocking 17% of the step (PD203 raised, PD303 ranked first on
    an edit of `alloc`). The same steps without it give the same sync metrics."""
    # item() ends four steps; the last step's device work runs on past its host range
    base = dict(steps=[S(cpu_ops_us=2000, kernels=40, kernel_us=300, item_syncs=1)] * 4
                + [S(cpu_ops_us=2000, kernels=40, kernel_us=300)], num_workers=4)
    with_end, without = tmp_path / "end.json", tmp_path / "plain.json"
    tg.write(tg.TraceSpec(**base, end_sync=True), with_end)
    truth = tg.write(tg.TraceSpec(**base), without)
    a, b = analyze(load_trace(with_end)), analyze(load_trace(without))
    sync = [e for e in events(with_end) if e["name"] == "cudaDeviceSynchronize"]
    assert len(sync) == 1
    last_host_end = max(e["ts"] + e["dur"] for e in events(with_end) if e["name"].startswith("ProfilerStep"))
    # the case in point: after the last step's host range, inside the step extended to its device work
    assert last_host_end <= sync[0]["ts"] < a.steps.end[-1]
    assert a.metrics["sync.per_step"] == np.mean(truth.syncs) == 0.8
    for key in SYNC_METRICS:
        assert a.metrics[key] == pytest.approx(b.metrics[key], abs=1e-9), key


def test_a_lone_sync_after_the_steps_raises_nothing(tmp_path):
    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=2000, kernels=40, kernel_us=100, data_wait_us=3000)] * 5,
                          num_workers=4, end_sync=True), path)
    a = analyze(load_trace(path))
    sync = [e for e in events(path) if e["name"] == "cudaDeviceSynchronize"]
    assert len(sync) == 1 and sync[0]["ts"] < a.steps.end[-1]     # inside the extended last step
    assert a.metrics["share.device"] < 0.95      # not quiet because the device is busy
    assert {k: a.metrics[k] for k in SYNC_METRICS} == dict.fromkeys(SYNC_METRICS, 0.0)
    flags, fixes = diagnosis(a)
    assert "host-device-sync" not in flags and "remove-host-syncs" not in fixes


def test_an_optimizer_range_past_the_last_step_ends_with_it(tmp_path):
    """The last Optimizer.step span of the H100 traces runs on past its ProfilerStep, over the sync
    after it (optimizer.step_share 28% on `compute`, 21% on `alloc`): only the part inside the step's
    host range is the step's update."""
    h = HandTrace()
    h.step(1, 0, 1000)
    h.step(2, 1000, 2000)
    for start in (0, 1000):
        for i in range(4):                       # 4 x 400 us kernels: the device runs behind the host
            h.launch(1, start + 10 + 20 * i, "sgemm_kernel", 400)
    h.events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
                     "ts": 800, "dur": 100})
    h.events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
                     "ts": 1800, "dur": 1400})   # ends 1.2 ms after its step's host range
    h.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                     "ts": 2010, "dur": h.device_free - 2010 + 1})
    h.write(tmp_path / "t.json")
    a = analyze(load_trace(tmp_path / "t.json"))
    assert a.steps.end[-1] == pytest.approx(h.device_free)       # the sync lies in the extended step
    total = float(a.steps.duration.sum())
    assert a.metrics["optimizer.step_share"] == pytest.approx((100 + 200) / total)
    assert a.metrics["sync.per_step"] == 0 and a.metrics["sync.share"] == 0
