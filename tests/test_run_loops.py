"""`perfdoctor run` on loops it used to miss: hand-written updates (no torch.optim), a closure
optimizer with a few long steps, too few steps for a trace, a failure before the first step.

Each test writes a small CPU training script, runs it under `perfdoctor run` and checks the
run directory the run really produced: steps.jsonl, child.json, the trace, report.json.
"""

from __future__ import annotations

import json

import pytest
from runs import bare, child, prun, prun_script, report, steps

torch = pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")


# An LSTM language model as in the classic word-language-model example: batches sliced from one
# tensor (no DataLoader), parameters updated by hand (no optimizer), gradients clipped.
LSTM = r"""
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
iters = int(sys.argv[1])
vocab, emb, hid, bptt, bsz = 200, 64, 128, 20, 16
data = torch.randint(0, vocab, (bptt * (iters + 1) + 1, bsz))
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.rnn, self.dec = nn.Embedding(vocab, emb), nn.LSTM(emb, hid), nn.Linear(hid, vocab)
    def forward(self, x, h):
        out, h = self.rnn(self.enc(x), h)
        return self.dec(out), h
model, lr, crit, h = LM(), 0.5, nn.CrossEntropyLoss(), None
for i in range(iters):
    x, y = data[i * bptt:(i + 1) * bptt], data[i * bptt + 1:(i + 1) * bptt + 1]
    h = None if h is None else tuple(t.detach() for t in h)
    model.zero_grad()
    out, h = model(x, h)
    loss = crit(out.view(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(-lr, p.grad)
    if i % 10 == 0:
        print(f"iter {i} loss {loss.item():.4f}", flush=True)
print("lstm: done; inductor loaded:", "torch._inductor" in sys.modules)
"""


def test_hand_written_update_counts_backward_passes(tmp_path):
    script = tmp_path / "lstm.py"
    script.write_text(LSTM)
    out = tmp_path / "run"
    r = prun("--skip-steps", "3", "--trace-steps", "4", script, 40, out=out)
    b = bare(script, 40)
    assert r.returncode == 0 == b.returncode, r.stderr
    # the script's output, untouched; and the profiler's start did not load torch._inductor and
    # torch._dynamo into a script that never uses them (~1 s inside one of its steps)
    assert r.stdout == b.stdout and "inductor loaded: False" in b.stdout
    assert "deprecated" in r.stderr                           # add_(Number, Tensor)'s own warning passes through
    recs = steps(out)
    assert len(recs) == 39 and {s["mode"] for s in recs} == {"backward"}   # 40 passes, the first starts the count
    c = child(out)
    assert c["mode"] == "backward" and c["step_source"].startswith("backward passes")
    doc = report(out)
    assert doc["run"]["step_source"] == c["step_source"]
    # a hand-written update is an optimizer too: the note says which kind stepped none
    assert any(n.startswith("no torch.optim optimizer stepped") and "updates its parameters by hand" in n for n in doc["run"]["notes"])
    m = doc["traces"][0]["metrics"]
    assert list((out / "trace").glob("*.pt.trace.json.gz"))
    assert m["steps.source"] == "ProfilerStep" and m["steps.count"] == 4
    assert m["run.steps"] == 39
    assert doc["verdict"]["bound"] != "inconclusive" and doc["verdict"]["rule"]


# Hand-written accumulation over a DataLoader: 3 backward passes per update, no optimizer. The
# passes of one update are one step; batches come from a DataLoader but backward passes win.
ACCUM = r"""
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(30 * 8, 16), torch.randn(30 * 8, 1))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
    (nn.functional.mse_loss(model(x), y) / 3).backward()
    if i % 3 == 2:
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        model.zero_grad(set_to_none=(i % 2 == 0))   # both ways of resetting
print("accum: done")
"""


def test_hand_written_gradient_accumulation_is_one_step_per_update(tmp_path):
    r, out = prun_script(tmp_path, "accum.py", ACCUM)
    assert r.stdout == "accum: done\n"
    recs = steps(out)
    # 30 passes in 10 updates: the first update's first pass starts the count, the last update
    # is never followed by a reset, so 9 steps of 3 batches each.
    assert [s["batches"] for s in recs] == [3] * 9
    assert child(out)["mode"] == "backward"
    assert child(out)["dataset_kind"] == "map"              # a TensorDataset: PD310 has nothing to shard
    assert report(out)["traces"][0]["metrics"]["input.dataset_kind"] == "map"
    # --max-steps counts the steps kept while the source was being chosen (8 here) as well
    r = prun("--no-trace", "--max-steps", 5, tmp_path / "accum.py", out=tmp_path / "stopped")
    assert r.returncode == 0 and r.stdout == "" and len(steps(tmp_path / "stopped")) == 5
    assert report(tmp_path / "stopped")["run"]["stopped_by"] == "max-steps"


# 40 backward passes accumulated with no reset and no update (backward-each fallback after 32),
# then a torch.optim loop: steps follow the optimizer from its first step.
LATE_OPTIMIZER = r"""
import torch, torch.nn as nn
model = nn.Linear(16, 1)
x, y = torch.randn(8, 16), torch.randn(8, 1)
for i in range(40):
    nn.functional.mse_loss(model(x), y).backward()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(30):
    opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
print("late: done")
"""


def test_an_optimizer_that_starts_late_takes_over_the_steps_and_the_note_names_accumulation(tmp_path):
    """Backward passes before the first optimizer step are gradients accumulated (a user's 96 had
    read "an evaluation before training?", which calls no backward); from its first step the
    optimizer's steps are the steps."""
    r, out = prun_script(tmp_path, "late.py", LATE_OPTIMIZER)
    assert r.stdout == "late: done\n"
    assert child(out)["mode"] == "optimizer"
    notes = report(out)["run"]["notes"]
    note = next(n for n in notes if "with no optimizer step" in n)
    assert "(gradients accumulated over them before the first update?)" in note and "evaluation" not in note, note


# Layer-wise training (pytorch/examples mnist_forward_forward): one Adam per layer, the layers
# trained one after the other. Steps followed only the first optimizer: the second layer's
# training was no step, and --max-steps past the first layer's steps never stopped the run.
LAYERWISE = r"""
import torch, torch.nn as nn
torch.manual_seed(0)
layers = [nn.Linear(32, 32), nn.Linear(32, 32)]
x = torch.randn(64, 32)
for n, layer in enumerate(layers):
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
    for i in range(25):
        loss = layer(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    x = layer(x).detach()
print("layerwise: done")
"""


