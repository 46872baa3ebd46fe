"""Per-sample gradients taken one sample at a time (PD382) against gradient accumulation over
micro-batches of one: both call the model at batch one with a pass per call, and only the passes
that begin from no gradients tell them apart (loop.fresh_passes_per_step)."""

from __future__ import annotations

import pytest
from runs import child, prun, report

# 16 samples a step from a tensor, an MLP called on one sample at a time, then one SGD step.
# --grad: torch.autograd.grad per sample, each gradient clipped and summed (DP-SGD by hand);
# --zero: backward() per sample, the gradient read from .grad and zeroed (the same, by hand);
# --accum: backward() per sample into .grad, no reset (gradient accumulation at micro-batch one).
SCRIPT = r"""
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
mode = sys.argv[1]
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt, crit = torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss()
params = list(model.parameters())
X, Y = torch.randn(512, 16), torch.randint(0, 4, (512,))
for step in range(40):
    idx = torch.randint(0, 512, (16,))
    xb, yb = X[idx], Y[idx]
    opt.zero_grad()
    summed = [torch.zeros_like(p) for p in params]
    for i in range(16):
        loss = crit(model(xb[i:i + 1]), yb[i:i + 1])
        if mode == "--grad":
            gs = torch.autograd.grad(loss, params)
        elif mode == "--zero":
            loss.backward()
            gs = [p.grad.clone() for p in params]
            model.zero_grad()
        else:
            (loss / 16).backward()
            continue
        scale = torch.clamp(1.0 / (torch.sqrt(sum((g * g).sum() for g in gs)) + 1e-6), max=1.0)
        for s, g in zip(summed, gs):
            s.add_(g * scale)
    if mode != "--accum":
        for p, s in zip(params, summed):
            p.grad = s / 16
    opt.step()
print("done", mode)
"""


@pytest.mark.parametrize("mode,fresh", [("--grad", 16), ("--zero", 16), ("--accum", 1)])
def test_per_sample_gradients_are_told_from_accumulation(tmp_path, mode, fresh):
    script = tmp_path / "psg.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    r = prun("--no-trace", script, mode, out=out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"done {mode}\n"
    calls = child(out)["root_calls"]
    assert (calls["calls"], calls["batch"], calls["passes"], calls["fresh_passes"]) == (16, 1, 16, fresh)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.fresh_passes_per_step"] == fresh and m["loop.backward_passes_per_step"] == 16
    ids = [f["id"] for f in doc["findings"]]
    assert "PD353" not in ids                  # a pass per call: no per-sample loop of summed losses
    if fresh == 1:
        assert "PD382" not in ids
        return
    fix = next(f for f in doc["findings"] if f["id"] == "PD382")
    wait = m["run.data_wait_share"]
    assert fix["gain"]["expected"] is None     # how the ops scale from one sample to 16: not in a run at one
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (wait + (1 - wait) / 16), rel=1e-3)
