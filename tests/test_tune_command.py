"""`perfdoctor tune` as a command on real scripts: its errors and exit codes, each run's length,
a failing baseline's output, the baseline's stacks, a trial that keeps the loader's iterator."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from quiet import skip_if_shared
from tunecases import EX, ptune, tuned

from perfdoctor.tune.measure import Measured


def test_usage_errors_exit_2_in_one_line(tmp_path):
    r = ptune()
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "give a script" in r.stderr
    r = ptune(tmp_path / "nope.py")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_an_output_file_that_cannot_be_written_is_refused_before_the_tune_starts(tmp_path):
    """-o into a missing directory was found out after the whole budget (300 s by default): the
    tune ran, then printed one error and no table. It is refused at once, and nothing runs."""
    for bad, why in ((tmp_path / "missing" / "tune.json", "No such file or directory"), (tmp_path, "is a directory")):
        r = ptune("--budget", "10", "--out", tmp_path / "t", "-o", bad, EX / "compute_bound.py")
        assert r.returncode == 2 and r.stderr == f"perfdoctor: error: cannot write {bad}: {why}\n", r.stderr
        assert not (tmp_path / "t").exists()


def test_a_script_perfdoctor_interrupted_after_the_durations_grace_did_not_fail(tmp_path):
    """--duration's stop waits for a step boundary, then sends SIGINT: a script still starting by
    then (import torch on a loaded machine) ends 130 with one step, not measurable (exit 3), not
    failed (exit 1, "nothing to tune")."""
    from perfdoctor.tune.measure import measure_dir
    d = tmp_path / "run"
    d.mkdir()
    (d / "steps.jsonl").write_text(json.dumps({"step": 1, "end": 1.0, "dur": 0.001, "wait": 0.0, "batches": 1}) + "\n")
    child = {"outcome": "interrupted", "exit_code": 130, "steps": 1}
    late = measure_dir(d, {}, 130, child, 35.0, stopped_late=True)
    assert late.error.startswith("not measurable: ") and "perfdoctor interrupted it" in late.error
    assert measure_dir(d, {}, 130, child, 35.0).error == "the script failed (exit code 130)"


def test_a_baseline_with_too_few_steps_says_how_long_a_run_must_be(tmp_path):
    """An LBFGS script (pytorch/examples time_sequence_prediction) took 6 steps in a 38 s run, 6 s
    each: "give it more time (--duration)" did not say how much. The advice comes from the run's
    pace: 10 steady steps plus the ones the run left out; and a script that ended by itself needs
    more steps of its own, which no --duration gives."""
    from perfdoctor.tune.measure import longer_runs, measure_dir
    d = tmp_path / "run"
    d.mkdir()
    ends = [100.0 + 6.0 * i for i in range(1, 7)]            # 6 steps of 6 s
    (d / "steps.jsonl").write_text("".join(json.dumps({"step": i + 1, "end": e, "dur": 6.0, "wait": 0.0,
                                                       "batches": 0}) + "\n" for i, e in enumerate(ends)))
    stopped = measure_dir(d, {}, 0, {"outcome": "stopped", "exit_code": 0, "steps": 6}, 40.0)
    assert stopped.error.startswith("not measurable: only ")
    left_out = 6 - stopped.estimate.n
    text = longer_runs(stopped, 8)
    run_s = math.ceil((10 + left_out) * 6.0 / 5) * 5
    assert "6 step(s) took 36 s here, 6.0 s each" in text and f"--duration {run_s} --budget {8 * run_s}" in text
    ended = measure_dir(d, {}, 0, {"outcome": "completed", "exit_code": 0, "steps": 6}, 40.0)
    text = longer_runs(ended, 8)
    assert "ended by itself after 6 step(s)" in text and "--duration" not in text
    # sys.exit(0) from the loop ends it as well: not "the script failed (exit)", exit 1
    exited = measure_dir(d, {}, 0, {"outcome": "exit", "exit_code": 0, "steps": 6}, 40.0)
    assert exited.error.startswith("not measurable: only ") and "ended by itself after 6 step(s)" in longer_runs(exited, 8)
    assert measure_dir(d, {}, 2, {"outcome": "exit", "exit_code": 2, "steps": 6}, 40.0).error == "the script failed (exit code 2)"
    assert longer_runs(stopped, 8, max_steps=6).startswith("--max-steps 6 stopped it")
    # 200 steps of 0.1 s the estimator found correlated over too many steps: not "runs of 20 s"
    # after a 20 s run (its reasons other than too few steady steps: twice the run)
    from types import SimpleNamespace
    steps = [{"step": i + 1, "end": 200 + 0.1 * (i + 1), "dur": 0.1} for i in range(200)]
    est = SimpleNamespace(n=196, reason="step times stay correlated over 60 steps (2 burst cycles), more than 1/4 "
                                        "of the 196 steady steps: run longer")
    corr = Measured(d, {}, 0, "stopped", 25.0, steps, estimate=est, error="not measurable: " + est.reason)
    assert longer_runs(corr, 8) == "200 step(s) took 20 s here: runs about twice as long, --duration 40 --budget 320"


SLOW_START = textwrap.dedent("""
    import sys, time
    time.sleep(float(sys.argv[1]))          # a slow start: loading a model, data, compiling
    import torch
    torch.set_num_threads(1)
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    while True:
        opt.zero_grad(); m(x).sum().backward(); opt.step(); time.sleep(0.01)
