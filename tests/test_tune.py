"""`perfdoctor tune`: the plan, the code it prints, the loss comparison, the injection into a real
child run, the command's errors, and (slow) the acceptance run on examples/cpu_bound_loader.py."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from quiet import Foreign, skip_if_shared

from perfdoctor.tune import plan, verify as V
from perfdoctor.tune.apply import apply_text
from perfdoctor.tune.measure import Measured, loss_drift
from perfdoctor.tune.noise import baseline_noise

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
SGD = {"class": "SGD", "foreach": None, "fused": None, "supports": ["foreach", "fused"]}
LOADER0 = {"num_workers": 0, "persistent_workers": False, "prefetch_factor": None, "pin_memory": False,
           "batch_size": 16}


def facts(**kw) -> plan.Facts:
    base = dict(cores=2, cuda=False, verdict="input_cpu", data_wait=0.9, loader=dict(LOADER0),
                optimizers=[SGD], threads=1)
    base.update(kw)
    return plan.Facts(**base)


# -- plan ----------------------------------------------------------------------------------------

def test_worker_candidates_follow_the_cores():
    assert plan.worker_candidates(2, 0) == [1, 2]
    assert plan.worker_candidates(2, 2) == [1, 0]                # workers may be the problem: none is tried
    assert plan.worker_candidates(8, 0) == [2, 4, 7, 8]          # the 4 nearest the core count
    assert plan.worker_candidates(8, 4) == [2, 7, 8, 0]
    assert plan.worker_candidates(1, 0) == [1]


def test_input_bound_plan_starts_with_the_loader_and_skips_cuda_on_cpu():
    trials = plan.plan(facts())
    # from num_workers=0 the workers are kept alive across epochs (PD301's advice)
    assert [t.changes for t in trials[:2]] == [{"num_workers": 1, "persistent_workers": True},
                                               {"num_workers": 2, "persistent_workers": True}]
    ran = [t.changes for t in trials if not t.skip]
    assert ran == [trials[0].changes, trials[1].changes, {"threads": 2},       # on the CPU: fused first (PD338)
                   {"optimizer": "fused"}, {"optimizer": "foreach"}]
    skipped = {t.label: t.skip for t in trials if t.skip}
    for k in ("pin_memory=True", "cudnn_benchmark=True", "tf32=True", "expandable_segments=True"):
        assert skipped[k] == "no CUDA device"
    assert "--allow-numerics" in skipped["autocast=bfloat16"]
    assert "--allow-compile" in skipped["compile=True"]


def test_verdict_orders_the_groups_and_material_wait_puts_the_loader_first():
    host = plan.plan(facts(verdict="host", data_wait=0.01), allow_compile=True)
    assert [t.group for t in host if not t.skip][:2] == ["optimizer", "optimizer"]
    assert [t.group for t in host if not t.skip][2] == "compile"
    host_waiting = plan.plan(facts(verdict="host", data_wait=0.22))
    assert host_waiting[0].changes == {"num_workers": 1, "persistent_workers": True}
    dev = plan.plan(facts(verdict="device", data_wait=0.0, cuda=True), allow_numerics=True)
    assert dev[0].changes == {"autocast": "bfloat16"} and dev[0].skip is None
    assert all(t.skip is None for t in dev if t.group == "cuda")


def test_no_idle_core_puts_the_loader_trials_after_the_threads_or_last():
    """The report found no idle core (PD309: more workers would take CPU from the trainer): the
    loader's trials no longer come first for the data wait; on an input-bound verdict they come
    right after the threads trial (the wait is the step: the optimizer can gain at most the rest),
    on the others last. A Dataset whose __getitem__ does 2-thread matmuls (input_cpu, data wait
    93.5%, PD309, the script's threads = the 2 cores, SGD): tune ran optimizer=fused and foreach
    first, the worker trials were skipped for budget, and bare reruns with num_workers=2 ran
    2.5-33x faster (3 interleaved pairs on a shared 2-core VM)."""
    trials = [t for t in plan.plan(facts(saturated=True)) if not t.skip]
    assert [t.group for t in trials] == ["threads", "loader", "loader", "optimizer", "optimizer"]
    seen = [t for t in plan.plan(facts(saturated=True, data_wait=0.935, threads=2)) if not t.skip]
    assert [t.changes for t in seen[:2]] == [{"num_workers": 1, "persistent_workers": True},
                                              {"num_workers": 2, "persistent_workers": True}]
    assert [t.group for t in seen[2:]] == ["optimizer", "optimizer"]
    host = [t for t in plan.plan(facts(verdict="host", data_wait=0.22, saturated=True)) if not t.skip]
    assert host[0].group == "optimizer" and host[-1].group == "loader"
    # without PD309 the same wait puts them first
    assert [t for t in plan.plan(facts()) if not t.skip][0].group == "loader"


def test_the_reports_ranked_fixes_order_the_groups():
    """A device-bound CPU run whose report ranks PD346 (threads) first, then PD338: the threads
    trial runs first, the optimizer next, then the verdict's order; skipped trials do not count."""
    f = facts(verdict="cpu_compute", data_wait=0.0, ranked=["PD346", "PD338", "PD320"])
    trials = [t for t in plan.plan(f) if not t.skip]
    assert [t.group for t in trials][:3] == ["threads", "optimizer", "optimizer"]
    assert [t.group for t in trials][3] == "loader"
    assert [t.group for t in plan.plan(facts(verdict="cpu_compute", data_wait=0.0)) if not t.skip][0] == "optimizer"


def test_contention_tries_fewer_threads_first():
    """The training thread queued for a CPU (PD214) while another job held 0.8 of 2 cores: the
    trial that tests PD348 runs one thread, first, whatever the verdict (a GAN on such a machine
    ran 27x faster with one thread than with two; on a quiet one the two ran alike). Less load
    from others leaves both cores free: no threads trial; without contention, more threads."""
    busy = facts(verdict="cpu_compute", data_wait=0.0, threads=2, contended=True, other_cores=0.8,
                 ranked=["PD338"])          # before the report's ranked fix too
    trials = [t for t in plan.plan(busy) if not t.skip]
    assert trials[0].changes == {"threads": 1} and trials[0].group == "threads"
    assert [t for t in trials if "threads" in t.changes] == trials[:1]
    assert plan.rule_for({"threads": 1}, {"PD348", "PD338"}) == "PD348"
    # PD341 (fit threads to cores) fired beside it with no gain: the trial still tests the ranked
    # PD348 and takes its expected gain (user trial: it read "? (PD341)", PD348 "not measured")
    from perfdoctor.tune.predict import prediction
    fixes = {"PD348": {"kind": "fix", "ranked": True, "gain": {"expected": 1.77}},
             "PD338": {"kind": "fix", "ranked": True, "gain": {"expected": 1.03}},
             "PD341": {"kind": "fix", "ranked": False, "gain": {"expected": None}}}
    assert prediction(plan.Trial({"threads": 1}, "threads"), fixes, None) == ("PD348", 1.77)
    assert plan.rule_for({"threads": 1}, {"PD348", "PD341"}) == "PD341"     # nothing ranked: the first given
    light = facts(verdict="cpu_compute", data_wait=0.0, threads=2, contended=True, other_cores=0.3)
    assert not any("threads" in t.changes for t in plan.plan(light))
    eight = facts(cores=8, verdict="input_cpu", threads=8, contended=True, other_cores=3.2)
    assert plan.plan(eight)[0].changes == {"threads": 5}
    quiet = facts(verdict="cpu_compute", data_wait=0.0, threads=1, other_cores=0.8)
    assert {"threads": 2} in [t.changes for t in plan.plan(quiet)]
    # a script that sets 1 thread on a contended machine: more threads are not tried, and the
    # row says why (it was left out without a word)
    one = facts(verdict="cpu_compute", data_wait=0.0, threads=1, contended=True, other_cores=0.3)
    row = next(t for t in plan.plan(one) if "threads" in t.changes)
    assert row.changes == {"threads": 2} and row.skip.startswith("other processes kept the cores busy")
    # that row tests more threads (PD341, PD346), not the ranked PD348 (fewer): it had taken PD348's
    # 1.77x and taken PD348 off the fixes tune did not measure
    assert prediction(row, fixes, None) == ("PD341", None)
    assert prediction(trials[0], {**fixes, "PD341": {**fixes["PD341"], "ranked": True}}, None) == ("PD348", 1.77)
    assert plan.wanted(row, plan.only_names(["PD346"])) and not plan.wanted(row, plan.only_names(["PD348"]))


def test_no_trial_for_what_the_script_already_does():
    trials = plan.plan(facts(loader=dict(LOADER0, num_workers=2, pin_memory=True), threads=2,
                             optimizers=[dict(SGD, foreach=True, fused=True)]))
    labels = [t.label for t in trials]
    assert "num_workers=2" not in labels and "threads=2" not in labels
    assert not any(t.group in ("optimizer", "threads") for t in trials)
    assert "pin_memory=True" not in labels


def test_refinements_build_on_the_best_worker_count():
    # the script had no workers: the first pass already kept them alive; prefetch refines
    ref = plan.refinements(facts(), {"num_workers": 2, "persistent_workers": True})
    assert [t.changes for t in ref] == [{"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}]
    assert all(t.skip is None for t in ref)
    none = plan.refinements(facts(), None)
    assert [t.skip for t in none] == ["needs worker processes (no num_workers setting was faster)"]
    # the budget skipped every worker trial: none was measured, so none can have been faster
    unmeasured = plan.refinements(facts(), None, workers_measured=False)
    assert [t.skip for t in unmeasured] == ["needs worker processes (no num_workers setting was measured)"]
    # the script has restarting workers: their count is tried as it is, persistence on top
    own = facts(loader=dict(LOADER0, num_workers=1))
    assert plan.plan(own)[0].changes == {"num_workers": 2}
    ref = plan.refinements(own, {"num_workers": 2})
    assert [t.changes for t in ref] == [{"num_workers": 2, "persistent_workers": True},
                                        {"num_workers": 2, "prefetch_factor": 4}]


def test_compile_trial_uses_the_advised_mode_and_falls_back():
    """Graph replay where the report ranks PD311 on CUDA; the default mode elsewhere (a CPU run
    has no graphs to replay, whatever the report says); a failed replay trial is followed by a
    default-mode one, which has no fallback of its own."""
    def compile_trial(**kw):
        return next(t for t in plan.plan(facts(**kw), allow_compile=True) if t.group == "compile")
    replay = compile_trial(cuda=True, graph_replay=True)
    assert replay.changes == {"compile": "reduce-overhead"} and replay.label == "compile=reduce-overhead"
    assert compile_trial(cuda=True).changes == {"compile": True}
    assert compile_trial(graph_replay=True).changes == {"compile": True}
    again = plan.fallback(replay)
    assert again.changes == {"compile": True} and again.group == "compile" and plan.fallback(again) is None
    assert plan.fallback(plan.Trial({"num_workers": 2}, "loader")) is None
    assert 'torch.compile(model, mode="reduce-overhead")' in apply_text(replay.changes, {}, True)
    assert "torch.compile(model)" in apply_text({"compile": True}, {}, False)


def test_rule_for_prefers_a_ranked_fix():
    assert plan.rule_for({"num_workers": 2}, {"PD301"}) == "PD301"
    # persistent workers on the script's own workers test PD356 (restarts measured) when it ranked
    assert plan.rule_for({"persistent_workers": True}, {"PD356", "PD301"}) == "PD356"
    assert plan.rule_for({"num_workers": 2, "persistent_workers": True}, {"PD356", "PD301"}) == "PD301"
    assert plan.rule_for({"compile": True}, {"PD312"}) == "PD312"
    assert plan.rule_for({"compile": True}, set()) == "PD311"       # named, prediction null
    assert plan.rule_for({"cudnn_benchmark": True}, {"PD301"}) is None
    # on a CPU run the compile trial is PD312's, even when the report ranked neither
    assert plan.rule_for({"compile": True}, set(), {"PD312", "PD301"}) == "PD312"
    assert plan.rule_for({"autocast": "bfloat16"}, set(), {"PD312"}) is None


# -- apply text ------------------------------------------------------------------------------------

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
        self.last = _measured(tmp_path, d.name, runs[d.name], ch, seed=len(launched))
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
    t.baselines = [_measured(tmp_path, "baseline", 100.0, seed=9)]
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
    t.baselines = [_measured(tmp_path, "baseline", 100.0, seed=9)]
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
    t.baselines = [_measured(tmp_path, "baseline", 100.0, seed=9)]
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


def _measured(tmp_path, name, ms, changes=None, seed=0):
    """A run of 60 steady steps around `ms` milliseconds (1% jitter), as measure_dir leaves one."""
    from perfdoctor.stats.steptime import estimate_durations
    from perfdoctor.tune.measure import Measured
    durs = ms / 1e3 * (1 + 0.01 * np.random.default_rng(seed).standard_normal(60))
    return Measured(tmp_path / name, dict(changes or {}), 0, "stopped", 10.0, inject={"applied": list(changes or {})},
                    estimate=estimate_durations(durs), other_load=0.0, cores=2)


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
    t.baselines = [_measured(tmp_path, "baseline", 106.7, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    assert not t.noisy and t.spread is None
    runs = iter([_measured(tmp_path, "baseline-2", second_ms, seed=2),
                 _measured(tmp_path, "01-optimizer=foreach", 152.0, {"optimizer": "foreach"}, seed=3),
                 _measured(tmp_path, "baseline-3", second_ms, seed=4)])
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
    t.baselines = [_measured(tmp_path, "baseline", 0.2523, seed=1)]
    t.noisy, t.noise_head = baseline_noise(t.baselines[0])
    runs = iter([_measured(tmp_path, "baseline-2", 0.2471, seed=2)])
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
    t.baselines = [_measured(tmp_path, "baseline", 50.0, seed=1)]
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
    t.baselines = [_measured(tmp_path, "baseline", 50.0, seed=1)]
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


def test_apply_text_is_the_code_change():
    inject = {"loaders": [{"asked": LOADER0}], "optimizers": [SGD], "threads_asked": [1]}
    text = apply_text({"num_workers": 2, "persistent_workers": True, "threads": 2, "optimizer": "foreach"},
                      inject, cuda=False)
    assert text.splitlines() == [
        "DataLoader(..., num_workers=2, persistent_workers=True)  # the script has num_workers=0, "
        "persistent_workers=False",
        "torch.set_num_threads(2)  # the script sets 1",
        "torch.optim.SGD(..., foreach=True)"]
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in apply_text({"autocast": "bfloat16"}, {}, cuda=False)
    assert "expandable_segments:True" in apply_text({"expandable_segments": True}, {}, cuda=True)
    assert "no change was measured faster" in apply_text({}, inject, cuda=False)
    # back to num_workers=0 from persistent workers: the arguments torch refuses without workers go too
    workers = {"loaders": [{"asked": dict(LOADER0, num_workers=2, persistent_workers=True, prefetch_factor=4)}]}
    assert apply_text({"num_workers": 0}, workers, cuda=False) == (
        "DataLoader(..., num_workers=0, persistent_workers=False, prefetch_factor=None)  # the script has "
        "num_workers=2, persistent_workers=True, prefetch_factor=4")


def test_no_compile_trial_for_a_script_that_compiles_already():
    comp = [t for t in plan.plan(facts(compiled=True), allow_compile=True) if t.group == "compile"]
    assert [t.skip for t in comp] == ["the script compiles its model already"]
    assert [t.skip for t in plan.plan(facts(), allow_compile=True) if t.group == "compile"] == [None]


def test_a_float64_model_gets_a_float32_trial_before_autocast():
    """PD357's change: only for a model trained in float64, opt-in like autocast, tried first."""
    labels = [t.label for t in plan.plan(facts(verdict="cpu_compute"))]
    assert "float32=True" not in labels and "autocast=bfloat16" in labels
    trials = [t for t in plan.plan(facts(verdict="cpu_compute", fp64=True)) if t.group == "numerics"]
    # autocast leaves float64 ops alone: on a float64 model it is tried on top of float32
    assert [t.label for t in trials] == ["float32=True", "float32=True, autocast=bfloat16"]
    assert all(t.skip == "changes numerics: needs --allow-numerics" for t in trials)
    assert [t.skip for t in plan.plan(facts(fp64=True), allow_numerics=True) if t.group == "numerics"] == [None, None]
    assert plan.rule_for({"float32": True}, {"PD357"}) == "PD357"


def test_a_16_bit_model_on_a_cpu_without_its_math_gets_the_float32_trial_only():
    """PD368's change: a model kept in bf16/fp16 on a CPU without that math is made float32; a
    16-bit autocast trial on it would test nothing the report advises."""
    trials = [t for t in plan.plan(facts(verdict="cpu_compute", half=True), allow_numerics=True)
              if t.group == "numerics"]
    assert [(t.label, t.skip) for t in trials] == [("float32=True", None)]
    assert plan.rule_for({"float32": True}, {"PD368", "PD338"}) == "PD368"


HALF = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).bfloat16()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    y = x[:, :1].float() * 2
    for i in range(20):
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
    print("dtypes", next(model.parameters()).dtype, out.dtype, flush=True)
""")


def test_float32_change_trains_a_bfloat16_model_in_float32(tmp_path, capfd):
    """The same change on a model kept in bfloat16: its parameters and inputs float32, its output
    bfloat16 again; the code to apply names the dtype it trains in now."""
    from perfdoctor.tune.apply import apply_text

    res, d = launch(tmp_path, {"float32": True}, max_steps=None, script_text=HALF)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    assert "dtypes torch.float32 torch.bfloat16" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["float32"] and inj["float32_from"] == ["bfloat16"]
    assert inj["losses"][-1] < 0.7 * inj["losses"][0]                 # it still trains
    text = apply_text({"float32": True}, inj, cuda=False)
    assert text.startswith("model.float()") and "trains in bfloat16 now" in text and "numpy" not in text
    inner = apply_text({"float32": True}, {**inj, "float32_inner": ["GRUCell"]}, cuda=False)
    assert "makes in bfloat16 and passes to its GRUCell (e.g. torch.zeros(..., dtype=torch.bfloat16)" in inner


def test_stacked_changes_of_different_fixes_are_predicted_as_those_fixes_combined():
    """float32 with autocast tests PD357 and PD320 together: neither alone is credited or
    predicts it; num_workers with persistent_workers is PD301's one change."""
    from perfdoctor.tune.predict import prediction
    fixes = {"PD357": {"gain": {"expected": 1.86}}, "PD320": {"gain": {"expected": 1.5}},
             "PD301": {"gain": {"expected": 2.0}}}
    rule, pred = prediction(plan.Trial({"float32": True, "autocast": "bfloat16"}, "numerics"), fixes, None)
    assert rule == "PD357+PD320" and pred == pytest.approx(1 / (1 / 1.86 + 1 / 1.5 - 1))
    assert prediction(plan.Trial({"float32": True, "autocast": "bfloat16"}, "numerics"),
                      {"PD357": fixes["PD357"]}, None) == ("PD357+PD320", None)   # autocast not raised: unknown
    assert prediction(plan.Trial({"num_workers": 1, "persistent_workers": True}, "loader"), fixes, None) == ("PD301", 2.0)
    assert prediction(plan.Trial({"float32": True}, "numerics"), fixes, None) == ("PD357", 1.86)


def test_num_workers_zero_is_pd347s_trial_and_its_refinements_say_why_they_skip():
    assert plan.rule_for({"num_workers": 0}, {"PD301", "PD347"}) == "PD347"
    assert plan.rule_for({"num_workers": 2}, {"PD301", "PD347"}) == "PD301"
    ref = plan.refinements(facts(loader=dict(LOADER0, num_workers=2)), {"num_workers": 0})
    assert ref and all(t.skip == "needs worker processes (the fastest setting has none)" for t in ref)


# -- loss drift ----------------------------------------------------------------------------------

def measured(losses) -> Measured:
    return Measured(Path("."), {}, 0, "stopped", 1.0, inject={"losses": losses})


def test_a_trial_without_losses_to_compare_says_why():
    from perfdoctor.tune.measure import no_drift_reason
    assert loss_drift(measured([]), measured([])) is None
    assert no_drift_reason(measured([]), measured([])).startswith("no loss was recorded in either run")
    assert loss_drift(measured([1.0] * 40), measured([1.0] * 5)) is None
    assert no_drift_reason(measured([1.0] * 40), measured([1.0] * 5)) == \
        "the loss could not be compared with the baseline's (5 losses against 40; 8 needed)"


def test_loss_drift_accepts_rounding_and_refuses_divergence():
    base = [2.3 - 0.01 * i for i in range(40)]
    same = loss_drift(measured(base), measured([x * 1.002 for x in base]))
    assert not same["diverged"] and same["drift"] == pytest.approx(0.002, abs=1e-4) and same["steps"] == 40
    up = loss_drift(measured(base), measured(base[:30] + [x * 1.5 for x in base[30:]]))
    assert up["diverged"] and "(diverges)" in up["text"]
    nan = loss_drift(measured(base), measured(base[:12] + ["nan"] * 28))
    assert nan["diverged"] and "non-finite at backward 13" in nan["text"]
    assert loss_drift(measured(base[:5]), measured(base)) is None      # too few to compare


def test_loss_drift_judges_a_converged_loss_by_what_training_achieved():
    # both runs drive the loss from ~1 to nearly zero (a tiny ViT on the CPU under autocast: 1.3e-6 vs 2e-13)
    base = [math.exp(-0.75 * i) for i in range(40)]
    amp = [max(x, 1.3e-6) for x in base]
    near = loss_drift(measured(base), measured(amp))
    assert not near["diverged"], near["text"]
    # losing a tenth of the progress is divergence, however small the last losses
    lost = loss_drift(measured(base), measured(base[:30] + [0.15] * 10))
    assert lost["diverged"], lost["text"]
    # a loss that barely moved is judged against its own level, as before
    flat = [2.0 - 0.001 * i for i in range(40)]
    assert loss_drift(measured(flat), measured(flat[:30] + [x * 1.15 for x in flat[30:]]))["diverged"]
    assert not loss_drift(measured(flat), measured(flat[:30] + [x * 1.05 for x in flat[30:]]))["diverged"]


# -- injection into a real child -------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(ds, batch_size=8, num_workers=0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("threads", torch.get_num_threads(), "workers", loader.num_workers, flush=True)
    for epoch in range(3):
        for x, y in loader:
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(); loss.backward(); opt.step()
    print("dtype", out.dtype, "foreach", opt.defaults.get("foreach"), flush=True)
""")


def launch(tmp_path: Path, changes, max_steps=60, script_text=SCRIPT):
    pytest.importorskip("torch")
    from perfdoctor.collect.launcher import RunConfig, launch as _launch
    script = tmp_path / "train.py"
    script.write_text(script_text)
    d = tmp_path / "run"
    res = _launch(RunConfig(argv=[str(script)], run_dir=d, max_steps=max_steps, trace=False, changes=changes))
    return res, d


def injected(tmp_path: Path, capfd, changes: dict, script_text: str) -> tuple[str, dict]:
    """The script run to its end under `changes`, in a directory of its own: (its stdout, inject.json)."""
    sub = tmp_path / (re.sub(r"[^A-Za-z0-9]+", "_", plan.describe(changes)))
    sub.mkdir()
    res, d = launch(sub, changes, max_steps=None, script_text=script_text)
    assert res.exit_code == 0
    return capfd.readouterr().out, json.loads((d / "inject.json").read_text())


def test_injected_changes_reach_the_script(tmp_path, capfd):
    res, d = launch(tmp_path, {"num_workers": 1, "threads": 2, "optimizer": "foreach", "autocast": "bfloat16"})
    out = capfd.readouterr().out
    assert res.exit_code == 0
    assert "threads 2 workers 1" in out                      # the script's own print, after its set_num_threads(1)
    inj = json.loads((d / "inject.json").read_text())
    assert inj["loaders"][0]["asked"]["num_workers"] == 0 and inj["loaders"][0]["got"]["num_workers"] == 1
    assert inj["threads_asked"] == [1] and inj["threads"] == 2
    assert set(inj["applied"]) == {"num_workers", "threads", "optimizer", "autocast"}
    assert inj["optimizers"][0]["class"] == "SGD"
    # one loss per backward: 60 measured steps after the first optimizer step, which starts them
    assert len(inj["losses"]) == 61 and all(isinstance(x, float) for x in inj["losses"])


def test_the_no_workers_trial_runs_a_loader_built_for_workers(tmp_path, capfd):
    """torch refuses persistent_workers, prefetch_factor and multiprocessing_context without
    workers: the num_workers=0 trial drops them, and the code to apply says so."""
    from perfdoctor.tune.apply import apply_text

    text = SCRIPT.replace("num_workers=0)", "num_workers=2, persistent_workers=True, prefetch_factor=4, "
                                            "multiprocessing_context='fork')")
    res, d = launch(tmp_path, {"num_workers": 0}, max_steps=20, script_text=text)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    inj = json.loads((d / "inject.json").read_text())
    assert inj["loaders"][0]["got"]["num_workers"] == 0
    assert inj["loaders"][0]["asked"]["multiprocessing_context"] == "fork"
    line = apply_text({"num_workers": 0}, inj, cuda=False)
    assert "num_workers=0, persistent_workers=False, prefetch_factor=None, multiprocessing_context=None" in line


REBUILT = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(1)
    lin = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    def make(ds):                                 # a new loader each epoch, from a helper
        return DataLoader(ds, batch_size=4)
    val = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    for epoch in range(3):
        for (x,) in make(TensorDataset(torch.randn(16, 2))):
            loss = lin(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        for (x,) in make(TensorDataset(torch.randn(8, 2))):     # validation, from the same helper
            pass
""")


def test_a_dataloader_built_again_each_epoch_is_told_to_be_built_once(tmp_path, capfd):
    """persistent_workers keeps workers alive as long as their DataLoader: a script that builds
    its loader anew each epoch (in a function the loop calls) restarts them anyway, so the code
    to apply says to build it once. Loaders on other data (validation, same helper) or built once
    are not counted."""
    from perfdoctor.tune.apply import apply_text
    _, inj = injected(tmp_path, capfd, {"num_workers": 1, "persistent_workers": True}, REBUILT)
    built = [ld["built"] for ld in inj["loaders"]]
    assert len(built) == 7 and len(set(built)) == 3 and built.count(built[0]) == 1   # val, then 3 x (train, val)
    train = {**inj, "loaders": inj["loaders"][1:]}
    text = apply_text({"num_workers": 1, "persistent_workers": True}, train, cuda=False)
    assert "built this DataLoader 3 times" in text and "build it once" in text
    assert "build it once" not in apply_text({"num_workers": 1, "persistent_workers": True}, inj, cuda=False)
    assert "build it once" not in apply_text({"threads": 2}, train, cuda=False)


def test_a_script_leaving_through_os_exit_keeps_its_record(tmp_path, capfd):
    """os._exit skips atexit: tune's record (what was applied, the losses) is written first."""
    res, d = launch(tmp_path, {"num_workers": 1}, max_steps=None,
                    script_text=SCRIPT + "import os\nos._exit(4)\n")
    assert res.exit_code == 4 and res.child["outcome"] == "exit" and "dtype" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["num_workers"] and len(inj["losses"]) == 3 * 32


def test_autocast_and_optimizer_injection_change_what_the_script_sees(tmp_path, capfd):
    res, d = launch(tmp_path, {"autocast": "bfloat16", "optimizer": "foreach"}, max_steps=None)
    assert res.exit_code == 0
    assert "dtype torch.bfloat16 foreach True" in capfd.readouterr().out


FLOAT64 = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0); torch.set_num_threads(1)      # tiny ops: a second thread only spins
    class Seq(torch.nn.Module):                  # float64 state made inside forward, as scripts do
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.LSTMCell(1, 16)
            self.head = torch.nn.Linear(16, 1)
        def forward(self, x):
            h = torch.zeros(x.size(0), 16, dtype=torch.double)
            c = torch.zeros(x.size(0), 16, dtype=torch.double)
            outs = []
            for xt in x.split(1, dim=1):
                h, c = self.cell(xt, (h, c))
                outs.append(self.head(h))
            return torch.cat(outs, dim=1)
    x = torch.sin(torch.arange(0, 8 * 30, dtype=torch.float64).reshape(8, 30) / 5)
    model = Seq().double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(20):
        opt.zero_grad()
        out = model(x[:, :-1])
        loss = torch.nn.functional.mse_loss(out, x[:, 1:])
        loss.backward()
        opt.step()
    print("dtypes", next(model.parameters()).dtype, out.dtype, flush=True)
""")


def test_float32_change_trains_a_float64_model_in_float32(tmp_path, capfd):
    """The model and what enters it are float32, its output float64 again (the loss and target
    untouched), the optimizer still steps the same parameters: the loss follows the baseline's."""
    from perfdoctor.tune.apply import apply_text

    res, d = launch(tmp_path, {"float32": True}, max_steps=None, script_text=FLOAT64)
    assert res.exit_code == 0, capfd.readouterr().err[-2000:]
    assert "dtypes torch.float32 torch.float64" in capfd.readouterr().out
    inj = json.loads((d / "inject.json").read_text())
    assert inj["applied"] == ["float32"] and not inj["notes"]
    (tmp_path / "b").mkdir()
    launch(tmp_path / "b", {}, max_steps=None, script_text=FLOAT64)
    assert "dtypes torch.float64 torch.float64" in capfd.readouterr().out
    ref = json.loads((tmp_path / "b" / "run" / "inject.json").read_text())
    drift = loss_drift(measured(ref["losses"]), measured(inj["losses"]))
    assert drift["steps"] == 20 and not drift["diverged"] and drift["drift"] < 1e-3
    assert ref["losses"][-1] < 0.5 * ref["losses"][0]                 # it trains: the comparison means something
    text = apply_text({"float32": True}, inj, cuda=False)
    # the forward makes its LSTMCell state in float64: model.float() alone would fail on it
    assert text.startswith("model.float()") and inj["float32_inner"] == ["LSTMCell"] and "its LSTMCell" in text
    assert ref["float32_inner"] == [] and "its LSTMCell" not in apply_text({"float32": True}, ref, cuda=False)


def test_autocast_on_a_float64_model_runs_it_in_bfloat16_only_on_top_of_float32(tmp_path, capfd):
    """torch.autocast casts float32 ops only: alone it leaves a float64 model in float64 (so the
    plan stacks it on float32), and on float32 the model's linear layers run in bfloat16."""
    text = FLOAT64.replace("out = model(x[:, :-1])", "out = model(x[:, :-1]); print('out', out.dtype, flush=True)")
    alone, _ = injected(tmp_path, capfd, {"autocast": "bfloat16"}, text)
    assert "out torch.float64" in alone and "out torch.bfloat16" not in alone
    out, inj = injected(tmp_path, capfd, {"float32": True, "autocast": "bfloat16"}, text)
    assert set(inj["applied"]) == {"float32", "autocast"} and "out torch.bfloat16" in out


CHECKPOINTED = textwrap.dedent("""
    from torch.utils.checkpoint import checkpoint
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)      # tiny ops: a second thread only spins
    calls = 0
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            global calls
            calls += 1
            return torch.nn.functional.dropout(self.lin(x).relu(), 0.2)
    blocks = torch.nn.ModuleList([Block(), Block()])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    for step in range(20):
        h = torch.randn(4, 8)
        h = checkpoint(blocks[0], h, use_reentrant=False)
        h = torch.utils.checkpoint.checkpoint(blocks[1], h, use_reentrant=False, preserve_rng_state=True)
        loss = h.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    print("forward calls per step", calls / 20, flush=True)
""")


def test_recompute_off_runs_checkpointed_blocks_once(tmp_path, capfd):
    """Two checkpointed blocks: their forward runs twice per step (once again in backward) unless
    tune's recompute=off calls them directly; the calls are counted either way, and the losses
    are the same (the checkpoint reruns dropout with the RNG state it had)."""
    losses = {}
    for changes, per_step in (({}, 4.0), ({"recompute": "off"}, 2.0)):
        out, inj = injected(tmp_path, capfd, changes, CHECKPOINTED)
        assert f"forward calls per step {per_step}" in out
        assert inj["checkpoint_calls"] == 40 and inj["applied"] == (["recompute"] if changes else [])
        losses[bool(changes)] = inj["losses"]
    assert len(losses[True]) == 20 and losses[True] == pytest.approx(losses[False], rel=1e-5)


EMPTY_CACHE = textwrap.dedent("""
    import torch
    from torch.cuda import empty_cache                   # by name, after torch: the injected one
    torch.set_num_threads(1)
    freed = []
    torch.cuda.memory.is_initialized = lambda: True      # stands in for a CUDA device: the allocator's
    torch._C._cuda_emptyCache = lambda: freed.append(1)  # release, which empty_cache calls
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(20):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        empty_cache() if step % 2 else torch.cuda.empty_cache()
    print("released", len(freed), flush=True)
""")


def test_empty_cache_off_skips_the_scripts_calls(tmp_path, capfd):
    """The baseline counts the script's torch.cuda.empty_cache() calls (both ways of naming it),
    which plans an empty_cache=off trial (PD343) on a CUDA machine; the trial skips them."""
    for changes, released in (({}, 20), ({"empty_cache": "off"}, 0)):
        out, inj = injected(tmp_path, capfd, changes, EMPTY_CACHE)
        assert f"released {released}\n" in out
        assert inj["empty_cache_calls"] == 20 and inj["applied"] == (["empty_cache"] if changes else [])
    ranked = plan.plan(facts(verdict="device", cuda=True, empty_cache_calls=20, ranked=["PD343"]))
    assert ranked[0].changes == {"empty_cache": "off"} and ranked[0].group == "allocator" and ranked[0].skip is None
    assert plan.rule_for({"empty_cache": "off"}, {"PD343"}) == "PD343"
    cpu = {t.label: t.skip for t in plan.plan(facts(empty_cache_calls=20))}
    assert cpu["empty_cache=off"] == "no CUDA device"
    assert not any("empty_cache" in t.changes for t in plan.plan(facts(cuda=True)))
    assert apply_text({"empty_cache": "off"}, inj, cuda=True).startswith("# torch.cuda.empty_cache()  # remove it")


SAVING = textwrap.dedent("""
    import io, os, sys, tempfile
    from safetensors.torch import save_file              # first: its import imports torch
    import torch
    torch.set_num_threads(1)
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    d = tempfile.mkdtemp()
    copies = 0
    for step in range(20):
        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, os.path.join(d, f"{step}.safetensors"))
        torch.save(opt.state_dict(), os.path.join(d, f"{step}.pt"))
        buf = io.BytesIO(); torch.save(m.state_dict(), buf); copies += buf.tell() > 0     # a copy, not a checkpoint
    print("written", sorted(os.listdir(d), key=lambda n: (int(n.split(".")[0]), n)), "copies", copies, flush=True)
""")


def test_save_every_writes_one_checkpoint_in_n(tmp_path, capfd):
    """The baseline counts the script's saves (safetensors' save_file bound by name in an import
    that imports torch, and torch.save); save_every=5 writes every save of one step in five
    (the model and its optimizer together) and never skips a save into a buffer."""
    both = lambda steps: [f"{i}.{x}" for i in steps for x in ("pt", "safetensors")]   # noqa: E731
    for changes, written in (({}, both(range(20))), ({"save_every": 5}, both((0, 5, 10, 15)))):
        out, inj = injected(tmp_path, capfd, changes, SAVING)
        assert f"written {written} copies 20\n" in out, out
        assert inj["save_calls"] == 60 and inj["applied"] == (["save_every"] if changes else [])
    trials = plan.plan(facts(verdict="host", data_wait=0.0, frequent_saves=True, ranked=["PD350"]))
    assert trials[0].changes == {"save_every": plan.SAVE_EVERY} and trials[0].skip is None
    assert plan.rule_for(trials[0].changes, {"PD350"}) == "PD350"
    assert not any("save_every" in t.changes for t in plan.plan(facts()))
    assert apply_text({"save_every": 100}, inj, cuda=False).startswith("if step % 100 == 0: save(...)  # torch.save / save_file")


def test_without_changes_nothing_is_injected(tmp_path, capfd):
    res, d = launch(tmp_path, None)
    assert res.exit_code == 0 and "threads 1 workers 0" in capfd.readouterr().out
    assert not (d / "inject.json").exists()


# -- the command -----------------------------------------------------------------------------------

def ptune(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "tune", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def tuned(tmp_path: Path, script: Path, *args) -> tuple[dict, Foreign]:
    """`perfdoctor tune ARGS SCRIPT` into tmp_path/t: its JSON document, and the machine's share
    that other work took meanwhile (a tune that found nothing measurable on a shared machine skips)."""
    foreign = Foreign()
    r = ptune(*args, "--out", tmp_path / "t", "-o", tmp_path / "t.json", script)
    if r.returncode == 3:
        skip_if_shared(foreign)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / "t.json").read_text()), foreign


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
    r = ptune("--budget", "60", "--duration", "60", "--out", tmp_path / "t", EX / "crash.py", "--crash-after", "3")
    assert r.returncode == 1
    # the script's own traceback, from the end of its output.log (its output stays there, not here)
    log = tmp_path / "t" / "baseline" / "output.log"
    assert "Traceback (most recent call last)" in log.read_text()
    assert f"line(s) of its output ({log}):" in r.stderr and "[perfdoctor tune]   Traceback (most recent" in r.stderr
    # --show-output: through, as the script writes it, and no file
    r = ptune("--show-output", "--budget", "60", "--duration", "60", "--out", tmp_path / "s", EX / "crash.py",
              "--crash-after", "3")
    assert r.returncode == 1 and "\nTraceback (most recent call last)" in r.stderr
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
    said = " ".join(r.stderr.split())
    assert "not measured by tune" in said and "PD369 The loop waits on its own producer threads" in said
    # only the baseline's first run is sampled: its repeat (and the trials) run as they always did
    others = [d for d in out.iterdir() if d.is_dir() and d.name != "baseline"]
    assert others and not any((d / "stacks" / "pyspy.meta.json").exists() for d in others)


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
    assert (tmp_path / "t" / "tune.json").exists() and "best:" in r.stderr
    if doc["best"]:                          # confirmed by a second run, or said to rest on one
        best = next(t for t in doc["trials"] if t["changes"] == doc["best"]["changes"])
        assert doc["best"]["confirmed"] == (best["confirm"] is not None)
        assert ("two runs" if doc["best"]["confirmed"] else "one run") in r.stderr
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    expected = {f["id"]: (f.get("gain") or {}).get("expected") for f in report["findings"]}
    for t in doc["trials"]:                 # "predicted" is the report's expected gain of the tested fix
        want = expected.get(t["rule"])
        assert t["predicted"] == (None if want is None else pytest.approx(want, abs=1e-4))


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
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--duration", "10",
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
        if trial["status"] == "faster":
            assert max(measured[w]) > 1.0, (trial, measured)
        if trial["status"] == "slower":
            assert min(measured[w]) < 1.10, (trial, measured)
    # 1 worker: no material gain on a 2-core machine. tune claims none: not "faster", its interval
    # not above 1.10, and a point estimate under 1.10 unless it says the trial is inconclusive (a
    # CI run: 1.13x [0.76, 1.67] against reruns of 0.65-0.95x; the point of an interval that wide
    # is no claim). The report's model (PD301: one worker on the free core overlaps the ~7% of the
    # step outside the wait, max(1 - f, f / 1)) predicts ~1.07x: at most the step less its wait.
    one = by["num_workers=1"]
    assert one["status"] == "skipped" or (
        one["status"] != "faster" and one["ci95"][0] < 1.10
        and (one["status"] == "inconclusive" or one["speedup"] < 1.10)
        and 1.0 <= one["predicted"] <= 1 / max(0.5, doc["baseline"]["data_wait_share"]) + 0.01), one
    best = doc["best"]
    if best and "num_workers" in best["changes"]:
        w = best["changes"]["num_workers"]
        lo, hi = measured[w][0], measured[w][-1]
        assert f"num_workers={w}" in doc["apply"] and hi > 1.0, (best, measured)
        if best["confirmed"]:               # two runs: within 25% of what the reruns support
            assert 0.75 * lo <= best["speedup"] <= 1.25 * hi, (best, measured)
        else:                               # the budget ran out first (a slow machine): it says so
            said = " ".join(r.stderr.split())                       # rich wraps the line
            assert "one run (no budget left to confirm it)" in said, r.stderr
            assert "one run, not confirmed" in by[f"num_workers={w}"]["reason"], best


def test_a_confirmed_trials_row_shows_both_runs_step_times_and_baselines(monkeypatch, tmp_path):
    """regression.py (pytorch/examples) on a busy VM: threads=1's row read 0.378 ms against
    0.555/0.526 ms beside a speed-up of 1.16x, which pooled a second run (0.485 ms against a
    baseline run of 0.459 ms) that the cells did not show. A confirmed row shows both runs."""
    from types import SimpleNamespace

    from perfdoctor.report.labels import tune_step_times
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
    from perfdoctor.report.labels import tune_step_times
    from perfdoctor.tune.result import _trial_doc
    from perfdoctor.tune.verify import Outcome
    m = _measured(tmp_path, "01-num_workers=1", 13.6, {"num_workers": 1})
    m.error = "the script failed (RuntimeError: boom)"
    out = Outcome(plan.Trial({"num_workers": 1}, "loader"), "failed", m.error, run=m,
                  bases=[_measured(tmp_path, "baseline-2", 13.9)])
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
    t.baselines = [_measured(tmp_path, "baseline", 50.0, seed=1)]
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


CNN = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    x = torch.randn(16, 3, 12, 12)
    y = x.mean((1, 2, 3)).unsqueeze(1)
    w0 = model[0].weight.detach().clone()
    for i in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    w = model[0].weight
    print("layout", w.is_contiguous(memory_format=torch.channels_last), "inputs", all(seen),
          "stepped", not torch.equal(w.detach(), w0), "same", w is opt.param_groups[0]["params"][0], flush=True)
""")


def test_channels_last_change_trains_the_model_in_channels_last(tmp_path, capfd):
    """PD342's change: the convolution weights channels_last in place (the optimizer still steps
    the same Parameter), the input batches too; the losses those of the NCHW run (same math, in
    another memory layout). Planned (CUDA only) where the report found NCHW convolutions."""
    from perfdoctor.tune.apply import apply_text

    out, inj = injected(tmp_path, capfd, {"channels_last": True}, CNN)
    assert "layout True inputs True stepped True same True" in out
    assert inj["applied"] == ["channels_last"] and inj["channels_last_modules"] == 1 and not inj["notes"]
    out_ref, ref = injected(tmp_path, capfd, {}, CNN)
    assert "layout False inputs False stepped True same True" in out_ref
    drift = loss_drift(measured(ref["losses"]), measured(inj["losses"]))
    assert drift["steps"] == 20 and not drift["diverged"] and drift["drift"] < 1e-4
    assert "model.to(memory_format=torch.channels_last)" in apply_text({"channels_last": True}, inj, cuda=True)
    facts = lambda **kw: plan.Facts(cores=4, cuda=True, verdict="device", **kw)  # noqa: E731
    trials = plan.plan(facts(nchw=True, ranked=["PD342", "PD320"]))
    assert trials[0].changes == {"channels_last": True} and trials[0].skip is None
    assert not any("channels_last" in t.changes for t in plan.plan(facts()))
    cpu = plan.plan(plan.Facts(cores=4, cuda=False, verdict="device", nchw=True))
    assert [t.skip for t in cpu if "channels_last" in t.changes] == ["no CUDA device"]
    assert plan.rule_for({"channels_last": True}, {"PD342"}) == "PD342"


TWO_MODELS = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 1))
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 1))  # no 4-D parameters
    seen = []
    mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    opt = torch.optim.SGD([*cnn.parameters(), *mlp.parameters()], lr=0.01)
    x = torch.randn(4, 3, 6, 6)
    for i in range(3):
        opt.zero_grad()
        (cnn(x).sum() + mlp(x).sum()).backward()
        opt.step()
    print("mlp inputs channels_last", any(seen), flush=True)
""")


