"""A batch too small for the CPU (PD385): most of each step a fixed cost, so a doubled batch costs
little more time. Found on live runs from the census's batch and the trace's large ops; a data
wait too short for worker processes is no num_workers flag (PD201)."""

from __future__ import annotations

import pytest
from runs import prun_script, report

from perfdoctor.analyze import registry
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.gain import describe
from perfdoctor.rules.loader import load_rules

RULES = load_rules()

# An MLP trained from a DataLoader over a TensorDataset; argv[1]: the batch size, argv[2]: the width
SCRIPT = r"""
import sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
bs, width = int(sys.argv[1]), int(sys.argv[2])
ds = TensorDataset(torch.randn(4096, 128), torch.randint(0, 10, (4096,)))
model = nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
n = 0
while n < int(sys.argv[3]):
    for x, y in DataLoader(ds, batch_size=bs, shuffle=True, drop_last=True):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); n += 1
        if n == int(sys.argv[3]):
            break
print("done")
"""


def _fixed(m: dict) -> float:
    batch = m["loop.model_call_batch"]
    sample_loop = m["cpu.loop_share"] or 0 if batch > 1 and abs((m["cpu.loop_iterations"] or 0) - batch) <= 1 else 0
    grows = ((max(0.0, m["cpu.compute_share"] - (m["cpu.optimizer_large_op_share"] or 0)) + sample_loop)
             * max(1.0, m["steps.time_median_ms"] / m["run.step_time_ms"]) + (m["run.data_wait_share"] or 0)
             + max(m.get(k) or 0 for k in ("calls.convert_share", "calls.pre_forward_share",
                                           "stacks.pre_forward_data_share")))
    return 1 - min(1.0, grows)


@pytest.mark.quiet         # the fixed part of the step is a timing
def test_a_batch_of_one_is_offered_a_larger_batch_first_and_no_workers_flag(tmp_path):
    """batch_size=1: the step is the loop's Python and the ops' dispatch (doubling measured
    1.76-1.89x in samples per second on the 2-core VM, bench/bench_larger_batch.py); the data wait
    is a fraction of a millisecond a batch, less than a worker's handoff costs."""
    r, out = prun_script(tmp_path, "bs1.py", SCRIPT, "1", "256", "1500", trace=True)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.model_call_batch"] == 1 and m["input.loader_batch_size"] == 1
    # where the run saw other work on its cores, "run on cores of your own" (PD348) may come first,
    # and rightly (a CI run beside another test worker, before this test held the machine): the
    # batch's fix comes next
    first = [f for f in doc["findings"] if f["id"] != "PD348"][0]
    assert first["id"] == "PD385", [f["id"] for f in doc["findings"]]
    fixed = _fixed(m)
    assert fixed >= 0.5
    assert first["gain"]["expected"] == pytest.approx(2 / (2 - fixed), rel=1e-3)
    assert first["gain"]["ceiling"] == pytest.approx(2.0)
    assert 1.33 <= first["gain"]["expected"] <= 2.0
    wait_per_batch = m["run.data_wait_share"] * m["run.step_time_ms"] / m["loop.batches_per_step"]
    assert wait_per_batch < 1.0
    assert "PD201" not in {f["id"] for f in doc["flags"]}
    assert first["gain"]["setting"] == "with a batch of 2" and "PD385 Use a larger batch" in r.stderr


def test_a_batch_whose_work_is_most_of_the_step_gets_no_larger_batch(tmp_path):
    """A wide MLP at batch 256: its matrix products are most of the step, so a doubled batch
    nearly doubles the step: no fix."""
    r, out = prun_script(tmp_path, "wide.py", SCRIPT, "256", "1024", "40", trace=True)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.model_call_batch"] == 256
    assert _fixed(m) < 0.5
    assert "PD385" not in {f["id"] for f in doc["findings"]}


def _metrics(**kw) -> dict:
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"trace.platform": "cpu", "loop.model_calls_per_step": 1, "loop.model_call_batch": 4,
              "cpu.compute_share": 0.2, "steps.time_median_ms": 2.0, "run.step_time_ms": 1.5,
              "run.data_wait_share": 0.1})
    m.update(kw)
    return m


def _pd385(m: dict):
    return next((f for f in evaluate(RULES, m).fixes if f.rule.id == "PD385"), None)