def test_layer_wise_training_steps_follow_each_layers_optimizer(tmp_path):
    r, out = prun_script(tmp_path, "layerwise.py", LAYERWISE)
    assert r.stdout == "layerwise: done\n"
    recs = steps(out)
    assert len(recs) == 49                         # 50 updates: the first starts the count
    assert all(s["dur"] > 0 for s in recs)         # the second layer's steps, written at the hand-over too
    assert [s["step"] for s in recs] == list(range(1, 50))
    assert child(out)["mode"] == "optimizer"
    notes = [n for n in child(out)["notes"] if "stopped stepping" in n]
    assert notes == ["Adam of 1,056 parameters stopped stepping and another Adam of 1,056 parameters stepped 16 "
                     "times in a row: steps follow it from then on (a new phase of training: layer by layer, a "
                     "second stage)"]
    r = prun("--no-trace", "--max-steps", 40, tmp_path / "layerwise.py", out=tmp_path / "stopped")
    assert r.returncode == 0 and r.stdout == "" and len(steps(tmp_path / "stopped")) == 40


# A functional loop: gradients from torch.autograd.grad (never accumulated in .grad), a gradient
# penalty taken with create_graph=True inside each step (not a step), parameters updated by hand.
FUNCTIONAL = r"""
from torch.autograd import grad
import torch
torch.manual_seed(0)
w1, w2 = torch.randn(16, 32, requires_grad=True), torch.randn(32, 1, requires_grad=True)
for i in range(20):
    x = torch.randn(8, 16, requires_grad=True)
    out = torch.tanh(x @ w1) @ w2
    (gx,) = grad(out.sum(), x, create_graph=True)              # a penalty on the input gradient
    loss = out.pow(2).mean() + gx.pow(2).mean()
    g1, g2 = grad(loss, [w1, w2], None, None, False)            # positional: create_graph=False
    with torch.no_grad():
        w1 -= 0.01 * g1
        w2 -= 0.01 * g2
print("functional: done")
"""


def test_functional_loop_counts_autograd_grad_calls(tmp_path):
    r, out = prun_script(tmp_path, "functional.py", FUNCTIONAL)
    assert r.stdout == "functional: done\n"
    recs = steps(out)
    # 20 updates: the second call is the first whose weights were updated since the last call,
    # and that boundary starts the count (18 steps); the penalties are no steps
    assert len(recs) == 18 and {s["mode"] for s in recs} == {"backward"}
    c = child(out)
    assert c["mode"] == "backward" and c["step_source"] == "torch.autograd.grad calls (one per step)"
    assert any("torch.autograd.grad" in n for n in report(out)["run"]["notes"])


# An inference loop over tensors: no optimizer, no backward pass, no DataLoader; a model with
# nested modules, called once per iteration, and once more after the loop under another name.
# A process forked before the loop (as a DataLoader worker is) finds Module.__call__ as it was.
INFERENCE = r"""
import os
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Sequential(nn.ReLU(), nn.Linear(64, 64)), nn.Linear(64, 4)).eval()
head = nn.Linear(4, 1)
x = torch.randn(16, 32)
pid = os.fork()
if pid == 0:
    print("forked: Module.__call__ wrapped:", getattr(nn.Module.__call__, "_perfdoctor", False), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
with torch.inference_mode():
    for i in range(20):
        y = model(x)
    z = head(y)
print("inference: done; Module.__call__ wrapped:", getattr(nn.Module.__call__, "_perfdoctor", False))
"""


def test_inference_loop_steps_are_calls_of_the_outermost_module(tmp_path):
    r, out = prun_script(tmp_path, "infer.py", INFERENCE)
    # the class-wide wrapper was taken off once the source was chosen
    assert r.stdout == ("forked: Module.__call__ wrapped: False\n"
                        "inference: done; Module.__call__ wrapped: False\n")
    recs = steps(out)
    assert len(recs) == 19 and {s["mode"] for s in recs} == {"module"}   # nested modules and the head: no steps
    c = child(out)
    assert c["mode"] == "module" and c["step_source"] == "calls of the outermost module (one per step)"
    # one call of the model per step (its pre-hook, which marks the step, runs after the class
    # wrapper counted the call: that call is the next step's, not a second one of this step)
    assert c["root_calls"] == {"module": "Sequential", "calls": 1, "grad_calls": 0,
                               "batch": 16, "batch_share": 1.0, "modules": 1,
                               "passes": 0, "fresh_passes": 0, "cpu_autocast": None, "conv_layout": None,
                               "padding": None, "dense_embeddings": None, "chained": 0, "sliced": 0, "rnn_module": None,
                               "rnn": None, "rnn_calls": 0,
                               "rnn_chained": 0, "rnn_fed_sliced": 0, "rnn_fed_back": 0, "rnn_layers": [],
                               "compiled_in_place": False, "dynamo_graphs": None}
    assert report(out)["traces"][0]["metrics"]["loop.model_calls_per_step"] == 1
    assert any("outermost module (Sequential)" in n for n in report(out)["run"]["notes"])


# A per-sample loop: the model is called once per sample (batch of one) before one backward pass
# per step; with --batched, once per batch. Batches of 16 from a DataLoader (num_workers=0) whose
# samples, shaped (1, 32), go through a transform that is a module: 16 calls of it per step,
# with a batch of one, inside the DataLoader (batch preparation: not the model's calls).
PER_SAMPLE = r"""
import sys
import torch, torch.nn as nn
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
class Scale(nn.Module):
    def forward(self, t):
        return t * 0.5
class Samples(Dataset):
    def __init__(self):
        self.x, self.y, self.tf = torch.randn(16 * 12, 1, 32), torch.randint(0, 4, (16 * 12,)), Scale()
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return self.tf(self.x[i]), self.y[i]
model = nn.Sequential(nn.Flatten(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt, crit = torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss()
for x, y in DataLoader(Samples(), batch_size=16):
    opt.zero_grad()
    if "--batched" in sys.argv:
        loss = crit(model(x), y)
    else:
        loss = sum(crit(model(x[i:i + 1]), y[i:i + 1]) for i in range(len(x))) / len(x)
    loss.backward()
    opt.step()
print("per-sample: done")
"""


def test_a_per_sample_loop_is_named_with_its_calls(tmp_path):
    r, out = prun_script(tmp_path, "per_sample.py", PER_SAMPLE)
    assert r.stdout == "per-sample: done\n"
    assert child(out)["mode"] == "optimizer"                  # the 16 forward passes before a backward: no module source
    assert child(out)["root_calls"] == {"module": "Sequential", "calls": 16, "grad_calls": 16,
                                        "batch": 1, "batch_share": 1.0, "modules": 2,
                                         "passes": 1, "fresh_passes": 1, "cpu_autocast": None, "conv_layout": None,
                                         "padding": None, "dense_embeddings": None, "chained": 0, "sliced": 15,
                                         "rnn_module": None,
                                         "rnn": None, "rnn_calls": 0,
                               "rnn_chained": 0, "rnn_fed_sliced": 0, "rnn_fed_back": 0, "rnn_layers": [],
                               "compiled_in_place": False, "dynamo_graphs": 0}
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.model_calls_per_step"] == 16 and m["loop.model_call_batch"] == 1 and m["loop.batches_per_step"] == 1
    assert m["loop.backward_passes_per_step"] == 1
    fix = next(f for f in doc["findings"] if f["id"] == "PD353")
    wait = m["run.data_wait_share"]                  # the wait for batches stays: the ceiling is outside it
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (wait + (1 - wait) / 16), rel=1e-3)
    assert fix["gain"]["expected"] is None
    out = tmp_path / "batched"
    r = prun("--no-trace", tmp_path / "per_sample.py", "--batched", out=out)
    assert r.returncode == 0, r.stderr
    # the transform's 16 calls a step with a batch of one are the DataLoader's, not the model's
    assert child(out)["root_calls"]["calls"] == 1 and child(out)["root_calls"]["batch"] == 16
    assert not any(f["id"] == "PD353" for f in report(out)["findings"])


