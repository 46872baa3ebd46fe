"""`perfdoctor gate`: the statistics on generated step-time series with known effects (fixed
seeds), the outputs against their formats, and real runs of the examples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pytest

from perfdoctor.gate import stats
from perfdoctor.gate.gate import GateOptions, gate_runs
from perfdoctor.gate.load import RunData
from perfdoctor.gate.render import github, junit, markdown

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
FP = {"device": "cpu", "device_count": 0, "torch": "2.13.0+cpu", "cpu_count": 2, "batch_size": None}


def mk(durs, waits=None, *, share_input=0.05, verdict="device", fp=None, label="run") -> RunData:
    durs = list(map(float, durs))
    waits = list(waits) if waits is not None else [0.0] * len(durs)
    steps = [{"step": i + 1, "dur": d, "wait": float(w), "mode": "optimizer", "profiled": False, "perturbed": False}
             for i, (d, w) in enumerate(zip(durs, waits))]
    doc = {"schema_version": 1, "verdict": {"bound": verdict}, "findings": [],
           "traces": [{"metrics": {"share.input": share_input, "gpu.idle_share": None,
                                   "run.step_time_median_ms": 1e3 * float(np.median(durs))}}]}
    return RunData(label, doc, steps, dict(fp or FP))


def series(rng, n=60, median=0.100, noise=0.03):
    """Step times with multiplicative log-normal noise (sd ~ noise) and a slow warm-up step."""
    x = median * np.exp(rng.normal(0.0, noise, n))
    x[0] *= 5
    return x


# --- statistics -------------------------------------------------------------------------------

def test_steady_state_rule():
    durs = [1.0, 0.5] + [0.1] * 30 + [0.1, 9.0] + [0.1] * 8      # 42 steps: warm-up, then one outlier
    steps = [{"dur": d, "wait": 0.0} for d in durs]
    for i in (10, 11, 12):
        steps[i]["profiled"] = True
    steps[13]["perturbed"] = True
    steps[20]["dur"] = 0.101
    s = stats.steady_state(steps)
    assert s.dropped == {"warm-up": 5, "profiled/perturbed": 4, "outliers": 1}    # max(2, ceil(4.2)) = 5
    assert s.n == 42 - 5 - 4 - 1 and s.median == pytest.approx(0.1)
    assert stats.steady_state([{"dur": 0.1}] * 5).dropped["warm-up"] == 2          # at least 2


def test_mann_whitney_against_brute_force():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 30), rng.normal(0.8, 1, 25)
    u = sum((y > x) + 0.5 * (y == x) for x in a for y in b)
    n1, n2 = 30, 25
    z = (u - n1 * n2 / 2 - 0.5) / np.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    from math import erfc, sqrt
    assert stats.mann_whitney_greater(a, b) == pytest.approx(0.5 * erfc(z / sqrt(2)), rel=1e-9)
    assert stats.mann_whitney_greater(a, b) < 0.01 < stats.mann_whitney_greater(b, a)


@pytest.mark.parametrize("seed", range(10))
def test_20_percent_slowdown_is_a_regression(seed):
    rng = np.random.default_rng(seed)
    res = gate_runs(mk(series(rng, median=0.120)), [mk(series(rng))])
    assert res.outcome == "regression" and res.exit_code() == 1
    assert "step time" in res.reason and "within-run noise only" in res.reason


def test_same_distribution_never_regresses_50_seeds():
    outcomes = []
    for seed in range(50):
        rng = np.random.default_rng(100 + seed)
        outcomes.append(gate_runs(mk(series(rng)), [mk(series(rng))]).outcome)
        several = gate_runs(mk(series(rng)), [mk(series(rng)) for _ in range(3)])
        assert several.outcome != "regression"
    assert "regression" not in outcomes
    assert outcomes.count("pass") >= 45


@pytest.mark.parametrize("seed", range(10))
def test_5_percent_change_below_min_effect_passes(seed):
    rng = np.random.default_rng(200 + seed)
    res = gate_runs(mk(series(rng, median=0.105, noise=0.02)), [mk(series(rng, noise=0.02))],
                    GateOptions(min_effect=0.10))
    assert res.outcome == "pass" and res.exit_code() == 0
    # the same 5% with a 3% minimum effect is a (significant) regression
    res3 = gate_runs(mk(series(rng, median=0.105, noise=0.02)), [mk(series(rng, noise=0.02))],
                     GateOptions(min_effect=0.03))
    assert res3.outcome == "regression"


def test_improvement():
    rng = np.random.default_rng(7)
    res = gate_runs(mk(series(rng, median=0.070)), [mk(series(rng))])
    assert res.outcome == "improvement" and res.exit_code() == 0


def test_too_few_steps_is_inconclusive():
    rng = np.random.default_rng(3)
    res = gate_runs(mk(series(rng, n=12, median=0.2)), [mk(series(rng))])
    assert res.outcome == "inconclusive" and res.exit_code() == 3 and res.exit_code(strict=True) == 1
    assert "steady-state steps" in res.reason
    no_steps = mk(series(rng))
    no_steps.steps = None                     # a bare report.json
    assert gate_runs(no_steps, [mk(series(rng))]).outcome == "inconclusive"


def test_several_baselines_judge_against_their_spread():
    rng = np.random.default_rng(11)
    # run-to-run noise of +-15%: a 20% slower run is within 3 spreads
    noisy = [mk(series(rng, median=m)) for m in (0.085, 0.100, 0.115, 0.095, 0.110)]
    assert gate_runs(mk(series(rng, median=0.120)), noisy).outcome == "pass"
    tight = [mk(series(rng, median=m)) for m in (0.099, 0.100, 0.101)]
    res = gate_runs(mk(series(rng, median=0.120)), tight)
    assert res.outcome == "regression" and "run-to-run" in res.method
    assert "spread" in res.reason


def test_different_cpu_count_is_not_comparable_but_shares_still_gate():
    rng = np.random.default_rng(5)
    other = dict(FP, cpu_count=8)
    base = mk(series(rng), share_input=0.12, fp=other)
    res = gate_runs(mk(series(rng, median=0.150), share_input=0.13), [base])
    assert res.outcome == "not comparable" and res.exit_code() == 3
    st = next(r for r in res.rows if r.metric.startswith("step time"))
    assert st.status == "not comparable" and "CPU count 8 vs 2" in st.reason
    # a data-wait share change still gates (and the verdict change is named)
    waits_b = [d * 0.12 for d in series(rng)]
    cur_d = series(rng)
    res = gate_runs(mk(cur_d, [d * 0.31 for d in cur_d], share_input=0.31, verdict="input_cpu"),
                    [mk(series(rng), waits_b, share_input=0.12, fp=other)])
    assert res.outcome == "regression" and res.exit_code() == 1
    assert res.reason.startswith("data wait 12% -> 31%") and res.reason.endswith("now input-bound (CPU)")
    assert any("absolute times not compared" in n for n in res.notes)


def test_busy_machine_makes_step_time_inconclusive():
    rng = np.random.default_rng(8)
    base = mk(series(rng))
    cur = mk(series(rng, median=0.3))
    busy = {"system.cpu_busy_share": 1.0, "machine.cpu_count": 2, "loader.trainer_cpu_mean": 1.0, "loader.workers": 0}
    cur.doc["traces"][0]["metrics"].update(busy)
    res = gate_runs(cur, [base])
    assert res.outcome == "inconclusive" and "busy with other work" in res.reason and "1.0 of 2 cores" in res.reason
    assert gate_runs(cur, [base], GateOptions(max_other_load=1.0)).outcome == "regression"
    cur.doc["traces"][0]["metrics"]["system.cpu_busy_share"] = 0.55        # 0.1 core of others: fine
    assert gate_runs(cur, [base]).outcome == "regression"


def test_unknown_fingerprint_fields_are_recorded_not_blocking():
    rng = np.random.default_rng(6)
    res = gate_runs(mk(series(rng), fp=dict(FP, torch=None)), [mk(series(rng))])
    assert res.outcome == "pass" and "torch version" in res.fingerprint["unknown"]


# --- output formats ---------------------------------------------------------------------------

def _regression():
    rng = np.random.default_rng(0)
    cur, base = series(rng, median=0.13), series(rng)
    return gate_runs(mk(cur, cur * 0.31, share_input=0.31, verdict="input"),
                     [mk(base, base * 0.12, share_input=0.12)])


def check_markdown_table(text: str, rows: int) -> None:
    lines = [x for x in text.splitlines() if x.startswith("|")]
    assert len(lines) == rows + 2
    cells = [len([c for c in _split_cells(x)]) for x in lines]
    assert len(set(cells)) == 1 and cells[0] == 6
    assert lines[0].replace(" ", "") == "|metric|baseline|current|change|threshold|status|"
    assert all(c.strip().startswith("---") or c.strip().startswith(":--") for c in _split_cells(lines[1]))


def _split_cells(line: str) -> list[str]:
    import re
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_markdown_summary_is_a_valid_table():
    res = _regression()
    check_markdown_table(markdown(res), len(res.rows))


def test_github_summary_and_workflow_commands(tmp_path, monkeypatch, capsys):
    res = _regression()
    summary = tmp_path / "summary.md"
    summary.write_text("previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    github(res)
    text = summary.read_text()
    assert text.startswith("previous step\n") and "perfdoctor gate: regression" in text
    out = capsys.readouterr().out
    assert out.startswith("::error title=perfdoctor gate: regression::") and "%25" in out


def check_junit(path: Path, failures: int, skipped: int, tests: int) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuite" and root.get("name") == "perfdoctor-gate"
    cases = root.findall("testcase")
    assert len(cases) == tests == int(root.get("tests"))
    assert int(root.get("failures")) == failures == sum(c.find("failure") is not None for c in cases)
    assert int(root.get("skipped")) == skipped == sum(c.find("skipped") is not None for c in cases)
    assert int(root.get("errors")) == 0
    return root


def test_junit_xml(tmp_path):
    res = _regression()
    junit(res, tmp_path / "j.xml")
    root = check_junit(tmp_path / "j.xml", failures=2, skipped=0, tests=len(res.rows))
    fail = root.find("testcase/failure")
    assert fail.get("type") == "regression" and fail.get("message")
    rng = np.random.default_rng(3)
    junit(gate_runs(mk(series(rng, n=8)), [mk(series(rng))]), tmp_path / "s.xml")
    check_junit(tmp_path / "s.xml", failures=0, skipped=1, tests=3)


# --- real runs --------------------------------------------------------------------------------

def pd(*args, env=None, check=None):
    p = subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check is not None:
        assert p.returncode == check, p.stdout + p.stderr
    return p


# Single-threaded torch: on a shared 2-core CI machine, multithreaded GEMMs slow down several-fold
# when another process takes a core, single-threaded ones by at most ~2-3x.
QUIET = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of the same script, one made ~9x heavier (MLP 3x wider), and the augmentation
    moved onto the trainer's thread (cpu_bound_loader, num_workers=0): input-bound."""
    root = tmp_path_factory.mktemp("gate-runs")
    mlp = ["examples/compute_bound.py", "--batch-size", "64", "--width"]
    spec = {"a": [*mlp, "512"], "b": [*mlp, "512"], "wide": [*mlp, "1536"],
            "w0": ["examples/cpu_bound_loader.py", "--workers", "0"]}
    out = {}
    for name, argv in spec.items():
        d = root / name
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "40", "--out", str(d), *argv],
                           cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
        assert p.returncode == 0 and (d / "report.json").is_file(), p.stderr[-2000:]
        out[name] = d
    return out


