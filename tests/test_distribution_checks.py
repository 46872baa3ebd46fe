"""torch.distributions' argument checks: sized from py-spy's stacks (analyze/stackmarks.py),
offered off (PD379), and measured by tune's distribution_checks trial (collect/inject.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from stackcases import frame as _ev
from stackcases import ten_steps
from tunecases import facts, injected

from perfdoctor.analyze.stackmarks import checks_distribution
from perfdoctor.tune import plan
from perfdoctor.tune.apply import apply_text

SITE = "/venv/lib/python3.11/site-packages/"
MAIN = ("main", "/home/u/rl.py", 30)
INIT = ("Categorical.__init__", SITE + "torch/distributions/categorical.py", 70)
DIST_INIT = ("Distribution.__init__", SITE + "torch/distributions/distribution.py", 75)
SIMPLEX = ("_Simplex.check", SITE + "torch/distributions/constraints.py", 533)
SAMPLE = ("Categorical.sample", SITE + "torch/distributions/categorical.py", 148)
LOG_PROB = ("Categorical.log_prob", SITE + "torch/distributions/categorical.py", 155)
VALIDATE = ("Distribution._validate_sample", SITE + "torch/distributions/distribution.py", 322)


def test_the_checks_are_the_frames_of_distribution_init_validate_sample_and_constraints():
    assert checks_distribution((MAIN, INIT, DIST_INIT))
    assert checks_distribution((MAIN, INIT, DIST_INIT, SIMPLEX))
    assert checks_distribution((MAIN, LOG_PROB, VALIDATE))
    assert checks_distribution((MAIN, ("_Simplex.check", "C:\\py\\Lib\\site-packages\\torch\\distributions\\constraints.py", 1)))
    # a distribution's own work, and a user's file of the same name, are not the checks
    assert not checks_distribution((MAIN, INIT))
    assert not checks_distribution((MAIN, SAMPLE))
    assert not checks_distribution((MAIN, ("Distribution.__init__", "/home/u/distribution.py", 3)))
    assert not checks_distribution((MAIN, ("Distribution.expand", DIST_INIT[1], 87)))


def test_the_checks_share_of_each_step_is_measured_from_the_stacks():
    """Ten 100 ms steps: a distribution built (30 ms, 20 of them in Distribution.__init__'s
    checks), sampled (10 ms), scored (20 ms, 5 in _validate_sample): 25% of the step checks."""
    ev = [_ev("B", 0, *MAIN)]
    for k in range(10):
        t = k * 100_000
        ev += [_ev("B", t, *INIT), _ev("B", t + 10_000, *DIST_INIT), _ev("B", t + 12_000, *SIMPLEX),
               _ev("E", t + 30_000, *SIMPLEX), _ev("E", t + 30_000, *DIST_INIT), _ev("E", t + 30_000, *INIT),
               _ev("B", t + 30_000, *SAMPLE), _ev("E", t + 40_000, *SAMPLE),
               _ev("B", t + 40_000, *LOG_PROB), _ev("B", t + 40_000, *VALIDATE), _ev("E", t + 45_000, *VALIDATE),
               _ev("E", t + 60_000, *LOG_PROB)]
    ev.append(_ev("E", 1_000_000, *MAIN))
    rep = ten_steps(ev)
    assert rep.metrics["stacks.distribution_check_share"] == pytest.approx(0.25)
    assert rep.metrics["stacks.anomaly_stack_share"] == 0.0


CHECKED = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    bad = 0
    for step in range(6):
        probs = torch.softmax(policy(torch.ones(1, 4)), 1)
        m = torch.distributions.Categorical(probs, validate_args=True)
        a = m.sample()
        loss = -m.log_prob(a).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        try:                       # probabilities off the simplex: only a check can tell
            torch.distributions.Categorical(torch.tensor([[2.0, -1.0]]), validate_args=True)
        except ValueError:
            bad += 1
    print("rejected", bad)
""")


def test_checks_off_builds_every_distribution_unchecked_with_the_same_losses(tmp_path, capfd):
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"distribution_checks": "off"}, CHECKED)
    bare_out, bare = injected(tmp_path, capfd, {}, CHECKED)
    assert out.strip() == "rejected 0" and bare_out.strip() == "rejected 6"
    assert "distribution_checks" in inj["applied"] and "distribution_checks" not in bare["applied"]
    assert inj["losses"] == bare["losses"] and len(bare["losses"]) == 6
    text = apply_text({"distribution_checks": "off"}, bare, cuda=False)
    assert text.startswith("torch.distributions.Distribution.set_default_validate_args(False)")


def test_a_report_that_found_the_checks_plans_their_trial_after_anomaly_mode():
    trials = plan.plan(facts(distribution_checks=True, anomaly=True, verdict="host", data_wait=0.0))
    assert [t.changes for t in trials[:2]] == [{"anomaly": "off"}, {"distribution_checks": "off"}]
    assert trials[1].group == "distributions" and not trials[1].bound
    assert plan.rule_for(trials[1].changes, {"PD379", "PD312"}) == "PD379"
    assert all("distribution_checks" not in t.changes for t in plan.plan(facts()))
    assert plan.only_names(["distributions,PD379"]) == {"distributions", "PD379"}   # known names both


# A policy-gradient rollout: a distribution built, sampled and scored per environment step
ROLLOUT = textwrap.dedent("""
    import numpy as np, torch
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for episode in range(150):
        logps = []
        state = rng.standard_normal(4)
        for t in range(40):
            m = torch.distributions.Categorical(torch.softmax(policy(torch.from_numpy(state).float()[None]), 1))
            a = m.sample()
            logps.append(m.log_prob(a))
            state = 0.9 * state + 0.1 * rng.standard_normal(4) + 0.01 * a.item()
        loss = -torch.cat(logps).sum()
        opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.mark.slow
def test_run_of_a_rollout_sizes_the_checks_and_offers_them_off(tmp_path):
    pytest.importorskip("torch")
    from perfdoctor.collect.stacks import find_py_spy
    if not find_py_spy():
        pytest.skip("py-spy is not installed")
    script = tmp_path / "rollout.py"
    script.write_text(ROLLOUT)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--out", str(tmp_path / "run"),
                        "--format", "json", "-o", str(tmp_path / "r.json"), str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    m = doc["traces"][0]["metrics"]
    if m["stacks.distribution_check_share"] is None:
        pytest.skip("no stacks recorded here: " + " ".join(doc["run"]["notes"]))
    # the checks are a material part of a step of small ops (0.2-0.3 of it on a quiet 2-core VM)
    assert m["stacks.distribution_check_share"] >= 0.05, m["stacks.distribution_check_share"]
    fix = next(f for f in doc["findings"] if f["id"] == "PD379")
    share, unread = m["stacks.distribution_check_share"], m["stacks.unread_share"] or 0.0
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share * (1 - unread)), rel=1e-3)
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (1 - share), rel=1e-3)
    assert fix["ranked"]