ROLLOUT = r"""
import sys, torch
torch.manual_seed(0)
policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
graph = "--graph" in sys.argv
for update in range(40):
    states, actions, logps = [], [], []
    s = torch.zeros(4)
    with torch.set_grad_enabled(graph):           # acting: one state at a time, the next made from it
        for t in range(24):
            dist = torch.distributions.Categorical(logits=policy(s))
            a = dist.sample()
            states.append(s); actions.append(a); logps.append(dist.log_prob(a))
            s = torch.tanh(s + 0.1 * float(a.item()) + 0.05 * torch.randn(4))
    if graph:
        logp = torch.stack(logps)
    else:                                         # one batched pass over the episode for the loss
        logp = torch.log_softmax(policy(torch.stack(states)), -1).gather(1, torch.stack(actions)[:, None])[:, 0]
    loss = -(logp * torch.linspace(1, 0, 24)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
print("rollout: done")
"""


def test_a_rollout_under_no_grad_then_one_batched_pass_is_not_told_to_batch_its_samples(tmp_path):
    """PD353's own advice for a policy-gradient loop: act under torch.no_grad(), then recompute the
    log-probabilities in one batched pass. A user who did so was still told to batch 108 calls: the
    census counted the rollout's calls too. Only the calls with autograd on are the graphs the
    backward pass walks; the loop that builds its loss call by call is still told."""
    r, out = prun_script(tmp_path, "rollout.py", ROLLOUT)
    assert r.stdout == "rollout: done\n"
    rc = child(out)["root_calls"]
    assert (rc["calls"], rc["grad_calls"], rc["batch"]) == (25, 1, 1)
    doc = report(out)
    assert doc["traces"][0]["metrics"]["loop.model_grad_calls_per_step"] == 1
    assert not any(f["id"] == "PD353" for f in doc["findings"])
    # the first episode's actions came before any optimizer step: a rollout, not an evaluation
    note = next(n for n in doc["run"]["notes"] if "with no optimizer step" in n)
    assert "(a rollout under torch.no_grad() before the first update" in note and "evaluation" not in note, note
    out = tmp_path / "graph"
    r = prun("--no-trace", tmp_path / "rollout.py", "--graph", out=out)
    assert r.returncode == 0, r.stderr
    rc = child(out)["root_calls"]
    assert (rc["calls"], rc["grad_calls"], rc["batch"]) == (24, 24, 1)
    assert any(f["id"] == "PD353" for f in report(out)["findings"])


def test_a_policy_called_on_one_state_at_a_time_is_a_batch_of_one():
    """A 1-D input is one unbatched sample to torch's layers: an RL rollout calling its policy on
    one state of 4 numbers 20 times a step read as 20 calls with a batch of 4, and PD353 (batch
    the samples) gave way to PD365 with "~16x" for a loop that is a recurrence."""
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.modules import Census
    policy, loss = torch.nn.Linear(4, 2), torch.nn.MSELoss()
    census = Census(torch.Tensor)
    census.boundary("optimizer")                       # the counted step starts
    for _ in range(20):
        census.count(policy, (torch.zeros(4),), {})    # one state: 1-D
    census.count(loss, (torch.zeros(3, 2), torch.zeros(3, 2)), {})
    census.boundary("optimizer")
    assert census.result == {"module": "Linear", "calls": 20, "grad_calls": 20,
                             "batch": 1, "batch_share": 1.0, "modules": 2, "passes": 0,
                             "fresh_passes": 0, "cpu_autocast": None, "dense_embeddings": None, "conv_layout": None,
                             "padding": None, "chained": 0, "sliced": 0, "rnn_module": None, "rnn": None,
                             "rnn_calls": 0,
                               "rnn_chained": 0, "rnn_fed_sliced": 0, "rnn_fed_back": 0, "rnn_layers": [],
                               "compiled_in_place": False}
    census.reset()
    census.boundary("optimizer")
    census.count(policy, (torch.zeros(32, 4),), {})    # a batch of states; a scalar has no batch
    census.count(loss, (torch.tensor(1.0),), {})
    census.boundary("optimizer")
    assert census.result["batch"] == 32
    assert census.counts == {} and census.state == "done"


def test_a_decoder_unrolled_over_time_steps_is_no_per_sample_loop():
    """A seq2seq decoder unrolled in Python (the step calls its submodules itself, 12 time steps):
    its embedding gets one token per sequence (1-D: read as a batch of one) and its attention,
    GRU and output layers the batch of 32, 12 calls each. The embedding came first of the tie,
    and PD353 said "a batch of one" at "max 12x"; the tied modules' calls are judged together."""
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.modules import Census
    emb, att, gru, out = (torch.nn.Embedding(10, 4), torch.nn.Linear(8, 1), torch.nn.GRU(8, 4, batch_first=True),
                          torch.nn.Linear(4, 10))
    census = Census(torch.Tensor)
    census.boundary("optimizer")
    census.count(torch.nn.GRU(4, 4), (torch.zeros(32, 12, 4),), {})          # the encoder, once
    for _ in range(12):
        census.count(emb, (torch.zeros(32, dtype=torch.long),), {})
        census.count(att, (torch.zeros(32, 12, 8),), {})
        census.count(gru, (torch.zeros(32, 1, 8),), {})
        census.count(out, (torch.zeros(32, 4),), {})
    census.boundary("optimizer")
    r = census.result
    assert (r["module"], r["calls"], r["batch"], r["modules"]) == ("Embedding", 12, 32, 5)
    assert r["batch_share"] == pytest.approx(36 / 48)
    # a per-sample loop calling two modules per sample stays one: both at a batch of one
    census.reset()
    census.boundary("optimizer")
    for _ in range(16):
        census.count(att, (torch.zeros(1, 8),), {})
        census.count(out, (torch.zeros(1, 4),), {})
    census.count(gru, (torch.zeros(16, 1, 8),), {})                         # once, batched: not counted with them
    census.boundary("optimizer")
    assert (census.result["batch"], census.result["batch_share"]) == (1, 1.0)


