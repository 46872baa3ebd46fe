"""`perfdoctor tune`'s table and the notes under it: step times of each run, how the baseline ran,
failed runs, narrow terminals, trials the budget skipped."""

from __future__ import annotations


import pytest
from tunecases import facts, steady_run

from perfdoctor.tune import plan, verify as V
from perfdoctor.tune.noise import baseline_noise


def test_a_confirmed_trials_row_shows_both_runs_step_times_and_baselines(monkeypatch, tmp_path):
    """regression.py (pytorch/examples) on a busy VM: threads=1's row read 0.378 ms against
    0.555/0.526 ms beside a speed-up of 1.16x, which pooled a second run (0.485 ms against a
    baseline run of 0.459 ms) that the cells did not show. A confirmed row shows both runs."""
    from types import SimpleNamespace

    from perfdoctor.report.tune_labels import tune_step_times
    from perfdoctor.tune import result as R, session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.baselines = [SimpleNamespace(run_dir=tmp_path / "baseline", ok=True, step_s=0.1)]
    first = SimpleNamespace(ok=True, step_s=0.08, run_dir=tmp_path / "01-threads=1", error=None)
    a = S.Outcome(plan.Trial({"threads": 1}, "threads"), "faster", ratio=1.25, ci95=(1.2, 1.3), run=first,
                  bases=t.baselines[:1])
    t.outcomes = [a]
    monkeypatch.setattr(V, "speedup", lambda bases, m: (bases[-1].step_s / m.step_s, (1.15, 1.35)))

    def fake_launch(self, d, ch, **k):
        d.mkdir(parents=True)
        return SimpleNamespace(ok=True, step_s=0.09 if d.name.startswith("baseline") else 0.072, run_dir=d,
                               error=None)
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    t._confirm(a)
    tr = R._trial_doc(a, {})
    assert tr["confirm"]["step_time_s"] == 0.072 and tr["confirm"]["baseline_step_time_s"] == 0.09
    assert tune_step_times(tr) == ("80.0/72.0 ms", "100.0/90.0 ms")
    # a trial run once keeps its one step time and its own baselines
    once = {**tr, "confirm": None}
    assert tune_step_times(once) == ("80.0 ms", "100.0 ms")
    from perfdoctor.report import markdown
    doc = {"command": "train.py", "noise": "", "trials": [tr], "best": None, "skipped_for_budget": [],
           "untested": [], "baseline": {"step_time_s": 0.1, "ci95": [0.09, 0.11], "steps": 30, "verdict": "cpu"}}
    assert "| threads=1 | 80.0/72.0 ms | " in markdown.tune(doc)
    # the best line says both runs' step times too, as its speed-up pools both
    import io

    from rich.console import Console
    best = {"changes": {"threads": 1}, "speedup": a.ratio, "ci95": list(a.ci95), "step_time_s": 0.08, "confirmed": True}
    doc = {**doc, "best": best, "apply": "torch.set_num_threads(1)", "budget_s": 1000, "dir": "runs", "elapsed_s": 60}
    buf = io.StringIO()
    R.render(doc, Console(file=buf, width=200))
    assert "two runs), 80.0/72.0 ms/step. Apply:" in buf.getvalue()
    assert "two runs), 80.0/72.0 ms/step. Apply:" in markdown.tune(doc)
    buf = io.StringIO()
    R.render({**doc, "best": {**best, "confirmed": False}, "trials": [once]}, Console(file=buf, width=200))
    assert "one run (no budget left to confirm it)), 80.0 ms/step. Apply:" in buf.getvalue()


