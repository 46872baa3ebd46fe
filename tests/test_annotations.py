"""record_function labels and with_stack Python frames are not op time: a step's breakdown and
verdict are the same with and without them (PD319 advises the labels)."""

from __future__ import annotations

import pytest

from perfdoctor.diagnose.offline import diagnose_path
from tests.kineto import HandTrace


def _cpu_steps(labelled: bool) -> HandTrace:
    """4 steps of 10 ms on the CPU: two 1 ms ops in a forward, a 0.2 ms op in the optimizer step,
    the rest Python. Labelled: a "## forward ##" block over 8 ms around the two ops, a 1 ms
    Python frame with no op in it, and the optimizer's own Optimizer.step# label."""
    h = HandTrace()
    for i in range(4):
        t0 = i * 10_000.0
        h.step(i + 1, t0, t0 + 10_000)
        h.op(1, t0 + 2_000, "aten::addmm", 1_000)
        h.op(1, t0 + 6_000, "aten::addmm", 1_000)
        h.op(1, t0 + 9_700, "aten::add_", 200)
        if labelled:
            h.block(1, t0 + 500, "## forward ##", 8_000)
            h.block(1, t0 + 8_500, "train.py(42): log_metrics", 1_000, cat="python_function")
            h.block(1, t0 + 9_500, "Optimizer.step#SGD.step", 500)
    return h


def test_labels_and_python_frames_are_not_op_time(tmp_path):
    docs = {}
    for labelled in (False, True):
        path = tmp_path / f"{labelled}.json"
        _cpu_steps(labelled).write(path)
        docs[labelled] = diagnose_path(str(path))
    for doc in docs.values():
        m = doc["traces"][0]["metrics"]
        assert m["trace.platform"] == "cpu" and m["steps.count"] == 4
        assert m["breakdown.cpu_exec"] == pytest.approx(0.22) and m["breakdown.other"] == pytest.approx(0.78)
        assert doc["verdict"]["bound"] == "host"
    # labelled, it was "compute-bound: ops 100%" (the labels counted as ops)
    assert docs[True]["verdict"]["summary"] == docs[False]["verdict"]["summary"]
