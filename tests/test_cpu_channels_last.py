"""Convolutions on NCHW tensors on the CPU (PD392): their share of the step from a trace
(analyze/cpuops.py, cpu.conv_nd_share), the memory format their inputs came in from the module
census (collect/convlayout.py, loop.conv_channels_last_share), and tune's trial of it."""

from __future__ import annotations

import pytest
from runs import child, prun_script, recorded, report

torch = pytest.importorskip("torch")

# a small CNN trained on the CPU, recording its own trace (3 steps); CONV picks the layers
CNN = r"""
import sys, torch, torch.nn as nn
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
CONV = {conv}
net = nn.Sequential(CONV(3, 16, 3, padding=1), nn.ReLU(), CONV(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                    nn.LazyLinear(10))
x, y = torch.randn({shape}), torch.randint(0, 10, (16,))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
def step():
    opt.zero_grad(); nn.functional.cross_entropy(net(x), y).backward(); opt.step()
step()
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(3):
        step(); p.step()
p.export_chrome_trace(sys.argv[1])
"""


def test_a_trace_sizes_2d_convolutions_and_offers_channels_last_not_for_1d(tmp_path):
    """Conv2d layers on 32x32 images: most of the step, forward and backward, and PD392 is offered
    with no modelled gain (tune measures it); the same net of Conv1d layers (3-D tensors, which no
    memory format reorders) gets no share and no PD392."""
    shares, fixes = {}, {}
    for name, conv, shape in (("2d", "nn.Conv2d", "16, 3, 32, 32"), ("1d", "nn.Conv1d", "16, 3, 256")):
        (tmp_path / name).mkdir()
        names, doc = recorded(tmp_path / name, CNN.format(conv=conv, shape=shape))
        m = doc["traces"][0]["metrics"]
        shares[name] = (m["cpu.conv_nd_share"], m["cpu.gemm_conv_share"])
        fixes[name] = {f["id"]: f for f in doc["findings"]}
    nd, gemm = shares["2d"]
    assert 0.15 <= nd <= gemm <= 1 and shares["1d"][0] == 0.0 and shares["1d"][1] > 0.15
    f = fixes["2d"]["PD392"]
    assert f["gain"]["expected"] is None and f["gain"]["share"] == pytest.approx(nd, abs=1e-3)
    assert "PD392" not in fixes["1d"]


LIVE = r"""
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                    nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)){convert}
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(16, 3, 32, 32){convert}, torch.randint(0, 10, (16,))
for _ in range(30):
    opt.zero_grad(); nn.functional.cross_entropy(net(x), y).backward(); opt.step()
"""


def test_a_run_reads_the_convolutions_input_format_and_offers_channels_last_only_on_nchw(tmp_path):
    """`perfdoctor run` sees each convolution call's input format: NCHW inputs, PD392 offered;
    the same net and batches in channels_last, every call seen so, nothing offered."""
    for convert, share in (("", 0.0), (".to(memory_format=torch.channels_last)", 1.0)):
        d = tmp_path / f"cl{share}"
        d.mkdir()
        _, out = prun_script(d, "cnn.py", LIVE.format(convert=convert), opts=("--no-stacks",), trace=True)
        assert child(out)["root_calls"]["conv_layout"] == {"calls": 2, "channels_last": int(2 * share)}
        doc = report(out)
        m = doc["traces"][0]["metrics"]
        assert m["loop.conv_channels_last_share"] == share and m["cpu.conv_nd_share"] >= 0.15
        assert ("PD392" in {f["id"] for f in doc["findings"]}) is (share == 0.0)


def test_an_input_in_both_formats_or_neither_tells_nothing():
    """1x1 images (a DCGAN generator's first layer) are contiguous in both formats, and a strided
    view in neither: such calls are not counted."""
    from perfdoctor.collect.convlayout import ConvLayouts
    conv = torch.nn.Conv2d(4, 4, 1)
    seen = ConvLayouts(torch, (torch.nn.Conv2d,))
    seen.call(conv, (torch.randn(2, 4, 1, 1),), {})
    seen.call(conv, (torch.randn(2, 4, 8, 16)[..., ::2],), {})
    seen.call(torch.nn.Linear(2, 2), (torch.randn(2, 2),), {})
    assert seen.result() is None
    seen.call(conv, (), {"input": torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)})
    seen.call(conv, (torch.randn(2, 4, 8, 8),), {})
    assert seen.result() == {"calls": 2, "channels_last": 1}