# LBFGS with a closure: 20 forward/backward passes inside each optimizer.step(). Each closure call
# also multiplies matrices for STEP_S / 20 seconds, so that a step lasts STEP_S of CPU work on any
# machine, however fast or busy. The time rules are scaled down (1 s instead of 10 s) as for
# steps of ~20 s.
LBFGS = r"""
import sys, time
import torch, torch.nn as nn
torch.manual_seed(0); torch.set_num_threads(1)
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
x, y = torch.randn(512, 32), torch.randn(512, 1)
a, b = torch.randn(256, 256), torch.randn(256, 256)
model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.05, max_iter=20, tolerance_grad=0, tolerance_change=0)
calls = 0
def closure():
    global calls
    calls += 1
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    while time.perf_counter() - t0 < step_s / 20:
        torch.mm(a, b)
    return loss
for i in range(steps):
    loss = opt.step(closure)
    print(f"step {i} loss {loss.item():.4f}", flush=True)
print(f"lbfgs: done, {calls} closure calls")
"""
SCALED = {"PERFDOCTOR_WARMUP_S": "1", "PERFDOCTOR_TRACE_S": "1"}


def test_closure_optimizer_with_long_steps_gets_a_trace_of_a_whole_step(tmp_path):
    script = tmp_path / "lbfgs.py"
    script.write_text(LBFGS)
    out = tmp_path / "run"
    r = prun(script, 4, 2.5, out=out, env=SCALED)        # default --skip-steps 5: more than the run has
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("lbfgs: done, 80 closure calls\n")
    recs = steps(out)
    assert len(recs) == 4 and {s["mode"] for s in recs} == {"optimizer"}   # optimizer steps, not 80 passes
    assert all(s["dur"] > 2.4 for s in recs)                  # whole steps of ~2.5 s, the first one too
    c = child(out)
    assert c["step_source"] == "optimizer steps"
    # every step timed, the first from its own start: 4 steps, not "5 steps, 4 timed" (pytorch/examples'
    # time_sequence_prediction, --steps 4, read that)
    assert c["first_step_timed"] is True and "4 steps (20 backward passes a step), all timed, in a " in r.stderr
    assert c["window"]["start_after_steps"] == 1 and c["window"]["recorded_steps"] == 1
    assert [s["step"] for s in recs if s["profiled"]] == [2]  # step 1 warm-up, step 2 traced
    doc = report(out)
    notes = " ".join(doc["run"]["notes"])
    assert "LBFGS.step(closure) runs forward and backward inside the optimizer step" in notes and "steps are long" in notes
    m = doc["traces"][0]["metrics"]
    assert m["steps.source"] == "ProfilerStep" and m["steps.count"] == 1
    assert m["steps.time_median_ms"] > 2400                   # the traced step is a whole one
    assert doc["verdict"]["bound"] == "device", doc["verdict"]["summary"]   # CPU ops fill the step
    # the script's torch.set_num_threads(1) is recorded; with a second physical core idle, PD346
    # offers it to torch (its evidence: the thread count, the cores, the idle share, the op share)
    assert c["torch_threads"] == 1 and m["machine.torch_threads"] == 1
    # the closure's forward and backward are not the optimizer's own time (PD338 is no fix here)
    assert m["optimizer.closure"] is True and m["optimizer.step_share"] < 0.2
    # nor is it timed as the optimizer's (collect/optclock.py): no `opt`, no calls.optimizer_share
    assert c["optimizer"]["class"] == "LBFGS" and c["optimizer"]["closure_calls"] == 4
    assert not any("opt" in s for s in recs) and m["calls.optimizer_share"] is None
    assert list(c["param_dtypes"]) == ["torch.float32"] and m["params.fp64_share"] == 0.0
    ids = {f["id"] for f in doc["findings"]}
    idle = (m["machine.physical_cores"] or 0) >= 2 and (m["machine.free_cores"] or 0) >= 0.5
    crowded = "cpu-oversubscription" in {f["slug"] for f in doc["flags"]}
    assert m["threads.splittable_share"] > 0.5        # 256x256 matrix products of ~0.3 ms each
    assert ("PD346" in ids) == (idle and not crowded), (m["machine.physical_cores"], m["machine.free_cores"])


FEW_LONG = r"""
import sys, time
import torch, torch.nn as nn
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
a = torch.randn(256, 256)
for i in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < float(sys.argv[2]):
        torch.mm(a, a)
    opt.zero_grad(); model(a).sum().backward(); opt.step()
print("few long: done", flush=True)
"""


def test_few_long_cpu_steps_need_no_profiler_warm_up_step(tmp_path):
    """A user's 6 steps of 3 s on a CPU got no trace: the window waited 10 s (warmup_s), then kept
    torch.profiler's own warm-up step, and no step was left to record. Without CUDA the profiler
    starts in milliseconds, so a step of 0.1 s or more needs no warm-up step (window.CPU_STEP_S).
    Scaled: 5 steps of 1.2 s, warmup_s 3 s: the trace starts after 3 steps and records the 4th."""
    script = tmp_path / "few_long.py"
    script.write_text(FEW_LONG)
    out = tmp_path / "run"
    r = prun(script, 5, 1.2, out=out, env={"PERFDOCTOR_WARMUP_S": "3"})
    assert r.returncode == 0 and r.stdout == "few long: done\n", r.stderr
    c = child(out)
    # the first step's end starts the clock: 5 steps, 4 timed
    assert c["first_step_timed"] is False and "5 steps, 4 timed, in a " in r.stderr
    assert c["window"]["start_after_steps"] == 3 and c["window"]["profiler_warmup_steps"] == 0, c["window"]
    assert c["window"]["recorded_steps"] == 1 and c["profiler"] == "done"
    assert [s["step"] for s in steps(out) if s["profiled"]] == [4]
    m = report(out)["traces"][0]["metrics"]
    assert m["steps.count"] == 1 and m["steps.time_median_ms"] > 1100      # a whole step of ~1.2 s


def test_cpu_steps_of_a_tenth_of_a_second_need_no_profiler_warm_up_step_either(tmp_path):
    """The profiler's first step on a CPU cost 0-3 ms more than the next ones: a step of 0.1 s
    or more absorbs that, so it gets no warm-up step either, and a short run of such steps keeps
    one more step to record (a hand-written update's 10 steps of 0.45 s had no trace: its step
    source is known after 8 of them, and the warm-up step took the 9th). 7 iterations of 0.25 s,
    6 timed steps: the trace starts after 5 and records the 6th, the last (a warm-up step there
    left no trace)."""
    script = tmp_path / "few_long.py"
    script.write_text(FEW_LONG)
    out = tmp_path / "run"
    r = prun(script, 7, 0.25, out=out)
    assert r.returncode == 0 and r.stdout == "few long: done\n", r.stderr
    c = child(out)
    assert c["window"]["start_after_steps"] == 5 and c["window"]["profiler_warmup_steps"] == 0, c["window"]
    assert c["window"]["recorded_steps"] == 1 and c["profiler"] == "done"
    assert [s["step"] for s in steps(out) if s["profiled"]] == [6]


