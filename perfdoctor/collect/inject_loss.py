"""The losses `perfdoctor tune` compares between runs (inject.json "losses"): the scalar each
training step takes its gradients of, whichever way the script takes them.

- `loss.backward()` on a scalar tensor (Tensor.backward);
- `torch.autograd.grad(loss, params)` on one scalar output, unless create_graph is set (a
  gradient penalty, an inner step: what is differentiated again is no step's loss);
- the value `torch.func.grad_and_value(f)(...)` returns, for a call outside any other torch.func
  transform and not while compiling (torch.func.grad returns no value: such a loop has no loss
  to compare, and tune says so).

A plain tensor's loss on the CPU is kept as its float at once; any other (a device's, a tensor
subclass's: the fake tensors torch.compile differentiates with autograd.grad while it builds a
backward graph have no value) as a detached tensor, converted at exit (inject.write_record), so no
device sync is added to the step and no conversion can fail inside the script's call. LOSS_CAP of
them at most, the first ones. (Thousands of CPU scalar tensors kept alive among a step's freed
activations pinned glibc's heap: nanoGPT's trainer grew 6 MB a step under tune, flat without it,
and its baseline's report blamed the script for it, PD216.) A loss a GradScaler scaled
(`scaler.scale(loss).backward()`) is kept as the loss it scaled: the scaled one is times 65536 to
start, then times whatever the scaler makes of it (a nanoGPT-style run's check read 2.7e+05 for a
loss of 4.2).
"""

from __future__ import annotations

import functools
import os
import weakref

from perfdoctor.collect.funcpasses import outside_transforms
from perfdoctor.collect.passes import creates_graph

LOSS_CAP = 100_000                     # losses kept (one per step's gradient call); a longer run keeps the first ones


def record_losses(torch, st) -> None:
    """Wrap the three ways in; each loss goes to st.losses (inject._State)."""
    unscaled = _scaled_losses(torch)

    def keep(t) -> None:
        if len(st.losses) < LOSS_CAP and isinstance(t, torch.Tensor) and t.numel() == 1 and os.getpid() == st.pid:
            loss = unscaled(t).detach()
            if type(loss) is torch.Tensor and loss.device.type == "cpu" and not loss.is_complex():
                try:
                    loss = float(loss)
                except Exception:        # recording never breaks the step: kept as the tensor
                    pass
            st.losses.append(loss)

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


def _scaled_losses(torch):
    """Wrap GradScaler.scale (torch.cuda.amp's is the same class's): the scalar it returns -> the
    loss it scaled, for as long as the scaled tensor lives. Returns the lookup: a tensor scale()
    made gives its loss, any other itself. A disabled scaler returns the loss itself: nothing kept."""
    made: dict[int, tuple] = {}
    cls = getattr(getattr(getattr(torch, "amp", None), "grad_scaler", None), "GradScaler", None)
    if cls is None or not callable(getattr(cls, "scale", None)):
        return lambda t: t
    orig = cls.scale

    def scale(self, outputs):
        out = orig(self, outputs)
        if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor) and out is not outputs \
                and outputs.numel() == 1:
            if len(made) >= 64:          # scaled losses never taken backward (the last of a run): forget them
                made.clear()
            made[id(out)] = (weakref.ref(out), outputs.detach())
        return out
    cls.scale = functools.update_wrapper(scale, orig)

    def unscaled(t):
        entry = made.pop(id(t), None)
        return entry[1] if entry is not None and entry[0]() is t else t
    return unscaled
