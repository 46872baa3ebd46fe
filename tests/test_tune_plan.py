"""`perfdoctor tune`'s plan: which trials, in which order, skipped for what; the code it prints
for a change; the fixes a trial tests and what they predict together; the loss comparison."""

from __future__ import annotations

import math

import pytest
from tunecases import LOADER0, SGD, facts, measured

from perfdoctor.tune import plan
from perfdoctor.tune.apply import apply_text
from perfdoctor.tune.measure import loss_drift


def test_worker_candidates_follow_the_cores():
    assert plan.worker_candidates(2, 0) == [1, 2]
    assert plan.worker_candidates(2, 2) == [1, 0]                # workers may be the problem: none is tried
    assert plan.worker_candidates(8, 0) == [2, 4, 7, 8]          # the 4 nearest the core count
    assert plan.worker_candidates(8, 4) == [2, 7, 8, 0]
    assert plan.worker_candidates(1, 0) == [1]
    # a loader that waits (a sleep, a remote source): as many as PD301's model credits, past the cores
    assert plan.worker_candidates(2, 0, 8.0) == [1, 2, 4, 8]
    assert plan.worker_candidates(2, 0, 1.0) == [1, 2] and plan.worker_candidates(16, 0, 8.0) == [4, 8, 15, 16]


def _pd301_case(prefix: str) -> dict:
    import tomllib
    from pathlib import Path
    rule = tomllib.loads((Path(__file__).resolve().parents[1] / "rules" / "PD301-loader-workers.toml").read_text())
    return next(c["metrics"] for c in rule["cases"] if c["name"].startswith(prefix))