def test_a_baseline_run_several_times_is_explained_under_the_table():
    """A noisy machine: the baseline ran again between trials and each trial is compared with the
    run(s) beside it, so a row's "vs baseline" (62.0 ms) differs from the header's first run
    (59.2 ms). The table says so, with every baseline run's step time; a baseline run once says nothing."""
    import io

    from rich.console import Console

    from perfdoctor.report import markdown
    from perfdoctor.tune.result import render
    tr = {"label": "threads=2", "changes": {"threads": 2}, "rule": "PD346", "predicted": 1.03, "step_time_s": 0.0611,
          "baseline_step_time_s": [0.062], "speedup": 1.02, "ci95": [0.87, 1.19], "status": "inconclusive",
          "reason": None, "confirm": None}
    base = {"step_time_s": 0.0592, "ci95": [0.0583, 0.0604], "steps": 85, "verdict": "input_cpu", "repeats": []}
    doc = {"command": "train.py", "noise": "", "trials": [tr], "best": None, "skipped_for_budget": [], "untested": [],
           "baseline": base, "budget_s": 75, "dir": "runs", "elapsed_s": 70}

    def shown(d):
        buf = io.StringIO()
        render(d, Console(file=buf, width=400))
        return buf.getvalue(), markdown.tune(d)
    for out in shown(doc):
        assert "vs baseline:" not in out and "62.0 ms" in out and "59.2 ms" in out
        # whose prediction the column is (a user compared it with an earlier run's report)
        assert "predicted: the gain this tune's baseline report expects of the fix a trial tests" in out
    assert not any("predicted: the gain" in out for out in shown({**doc, "trials": [{**tr, "predicted": None}]}))
    # a quiet machine: both baseline runs came before the trials (said so: not "between the trials",
    # which a user trial read while every trial ran slower on a machine slowing down)
    again = {**doc, "baseline": {**base, "repeats": [{"dir": "b2", "step_time_s": 0.062}]}}
    for out in shown(again):
        out = out.replace("\\", "")                     # markdown escapes the brackets
        assert "The baseline ran 2 times, before the trials only (and before a confirmation), not after them" in out
        assert "59.2, 62.0 ms/step (the header's is the first)" in out and "hits both sides" not in out
    # a quiet machine with a closing run: the trial was compared with the run before it and the one after
    closed = {**again, "closing": "b3", "baseline": {**base, "repeats": [{"dir": "b2", "step_time_s": 0.062},
                                                                        {"dir": "b3", "step_time_s": 0.064}]},
              "trials": [{**tr, "baseline_dirs": ["b2", "b3"], "baseline_step_time_s": [0.062, 0.064]}]}
    for out in shown(closed):
        out = out.replace("\\", "")
        assert "The baseline ran 3 times, before the trials and once after them all" in out
        assert "62.0/64.0 ms" in out and "found noisy" not in out
    # a noisy one: the baseline ran again after a trial, and the trial was measured against both
    noisy = {**again, "baseline": {**base, "repeats": [{"dir": "b2", "step_time_s": 0.062},
                                                        {"dir": "b3", "step_time_s": 0.064}]},
             "trials": [{**tr, "baseline_dirs": ["b2", "b3"], "baseline_step_time_s": [0.062, 0.064]}]}
    for out in shown(noisy):
        out = out.replace("\\", "")
        assert "The baseline ran 3 times, before the trials and, once the machine was found noisy, after each trial" in out
        assert "after all the trials" not in out


def test_a_run_that_failed_after_some_steps_shows_no_step_time(tmp_path):
    """A trial whose script failed at batch 200 (with workers only) read "13.6 ms | 13.9 ms" beside
    "failed", a measurement it never was: its row and the document show none."""
    from perfdoctor.report.tune_labels import tune_step_times
    from perfdoctor.tune.result import _trial_doc
    from perfdoctor.tune.verify import Outcome
    m = steady_run(tmp_path, "01-num_workers=1", 13.6, {"num_workers": 1})
    m.error = "the script failed (RuntimeError: boom)"
    out = Outcome(plan.Trial({"num_workers": 1}, "loader"), "failed", m.error, run=m,
                  bases=[steady_run(tmp_path, "baseline-2", 13.9)])
    doc = _trial_doc(out, {})
    assert doc["step_time_s"] is None and doc["baseline_step_time_s"] == [pytest.approx(0.0139, rel=0.02)]
    assert tune_step_times(doc) == ("-", "-")
    m.error = None                                    # measured (a loss refusal keeps its time)
    assert tune_step_times(_trial_doc(out, {}))[0].endswith(" ms")


