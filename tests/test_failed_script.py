"""A run whose script failed (exited 3 after its steps), as gate, compare and the report read it.
gate: a crash that ends the job early reads as a speed-up (fewer, cheaper steps), so the gate
fails on it, whatever its step times say (a user trial: a script that exited with code 3 was
gated IMPROVEMENT -89.7%, exit 0). The report: no tune command (tune refuses such a baseline),
and markdown says it failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.gate.gate import FAILED
from perfdoctor.report.labels import script_failure

REPO = Path(__file__).resolve().parents[1]
QUIET = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200"}

EXITS = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randn(64, 1)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("steps done", flush=True)
sys.exit(int(sys.argv[2]))
"""


def _run(tmp: Path, name: str, steps: int, code: int) -> Path:
    script = tmp / "exits.py"
    script.write_text(EXITS)
    d = tmp / name
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(d), str(script), str(steps), str(code)],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert p.returncode == code and (d / "report.json").is_file(), p.stderr[-2000:]
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate-failed")
    return {"ok": _run(tmp, "ok", 300, 0), "failed": _run(tmp, "failed", 60, 3)}


def _gate(current: Path, baseline: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", "gate", str(current), "--baseline", str(baseline), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **QUIET})


def test_a_current_run_whose_script_failed_fails_the_gate(runs, tmp_path):
    junit = tmp_path / "gate.xml"
    p = _gate(runs["failed"], runs["ok"], "--format", "json", "--junit", str(junit))
    assert p.returncode == 1, p.stderr
    res = json.loads(p.stdout)
    assert res["outcome"] == FAILED and res["exit_code"] == 1
    row = res["rows"][0]
    assert row["metric"] == "script" and row["status"] == FAILED and row["current"] == "exited (exit code 3)"
    assert res["reason"].startswith("the current run's script exited (exit code 3)")
    # the step time is still compared and shown: the same script, so no slower step hides in it
    assert any(r["metric"] == "step time" for r in res["rows"])
    xml = junit.read_text()
    assert 'type="failed"' in xml and "exit code 3" in xml
    t = _gate(runs["failed"], runs["ok"])
    assert t.returncode == 1 and "perfdoctor gate: FAILED" in t.stdout, t.stdout


def test_a_baseline_whose_script_failed_is_noted_and_the_current_run_is_gated(runs):
    p = _gate(runs["ok"], runs["failed"], "--format", "json")
    res = json.loads(p.stdout)
    assert res["outcome"] != FAILED and p.returncode in (0, 1, 3)
    assert all(r["metric"] != "script" for r in res["rows"])
    assert any("the script exited (exit code 3)" in n for n in res["notes"]), res["notes"]


def test_script_failure_reads_the_run_record():
    assert script_failure({"outcome": "completed", "exit_code": 0}) is None
    assert script_failure({"outcome": "exit", "exit_code": 0}) is None
    assert script_failure({"outcome": "stopped", "exit_code": 0, "stopped_by": "max-steps"}) is None
    # perfdoctor's own stop that had to interrupt the script is no failure of the script's
    assert script_failure({"outcome": "interrupted", "exit_code": 130, "stopped_by": "duration"}) is None
    assert script_failure({"outcome": "crashed", "exit_code": 1}) == "crashed (exit code 1)"
    assert script_failure({"outcome": "killed", "exit_code": 137}) == "was killed (exit code 137)"
    assert script_failure(None) is None and script_failure({}) is None
    # a report is input: values of the wrong type are unknown, never a crash (the fuzz test found one)
    assert script_failure({"outcome": ["exit"], "exit_code": "3"}) is None
    assert script_failure({"outcome": "crashed", "exit_code": [1]}) == "crashed"


def test_compare_notes_a_side_whose_script_failed(runs):
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "compare", str(runs["ok"]), str(runs["failed"]), "-f", "json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **QUIET})
    assert p.returncode == 0, p.stderr
    notes = [n for n in json.loads(p.stdout)["notes"] if "busy with other work" not in n]   # a test worker beside
    assert notes == ["after: the script exited (exit code 3): its steps cover the run up to that failure"], notes


def test_the_report_of_a_failed_script_offers_no_tune_command(runs):
    """tune refuses a baseline whose script fails (exit 1: "nothing to tune"), so the report of
    one does not offer `perfdoctor tune --only ...` (a user trial: it did, for a script that exited 3)."""
    from perfdoctor.report.tune_labels import tune_hint
    ok = json.loads((runs["ok"] / "report.json").read_text())
    failed = json.loads((runs["failed"] / "report.json").read_text())
    assert tune_hint(ok) is not None and tune_hint(ok).startswith("perfdoctor tune --only ")
    assert [f["id"] for f in failed["findings"]] and tune_hint(failed) is None


def test_markdown_says_the_script_failed_and_keeps_the_tune_command_without_a_ranked_fix(runs):
    """--format markdown left out what the terminal says (a user trial): a script that exited 3 was
    not said to have failed, and with only fixes worth a look the `perfdoctor tune` line was gone."""
    from perfdoctor.report.tune_labels import tune_hint
    from perfdoctor.report.markdown import report as md
    failed = json.loads((runs["failed"] / "report.json").read_text())
    assert "**The script exited \\(exit code 3\\)**" in md(failed)
    ok = json.loads((runs["ok"] / "report.json").read_text())
    cmd = tune_hint(ok)
    assert cmd and f"```sh\n{cmd}\n```" in md(ok)
    for f in ok["findings"]:        # the same fixes, none with a modelled gain: still measurable
        f["ranked"] = False
    text = md(ok)
    assert "No fix has a modelled gain here; the fixes below" in text and f"```sh\n{cmd}\n```" in text
    from perfdoctor.report.html import render
    page = render(ok)       # and the page: not "no fix applies" above the fixes worth a look
    assert "No fix has a modelled gain here; the fixes below" in page and "No fix with a measurable" not in page
    n = ok["run"]["steps"]
    assert f"run: {n + 1} steps, {n} timed: **" in text
