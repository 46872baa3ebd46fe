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
from runs import bare, child, prun, report, steps

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


def _ours(files: list) -> list:
    """The files of perfdoctor's own among `files` (a clone named perfdoctor holds torch too)."""
    ours = str(Path(perfdoctor.__file__).resolve().parent)
    return [f for f in files if str(Path(f).resolve()).startswith(ours)]


def _bare_and_watched(tmp_path, name: str, text: str):
    """The script run bare and under `perfdoctor run --no-trace`: (Dynamo's counters bare, under
    run, the run directory, run's result)."""
    pytest.importorskip("torch")
    script = tmp_path / name
    script.write_text(text)
    b = bare(script)
    assert b.returncode == 0, b.stderr
    out = tmp_path / "run"
    r = prun("--no-trace", script, out=out)
    assert r.returncode == 0, r.stderr
    return _dynamo(b.stdout), _dynamo(r.stdout), out, r


def test_a_compiled_step_compiles_as_it_does_bare_and_its_steps_are_seen(tmp_path):
    alone, watched, out, _ = _bare_and_watched(tmp_path, "compiled_step.py", SCRIPT)
    assert watched["breaks"] == alone["breaks"] and watched["graphs"] == alone["graphs"]
    assert not _ours(watched["files"])                     # none of our frames
    assert set(watched["files"]) <= set(alone["files"])
    assert alone["breaks"] and alone["graphs"] >= 2          # torch breaks at backward and in Optimizer.step
    recs = steps(out)
    assert len(recs) >= 55 and {s["mode"] for s in recs} == {"backward"}
    # the step source's note, as the child wrote it (the terminal wraps it at its width)
    assert any("inside torch.compile'd code" in n for n in child(out)["notes"])
    # a step compiled whole is no model compiled in place: its graphs were counted (PD226 stays off)
    assert child(out)["root_calls"] is None or not child(out)["root_calls"].get("compiled_in_place")
    assert "PD226" not in [f["id"] for f in report(out)["flags"]]


# A policy called once per action, as an RL rollout calls it: many outermost calls a step, each
# counted by the census (collect/modules.py) in the counted step. COMPILE is how it is compiled.
PER_CALL = r"""
import json, sys, torch, torch.nn as nn
import torch._dynamo.convert_frame as cf
converted = []
orig = cf.ConvertFrame.__call__
def convert(self, frame, *a, **k):
    converted.append(frame.f_code.co_filename)
    return orig(self, frame, *a, **k)
cf.ConvertFrame.__call__ = convert
_compile = torch.compile               # the eager backend: Dynamo's work without Inductor's minutes
torch.compile = lambda model=None, **kw: _compile(model, **{**kw, "backend": "eager"})
torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
COMPILE
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
for step in range(30):
    logps = [torch.log_softmax(policy(torch.randn(4)), -1)[0] for t in range(12)]
    loss = -torch.stack(logps).sum()
    opt.zero_grad(); loss.backward(); opt.step()
from torch._dynamo.utils import counters
print("DYNAMO " + json.dumps({"breaks": dict(counters["graph_break"]), "graphs": counters["stats"]["unique_graphs"],
                              "files": sorted(set(converted))}), flush=True)
"""




def test_a_model_compiled_in_place_never_compiles_the_census(tmp_path):
    """model.compile() of an nn.Sequential runs its layers eagerly under Dynamo's frame callback (on
    torch 2.13 it compiles none of torch's own frames): the census the class wrapper calls there
    in the counted step was handed to Dynamo as a frame of its own, guarded on its counts and
    recompiled at every call up to Dynamo's recompile limit (a user's REINFORCE loop)."""
    alone, watched, out, r = _bare_and_watched(tmp_path, "inplace.py", PER_CALL.replace("COMPILE", "policy.compile()"))
    assert not _ours(watched["files"]), watched["files"]
    assert watched["graphs"] == alone["graphs"] and watched["breaks"] == alone["breaks"]
    assert "recompile_limit" not in r.stderr
    rc = child(out)["root_calls"]
    assert rc["calls"] == 12                                       # the census still counted the step
    # and it compiled nothing: the run says so (PD226), from Dynamo's own count
    assert (rc["compiled_in_place"], rc["dynamo_graphs"], alone["graphs"]) == (True, 0, 0)
    flags = [f["id"] for f in report(out)["flags"]]
    assert "PD226" in flags


def test_tunes_compile_trial_compiles_as_torch_compile_of_the_model_does(tmp_path, capfd):
    """The compile trial runs the model through torch.compile(model), as a user's
    `model = torch.compile(model)` does: the graphs Dynamo makes, and no frame of ours, are those
    of the script compiling its model itself. (It had compiled the model in place: nothing at all
    of an nn.Sequential, and the trial measured Dynamo's frame callback around eager layers.)"""
    from tunecases import launch
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    (wrapped / "by_hand.py").write_text(PER_CALL.replace("COMPILE", "policy = torch.compile(policy)"))
    b = bare(wrapped / "by_hand.py")
    assert b.returncode == 0, b.stderr
    res, d = launch(tmp_path, {"compile": True}, max_steps=None, script_text=PER_CALL.replace("COMPILE", ""))
    out = capfd.readouterr().out
    assert res.exit_code == 0
    by_hand, trial = _dynamo(b.stdout), _dynamo(out)
    assert trial["graphs"] == by_hand["graphs"] >= 1 and trial["breaks"] == by_hand["breaks"]
    assert not _ours(trial["files"]), trial["files"]
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["compile"] and inj["losses"][-1] != inj["losses"][0]
