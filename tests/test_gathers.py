"""Rows gathered by advanced indexing on a CPU (gather.*, PD386): x[idx] and its backward, measured
on a trace torch records here, and no finding where the script gathers with index_select."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs import recorded

pytestmark = pytest.mark.torch

# A message-passing GNN over a random edge list (N nodes, E edges, F features) gathering with GATHER
GNN_MODEL = """
import sys, torch, torch.nn as nn
torch.manual_seed(0)
N, E, F = SIZES
src, dst = torch.randint(0, N, (E,)), torch.randint(0, N, (E,))
x, y = torch.randn(N, F), torch.randint(0, 7, (N,))
class Layer(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(F, F)
    def forward(self, h):
        return torch.relu(torch.zeros_like(h).index_add_(0, dst, GATHER))
model = nn.Sequential(Layer(), Layer(), nn.Linear(F, 7))
opt = torch.optim.Adam(model.parameters(), 1e-2)
"""
PROFILED = """
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        prof.step()
"""


def gnn(gather: str, sizes: str = "4000, 40000, 32", loop: str = PROFILED) -> str:
    """The GNN's script: `gather` the rows as "self.lin(h)[src]" or "self.lin(h).index_select(0, src)"."""
    return GNN_MODEL.replace("SIZES", sizes).replace("GATHER", gather) + loop


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
    names, doc = recorded(tmp_path, gnn("self.lin(h)[src]"))
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
    names, doc = recorded(tmp_path, gnn("self.lin(h).index_select(0, src)"))
    assert "aten::index_select" in names and "aten::index" not in names
    m = doc["traces"][0]["metrics"]
    assert m["gather.index_share"] is None and m["gather.index_backward_share"] is None
    assert "PD386" not in {f["id"] for f in doc["findings"]}


# --- tune's gather_select trial (PD386): x[idx] gathered with index_select ---------------------

INDEXING = r"""
import torch
x = torch.randn(6, 3, requires_grad=True)
idx = torch.tensor([4, 0, 4, 2])
got = x[idx]
same = torch.equal(got, x.detach().index_select(0, idx))
got.sum().backward()
counts = x.grad[:, 0].tolist()
neg = x[torch.tensor([-1])]                 # negative row numbers: torch's own indexing
mask = x[torch.tensor([True, False, True, False, False, False])]
print(same, counts, got.grad_fn.name(), neg.shape[0], mask.shape[0])
"""


def test_gather_select_gathers_the_same_rows_with_index_select(tmp_path, capfd):
    from tunecases import injected
    out, inj = injected(tmp_path, capfd, {"gather_select": True}, INDEXING)
    bare_out, bare = injected(tmp_path, capfd, {}, INDEXING)
    assert out.split() == ["True", "[1.0,", "0.0,", "1.0,", "0.0,", "2.0,", "0.0]", "IndexSelectBackward0", "1", "2"]
    assert bare_out.split()[-3:] == ["IndexBackward0", "1", "2"] and bare_out.split()[:7] == out.split()[:7]
    assert "gather_select" in inj["applied"] and "gather_select" not in bare["applied"]
    from perfdoctor.tune.apply import apply_text
    assert apply_text({"gather_select": True}, inj, cuda=False).startswith("x.index_select(0, idx)  # instead of x[idx]")


def test_a_report_with_pd386_plans_the_gather_trial():
    from tunecases import planned_once
    planned_once("PD386", "gather_select", "indexing", gathers=True)


LIVE_GNN = gnn("self.lin(h)[src]", "8000, 100000, 64", """
for _ in range(400):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.mark.slow
@pytest.mark.quiet      # it judges a speed-up: beside another test's run the trial measured 0.91x (1.80x alone)
def test_tune_measures_gathering_with_index_select(tmp_path):
    """The GNN run by tune: the trial rewrites its h[src] as index_select,
    and the trial is measured under PD386's ceiling."""
    from tunecases import ptune
    script = tmp_path / "gnn.py"
    script.write_text(LIVE_GNN)
    # runs of 3 s of steps (5-8 s with start-up and the report): the trial needs two (it and the
    # closing baseline) after the baseline; the 1.8x it measures needs no longer runs
    r = ptune("--only", "PD386", "--budget", "50", "--duration", "3", "--out", tmp_path / "t", "-o", tmp_path / "t.json",
              script)
    assert r.returncode in (0, 3), r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    trial = next(t for t in doc["trials"] if t["changes"] == {"gather_select": True})
    assert trial["rule"] == "PD386" and trial["predicted"] is None and trial["speedup"] is not None, trial
    assert "gather_select" in json.loads((Path(trial["dir"]) / "inject.json").read_text())["applied"]
    # measured 1.80x [1.74, 1.85] on the 2-core VM; under the ceiling the report gave
    assert trial["speedup"] > 1.0, trial
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    pd386 = next(f for f in report["findings"] if f["id"] == "PD386")
    # the ceiling scales the traced share by the profiler's inflation of the step: where that
    # reaches the whole step (a CI run: 0.73 of a step the trace made 1.51x longer), none is given
    ceiling = pd386["gain"]["ceiling"]
    if ceiling is None:
        assert pd386["gain"]["ceiling_share"] == 1.0 and "no ceiling from this trace" in pd386["gain"]["text"]
    else:
        assert trial["speedup"] <= ceiling * 1.1
