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