def test_a_failed_runs_tail_names_the_scripts_own_frame_of_an_error_raised_deep_in_a_library(tmp_path):
    """An error raised deep inside torch ends its traceback in torch's frames: the last lines alone
    do not say where the script called it. Its innermost own frame is added above them, once."""
    from perfdoctor.tune.measure import output_tail
    lib = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
    text = ["epoch 1 loss 0.3", "Traceback (most recent call last):",
            '  File "/home/me/train.py", line 40, in <module>', "    main()",
            '  File "/home/me/train.py", line 31, in main', "    out = model(x)"]
    text += [f'  File "{lib}", line {1700 + i}, in _call_impl' for i in range(6)]
    text += ["RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 5x3)"]
    (tmp_path / "output.log").write_text("\n".join(text) + "\n")
    tail, own = output_tail(tmp_path / "output.log", 5)
    assert tail == text[-5:]
    assert own == ["...", '  File "/home/me/train.py", line 31, in main', "    out = model(x)", "..."]
    tail, own = output_tail(tmp_path / "output.log", 12)       # the frame among the last lines: not twice
    assert own == [] and tail == text[-12:]
    # an earlier traceback the script printed and went on from is not this failure's
    (tmp_path / "output.log").write_text("\n".join(text[:6] + ["ValueError: caught", "retrying", *text[1:2],
                                                              *text[6:]]) + "\n")
    assert output_tail(tmp_path / "output.log", 5)[1] == []
    assert output_tail(tmp_path / "missing.log", 5) == (None, [])


@pytest.mark.parametrize("width", [80, 100, 150])
def test_the_table_keeps_every_status_and_whole_numbers_on_a_narrow_terminal(width):
    """A user's tune on a 100-column terminal: the status column had vanished and the speed-ups
    read "1.…". Every row's speed-up, interval and status are whole at any width; below 110
    columns the step-time columns give way (said so under the table)."""
    import io

    from rich.console import Console

    from perfdoctor.tune.result import WIDE, render
    trials = [{"label": "num_workers=1, persistent_workers=True", "changes": {"num_workers": 1}, "rule": "PD301",
               "predicted": 1.07, "step_time_s": 0.0577, "baseline_step_time_s": [0.0554, 0.0523], "speedup": 0.92,
               "ci95": [0.79, 1.07], "status": "inconclusive", "reason": None, "confirm": None},
              {"label": "expandable_segments=True", "changes": {"expandable_segments": True}, "rule": None,
               "predicted": None, "step_time_s": None, "baseline_step_time_s": [], "speedup": None, "ci95": None,
               "status": "skipped", "reason": "no CUDA device", "confirm": None},
              {"label": "optimizer=foreach", "changes": {"optimizer": "foreach"}, "rule": "PD338", "predicted": None,
               "step_time_s": 0.0507, "baseline_step_time_s": [0.0554, 0.0523], "speedup": 1.05, "ci95": [0.9, 1.22],
               "status": "faster", "reason": None, "confirm": None}]
    base = {"step_time_s": 0.058, "ci95": [0.0561, 0.0601], "steps": 326, "verdict": "device", "repeats": []}
    doc = {"command": "mnist_main.py", "noise": "", "trials": trials, "best": None, "skipped_for_budget": [],
           "untested": [], "baseline": base, "budget_s": 150, "dir": "runs", "elapsed_s": 144}
    buf = io.StringIO()
    render(doc, Console(file=buf, width=width))
    out = buf.getvalue()
    for want in ("0.92x", "0.79-1.07", "inconclusive", "1.05x", "0.90-1.22", "faster", "skipped: no CUDA"):
        assert want in out, (want, out)
    assert "…" not in out and all(len(line) <= width for line in out.splitlines())
    assert ("57.7 ms" in out) == (width >= WIDE) and ("a terminal of 110 columns or more" in out) == (width < WIDE)
    # the note under the table names the "vs baseline" column only where it is shown
    doc["baseline"]["repeats"] = [{"dir": "b2", "step_time_s": 0.0554}, {"dir": "b3", "step_time_s": 0.0523}]
    buf = io.StringIO()
    render(doc, Console(file=buf, width=width))
    flat = " ".join(buf.getvalue().split())
    assert ("vs baseline: the baseline run(s) beside each trial" in flat) == (width >= WIDE)
    assert ("Each trial's speed-up is measured against the baseline run(s) beside it. The baseline ran 3 times"
            in flat) == (width < WIDE)


