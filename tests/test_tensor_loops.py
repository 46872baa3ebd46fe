"""A Python loop updating tensors one at a time outside the optimizer (analyze/tensorloops.py,
PD380), on traces torch records on the CPU and on hand-built ones."""

from __future__ import annotations

import json

import pytest
from kineto import HandTrace
from runs import recorded

from perfdoctor.diagnose.offline import diagnose_path

# 8 blocks (Linear, LayerNorm, GELU): 32 tensors; an EMA of them by mul_/add_ after each step
EMA = """
import copy, sys, torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())])
ema = copy.deepcopy(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
x, y = torch.randn(32, 64), torch.randn(32, 64)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.99).add_(p, alpha=0.01)
        prof.step()
"""

# No update loop, though ops repeat in place: a forward pass of 16 residual blocks (Linear, GELU)
# whose outputs add their inputs in place, a for-loop SGD (its per-tensor add_ inside Optimizer.step), and gradients
# zeroed by hand, a zero_ per tensor (moves only: no arithmetic)
NO_LOOP = """
import sys, torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(16)])
opt = torch.optim.SGD(blocks.parameters(), lr=0.01, foreach=False)
x = torch.randn(32, 64)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        h = x
        for b in blocks:
            y = b(h)
            y.add_(h)
            h = y
        h.pow(2).mean().backward()
        opt.step()
        for p in blocks.parameters():
            p.grad.zero_()
        prof.step()
"""


def _plain_walk(path) -> tuple[float, float]:
    """The EMA's share of the profiled steps and the share of the gaps between its ops, by a plain
    walk of the events: the outermost mul_/add_ ops of each step (the script has no others)."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    span = gaps = 0.0
    for s in steps:
        inside = sorted((e for e in ev if e.get("cat") == "cpu_op" and s["ts"] <= e["ts"] < s["ts"] + s["dur"]),
                        key=lambda e: (e["ts"], -e["dur"]))
        top, end = [], float("-inf")
        for e in inside:
            if e["ts"] >= end:
                top.append(e)
                end = e["ts"] + e["dur"]
        loop = [e for e in top if e["name"] in ("aten::mul_", "aten::add_")]
        assert len(loop) == 64, [e["name"] for e in loop]
        span += loop[-1]["ts"] + loop[-1]["dur"] - loop[0]["ts"]
        gaps += sum(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(loop, loop[1:]))
    total = sum(s["dur"] for s in steps)
    return span / total, gaps / total


def test_an_ema_loop_is_found_with_its_tensors_and_offered_multi_tensor_ops(tmp_path):
    _, doc = recorded(tmp_path, EMA)
    m = doc["traces"][0]["metrics"]
    assert (m["tensorloop.tensors"], m["tensorloop.ops_per_tensor"]) == (32, 2)
    share, gaps = _plain_walk(tmp_path / "t.json")
    assert m["tensorloop.share"] == pytest.approx(share, rel=1e-3)
    assert m["tensorloop.gap_share"] == pytest.approx(gaps, rel=1e-3) and 0 < gaps < share
    fix = next((f for f in doc["findings"] if f["id"] == "PD380"), None)
    if share >= 0.05:                       # the loop is ~10% of this step; a loaded machine may shift it
        assert fix is not None
        expected = 1 / (1 - (gaps + (share - gaps) / 2))
        assert fix["gain"]["expected"] == pytest.approx(expected, rel=1e-3)
        assert fix["gain"]["ceiling"] == pytest.approx(1 / (1 - share), rel=1e-3)


# YOLOv5's ModelEMA: both models' state_dict() walked each step (a detach per tensor, buffers
# too), then `v *= d; v += (1 - d) * msd[k].detach()` per floating-point tensor. The profiler
# steps at the optimizer's step, as `perfdoctor run` places its boundary: each step starts with it.
STATE_DICT_EMA = """
import copy, sys, torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(*[m for _ in range(6) for m in (nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))])
ema = copy.deepcopy(model).eval()
opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
x = torch.randn(4, 8, 8, 8)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(4):
        model(x).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
        prof.step()
        with torch.no_grad():
            msd = model.state_dict()
            for k, v in ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= 0.99
                    v += 0.01 * msd[k].detach()
"""


def test_the_state_dict_walks_before_an_ema_loop_are_part_of_it(tmp_path):
    """6 convolutions and 6 batch norms: 30 floating-point tensors (the counters are left out),
    4 ops each; the loop runs from the state_dict() walks' first detach to its last add_."""
    _, doc = recorded(tmp_path, STATE_DICT_EMA)
    m = doc["traces"][0]["metrics"]
    assert (m["tensorloop.tensors"], m["tensorloop.ops_per_tensor"]) == (30, 4)
    ev = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    span = 0.0
    for s in steps:
        ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and s["ts"] <= e["ts"] < s["ts"] + s["dur"]),
                     key=lambda e: (e["ts"], -e["dur"]))
        names = [e["name"] for e in ops]
        loop = ops[:names.index("aten::conv2d")]          # before the forward pass: the EMA
        assert loop[0]["name"] == "aten::detach" and loop[-1]["name"] == "aten::add_"
        span += max(e["ts"] + e["dur"] for e in loop) - loop[0]["ts"]
    assert m["tensorloop.share"] == pytest.approx(span / sum(s["dur"] for s in steps), rel=1e-3)


def test_ops_repeated_in_place_by_a_forward_pass_an_optimizer_or_a_zeroing_loop_are_no_update_loop(tmp_path):
    names, doc = recorded(tmp_path, NO_LOOP)
    assert {"aten::add_", "aten::zero_", "Optimizer.step#SGD.step"} <= names
    m = doc["traces"][0]["metrics"]
    assert m["tensorloop.share"] == 0 and m["tensorloop.tensors"] is None
    assert "PD380" not in [f["id"] for f in doc["findings"]]


def test_a_soft_update_counts_its_four_ops_a_tensor_and_copies_alone_do_not(tmp_path):
    """A target network's soft update (tau * p + (1 - tau) * tp, copied into tp: mul, mul, add,
    copy_) over 20 tensors; then DDP's reducer copying 40 gradients into their buckets (copy_
    alone, no arithmetic: HTA's ResNet traces hold 81 in a row)."""
    tr = HandTrace()
    for i in range(3):
        s0 = i * 10000.0
        tr.op(1, s0, "aten::linear", 2000)
        t = s0 + 2100
        for _ in range(20):
            for name in ("aten::mul", "aten::mul", "aten::add", "aten::copy_"):
                tr.op(1, t, name, 10)
                t += 15
        tr.op(1, t, "aten::cross_entropy_loss", 100)
        t += 105
        for _ in range(40):
            tr.op(1, t, "aten::copy_", 10)
            t += 12
        tr.step(i, s0, s0 + 10000)
    p = tmp_path / "soft.json"
    tr.write(p)
    m = diagnose_path(str(p))["traces"][0]["metrics"]
    assert (m["tensorloop.tensors"], m["tensorloop.ops_per_tensor"]) == (20, 4)
    assert m["tensorloop.share"] == pytest.approx((80 * 15 - 5) / 10000)
    assert m["tensorloop.gap_share"] == pytest.approx(79 * 5 / 10000)
