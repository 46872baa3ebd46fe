"""A Python loop over the samples of a batch (analyze/sampleloop.py, PD365), recorded by
torch.profiler on the CPU: a contrastive loss written per anchor, and its vectorised twin."""

from __future__ import annotations

import numpy as np
import pytest

from quiet import interleaved_speedup

B, D = 128, 32


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine a second OpenMP thread waiting for a busy
    core made a [128, 64] linear take 12-60 ms instead of 0.1."""
    torch = pytest.importorskip("torch", reason="torch records the trace")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _trainer(looped: bool):
    torch = pytest.importorskip("torch", reason="torch records the trace")
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, D), torch.nn.ReLU(), torch.nn.Linear(D, D))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x1, x2 = torch.randn(B, 64), torch.randn(B, 64)

    def loss_fn(a, b):
        a, b = F.normalize(a, dim=1), F.normalize(b, dim=1)
        if not looped:
            return F.cross_entropy(a @ b.T / 0.1, torch.arange(B))
        total = 0.0
        for i in range(B):                      # one anchor at a time
            sims = b @ a[i] / 0.1
            total = total - sims[i] + torch.logsumexp(sims, 0)
        return total / B

    def step():
        loss = loss_fn(model(x1), model(x2))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def _report(tmp_path, step, name: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from perfdoctor.diagnose.offline import diagnose_path
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(4):
            step()
            p.step()
    p.export_chrome_trace(str(tmp_path / name))
    return diagnose_path(str(tmp_path / name))


def test_the_two_losses_agree():
    assert _trainer(True)() == pytest.approx(_trainer(False)(), rel=1e-4)


@pytest.mark.quiet
def test_a_per_sample_loop_is_found_and_its_ceiling_bounds_vectorising(tmp_path):
    looped, vectorised = _trainer(True), _trainer(False)
    loop_doc, vec_doc = _report(tmp_path, looped, "loop.json"), _report(tmp_path, vectorised, "vec.json")
    m = loop_doc["traces"][0]["metrics"]
    # 7 ops per anchor (select, matmul, div, select, sub, logsumexp, add), 128 anchors; the
    # first anchor starts from a Python 0.0 (rsub, not sub), so the run holds 127 full periods
    assert m["cpu.loop_ops_per_iteration"] == 7 and B - 2 <= m["cpu.loop_iterations"] <= B
    assert m["cpu.loop_share"] > 0.5 and m["cpu.loop_op_median_us"] < 50
    assert 0 < m["cpu.loop_kept_op_share"] < 1 - m["cpu.loop_share"]
    fix = next(f for f in loop_doc["findings"] if f["id"] == "PD365")
    assert fix["gain"]["ceiling"] == pytest.approx(1 / m["cpu.loop_kept_op_share"], rel=1e-3)
    vm = vec_doc["traces"][0]["metrics"]
    assert vm["cpu.loop_share"] == 0.0 and vm["cpu.loop_iterations"] is None
    assert "PD365" not in {f["id"] for f in vec_doc["findings"]}

    # the ceiling bounds the speed-up vectorising gives, timed interleaved outside the profiler
    measured = interleaved_speedup(looped, vectorised, 7)
    assert measured > 2                                          # the loop is the step's cost
    assert measured <= fix["gain"]["ceiling"] * 1.15, (measured, fix["gain"])


def test_a_stack_of_layers_that_slice_is_no_loop_over_samples(tmp_path):
    """24 identical layers, each slicing its output: the same ops repeat 24 times, each period
    taking a slice, but each layer has its own parameters (an AccumulateGrad per period in the
    backward pass)."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(D, 2 * D)

        def forward(self, x):
            return x + torch.relu(self.lin(x)[:, :D])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(24)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(B, D)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    doc = _report(tmp_path, step, "layers.json")
    m = doc["traces"][0]["metrics"]
    assert m["cpu.ops_per_step"] > 24 * 5 and m["cpu.loop_share"] == 0.0
    assert "PD365" not in {f["id"] for f in doc["findings"]}


