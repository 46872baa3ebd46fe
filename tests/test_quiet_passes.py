"""The backward wrapper's fast path (hooks.Session.quiet_passes): in a loop whose steps follow
an optimizer, a backward pass has something to tell the session only in the census step (its
passes are counted) and while the trace records (the memory budget is checked inside the pass).
Otherwise the wrapper calls straight through: ~7 us a step less on a 0.3 ms step
(bench/bench_hooks.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the hooks need torch (test dependency)")

LOOP = r"""
import json, tempfile, torch
from perfdoctor.collect import hooks, passes
S = hooks.Session({"run_dir": tempfile.mkdtemp(), "skip": 4, "active": 2})
S.install(torch)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
entered = []
orig_enter = passes._enter
def spy(session, roots, fresh):
    entered.append(S.steps)
    return orig_enter(session, roots, fresh)
passes._enter = spy
rows = []
for i in range(14):
    rows.append([S.steps, S.quiet_passes, S.window.state, S.census.state])
    loss = model(torch.randn(8, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
S.finish("ok")
print(json.dumps({"rows": rows, "entered": entered,
                  "census": S.census.result, "recorded": S.window.info().get("recorded_steps")}))
"""


def test_backward_passes_are_watched_only_while_they_have_something_to_tell(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    rows, entered = got["rows"], got["entered"]
    watched = [steps for steps, quiet, _, _ in rows if not quiet]
    assert entered == watched                           # the slow path runs exactly when not quiet
    for steps, quiet, window, census in rows:
        # not quiet: before the optimizer's first step, in the census step, or while recording
        assert quiet == (steps > 0 and census == "done" and window != "recording"), (steps, quiet, window, census)
    assert any(w == "recording" for _, _, w, _ in rows) and got["recorded"] == 2
    assert sum(q for _, q, _, _ in rows) >= 8           # quiet around the trace window
    assert got["census"]["passes"] == 1                 # the census step still counted its pass