def test_channels_last_changes_only_the_models_it_converts(tmp_path, capfd):
    """A module without 4-D parameters called beside a CNN keeps its inputs as they are (only
    the converted model's inputs become channels_last), and the record counts the one model
    converted, not every model called."""
    out, inj = injected(tmp_path, capfd, {"channels_last": True}, TWO_MODELS)
    assert "mlp inputs channels_last False" in out
    assert inj["applied"] == ["channels_last"] and inj["channels_last_modules"] == 1


LAZY_CNN = textwrap.dedent("""
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3, padding=1), torch.nn.Flatten(), torch.nn.LazyLinear(1))
    opt = None
    x = torch.randn(4, 3, 6, 6)
    for i in range(3):
        out = model(x)                     # the first call makes the parameters
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
        opt.zero_grad()
        out.sum().backward()
        opt.step()
    print("layout", model[0].weight.is_contiguous(memory_format=torch.channels_last), flush=True)
""")


def test_channels_last_waits_for_a_lazy_model_to_make_its_parameters(tmp_path, capfd):
    """Lazy modules have no shapes before their first call (their parameters refuse dim()): the
    model is converted at the first call after that, instead of the script failing."""
    out, inj = injected(tmp_path, capfd, {"channels_last": True}, LAZY_CNN)
    assert "layout True" in out and inj["channels_last_modules"] == 1