# Load from other processes changes a whole run's speed by tens of percent, so these tests use a
# 150% minimum effect: the wider model is ~9x the FLOPs, far beyond it, and a rerun of the same
# script is far below it. The regression tests turn the busy-machine check off (--max-other-load 1)
# so that a neighbour's load cannot turn the 9x into "inconclusive"; the same-script test keeps it.
EFFECT = "1.5"


def test_real_slowdown_fails_with_reason(runs, tmp_path):
    p = pd("gate", runs["wide"], "--baseline", runs["a"], "--min-effect", EFFECT, "--max-other-load", "1",
           "--junit", tmp_path / "j.xml", check=1)
    assert "regression: step time" in p.stdout.replace("\n", " ")
    check_junit(tmp_path / "j.xml", failures=1, skipped=0, tests=3)
    # two baselines: judged against their spread
    p = pd("gate", runs["wide"], "-b", runs["a"], "-b", runs["b"], "--min-effect", EFFECT, "--max-other-load", "1",
           "--format", "json", check=1)
    doc = json.loads(p.stdout)
    assert doc["outcome"] == "regression" and doc["method"].startswith("run-to-run")
    assert doc["rows"][0]["values"]["current_median_s"] > 2.5 * doc["rows"][0]["values"]["baseline_center_s"]


