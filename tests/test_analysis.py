"""Every metric against the generator's ground truth (tests/tracegen.py places every event)."""

from __future__ import annotations

import numpy as np
import pytest

import tracegen as tg
from perfdoctor.analyze import registry
from perfdoctor.analyze.timeline import BREAKDOWN

S = tg.StepSpec


def approx(x, rel=1e-6, abs=1e-9):
    return pytest.approx(x, rel=rel, abs=abs)


def test_registry_is_the_contract(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S()] * 3))
    assert set(a.metrics) == set(registry.REGISTRY)
    for name, m in registry.REGISTRY.items():
        assert m.unit and m.doc, name
    with pytest.raises(KeyError):
        registry.check({"no.such_metric": 1})


@pytest.mark.parametrize("fmt", ["kineto", "legacy2021"])
@pytest.mark.parametrize("ns", [False, True])
def test_steps_and_breakdown_match_truth(analyze_spec, fmt, ns):
    steps = [S(data_wait_us=2000, kernels=30, kernel_us=80), S(data_wait_us=1000, kernels=10, kernel_us=200),
             S(data_wait_us=3000, kernels=20, kernel_us=50)]
    a, truth = analyze_spec(tg.TraceSpec(steps=steps, fmt=fmt, ns_resolution=ns))
    m = a.metrics
    assert m["steps.count"] == truth.n_steps == 3 and m["steps.source"] == "ProfilerStep"
    wall = np.array(truth.step_wall_device_us)
    assert a.steps.duration == approx(wall, rel=1e-9, abs=0.3)
    assert m["steps.time_median_ms"] == approx(np.median(wall) / 1e3, rel=1e-4)
    total = wall.sum()
    assert m["breakdown.kernel"] == approx(sum(truth.kernel_busy_us) / total, rel=1e-4)
    assert m["input.data_wait_host_share"] == approx(sum(truth.data_wait_us) / total, rel=1e-4)
    assert sum(m[f"breakdown.{r}"] for r in BREAKDOWN) == approx(1.0)
    assert a.step_breakdown_ms.sum(axis=1) == approx(wall / 1e3, rel=1e-6)
    assert m["input.loader"] == "single_process" and m["input.num_workers_zero"] is True


def test_device_work_past_host_step_extends_the_step(analyze_spec):
    # 40 kernels of 300 us queue far behind 2 ms of host launches: steps end on the GPU.
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(cpu_ops_us=2000, kernels=40, kernel_us=300)] * 3))
    assert truth.step_wall_device_us[0] > truth.step_wall_us[0] * 2
    assert a.steps.duration == approx(np.array(truth.step_wall_device_us), abs=0.3)
    assert a.metrics["breakdown.kernel"] > 0.95
    assert a.metrics["gpu.kernel_busy_share"] == approx(sum(truth.kernel_busy_us) / sum(truth.step_wall_device_us), rel=1e-4)


def test_syncs_copies_and_allocator(analyze_spec):
    steps = [S(syncs=3, item_syncs=2, pageable_h2d=2, pinned_h2d=1, mallocs=2, frees=1)] * 4
    a, truth = analyze_spec(tg.TraceSpec(steps=steps, memory_events=True, reserved_churn=True))
    m = a.metrics
    assert m["sync.per_step"] == approx(np.mean(truth.syncs)) == 5
    assert m["sync.scalar_dtoh_per_step"] == 2
    assert m["memcpy.pageable_h2d_per_step"] == approx(np.mean(truth.pageable_h2d)) == 2
    assert m["memory.malloc_per_step"] == 2 and m["memory.free_per_step"] == 1
    assert m["memory.reserved_changes_per_step"] == approx(np.mean(truth.reserved_changes[1:]))
    assert m["memory.peak_allocated_bytes"] == truth.peak_allocated_bytes
    assert 0 < m["memory.reserved_swing"] < 1
    assert m["memory.peak_reserved_fraction"] == approx(m["memory.peak_reserved_bytes"] / 2**35)
    assert len(a.memory_series["t_ms"]) == len(a.memory_series["reserved_bytes"]) > 0