# -- keep_iterator (PD355) -------------------------------------------------------------------------

PEEKING = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lin = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.arange(40.0).reshape(-1, 1)), batch_size=4, shuffle=True)   # 10 batches
    seen = []
    for step in range(25):
        (x,) = next(iter(loader))                  # a new iterator every step
        seen.append(x.flatten().tolist())
        loss = lin(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    epochs = [sorted(v for b in seen[i:i + 10] for v in b) for i in (0, 10)]
    print("epochs whole", all(e == [float(v) for v in range(40)] for e in epochs))
    short = DataLoader(TensorDataset(torch.arange(40.0).reshape(-1, 1)), batch_size=4)
    for epoch in range(3):                          # an epoch loop that stops early: left alone
        print("starts at", next(iter(short))[0][0].item(), end="; ")
        for i, (x,) in enumerate(short):
            if i == 4:
                break
    print()
""")


def test_keep_iterator_hands_a_peeking_iterator_out_again_until_it_runs_out(tmp_path, capfd):
    """tune's trial of PD355: `next(iter(loader))` every step draws from one iterator, a new one
    only when it ran out (an epoch: every sample once); an epoch loop that stops early, and its
    peek, are left as they are. Without the change the starts are only counted."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"keep_iterator": True}, PEEKING)
    assert "epochs whole True" in out
    # 25 steps over 10-batch epochs: 3 iterators; the short loader's peek is followed by its own
    # epoch loop, which takes the peek's iterator (1 batch drawn) and breaks after 5 more: 3
    # starts, and its next peek gets a new one (6 batches drawn is no peek's)
    assert inj["iterator_starts"] == 3 + 3 and inj["iterator_reuses"] == 22 + 3
    assert "keep_iterator" in inj["applied"]
    assert out.count("starts at 0.0") == 3                     # the short loader's epochs start over
    bare_out, bare = injected(tmp_path, capfd, {}, PEEKING)
    assert bare["iterator_starts"] == 25 + 6 and bare["iterator_reuses"] == 0 and "keep_iterator" not in bare["applied"]
    assert "epochs whole False" in bare_out                   # a fresh order every step repeats samples
    text = apply_text({"keep_iterator": True}, bare, cuda=False)
    assert text.startswith("it = iter(loader)") and "started 31 iterators" in text


def test_a_report_that_found_peeks_plans_the_keep_iterator_trial_first():
    trials = plan.plan(facts(peeks=True, ranked=["PD355", "PD301"]))
    assert trials[0].changes == {"keep_iterator": True} and trials[0].group == "iterator" and not trials[0].skip
    assert plan.rule_for(trials[0].changes, {"PD355", "PD301"}) == "PD355"
    assert all("keep_iterator" not in t.changes for t in plan.plan(facts()))


@pytest.mark.slow
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
    # --only: the iterator's trial alone, and a budget for it and the run it keeps for a baseline after
    # it (the closing run, or a noisy machine's), seldom for its confirmation (the other trials and the
    # second runs took 20 s more; plan.plan puts this trial first where PD355 ranks first)
    doc, foreign = tuned(tmp_path, script, "--budget", "32", "--duration", "3", "--only", "iterator")
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    assert next(f["id"] for f in report["findings"] if f.get("ranked")) == "PD355"
    keep, = doc["trials"]
    assert keep["changes"] == {"keep_iterator": True} and keep["rule"] == "PD355" and keep["predicted"] > 2
    if keep["reason"] == "budget":     # a noisy machine: a baseline repeated before the trial took the budget
        skip_if_shared(foreign)        # (CI: other processes used 1.0 of 2 cores, 16.7 s gone before the trial)
    assert keep["status"] == "faster" and keep["speedup"] > 2, keep
    assert doc["best"]["changes"] == {"keep_iterator": True} and doc["apply"].startswith("it = iter(loader)")


INDEXED = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Subset, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.arange(50.0).reshape(-1, 1), torch.arange(50) % 3)
    lin = torch.nn.Linear(1, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    for loader in (DataLoader(ds, batch_size=8, shuffle=True),
                   DataLoader(Subset(ds, list(range(0, 50, 2))), batch_size=4, drop_last=True),
                   DataLoader(ds, batch_size=8, collate_fn=lambda b: b)):      # the script's own collate: left
        got = []
        for batch in loader:
            if isinstance(batch[0], tuple):
                got.append(len(batch))
                continue
            x, y = batch
            got.append(x.flatten().tolist() + y.tolist())
            loss = torch.nn.functional.cross_entropy(lin(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        print(type(batch).__name__, len(loader), loader.batch_size, got)
""")


def test_index_batches_draws_the_same_rows_with_one_indexing_a_batch(tmp_path, capfd):
    """tune's trial of PD358: a TensorDataset (or a Subset of one) fetched sample by sample gets a
    BatchSampler over its own sampler and batch_size=None; the batches hold the same rows in the
    same order, shuffled or not, drop_last kept; a loader with its own collate_fn is left alone."""
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"index_batches": True}, INDEXED)
    bare_out, bare = injected(tmp_path, capfd, {}, INDEXED)
    lines, bare_lines = out.splitlines(), bare_out.splitlines()
    assert len(lines) == len(bare_lines) == 3
    for a, b in zip(lines, bare_lines):
        # type, batches, batch_size, the rows of every batch: the same, batch_size aside
        ka, kb = a.split(" ", 3), b.split(" ", 3)
        assert ka[0] == kb[0] and ka[1] == kb[1] and ka[3] == kb[3]
    assert [x.split(" ", 3)[2] for x in lines] == ["None", "None", "8"]
    assert [x.split(" ", 3)[2] for x in bare_lines] == ["8", "4", "8"]
    assert "index_batches" in inj["applied"] and "index_batches" not in bare["applied"]
    text = apply_text({"index_batches": True}, bare, cuda=False)
    assert "sampler=BatchSampler(RandomSampler(dataset), batch_size=8" in text and "batch_size=None" in text
    assert plan.plan(facts(per_sample=True, ranked=["PD358"]))[0].changes == {"index_batches": True}
    assert plan.rule_for({"index_batches": True}, {"PD358"}) == "PD358"
