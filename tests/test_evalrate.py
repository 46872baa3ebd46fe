"""The trace window's no-grad evaluation share taken to the run's rate (analyze/callshares.py
nograd_run_share, with the long-step part from analyze/evalforward.py): an evaluation every 20
steps that falls inside a 5-step trace window is 1 step in 5 there, 1 in 20 in the run. A no-grad
forward in every step (a teacher) beside a checkpoint every N steps is not scaled down."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.callshares import combined, nograd_run_share
from perfdoctor.analyze.evalforward import _in_long_steps
from runs import prun, report, steps


def test_an_evaluation_in_one_traced_step_is_the_long_steps_part():
    # 4 usual steps of 5 ms, one of 40 ms that holds a 34 ms no-grad evaluation
    dur, nograd = np.array([5.0, 5, 40, 5, 5]), np.array([0.0, 0, 34, 0, 0])
    got = _in_long_steps(dur, nograd, float(dur.sum()))
    assert got["evaluation.nograd_long_steps_share"] == pytest.approx(34 / 60)
    assert got["evaluation.nograd_long_steps_fraction"] == pytest.approx(34 / 35)


def test_a_teacher_every_step_beside_a_checkpoint_is_not_in_the_long_steps_part():
    # a 3 ms teacher in every step, a 20 ms checkpoint in the third: the long step holds no more
    dur, nograd = np.array([10.0, 10, 30, 10, 10]), np.array([3.0, 3, 3, 3, 3])
    got = _in_long_steps(dur, nograd, float(dur.sum()))
    assert got == {"evaluation.nograd_long_steps_share": 0.0, "evaluation.nograd_long_steps_fraction": 0.0}
    # the evaluation and a teacher together: only the evaluation's time beyond the teacher's
    got = _in_long_steps(dur, nograd + np.array([0, 0, 15, 0, 0]), float(dur.sum()))
    assert got["evaluation.nograd_long_steps_share"] == pytest.approx(15 / 70)
    assert got["evaluation.nograd_long_steps_fraction"] == pytest.approx(15 / 20)
    # no long step, or too few steps to tell one: unknown
    assert set(_in_long_steps(np.array([10.0, 11, 12]), np.array([3.0, 3, 3]), 33.0).values()) == {None}
    assert set(_in_long_steps(np.array([5.0, 40]), np.array([0.0, 34]), 45.0).values()) == {None}


RUN = {"loop.long_steps_every": 10.0, "loop.long_steps_traced": 1, "loop.long_steps_share": 0.36}


def test_the_window_share_is_taken_at_the_runs_rate():
    """The evaluation fills the long traced step's excess (fraction 1): its share of the run is
    the run's long steps' share, not the window's 57%."""
    m = {**RUN, "evaluation.nograd_forward_share": 0.57, "evaluation.nograd_long_steps_share": 0.57,
         "evaluation.nograd_long_steps_fraction": 1.0}
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.36)
    assert combined({**m, **nograd_run_share(m)})["evaluation.share"] == pytest.approx(0.36)
    # a checkpoint shares the long steps: the evaluation's part of them only
    m["evaluation.nograd_long_steps_fraction"] = 0.5
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.18)
    # a teacher in every step (0.10 of the window) and the evaluation: the teacher at the window's share
    m.update({"evaluation.nograd_forward_share": 0.67, "evaluation.nograd_long_steps_fraction": 1.0})
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.10 + 0.36)


def test_a_teacher_every_step_keeps_the_window_share():
    """The long steps (a checkpoint every 10 steps) hold no more no-grad work than the others."""
    m = {**RUN, "evaluation.nograd_forward_share": 0.3, "evaluation.nograd_long_steps_share": 0.0,
         "evaluation.nograd_long_steps_fraction": 0.0}
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.3)
    assert combined({**m, **nograd_run_share(m)})["evaluation.share"] == pytest.approx(0.3)


def test_a_no_grad_stretch_in_every_step_of_a_timed_run_is_the_steps_own_work():
    """An RL loop: 16 no-grad policy calls and a numpy environment between them in every step read
    "evaluate less often", 31% of the step, where the run's timed no-grad calls were 1.8% beyond
    the usual step's. A run that timed them (calls.nograd_share known) counts only what the long
    steps hold; a trace alone cannot tell a teacher from an evaluation and keeps the window's."""
    m = {**RUN, "calls.nograd_share": 0.018, "evaluation.nograd_forward_share": 0.31,
         "evaluation.nograd_long_steps_share": None, "evaluation.nograd_long_steps_fraction": None}
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == 0.0
    assert combined({**m, **nograd_run_share(m)})["evaluation.share"] == pytest.approx(0.018)
    # a teacher in every step (0.10) and an evaluation in the long steps: the evaluation alone
    m.update({"evaluation.nograd_forward_share": 0.67, "evaluation.nograd_long_steps_share": 0.57,
              "evaluation.nograd_long_steps_fraction": 1.0})
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.36)
    del m["calls.nograd_share"]
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.10 + 0.36)


@pytest.mark.parametrize("missing", [{"loop.long_steps_traced": 0}, {"loop.long_steps_traced": None},
                                     {"loop.long_steps_every": None}, {"loop.long_steps_share": None},
                                     {"evaluation.nograd_long_steps_share": None,
                                      "evaluation.nograd_long_steps_fraction": None}])