def test_same_script_never_regresses(runs):
    for cur, base in (("b", "a"), ("a", "b")):
        p = pd("gate", runs[cur], "--baseline", runs[base], "--min-effect", EFFECT, "--min-share", "0.25")
        assert p.returncode in (0, 3), p.stdout + p.stderr
    p = pd("gate", runs["b"], "-b", runs["a"], "-b", runs["b"], "--min-effect", EFFECT, "--min-share", "0.25")
    assert p.returncode in (0, 3), p.stdout + p.stderr


def test_real_data_wait_regression(runs, tmp_path):
    summary = tmp_path / "summary.md"
    p = pd("gate", runs["w0"], "--baseline", runs["a"], "--format", "json", env={"GITHUB_STEP_SUMMARY": str(summary)})
    doc = json.loads(p.stdout)                      # with --format json the workflow commands go to stderr
    share = next(r for r in doc["rows"] if r["metric"] == "data wait (share.input)")
    assert p.returncode == 1 and share["status"] == "regression", p.stdout
    assert share["values"]["current"] - share["values"]["baseline"] > 0.5
    assert "data wait" in doc["reason"]
    # The small-MLP baseline sits near the device/input line, so its own verdict can be
    # input-bound too: the reason names the new bottleneck exactly when the verdict changed.
    vrow = next(r for r in doc["rows"] if r["metric"] == "verdict")
    assert vrow["current"].startswith("input")
    changed = vrow["baseline"] != vrow["current"]
    assert (": now input-bound" in doc["reason"]) == changed, (vrow, doc["reason"])
    assert any(x.startswith("::error title=perfdoctor gate: regression::") for x in p.stderr.splitlines())
    p = pd("gate", runs["w0"], "--baseline", runs["a"], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert p.returncode == 1 and "::error title=perfdoctor gate: regression::" in p.stdout
    parts = summary.read_text().split("### perfdoctor gate: regression")
    assert len(parts) == 3 and parts[0] == ""                                     # appended, not overwritten
    for part in parts[1:]:
        check_markdown_table(part, len(doc["rows"]))


def test_other_cpu_count_is_not_comparable(runs, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(runs["wide"], moved)
    doc = json.loads((moved / "report.json").read_text())
    doc["traces"][0]["metrics"]["machine.cpu_count"] = 64
    (moved / "report.json").write_text(json.dumps(doc))
    p = pd("gate", moved, "--baseline", runs["a"], "--format", "json")
    res = json.loads(p.stdout)
    assert res["rows"][0]["status"] == "not comparable" and "CPU count" in res["rows"][0]["reason"]
    assert any("CPU count" in d for d in res["fingerprint"]["differs"])
    if res["outcome"] == "not comparable":              # no share moved by 10 points
        assert p.returncode == 3
        assert pd("gate", moved, "--baseline", runs["a"], "--strict").returncode == 1


def test_input_errors_exit_2(runs, tmp_path):
    p = pd("gate", tmp_path / "nope", "--baseline", runs["a"], check=2)
    assert p.stderr.startswith("perfdoctor: error:") and "no such file" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{\"a\": 1}")
    assert "not a perfdoctor report" in pd("gate", runs["a"], "--baseline", bad, check=2).stderr
    assert pd("gate", runs["a"], check=2).returncode == 2                   # --baseline is required


def test_report_file_without_steps_is_inconclusive(runs, tmp_path):
    lone = tmp_path / "report.json"
    shutil.copy(runs["wide"] / "report.json", lone)
    p = pd("gate", lone, "--baseline", runs["a"], "--max-other-load", "1", "--format", "json")
    res = json.loads(p.stdout)
    assert res["rows"][0]["status"] == "inconclusive" and "no step records" in res["rows"][0]["reason"]
    assert p.returncode in (1, 3)                        # 1 only if a share moved


def test_run_with_baseline_gates_in_one_command(tmp_path):
    """`perfdoctor run --baseline B` runs, diagnoses, then gates: slower work -> exit 1."""
    import subprocess
    import sys
    from pathlib import Path
    ex = Path(__file__).resolve().parent.parent / "examples" / "compute_bound.py"
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    base = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "40", "--no-trace",
                           "--out", str(tmp_path / "base"), str(ex), "--width", "256", "--batch-size", "64"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert base.returncode == 0, base.stderr
    slow = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "40", "--no-trace",
                           "--out", str(tmp_path / "slow"), "--baseline", str(tmp_path / "base"),
                           str(ex), "--width", "1536", "--batch-size", "64"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert slow.returncode in (1, 3), slow.stderr      # 3 only if the machine was too busy to judge
    assert "regression" in slow.stderr or "inconclusive" in slow.stderr
    missing = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--baseline", str(tmp_path / "nope"),
                              str(ex)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such baseline" in missing.stderr