def test_the_optimizers_large_ops_are_a_fixed_cost_and_an_unknown_one_reads_none():
    # 0.2 x 2 / 1.5 + 0.1 = 0.367 grows: fixed 0.633, expected 2 / 1.367
    f = _pd385(_metrics())
    assert f is not None and f.expected == pytest.approx(2 / (2 - (1 - 0.2 * 2 / 1.5 - 0.1)), rel=1e-6)
    assert "None" not in f.summary and "batch of 4" in f.summary
    # the optimizer's large ops do not grow with the batch: 0.15 of the 0.2 is the optimizer's
    g = _pd385(_metrics(**{"cpu.compute_share": 0.5, "cpu.optimizer_large_op_share": 0.4}))
    assert g is not None and g.expected == pytest.approx(2 / (2 - (1 - 0.1 * 2 / 1.5 - 0.1)), rel=1e-6)
    assert _pd385(_metrics(**{"cpu.compute_share": 0.5})) is None          # 0.77 grows with the batch
    assert _pd385(_metrics(**{"loop.model_calls_per_step": 8})) is None     # a loop over samples: PD353
    # a Python loop over the batch's 4 samples (a custom loss) grows with the batch; one of 12 does not
    assert _pd385(_metrics(**{"cpu.loop_share": 0.3, "cpu.loop_iterations": 4})) is None
    assert _pd385(_metrics(**{"cpu.loop_share": 0.3, "cpu.loop_iterations": 12})).expected == f.expected
    assert _pd385(_metrics(**{"trace.platform": "cuda"})) is None           # PD313's on a GPU
    # a steady window slower than the trace (a shared CPU) leaves the trace's own share: 0.55 grows
    assert _pd385(_metrics(**{"cpu.compute_share": 0.45, "steps.time_median_ms": 2.0, "run.step_time_ms": 4.0})) is None


def test_a_whole_step_share_with_a_ceiling_says_its_label():
    text = describe(1.5, 1.4, 2.0, 2.0, 1.0, "a doubled batch sharing one step's time")
    assert text.endswith("at most 2.00x (a doubled batch sharing one step's time)"), text
    assert describe(None, None, None, None, 1.0, "anomaly mode").endswith("(nothing measured bounds anomaly mode)")


# --- tune's batch_scale trial (PD385): twice the DataLoader's batch, compared per sample ----------

LOADERS = r"""
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
ds = TensorDataset(torch.randn(64, 3))
plain = next(iter(DataLoader(ds, batch_size=4)))[0]
sampled = next(iter(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False))))[0]
print(len(plain), len(sampled))
"""


def test_batch_scale_doubles_an_int_batch_size_and_leaves_a_batch_sampler(tmp_path, capfd):
    pytest.importorskip("torch")
    from tunecases import injected
    out, inj = injected(tmp_path, capfd, {"batch_scale": 2}, LOADERS)
    bare_out, bare = injected(tmp_path, capfd, {}, LOADERS)
    assert out.split() == ["8", "4"] and bare_out.split() == ["4", "4"]
    assert "batch_scale" in inj["applied"] and "batch_scale" not in bare["applied"]
    assert inj["loaders"][0]["asked"]["batch_size"] == 4          # what the script asked for
    from perfdoctor.tune.apply import apply_text
    assert apply_text({"batch_scale": 2}, inj, cuda=False).startswith("DataLoader(dataset, batch_size=8, ...)")


def test_a_scaled_batchs_speedup_is_per_sample(tmp_path):
    from tunecases import steady_run

    from perfdoctor.tune.measure import speedup
    base = steady_run(tmp_path, "base", 1.0)
    scaled = steady_run(tmp_path, "scaled", 1.2, {"batch_scale": 2}, seed=1)
    ratio, (lo, hi) = speedup([base], scaled)
    assert ratio == pytest.approx(2 * base.step_s / scaled.step_s) and lo < ratio < hi
    scaled.inject = {"applied": []}                 # a loop without a DataLoader: nothing was scaled
    assert speedup([base], scaled)[0] == pytest.approx(base.step_s / scaled.step_s)


def test_a_report_with_pd385_plans_the_trial_behind_allow_numerics():
    from tunecases import facts

    from perfdoctor.rules.tunable import tune_command
    from perfdoctor.tune import plan
    ours = [t for t in plan.plan(facts(small_batch=True, verdict="cpu_overhead", data_wait=0.1))
            if "batch_scale" in t.changes]
    assert len(ours) == 1 and ours[0].skip == "changes numerics: needs --allow-numerics"
    allowed = next(t for t in plan.plan(facts(small_batch=True, verdict="cpu_overhead", data_wait=0.1),
                                        allow_numerics=True) if "batch_scale" in t.changes)
    assert allowed.skip is None and plan.rule_for(allowed.changes, {"PD385", "PD312"}) == "PD385"
    assert not any("batch_scale" in t.changes for t in plan.plan(facts(small_batch=True, loader=None)))
    assert tune_command(["PD385"], "train.py", cuda=False) == "perfdoctor tune --only PD385 --allow-numerics train.py"


