"""Parity with the reference tools (issue 14 point 6), on cases built from what their own tests
describe: torch-tb-profiler's step attribution (tb_plugin/test/test_profiler.py), HTA's MTIA
traces (tests/data/mtia_trace_single_rank), gloo collectives, execution-trace files."""

from __future__ import annotations

import gzip
import json

import pytest
from pytest import approx

from perfdoctor.analyze.pipeline import analyze
from perfdoctor.analyze.timeline import BREAKDOWN
from perfdoctor.trace.loader import load_trace


def _op(name, ts, dur, ext, tid="123", cat="Operator"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 13721, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": [], "External id": ext}}


def _dev(cat, name, ts, dur, corr, ext):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": "stream 7", "ts": ts, "dur": dur,
            "args": {"stream": 7, "correlation": corr, "external id": ext, "device": 0}}


def _rt(name, ts, dur, corr, ext, tid="123"):
    return {"ph": "X", "cat": "Runtime", "name": name, "pid": 13721, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "external id": ext}}


def _analyze(tmp_path, events, name="t.json", **top):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return analyze(load_trace(path))


KERNEL = "void cunn_ClassNLLCriterion_updateGradInput_kernel<float>"


def _ms(a, i, role):
    return a.step_breakdown_ms[i][BREAKDOWN.index(role)] * 1e3


def test_first_step_excludes_device_work_of_the_unprofiled_step_before_it(tmp_path):
    # test_multiple_profilersteps_with_overlap: kernel 123 was launched before ProfilerStep#1 (no
    # runtime call in the trace) and ends at 240, before step 1's own memcpy starts (280), so step 1
    # starts at 240; the memcpy it launched runs past step 2's host start, so step 2 starts at 380.
    events = [_op("ProfilerStep#1", 100, 200, 1), _op("aten::to", 200, 60, 2),
              _op("ProfilerStep#2", 350, 150, 3), _op("aten::mm", 360, 50, 4),
              _dev("Kernel", KERNEL, 150, 90, 123, 123),
              _dev("Memcpy", "Memcpy HtoD (Pageable -> Device)", 280, 100, 334, 2),
              _rt("cudaMemcpyAsync", 250, 5, 334, 2),
              _dev("Kernel", KERNEL, 410, 200, 40348, 4), _rt("cudaLaunchKernel", 400, 5, 40348, 4)]
    a = _analyze(tmp_path, events)
    assert list(a.steps.start) == [240, 380] and list(a.steps.end) == [380, 610]
    assert [_ms(a, 0, r) for r in ("kernel", "memcpy", "runtime", "cpu_exec", "other")] == \
        approx([0, 100, 5, (200 + 60) - (150 + 90) - 5, 280 - (200 + 60)])
    assert [_ms(a, 1, r) for r in ("kernel", "memcpy", "runtime", "cpu_exec", "other")] == \
        approx([200, 0, 5, (280 + 100) - 360 + (410 - 405), 0])


def test_last_steps_without_kernels_dropped_and_first_step_after_earlier_work(tmp_path):
    # test_last_steps_no_kernel: steps 2 and 3 launched nothing (dropped); step 1 runs from the end
    # of the kernel launched before it (110) to the end of its own kernel (330).
    events = [_op("ProfilerStep#1", 100, 200, 1), _op("aten::to", 120, 10, 2),
              _op("ProfilerStep#2", 300, 100, 3), _op("ProfilerStep#3", 400, 50, 4),
              _dev("Kernel", KERNEL, 90, 20, 123, 123), _rt("cudaMemcpyAsync", 125, 5, 334, 2),
              _dev("Kernel", KERNEL, 150, 180, 334, 2)]
    a = _analyze(tmp_path, events)
    assert len(a.steps) == 1 and float(a.steps.duration[0]) == (150 + 180) - (90 + 20)
    assert a.metrics["breakdown.kernel"] == approx(180 / 220)


def _mtia_events():
    """Two steps of an MTIA trace shaped as HTA reads them: launches in mtia_runtime, device work in
    mtia_ccp_events (a compute job of 400 us and a 100 us dma_request per 1000 us step)."""
    ev, corr = [], 1
    for i, t0 in enumerate((0, 1000)):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 10, "tid": 10,
                   "ts": t0, "dur": 1000, "args": {"External id": 100 + i}})
        for at, dur, name in ((100, 400, "fused_mlp_job"), (600, 100, "dma_request")):
            ev.append({"ph": "X", "cat": "mtia_runtime", "name": "runFunction - job_prep_and_submit_for_execution",
                       "pid": 10, "tid": 10, "ts": t0 + at, "dur": 20, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "mtia_ccp_events", "name": name, "pid": 1, "tid": 102,
                       "ts": t0 + at + 50, "dur": dur, "args": {"correlation": corr, "stream": 102}})
            corr += 1
    return ev