def test_quiet_allocator_and_no_syncs(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(mallocs=3)] + [S()] * 3, memory_events=True))
    m = a.metrics
    assert m["memory.malloc_per_step"] == 0 and m["memory.free_per_step"] == 0   # warm-up step excluded
    assert m["memory.reserved_changes_per_step"] == 0 and m["memory.reserved_swing"] == 0
    assert m["sync.per_step"] == 0 and m["memcpy.pageable_h2d_per_step"] == 0


def test_tensor_core_shares(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(kernels=20, kernel_us=100, gemm_ops=8, tensor_core_kernels=3)] * 3))
    m = a.metrics
    assert m["tensor_core.kernel_share"] == approx(truth.tensor_core_kernel_us / truth.kernel_us_total)
    assert m["tensor_core.eligible_share"] == approx(8 / 20)   # 8 GEMM kernels, 3 of them on tensor cores
    b, _ = analyze_spec(tg.TraceSpec(steps=[S(kernels=20, gemm_ops=8)] * 3), name="fp32.json")
    assert b.metrics["tensor_core.kernel_share"] == 0 and b.metrics["tensor_core.eligible_share"] == approx(0.4)


def test_communication_share_and_overlap(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(kernels=10, kernel_us=100, nccl_kernels=2, nccl_us=400)] * 3,
                                         rank=0, world_size=2))
    m = a.metrics
    total = sum(truth.step_wall_device_us)
    assert m["comm.share"] == approx(sum(truth.nccl_busy_us) / total, rel=1e-4)
    assert 0 <= m["comm.overlap"] <= 1
    assert m["comm.exposed_share"] == approx(m["comm.share"] * (1 - m["comm.overlap"]), rel=1e-4)
    assert m["trace.rank"] == 0 and m["trace.world_size"] == 2


def test_idle_gaps_are_attributed_to_data_wait(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(data_wait_us=4000, kernels=10, kernel_us=100)] * 3))
    m = a.metrics
    parts = ("gpu.idle_host_wait_share", "gpu.idle_kernel_wait_share", "gpu.idle_other_share")
    assert sum(m[p] for p in parts) == approx(m["gpu.idle_share"])
    host = [k for k in m if k.startswith("gpu.idle_while_")]
    assert sum(m[k] for k in host) == approx(m["gpu.idle_share"])
    raw = sum(truth.data_wait_us) / sum(truth.step_wall_device_us)
    assert m["input.data_wait_host_share"] == approx(raw, rel=1e-4)
    # Exposed wait: the previous step's last kernels overlap the start of the wait.
    assert m["gpu.idle_while_data_wait_share"] == approx(m["input.data_wait_share"])
    assert 0.97 * raw < m["input.data_wait_share"] < raw
    g = a.gaps[0]
    assert g.kind == "host_wait" and g.host_activity == "data_wait"
    assert g.host_event.startswith("enumerate(DataLoader)#_SingleProcessDataLoaderIter")
    assert g.duration_ms >= 4.0


def test_back_to_back_kernels_are_kernel_wait(analyze_spec):
    # Tiny kernels launched faster than they run: gaps are launch latency (< 30 us), not host waits.
    a, _ = analyze_spec(tg.TraceSpec(steps=[S(cpu_ops_us=1500, kernels=50, kernel_us=25)] * 3))
    m = a.metrics
    assert m["gpu.idle_kernel_wait_share"] > 0.5 * m["gpu.idle_share"] > 0
    assert m["gpu.kernel_wait_threshold_us"] == 30.0


def test_fallback_to_dataloader_iterations(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(data_wait_us=1000)] * 4, profiler_steps=False))
    assert a.metrics["steps.source"] == "DataLoader iterations"
    assert a.metrics["steps.count"] == 3                 # the last, open-ended iteration is not counted
    starts = np.array(truth.step_start_us)
    assert a.steps.start == approx(starts[:3], abs=0.3)
    assert any("DataLoader" in n for n in a.notes)


