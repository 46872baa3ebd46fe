"""A training step compiled whole (forward, backward and the optimizer step in one torch.compile'd
function) under `perfdoctor run`: Dynamo must compile what it compiles bare, no more, and the run
must still see the steps (collect/dynamoskip.py).

Before, Dynamo compiled the frames of perfdoctor's backward wrapper and of the bookkeeping it
calls (code run as Python inside a compiled call passes through Dynamo's frame callback), and
traced the optimizer-step hooks into the compiled step: extra frames and graph breaks, and a
small MLP's step ran 1.10-1.50x slower under `perfdoctor run --no-trace`. Dynamo's own counters
(graphs, graph breaks, the files of the frames it was handed) are compared, not times: the eager
backend compiles nothing, so they come in seconds and do not depend on the machine's load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from runs import bare, child, prun, steps

import perfdoctor

SCRIPT = r"""
import json, torch, torch.nn as nn
import torch._dynamo.convert_frame as cf
converted = []                      # the frames Dynamo was handed to compile: their files
orig = cf.ConvertFrame.__call__
def convert(self, frame, *a, **k):
    converted.append(frame.f_code.co_filename)
    return orig(self, frame, *a, **k)
cf.ConvertFrame.__call__ = convert
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 16), torch.randn(8, 4)

@torch.compile(backend="eager")
def train_step(x, y):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss

for step in range(60):
    loss = train_step(x, y)
from torch._dynamo.utils import counters
print("DYNAMO " + json.dumps({"breaks": dict(counters["graph_break"]), "graphs": counters["stats"]["unique_graphs"],
                              "files": sorted(set(converted))}), flush=True)
"""


def _dynamo(stdout: str) -> dict:
    return json.loads(re.search(r"^DYNAMO (.*)$", stdout, re.M).group(1))


def test_a_compiled_step_compiles_as_it_does_bare_and_its_steps_are_seen(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "compiled_step.py"
    script.write_text(SCRIPT)
    b = bare(script)
    assert b.returncode == 0, b.stderr
    out = tmp_path / "run"
    r = prun("--no-trace", script, out=out)
    assert r.returncode == 0, r.stderr
    alone, watched = _dynamo(b.stdout), _dynamo(r.stdout)
    assert watched["breaks"] == alone["breaks"] and watched["graphs"] == alone["graphs"]
    ours = str(Path(perfdoctor.__file__).resolve().parent)          # a clone named perfdoctor holds torch too
    assert not [f for f in watched["files"] if str(Path(f).resolve()).startswith(ours)]   # none of our frames
    assert set(watched["files"]) <= set(alone["files"])
    assert alone["breaks"] and alone["graphs"] >= 2          # torch breaks at backward and in Optimizer.step
    recs = steps(out)
    assert len(recs) >= 55 and {s["mode"] for s in recs} == {"backward"}
    # the step source's note, as the child wrote it (the terminal wraps it at its width)
    assert any("inside torch.compile'd code" in n for n in child(out)["notes"])
