"""The losses `perfdoctor tune` compares between runs (inject.json "losses"): the scalar each
training step takes its gradients of, whichever way the script takes them.

- `loss.backward()` on a scalar tensor (Tensor.backward);
- `torch.autograd.grad(loss, params)` on one scalar output, unless create_graph is set (a
  gradient penalty, an inner step: what is differentiated again is no step's loss);
- the value `torch.func.grad_and_value(f)(...)` returns, for a call outside any other torch.func
  transform and not while compiling (torch.func.grad returns no value: such a loop has no loss
  to compare, and tune says so).

Losses are kept as detached tensors and converted at exit (inject.write_record), so no device
sync is added to the step; LOSS_CAP of them at most, the first ones.
"""

from __future__ import annotations

import functools
import os

from perfdoctor.collect.funcpasses import outside_transforms
from perfdoctor.collect.passes import creates_graph

LOSS_CAP = 100_000                     # losses kept (one per step's gradient call); a longer run keeps the first ones


def record_losses(torch, st) -> None:
    """Wrap the three ways in; each loss goes to st.losses (inject._State)."""
    def keep(t) -> None:
        if len(st.losses) < LOSS_CAP and isinstance(t, torch.Tensor) and t.numel() == 1 and os.getpid() == st.pid:
            st.losses.append(t.detach())

    backward_orig = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        keep(self)
        return backward_orig(self, *args, **kwargs)
    torch.Tensor.backward = backward

    grad_orig = torch.autograd.grad

    def grad(outputs, inputs, *args, **kwargs):
        if not creates_graph(args, kwargs):
            keep(outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs)
        return grad_orig(outputs, inputs, *args, **kwargs)
    torch.autograd.grad = functools.update_wrapper(grad, grad_orig)
    _func_values(torch, keep)


def _func_values(torch, keep) -> None:
    func, top_level = getattr(torch, "func", None), outside_transforms(torch)
    gv = getattr(func, "grad_and_value", None)
    if gv is None or top_level is None:
        return

    def grad_and_value(*args, **kwargs):
        g = gv(*args, **kwargs)
        aux = kwargs.get("has_aux", args[2] if len(args) > 2 else False)

        def call(*a, **k):
            out = g(*a, **k)
            if top_level():
                keep(out[1][0] if aux else out[1])
            return out
        return functools.update_wrapper(call, g)
    func.grad_and_value = functools.update_wrapper(grad_and_value, gv)