def test_fallback_to_whole_trace(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S()] * 2, profiler_steps=False), name="w.json")
    # tracegen emits a DataLoader annotation only when data_wait_us > 0: no loader, no optimizer
    assert a.metrics["steps.source"] == "whole trace" and a.metrics["steps.count"] == 1


def test_cpu_only_trace_has_no_device_numbers(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S(data_wait_us=500)] * 3, device="cpu"))
    m = a.metrics
    assert m["trace.platform"] == "cpu" and m["trace.device_name"] is None
    for k, v in m.items():
        if k.split(".")[0] in ("gpu", "sync", "memcpy", "tensor_core") or k.startswith("memory.") and k != "memory.events":
            assert v is None, k
    assert m["breakdown.kernel"] == 0 and a.gaps == []


def test_rocm_trace_is_recognised(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(syncs=2, pageable_h2d=1)] * 3, device="rocm"))
    m = a.metrics
    assert m["trace.platform"] == "rocm" and m["trace.compute_capability"] is None
    # The pageable copy is a blocking hipMemcpyWithStream on ROCm: a sync point of its own.
    assert m["sync.per_step"] == np.mean(truth.syncs) + 1 == 3
    assert m["gpu.kernel_busy_share"] > 0


@pytest.mark.parametrize("device", ["rocm", "cuda"])
def test_a_device_only_trace_is_told_rocm_by_its_kernel_names(tmp_path, device):
    """A trace of device activity alone (no runtime calls, no deviceProperties: no HIP name, no
    AMD device to tell): AMD's Tensile GEMM kernels (Cijk_...) say ROCm; NVIDIA's say CUDA."""
    import json
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace
    obj, _ = tg.build(tg.TraceSpec(steps=[S(kernels=6, gemm_ops=3)] * 3, device=device))
    obj.pop("deviceProperties", None)
    obj["traceEvents"] = [e for e in obj["traceEvents"] if e.get("cat") not in ("cuda_runtime", "runtime")]
    names = {e["name"] for e in obj["traceEvents"] if e.get("cat") == "kernel"}
    assert any(n.startswith("Cijk_") for n in names) == (device == "rocm"), names
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    assert analyze(load_trace(path)).metrics["trace.platform"] == device


def test_kernel_statistics_and_launch_boundness(analyze_spec):
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(kernels=12, kernel_us=3)] * 3))   # 3 us kernels, ~5 us launches
    m = a.metrics
    assert m["gpu.kernels_per_step"] == 12 and m["gpu.kernel_median_us"] == 3
    assert m["gpu.launch_bound_kernel_fraction"] == 1.0
    b, _ = analyze_spec(tg.TraceSpec(steps=[S(kernels=12, kernel_us=400)] * 3), name="long.json")
    assert b.metrics["gpu.launch_bound_kernel_fraction"] == 0.0


def test_copy_and_allocator_time_shares(analyze_spec):
    spec = tg.TraceSpec(steps=[S(pageable_h2d=2, pinned_h2d=3, mallocs=2, frees=2)] * 3)
    a, truth = analyze_spec(spec)
    m = a.metrics
    wall = sum(truth.step_wall_device_us)
    assert m["memcpy.h2d_share"] == approx(sum(truth.memcpy_us) / wall, rel=1e-4)
    assert 0 < m["memcpy.pageable_h2d_share"] < m["memcpy.h2d_share"]
    # steady state = steps 2 and 3: their cudaMalloc/cudaFree time over their wall time
    events = tg.build(spec)[0]["traceEvents"]
    lo = truth.step_start_us[1]
    api = sum(e["dur"] for e in events if e.get("name") in ("cudaMalloc", "cudaFree") and e["ts"] >= lo)
    assert m["memory.alloc_api_share"] == approx(api / sum(truth.step_wall_device_us[1:]), rel=1e-4)