# A closure of thousands of tiny ops, 20 calls a step (pytorch/examples' time_sequence_prediction
# is this with an LSTM cell over 999 time steps: ~8M profiler events a step, and the job was
# killed for memory while perfdoctor recorded it).
TINY_OPS = r"""
import resource, sys
import torch, torch.nn as nn
torch.manual_seed(0); torch.set_num_threads(1)
w = nn.Parameter(torch.ones(4))
opt = torch.optim.LBFGS([w], lr=1e-4, max_iter=20, tolerance_grad=0, tolerance_change=0)
def closure():
    opt.zero_grad()
    h = w
    for _ in range(1500):
        h = h * 0.999 + 0.001
    loss = h.sum()
    loss.backward()
    return loss
for i in range(int(sys.argv[1])):
    opt.step(closure)
print("peak_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_the_window_hides_torchs_cycle_warning_and_nothing_else():
    """torch 2.10-2.11 warn at any scheduled profiler's start that a cycle clears events (the
    message as they print it); the window hides that one around its own calls instead of asking
    for acc_events, which parses every event in Python at stop(). Other warnings pass."""
    import warnings

    from perfdoctor.collect.profquiet import cycle_warning_hidden as _cycle_warning_hidden
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _cycle_warning_hidden():
            warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from the "
                          "current cycle will be reported.To keep events across cycles, set acc_events=True.")
            warnings.warn("the script's own warning")
        warnings.warn("Warning: Profiler clears events at the end of each cycle. (the script's profiler)")
    assert [str(w.message) for w in seen] == ["the script's own warning",
                                              "Warning: Profiler clears events at the end of each cycle. (the script's profiler)"]


def test_hiding_the_cycle_warning_leaves_the_scripts_once_per_line_warnings_shown_once():
    """The window's start and steps hide torch's warning without touching the warnings filters:
    a filter change clears every module's record of the warnings it showed, so a script's
    once-per-line warning printed again after each of the window's calls."""
    import warnings

    from perfdoctor.collect.profquiet import cycle_warning_hidden
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")

        def script_warns():
            warnings.warn("the script's own warning")
        script_warns()
        for _ in range(3):
            with cycle_warning_hidden():
                warnings.warn("Warning: Profiler clears events at the end of each cycle. Only events ...")
            script_warns()
    assert [str(w.message) for w in seen] == ["the script's own warning"]


def test_the_cycle_warning_is_filtered_out_where_warnings_are_errors():
    """Under -W error the warning would raise inside the profiler's start: there it is filtered out."""
    import warnings

    from perfdoctor.collect.profquiet import cycle_warning_hidden
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cycle_warning_hidden():
            warnings.warn("Warning: Profiler clears events at the end of each cycle. Only events ...")
        with pytest.raises(UserWarning):
            warnings.warn("the script's own warning")


WARNS_EACH_STEP = """
import warnings
import torch, torch.nn as nn
m = nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(20):
    warnings.warn("the script's own warning, once per line by default")
    opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
"""


def test_a_scripts_warning_prints_as_often_as_under_python(tmp_path):
    """pytorch/examples' mnist_rnn warns on each forward (dropout2d on a 2-D input): python shows it
    once; under `run` the trace window's start and steps showed it 6 more times."""
    script = tmp_path / "warns.py"
    script.write_text(WARNS_EACH_STEP)
    r = prun(script, out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "trace").is_dir() and any((tmp_path / "run" / "trace").iterdir())
    assert bare(script).stderr.count("own warning") == 2           # the message and its source line
    assert r.stderr.count("own warning") == 2, r.stderr


def test_the_memory_budget_is_the_least_of_the_setting_and_a_part_of_the_free_memory(monkeypatch):
    """Above the larger of the resident size now and the process's peak so far: the script's own
    peaks are not the profiler's."""
    from perfdoctor.collect import tracebudget as tb
    mb = 2 ** 20
    monkeypatch.setattr(tb, "resident_bytes", lambda: 300 * mb)
    monkeypatch.setattr(tb, "peak_resident_bytes", lambda: 700 * mb)
    monkeypatch.setattr(tb, "available_bytes", lambda: 20000 * mb)
    assert tb.memory_limit(512) == (1212 * mb, 512 * mb)            # 20 GB free: the setting
    monkeypatch.setattr(tb, "available_bytes", lambda: 2000 * mb)
    assert tb.memory_limit(512) == (800 * mb, 100 * mb)             # 2 GB free: a twentieth of it
    monkeypatch.setattr(tb, "available_bytes", lambda: 100 * mb)
    assert tb.memory_limit(512) == (732 * mb, 32 * mb)              # never below the floor
    monkeypatch.setattr(tb, "resident_bytes", lambda: None)
    assert tb.memory_limit(512) is None                             # no /proc: no budget
    # this machine's own readings are real numbers
    monkeypatch.undo()
    now, peak = tb.resident_bytes(), tb.peak_resident_bytes()
    assert now and peak and now <= peak * 1.01 and tb.available_bytes() > 0


@pytest.mark.quiet          # the cut step's length against the steady steps': a neighbour's load flipped it in CI
def test_a_step_of_millions_of_events_is_traced_within_the_memory_budget(tmp_path):
    """The window stops recording inside a step once the profiler's events pass its budget (here
    32 MB, PERFDOCTOR_TRACE_MB): the script finishes, its peak memory stays well below a run that
    records one whole step, the trace holds the part of the step recorded, and the report says
    the traced step is cut short, first among its notes."""
    script = tmp_path / "tiny_ops.py"
    script.write_text(TINY_OPS)
    runs = {}
    for name, mb, extra in (("budget", "32", ()), ("whole", "100000", ("--trace-steps", "1"))):
        out = tmp_path / name
        r = prun("--no-stacks", *extra, script, 5, out=out, env=dict(SCALED, PERFDOCTOR_TRACE_MB=mb))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("peak_mb ") and r.stdout.count("\n") == 1
        runs[name] = (int(r.stdout.split()[1]), child(out)["window"], out)
    (cut_peak, win, out), (whole_peak, whole_win, _) = runs["budget"], runs["whole"]
    assert whole_win["cut"] is None and whole_win["recorded_steps"] == 1
    assert win["budget_mb"] == 32 and win["cut"]["budget_mb"] == 32 and win["recorded_steps"] == 0
    # one whole step's events (~200k) cost the other run hundreds of MB more
    assert whole_peak - cut_peak > 200, (cut_peak, whole_peak)
    doc = report(out)
    notes = doc["run"]["notes"]
    assert notes[0].startswith("the trace stopped inside a step") and "32 MB" in notes[0], notes
    tr = doc["traces"][0]
    m = tr["metrics"]
    assert m["steps.count"] == 1 and m["steps.time_median_ms"] < 0.8 * m["run.step_time_ms"]
    assert 0 < win["cut"]["after_s"] < m["run.step_time_ms"] / 1e3
    # the trace's header says where it was cut, so the trace alone tells the reader too; the run's
    # report says it once, in the run's own note; and the
    # closure call cut short is no optimizer update: its forward is not counted as the optimizer's
    from perfdoctor.analyze.pipeline import CUT_NOTE
    from perfdoctor.diagnose.offline import diagnose_path
    assert sum("cut short" in n for n in tr["notes"]) == 1, tr["notes"]
    alone = diagnose_path(str(next((out / "trace").iterdir())))["traces"][0]["notes"]
    assert any(n.startswith(CUT_NOTE) for n in alone), alone
    assert m["optimizer.closure"] is True and m["optimizer.ops_per_step"] == 0
    assert "PD338" not in {f["id"] for f in doc["findings"]} and "PD211" not in {f["id"] for f in doc["flags"]}