""")


def test_each_runs_duration_counts_from_its_first_step(tmp_path):
    """A tune run trains for --duration seconds however long the script takes to start: 3 s of
    sleep before `import torch` left `run --duration 2` (counted from the launch) no step at all."""
    pytest.importorskip("torch")
    from perfdoctor.collect.launcher import RunConfig, launch as _launch
    from perfdoctor.tune.measure import run_once
    script = tmp_path / "slow.py"
    script.write_text(SLOW_START)
    m = run_once([str(script), "3"], None, tmp_path / "tune", {}, run_s=2, max_steps=None)
    assert m.ok, m.error
    trained = sum(s["dur"] for s in m.steps)
    assert 1.5 <= trained and m.wall_s >= 3 + 2 and m.estimate.n >= 50, (trained, m.wall_s)
    res = _launch(RunConfig(argv=[str(script), "3"], run_dir=tmp_path / "run", duration=2, trace=False))
    assert res.stopped_by == "duration" and res.exit_code == 0 and res.child.get("steps", 0) == 0


def test_a_script_with_no_step_within_the_startup_limit_is_stopped(tmp_path):
    from perfdoctor.collect.launcher import RunConfig, launch as _launch
    script = tmp_path / "slow.py"
    script.write_text(SLOW_START)
    res = _launch(RunConfig(argv=[str(script), "60"], run_dir=tmp_path / "run", duration=2, duration_from="first-step",
                            startup_s=2, trace=False))
    assert res.stopped_by == "duration" and res.exit_code == 0 and res.wall_s < 20
    assert "no training step within 2 s of the launch (--duration counts from the first step): asked the script " \
           "to stop" in res.notes


def test_a_failing_baseline_exits_1_with_the_scripts_output(tmp_path):
    pytest.importorskip("torch")
    r = ptune("--budget", "60", "--duration", "60", "--out", tmp_path / "t", "-o", tmp_path / "t.json", EX / "crash.py",
              "--crash-after", "3")
    assert r.returncode == 1
    # -o FILE and tune.json are written all the same: why, and no trial (a CI job reading the file
    # had found none)
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc == json.loads((tmp_path / "t" / "tune.json").read_text())
    error = r.stderr.strip().splitlines()[-1]
    assert doc["failed"] == {"exit_code": 1, "error": error.removeprefix("perfdoctor: error: ")}
    assert doc["baseline"] is None and doc["trials"] == [] and doc["best"] is None
    assert doc["command"].endswith("crash.py --crash-after 3")
    # the script's own traceback, from the end of its output.log (its output stays there, not here)
    log = tmp_path / "t" / "baseline" / "output.log"
    assert "Traceback (most recent call last)" in log.read_text()
    assert f"line(s) of its output ({log}):" in r.stderr and "[perfdoctor tune]   Traceback (most recent" in r.stderr
    # --show-output: through, as the script writes it, and no file
    r = ptune("--show-output", "--budget", "60", "--duration", "60", "--out", tmp_path / "s", "-o", tmp_path / "s.md",
              "-f", "markdown", EX / "crash.py", "--crash-after", "3")
    assert r.returncode == 1 and "\nTraceback (most recent call last)" in r.stderr
    assert "Not tuned (exit code 1): baseline: the script failed" in (tmp_path / "s.md").read_text()
    assert "line(s) of its output" not in r.stderr and not (tmp_path / "s" / "baseline" / "output.log").exists()
    assert "perfdoctor: error: baseline: the script failed" in r.stderr
    assert (tmp_path / "t" / "baseline" / "steps.jsonl").exists()


PRODUCER_LOOP = textwrap.dedent("""
    import random, time
    from concurrent.futures import ThreadPoolExecutor
    import torch

    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)     # a ~1 ms step even beside a neighbour (two threads: 88 ms there)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def load(i):                 # one loader thread: 40-60 ms of remote-read-like waiting a batch
        time.sleep(random.uniform(0.04, 0.06))
        return torch.randn(32, 64), torch.randint(0, 4, (32,))

    pool = ThreadPoolExecutor(max_workers=1)
    ahead = pool.submit(load, 0)           # one batch made ahead (pool.map would queue all at once)
    for i in range(1, 100_000):
        x, y = ahead.result()
        ahead = pool.submit(load, i)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
