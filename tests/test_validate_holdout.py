"""bench/validate_holdout.py: the held-out GPU check. Without CUDA it measures nothing and says
so; its judgement is checked on the H100 corpus; its scripts run (tiny sizes) on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "validate_holdout.py"
sys.path.insert(0, str(BENCH.parent))
import validate_holdout  # noqa: E402

sys.path.remove(str(BENCH.parent))


def test_without_cuda_it_measures_nothing_and_says_so():
    r = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    if "True" not in r.stdout.splitlines()[0]:
        assert "no CUDA device: nothing measured" in r.stdout and "|" not in r.stdout


def test_judgement_on_the_corpus(shared_traces):
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.rules.gain import combined

    doc = diagnose_path(str(shared_traces / "h100" / "compute"))
    row = validate_holdout.judge(doc, ["mixed-precision", "channels-last"], 2.08)
    assert row["ranks"][0] == 1 and row["ranked_first"] and row["first"] == ["mixed-precision"]
    assert row["within"] and row["ceiling_holds"] and row["expected"] < row["ceiling"]
    assert row["error"] == pytest.approx(row["expected"] / 2.08 - 1)
    # the two overlap (both credit the batch-norm kernels): their expected gains multiply, while
    # their ceilings add (the union of their shares is at most the sum)
    alone = {s: validate_holdout.judge(doc, [s], 2.08) for s in ("mixed-precision", "channels-last")}
    assert row["expected"] == pytest.approx(alone["mixed-precision"]["expected"] * alone["channels-last"]["expected"])
    assert row["ceiling"] == pytest.approx(combined([alone[s]["ceiling"] for s in alone]))
    far = validate_holdout.judge(doc, ["mixed-precision", "channels-last"], row["expected"] * 1.4)
    assert not far["within"] and far["ceiling_holds"]
    beaten = validate_holdout.judge(doc, ["mixed-precision", "channels-last"], row["ceiling"] * 1.1)
    assert not beaten["within"] and not beaten["ceiling_holds"]
    absent = validate_holdout.judge(doc, ["remove-empty-cache"], 1.04)
    assert absent["ranks"] == [None] and absent["expected"] is None and not absent["ranked_first"]


# Every script and arm in one interpreter (one torch import): runpy with the script's argv.
RUN_ALL = """
import contextlib, io, json, os, runpy, sys
sys.path.insert(0, os.path.dirname(json.loads(sys.argv[1])[0][0]))     # the scripts' steady.py
out, kept = {}, []
for path, args in json.loads(sys.argv[1]):
    sys.argv = [path, *args]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        kept.append(runpy.run_path(path, run_name="__main__"))   # never collected: see below
    out[path + " " + " ".join(args)] = buf.getvalue()
print(json.dumps(out), flush=True)
os._exit(0)     # not the interpreter's shutdown: it joins the DataLoader workers of the last arm
"""


def test_holdout_scripts_run_and_print_their_step_time():
    runs = []
    # The DataLoader workers a loader fix starts (8, forked from a process with many threads) hang
    # at shutdown, and their iterator's collection by a later script waited 5 s for each: those
    # scripts come last, every script's globals are kept (a garbage collection that fell inside
    # the next loader script once made this test 40 s longer), and the interpreter leaves without
    # joining them
    # (so do the persistent workers of a fixed arm)
    starts = lambda s: bool({"loader-workers", "persistent-workers"} & set(validate_holdout.APPLIED[s]))  # noqa: E731
    for script in sorted(validate_holdout.APPLIED, key=lambda s: (starts(s), s)):
        arms = [[]] if "compile-fuse" in validate_holdout.APPLIED[script] else [[], ["--fixed"]]  # compiling: minutes
        runs += [(str(validate_holdout.HOLDOUT / script), ["--small", "--steps", "4", *arm]) for arm in arms]
    r = subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps(runs)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == len(runs)
    for key, stdout in got.items():
        assert validate_holdout.steady_ms(stdout) > 0, key


def test_record_keeps_the_metrics_a_run_reported_when_its_directory_is_gone(tmp_path):
    sys.path.insert(0, str(BENCH.parent))
    import record_holdout
    sys.path.remove(str(BENCH.parent))

    metrics = {"save.share": 0.75, "save.interval_steps": 2.0}
    results = tmp_path / "h3.json"
    results.write_text(json.dumps({"device": "torch CUDA 13.0, NVIDIA H200", "rows": {
        "h3_safetensors_every2.py": {"bare_ms": [36.1, 35.9], "fixed_ms": [10.1, 10.0], "metrics": metrics}}}))
    got = record_holdout.record(results)["h3_safetensors_every2.py"]
    assert got["metrics"] == metrics and got["applied"] == ["checkpoint-off-the-step"]
    assert got["bare_ms"] == [36.1, 35.9] and "H200" in got["device"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"device": "d", "rows": {"h3_safetensors_every2.py": {"bare_ms": [1], "fixed_ms": [1]}}}))
    with pytest.raises(SystemExit, match="no run directory"):
        record_holdout.record(bare)


def test_a_measurement_whose_diagnosis_fails_is_kept(tmp_path, monkeypatch, capsys):
    """On an H200 the diagnosis failed (a wheel missing on the device) after both arms had been
    measured, and the measurement was lost with it: the row keeps the step times and the error."""
    def broken(script, out, small):
        raise SystemExit("perfdoctor run failed (1): ModuleNotFoundError: No module named 'simpleeval'")
    monkeypatch.setattr(validate_holdout, "diagnose", broken)
    results = tmp_path / "results.json"
    assert validate_holdout.main(["--cpu", "--pairs", "1", "--steps", "6", "--only", "h4_sync_metrics.py",
                                  "--json", str(results)]) == 0
    row = json.loads(results.read_text())["rows"]["h4_sync_metrics.py"]
    assert len(row["bare_ms"]) == len(row["fixed_ms"]) == 1 and row["bare_ms"][0] > 0 and row["fixed_ms"][0] > 0
    assert "simpleeval" in row["error"] and "failed" in capsys.readouterr().out