def test_too_few_steps_for_a_trace_still_get_a_verdict(tmp_path):
    script = tmp_path / "lbfgs.py"
    script.write_text(LBFGS)
    out = tmp_path / "run"
    r = prun(script, 1, 2.5, out=out, env=SCALED)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("lbfgs: done, 20 closure calls\n")
    assert len(steps(out)) == 1
    assert child(out)["profiler"] == "empty"                  # the window opened, no whole step followed
    assert not (out / "trace").exists() or not list((out / "trace").iterdir())
    doc = report(out)
    v = doc["verdict"]
    assert v["bound"] == "device" and v["rule"] == "PD114", v["summary"]
    assert v["confidence"] <= 0.4 and v["confidence_label"] == "low"
    assert any("no trace" in n and "confidence is capped" in n for n in v["notes"])
    assert "COMPUTE-BOUND (CPU)" in r.stderr and "Step breakdown" not in r.stderr


EARLY_CRASH = r"""
import torch
print("loading data", flush=True)
model = torch.nn.Linear(4, 1)
def load(path):
    raise FileNotFoundError(f"{path} not found")
load("data/train.bin")
"""


FORWARD_CRASH = r"""
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, target):
        return self.fc(x)

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()      # the first forward fails
    opt.step()
    opt.zero_grad()
"""


def test_a_crash_inside_a_forward_has_pythons_traceback(tmp_path):
    """The exception passes through perfdoctor's Module.__call__ wrapper (it finds the steps):
    the traceback is still the one `python script.py` prints, byte for byte, without its frame."""
    script = tmp_path / "fwd.py"
    script.write_text(FORWARD_CRASH)
    r, b = prun(script, out=tmp_path / "run"), bare(script)
    assert r.returncode == 1 == b.returncode
    assert "missing 1 required positional argument: 'target'" in b.stderr
    assert r.stderr.startswith(b.stderr) and "perfdoctor" not in b.stderr, r.stderr


def test_failure_before_the_first_step_is_the_verdict(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(EARLY_CRASH)
    out = tmp_path / "run"
    r = prun(script, out=out)
    b = bare(script)
    assert r.returncode == 1 == b.returncode
    assert r.stdout == b.stdout == "loading data\n"
    assert r.stderr.startswith(b.stderr)                      # Python's own traceback, byte for byte
    doc = report(out)
    assert doc["run"]["outcome"] == "crashed" and doc["run"]["exit_code"] == 1 and doc["run"]["steps"] == 0
    assert doc["run"]["error"] == "FileNotFoundError: data/train.bin not found"
    assert doc["verdict"]["bound"] == "inconclusive"
    assert doc["verdict"]["summary"].startswith("The script failed before its first step (FileNotFoundError")
    tail = r.stderr[len(b.stderr):]
    assert "failed before its first step" in tail and "exit code 1" in tail
    assert "Step breakdown" not in tail
    # nothing was measured: no fix section for it, no tensorboard to open, no "0 step(s) from no trace"
    assert "No fix" not in tail and "tensorboard" not in tail and "step(s)" not in tail, tail
    assert "CPU only · no trace" in tail


DOUBLE = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).double()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(128, 512, dtype=torch.float64)
for _ in range(40):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""


def test_a_model_in_float64_is_told_to_train_in_float32(tmp_path):
    script = tmp_path / "double.py"
    script.write_text(DOUBLE)
    out = tmp_path / "run"
    r = prun("--skip-steps", "3", "--trace-steps", "3", script, out=out)
    assert r.returncode == 0, r.stderr
    assert child(out)["param_dtypes"] == {"torch.float64": 2 * (512 * 512 + 512)}
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["params.fp64_share"] == 1.0 and m["params.count"] == 2 * (512 * 512 + 512)
    fix = next(f for f in doc["findings"] if f["id"] == "PD357")
    assert 1.3 < fix["gain"]["expected"] <= 2.5       # 512-wide products: large ops, about 2x


def test_param_dtypes_read_as_untrusted():
    from perfdoctor.analyze.params import param_metrics
    assert param_metrics({"torch.float64": 30, "torch.float32": 10}) == {
        "params.count": 40, "params.fp64_share": 0.75, "params.half_dtype": None,
        "params.dense_embedding_share": None, "params.embedding_touched_share": None}
    assert param_metrics({"torch.float64": -5, 7: 3, "torch.complex128": True}) == dict.fromkeys(
        ("params.count", "params.fp64_share", "params.half_dtype", "params.dense_embedding_share",
         "params.embedding_touched_share"))
    # the census's dense tables: shares of the optimizer's elements; damaged counts are unknown
    tables = {"torch.float32": 1000}
    m = param_metrics(tables, {"elements": 800, "touched": 40, "tables": 1})
    assert (m["params.dense_embedding_share"], m["params.embedding_touched_share"]) == (0.8, 0.05)
    assert param_metrics(tables, {"elements": 4000, "touched": 40})["params.dense_embedding_share"] == 1.0
    for bad in ({"elements": 10, "touched": 20}, {"elements": "x", "touched": 1}, {"elements": 0}, [3]):
        assert param_metrics(tables, bad)["params.dense_embedding_share"] is None
    # a model kept in a 16-bit float: the dtype that holds half the elements or more
    assert param_metrics({"torch.bfloat16": 20, "torch.float32": 20})["params.half_dtype"] == "bfloat16"
    assert param_metrics({"torch.float16": 19, "torch.float32": 21})["params.half_dtype"] is None
    assert param_metrics({"torch.float16": 30, "torch.float32": 1})["params.half_dtype"] == "float16"
    assert param_metrics(None)["params.fp64_share"] is None


def test_a_long_error_is_named_by_its_first_line():
    """torch.load's weights_only error: a dozen lines with bold codes; the verdict takes the first
    line (report.json's run.error keeps all of it)."""
    from perfdoctor.diagnose.ending import ERROR_CHARS, _headline
    err = ("UnpicklingError: Weights only load failed. This file can still be loaded, \x1b[1mdo those steps only "
           "if you trust the source\x1b[0m.\n\t(1) In PyTorch 2.6, we changed the default ...\n")
    assert _headline(err) == ("UnpicklingError: Weights only load failed. This file can still be loaded, do those "
                              "steps only if you trust the source. ...")
    assert _headline("FileNotFoundError: data/train.bin not found") == "FileNotFoundError: data/train.bin not found"
    long = "ValueError: " + "x" * 500
    assert _headline(long) == long[:ERROR_CHARS] + " ..."
    assert _headline("  ") == ""