def test_loops_that_take_no_rows_are_not_per_sample_loops():
    from perfdoctor.analyze.sampleloop import periodic_runs
    # a for-loop optimizer: the same two ops per parameter, 40 parameters, no indexing
    s = np.array([1, 2] * 40 + [3])
    covered, runs = periodic_runs(s, np.zeros(len(s), bool))
    assert not covered.any() and runs == []
    # the same sequence where each period takes a row (op 1 is a select): a loop of 40
    covered, runs = periodic_runs(s, s == 1)
    assert max(runs) == (40, 2) and covered[:80].all() and covered.sum() == 80   # the 3 after is not the loop's
    # a first iteration that differs in one op (an accumulator's rsub: 4) is the loop's; the op
    # before it (7, the model's linear) is not
    s = np.array([7, 1, 4, 3] + [1, 2, 3] * 20 + [8])
    covered, runs = periodic_runs(s, s == 1)
    assert max(runs) == (20, 3) and not covered[0] and covered[1:-1].all() and not covered[-1]
    # each period holds an AccumulateGrad: layers with parameters of their own; the forward
    # pass of as many layers (one period fewer or more) goes with it
    fwd, bwd = [1, 2] * 24, [5, 6, 7] * 24
    s = np.array(fwd + bwd)
    covered, runs = periodic_runs(s, (s == 1) | (s == 5), s == 7)
    assert runs == [] and not covered.any()
    # `for row in x:` unbinds x once before the loop: its periods take no row themselves
    s = np.array([9, 8] + [1, 2] * 20 + [3])
    assert periodic_runs(s, np.zeros(len(s), bool))[1] == []
    assert max(periodic_runs(s, np.zeros(len(s), bool), splits=s == 9)[1]) == (20, 2)
    # 15 periods: under MIN_ITERATIONS
    s = np.array([1, 2] * 15 + [3, 4])
    assert periodic_runs(s, s == 1)[1] == []


def test_on_a_gpu_the_loop_gains_only_down_to_the_device_work_launched_outside_it(tmp_path):
    """A CUDA step: a linear whose 800 us kernel runs while the host loops over 32 samples (select,
    mul, sum per sample, each launching a 2 us kernel), 1500 us per step. The host's ops outside
    the loop are 100 us, but the device work launched outside it (800 us) stays after
    vectorising: that is the share that stays, and PD365's ceiling is 1500 / 800."""
    from kineto import HandTrace

    from perfdoctor.diagnose.offline import diagnose_path
    h = HandTrace()
    steps, step_us, loop_start, per_iter = 6, 1500.0, 200.0, 30.0
    for i in range(steps):
        s = 1000.0 + i * step_us
        h.step(i, s, s + step_us)
        h.op(1, s + 10, "aten::linear", 100)
        h.launch(1, s + 20, "ampere_sgemm_128x64_tn", 800)
        for j in range(32):
            a = s + loop_start + j * per_iter
            h.op(1, a, "aten::select", 5)
            h.op(1, a + 7, "aten::mul", 8)
            h.launch(1, a + 8, "vectorized_elementwise_kernel", 2)
            h.op(1, a + 17, "aten::sum", 8)
            h.launch(1, a + 18, "reduce_kernel", 2)
    h.write(tmp_path / "loop.json")
    doc = diagnose_path(str(tmp_path / "loop.json"))
    m = doc["traces"][0]["metrics"]
    assert m["cpu.loop_iterations"] >= 30 and m["cpu.loop_ops_per_iteration"] == 3
    loop_end = loop_start + 31 * per_iter + 25          # the last iteration's sum ends 25 us in
    assert m["cpu.loop_share"] == pytest.approx((loop_end - loop_start) / step_us, abs=0.05)
    assert m["cpu.loop_kept_op_share"] == pytest.approx(800 / step_us, rel=0.01)
    fix = next(f for f in doc["findings"] if f["id"] == "PD365")
    assert fix["gain"]["ceiling"] == pytest.approx(step_us / 800, rel=0.01)
    share = 1 - 800 / step_us                          # the loop shortens the step only to the device work
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share + share / m["cpu.loop_iterations"]), rel=0.01)