@pytest.mark.quiet
@pytest.mark.slow
def test_tune_measures_a_doubled_batch_in_samples_per_second(tmp_path):
    """The batch_size=1 MLP: the trial's steps are longer than the baseline's, its speed-up is per
    sample, and its prediction is the report's PD385 gain. A timing: it holds the machine (ci110,
    beside another test: 1.05x, where alone it measures ~1.8x)."""
    from tunecases import ptune
    script = tmp_path / "bs1.py"
    script.write_text(SCRIPT)
    r = ptune("--only", "PD385", "--allow-numerics", "--budget", "50", "--duration", "3", "--out", tmp_path / "t", "-o",
              tmp_path / "t.json", script, "1", "256", "3000")
    assert r.returncode in (0, 3), r.stderr
    import json
    doc = json.loads((tmp_path / "t.json").read_text())
    trial = next(t for t in doc["trials"] if t["changes"] == {"batch_scale": 2})
    if trial["status"] == "skipped" and trial["reason"] == "budget":     # a CI run beside another test: 30 s
        pytest.skip("the machine was too slow for the trial to fit the budget")  # had not fit it
    assert trial["status"] in ("faster", "slower", "no change", "inconclusive"), trial
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    pd385 = next(f for f in report["findings"] if f["id"] == "PD385")
    assert trial["rule"] == "PD385" and trial["predicted"] == pytest.approx(pd385["gain"]["expected"], abs=1e-4)
    # the speed-up is per sample: twice the step times' ratio (the baselines pooled: between the
    # ratios to the fastest and the slowest of them), not the ratio itself. Not "the step of twice
    # the samples is longer": expected 1.1x longer, a snapshot run read a trial step shorter than
    # every baseline's
    bases = [doc["baseline"]["step_time_s"], *trial["baseline_step_time_s"]]
    ratios = [2 * min(bases) / trial["step_time_s"], 2 * max(bases) / trial["step_time_s"]]
    again = trial["confirm"] or {}
    if again.get("speedup"):            # confirmed: both runs weighed together (a CI run: 1.95x, then 2.45x)
        assert again["speedup"] == pytest.approx(2 * again["baseline_step_time_s"] / again["step_time_s"], rel=0.02)
        ratios.append(again["speedup"])
    assert 0.98 * min(ratios) <= trial["speedup"] <= 1.02 * max(ratios), (trial, ratios)
    assert trial["speedup"] > 1.2
    assert "in samples per second" in r.stdout


def test_the_tune_hint_offers_pd385_only_where_a_dataloader_has_a_batch_to_scale():
    from perfdoctor.report.tune_labels import tune_hint
    doc = {"run": {"command": "train.py", "steps": 100, "outcome": "completed", "exit_code": 0}, "verdict": {},
           "traces": [{"metrics": {"trace.platform": "cpu", "input.loader_batch_size": 1}}],
           "findings": [{"id": "PD385", "kind": "fix"}, {"id": "PD338", "kind": "fix"}]}
    assert tune_hint(doc) == "perfdoctor tune --only PD385,PD338 --allow-numerics train.py"
    doc["traces"][0]["metrics"]["input.loader_batch_size"] = None       # the loop makes its own batches
    assert tune_hint(doc) == "perfdoctor tune --only PD338 train.py"


# A transformer layer trained with gradient accumulation: argv[1] micro-batches of argv[2]
# sequences a step, the batch made in the loop (no DataLoader), as nanoGPT's train.py does.
ACCUMULATING = r"""
import sys, torch
torch.manual_seed(0)
micro, bs = int(sys.argv[1]), int(sys.argv[2])
layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
head = torch.nn.Linear(64, 50)
model = torch.nn.Sequential(layer, head)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(30):
    for _ in range(micro):
        x, y = torch.randn(bs, 16, 64), torch.randint(0, 50, (bs * 16,))
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, 50), y) / micro
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_gradient_accumulation_over_small_micro_batches_is_offered_fewer_larger_ones(tmp_path):
    """nanoGPT on a CPU (40 micro-batches of 16 sequences a step) got no advice on its batch: PD385
    needs one model call a step, and its text says accumulation keeps the small batch's cost. Its
    8-fold accumulation of micro-batches of 4 sequences is told to merge them (PD394), bounded by
    the 8 micro-batches, with no modelled gain (nanoGPT measured more than the ops' shares give)."""
    r, out = prun_script(tmp_path, "accumulate.py", ACCUMULATING, "8", "4", trace=True)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert (m["loop.backward_passes_per_step"], m["loop.fresh_passes_per_step"], m["loop.model_calls_per_step"],
            m["loop.model_call_batch"]) == (8, 1, 8, 4)
    fix = next(f for f in doc["findings"] if f["id"] == "PD394")
    assert fix["gain"]["ceiling"] == pytest.approx(8.0) and fix["gain"]["expected"] is None
    assert "accumulates gradients over 8 micro-batches of 4" in fix["summary"]
    assert "PD385" not in {f["id"] for f in doc["findings"]}
