"""gc.collect() called by the loop (PD384): timed by `perfdoctor run` (collect/timedcalls.py)
whether or not py-spy runs, and told from the loop's own data work in the stacks."""

from __future__ import annotations

import pytest
from runs import prun_script, report, steps

# gc.collect() after every step beside 200K Python tuples (a data set kept as Python objects)
SCRIPT = r"""
import gc, random, sys
import torch, torch.nn as nn
random.seed(0); torch.manual_seed(0)
data = [(random.random(), random.randint(0, 3)) for _ in range(200_000)]
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)
for step in range(30):
    y = torch.tensor([data[random.randrange(len(data))][1] for _ in range(32)])
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if "--every" not in sys.argv or step % 10 == 0:
        gc.collect()
print("done", gc.collect.__name__)
"""


def test_gc_collect_every_step_is_timed_and_offered_less_often(tmp_path):
    r, out = prun_script(tmp_path, "gcstep.py", SCRIPT)
    assert r.stdout == "done collect\n"                      # the wrapper keeps the builtin's name
    recs = steps(out)
    assert sum(1 for s in recs if s.get("gc", 0) > 0) >= 25   # each step's collection, timed
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["calls.gc_share"] > 0.5 and m["gc.share"] >= m["calls.gc_share"]
    first = doc["findings"][0]
    assert first["id"] == "PD384"
    assert first["gain"]["expected"] == pytest.approx(1 / (1 - 0.99 * m["gc.share"]), rel=1e-3)


def test_gc_collect_every_ten_steps_is_timed_in_those_steps(tmp_path):
    """Every ten steps the collections land in those steps alone; each one walks 200K tuples, so
    even then they are most of the steady time (a step's own work is well under a millisecond)."""
    r, out = prun_script(tmp_path, "gcstep.py", SCRIPT, "--every")
    assert r.returncode == 0
    timed = [s["step"] for s in steps(out) if s.get("gc", 0) > 0]
    assert 2 <= len(timed) <= 3 and all(b - a == 10 for a, b in zip(timed, timed[1:])), timed


def test_the_timing_wrapper_is_no_frame_of_the_stack():
    from perfdoctor.analyze.stackcause import classify, code_frames
    text = {3: "    gc.collect()"}
    source = lambda file, line: text.get(line, "") if file == "/home/u/t.py" else ""  # noqa: E731
    stack = (("<module>", "/home/u/t.py", 3),
             ("TimedCalls._wrap.<locals>.timed", "/venv/lib/python3.11/site-packages/perfdoctor/collect/timedcalls.py", 60))
    assert [f.func for f in code_frames(stack)] == ["<module>"]
    assert classify(stack, source, lambda f: [])[0] == "garbage_collection"