def test_step_time_statistics(analyze_spec):
    steps = [S(cpu_ops_us=1000 * (i + 1), kernels=4) for i in range(5)]
    a, truth = analyze_spec(tg.TraceSpec(steps=steps))
    m = a.metrics
    d = np.array(truth.step_wall_device_us) / 1e3
    assert m["steps.time_mean_ms"] == approx(d.mean(), rel=1e-4)
    assert m["steps.time_min_ms"] == approx(d.min(), rel=1e-4) and m["steps.time_max_ms"] == approx(d.max(), rel=1e-4)
    assert m["steps.time_p90_ms"] == approx(np.percentile(d, 90), rel=1e-4)
    assert m["steps.time_cv"] == approx(d.std() / d.mean(), rel=1e-3)


def test_trace_metadata_metrics(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S()] * 3, compute_major=8, rank=3, world_size=4))
    m = a.metrics
    assert m["trace.platform"] == "cuda" and m["trace.compute_capability"] == 8.0
    assert m["trace.device_memory_bytes"] == 2**35 and m["trace.rank"] == 3 and m["trace.world_size"] == 4
    assert m["trace.truncated"] is False and m["trace.events"] > 0 and m["trace.device_name"]


def test_datapipe_and_multiprocess_loader_names(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S(data_wait_us=500)] * 3, num_workers=4))
    assert a.metrics["input.loader"] == "multi_process" and a.metrics["input.num_workers_zero"] is False
    b, _ = analyze_spec(tg.TraceSpec(steps=[S(data_wait_us=0)] * 3), name="none.json")
    assert b.metrics["input.loader"] is None and b.metrics["input.num_workers_zero"] is None


def _host_bound_trace(path, gap_us: float, gaps: int, steps: int = 4):
    """Per step: 40 tiny ops, each launching a 10 us kernel, with `gaps` untraced stretches of
    gap_us spread between them (the Python between ops, or one long piece of the loop's code)."""
    from kineto import HandTrace

    tr = HandTrace()
    tr.tiny_op_steps(steps, gaps, gap_us)
    tr.write(path)


def test_long_untraced_stretches_are_told_from_the_python_between_ops(tmp_path):
    """The same 4 ms of untraced host time per step: as 40 pieces of 100 us between ops (the
    model's Python: graph replay removes it) or as one 4 ms stretch (the loop's own code, e.g. a
    checkpoint write: compiling the model leaves it, and PD311 does not count it)."""
    from perfdoctor.diagnose.offline import diagnose_path

    out = {}
    for name, gap_us, gaps in (("short", 100.0, 40), ("long", 4000.0, 1)):
        _host_bound_trace(tmp_path / f"{name}.json", gap_us, gaps)
        doc = diagnose_path(str(tmp_path / f"{name}.json"))
        out[name] = (doc["traces"][0]["metrics"], {f["slug"] for f in doc["findings"]})
    m_short, fixes_short = out["short"]
    m_long, fixes_long = out["long"]
    # 4 ms of gaps and 40 x 5 us between an op's end and the next, in a 5 ms step
    assert m_short["gpu.idle_while_untraced_share"] == m_long["gpu.idle_while_untraced_share"] == pytest.approx(0.84)
    assert m_short["gpu.idle_while_long_untraced_share"] == 0
    assert m_long["gpu.idle_while_long_untraced_share"] == pytest.approx(4005 / 5000)
    assert "compile-reduce-overhead" in fixes_short and "compile-reduce-overhead" not in fixes_long