def test_grad_resets_tell_accumulation_from_updates():
    """The reset detector on its own: set to None, zeroed in place, clipped = a new step;
    accumulation = the same step; a reset through .grad.data is invisible."""
    from perfdoctor.collect.passes import GradResets

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    g = GradResets()

    def passes(*resets):
        out = []
        for _ in resets:
            loss = model(torch.randn(2, 4)).sum()
            out.append(g.before_pass(loss))
            loss.backward()
            g.after_pass()
        return out
    assert passes(1, 2) == [True, False]                      # first pass; accumulation
    assert len(g.leaves) >= 2
    model.zero_grad()                                          # set to None
    assert passes(1) == [True]
    model.zero_grad(set_to_none=False)                         # zeroed in place
    assert passes(1) == [True]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)   # modified in place
    assert passes(1) == [True]
    for p in model.parameters():
        p.grad.data.zero_()                                    # .data has its own version counter
    assert passes(1) == [False]


# A WGAN's loop: the critic steps 5 times per generator step. Steps follow the first optimizer to
# step (the critic's), and the run says that an iteration of the loop spans 5 of them.
WGAN = r"""
import torch, torch.nn as nn
torch.manual_seed(0)
D, G = nn.Linear(8, 1), nn.Linear(4, 8)
oD, oG = torch.optim.RMSprop(D.parameters(), lr=1e-4), torch.optim.Adam(G.parameters(), lr=1e-4)
for it in range(12):
    for _ in range(5):
        oD.zero_grad(); (D(G(torch.randn(16, 4)).detach()).mean() - D(torch.randn(16, 8)).mean()).backward(); oD.step()
    oG.zero_grad(); (-D(G(torch.randn(16, 4))).mean()).backward(); oG.step()
"""


def test_optimizers_stepping_at_different_rates_are_said(tmp_path):
    _, out = prun_script(tmp_path, "wgan.py", WGAN)
    assert len(steps(out)) == 59                              # 60 critic steps; the first starts the count
    note = next(n for n in child(out)["notes"] if "different rates" in n)
    assert "RMSprop, 60 steps" in note and "Adam stepped 12 times, once per 5.0 steps" in note
    assert "an iteration spans about 5.0 steps" in note and "a step is an iteration" in note


# An actor-critic loop: the critic's Adam every iteration, the actor's Adam every second one. With
# the actor's update first in the loop (it steps first), a step is two iterations: said, and the
# two Adams are told apart by their parameter counts.
ACTOR_FIRST = r"""
import torch, torch.nn as nn
torch.manual_seed(0)
actor, critic = nn.Linear(8, 2), nn.Linear(8, 64)
oa, oc = torch.optim.Adam(actor.parameters()), torch.optim.Adam(critic.parameters())
for it in range(40):
    x = torch.randn(16, 8)
    if it % 2 == 0:
        oa.zero_grad(); actor(x).pow(2).mean().backward(); oa.step()
    oc.zero_grad(); critic(x).pow(2).mean().backward(); oc.step()
"""


def test_a_rarer_optimizer_stepping_first_makes_a_step_span_iterations(tmp_path):
    _, out = prun_script(tmp_path, "ac.py", ACTOR_FIRST)
    assert len(steps(out)) == 19                              # 20 actor steps; the first starts the count
    note = next(n for n in child(out)["notes"] if "different rates" in n)
    assert "(Adam of 18 parameters, 20 steps), and Adam of 576 parameters stepped 40 times, 2.0 per step" in note
    assert "a step spans about 2.0 iterations" in note


# An evaluation pass before training: 30 DataLoader batches with no backward pass make the
# DataLoader the step source; when the optimizer steps, steps follow it, and --max-steps, the
# warm-up and the trace count from there (the trace of evaluation batches is dropped).
EVAL_FIRST = r"""
import sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
loader = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,))), batch_size=32)
with torch.no_grad():
    for i, (x, y) in enumerate(loader):
        if i == 30:
            break
        with torch.profiler.record_function("eval_batch"):
            model(x)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(10):
    for x, y in loader:
        with torch.profiler.record_function("train_batch"):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize("skip,active", [(3, 2), (25, 10)])     # the eval's trace written / still recording
def test_an_evaluation_before_training_does_not_take_the_steps(tmp_path, skip, active):
    script = tmp_path / "eval_first.py"
    script.write_text(EVAL_FIRST)
    out = tmp_path / "run"
    r = prun("--max-steps", 35, "--skip-steps", skip, "--trace-steps", active, script, out=out)
    assert r.returncode == 0, r.stderr
    recs = steps(out)
    assert len([s for s in recs if s["mode"] == "optimizer"]) == 35          # 35 training steps, then stopped
    assert 29 <= len([s for s in recs if s["mode"] == "dataloader"]) <= 31   # the evaluation's batches
    notes = child(out)["notes"]
    assert any("an optimizer stepped then" in n for n in notes)
    assert not any("a step is one DataLoader iteration" in n for n in notes)
    files = list((out / "trace").iterdir())
    assert len(files) == 1 and files[0].name.endswith(".pt.trace.json.gz"), files     # the eval's trace is gone
    traced = json.loads(__import__("gzip").decompress(files[0].read_bytes()))
    names = {e.get("name") for e in traced["traceEvents"]}
    assert "train_batch" in names and "eval_batch" not in names
    assert report(out)["verdict"]["bound"] != "inconclusive"


SHORT_EPOCHS = r"""
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,))), batch_size=8)
for epoch in range(6):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def test_the_end_of_an_epoch_is_no_extra_batch(tmp_path):
    """The __next__ call that ends an epoch (StopIteration) brings no batch: a step across an
    epoch boundary holds one batch, and no 'another loop' note appears."""
    _, out = prun_script(tmp_path, "epochs.py", SHORT_EPOCHS)
    recs = steps(out)
    assert len(recs) == 47 and {s["batches"] for s in recs} == {1}
    assert not any("another loop" in n for n in report(out)["run"]["notes"])


