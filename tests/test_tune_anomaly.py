"""tune's anomaly trial (collect/inject.py): autograd anomaly detection left off, PD374's fix
measured; the numerics are the same, so it is a setting to apply."""

from __future__ import annotations

import textwrap

import pytest
from tunecases import facts, injected

from perfdoctor.tune import plan
from perfdoctor.tune.apply import apply_text

ANOMALOUS = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.autograd.set_detect_anomaly(True)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    on = []
    for step in range(6):
        x = torch.randn(8, 32)
        with torch.autograd.detect_anomaly(check_nan=True):
            on.append(torch.is_anomaly_enabled())
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    on.append(torch.is_anomaly_enabled())
    print("anomaly", on, "loss", round(loss.item(), 6))
""")


def test_anomaly_off_keeps_the_detection_off_and_the_losses(tmp_path, capfd):
    """set_detect_anomaly(True) and detect_anomaly() leave the mode off under the trial, counted;
    the losses are the same as with the checks on (the mode changes no math)."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"anomaly": "off"}, ANOMALOUS)
    bare_out, bare = injected(tmp_path, capfd, {}, ANOMALOUS)
    assert out.startswith("anomaly [False, False, False, False, False, False, False] loss "), out
    assert bare_out.startswith("anomaly [True, True, True, True, True, True, True] loss "), bare_out
    assert out.split("loss ")[1] == bare_out.split("loss ")[1]
    assert "anomaly" in inj["applied"] and "anomaly" not in bare["applied"]
    # calls asking for the mode on: the set call and each context's entry, and with the mode on
    # each context's exit too (it restores the mode it found)
    assert inj["anomaly_calls"] == 1 + 6 and bare["anomaly_calls"] == 1 + 6 + 6
    assert inj["losses"] == bare["losses"]
    text = apply_text({"anomaly": "off"}, bare, cuda=False)
    assert text.startswith("torch.autograd.set_detect_anomaly(False)  # or remove set_detect_anomaly(True)")


def test_a_report_that_found_anomaly_detection_plans_its_trial_first_on_a_host_bound_step():
    trials = plan.plan(facts(anomaly=True, verdict="host", data_wait=0.0))
    assert trials[0].changes == {"anomaly": "off"} and trials[0].group == "anomaly" and not trials[0].bound
    assert plan.rule_for(trials[0].changes, {"PD374", "PD338"}) == "PD374"
    assert all("anomaly" not in t.changes for t in plan.plan(facts()))


@pytest.mark.slow
def test_run_sizes_anomaly_mode_from_its_checks_and_its_stored_stacks(tmp_path):
    """`perfdoctor run` on a loop under set_detect_anomaly(True): the trace times the engine's NaN
    checks, py-spy the Python stacks each forward op stores; PD374's expected gain, a lower
    estimate with no ceiling, counts both."""
    pytest.importorskip("torch")
    import json
    import subprocess
    import sys
    from perfdoctor.collect.stacks import find_py_spy
    if not find_py_spy():
        pytest.skip("py-spy is not installed")
    script = tmp_path / "train.py"
    script.write_text(ANOMALOUS.replace("range(6)", "range(10 ** 6)").replace("range(4)", "range(8)"))
    # a number of steps, not --duration 8: a run's duration counts from the process start, and under
    # a CI neighbour's load the start-up (torch's import) took 8 s and left one step (no trace, no stacks)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--max-steps", "400", "--out",
                        str(tmp_path / "run"), "--format", "json", "-o", str(tmp_path / "r.json"), str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    m = doc["traces"][0]["metrics"]
    # the checks found and timed: 4.8-5.9% of the step on a quiet VM, 0.9% once in CI beside another
    # test worker (its steps stretched by other work, the tiny checks not): their size is not the claim
    assert m["autograd.anomaly_checked_share"] >= 0.5 and m["autograd.anomaly_check_share"] > 0, m
    # what the stacks saw, said when they name no storing (one CI run read 0.0 with stacks taken)
    seen = ({k: v for k, v in m.items() if k.startswith("stacks.")}, doc.get("stacks"),
            doc["run"]["notes"])
    assert m["stacks.anomaly_stack_share"] > 0.02, seen
    fix = next(f for f in doc["findings"] if f["id"] == "PD374")
    checks_alone = 1 / (1 - m["autograd.anomaly_check_share"])
    assert fix["gain"]["expected"] > checks_alone * 1.01 and fix["ranked"], fix["gain"]
    assert fix["gain"]["ceiling"] is None or fix["gain"]["ceiling"] == float("inf"), fix["gain"]