def test_a_loop_with_a_branch_taken_in_some_iterations_is_still_a_loop():
    """A per-sample augmentation that flips half of the images at random (`if torch.rand(1).item()
    < 0.5: img = img.flip(2)`): its iterations are 13 or 14 ops, so no period repeats exactly. A
    SimCLR-like script made two such views of 128 images a step (~40% of it) and was told 0% loop."""
    from perfdoctor.analyze.sampleloop import branching_runs, periodic_runs, sample_loop_metrics  # noqa: F401
    rng = np.random.default_rng(0)
    body, flip = [1, 2, 3, 4], 9                 # 1: select (takes the row), 9: the optional flip
    s = [7]                                      # the model's op before the loop
    for _ in range(40):
        s += body[:2] + ([flip] if rng.random() < 0.5 else []) + body[2:]
    s = np.array(s + [8])
    assert periodic_runs(s, s == 1)[1] == []      # no exact period
    covered, runs = branching_runs(s, s == 1)
    assert max(runs) == (40, 4)
    assert not covered[0] and not covered[-1] and covered[1:-1].all()   # the flips inside included
    # the loop's ops also run outside it, many more times than it iterates (the model's own adds
    # and copies, of eleven different counts): the row-taking op's count (40) is the level tried first
    model = np.concatenate([np.repeat(np.arange(20, 31), np.arange(50, 61) * 3)] + [np.array([2, 3] * 300)])
    rng.shuffle(model)
    s4 = np.concatenate([model, s])
    covered, runs = branching_runs(s4, s4 == 1)
    assert max(runs) == (40, 4) and covered[len(model) + 1:-1].all() and not covered[:len(model)].any()
    # a stack of layers (an AccumulateGrad, 7, each period) with an optional op stays out
    s2 = []
    for _ in range(24):
        s2 += [1, 2] + ([flip] if rng.random() < 0.5 else []) + [7]
    s2 = np.array(s2)
    assert branching_runs(s2, s2 == 1, s2 == 7)[1] == []
    # no loop at all: nothing, whichever name is left out
    s3 = np.array([1, 2, 3, 9, 2, 1, 3, 3, 9] * 3)
    assert branching_runs(s3, s3 == 1)[1] == []
    # a row-taking op (1) once in each of 18 different stretches (a Transformer's layers: the H100
    # corpus `alloc`, told "a loop that runs the same 1 ops 18 times"): with the other names, each
    # counted less often, left out, the slices alone repeat; that is no loop
    s5 = np.concatenate([[100 + 3 * i, 1, 101 + 3 * i, 102 + 3 * i] for i in range(18)])
    assert periodic_runs(s5, s5 == 1)[1] == [] and branching_runs(s5, s5 == 1)[1] == []
    # but a loop whose every iteration takes a row and some flip it (r = x[i]; if ...: r = r.flip(0))
    # is one: the ops left out between the row takes are at most one an iteration
    s6 = [7]
    for _ in range(30):
        s6 += [1, 50] if rng.random() < 0.5 else [1]
    s6 = np.array(s6 + [9])
    assert max(branching_runs(s6, s6 == 1)[1]) == (30, 1)