def test_a_worker_count_trial_is_predicted_at_its_own_count():
    """A user's loader that sleeps 4 ms a sample on 2 cores: the report's PD301 models 8 workers
    (they wait, they need no core), and tune predicted that same gain for 1 and 2 workers, which
    measured 1.12x and 2.27x ("the model over-predicts"). Each trial is now predicted at its own
    count, at most the model's (the rule's own case: 2 workers measured 2.21x)."""
    from perfdoctor.tune import predict
    doc = {"traces": [{"metrics": _pd301_case("a loader that waits 1 ms per sample")}]}
    assert predict.modelled_workers(doc, []) == pytest.approx(8.0)
    one = predict.trial_gain(doc, [], "PD301", {"num_workers": 1, "persistent_workers": True}, 0)
    two = predict.trial_gain(doc, [], "PD301", {"num_workers": 2, "persistent_workers": True}, 0)
    eight = predict.trial_gain(doc, [], "PD301", {"num_workers": 8}, 0)
    sixteen = predict.trial_gain(doc, [], "PD301", {"num_workers": 16}, 0)
    assert one["expected"] == pytest.approx(1 / 0.858, abs=0.01)           # the wait, one batch at a time
    assert two["expected"] == pytest.approx(2.33, abs=0.01)
    assert eight["expected"] == pytest.approx(7.0, abs=0.05) == sixteen["expected"]   # no more than the model's
    assert one["ceiling"] == two["ceiling"] == eight["ceiling"]           # the wait removed, whatever the count
    assert predict.trial_gain(doc, [], "PD302", {"pin_memory": True}, 0) is None
    assert predict.trial_gain(doc, [], "PD301", {"prefetch_factor": 4}, 0) is None   # no count: the report's
    # a computing loader: its workers get the free cores, so a 2-core machine credits 1
    cpu = {"traces": [{"metrics": _pd301_case("pytorch/examples mnist_rnn")}]}
    assert predict.modelled_workers(cpu, []) == pytest.approx(1.0, abs=0.1)
    assert (predict.trial_gain(cpu, [], "PD301", {"num_workers": 2}, 0)["expected"]
            == pytest.approx(predict.trial_gain(cpu, [], "PD301", {"num_workers": 1}, 0)["expected"]))


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
    ran 27x faster with one thread than with two; on a quiet one the two ran alike), after only
    the trial of the report's first-ranked fix (a 110 s budget had gone to threads=1, and tune
    called it best, where the skipped num_workers=0, PD347's, measured 4.4x by hand). Less load
    from others leaves both cores free: no threads trial; without contention, more threads."""
    busy = facts(verdict="cpu_compute", data_wait=0.0, threads=2, contended=True, other_cores=0.8,
                 ranked=["PD338"])
    trials = [t for t in plan.plan(busy) if not t.skip]
    assert "PD338" in plan.tested(trials[0])                     # the report's top claim first
    assert trials[1].changes == {"threads": 1} and trials[1].group == "threads"
    assert [t for t in trials if "threads" in t.changes] == trials[1:2]
    alone = facts(verdict="cpu_compute", data_wait=0.0, threads=2, contended=True, other_cores=0.8)
    assert [t for t in plan.plan(alone) if not t.skip][0].changes == {"threads": 1}   # nothing ranked: threads first
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
    # that row tests more threads (PD346), not the ranked PD348 (fewer): it had taken PD348's
    # 1.77x and taken PD348 off the fixes tune did not measure; nor PD341, which fits threads to
    # the cores (fewer)
    assert prediction(row, fixes, None) == ("PD346", None)
    assert prediction(trials[1], {**fixes, "PD341": {**fixes["PD341"], "ranked": True}}, None) == ("PD348", 1.77)
    assert plan.wanted(row, plan.only_names(["PD346"])) and not plan.wanted(row, plan.only_names(["PD348"]))
    # the queue of the job's own making (2 workers at 0.37 core each and 2 torch threads on 2
    # cores, others at 0.02 core: a user trial): one thread fewer is tried, and tests PD341
    own = facts(verdict="input_cpu", threads=2, contended=True, other_cores=0.02, worker_cores=0.73)
    fewer = next(t for t in plan.plan(own) if "threads" in t.changes)
    assert fewer.changes == {"threads": 1} and not fewer.skip and fewer.tests == plan.THREADS_FEWER
    mine = {"PD341": {"kind": "fix", "ranked": True, "gain": {"expected": 1.41}}}
    assert prediction(fewer, mine, None) == ("PD341", 1.41)
    # no workers and others idle, but the job's own threads outnumber the cores (a logger's
    # writer thread beside 2 torch threads: 1.40 runnable per core on 2 cores, a user trial with
    # TensorBoard histograms every step, PD341 ~1.26x): one torch thread fewer; it measured 1.10x
    logger = facts(verdict="host", threads=2, contended=True, other_cores=0.02, demand=1.40)
    fewer = next(t for t in plan.plan(logger) if "threads" in t.changes)
    assert fewer.changes == {"threads": 1} and fewer.tests == plan.THREADS_FEWER
    assert prediction(fewer, {"PD341": {"kind": "fix", "ranked": True, "gain": {"expected": 1.26}}}, None) \
        == ("PD341", 1.26)
    # an excess under half a core is no reason; 8 threads on 8 cores with 2.5 cores' excess: 6
    assert not any("threads" in t.changes for t in plan.plan(facts(verdict="host", threads=2, contended=True,
                                                                    other_cores=0.02, demand=1.2)))
    many = facts(cores=8, verdict="host", threads=8, contended=True, other_cores=0.0, demand=1.3125)
    assert next(t for t in plan.plan(many) if "threads" in t.changes).changes == {"threads": 6}


def test_no_trial_for_what_the_script_already_does():
    trials = plan.plan(facts(loader=dict(LOADER0, num_workers=2, pin_memory=True), threads=2,
                             optimizers=[dict(SGD, foreach=True, fused=True)]))
    labels = [t.label for t in trials]
    assert "num_workers=2" not in labels and "threads=2" not in labels
    assert not any(t.group in ("optimizer", "threads") for t in trials)
    assert "pin_memory=True" not in labels
    # a fused optimizer gets no foreach trial (a step back), on the CPU or a GPU
    for cuda in (False, True):
        fused = plan.plan(facts(cuda=cuda, optimizers=[dict(SGD, fused=True)]))
        assert not any(t.group == "optimizer" for t in fused), cuda
    assert [t.changes for t in plan.plan(facts(optimizers=[dict(SGD, foreach=True)])) if t.group == "optimizer"] \
        == [{"optimizer": "fused"}]


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

def test_a_report_that_found_peeks_plans_the_keep_iterator_trial_first():
    trials = plan.plan(facts(peeks=True, ranked=["PD355", "PD301"]))
    assert trials[0].changes == {"keep_iterator": True} and trials[0].group == "iterator" and not trials[0].skip
    assert plan.rule_for(trials[0].changes, {"PD355", "PD301"}) == "PD355"
    assert all("keep_iterator" not in t.changes for t in plan.plan(facts()))


def test_a_ranked_fix_under_a_material_gain_orders_no_trial_group():
    """An input-bound tune (89% data wait, no idle core: PD309) spent its 120 s on optimizer=fused
    and foreach, the report's PD338 ranked at ~1.02x (max 1.04x), and left its loader trials
    skipped for budget. A ranked fix whose ceiling (else expected gain) is under a material gain
    orders no group: the verdict's order stands."""
    from types import SimpleNamespace

    from perfdoctor.tune.predict import facts as plan_facts
    b = SimpleNamespace(inject={"loaders": [{"asked": LOADER0}], "optimizers": [SGD], "threads": 2},
                        child={}, estimate=SimpleNamespace(wait_share=0.89))
    doc = {"verdict": {"bound": "input_cpu"}, "flags": [],
           "traces": [{"metrics": {"machine.cpu_count": 2}}]}
    fixes = {"PD348": {"ranked": True, "on_bottleneck": True, "gain": {"expected": 1.17}},
             "PD338": {"ranked": True, "gain": {"expected": 1.02, "ceiling": 1.04}},
             "PD309": {"ranked": False}}
    f = plan_facts(doc, fixes, b)
    assert f.ranked == ["PD348"] and f.saturated
    groups = [t.group for t in plan.plan(f) if t.skip is None]
    assert groups.index("loader") < groups.index("optimizer"), groups
    fixes["PD338"]["gain"]["ceiling"] = 1.3          # a ceiling that allows a material gain ranks it,
    assert plan_facts(doc, fixes, b).ranked == ["PD348"]   # off the bottleneck: if it outweighs the wait
    fixes["PD338"]["on_bottleneck"] = True
    assert plan_facts(doc, fixes, b).ranked == ["PD348", "PD338"]


