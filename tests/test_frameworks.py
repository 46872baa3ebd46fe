"""`perfdoctor run` on the frameworks people train with, unmodified: PyTorch Lightning
Trainer.fit, HF transformers.Trainer, accelerate with gradient accumulation, a torch.compile'd
model. Tiny models from code or configs (random weights): nothing is downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")

EX = Path(__file__).resolve().parent.parent / "examples"
BATCH = 8


def _run(tmp_path: Path, script, *args, timeout=120):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), "--skip-steps", "3",
                        "--trace-steps", "2", str(script), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    return r, steps, json.loads((out / "report.json").read_text()), json.loads((out / "child.json").read_text())


def _check_verdict(doc):
    """A sensible verdict for a loader that sleeps and a model computed on the CPU: input-bound
    (the usual case here), or compute-bound when a loaded machine stretched the compute; never
    inconclusive, communication or host. When the steady steps waited for data most of the time,
    input-bound."""
    v, m = doc["verdict"], doc["traces"][0]["metrics"]
    assert v["bound"] == "device" or v["bound"].startswith("input"), v
    if (m["run.data_wait_share"] or 0) >= 0.6 and (m["share.input"] or 0) >= 0.5:
        assert v["bound"].startswith("input"), v


def _check_loading(steps, accumulate: int, load_ms: float):
    """Every measured step holds `accumulate` batches, and the data wait of each covers the
    loading the dataset sleeps (BATCH samples of load_ms per batch)."""
    # the first measured step may start after its batches were fetched, and a loader that fetches
    # one batch ahead (accelerate, Lightning) ends the last step with a StopIteration, not a batch
    later = steps[1:-1]
    assert later and all(s["batches"] == accumulate for s in later), [s["batches"] for s in steps]
    per_step = accumulate * BATCH * load_ms / 1e3
    assert all(s["wait"] >= 0.9 * per_step for s in later), [s["wait"] for s in later]
    assert all(s["wait"] <= s["dur"] for s in steps)


@pytest.mark.slow
def test_lightning_trainer_fit(tmp_path):
    pytest.importorskip("lightning", reason="lightning is in the test extra")
    r, steps, doc, child = _run(tmp_path, EX / "lightning_fit.py", "--steps", "16", "--accumulate", "2",
                                "--load-ms", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "lightning_fit: 16 optimizer steps\n"            # the script's own stdout, untouched
    assert "`Trainer.fit` stopped" in r.stderr                           # Lightning's own messages too
    # Lightning steps optimizers through a closure: every optimizer step is a step, the first included
    assert child["mode"] == "optimizer" and len(steps) == 16
    _check_loading(steps, 2, 3)
    _check_verdict(doc)


@pytest.mark.slow
def test_accelerate_with_gradient_accumulation(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is in the test extra")
    r, steps, doc, child = _run(tmp_path, EX / "accelerate_loop.py", "--steps", "16", "--accumulate", "2",
                                "--load-ms", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "accelerate_loop: 16 optimizer steps\n"
    # AcceleratedOptimizer.step skips the accumulation batches: 16 updates, the first starts the count
    assert child["mode"] == "optimizer" and len(steps) == 15
    _check_loading(steps, 2, 3)
    _check_verdict(doc)


@pytest.mark.slow
def test_hf_trainer(tmp_path):
    pytest.importorskip("transformers", reason="transformers is in the test extra")
    r, steps, doc, child = _run(tmp_path, EX / "hf_trainer.py", "--steps", "12", "--accumulate", "2",
                                "--load-ms", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.endswith("hf_trainer: 12 optimizer steps\n") and "train_runtime" in r.stdout
    assert child["mode"] == "optimizer" and len(steps) == 11
    _check_loading(steps, 2, 3)
    m = doc["traces"][0]["metrics"]
    assert m["run.data_wait_share"] > 0
    _check_verdict(doc)


COMPILED = r"""
import sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = torch.compile(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)), backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,))), batch_size=16)
n = 0
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    n += 1
print(f"compiled: {n} steps, exit 4", flush=True)
sys.exit(4)
"""


@pytest.mark.slow
def test_torch_compile_model(tmp_path):
    """A compiled model (AOTAutograd graphs, no C++ compiler needed): steps are optimizer steps
    (the compilation happens before the first one, which starts the count), and the exit code
    passes through."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    r, steps, doc, child = _run(tmp_path, script)
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stdout == "compiled: 32 steps, exit 4\n"
    assert child["mode"] == "optimizer" and len(steps) == 31 and child["outcome"] == "exit"
    assert all(s["batches"] == 1 for s in steps[1:])


HF_EVAL = r"""
import tempfile, torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

class Ids(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids, self.labels = torch.randint(5, 100, (n, 32), generator=g), torch.randint(0, 2, (n,), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}

class EvalAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        control.should_evaluate = state.global_step in (10, 40)

torch.manual_seed(0)
cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=32, num_labels=2)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=50, per_device_train_batch_size=8, per_device_eval_batch_size=32,
                             gradient_accumulation_steps=2, eval_strategy="no", save_strategy="no",
                             logging_steps=1, report_to=[], disable_tqdm=True, use_cpu=True, seed=0)
    Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=Ids(1024), eval_dataset=Ids(512),
            callbacks=[EvalAt()]).train()
"""


@pytest.mark.quiet
@pytest.mark.slow
def test_hf_trainer_evaluating_at_two_chosen_steps(tmp_path):
    """Evaluations at steps 10 and 40 of 50 (a callback, as a script that evaluates when it
    chooses): the traced steps (6-11) hold one, the steady window too few to show a period. The
    evaluation's share is the run's (the steps that drew its batches, their time beyond the usual
    step), not the window's, which holds it 1 step in 6. The evaluation (16 batches of 32) makes
    its step ~3.5x the usual one: with 8 batches it was ~2.3x, near the long-step line (2x), and a
    CI run whose traced evaluation step fell under it read the window's share (0.22 for 0.10).
    With eval_steps=10 over 30 steps the run held it 1 step in ~10, too near the window's for the
    two figures to be told apart on a loaded machine (0.37 and 0.29 in a CI run); 1 in ~37 now."""
    pytest.importorskip("transformers", reason="transformers is in the test extra")
    script = tmp_path / "hf_eval.py"
    script.write_text(HF_EVAL)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    m = json.loads((out / "report.json").read_text())["traces"][0]["metrics"]
    assert [s["step"] for s in steps if s["batches"] > 2] == [10, 40], [s["batches"] for s in steps]
    assert sum(1 for s in steps if s["profiled"] and s["batches"] > 2) == 1
    assert m["loop.long_steps_every"] is None            # too few long steps in the steady window: no period
    window, run = m["evaluation.nograd_forward_share"], m["loop.extra_batches_excess_share"]
    assert window > 1.5 * run, (window, run)             # 1 evaluation in 6 traced steps, 1 in ~37 in the run
    assert m["evaluation.share"] == pytest.approx(run, abs=0.05), (m["evaluation.share"], run, window)
    assert m["evaluation.nograd_run_share"] <= run + 0.05, (m["evaluation.nograd_run_share"], run)