""")


def test_the_baseline_records_python_stacks_so_a_loop_waiting_on_its_producers_is_found(tmp_path):
    """A loop fed by its own ThreadPoolExecutor (no DataLoader) waits in the pool's results, which
    only the Python stacks see. tune's baseline ran without them: its report read HOST-BOUND with
    no PD369, and "not measured by tune" left out the one fix that mattered (`run` of the same
    script: INPUT-BOUND, PD369 first, ~2.00x). The baseline records them as `run` does (--stacks
    here: auto mode needs an idle core); the trials do not."""
    pytest.importorskip("torch")
    from perfdoctor.collect.stacks import find_py_spy
    if find_py_spy() is None:
        pytest.skip("py-spy not installed")
    script = tmp_path / "pool_train.py"
    script.write_text(PRODUCER_LOOP)
    out = tmp_path / "t"
    # --only compile (not allowed here: skipped): the baseline and its repeat, no trial to wait for;
    # the repeat runs where two more runs as long as the longest fit the budget (a CI baseline with
    # its trace and stacks took over 15 s: 30 s left no repeat, and nothing to check it against)
    r = ptune("--stacks", "--budget", "90", "--duration", "4", "--only", "compile", "--out", out, script)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "baseline" / "report.json").read_text())
    if rep["stacks"] is None:
        notes = " ".join(rep["run"]["notes"])
        assert "ptrace" in notes, notes
        pytest.skip("py-spy could not attach here: " + notes)
    # the producer (50 ms a batch) paces a step whose own work is ~1 ms; on a shared machine the
    # trainer's own share grows, so only PD369's own threshold is asserted: no timing judged here
    assert rep["traces"][0]["metrics"]["stacks.producer_wait_share"] >= 0.05
    found = {f["id"]: f for f in rep["findings"]}
    assert "PD369" in found and found["PD369"].get("ranked"), list(found)
    doc = json.loads((out / "tune.json").read_text())
    left = {u["id"]: u for u in doc["untested"]}
    assert left["PD369"]["ranked"] and left["PD369"]["expected"] > 1.0, doc["untested"]
    said = " ".join(r.stdout.split())
    assert "not measured by tune" in said and "PD369 The loop waits on its own producer threads" in said
    # only the baseline's first run is sampled: its repeat (and the trials) run as they always did
    others = [d for d in out.iterdir() if d.is_dir() and d.name != "baseline"]
    assert others and not any((d / "stacks" / "pyspy.meta.json").exists() for d in others)


@pytest.mark.slow
@pytest.mark.quiet      # it judges a measured speed-up: alone, or skipped with the figure when shared
def test_tune_measures_keeping_the_iterator_a_script_re_creates_every_step(tmp_path):
    """The every-step iterator over a shuffled TensorDataset (the sampler's order drawn each step):
    the baseline's report ranks PD355 first and tune measures its trial faster, predicted by it."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.set_num_threads(1)
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        loader = DataLoader(TensorDataset(torch.rand(400_000, 16), torch.rand(400_000, 1)), batch_size=32,
                            shuffle=True)
        for step in range(10 ** 6):
            x, y = next(iter(loader))
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """))
    # --only: the iterator's trial alone, and a budget for the baseline, its second run, the trial and
    # the run it keeps for a baseline after it (the closing run, or a noisy machine's), seldom for its
    # confirmation (the other trials and the second runs took 20 s more; plan.plan puts this trial
    # first where PD355 ranks first). 32 s left the trial out on a quiet CI machine whose runs took
    # ~9 s each with their start: two runs gone, the 2 x 9 s the trial needs did not fit.
    doc, foreign = tuned(tmp_path, script, "--budget", "44", "--duration", "3", "--only", "iterator")
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    assert next(f["id"] for f in report["findings"] if f.get("ranked")) == "PD355"
    keep, = doc["trials"]
    assert keep["changes"] == {"keep_iterator": True} and keep["rule"] == "PD355" and keep["predicted"] > 2
    if keep["reason"] == "budget":     # a noisy machine: a baseline repeated before the trial took the budget
        skip_if_shared(foreign)        # (CI: other processes used 1.0 of 2 cores, 16.7 s gone before the trial)
    assert keep["status"] == "faster" and keep["speedup"] > 2, json.dumps(keep)
    assert doc["best"]["changes"] == {"keep_iterator": True} and doc["apply"].startswith("it = iter(loader)")
