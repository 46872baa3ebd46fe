"""`perfdoctor tune`'s document on a small script, and the README demo's acceptance run on
examples/cpu_bound_loader.py, against independent reruns (timing tests: they hold the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from quiet import Foreign, skip_if_shared
from tunecases import EX, SCRIPT, ptune


@pytest.mark.quiet
@pytest.mark.slow
def test_tune_document_on_a_small_script(tmp_path):
    """Every trial has a status from the documented set, CUDA trials are skipped with their reason,
    the budget is respected and what it left out is listed."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    crash = 'if loader.num_workers == 1:\n    raise RuntimeError("this script breaks with one worker")\nfor epoch'
    script.write_text(SCRIPT.replace("range(3)", "range(10 ** 6)").replace("for epoch", crash, 1))
    # runs of 2 s of training (after importing torch: 2.5-4 s on a 2-core VM): two baselines and
    # both worker trials fit, the rest as the machine allows
    budget = 40
    foreign = Foreign()
    r = ptune("--budget", str(budget), "--duration", "2", "--out", tmp_path / "t", "-o", tmp_path / "t.json", script)
    if r.returncode == 3:
        # on a loaded machine starting Python and importing torch can take the whole run, and
        # the baseline reaches a step or two (exit 3, documented).
        # The budget and what fits in it are timings: a shared machine skips, a quiet one fails
        skip_if_shared(foreign)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["baseline"]["step_time_s"] > 0 and doc["baseline"]["steps"] >= 10
    assert doc["baseline"]["report_dir"] == str(tmp_path / "t" / "baseline")     # the fixes' report: the traced run
    # the baseline ran twice before any trial, and their spread is in every interval
    from perfdoctor.stats.speedups import run_spread
    times = [doc["baseline"]["step_time_s"]] + [x["step_time_s"] for x in doc["baseline"]["repeats"]]
    assert len(times) >= 2 and doc["run_spread"] == pytest.approx(run_spread(times), rel=0.05, abs=1e-3)  # rounded
    assert "run-to-run spread" in doc["noise"]
    statuses = {t["status"] for t in doc["trials"]}
    assert statuses <= {"faster", "slower", "no change", "inconclusive", "failed", "skipped"}
    by = {t["label"].replace(", persistent_workers=True", ""): t for t in doc["trials"]}
    assert by["tf32=True"]["status"] == "skipped" and by["tf32=True"]["reason"] == "no CUDA device"
    # the loader comes first; a trial that crashes is reported, and the tune goes on. Whether the
    # worker trials fit in the budget is a timing: on a machine with other work (a load of 4 on
    # 2 cores once) the baselines took it all, and that skips, as exit 3 does above
    if any(by[k]["status"] == "skipped" and by[k]["reason"] == "budget" for k in ("num_workers=1", "num_workers=2")):
        skip_if_shared(foreign)
    assert by["num_workers=1"]["status"] == "failed"
    assert "RuntimeError: this script breaks with one worker" in by["num_workers=1"]["reason"]
    # each run's output is in its directory, not among tune's lines; a failed run's last lines are
    # shown (the traceback's, here)
    assert "threads 1 workers 0" not in r.stdout + r.stderr        # the baseline's first line
    assert (tmp_path / "t" / "baseline" / "output.log").read_text().startswith("threads 1 workers 0\n")
    failed = Path(by["num_workers=1"]["dir"]) / "output.log"
    assert f"line(s) of its output ({failed}):" in r.stderr
    assert 'raise RuntimeError("this script breaks with one worker")' in r.stderr
    assert by["num_workers=2"]["status"] != "skipped"
    ran = [t for t in doc["trials"] if t["step_time_s"] is not None]
    for t in ran:
        if t["speedup"] is not None:
            lo, hi = t["ci95"]
            assert lo <= t["speedup"] <= hi
            assert (t["status"] == "faster") == (lo > 1)
            # against the baseline run(s) it was compared with (before and after it on a noisy machine)
            base = {b["dir"]: b["step_time_s"] for b in [doc["baseline"], *doc["baseline"]["repeats"]]}
            ref = sum(base[d] for d in t["baseline_dirs"]) / len(t["baseline_dirs"])
            again = t["confirm"]["speedup"] if t["confirm"] else None     # the best's second run
            first = ref / t["step_time_s"]
            # tune pools the steps of the baseline runs around a trial; the mean of their step
            # times differs from that by up to the runs' own spread (0.67 once, with another job
            # on the machine: 0.67x pooled against 0.85x from the means)
            tol = max(0.2, 2 * (doc["run_spread"] or 0))
            assert t["speedup"] == pytest.approx(first if again is None else (first * again) ** 0.5, rel=tol)
            # each decisive trial of a fix the report raised is held to that fix's model
            mc = t["model_check"]
            if t["rule"] and t["offered"] and t["status"] in ("faster", "slower", "no change"):
                assert mc is not None and mc["rule"] == t["rule"], t
                if mc["verdict"] == "agrees" and mc["range"] is None:
                    assert lo <= mc["expected"] <= hi
                if mc["verdict"] == "beats-ceiling":
                    assert lo > mc["ceiling"]
            elif t["status"] == "inconclusive":
                assert mc is None
        assert Path(t["dir"], "steps.jsonl").exists()
    longest = max(json.loads(Path(d, "run.json").read_text())["wall_s"]
                  for d in (tmp_path / "t").iterdir() if (d / "run.json").exists())
    assert doc["elapsed_s"] <= budget + longest + 5                        # never a run past the budget
    assert doc["skipped_for_budget"] == [t["label"] for t in doc["trials"] if t["reason"] == "budget"]
    # the result on stdout (`tune ... > result.txt` keeps it), tune's progress on stderr
    assert (tmp_path / "t" / "tune.json").exists() and "best:" in r.stdout and "best:" not in r.stderr
    assert "[perfdoctor tune] baseline:" in r.stderr and "[perfdoctor tune]" not in r.stdout
    if doc["best"]:                          # confirmed by a second run, or said to rest on one
        best = next(t for t in doc["trials"] if t["changes"] == doc["best"]["changes"])
        assert doc["best"]["confirmed"] == (best["confirm"] is not None)
        assert ("two runs" if doc["best"]["confirmed"] else "one run") in r.stdout
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    expected = {f["id"]: (f.get("gain") or {}).get("expected") for f in report["findings"]}
    for t in doc["trials"]:                 # "predicted" is the report's expected gain of the tested fix
        want = expected.get(t["rule"])
        assert t["predicted"] == (None if want is None else pytest.approx(want, abs=1e-4))
    # `report TUNE_DIR`: the baseline's report, every fix tune measured with its measurement under it
    from perfdoctor.report.tune_labels import measured_by_rule, tune_measured
    shown = subprocess.run([sys.executable, "-m", "perfdoctor", "report", "--details", str(tmp_path / "t")],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0 and "is a tune directory" in shown.stderr, shown.stderr
    for rid, tr in measured_by_rule(doc).items():
        assert (f"measured by tune: {tune_measured(tr)}" in shown.stdout) == (rid in expected), rid


@pytest.mark.quiet
@pytest.mark.slow
def test_acceptance_cpu_bound_loader(tmp_path):
    """The README demo: tune's verdict on each DataLoader setting (faster, slower) is one that
    independent reruns support, it calls 1 worker no gain where that is the truth, and a worker
    setting it recommends is confirmed by two runs and within 25% of the reruns' speed-ups, or
    said to rest on one run when the budget ran out before its confirmation (a slow machine: one
    run measured 1.39x where reruns gave 1.01-1.09x, the noise the confirmation is there for)."""
    pytest.importorskip("torch")
    cores = os.cpu_count() or 1
    if cores != 2:
        pytest.skip(f"the acceptance numbers are for a 2-core machine (this one has {cores})")
    skip_if_shared()
    foreign = Foreign()
    r = ptune("--budget", "90", "--out", tmp_path / "t", "-o", tmp_path / "t.json",
              EX / "cpu_bound_loader.py", "--workers", "0", timeout=400)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    by = {t["label"].replace(", persistent_workers=True", ""): t for t in doc["trials"]}
    # independent reruns: plain `perfdoctor run` of each DataLoader setting. The truth depends on
    # the machine (here a worker process is slower at the transforms than the trainer's thread:
    # measured 1 worker 0.26-0.64x, 2 workers 0.6-0.9x on a quiet VM, 2 workers ~1.35x on a busier
    # one), so tune is checked against these measurements, not against an expectation.
    # The example's --workers N keeps its workers alive (persistent_workers=True), as tune's worker
    # trials do from a script without workers (plan.worker_changes): with restarting workers the
    # trial measured the restarts, and this comparison failed.
    from perfdoctor.diagnose.live import read_steps
    from perfdoctor.stats.speedups import speedup
    from perfdoctor.stats.steptime import estimate
    # The truth is a distribution here: the same worker setting differs between runs of the same
    # command by up to 2.7x on this VM (1 worker: 72 and 196 ms/step in two 12 s runs; 2 workers:
    # 0.55x in tune and 1.27x in the rerun of one run of this test, both quiet). So each worker
    # setting is rerun twice, and tune's claims are checked against what the reruns can support:
    # a setting called slower is not faster in every rerun, one called faster is faster in some,
    # and the recommended one (confirmed by tune's own second run) lies within 25% of the reruns.
    def rerun(w, k):
        out = tmp_path / f"rerun{w}-{k}"
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--duration", "6",
                            "--out", str(out), str(EX / "cpu_bound_loader.py"), "--workers", str(w)],
                           capture_output=True, text=True, timeout=200)
        assert p.returncode == 0, p.stderr
        return estimate(read_steps(out), num_workers=w or None)
    # Two base runs, interleaved with the worker reruns (a slow stretch of the VM hits a base run
    # and a worker run alike), and each worker rerun against each base: the spread the noise
    # allows. One base run made a CI check fail: tune 1.75x [1.65, 1.84] for 2 workers, reruns
    # 0.84x and 0.92x against a single base.
    bases, reruns = [], {1: [], 2: []}
    for k in (0, 1):
        bases.append(rerun(0, k))
        for w in (1, 2):
            reruns[w].append(rerun(w, k))
    measured = {w: sorted(speedup(b, x)[0] for b in bases for x in reruns[w]) for w in (1, 2)}
    skip_if_shared(foreign)        # a neighbour that came halfway changed the truth measured
    # The same holds for a change that no process on this VM shows (the host under it): once,
    # tune's runs were all ~2.2x slower than the reruns just after, and it measured 2 workers at
    # 1.29x [1.11, 1.52] where the reruns gave 0.55-0.59x. The script's baseline step time is
    # the gauge: where tune's baseline runs lie outside the reruns' by more than 1.5x, the reruns
    # measured another machine, and there is nothing to check tune against.
    tuned = [doc["baseline"]["step_time_s"]] + [x["step_time_s"] for x in doc["baseline"]["repeats"]]
    again = [b.step_s for b in bases]
    if min(tuned) > 1.5 * max(again) or max(tuned) < min(again) / 1.5:
        pytest.skip(f"the machine changed speed between tune and the reruns: the baseline's step took "
                    f"{', '.join(f'{1e3 * t:.0f}' for t in tuned)} ms in tune and "
                    f"{', '.join(f'{1e3 * t:.0f}' for t in again)} ms in the reruns")
    # A claim the reruns do not support yet gets up to two more rounds of reruns (a base run and
    # the setting's, interleaved) before it is judged: the truth is a distribution, and four pairs
    # drawn in one stretch of the VM can all lie on one side of it (a CI run: tune 1.17x [1.05, 1.30]
    # for 2 workers, reruns 0.53-0.76x; on this machine 2 workers ran 0.55x and 1.27x, both quiet).
    # A gain measured in one run that the budget left unconfirmed is said to be one (checked below
    # for the recommended setting): it is the noise the confirmation is there for (a CI run: 2
    # workers 1.40x [1.21, 1.61] in one run of tune, 0.86-0.96x in 16 rerun pairs).
    def once(trial):
        return trial["status"] == "faster" and "one run, not confirmed" in (trial.get("reason") or "")

    def supported(w, trial):
        return ((trial["status"] != "faster" or once(trial) or max(measured[w]) > 1.0)
                and (trial["status"] != "slower" or min(measured[w]) < 1.10))
    for w in (1, 2):
        for k in (2, 3):
            if by[f"num_workers={w}"]["status"] == "skipped" or supported(w, by[f"num_workers={w}"]):
                break
            bases.append(rerun(0, f"{k}-for{w}"))
            reruns[w].append(rerun(w, k))
            measured[w] = sorted(speedup(b, x)[0] for b in bases for x in reruns[w])
    skip_if_shared(foreign)
    for w in (1, 2):
        trial = by[f"num_workers={w}"]
        # Where the report ranked another fix higher (a CI machine whose torch ran 1 thread:
        # threads=2 first, measured 1.40x in one run), the budget can run out before a worker
        # trial: a setting tune did not try makes no claim to check.
        if trial["status"] == "skipped":
            assert trial["reason"] == "budget", trial
            print(f"num_workers={w}: not tried (budget), reruns {measured[w]}")
            continue
        print(f"num_workers={w}: tune {trial['speedup']:.2f}x {trial['ci95']} {trial['status']}, reruns {measured[w]}")
        assert trial["status"] != "failed", trial
        if trial["status"] == "faster" and not once(trial):
            assert max(measured[w]) > 1.0, (trial, measured)
        if trial["status"] == "slower":
            assert min(measured[w]) < 1.10, (trial, measured)
    # 1 worker: no material gain on a 2-core machine. tune claims none: not "faster", its interval
    # not above 1.10, and a point estimate under 1.10 unless it says the trial is inconclusive (a
    # CI run: 1.13x [0.76, 1.67] against reruns of 0.65-0.95x; the point of an interval that wide
    # is no claim). The report's model (PD301: one worker on the free core overlaps the ~7% of the
    # step outside the wait, max(1 - f, f / 1)) predicts ~1.07x: at most the step less its wait.
    # f is the report's own (share.input of the baseline's report): the tune document's
    # data_wait_share is the steady window's, and the two differed by 0.011 in a CI run (0.921 and
    # 0.932: 1.0855x against a bound of 1.0833x from the other)
    m = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())["traces"][0]["metrics"]
    f = m["share.input"] - (m.get("loop.peek_order_share") or 0)
    one = by["num_workers=1"]
    assert one["status"] == "skipped" or (
        one["status"] != "faster" and one["ci95"][0] < 1.10
        and (one["status"] == "inconclusive" or one["speedup"] < 1.10)
        and 1.0 <= one["predicted"] <= 1 / max(0.5, f) + 0.001), (one, f)
    best = doc["best"]
    if best and "num_workers" in best["changes"]:
        w = best["changes"]["num_workers"]
        lo, hi = measured[w][0], measured[w][-1]
        assert f"num_workers={w}" in doc["apply"], best
        if best["confirmed"]:               # two runs: within 25% of what the reruns support
            assert hi > 1.0 and 0.75 * lo <= best["speedup"] <= 1.25 * hi, (best, measured)
        else:                               # the budget ran out first (a slow machine): it says so
            said = " ".join(r.stdout.split())                       # rich wraps the line
            assert "one run (no budget left to confirm it)" in said, r.stdout
            assert "one run, not confirmed" in by[f"num_workers={w}"]["reason"], best
