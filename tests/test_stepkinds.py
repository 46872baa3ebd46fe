"""Steady steps of two kinds mixed through the run (diagnose/stepnotes.kinds_note): batches of two
sizes in turn read as one mean and a median that matched neither, without a word."""

from __future__ import annotations

import random

import pytest
from runs import prun_script, report

from perfdoctor.diagnose.confidence import confidence
from perfdoctor.diagnose.stepnotes import drift_note, kinds_note

TWO_SIZES = r"""
import torch, torch.nn as nn
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
small, large = torch.randn(8, 256), torch.randn(1024, 256)
for i in range(120):
    x = small if i % 2 else large
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
print("two sizes: done")
"""


def rows(durs, runqs=None):
    return [{"dur": d, **({"runq": q} if runqs else {})} for d, q in zip(durs, runqs or durs)]


@pytest.mark.torch
def test_a_run_alternating_two_batch_sizes_says_its_steps_are_of_two_kinds(tmp_path):
    """Batches of 1024 and 8 in turn. The notes that compare medians read the two kinds as other
    things, and are not made: a drift (each third's median fell on either kind: 4.9 -> 16.3 ms),
    traced steps 'in another state' (their median 1.55 ms, one kind's, against 10.6 ms), a long
    step in the traced window."""
    r, out = prun_script(tmp_path, "two_sizes.py", TWO_SIZES, opts=("--no-stacks",), trace=True)
    assert r.stdout == "two sizes: done\n"
    doc = report(out)
    [note] = [n for n in doc["run"]["notes"] if n.startswith("the steady steps are of two kinds")]
    assert note.startswith("the steady steps are of two kinds, they alternate: "), note
    assert doc["traces"][0]["metrics"]["run.step_kinds"] == 2
    said = " ".join(doc["run"]["notes"] + doc["verdict"]["notes"])
    for artefact in ("length drifts", "in another state", "a long step fell in the traced window"):
        assert artefact not in said, said


def test_two_kinds_are_told_apart_from_noise_long_steps_and_a_drift():
    rng = random.Random(7)
    alternating = [(0.0025 if i % 2 else 0.0135) * rng.uniform(0.9, 1.1) for i in range(60)]
    [note] = kinds_note(rows(alternating))
    assert "they alternate: 30 of about 2.4" in note and "30 of about 13" in note and "two sizes" in note
    mixed = [(0.02 if rng.random() < 0.4 else 0.004) * rng.uniform(0.9, 1.1) for _ in range(80)]
    assert "mixed through the run" in kinds_note(rows(mixed))[0]
    assert kinds_note(rows([0.005 * rng.lognormvariate(0, 0.4) for _ in range(200)])) == []   # one kind, noisy
    assert kinds_note(rows([0.05 if i % 10 == 0 else 0.002 for i in range(60)])) == []   # 10% long: long steps
    phases = [0.003] * 30 + [0.012] * 30                                   # two phases: the drift note's
    assert kinds_note(rows(phases)) == [] and drift_note(rows(phases))
    assert kinds_note(rows(alternating[:11])) == []                        # too few steps to tell


def test_long_steps_that_only_queued_for_a_cpu_are_the_machines():
    durs = [0.0025 if i % 2 else 0.0135 for i in range(60)]
    queued = [0.0 if i % 2 else 0.011 for i in range(60)]
    [note] = kinds_note(rows(durs, queued))
    assert note.endswith("The long ones waited for a CPU: other work on the machine, not the script's, made them "
                         "long; rerun on a quiet machine")
    [note] = kinds_note(rows(durs, [0.0002] * 60))                        # they worked: the script's
    assert note.endswith("(batches of two sizes, or work every other step)")


def test_with_two_kinds_the_traced_steps_median_is_no_other_state():
    """Traced steps far shorter than the steady ones are another state of the run (the profiler
    only adds time), unless the steps are of two kinds: then each median is one kind's."""
    m = {"share.device": 0.0, "share.input": 0.0, "share.host": 0.1, "share.communication": 0.0, "cpu.compute_share": 0.9,
         "steps.source": "ProfilerStep", "steps.count": 5, "trace.platform": "cpu", "steps.time_mean_ms": 9.6,
         "steps.time_median_ms": 1.55, "run.step_time_ms": 12.4, "run.step_time_median_ms": 10.6}
    assert any("in another state" in n for n in confidence("host", {**m, "run.step_kinds": 1})[1])
    assert not any("in another state" in n for n in confidence("host", {**m, "run.step_kinds": 2})[1])


def test_a_trace_cut_inside_its_only_step_is_no_other_state():
    """pytorch/examples' time_sequence_prediction (LBFGS, 22 s steps): the memory budget stopped the
    trace 9.7 s into its only step, and the note that the trace caught the run in another state
    followed the note that the step was cut. A cut step's length is no step's; with three traced
    steps or more the median holds."""
    m = {"share.device": 0.0, "share.input": 0.0, "share.host": 0.2, "share.communication": 0.0,
         "cpu.compute_share": 0.8, "steps.source": "ProfilerStep", "steps.count": 1, "trace.platform": "cpu",
         "steps.time_mean_ms": 9770.0, "steps.time_median_ms": 9770.0, "run.step_time_ms": 22229.0,
         "run.step_time_median_ms": 22228.0, "run.step_kinds": 1}
    assert any("in another state" in n for n in confidence("host", {**m, "trace.cut_s": None})[1])
    assert not any("in another state" in n for n in confidence("host", {**m, "trace.cut_s": 9.7})[1])
    assert any("in another state" in n for n in confidence("host", {**m, "trace.cut_s": 9.7, "steps.count": 4})[1])
    # and the header's median says it is a cut step's
    from perfdoctor.report.labels import cut_text
    assert cut_text({**m, "trace.cut_s": 9.7}) == " (cut short)" and cut_text(m) == ""
    assert cut_text({**m, "trace.cut_s": 9.7, "steps.count": 4}) == ""
