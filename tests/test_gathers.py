"""Rows gathered by advanced indexing on a CPU (gather.*, PD386): x[idx] and its backward, measured
on a trace torch records here, and no finding where the script gathers with index_select."""

from __future__ import annotations

import json

import pytest
from runs import recorded

pytestmark = pytest.mark.torch

# A message-passing GNN over a random edge list; argv[2]: "index" gathers with h[src], "select"
# with h.index_select(0, src) (the same rows)
GNN = """
import sys, torch, torch.nn as nn
torch.manual_seed(0)
N, E, F = 4000, 40000, 32
src, dst = torch.randint(0, N, (E,)), torch.randint(0, N, (E,))
x, y = torch.randn(N, F), torch.randint(0, 7, (N,))
class Layer(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(F, F)
    def forward(self, h):
        m = self.lin(h).index_select(0, src) if sys.argv[2] == "select" else self.lin(h)[src]
        return torch.relu(torch.zeros_like(h).index_add_(0, dst, m))
model = nn.Sequential(Layer(), Layer(), nn.Linear(F, 7))
opt = torch.optim.Adam(model.parameters(), 1e-2)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        prof.step()
"""


def _by_hand(trace) -> tuple[float, float]:
    """(index + IndexBackward0, IndexBackward0) time inside the ProfilerStep spans / their time."""
    ev = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    total = sum(s["dur"] for s in steps)

    def inside(e):
        return any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)
    fwd = sum(e["dur"] for e in ev if e["name"] == "aten::index" and e.get("cat") == "cpu_op" and inside(e))
    back = sum(e["dur"] for e in ev if e["name"] == "autograd::engine::evaluate_function: IndexBackward0"
               and e.get("cat") == "cpu_op" and inside(e))
    return (fwd + back) / total, back / total


def test_a_gnn_gathering_with_advanced_indexing_is_offered_index_select(tmp_path):
    names, doc = recorded(tmp_path, GNN.replace('sys.argv[2] == "select"', "False"))
    assert "autograd::engine::evaluate_function: IndexBackward0" in names
    m = doc["traces"][0]["metrics"]
    share, back = _by_hand(tmp_path / "t.json")
    assert m["gather.index_share"] == pytest.approx(share, rel=0.05)
    assert m["gather.index_backward_share"] == pytest.approx(back, rel=0.05)
    assert 0 < m["gather.index_backward_share"] < m["gather.index_share"]
    assert m["gather.index_share"] >= 0.1
    f = next(f for f in doc["findings"] if f["id"] == "PD386")
    # no expected gain; the ceiling: the share removed (no profiler inflation without a live run)
    assert f["gain"]["expected"] is None
    assert f["gain"]["ceiling"] == pytest.approx(1 / (1 - m["gather.index_share"]), rel=1e-4)


def test_the_same_gnn_gathering_with_index_select_gets_no_finding(tmp_path):
    names, doc = recorded(tmp_path, GNN.replace('sys.argv[2] == "select"', "True"))
    assert "aten::index_select" in names and "aten::index" not in names
    m = doc["traces"][0]["metrics"]
    assert m["gather.index_share"] is None and m["gather.index_backward_share"] is None
    assert "PD386" not in {f["id"] for f in doc["findings"]}