def test_loop_metrics_from_the_census():
    from perfdoctor.analyze.loopcalls import loop_metrics
    steady = [{"batches": 1}, {"batches": 1}, {"batches": 2}]
    m = loop_metrics({"module": "Net", "calls": 32, "grad_calls": 32, "batch": 1, "batch_share": 0.97, "modules": 1},
                     steady)
    assert m == {"loop.model_name": "Net", "loop.model_calls_per_step": 32, "loop.model_grad_calls_per_step": 32,
                 "loop.model_call_batch": 1,
                 "loop.model_call_batch_share": 0.97, "loop.batches_per_step": pytest.approx(4 / 3),
                 "loop.backward_passes_per_step": None, "loop.fresh_passes_per_step": None,
                 "loop.extra_batches_excess_share": None, "loop.model_cpu_autocast": None,
                 "loop.conv_channels_last_share": None,
                 "loop.model_call_chained_share": None, "loop.model_call_sliced_share": None,
                 "loop.model_rnn_module": None, "loop.padding_share": None, "loop.padding_source": None,
                 "loop.model_compiled_in_place": None, "loop.dynamo_graphs": None}
    # the calls that took the last call's state, of those after the first; a count past them is capped
    shares = loop_metrics({"module": "CharRNN", "calls": 13, "chained": 12, "sliced": 6, "rnn_module": "LSTM"}, steady)
    assert (shares["loop.model_call_chained_share"], shares["loop.model_call_sliced_share"]) == (1.0, 0.5)
    assert shares["loop.model_rnn_module"] == "LSTM"
    assert loop_metrics({"module": "Net", "calls": 4, "chained": 9}, steady)["loop.model_call_chained_share"] == 1.0
    assert loop_metrics({"module": "Net", "calls": 1, "chained": 0}, steady)["loop.model_call_chained_share"] is None
    # the CPU autocast dtype the census saw; anything but a name is unknown
    assert loop_metrics({"module": "Net", "calls": 1, "cpu_autocast": "bfloat16"}, steady)["loop.model_cpu_autocast"] \
        == "bfloat16"
    assert loop_metrics({"module": "Net", "calls": 1, "cpu_autocast": 16}, steady)["loop.model_cpu_autocast"] is None
    # no census (a trace alone, a run of one step) or a damaged one: unknown, never made up
    assert loop_metrics(None, [])["loop.model_calls_per_step"] is None
    bad = loop_metrics({"module": 3, "calls": 0, "batch": -2, "batch_share": 7}, steady)
    assert bad["loop.model_calls_per_step"] is None and bad["loop.batches_per_step"] == pytest.approx(4 / 3)
    odd = loop_metrics({"module": 3, "calls": 5, "batch": -2, "batch_share": 7}, [])
    assert odd["loop.model_name"] is None and odd["loop.model_call_batch"] is None
    assert odd["loop.model_call_batch_share"] is None and odd["loop.model_calls_per_step"] == 5
    # fresh passes are some of the passes: more than there were, or without a count of passes, unknown
    fresh = [loop_metrics({"module": "Net", "calls": 16, "passes": p, "fresh_passes": f}, steady)["loop.fresh_passes_per_step"]
             for p, f in ((16, 16), (16, 1), (4, 16), (None, 3), (16, -1), (16, 2.5))]
    assert fresh == [16, 1, None, None, None, None]
    # calls with autograd on are some of the calls: more than there were, or not a count, unknown
    grad = [loop_metrics({"module": "Net", "calls": 16, "grad_calls": g}, steady)["loop.model_grad_calls_per_step"]
            for g in (0, 1, 16, 17, -1, 2.5, None)]
    assert grad == [0, 1, 16, None, None, None, None]
    # compiled in place, and Dynamo's graphs at the exit (PD226); anything else unknown
    both = loop_metrics({"module": "Net", "calls": 1, "compiled_in_place": True, "dynamo_graphs": 0}, steady)
    assert (both["loop.model_compiled_in_place"], both["loop.dynamo_graphs"]) == (True, 0)
    odd = loop_metrics({"module": "Net", "calls": 1, "compiled_in_place": 1, "dynamo_graphs": True}, steady)
    assert (odd["loop.model_compiled_in_place"], odd["loop.dynamo_graphs"]) == (None, None)


def test_autograd_grad_steps_only_on_weights():
    """A functional step takes the gradients of weights: parameters, or the same tensors updated
    in place since the last call. Not an attack's new input each call, nor a Jacobian's rows."""
    from perfdoctor.collect.passes import weights_updated
    w = torch.randn(3, requires_grad=True)
    assert weights_updated(torch, torch.nn.Parameter(torch.randn(2))) is True
    assert weights_updated(torch, [w]) is False                   # the first call: nothing to compare
    assert weights_updated(torch, [w]) is False                   # the same tensor, untouched (Jacobian rows)
    with torch.no_grad():
        w -= 0.1
    assert weights_updated(torch, {"w": w}) is True                # updated in place since: a step
    for _ in range(3):                                             # PGD: a new input tensor each call
        assert weights_updated(torch, torch.randn(3, requires_grad=True)) is False


# An IterableDataset read by 2 forked workers; with "shard" each worker keeps every 2nd sample by
# get_worker_info() (the usual sharding), without it each replays the whole stream.
STREAM = r"""
import sys, torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
shard = sys.argv[1] == "shard"
class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info() if shard else None
        k, n = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, 640, n):
            yield torch.full((8,), float(i))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Stream(), batch_size=32, num_workers=2, multiprocessing_context="fork")
seen = 0
for x in loader:
    opt.zero_grad(); model(x).mean().backward(); opt.step()
    seen += len(x)
print(seen)
"""


@pytest.mark.parametrize("mode", ["shard", "replay"])
def test_workers_reading_get_worker_info_are_seen(tmp_path, mode):
    r, out = prun_script(tmp_path, "stream.py", STREAM, mode)
    assert r.stdout == ("640\n" if mode == "shard" else "1280\n")       # replayed: every sample twice
    assert child(out)["worker_info_used"] is (mode == "shard")
    assert report(out)["traces"][0]["metrics"]["input.worker_info_used"] is (mode == "shard")
    # the marker is a run file: --force clears it with the rest of an old run
    from perfdoctor.collect.hooks import WORKER_INFO_MARKER
    from perfdoctor.collect.rundir import RUN_FILES
    assert WORKER_INFO_MARKER in RUN_FILES and (out / WORKER_INFO_MARKER).exists() is (mode == "shard")


def test_evaluation_calls_in_the_counted_step_describe_it_only_without_training_calls():
    """A validation loop inside the counted step (the model in eval mode, autograd off) calls the
    model more often than training does: the step's calls and batch are the training calls'; a
    step of evaluation calls alone (an inference loop) is described by them."""
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.modules import Census
    model = torch.nn.Linear(4, 2)
    census = Census(torch.Tensor, grad=torch.is_grad_enabled)
    census.boundary("optimizer")
    census.count(model, (torch.zeros(256, 4),), {})
    model.eval()
    with torch.no_grad():
        for _ in range(32):
            census.count(model, (torch.zeros(64, 4),), {})
    model.train()
    census.boundary("optimizer")
    assert (census.result["calls"], census.result["batch"]) == (1, 256)
    census.reset()
    census.boundary("module")
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            census.count(model, (torch.zeros(64, 4),), {})
        census.boundary("module")
    assert (census.result["calls"], census.result["batch"]) == (3, 64)
    model.train()
    # an RL rollout under no_grad with the policy in train mode is the step's own work
    census.reset()
    census.boundary("optimizer")
    with torch.no_grad():
        for _ in range(20):
            census.count(model, (torch.zeros(4),), {})
    census.count(model, (torch.zeros(20, 4),), {})
    census.boundary("optimizer")
    assert (census.result["calls"], census.result["batch"]) == (21, 1)
    assert census.result["grad_calls"] == 1           # what the step's backward pass walks (PD353)
