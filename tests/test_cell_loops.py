"""A Python loop over an RNN cell's time steps (analyze/cellloops.py, PD387), recorded by
torch.profiler on the CPU (the bench's model: an nn.LSTMCell / nn.GRUCell unrolled by hand and its
nn.LSTM twin), and a CUDA trace written by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

T, B, H = 24, 8, 16
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _report(tmp_path, kind: str) -> dict:
    """The report of a trace of bench/bench_cell_loops.py's model (hidden H, T time steps, batch B):
    "lstm" and "gru" loop over nn.LSTMCell / nn.GRUCell, "fused" runs nn.LSTM."""
    pytest.importorskip("torch", reason="torch records the trace")
    sys.path.insert(0, str(BENCH))
    try:
        import bench_cell_loops as bench
    finally:
        sys.path.remove(str(BENCH))
    step = bench.trainer("lstm" if kind == "fused" else kind, H, T, B, fused=kind == "fused")
    return bench.diagnosed(step, tmp_path / f"{kind}.json")


@pytest.mark.quiet         # the loop's share is a timing: beside another test a CI run read 0.43 for ~0.85
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_loop_over_a_cell_is_a_recurrence_with_its_own_fix(tmp_path, kind):
    doc = _report(tmp_path, kind)
    m = doc["traces"][0]["metrics"]
    # the forward loop (a cell, an embedding and a slice a time step) and its backward: most of
    # the step, none of it a loop over samples
    assert m["rnn.cell_loop_iterations"] == pytest.approx(T, abs=1)
    # what stays is the ops outside the loop and its backward (the optimizer's, the loss's): less
    # than the rest of the step, whose untraced time between ops goes with the loop
    assert 0.5 < m["rnn.cell_loop_share"] <= 1 and 0 < m["rnn.cell_loop_kept_share"] < 1 - m["rnn.cell_loop_share"]
    assert not m["cpu.loop_share"]
    ids = [f["id"] for f in doc["findings"]]
    assert "PD387" in ids and "PD365" not in ids
    fix = next(f for f in doc["findings"] if f["id"] == "PD387")
    assert fix["gain"]["ceiling"] == pytest.approx(1 / m["rnn.cell_loop_kept_share"], rel=1e-3)
    assert fix["gain"]["expected"] is None


def test_the_fused_module_has_no_cell_loop(tmp_path):
    doc = _report(tmp_path, "fused")
    m = doc["traces"][0]["metrics"]
    assert m["rnn.cell_loop_share"] is None and not m["cpu.loop_share"]
    assert "PD387" not in [f["id"] for f in doc["findings"]]


def test_on_a_gpu_the_ceiling_keeps_the_device_work_launched_outside_the_loop(tmp_path):
    """A CUDA step by hand: an 800 us kernel launched before a loop of 24 time steps (select, then
    aten::lstm_cell launching a 3 us kernel), 1500 us a step. The loop is a recurrence (no PD365),
    and the device work launched outside it stays: PD387's ceiling is 1500 / 800."""
    from kineto import HandTrace

    from perfdoctor.diagnose.offline import diagnose_path
    h = HandTrace()
    step_us, loop_start, per_iter = 1500.0, 200.0, 40.0
    for i in range(6):
        s = 1000.0 + i * step_us
        h.step(i, s, s + step_us)
        h.op(1, s + 10, "aten::linear", 100)
        h.launch(1, s + 20, "ampere_sgemm_128x64_tn", 800)
        for j in range(T):
            a = s + loop_start + j * per_iter
            h.op(1, a, "aten::select", 5)
            h.op(1, a + 8, "aten::lstm_cell", 25)
            h.launch(1, a + 10, "_thnn_fused_lstm_cell_kernel", 3)
    h.write(tmp_path / "cell.json")
    doc = diagnose_path(str(tmp_path / "cell.json"))
    m = doc["traces"][0]["metrics"]
    assert m["rnn.cell_loop_iterations"] == pytest.approx(T, abs=1) and not m["cpu.loop_share"]
    loop_end = loop_start + (T - 1) * per_iter + 33            # the last cell call ends 33 us in
    assert m["rnn.cell_loop_share"] == pytest.approx((loop_end - loop_start) / step_us, abs=0.05)
    assert m["rnn.cell_loop_kept_share"] == pytest.approx(800 / step_us, rel=0.01)
    fix = next(f for f in doc["findings"] if f["id"] == "PD387")
    assert fix["gain"]["ceiling"] == pytest.approx(step_us / 800, rel=0.01)
    assert "PD365" not in [f["id"] for f in doc["findings"]]


