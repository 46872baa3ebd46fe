"""A loop over time steps is no loop over samples (analyze/recurrence.py, stacks.recurrent_loop_share):
the source of the loop py-spy sampled says whether each iteration needs the one before, which a
trace cannot tell; PD365 (vectorise the per-sample loop) steps aside for a recurrence."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
from test_stacks import SITE, _ev, needs_py_spy

from perfdoctor.analyze.recurrence import recurrent, recurrent_lines, trains
from perfdoctor.analyze.stacks import attribute


def _loops(src: str) -> list[bool]:
    tree = ast.parse(textwrap.dedent(src))
    return [recurrent(n) for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))]


@pytest.mark.parametrize("src,want", [
    # a mass-spring simulation's integration steps (positions read before their update), and the
    # springs loop inside them, which carries nothing (an in-place write through a subscript)
    ("""
     for _ in range(steps):
         forces = torch.zeros_like(positions)
         for (i, j, r, k) in springs:
             xi, xj = positions[i], positions[j]
             forces[i] += xj - xi
         velocities = velocities + forces * dt
         positions = (positions +
                      velocities * dt)
     """, [True, False]),
    # a hand-written RNN: the name inside a call
    ("""
     for t in range(T):
         h = torch.tanh(x[t] @ w + h @ u)
         outs.append(h)
     """, [True]),
    # a rollout: the state the policy reads is the environment's last answer
    ("""
     while not done:
         action = policy(state)
         state, reward, done = env.step(action)
     """, [True]),
    # running sums batch: a per-sample contrastive loss, a loss and a count summed by hand
    ("""
     for i in range(a.shape[0]):
         sims = b @ a[i] / tau
         total = total - sims[i] + torch.logsumexp(sims, 0)
     """, [False]),
    ("""
     for i in range(n):
         y = model(x[i:i + 1])
         loss = loss + crit(y, t[i])
         correct += (y.argmax() == t[i]).sum()
     """, [False]),
    # a running max, min or product batches too (a max over the batch)
    ("""
     for i in range(n):
         s = score(x[i])
         best = max(best, s)
         top = torch.maximum(top, s)
         p = p * s
         q *= s
     """, [False]),
    # `x = c / x` is no running product, and an EMA reads its name inside a product
    ("""
     for t in range(n):
         x = c / x
     """, [True]),
    ("""
     for t in range(n):
         h = h * 0.9 + x[t]
     """, [True]),
    # a value only handed on (the last sample, for a difference) depends on no earlier iteration
    ("""
     for t in range(n):
         x = data[t]
         d = x - prev
         out.append(d)
         prev = x
     """, [False]),
    # ... unless what is handed on came from it: through a buffer written by subscript or by a
    # method, under a test that reads it, or two names that feed each other
    ("""
     for t in range(n):
         buf = torch.zeros(3)
         buf[0] = state[0]
         state = buf * 2
     """, [True]),
    ("""
     for t in range(n):
         buf = torch.zeros(3)
         buf.copy_(state)
         state = buf * 2
     """, [True]),
    ("""
     for t in range(n):
         if state > 0:
             y = 1
         else:
             y = 2
         state = y + x[t]
     """, [True]),
    ("""
     for t in range(n):
         a, b = b, a + b
     """, [True]),
    # a sum read by another statement before its update is a recurrence (scaled by it)
    ("""
     for i in range(n):
         y = x[i] * total
         total = total + y
     """, [True]),
    # the loop's own target, and a name read in the loop's test
    ("""
     for i in range(n):
         i = i + 1
     """, [False]),
    ("""
     while err > tol:
         err = step(x)
     """, [True]),
])
def test_a_loop_that_carries_a_value_is_recurrent(src, want):
    assert _loops(src) == want


def test_the_training_loops_lines_are_left_out_and_its_inner_loops_judged_alone(tmp_path):
    """A training loop carries its running loss (an EMA: a recurrence by the rule), but that says
    nothing of a per-sample loss inside it; a simulation in the model's forward stays recurrent."""
    src = textwrap.dedent("""\
        def forward(p, v, steps):
            for _ in range(steps):
                v = v + force(p)
                p = p + v
            return p

        ema = 0.0
        for batch in loader:
            total = 0
            for i in range(len(batch)):
                total = total + loss_of(batch[i])
            total.backward()
            ema = 0.9 * ema + 0.1 * total.item()
            opt.zero_grad()
        """)
    f = tmp_path / "train.py"
    f.write_text(src)
    tree = ast.parse(src)
    loops = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))), key=lambda n: n.lineno)
    assert [(n.lineno, recurrent(n), trains(n)) for n in loops] == [(2, True, False), (8, True, True),
                                                                     (10, False, False)]
    assert recurrent_lines(str(f)) == frozenset({3, 4})
    bad = tmp_path / "bad.py"
    bad.write_text("for x in y:\n    z = z +\n")
    assert recurrent_lines(str(bad)) == frozenset() and recurrent_lines(str(tmp_path / "gone.py")) == frozenset()


