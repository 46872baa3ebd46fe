"""`perfdoctor run` on torch.func training loops: the gradients come from the function
torch.func.grad (or grad_and_value) returns, which calls torch.autograd.grad with create_graph
on tensors functorch wraps anew each call, so nothing autograd sees says "step". The calls made
outside any other torch.func transform are the steps (collect/passes.wrap_func_grad)."""

from __future__ import annotations

import pytest
from runs import child, prun_script, report, steps

pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")

# 20 updates of a functional MLP by grad_and_value; each also takes per-sample gradients with
# vmap(grad(...)) for their norms: the grad inside vmap is that transform's, no step.
FUNC = r"""
import torch
from torch.func import functional_call, grad, grad_and_value, vmap
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
params = {k: v.detach() for k, v in model.named_parameters()}

def loss(p, x, y):
    return (functional_call(model, p, (x,)) - y).pow(2).mean()

per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
step = grad_and_value(loss)
norms = []
for i in range(20):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    g1 = per_sample(params, x.unsqueeze(1), y.unsqueeze(1))
    norms.append(sum(v.flatten(1).norm(dim=1) for v in g1.values()).max().item())
    g, value = step(params, x, y)
    params = {k: v - 0.01 * g[k] for k, v in params.items()}
print("func: done", len(norms))
"""


def test_a_torch_func_loop_counts_its_top_level_grad_calls(tmp_path):
    r, out = prun_script(tmp_path, "func.py", FUNC)
    assert r.stdout == "func: done 20\n"
    recs = steps(out)
    # 20 top-level grad_and_value calls: the first starts the count; the grads inside vmap are none
    assert len(recs) == 19 and {s["mode"] for s in recs} == {"backward"}
    c = child(out)
    assert c["mode"] == "backward" and c["step_source"] == "torch.func.grad calls (one per step)"
    assert any("torch.func.grad calls (a functional loop)" in n for n in report(out)["run"]["notes"])
    # one forward per step at the top level (the vmapped calls are inside the transform's call)
    assert c["root_calls"]["passes"] == 1


# A meta-learning loop: an inner torch.func.grad step on a task's support set, the meta-loss of
# the adapted weights taken with loss.backward() into the model's parameters, and an optimizer
# written by hand. The backward passes are the steps; the inner grad calls beside them are not.
MAML = r"""
import torch
from torch.func import functional_call, grad
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

def loss(p, x, y):
    return (functional_call(model, p, (x,)) - y).pow(2).mean()

for i in range(20):
    params = dict(model.named_parameters())
    xs, ys, xq, yq = torch.randn(5, 4), torch.randn(5, 1), torch.randn(5, 4), torch.randn(5, 1)
    g = grad(loss)(params, xs, ys)
    adapted = {k: v - 0.1 * g[k] for k, v in params.items()}
    model.zero_grad()
    loss(adapted, xq, yq).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
print("maml: done")
"""


def test_inner_func_grads_beside_backward_passes_are_no_steps(tmp_path):
    r, out = prun_script(tmp_path, "maml.py", MAML)
    assert r.stdout == "maml: done\n"
    c = child(out)
    assert c["mode"] == "backward" and c["step_source"] == "backward passes (a step from one gradient reset to the next)"
    # 20 meta-updates: the first inner grad call starts the count, and each backward pass after a
    # reset ends a step; the inner calls after the first backward pass mark nothing
    assert len(steps(out)) == 20


# Three ways a step takes its gradients, 10 steps each: loss.backward(), torch.autograd.grad of
# the loss (after a create_graph penalty call, which is no loss), torch.func.grad_and_value (with
# aux), and 5 of torch.func.grad, which returns no loss to record. The losses are printed too.
LOSSES = r"""
import torch
from torch.func import functional_call, grad, grad_and_value
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
x, y = torch.randn(16, 4), torch.randn(16, 1)

def loss(p):
    return (functional_call(model, p, (x,)) - y).pow(2).mean()

for i in range(10):
    l = (model(x) - y).pow(2).mean()
    print(repr(l.item()))
    model.zero_grad(); l.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
for i in range(10):
    xi = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(model(xi).sum(), xi, create_graph=True)
    l = (model(x) - y).pow(2).mean() + 0.0 * gx.pow(2).sum()
    print(repr(l.item()))
    gs = torch.autograd.grad(l, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), gs):
            p -= 0.05 * g
params = {k: v.detach() for k, v in model.named_parameters()}
step = grad_and_value(lambda p: (loss(p), p["weight"].sum()), has_aux=True)
for i in range(10):
    g, (value, aux) = step(params)
    print(repr(value.item()))
    params = {k: v - 0.05 * g[k] for k, v in params.items()}
for i in range(5):
    g = grad(loss)(params)
    params = {k: v - 0.05 * g[k] for k, v in params.items()}
"""


def test_tune_records_the_loss_of_each_way_a_step_takes_gradients(tmp_path, capfd):
    """`perfdoctor tune` compares a trial's losses with the baseline's (compile, autocast and
    float32 change numerics): they must be there for functional loops too (collect/inject_loss.py)."""
    import json

    from perfdoctor.collect.launcher import RunConfig, launch
    script = tmp_path / "losses.py"
    script.write_text(LOSSES)
    res = launch(RunConfig(argv=[str(script)], run_dir=tmp_path / "run", max_steps=None, trace=False, changes={}))
    assert res.exit_code == 0
    printed = [float(v) for v in capfd.readouterr().out.split()]
    inj = json.loads((tmp_path / "run" / "inject.json").read_text())
    assert len(printed) == 30 and inj["losses"] == printed