@pytest.mark.quiet         # the loop's share is a timing
def test_a_loop_over_slices_split_off_before_it_is_found(tmp_path):
    """pytorch/examples' time_sequence_prediction loops `for x_t in x.split(1, dim=1)`: every slice
    is taken by one aten::split before the loop, none in it (as `for row in x:` takes its rows by
    one aten::unbind). The loop over its two cells was found by nothing; it is PD387's."""
    torch = pytest.importorskip("torch", reason="torch records the trace")
    from torch.profiler import ProfilerActivity, profile

    from perfdoctor.diagnose.offline import diagnose_path
    torch.manual_seed(0)
    c1, c2, lin = torch.nn.LSTMCell(1, H), torch.nn.LSTMCell(H, H), torch.nn.Linear(H, 1)
    x = torch.randn(B, T + 1)

    def step():
        h = c = h2 = c2_ = torch.zeros(B, H)
        outs = []
        for x_t in x[:, :-1].split(1, dim=1):
            h, c = c1(x_t, (h, c))
            h2, c2_ = c2(h, (h2, c2_))
            outs.append(lin(h2))
        loss = ((torch.cat(outs, 1) - x[:, 1:]) ** 2).mean()
        loss.backward()
    step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3):
            step()
            p.step()
    p.export_chrome_trace(str(tmp_path / "split.json"))
    doc = diagnose_path(str(tmp_path / "split.json"))
    m = doc["traces"][0]["metrics"]
    assert m["rnn.cell_loop_iterations"] == pytest.approx(T, abs=1) and m["rnn.cell_loop_share"] > 0.5
    assert "PD387" in [f["id"] for f in doc["findings"]]


CELL_SCRIPT = '''
import sys, torch, torch.nn as nn
dtype = getattr(torch, sys.argv[1])
torch.manual_seed(0)
c1, c2, lin = nn.LSTMCell(1, 32).to(dtype), nn.LSTMCell(32, 32).to(dtype), nn.Linear(32, 1).to(dtype)
opt = torch.optim.SGD([*c1.parameters(), *c2.parameters(), *lin.parameters()], lr=0.1)
x = torch.randn(16, 41, dtype=dtype)
for step in range(40):
    h = c = h2 = c2_ = torch.zeros(16, 32, dtype=dtype)
    outs = []
    for x_t in x[:, :-1].split(1, dim=1):           # time_sequence_prediction's loop
        h, c = c1(x_t, (h, c))
        h2, c2_ = c2(h, (h2, c2_))
        outs.append(lin(h2))
    loss = ((torch.cat(outs, 1) - x[:, 1:]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


@pytest.mark.quiet         # the loop's share and the probe are timings
def test_run_measures_the_cell_against_the_fused_module(tmp_path):
    """Under `perfdoctor run` the loop's first cell is built again after the run and timed 40
    calls against nn.LSTM over 40 steps (collect/rnnprobe.py): PD387's expected gain is that ratio
    on the cell's part of the loop, the rest of the loop kept, under the ceiling."""
    from runs import child, prun_script, report
    _, out = prun_script(tmp_path, "cells.py", CELL_SCRIPT, "float32", trace=True)
    doc, rc = report(out), child(out)["root_calls"]
    assert (rc["rnn_module"], rc["rnn_calls"], rc["rnn"]["input_shape"]) == ("LSTMCell", 40, [16, 1])
    m = doc["traces"][0]["metrics"]
    assert m["rnn.cell_loop_iterations"] == pytest.approx(40, abs=1)
    probe = json.loads((out / "rnn_probe.json").read_text())
    assert (probe["kind"], probe["calls"], probe["batch"], probe["dtype"]) == ("LSTMCell", 40, 16, "float32")
    fix = next(f for f in doc["findings"] if f["id"] == "PD387")
    span, r = 1 - m["rnn.cell_loop_kept_share"], m["rnn.probe_speedup"]
    part = min(m["rnn.probe_layer_share"], span)
    s = span / (span - part + part / r)
    want = max(1.0, min(1 / (1 - span + span / s), fix["gain"]["ceiling"]))
    assert fix["gain"]["expected"] == pytest.approx(want, rel=2e-3)
    assert any(n.startswith("timed the script's LSTMCell layer and the layers called as often around it (Linear) "
                            "after the run") for n in doc["run"]["notes"])
