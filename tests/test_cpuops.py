"""cpu.small_op_share and what stays of a step when compile removes the ops' dispatch
(analyze/cpuops.py), on a hand-built CPU trace whose every duration is known."""

from __future__ import annotations

import json

import pytest

from perfdoctor.analyze.pipeline import analyze
from perfdoctor.trace.loader import load_trace

STEP_US = 500.0


def _trace(tmp_path) -> dict:
    ev = []

    def op(name, ts, dur, cat="cpu_op"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}})
    t = 1000.0
    for s in range(4):
        op(f"ProfilerStep#{s}", t, STEP_US, "user_annotation")
        # an aten::linear of 54 us: its transpose (2 us) and an addmm of 49 us that holds a 3 us
        # copy of the bias: 46 us of compute, the rest dispatch (dividing the linear's time by
        # the three ops it holds had called it small: 18 us each)
        op("aten::linear", t + 10, 54)
        op("aten::t", t + 11, 2)
        op("aten::addmm", t + 14, 49)
        op("aten::copy_", t + 15, 3)
        # a backward node of five tiny ops: small all through
        op("autograd::engine::evaluate_function: MulBackward0", t + 100, 40)
        for i in range(5):
            op("aten::mul", t + 102 + 7 * i, 5)
        for i in range(30):                             # thirty 6 us ops
            op("aten::add", t + 150 + 8 * i, 6)
        # the optimizer's step: a 30 us update of one large tensor and four tiny ones
        op("Optimizer.step#SGD.step", t + 400, 80, "user_annotation")
        op("aten::add_", t + 402, 30)
        for i in range(4):
            op("aten::add_", t + 440 + 9 * i, 6)
        t += STEP_US
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return analyze(load_trace(path)).metrics


def test_a_large_ops_compute_stays_and_the_dispatch_around_it_is_small(tmp_path):
    m = _trace(tmp_path)
    assert m["trace.platform"] == "cpu" and m["steps.count"] == 4
    ops = 54 + 40 + 30 * 6 + 30 + 4 * 6                     # the outermost ops' time per step
    large = (49 - 3) + 30                                     # the addmm's own time, the large update
    assert m["share.device"] == pytest.approx(ops / STEP_US)
    assert m["cpu.small_op_share"] == pytest.approx((ops - large) / STEP_US)
    assert m["cpu.compute_share"] == pytest.approx(large / STEP_US)
    assert m["cpu.optimizer_large_op_share"] == pytest.approx(30 / STEP_US)
    assert m["cpu.optimizer_op_share"] == pytest.approx((30 + 4 * 6) / STEP_US)   # its ops, not its 80 us
    assert m["cpu.rnn_small_op_share"] == 0.0


def test_a_call_long_in_one_step_only_is_a_stall_and_a_call_long_at_its_place_every_step_is_compute(tmp_path):
    """Four 1000 us steps: ten 5 us copies a step, the third of them 85 us in step 2 only (a stall:
    the allocator, a page fault, the profiler), and a 5 us sqrt then a 60 us one (an optimizer's
    small and large parameter) in every step. The stall is no compute; the 60 us sqrt is."""
    ev = []

    def op(name, ts, dur, cat="cpu_op"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}})
    t = 1000.0
    for s in range(4):
        op(f"ProfilerStep#{s}", t, 1000.0, "user_annotation")
        for i in range(10):
            op("aten::copy_", t + 10 + 100 * i, 85 if (s, i) == (2, 2) else 5)
        op("aten::sqrt", t + 960, 5)
        op("aten::sqrt", t + 970, 20 if s == 0 else 25)         # long at its place in every step
        t += 1000.0
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    m = analyze(load_trace(path)).metrics
    ops = 4 * (10 * 5 + 5) + 80 + 20 + 3 * 25          # the stall: 80 us beyond its 5
    assert m["share.device"] == pytest.approx(ops / 4000)
    assert m["cpu.compute_share"] == pytest.approx((20 + 3 * 25) / 4000)
    assert m["cpu.small_op_share"] == pytest.approx((ops - 20 - 3 * 25) / 4000)