def test_trials_skipped_for_budget_say_how_large_a_budget_would_run_them(monkeypatch, tmp_path):
    """pytorch/examples vae with --budget 120: the baseline ran twice (too few steady steps at 15 s),
    every trial was skipped for budget, and the table said only "raise --budget". With runs of
    ~40 s each, 90 s spent, three skipped trials on a quiet machine and the best's confirmation
    (two runs) and the closing baseline run need about 90 + 6 x 40 = 330 s; on a noisy one each
    trial takes a baseline too, and none closes."""
    import io

    from rich.console import Console

    from perfdoctor.report.outputs import rendered
    from perfdoctor.tune import session as S
    from perfdoctor.tune.result import build, render
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=120), log=lambda s: None)
    t.facts = facts()
    t.baselines = [steady_run(tmp_path, "baseline", 50.0, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    t.longest = 40.0
    monkeypatch.setattr(S.Tuner, "elapsed", lambda self: 90.0)
    for ch, g in (({"threads": 1}, "threads"), ({"optimizer": "foreach"}, "optimizer"), ({"num_workers": 1}, "loader")):
        t._trial(plan.Trial(ch, g))
    doc = build(t)
    assert doc["skipped_for_budget"] == ["threads=1", "optimizer=foreach", "num_workers=1"]
    assert doc["budget_for_all_s"] == 330
    buf = io.StringIO()
    render(doc, Console(file=buf, width=250))
    md = rendered(doc, "markdown", kind="tune").decode()
    for out in (buf.getvalue(), md.replace("\\", "")):
        assert "--budget 330 would run them all, at this run length" in out
    t.noisy = True
    assert build(t)["budget_for_all_s"] == 90 + (3 * 2 + 2) * 40


def test_written_to_a_file_a_long_status_is_whole_and_rows_are_not_padded(monkeypatch, capsys):
    """`tune ... > result.txt`: commands.md says no line is cut there; the status cell had ended
    "...PD306 is the change; othe…" and each row was padded with blanks to ~300 characters."""
    from perfdoctor.report.sanitize import console
    from perfdoctor.tune.result import STATUS_CHARS, render
    monkeypatch.delenv("COLUMNS", raising=False)
    reason = ("the script's own loop makes its samples from scratch every step and PD306 is the change; "
              "other trials of the loader could not apply to a loop without a DataLoader")
    assert len(reason) > STATUS_CHARS
    trial = {"label": "store_samples", "changes": {"store_samples": True}, "rule": "PD306", "predicted": None,
             "step_time_s": 0.01, "baseline_step_time_s": [0.1], "speedup": 10.45, "ci95": [9.8, 11.1],
             "status": "skipped", "reason": reason, "confirm": None}
    doc = {"command": "train.py", "noise": "", "trials": [trial], "best": None, "skipped_for_budget": [],
           "untested": [], "baseline": {"step_time_s": 0.1, "ci95": [0.09, 0.11], "steps": 40, "verdict": "input",
                                        "repeats": []}, "budget_s": 60, "dir": "runs", "elapsed_s": 50}
    render(doc, console())          # capsys: stdout is not a terminal, as a file is
    out = capsys.readouterr().out
    assert reason in out and "…" not in out
    assert not [line for line in out.splitlines() if line != line.rstrip(" ")]