def test_mtia_trace_reports_device_idle_and_compute_not_cpu_only(tmp_path):
    from perfdoctor.rules.engine import evaluate
    from perfdoctor.rules.loader import load_rules

    a = _analyze(tmp_path, _mtia_events(), distributedInfo={"backend": "mtia:hccl", "rank": 0, "world_size": 1})
    m = a.metrics
    assert m["trace.platform"] == "mtia"
    assert (m["gpu.idle_share"], m["gpu.kernel_busy_share"], m["breakdown.memcpy"]) == approx((0.5, 0.4, 0.1))
    assert m["precision.amp_share"] is None and m["trace.compute_capability"] is None
    d = evaluate(load_rules(None), m)
    fired = [f.rule for f in d.flags + d.fixes] + ([d.verdict.rule] if d.verdict else [])
    assert all("any" in r.devices or "mtia" in r.devices for r in fired), [r.id for r in fired]   # no CUDA/ROCm advice
    assert d.verdict.rule.bound == "host"      # device busy 50%, idle while the host launches: HTA's 42% idle, 55% compute reads the same way


def test_mtia_detected_by_launch_name_alone(tmp_path):
    ev = [dict(e, cat="kernel") if e["cat"] == "mtia_ccp_events" else e for e in _mtia_events()]
    assert _analyze(tmp_path, ev).metrics["trace.platform"] == "mtia"


def _gloo_gpu_events(op="gloo:all_reduce", backend=None):
    """One CUDA step: a 200 us kernel, then a 300 us host collective on a gloo thread (the device
    idles meanwhile), then nothing until the step ends at 1000."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000,
           "args": {"External id": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
           "args": {"correlation": 7, "External id": 1}},
          {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 20, "dur": 200,
           "args": {"correlation": 7, "stream": 7, "device": 0, "External id": 1}},
          {"ph": "X", "cat": "cpu_op" if op.startswith(("c10d", "record")) else "user_annotation", "name": op,
           "pid": 1, "tid": 5, "ts": 400, "dur": 300, "args": {"External id": 2}}]
    return ev, ({"distributedInfo": {"backend": backend, "rank": 0, "world_size": 2}} if backend else {})


@pytest.mark.parametrize("op, backend, comm", [("gloo:all_reduce", None, 0.3), ("record_param_comms", "gloo", 0.3),
                                               ("record_param_comms", "nccl", 0.0)])
def test_gloo_collectives_on_gpu_tensors_are_communication(tmp_path, op, backend, comm):
    ev, top = _gloo_gpu_events(op, backend)
    m = _analyze(tmp_path, ev, **top).metrics
    assert m["trace.platform"] == "cuda"
    assert m["breakdown.communication"] == approx(comm) and m["comm.share"] == approx(comm)
    assert m["gpu.idle_share"] == approx(0.8)          # the CPU does gloo's work: the device idles
    assert m["breakdown.kernel"] == approx(0.2)


ET_DOC = {"schema": "1.1.1-chakra.0.0.4", "pid": 7, "time": "2025-01-01 00:00:00", "start_ts": 12,
          "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0,
                     "inputs": {"values": [], "shapes": [], "types": []},
                     "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []}],
          "finish_ts": 99}


@pytest.mark.parametrize("gz", [False, True])
def test_execution_trace_in_a_directory_is_skipped_with_a_warning(tmp_path, gz):
    import tracegen as tg
    from perfdoctor.cli import main

    tg.write(tg.TraceSpec(steps=[tg.StepSpec()] * 3), tmp_path / "rank0.pt.trace.json")
    text = json.dumps(ET_DOC, indent=2).encode()
    et = tmp_path / ("et.json.gz" if gz else "et.json")
    et.write_bytes(gzip.compress(text) if gz else text)
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path), "--format", "json", "-o", str(out)])
    assert exc.value.code in (0, None)
    doc = json.loads(out.read_text())
    assert [t["path"] for t in doc["traces"]] == [str(tmp_path / "rank0.pt.trace.json")]
    assert doc["traces"][0]["warnings"][0].startswith(f"skipped {et.name}: a PyTorch execution trace")


def test_a_lone_execution_trace_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    et = tmp_path / "et.json"
    et.write_text(json.dumps(ET_DOC))
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(et)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "execution trace" in r.stderr and "Traceback" not in r.stderr
