"""The model's no-grad calls timed per step by `perfdoctor run` (collect/nogradcalls.py) and
calls.nograd_share (analyze/callshares.py): an evaluation with no DataLoader (nanoGPT's
estimate_loss over np.memmap batches) is named as one; a teacher run in every step is not."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.callshares import call_metrics, combined
from perfdoctor.analyze.longsteps import unexplained
from runs import child, prun_script, report, steps


def recs(durs, nograd, mode="optimizer"):
    return [{"step": 10 + i, "dur": d, "nograd": g, "mode": mode} for i, (d, g) in enumerate(zip(durs, nograd))]


def share(records, timed=True):
    return call_metrics(records, True, False, timed)["calls.nograd_share"]


def test_an_evaluation_every_10_steps_is_its_excess_over_the_steps():
    # usual steps of 2 ms, every 10th 20 ms of which 17 ms are no-grad forwards
    durs = [0.020 if i % 10 == 3 else 0.002 for i in range(100)]
    nograd = [0.017 if i % 10 == 3 else 0.0 for i in range(100)]
    assert share(recs(durs, nograd)) == pytest.approx(10 * 0.017 / sum(durs))
    assert combined({"calls.nograd_share": share(recs(durs, nograd))})["evaluation.share"] == \
        pytest.approx(10 * 0.017 / sum(durs))


def test_a_teacher_in_every_step_cancels():
    # a 1 ms teacher in every step, its time jittering by 0.1 ms: no evaluation
    rng = np.random.default_rng(0)
    nograd = [0.001 + 1e-4 * rng.random() for _ in range(100)]
    durs = [0.003 + g for g in nograd]
    assert share(recs(durs, nograd)) == 0.0
    # with an evaluation every 10 steps as well: only the evaluation's time beyond the teacher's
    nograd = [g + (0.015 if i % 10 == 3 else 0.0) for i, g in enumerate(nograd)]
    durs = [0.003 + g for g in nograd]
    ng = np.array(nograd)
    want = float((ng[3::10] - median(ng)).sum()) / sum(durs)
    assert share(recs(durs, nograd)) == pytest.approx(want)


def test_untimed_or_not_training_is_unknown():
    durs, nograd = [0.002] * 20, [0.0] * 19 + [0.01]
    assert share(recs(durs, nograd), timed=False) is None        # an older run, a trace alone
    assert share(recs(durs, nograd, mode="module")) is None       # an inference loop: every call is no-grad


# An MLP trained on tensors sliced in the loop (no DataLoader), evaluated every 10 steps by 40
# no-grad forwards of 32 rows (several training steps' time), from loop index 5 on: the
# evaluation of loop index i lands in step i (a step runs from one optimizer step to the next).
EVAL_EVERY_10 = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
X, Y = torch.randn(2048, 256), torch.randint(0, 10, (2048,))
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def estimate_loss():
    model.eval()
    with torch.no_grad():
        out = [model(X[k * 32:(k + 1) * 32]) for k in range(40)]
    model.train()
    return out

for step in range(150):
    if step % 10 == 5:
        estimate_loss()
    i = (step * 64) % 2048
    loss = torch.nn.functional.cross_entropy(model(X[i:i + 64]), Y[i:i + 64])
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.save(model, __file__ + ".pt")     # a whole model still pickles
"""

# The same loop with a teacher of its own called under no_grad before the student in every step.
TEACHER = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(2048, 256)
teacher = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(150):
    i = (step * 64) % 2048
    with torch.no_grad():
        target = teacher(X[i:i + 64]).softmax(1)
    loss = torch.nn.functional.cross_entropy(model(X[i:i + 64]), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.torch
def test_live_the_evaluating_steps_hold_the_no_grad_time(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "evalevery10.py", EVAL_EVERY_10, opts=("--no-stacks",))
    assert child(out)["nograd_timed"] is True
    recs = steps(out)
    # timed from the step after the census's (step 1) on: no-grad time exactly in the evaluating steps
    timed = [s for s in recs if s["step"] >= 2]
    assert [s["step"] for s in timed if s.get("nograd", 0) > 0] == [s["step"] for s in timed if s["step"] % 10 == 5]
    assert (tmp_path / "evalevery10.py.pt").stat().st_size > 0


@pytest.mark.quiet
@pytest.mark.torch
def test_live_an_evaluation_without_a_dataloader_is_named(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "evalevery10.py", EVAL_EVERY_10, opts=("--no-stacks",))
    doc = report(out)["traces"][0]
    m = doc["metrics"]
    recs = steps(out)
    # the evaluating steps' cost beyond the median step, over the steady steps' time
    steady = [s for s in recs if s["step"] >= 20]
    dur = np.array([s["dur"] for s in steady])
    truth = float((dur[[s["step"] % 10 == 5 for s in steady]] - median(dur)).sum() / dur.sum())
    assert m["loop.long_steps_every"] == 10, m
    assert m["evaluation.share"] == m["calls.nograd_share"]
    # a lower bound (the slicing between the calls is not timed) close to the long steps' excess
    assert truth - 0.08 < m["evaluation.share"] < truth + 0.03, (m["evaluation.share"], truth)
    ids = {f["id"] for f in doc["flags"]} | {f["id"] for f in doc["findings"]}
    assert "PD354" in ids and "PD359" not in ids, ids
    assert m["loop.long_steps_unnamed_share"] == pytest.approx(unexplained(m), abs=1e-5)
    assert m["loop.long_steps_unnamed_share"] < 0.05


@pytest.mark.quiet
@pytest.mark.torch
def test_live_a_teacher_every_step_is_no_evaluation(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "teacher.py", TEACHER, opts=("--no-stacks",))
    assert all(s.get("nograd", 0) > 0 for s in steps(out) if s["step"] >= 2)    # the teacher, in every step
    m = report(out)["traces"][0]["metrics"]
    assert m["calls.nograd_share"] < 0.05, m["calls.nograd_share"]      # under PD354's 5%: a preempted call or two at most
    assert (m["evaluation.share"] or 0) < 0.05