def test_an_input_bound_step_measures_its_input_before_fixes_off_the_bottleneck():
    """A user's tabular loop waited 81% of its steps for samples built from Python values: the
    report ranked sparse embeddings (~1.20x, no ceiling) and a fused optimizer (~1.12x, max 1.14x),
    both off the bottleneck, and PD306 unranked; tune spent its budget on optimizer=fused and left
    store_samples (2.7x when asked for; 3.5x by hand) skipped. Fixes off the bottleneck that cannot
    gain the wait's 1 / (1 - 0.81) order nothing: the preprocessing bound is measured first."""
    from types import SimpleNamespace

    from perfdoctor.tune.predict import facts as plan_facts
    b = SimpleNamespace(inject={"loaders": [{"asked": LOADER0}], "optimizers": [SGD], "threads": 1},
                        child={}, estimate=SimpleNamespace(wait_share=0.81))
    doc = {"verdict": {"bound": "input_cpu"}, "flags": [], "traces": [{"metrics": {"machine.cpu_count": 2}}]}
    fixes = {"PD383": {"ranked": True, "on_bottleneck": False, "gain": {"expected": 1.20}},
             "PD338": {"ranked": True, "on_bottleneck": False, "gain": {"expected": 1.12, "ceiling": 1.14}},
             "PD306": {"ranked": False, "on_bottleneck": True}, "PD309": {"ranked": False}}
    f = plan_facts(doc, fixes, b)
    assert f.ranked == [] and f.preprocess
    groups = [t.group for t in plan.plan(f) if t.skip is None]
    assert groups.index("preprocessing") < groups.index("optimizer"), groups
    # on a host-bound verdict the same fixes keep their ranks
    doc["verdict"]["bound"] = "host"
    assert plan_facts(doc, fixes, b).ranked == ["PD383", "PD338"]


def test_a_cpu_cnn_on_nchw_tensors_gets_a_channels_last_trial():
    """PD392 (convolutions on NCHW tensors on the CPU, no modelled gain) is measured: the layout
    trial runs on the CPU, where the CUDA settings are skipped; without the claim there is none."""
    cl = [t for t in plan.plan(facts(nchw=True)) if t.changes == {"channels_last": True}]
    assert len(cl) == 1 and cl[0].group == "layout" and cl[0].skip is None
    assert not [t for t in plan.plan(facts()) if "channels_last" in t.changes]
