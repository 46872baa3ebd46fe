"""Host-device syncs: which ones a step makes, and what they cost it.

A sync after the last ProfilerStep (a timing call, the profiler's stop) waits for the last step's
device work, so it lies inside that step once the step is extended to its device work; no step
makes it. What a sync in a step costs is the device idle it exposes (the device runs out of
queued work while the host waits, and idles until the host queues again), not the host time it
blocks. Ground truth is read from the trace's own events."""

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
SYNC_METRICS = ("sync.per_step", "sync.share", "sync.scalar_dtoh_per_step", "sync.exposed_idle_share",
                "gpu.idle_while_sync_share")


def events(path) -> list[dict]:
    return [e for e in json.loads(open(path).read())["traceEvents"] if e.get("ph") == "X"]


def diagnosis(a):
    d = evaluate(RULES, a.metrics)
    return {f.rule.slug for f in d.flags}, {f.rule.slug: f for f in d.fixes}


def exposed_truth(ev: list[dict], steps, minus=()) -> float:
    """us of device idle from the end of each item()'s DtoH copy (the device's last queued work,
    so it drains inside the sync) to the next device work, inside the steps, less the host's data
    waits and the calls named in `minus`."""
    dev = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in DEVICE_CATS)
    starts = np.array([s for s, _ in dev])
    lo, hi = float(steps.start[0]), float(steps.end[-1])
    mask = np.zeros(int(hi - lo) + 1, bool)      # 1 us grid: tracegen times are whole microseconds
    for e in ev:
        if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"]:
            d = e["ts"] + e["dur"]
            later = starts[starts >= d]
            n = min(float(later[0]) if len(later) else hi, hi)
            mask[int(d - lo):int(n - lo)] = True
    for e in ev:
        if e["name"].startswith("enumerate(DataLoader)") or e["name"] in minus:
            mask[int(e["ts"] - lo):int(e["ts"] + e["dur"] - lo)] = False
    for a, b in zip(steps.end[:-1], steps.start[1:]):       # the host's gaps between steps
        mask[int(a - lo):int(b - lo)] = False
    return float(mask[:-1].sum())


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


def test_a_sync_on_a_busy_device_costs_what_the_device_loses(tmp_path):
    """One loss.item() per step while the device runs 12 ms behind the host (the `uint8_input`
    case): the host blocks most of the step, the device loses only the moment until the next
    launch. Not flagged, though the device is under 95% busy."""
    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=2000, kernels=40, kernel_us=300, item_syncs=1,
                                   data_wait_us=1500)] * 5, num_workers=4), path)
    a = analyze(load_trace(path))
    m = a.metrics
    assert m["sync.per_step"] == 1 and m["sync.share"] > 0.5 and m["share.device"] < 0.95
    assert m["sync.exposed_idle_share"] * float(a.steps.duration.sum()) == pytest.approx(
        exposed_truth(events(path), a.steps), abs=1.0)
    assert m["sync.exposed_idle_share"] < 0.01
    flags, fixes = diagnosis(a)
    assert "host-device-sync" not in flags and "remove-host-syncs" not in fixes


def test_a_sync_before_the_loops_own_code_exposes_it(tmp_path):
    """The same item() followed by 2 ms of the loop's own code (logging, untraced): the device it
    drained idles all of it. Flagged, and PD303's gain rests on that idle."""
    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=1000, kernels=10, kernel_us=50, item_syncs=1)] * 5,
                          num_workers=4, gap_us=2000), path)
    a = analyze(load_trace(path))
    m, total = a.metrics, float(a.steps.duration.sum())
    truth = exposed_truth(events(path), a.steps)
    assert truth / total > 0.5
    assert m["sync.exposed_idle_share"] * total == pytest.approx(truth, abs=1.0)
    assert m["sync.exposed_idle_share"] <= m["gpu.idle_share"]
    flags, fixes = diagnosis(a)
    assert "host-device-sync" in flags
    assert fixes["remove-host-syncs"].share == pytest.approx(m["sync.exposed_idle_share"])
    assert fixes["remove-host-syncs"].expected == pytest.approx(1 / (1 - m["sync.exposed_idle_share"]), rel=1e-3)


def test_the_idle_after_a_sync_in_allocator_calls_is_not_claimed_twice(tmp_path):
    """empty_cache() at the start of each step (cudaFree outside any op, then cudaMalloc) after the
    previous step's item(): PD343 credits the device idle during those calls, PD303 the rest of
    the idle the sync exposed, so their shares add up to no more than the idle."""
    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=1000, kernels=10, kernel_us=50, item_syncs=1, frees=2, mallocs=2)] * 5,
                          num_workers=4, gap_us=1000), path)
    a = analyze(load_trace(path))
    m, total = a.metrics, float(a.steps.duration.sum())
    assert m["memory.empty_cache_per_step"] >= 0.5 and m["memory.alloc_idle_share"] > 0.01
    truth = exposed_truth(events(path), a.steps, minus=("cudaFree", "cudaMalloc"))
    assert m["sync.exposed_idle_share"] * total == pytest.approx(truth, abs=1.0)
    _, fixes = diagnosis(a)
    claimed = fixes["remove-host-syncs"].share + fixes["remove-empty-cache"].share
    assert claimed <= m["gpu.idle_share"] + 1e-9
