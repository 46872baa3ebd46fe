"""`perfdoctor tune`'s session on stand-in runs: the fallbacks between trials, the best's
confirmation, the closing baseline, judging against the run-to-run spread, the document."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tunecases import LOADER0, facts, steady_run

from perfdoctor.tune import plan, verify as V
from perfdoctor.tune.noise import baseline_noise


@pytest.mark.parametrize("crashed", [True, False])
def test_a_crashed_graph_replay_trial_is_followed_by_default_compile(monkeypatch, tmp_path, crashed):
    """The graph-replay run itself failed: default-mode compile is tried next. A trial refused for
    its loss (the run went fine) is not tried again in another mode."""
    from types import SimpleNamespace

    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000, allow_compile=True),
                log=lambda s: None)
    def baseline(self):
        self.facts = facts(cuda=True, graph_replay=True, verdict="host", data_wait=0.0, loader=None)
    tried = []
    def trial(self, tr):
        tried.append(tr.label)
        comp = bool(tr.changes.get("compile"))
        out = S.Outcome(tr, "failed" if comp else "no change",
                        run=SimpleNamespace(ok=not (comp and crashed)))
        self.outcomes.append(out)
        return out
    monkeypatch.setattr(S.Tuner, "_baseline", baseline)
    monkeypatch.setattr(S.Tuner, "_trial", trial)
    monkeypatch.setattr(S.Tuner, "_confirm_best", lambda self: None)
    t.run()
    i = tried.index("compile=reduce-overhead")
    if crashed:
        assert tried[i + 1] == "compile=True" and tried.count("compile=True") == 1
    else:
        assert "compile=True" not in tried


def test_a_combined_trial_credits_no_single_fix(tmp_path):
    """recompute=off + threads=2: its rule names both fixes and its prediction combines theirs
    (savings add), so the HTML's "measured by tune" never gives one fix the pair's speed-up."""
    from perfdoctor.rules.gain import combined
    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.facts = facts()                      # a CPU run
    t.fixes = {"PD346": {"gain": {"expected": 1.76}}, "PD345": {"gain": {"expected": 1.10}}}
    pair = plan.Trial({"recompute": "off", "threads": 2}, "combined")
    assert t._prediction(pair) == ("PD345+PD346", pytest.approx(combined([1.10, 1.76])))
    assert t._prediction(plan.Trial({"threads": 2}, "threads")) == ("PD346", 1.76)
    t.fixes.pop("PD345")                   # one part without a prediction: the pair has none
    assert t._prediction(pair) == ("PD345+PD346", None)
    # a fused optimizer is PD338's, which has no expected gain on a CPU: the pair has none either
    assert t._prediction(plan.Trial({"optimizer": "fused", "threads": 2}, "combined")) == ("PD338+PD346", None)


def test_best_is_confirmed_by_a_second_run(monkeypatch, tmp_path):
    """The best setting runs again; one that is not faster in its second run is no longer best, and
    the next best is confirmed in turn. Reported: the geometric mean, an interval spanning both."""
    from types import SimpleNamespace

    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.baselines = [SimpleNamespace(run_dir=tmp_path / "baseline", ok=True, step_s=0.1)]
    a = S.Outcome(plan.Trial({"num_workers": 2}, "loader"), "faster", ratio=1.5, ci95=(1.4, 1.6))
    b = S.Outcome(plan.Trial({"threads": 2}, "threads"), "faster", ratio=1.2, ci95=(1.1, 1.3))
    c = S.Outcome(plan.Trial({"optimizer": "foreach"}, "optimizer"), "slower", ratio=0.9, ci95=(0.85, 0.95))
    t.outcomes = [a, b, c]
    second = iter([(0.9, (0.8, 1.05)), (1.25, (1.15, 1.35))])
    launched, compared = [], []
    monkeypatch.setattr(V, "speedup", lambda bases, m: compared.append(bases[-1].run_dir.name) or next(second))
    def fake_launch(self, d, ch, **k):            # a run directory, as a real run leaves one
        d.mkdir(parents=True)
        launched.append((d.name, ch))
        # the baseline as fast as the first time: no run-to-run spread to widen the intervals
        return SimpleNamespace(ok=True, step_s=0.1 if d.name.startswith("baseline") else 0.08, run_dir=d, error=None)
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    t._confirm_best()
    # each second run right after a fresh baseline run, and compared with it
    assert launched == [("baseline-2", {}), ("01-confirm-num_workers=2", {"num_workers": 2}),
                        ("baseline-3", {}), ("02-confirm-threads=2", {"threads": 2})]
    assert [b.run_dir.name for b in t.baselines] == ["baseline", "baseline-2", "baseline-3"] and compared == ["baseline-2", "baseline-3"]
    # the second run outside the first one's interval: the runs disagree, the interval spans both
    assert a.status == "inconclusive" and "0.90x [0.80, 1.05], beyond the first run's interval" in a.reason
    assert a.ratio == pytest.approx((1.5 * 0.9) ** 0.5) and a.ci95 == (0.8, 1.6)
    # two runs that agree: their mean, with the narrower interval of two measurements
    assert b.status == "faster" and b.ratio == pytest.approx(1.226, abs=0.001)
    assert b.ci95 == pytest.approx((1.157, 1.299), abs=0.002) and "both runs: 1.23x [1.16, 1.30]" in b.reason
    assert t.best() is b and b.confirm["speedup"] == 1.25 and c.confirm is None
    d = S.Outcome(plan.Trial({"threads": 4}, "threads"), "faster", ratio=1.1, ci95=(1.05, 1.15))
    t.outcomes.append(d)
    t._confirm_best()                         # b stays best and confirmed; d is faster in one run only
    assert d.confirm is None and d.reason == "one run, not confirmed" and "not confirmed" not in (b.reason or "")
    # a setting faster than b in one run, with no budget left to run it again, is not recommended
    # over b, which was faster in both of its runs
    e = S.Outcome(plan.Trial({"threads": 2, "num_workers": 1}, "combined"), "faster", ratio=1.3, ci95=(1.2, 1.4))
    t.outcomes.append(e)
    monkeypatch.setattr(S.Tuner, "_fits", lambda self, n: False)
    t._confirm_best()
    assert e.confirm is None and t.best() is b


def test_two_runs_are_weighed_by_their_intervals_and_runs_that_disagree_span_both():
    from perfdoctor.stats.speedups import two_runs
    r, (lo, hi), ok = two_runs(1.2, (1.1, 1.3), 1.25, (1.15, 1.35))
    assert ok and r == pytest.approx(1.226, abs=0.001) and (lo, hi) == pytest.approx((1.157, 1.299), abs=0.001)
    # the narrower interval weighs more: threads=1 on a busy VM, 21x [1.77, 247] then 5.1x [0.69, 37.6]
    r, (lo, hi), ok = two_runs(21.28, (1.77, 247.35), 5.10, (0.69, 37.61))
    assert ok and 5.1 < r < 21.28 and lo > 1
    assert two_runs(1.5, (1.4, 1.6), 0.9, (0.8, 1.05))[1:] == ((0.8, 1.6), False)
    _, (lo, hi), ok = two_runs(1.02, (0.9, 1.15), 0.98, (0.85, 1.12))
    assert ok and lo < 1 < hi                    # no gain either time: none together


def _tuner_on(monkeypatch, tmp_path, runs: dict, budget_s=1000):
    """A Tuner whose runs are `runs[dir name]` (ms per step), launched in order, as _launch would."""
    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=budget_s), log=lambda s: None)
    t.facts = facts()
    launched = []

    def fake_launch(self, d, ch, **k):            # a run directory, as a real run leaves one
        d.mkdir(parents=True)
        launched.append(d.name)
        self.last = steady_run(tmp_path, d.name, runs[d.name], ch, seed=len(launched))
        return self.last
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    return t, launched


def test_a_drift_during_the_trials_is_judged_against_a_closing_baseline(monkeypatch, tmp_path):
    """A user trial on a quiet VM: the baseline ran twice at the same pace before the trials, then
    the machine slowed, and every trial read 0.77-0.82x, "slower", against the runs before it. The
    baseline now runs once more after the trials: each trial is compared with the run before it
    and that one, pooled, and the spread of all three baseline runs widens every interval, so a
    drift no longer reads as a loss; the note says the machine drifted."""
    t, launched = _tuner_on(monkeypatch, tmp_path, {"baseline-2": 100.0, "01-optimizer=foreach": 118.0,
                                                    "02-threads=1": 122.0, "baseline-3": 125.0})
    t.baselines = [steady_run(tmp_path, "baseline", 100.0, seed=9)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    t._repeat_baseline()
    a = t._trial(plan.Trial({"optimizer": "foreach"}, "optimizer"))
    b = t._trial(plan.Trial({"threads": 1}, "threads"))
    assert not t.noisy and a.status == b.status == "slower" and a.ratio < 0.9 and b.ratio < 0.85
    t._close()
    assert launched[-1] == "baseline-3" and t.closing is t.baselines[-1]
    for o in (a, b):
        assert [x.run_dir.name for x in o.bases] == ["baseline-2", "baseline-3"]
        assert o.status == "inconclusive" and o.ci95[0] < 1 < o.ci95[1]
    assert t.noisy and "the machine drifted during the trials" in t.noise_text
    assert re.search(r"/step after \(\+2[45]\.\d%\)", t.noise_text), t.noise_text
    from perfdoctor.tune.result import build
    doc = build(t)
    assert doc["closing"] == str(tmp_path / "baseline-3")
    assert doc["trials"][0]["baseline_step_time_s"] == pytest.approx([0.1, 0.125], rel=0.01)


def test_a_best_compared_with_the_closing_run_gets_a_fresh_baseline_for_its_second_run(monkeypatch, tmp_path):
    """On a quiet machine the closing run changes little. The best setting, compared with it, runs
    again after a fresh baseline run of its own (a baseline shared by its two comparisons would
    make two_runs weigh them as more independent than they are); a best that was not compared
    with the closing run (interleaved on a noisy machine) may start from it."""
    t, launched = _tuner_on(monkeypatch, tmp_path, {"baseline-2": 100.0, "01-num_workers=2": 80.0,
                                                    "02-threads=1": 101.0, "baseline-3": 100.5,
                                                    "baseline-4": 100.2, "03-confirm-num_workers=2": 80.5})
    t.baselines = [steady_run(tmp_path, "baseline", 100.0, seed=9)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    t._repeat_baseline()
    a = t._trial(plan.Trial({"num_workers": 2}, "loader"))
    b = t._trial(plan.Trial({"threads": 1}, "threads"))
    t._close()
    assert not t.noisy and "drifted" not in t.noise_text and t.closing.run_dir.name == "baseline-3"
    assert [x.run_dir.name for x in b.bases] == ["baseline-2", "baseline-3"] and b.status == "no change"
    assert not t._reuse(a)
    t._confirm_best()
    assert launched == ["baseline-2", "01-num_workers=2", "02-threads=1", "baseline-3", "baseline-4",
                        "03-confirm-num_workers=2"]
    assert [x.run_dir.name for x in a.bases] == ["baseline-2", "baseline-3"]
    assert a.confirm["baseline_step_time_s"] == t.baselines[-1].step_s and t.baselines[-1].run_dir.name == "baseline-4"
    assert a.status == "faster" and a.ratio == pytest.approx(1.25, rel=0.03) and "a second run: 1.2" in a.reason
    # an interleaved best, the closing run the last one launched: that run is its fresh baseline
    c = S_outcome(plan.Trial({"threads": 2}, "threads"), "faster")
    c.bases = t.baselines[1:2]
    t.last = t.closing
    assert t._reuse(c) and not t._reuse(a)


def test_no_closing_baseline_without_a_trial_compared_with_earlier_runs_only(monkeypatch, tmp_path):
    """Nothing to judge again (every trial interleaved, or failed): no closing run is spent."""
    t, launched = _tuner_on(monkeypatch, tmp_path, {})
    t.baselines = [steady_run(tmp_path, "baseline", 100.0, seed=9)]
    t.outcomes = [S_outcome(plan.Trial({"threads": 1}, "threads"), "failed")]
    t._close()
    assert launched == [] and t.closing is None


def S_outcome(trial, status):
    from perfdoctor.tune.verify import Outcome
    return Outcome(trial, status)


def test_a_second_run_that_found_no_gain_does_not_confirm_the_fastest_of_several(monkeypatch, tmp_path):
    """The best trial is the fastest of several, so its first estimate leans high: averaged with a
    second run of exactly 1.00x it read 1.22x [1.04, 1.43], 'confirmed' (review). The second run
    must find a gain itself."""
    from types import SimpleNamespace

    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.baselines = [SimpleNamespace(run_dir=tmp_path / "baseline", ok=True, step_s=0.1)]
    a = S.Outcome(plan.Trial({"num_workers": 2}, "loader"), "faster", ratio=1.5, ci95=(1.2, 1.9))
    t.outcomes = [a]
    monkeypatch.setattr(V, "speedup", lambda bases, m: (1.0, (0.8, 1.25)))

    def fake_launch(self, d, ch, **k):
        d.mkdir(parents=True)
        return SimpleNamespace(ok=True, step_s=0.1, run_dir=d, error=None)
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    t._confirm(a)
    assert a.status == "inconclusive" and "a second run measured 1.00x [0.80, 1.25]: not confirmed" in a.reason


def test_two_runs_faster_by_amounts_they_do_not_share_stay_faster(monkeypatch, tmp_path):
    """Keeping a re-created iterator measured 34x [27, 44] on a quiet machine; on a CI machine its
    second run read outside the first's interval and the trial became 'inconclusive', though both
    runs were many times faster. Faster both times is a measured gain; only its size is in doubt."""
    from types import SimpleNamespace

    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.baselines = [SimpleNamespace(run_dir=tmp_path / "baseline", ok=True, step_s=0.01)]
    second = {"r": (15.0, (12.0, 19.0))}
    monkeypatch.setattr(V, "speedup", lambda bases, m: second["r"])

    def fake_launch(self, d, ch, **k):
        d.mkdir(parents=True)
        return SimpleNamespace(ok=True, step_s=0.01, run_dir=d, error=None)
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    a = S.Outcome(plan.Trial({"keep_iterator": True}, "iterator"), "faster", ratio=34.0, ci95=(27.0, 44.0))
    t.outcomes = [a]
    t._confirm(a)
    assert a.status == "faster" and a.ratio == pytest.approx((34 * 15) ** 0.5) and a.ci95 == (12.0, 44.0)
    assert "15.00x [12.00, 19.00], beyond the first run's interval: faster both times" in a.reason
    # a second run whose interval reaches below 1 leaves the size and the direction in doubt
    second["r"] = (1.1, (0.9, 1.3))
    b = S.Outcome(plan.Trial({"num_workers": 2}, "loader"), "faster", ratio=1.6, ci95=(1.4, 1.8))
    t.outcomes.append(b)
    t._confirm(b)
    assert b.status == "inconclusive" and b.reason.endswith("the runs disagree") and b.ci95 == (0.9, 1.8)


def test_a_second_run_that_other_processes_slowed_says_so(monkeypatch, tmp_path):
    """A GAN on a shared 2-core VM: fused Adam 1.12x [1.08, 1.16] in its first run, then its
    confirm run took 760 ms a step (a 20 ms step) while other processes used 0.8 of the 2 cores;
    the reason said only 'the runs disagree', where a trial's says what the machine did."""
    from types import SimpleNamespace

    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["gan.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.baselines = [SimpleNamespace(run_dir=tmp_path / "baseline", ok=True, step_s=0.022, other_load=0.02, cores=2)]
    a = S.Outcome(plan.Trial({"optimizer": "fused"}, "optimizer"), "faster", ratio=1.12, ci95=(1.08, 1.16))
    t.outcomes = [a]
    monkeypatch.setattr(V, "speedup", lambda bases, m: (0.04, (0.02, 0.10)))
    load = {"baseline": 0.29, "confirm": 0.8}

    def fake_launch(self, d, ch, **k):
        d.mkdir(parents=True)
        kind = "baseline" if d.name.startswith("baseline") else "confirm"
        return SimpleNamespace(ok=True, step_s=0.0328 if kind == "baseline" else 0.760, run_dir=d, error=None,
                               other_load=load[kind], cores=2)
    monkeypatch.setattr(S.Tuner, "_launch", fake_launch)
    t._confirm(a)
    assert a.status == "inconclusive" and "the runs disagree" in a.reason
    assert a.reason.endswith("other processes used up to 0.8 cores during the second run")
    # a quiet second run: nothing about other processes
    b = S.Outcome(plan.Trial({"optimizer": "foreach"}, "optimizer"), "faster", ratio=1.12, ci95=(1.08, 1.16))
    t.outcomes.append(b)
    load.update(baseline=0.02, confirm=0.1)
    t._confirm(b)
    assert b.status == "inconclusive" and "other processes" not in b.reason


def test_an_interval_that_spans_a_gain_and_a_loss_is_inconclusive_not_no_change():
    from perfdoctor.tune.measure import judged
    assert judged(1.02, 1.3) == "faster" and judged(0.5, 0.97) == "slower"
    assert judged(0.93, 1.08) == "no change"                 # within 10% either way: nothing material
    assert judged(0.01, 133.62) == "inconclusive"            # a busy machine's 1.08x (user trial)
    assert judged(0.69, 37.61) == "inconclusive" and judged(0.95, 1.3) == "inconclusive"


def test_a_failed_trials_reason_is_its_errors_first_and_last_line():
    from perfdoctor.tune.measure import gist
    worker = ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
              '  File "worker.py", line 374, in _worker_loop\n    data = fetcher.fetch(index)\n'
              "RuntimeError: db handle used from another process\n")
    assert gist(worker) == ("Caught RuntimeError in DataLoader worker process 0. ... "
                            "RuntimeError: db handle used from another process")
    assert gist("ValueError: bad") == "ValueError: bad" and gist("") is None and gist(None) is None
    assert len(gist("x" * 1000)) == 240


