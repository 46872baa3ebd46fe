"""The batch made in the loop, timed per step by `perfdoctor run`: from a step's start to the
model's first training call, less the DataLoader's wait (collect/nogradcalls.py first_call,
steps.jsonl `pre`, calls.pre_forward_share), and PD385 (a larger batch), which counts it as work
that grows with the batch."""

from __future__ import annotations

import json
import threading

import pytest

from perfdoctor.analyze.callshares import call_metrics
from perfdoctor.collect.nogradcalls import NogradClock
from perfdoctor.collect.steprecord import line
from runs import prun_script, report, steps

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):         # a class of its own: the clock wraps the class's __call__
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x)


def test_the_first_training_call_of_the_root_is_noted_once_a_step():
    clock = NogradClock(threading.get_ident())
    model, other = Net(), Net()
    clock.watch(model, torch)
    try:
        x = torch.randn(3, 4)
        with torch.no_grad():
            model(x)                                   # an evaluation: not a training call
        other(x)                                       # another instance of the class
        t = threading.Thread(target=lambda: model(x))  # another thread
        t.start()
        t.join()
        assert clock.first_call() is None
        model(x)
        first = clock.first
        model(x)                                       # the second call keeps the first's time
        assert first is not None and clock.first_call() == first and clock.first_call() is None
    finally:
        clock.undo()


def test_the_time_before_the_forward_is_a_field_of_the_step_and_a_share():
    mark = (0.0, 0.0, 0, 0.0, None)
    rec = json.loads(line(1, mark, (0.01, 0.0, 0, 1.0, None), 0.01, "optimizer", False, False, False, pre=0.004))
    assert rec["pre"] == 0.004
    steps_ = [{"dur": 0.01, "pre": 0.004, "mode": "optimizer"}, {"dur": 0.01, "pre": 0.002, "mode": "optimizer"}]
    assert call_metrics(steps_, True, False, True, pre_timed=True)["calls.pre_forward_share"] == pytest.approx(0.3)
    assert call_metrics(steps_, True, False, True)["calls.pre_forward_share"] is None    # an older run: not timed


AUGMENTED = """
import numpy as np, torch, torch.nn as nn
rng = np.random.default_rng(0)
images = [rng.random((3, 32, 32), dtype=np.float32) for _ in range(1000)]
labels = rng.integers(0, 10, 1000)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(16, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(250):
    idx = rng.choice(1000, 64, replace=False)
    batch = [images[i] + 0.01 * rng.standard_normal((3, 32, 32), dtype=np.float32) for i in idx]
    x = torch.from_numpy(np.stack(batch))
    y = torch.from_numpy(labels[idx])
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""

LOADED = """
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(data, batch_size=16, shuffle=True):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""


@pytest.mark.slow
@pytest.mark.quiet      # a share of the step, as the conversion's (test_tensor_convert.py)
def test_a_batch_augmented_in_the_loop_is_not_a_fixed_cost(tmp_path):
    """64 images augmented in numpy before the model's call: ~40% of the step, which a doubled
    batch doubles (measured 0.98-1.16x in samples per second, where PD385 expected 1.41x)."""
    r, out = prun_script(tmp_path, "augmented.py", AUGMENTED, opts=("--no-stacks",), trace=True)
    assert r.stdout == "done\n"
    recs = steps(out)
    assert sum(1 for s in recs if s.get("pre", 0) > 0) > len(recs) / 2
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["calls.pre_forward_share"] > 0.2, m["calls.pre_forward_share"]
    assert "PD385" not in [f["id"] for f in doc["findings"]]


@pytest.mark.slow
def test_a_loop_over_a_dataloader_makes_no_batch_before_the_forward(tmp_path):
    """The loader's wait is data wait, not the batch made in the loop."""
    _, out = prun_script(tmp_path, "loaded.py", LOADED)
    m = report(out)["traces"][0]["metrics"]
    assert m["calls.pre_forward_share"] is not None and m["calls.pre_forward_share"] < 0.1, m
    assert m["run.data_wait_share"] > m["calls.pre_forward_share"]