@pytest.mark.parametrize("first_us,repeat_us", [(2000.0, 25.0), (50.0, 25.0), (1500.0, 1500.0)])
def test_an_ops_first_call_far_past_its_repeats_is_one_time_setup(tmp_path, first_us, repeat_us):
    """A trace of a GEMM test with no step annotations (one found on GitHub: the first
    aten::matmul 2.14 ms, four repeats of 24-39 us, read host-bound with "compile, ~4.37x" first):
    the device idle inside the first call is one-time setup; PD222 says so and PD311 leaves it
    out. A first call of 50 us (under a millisecond), or one as long as its repeats, is none."""
    from kineto import HandTrace

    from perfdoctor.diagnose.offline import diagnose_path

    tr, t = HandTrace(), 0.0
    for dur in [first_us] + [repeat_us] * 4:
        tr.op(1, t, "aten::mm", dur, ext=tr.corr + 1)
        tr.launch(1, t + dur - 10, "sm90_xmma_gemm_f16f16_f32_tn_n", 20.0)    # its kernel at the end
        t += dur + 5
    tr.write(tmp_path / "t.json")
    doc = diagnose_path(str(tmp_path / "t.json"))
    m = doc["traces"][0]["metrics"]
    flags, fixes = {f["id"] for f in doc["flags"]}, {f["id"] for f in doc["findings"]}
    if first_us == 2000.0:
        # idle from the op's start to its kernel's (launched 10 us before its end, 5 us a launch)
        assert m["gpu.idle_while_first_call_share"] == approx(1995 / (1e3 * m["steps.time_median_ms"]))
        assert m["gpu.first_call_op"] == "aten::mm" and m["gpu.first_call_repeat_ratio"] == approx(80)
        assert "PD222" in flags and "PD311" not in fixes
    else:
        assert m["gpu.idle_while_first_call_share"] == 0 and m["gpu.first_call_op"] is None
        assert "PD222" not in flags and "PD311" in fixes       # host-bound all the same


def test_reserved_swing_is_memory_given_back_not_growth():
    """Reserved memory that only grows (a new bucket's largest shape, cached and kept) is the
    allocator warming up; memory given back and asked for again is the swing (empty_cache)."""
    from perfdoctor.analyze.memory import reserved_swing
    growth = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0]) * 2**30
    assert reserved_swing(growth) == 0
    emptied = np.array([3.0, 1.0, 3.0, 1.5, 3.0]) * 2**30     # empty_cache every step, then regrown
    assert reserved_swing(emptied) == approx(2 / 3)
    assert reserved_swing(np.array([2.0, 4.0, 3.0])) == approx(0.25)   # a fall after growth counts
    assert reserved_swing(np.array([])) == 0 and reserved_swing(np.zeros(3)) == 0


def test_copies_on_the_compute_stream_run_alone_and_a_side_streams_beside_kernels(tmp_path):
    """memcpy.h2d_alone_share: HtoD copy time with no kernel beside it. tracegen queues its pinned
    copies on the stream the kernels run on, one after the other: all of their time is alone and
    PD363 (prefetch on a side stream) is offered; the same copies moved onto a stream of their own
    under the kernels (a prefetcher) run alone for none of it."""
    import json

    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace

    obj, _ = tg.build(tg.TraceSpec(steps=[S(pinned_h2d=4, kernels=10, kernel_us=50)] * 5))
    (tmp_path / "serial.json").write_text(json.dumps(obj))
    m = analyze(load_trace(tmp_path / "serial.json")).metrics
    assert m["memcpy.h2d_alone_share"] == approx(m["memcpy.h2d_share"]) and m["memcpy.h2d_share"] > 0.15
    kernels = sorted((e for e in obj["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    copies = [e for e in obj["traceEvents"] if "HtoD" in e.get("name", "")]
    for c in copies:          # under the next kernel that starts after it was issued, on stream 99
        k = next(k for k in kernels if k["ts"] >= c["ts"])
        c["ts"], c["args"]["stream"] = k["ts"], 99
    (tmp_path / "beside.json").write_text(json.dumps(obj))
    m2 = analyze(load_trace(tmp_path / "beside.json")).metrics
    assert m2["memcpy.h2d_alone_share"] == 0 and m2["memcpy.h2d_share"] > 0.15