def test_the_reports_fixes_no_trial_tested_are_listed():
    from types import SimpleNamespace

    from perfdoctor.tune.result import untested
    t = SimpleNamespace(
        outcomes=[SimpleNamespace(trial=SimpleNamespace(rule="PD301")), SimpleNamespace(trial=SimpleNamespace(rule="PD338+PD346"))],
        fixes={"PD317": {"kind": "fix", "title": "Profile", "ranked": False, "gain": None},
               "PD306": {"kind": "fix", "title": "Preprocess", "ranked": True, "gain": {"expected": None, "ceiling": 5.28}},
               "PD301": {"kind": "fix", "title": "Workers", "ranked": True, "gain": {"expected": 1.9, "ceiling": 5.28}},
               "PD346": {"kind": "fix", "title": "Threads", "ranked": True, "gain": {"expected": 1.1, "ceiling": 1.2}},
               "PD201": {"kind": "flag", "title": "num_workers=0"}})
    got = untested(t)
    assert [u["id"] for u in got] == ["PD306"] and got[0]["ceiling"] == 5.28 and got[0]["expected"] is None


@pytest.mark.parametrize("second_ms, status", [(167.6, "inconclusive"), (105.0, "slower")])
def test_trials_are_judged_against_the_run_to_run_spread(monkeypatch, tmp_path, second_ms, status):
    """Two runs of the unchanged script measured 106.7 and 167.6 ms/step on the shared VM, each
    with a tight interval, and a trial (AdamW foreach, which changes nothing measurable there)
    152 ms: against the first run alone it read 0.70x [0.67, 0.74], "slower". Its interval now
    spans the spread of the baseline runs, so it cannot tell (inconclusive: not "no change", which
    says nothing material changed); with two baseline runs that agree, the same trial is still
    slower."""
    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.facts = facts()
    t.baselines = [steady_run(tmp_path, "baseline", 106.7, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    assert not t.noisy and t.spread is None
    runs = iter([steady_run(tmp_path, "baseline-2", second_ms, seed=2),
                 steady_run(tmp_path, "01-optimizer=foreach", 152.0, {"optimizer": "foreach"}, seed=3),
                 steady_run(tmp_path, "baseline-3", second_ms, seed=4)])
    monkeypatch.setattr(S.Tuner, "_launch", lambda self, d, ch, **k: next(runs))
    t._repeat_baseline()
    assert t.spread == S.run_spread([b.step_s for b in t.baselines])
    assert t.spread == pytest.approx(S.run_spread([0.1067, second_ms / 1e3]), abs=0.005)
    assert t.noisy == (second_ms == 167.6)                  # a spread past NOISY_RUNS: interleave from now on
    assert f"run-to-run spread +-{100 * t.spread:.1f}%" in t.noise_text
    out = t._trial(plan.Trial({"optimizer": "foreach"}, "optimizer"))
    lo, hi = out.ci95
    assert out.status == status and lo <= out.ratio <= hi
    if status == "inconclusive":
        assert [b.run_dir.name for b in out.bases] == ["baseline-2", "baseline-3"] and lo < 1 / 1.1 and hi > 1.1
    else:                                                    # a quiet machine: one baseline before it
        assert [b.run_dir.name for b in out.bases] == ["baseline-2"] and hi < 1
    # terminal and markdown say the same: the baseline runs each row was compared with, and what
    # no faster trial means (runs that could not tell, or a measured "keep the script as it is")
    import io

    from rich.console import Console

    from perfdoctor.report.outputs import rendered
    from perfdoctor.tune.result import build, render
    t.outcomes = [out]
    doc = build(t)
    buf = io.StringIO()
    render(doc, Console(file=buf, width=250))
    md = rendered(doc, "markdown", kind="tune").decode()
    vs = "/".join(f"{b.step_s * 1e3:.1f}" for b in out.bases) + " ms"
    for text in (buf.getvalue(), md.replace("\\", "")):
        assert vs in text and "none of the trials was measurably faster" in text
        assert ("1 trial(s) inconclusive" in text) == (status == "inconclusive")
        assert ("keep the script as it is" in text) == (status == "slower")


def test_the_document_keeps_short_step_times_to_six_digits(monkeypatch, tmp_path):
    """Times in tune's JSON keep 6 significant digits, so the run-to-run spread printed with them
    can be recomputed from them for 0.25 ms steps too (rounded to whole microseconds, 0.252 and
    0.247 ms gave 0.0142 where the document said 0.013)."""
    from perfdoctor.stats.speedups import run_spread
    from perfdoctor.tune import session as S
    from perfdoctor.tune.result import build
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.facts = facts()
    t.baselines = [steady_run(tmp_path, "baseline", 0.2523, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    runs = iter([steady_run(tmp_path, "baseline-2", 0.2471, seed=2)])
    monkeypatch.setattr(S.Tuner, "_launch", lambda self, d, ch, **k: next(runs))
    t._repeat_baseline()
    doc = build(t)
    b = doc["baseline"]
    times = [b["step_time_s"]] + [x["step_time_s"] for x in b["repeats"]]
    assert len(times) == 2 and all(1e-4 < x < 1e-3 for x in times)
    assert times == [float(f"{x.step_s:.6g}") for x in t.baselines]
    assert doc["run_spread"] == pytest.approx(run_spread(times), abs=6e-5)     # the spread, to 4 decimals


def test_the_verdict_is_worded_as_the_report_words_it_and_no_advice_follows_no_trial(monkeypatch, tmp_path):
    """A CPU run's "device" verdict is COMPUTE-BOUND (CPU), as `run` prints it; when every trial was
    skipped, no "keep the script as it is" follows (nothing was measured to say so)."""
    import io

    from rich.console import Console

    from perfdoctor.tune import session as S
    from perfdoctor.tune.result import build, render
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.facts = facts()
    t.doc = {"verdict": {"bound": "device"}, "traces": [{"metrics": {"trace.platform": "cpu"}}]}
    t.baselines = [steady_run(tmp_path, "baseline", 50.0, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    t.outcomes = [S.Outcome(plan.Trial({"tf32": True}, "precision"), "skipped", reason="no CUDA device")]
    doc = build(t)
    assert doc["baseline"]["verdict"] == "device" and doc["baseline"]["verdict_title"] == "COMPUTE-BOUND (CPU)"
    buf = io.StringIO()
    render(doc, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "verdict COMPUTE-BOUND (CPU);" in out and "nothing was measured" in out
    assert "keep the script" not in out and "keep the script" in doc["apply"]
    t.doc["traces"][0]["metrics"]["trace.platform"] = "cuda"
    assert build(t)["baseline"]["verdict_title"] == "DEVICE-BOUND"


def test_predicted_says_question_mark_only_for_a_fix_the_report_offers(tmp_path):
    """pytorch/examples dcgan, compute-bound on a shared CPU: its report raised PD348, PD338 and
    PD319, yet the num_workers rows read "? (PD301)", which the docs define as "the report offers
    that fix without a model". A fix the report did not raise predicts nothing; one it raised
    without a model is "?"; a modelled one shows its gain. Terminal and markdown say the same."""
    import io

    from rich.console import Console

    from perfdoctor.report.outputs import rendered
    from perfdoctor.tune import session as S
    from perfdoctor.tune.result import build, render
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    t.facts = facts(verdict="device", data_wait=0.0, loader={**LOADER0, "num_workers": 2})
    t.doc = {"verdict": {"bound": "device"}, "traces": [{"metrics": {"trace.platform": "cpu"}}]}
    t.fixes = {"PD338": {"id": "PD338", "gain": {"expected": 1.0655}}, "PD312": {"id": "PD312", "gain": {}}}
    t.baselines = [steady_run(tmp_path, "baseline", 50.0, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    for ch, g in (({"optimizer": "fused"}, "optimizer"), ({"compile": True}, "compile"), ({"num_workers": 1}, "loader")):
        t._trial(plan.Trial(ch, g, skip="budget"))
    doc = build(t)
    assert [(x["rule"], x["offered"]) for x in doc["trials"]] == [("PD338", True), ("PD312", True), ("PD301", False)]
    buf = io.StringIO()
    render(doc, Console(file=buf, width=250))
    md = rendered(doc, "markdown", kind="tune").decode()
    for out in (buf.getvalue(), md.replace("\\", "")):
        assert "1.07x (PD338)" in out and "? (PD312)" in out and "- (PD301 not raised)" in out
        assert "? (PD301)" not in out

def _multiscale(tmp_path, name, scale, seed):
    """A run whose steps repeat a seeded 4x spread of work (image sizes 96-224 px, drawn by one
    generator in every run) with 0.5% noise of its own, as measure_dir leaves one."""
    from perfdoctor.stats.steptime import estimate
    from perfdoctor.tune.measure import Measured
    work = np.random.default_rng(0).choice([0.04, 0.07, 0.11, 0.16], size=65)
    durs = scale * work * (1 + 0.005 * np.random.default_rng(seed).standard_normal(65))
    steps = [{"step": i + 10, "dur": float(d), "wait": 0.0} for i, d in enumerate(durs)]
    return Measured(tmp_path / name, {}, 0, "stopped", 10.0, estimate=estimate(steps), other_load=0.0, cores=16)


def test_a_wide_baseline_interval_whose_work_repeats_step_for_step_is_no_noise(tmp_path):
    """The H200 run of bench/holdout/h4_empty_cache_cnn.py: the baseline's own interval was +-13%
    (image sizes 4x apart from step to step), three baseline runs agreed within 0.2%, and tune
    called the machine noisy. Paired by step number, two baseline runs agree within a percent: the
    machine is quiet. Work that does not repeat (another generator in each run) stays noisy."""
    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    first = _multiscale(tmp_path, "baseline", 1.0, 1)
    lo, hi = first.estimate.ci95
    assert (hi - lo) / 2 / first.step_s > S.NOISY_CI              # wide on its own
    t.baselines = [first]
    t.noisy, t.noise_head = baseline_noise(first)
    assert t.noisy
    again = _multiscale(tmp_path, "baseline-2", 1.002, 2)
    t.baselines.append(again)
    t._update_spread()
    t._paired_noise(first, again)
    assert not t.noisy and "repeats step for step" in t.noise_head, t.noise_head

    # the same spread drawn afresh in each run: nothing repeats, the pairing finds no agreement
    u = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=1000), log=lambda s: None)
    other = _multiscale(tmp_path, "other", 1.0, 3)
    other.estimate.durs[:] = np.random.default_rng(9).permutation(other.estimate.durs)
    u.baselines = [first, other]
    u.noisy, u.noise_head = baseline_noise(first)
    u._update_spread()
    u._paired_noise(first, other)
    assert u.noisy


def test_before_the_trials_tune_says_how_many_the_budget_leaves_room_for(tmp_path):
    """A 110 s budget, 10 s runs, a noisy machine (a baseline run again after each trial): a user's
    tune tested one fix and said so only at the end, as 'skipped: budget'. Said before the trials,
    with the budget that would run them all; nothing said where they all fit."""
    import time

    from perfdoctor.tune import session as S
    said = []
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=110), log=said.append)
    t.t0, t.longest, t.noisy = time.monotonic() - 25.0, 10.0, True     # two baseline runs, 25 s gone
    trials = [plan.Trial({"threads": 1}, "threads"), plan.Trial({"num_workers": 0}, "loader"),
              plan.Trial({"optimizer": "fused"}, "optimizer"), plan.Trial({"compile": True}, "compile", skip="x")]
    t._room(trials)
    # 110 - 25 = 85 s: 4 trials of 20 s (each with its baseline run) fit the 3 planned (one
    # skipped): silent. The confirmation of a faster one is not counted up front, as _trial does
    # not: "room for about 0 of the 6", then a trial ran.
    assert said == []
    t._room(trials + [plan.Trial({"prefetch_factor": 4}, "loader"), plan.Trial({"pin_memory": True}, "loader")])
    [line] = said
    assert line == ("the budget leaves room for about 4 of the 5 trials planned (a run takes ~10 s, and each trial "
                    "a baseline run again on this noisy machine; fewer once a faster one takes 2 runs to confirm); "
                    "--budget ~150 would run them all")
    assert t._fits(1 + t._reserve())        # what _trial asks of the first: room for it and its baseline


def test_trials_skipped_for_the_budget_run_when_the_closing_run_frees_it(monkeypatch, tmp_path):
    """A user's tune (VAE, --budget 150, runs of ~20 s): a fast trial held back three runs (the
    closing one and its confirmation), so the next trials were skipped for the budget; the closing
    run then found a drift, the fast trial went inconclusive, and tune ended at 92 s with "skipped
    for lack of budget". The freed runs now go to the skipped trials, in their places."""
    from perfdoctor.tune import session as S
    t, launched = _tuner_on(monkeypatch, tmp_path, {"baseline-2": 100.0, "01-num_workers=2": 80.0,
                                                    "baseline-3": 125.0, "02-threads=1": 124.0,
                                                    "baseline-4": 125.0}, budget_s=130)
    clock = {"s": 0.0}
    monkeypatch.setattr(S.Tuner, "elapsed", lambda self: clock["s"])
    real = S.Tuner._launch

    def timed(self, d, ch, **k):            # every run takes 20 s
        clock["s"] += 20.0
        self.longest = 20.0
        return real(self, d, ch, **k)
    monkeypatch.setattr(S.Tuner, "_launch", timed)
    clock["s"] = 20.0                        # the baseline's own run
    t.baselines = [steady_run(tmp_path, "baseline", 100.0, seed=9)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    t._repeat_baseline()
    a = t._trial(plan.Trial({"num_workers": 2}, "loader"))
    b = t._trial(plan.Trial({"threads": 1}, "threads"))
    assert a.status == "faster" and (b.status, b.reason) == ("skipped", "budget")      # 60 + 4 x 20 > 130
    t._close()
    assert t.noisy and a.status == "inconclusive" and t.best() is None
    t._skipped_again()                       # 80 s spent: the trial and a baseline after it fit
    assert launched == ["baseline-2", "01-num_workers=2", "baseline-3", "02-threads=1", "baseline-4"]
    again = t.outcomes[1]
    assert again.trial.changes == {"threads": 1} and again.status != "skipped" and again is not b
    assert [o.trial.changes for o in t.outcomes] == [{"num_workers": 2}, {"threads": 1}]
    assert [x.run_dir.name for x in again.bases] == ["baseline-3", "baseline-4"]
    t._skipped_again()                       # nothing left to run: nothing launched
    assert len(launched) == 5


def test_a_dropout_off_trial_shows_its_loss_drift_and_is_refused_only_when_the_loss_diverges(monkeypatch, tmp_path):
    """PD381's trial changes the regularisation (a user trial's tune.json had "loss": null for it):
    its loss drift is recorded, a loss that ends well above the baseline's refuses it, and a script
    whose loss is not seen is measured all the same (precision trials fail then)."""
    base_losses = [2.0 - 0.01 * i for i in range(40)]
    t, _ = _tuner_on(monkeypatch, tmp_path, {"01-attention_dropout=off": 80.0, "02-attention_dropout=off": 80.0,
                                             "03-attention_dropout=off": 80.0,
                                             "04-attention_dropout=off_optimizer=foreach": 80.0,
                                             "05-autocast=bfloat16": 80.0})
    t.baselines = [steady_run(tmp_path, "baseline", 100.0, seed=9)]
    t.baselines[0].inject["losses"] = base_losses
    t.noisy, t.noise_head = False, "quiet"
    real = t._launch

    def with_losses(losses):
        def launch(d, ch, **k):
            m = real(d, ch, **k)
            m.inject["losses"] = losses
            return m
        return launch
    monkeypatch.setattr(t, "_launch", with_losses([x - 0.05 for x in base_losses]))   # lower: no dropout
    a = t._trial(plan.Trial({"attention_dropout": "off"}, "numerics"))
    assert a.status == "faster" and a.loss is not None and not a.loss["diverged"], (a.status, a.reason)
    monkeypatch.setattr(t, "_launch", with_losses([x + 1.0 for x in base_losses]))    # ends far above
    b = t._trial(plan.Trial({"attention_dropout": "off"}, "numerics"))
    assert b.status == "failed" and b.reason.startswith("refused: loss drift"), b.reason
    monkeypatch.setattr(t, "_launch", with_losses([]))                               # no loss seen
    c = t._trial(plan.Trial({"attention_dropout": "off"}, "numerics"))
    assert c.loss is None and c.status == "faster", (c.status, c.reason)
    both = t._trial(plan.Trial({"attention_dropout": "off", "optimizer": "foreach"}, "combined"))   # no precision
    assert both.loss is None and both.status == "faster", (both.status, both.reason)
    d = t._trial(plan.Trial({"autocast": "bfloat16"}, "numerics"))                    # precision: not comparable
    assert d.status == "failed" and "the loss could not be compared" in d.reason


def test_a_compile_trials_compiling_does_not_size_the_runs_to_come(monkeypatch, tmp_path):
    """A user's Lightning tune (--budget 360): runs of 31-38 s, the compile trial 57 s with its
    compiling; the next trial and the best one's confirmation were then sized at 57 s each, skipped
    for lack of budget, and 110 s of it was left unspent. The runs to come are sized by the others."""
    from perfdoctor.tune import session as S
    t = S.Tuner(S.TuneOptions(argv=["train.py"], out=tmp_path, budget_s=360), log=lambda s: None)
    now = {"t": 0.0}
    lengths = {"baseline": 34.0, "01-optimizer=fused": 32.0, "02-compile=True": 57.0,
               "03-compile=reduce-overhead": 61.0, "04-threads=1": 40.0}

    def fake_run_once(argv, module, run_dir, changes, **k):
        now["t"] += lengths[run_dir.name]
        return steady_run(tmp_path, run_dir.name, 100.0, changes)
    monkeypatch.setattr(S, "run_once", fake_run_once)
    monkeypatch.setattr(S.time, "monotonic", lambda: now["t"])
    for name, changes in (("baseline", {}), ("01-optimizer=fused", {"optimizer": "fused"}),
                          ("02-compile=True", {"compile": True})):
        t._launch(tmp_path / name, changes)
    assert t.longest == 34.0
    t._launch(tmp_path / "03-compile=reduce-overhead", {"compile": "reduce-overhead"})
    assert t.longest == 34.0
    t._launch(tmp_path / "04-threads=1", {"threads": 1})      # a longer run of another trial counts
    assert t.longest == 40.0