def test_an_nn_lstms_time_steps_are_no_python_loop(tmp_path):
    """nn.LSTM on the CPU runs one op per gate and time step inside aten::lstm, and its backward
    pass walks those nodes one time step at a time (SliceBackward0 takes each step's row of a
    packed sequence): a recurrence inside torch, with no Python loop to vectorise. A user trial
    (an LSTM over bucketed, packed sequences) had "~2.97x Vectorise the per-sample Python loop"."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    emb, rnn, head = torch.nn.Embedding(100, 16), torch.nn.LSTM(16, 16, batch_first=True), torch.nn.Linear(16, 5)
    params = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    x, lengths, y = torch.randint(0, 100, (B, 40)), torch.randint(20, 41, (B,)), torch.randint(0, 5, (B,))

    def step():
        _, (h, _) = rnn(pack_padded_sequence(emb(x), lengths, batch_first=True, enforce_sorted=False))
        torch.nn.functional.cross_entropy(head(h[-1]), y).backward()
        opt.step()
        opt.zero_grad()
    doc = _report(tmp_path, step, "lstm.json")
    m = doc["traces"][0]["metrics"]
    assert m["cpu.ops_per_step"] > 20 * 10             # the backward pass walks the time steps
    assert m["cpu.loop_share"] == 0.0
    assert "PD365" not in {f["id"] for f in doc["findings"]}


def test_the_loops_own_python_work_is_left_in_the_expected_gain(tmp_path):
    """A loop whose every iteration also runs Python of its own between its ops (an RL rollout's
    pure-Python environment between policy calls, a tokenizer): gaps of 20 us or more in each
    iteration. Batching the ops need not remove that work, so the expected gain leaves it (the
    ceiling does not). A user's REINFORCE rollout read "~4.18x" with the environment counted as
    the loop's; vectorising the environment measured 2.05x. Exact on a hand-built trace: 16
    iterations of select, mul and sum (25 us) 100 us apart, after a 100 us op, in a 2000 us step."""
    from kineto import HandTrace

    from perfdoctor.diagnose.offline import diagnose_path

    def trace(name, iterations, per_iter, stalls=()):
        h = HandTrace()
        step_us = 2000.0
        for i in range(4):
            s = 1000.0 + i * step_us
            h.step(i, s, s + step_us)
            h.op(1, s + 10, "aten::linear", 100)
            a = s + 200
            for j in range(iterations):
                a += stalls[j] if j < len(stalls) else 0.0
                h.op(1, a, "aten::select", 5)
                h.op(1, a + 7, "aten::mul", 8)
                h.op(1, a + 17, "aten::sum", 8)
                a += per_iter
        h.write(tmp_path / name)
        return diagnose_path(str(tmp_path / name))

    doc = trace("own.json", 16, 100.0)
    m = doc["traces"][0]["metrics"]
    assert m["cpu.loop_iterations"] >= 15 and m["cpu.loop_ops_per_iteration"] == 3
    assert m["cpu.loop_share"] == pytest.approx((15 * 100 + 25) / 2000, abs=1e-3)
    assert m["cpu.loop_python_share"] == pytest.approx(15 * 75 / 2000, abs=1e-3)   # 75 us after each sum
    fix = next(f for f in doc["findings"] if f["id"] == "PD365")
    assert fix["gain"]["ceiling"] == pytest.approx(2000 / 100, rel=1e-3)
    share = (15 * 100 + 25 - 15 * 75) / 2000                  # the ops and the few us between them
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share + share / m["cpu.loop_iterations"]), rel=1e-3)

    # 40 iterations 30 us apart, three of them late by 150 us (the thread preempted): no work of its own
    m = trace("stalls.json", 40, 30.0, stalls=[0.0] * 10 + [150.0] + [0.0] * 19 + [150.0, 150.0])["traces"][0]["metrics"]
    assert m["cpu.loop_iterations"] >= 39 and m["cpu.loop_python_share"] == 0.0


@pytest.mark.quiet
def test_a_recorded_loop_with_python_work_in_each_iteration(tmp_path):
    """The same on a loop torch records: each of 32 samples also runs ~100 us of pure Python."""
    torch = pytest.importorskip("torch")
    import math
    x = torch.randn(32, 64, requires_grad=True)

    def step():
        total = 0.0
        for i in range(32):
            w = sum(math.sqrt(k) for k in range(1500))          # Python of the loop's own
            total = total + (x[i] * w).sum()
        total.backward()
    m = _report(tmp_path, step, "py.json")["traces"][0]["metrics"]
    assert m["cpu.loop_iterations"] >= 30
    assert 0.5 * m["cpu.loop_share"] < m["cpu.loop_python_share"] < m["cpu.loop_share"]


ROLLOUT = r"""
import math, torch
torch.manual_seed(0); torch.set_num_threads(1)
policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
state = [[0.01 * i, 0.0, 0.02, 0.0] for i in range(256)]
def env_step(actions):                         # a pure-Python environment, one state at a time
    for i, a in enumerate(actions):
        x, v, th, w = state[i]
        acc = (10.0 if a else -10.0) + 0.05 * w * w * math.sin(th)
        state[i] = [x + 0.02 * v, v + 0.02 * acc, th + 0.02 * w, w + 0.02 * math.cos(th) * acc]
    return torch.tensor(state)
for it in range(150):
    s, logps = torch.tensor(state), []
    for t in range(16):                        # 16 time steps: each needs the one before
        d = torch.distributions.Categorical(logits=policy(s))
        a = d.sample()
        logps.append(d.log_prob(a))
        s = env_step(a.tolist())
    loss = -torch.stack(logps).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("rollout: done")
"""


def test_a_rollouts_time_loop_is_no_per_sample_loop_in_a_live_run(tmp_path):
    """An RL rollout: 16 policy calls a step, each on the 256 environments' states, with a
    pure-Python environment stepped between them. The trace alone reads a loop of 16 iterations
    that takes rows (Categorical.log_prob slices) with the environment as its own Python work; the
    live run counts the policy's calls, once an iteration on 256 rows: a time loop, whose ops
    cannot run once over a batch, so PD365 steps aside there."""
    from runs import prun_script, report

    from perfdoctor.diagnose.offline import diagnose_path
    r, out = prun_script(tmp_path, "rollout.py", ROLLOUT, trace=True)
    assert r.stdout == "rollout: done\n"
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.model_calls_per_step"] == 16 and m["loop.model_call_batch"] == 256
    assert m["cpu.loop_iterations"] in (15, 16, 17) and m["cpu.loop_python_share"] > 0.05
    assert "PD365" not in {f["id"] for f in doc["findings"]}
    # the trace alone cannot tell the loop over time from one over samples: its expected gain leaves
    # the environment's time in place
    trace = next(out.glob("*.pt.trace.json*"))
    fix = next(f for f in diagnose_path(str(trace))["findings"] if f["id"] == "PD365")
    tm = diagnose_path(str(trace))["traces"][0]["metrics"]
    share = min(tm["cpu.loop_share"] - tm["cpu.loop_python_share"], 1 - tm["cpu.loop_kept_op_share"])
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share + share / tm["cpu.loop_iterations"]), rel=1e-3)
