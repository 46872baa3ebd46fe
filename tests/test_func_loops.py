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