def test_without_the_runs_long_steps_the_window_share_stands(missing):
    m = {**RUN, "evaluation.nograd_forward_share": 0.57, "evaluation.nograd_long_steps_share": 0.57,
         "evaluation.nograd_long_steps_fraction": 1.0, **missing}
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == 0.57
    assert nograd_run_share({**m, "evaluation.nograd_forward_share": None})["evaluation.nograd_run_share"] is None


def test_a_trace_alone_keeps_the_window_share():
    m = {"evaluation.nograd_forward_share": 0.57, "evaluation.nograd_long_steps_share": 0.57,
         "evaluation.nograd_long_steps_fraction": 1.0}
    assert combined(m)["evaluation.share"] == 0.57


# An MLP evaluating a no-grad forward over 4096 rows after every 20th update (several training
# steps' time): with the default window (5 steps skipped, 5 traced) exactly one evaluation (loop
# index 7, recorded as step 8) falls in the traced steps 6-10: 1 step in 5 there, 1 in 20 in the
# run. (The profiler slows the usual step's many small ops more than the evaluation's large
# ones, which offsets part of that on CPU: a period of 10 left too little to tell apart on a
# loaded 2-core machine.)
EVAL_EVERY_20 = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
X, Y = torch.randn(2048, 256), torch.randint(0, 10, (2048,))
XV = torch.randn(4096, 256)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def evaluate():
    model.eval()
    with torch.no_grad():
        hits = sum(int(model(XV[i:i + 256]).argmax(1).sum()) for i in range(0, len(XV), 256))
    model.train()
    return hits

for step in range(90):
    i = (step * 64) % 2048
    loss = torch.nn.functional.cross_entropy(model(X[i:i + 64]), Y[i:i + 64])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 7:
        evaluate()
"""


@pytest.mark.quiet
@pytest.mark.torch
def test_live_an_evaluation_every_20_steps_inside_the_window_is_taken_at_the_runs_rate(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "evalevery20.py"
    script.write_text(EVAL_EVERY_20)
    r = prun("--no-stacks", "--skip-steps", 5, "--trace-steps", 5, script, out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    m = report(tmp_path / "run")["traces"][0]["metrics"]
    recs = steps(tmp_path / "run")
    assert sum(1 for s in recs if s.get("profiled") and s["step"] % 20 == 8) == 1, recs
    # the run's own cost of the evaluations: over the un-profiled steps after the trace (and its
    # export step), the evaluating steps' time beyond the median step / the steps' time
    last = max(s["step"] for s in recs if s.get("profiled"))
    after = [s for s in recs if s["step"] > last + 1]
    dur = np.array([s["dur"] for s in after])
    evaluating = np.array([s["step"] % 20 == 8 for s in after])
    truth = float((dur[evaluating] - median(dur)).sum() / dur.sum())
    window = m["evaluation.nograd_forward_share"]
    assert (m["loop.long_steps_every"], m["loop.long_steps_traced"]) == (20, 1), (m["loop.long_steps_every"], m["loop.long_steps_traced"], window, truth)
    assert window > truth + 0.12, (window, truth)          # 1 evaluation in 5 traced steps, 1 in 20 in the run
    # taken at the run's rate: the larger of the trace's no-grad forward at that rate and the
    # run's timed no-grad calls of the model, two measures of the same evaluations (a CI run had
    # the calls' 0.381 beside the trace's 0.376), never the window's rate
    run_rate = [x for x in (m["evaluation.nograd_run_share"], m["calls.nograd_share"]) if x is not None]
    assert m["evaluation.nograd_run_share"] is not None and m["evaluation.share"] == max(run_rate)
    assert m["evaluation.share"] == pytest.approx(truth, abs=0.08), (m["evaluation.share"], truth)


def test_without_a_period_the_runs_long_steps_bound_the_window_share():
    """HF Trainer evaluating every 10 steps, 20 steady steps: the 5-step window held one
    evaluation (43.5% of it), the run's 2 long steps cost 21.9% of its steady time; no period in
    2 long steps. The evaluation is taken at the long steps' cost, not the window's."""
    m = {"loop.long_steps_every": None, "loop.long_steps_share": None, "loop.long_steps_traced": None,
         "loop.long_steps_any_share": 0.219, "evaluation.nograd_forward_share": 0.435,
         "evaluation.nograd_long_steps_share": 0.435, "evaluation.nograd_long_steps_fraction": 0.96}
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.96 * 0.219)
    # a teacher in every step (0.10 of the window) stays at the window's share
    m.update({"evaluation.nograd_forward_share": 0.535})
    assert nograd_run_share(m)["evaluation.nograd_run_share"] == pytest.approx(0.10 + 0.96 * 0.219)
    # never above the window's share; no long step in the trace's no-grad work, or none in the run: the window's
    assert nograd_run_share({**m, "loop.long_steps_any_share": 0.9})["evaluation.nograd_run_share"] == 0.535
    assert nograd_run_share({**m, "evaluation.nograd_long_steps_share": 0.0})["evaluation.nograd_run_share"] == 0.535
    assert nograd_run_share({**m, "loop.long_steps_any_share": 0.0})["evaluation.nograd_run_share"] == 0.535