def test_the_share_is_the_forward_time_on_recurrent_lines(tmp_path):
    """Ten 100 ms steps: 50 ms in the model's forward on a line of its time loop, 30 ms on a line
    of the forward outside it, 20 ms in backward: 50 of the 80 ms of forward time recur."""
    f = tmp_path / "sim.py"
    f.write_text(textwrap.dedent("""\
        def forward(p, v):
            p = p * 2
            for _ in range(50):
                v = v + p
                p = p + v
            return p
        """))
    main = ("main", str(f), 1)
    call = ("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789)
    inner, outer = ("forward", str(f), 4), ("forward", str(f), 2)
    bwd = ("backward", SITE + "torch/_tensor.py", 625)
    ev = [_ev("B", 0, *main)]
    for k in range(10):
        t = k * 100_000
        ev += [_ev("B", t, *call), _ev("B", t, *inner), _ev("E", t + 50_000, *inner),
               _ev("B", t + 50_000, *outer), _ev("E", t + 80_000, *outer), _ev("E", t + 80_000, *call),
               _ev("B", t + 80_000, *bwd), _ev("E", t + 100_000, *bwd)]
    ev.append(_ev("E", 1_000_000, *main))
    t0 = 1000.0
    steps = [{"step": k + 1, "end": t0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": False} for k in range(10)]
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": t0, "events": ev}], {"pid": 1, "rate_hz": 100}, steps)
    assert rep.metrics["stacks.recurrent_loop_share"] == pytest.approx(50 / 80)


SIM = r"""
import torch

class Springs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rest = torch.nn.Parameter(torch.randn(3, 2))

    def forward(self, steps):
        p = torch.cat([torch.zeros(1, 2), self.rest])
        v = torch.zeros(4, 2)
        for _ in range(steps):
            d = p[1] - p[0]
            f = torch.zeros_like(p)
            f[1] -= 0.5 * d
            f[0] += 0.5 * d
            v = v + f * 0.01
            p = p + v * 0.01
        return p

model = Springs()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
target = torch.ones(4, 2)
for epoch in range(400):
    opt.zero_grad()
    loss = (model(40) - target).pow(2).mean()
    loss.backward()
    opt.step()
print("sim: done")
"""


@needs_py_spy
def test_a_simulations_time_steps_get_no_vectorising_advice_in_a_run_with_stacks(tmp_path):
    """pytorch/examples' mass_spring.py, in small: the model's forward integrates 40 time steps of
    a few row ops each. The trace reads a loop that takes rows; the stacks put the forward's time
    on the lines of a loop that carries positions and velocities: PD365 is not offered (it read
    ~9.71x on the original, whose recurrence does not batch). The trace alone still offers it."""
    script = tmp_path / "sim.py"
    script.write_text(SIM)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--out", str(out), str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "sim: done\n"
    doc = json.loads((out / "report.json").read_text())
    m = doc["traces"][0]["metrics"]
    if m["stacks.steady_steps"] is None:
        pytest.skip("no stacks recorded here: " + " ".join(doc["run"]["notes"]))
    assert m["cpu.loop_share"] >= 0.1 and m["cpu.loop_iterations"] >= 16, m["cpu.loop_share"]
    assert m["stacks.recurrent_loop_share"] > 0.5
    assert "PD365" not in {f["id"] for f in doc["findings"]}
    from perfdoctor.diagnose.offline import diagnose_path
    trace = next((out / "trace").glob("*.pt.trace.json*"))
    assert "PD365" in {f["id"] for f in diagnose_path(str(trace))["findings"]}
