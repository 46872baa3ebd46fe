"""torch.func loops: their steps are the top-level calls of the functions torch.func.grad returns.

A torch.func loop (`grad(loss_fn)(params, x, y)`, then new params) calls torch.autograd.grad
with create_graph=True on tensors functorch wraps anew each call: none of that says "step". So
the functions torch.func.grad and grad_and_value return are wrapped (wrap_func_grad): a call
made outside any other torch.func transform is a step's pass; one inside vmap (per-sample
gradients) or inside another grad is part of that transform's call. Dynamo may trace these
wrappers (torch.func inside a compiled function): they step aside while it does.
"""

from __future__ import annotations

import functools

from perfdoctor.collect.dynamoskip import compiling_check
from perfdoctor.collect.passes import run_pass


def outside_transforms(torch):
    """A check that a call runs outside any torch.func transform and not while torch.compile
    traces it (a top-level call of a function torch.func.grad returned); None for a torch
    without functorch's levels."""
    level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
    if level is None:
        return None
    compiling = compiling_check(torch)
    return lambda: not compiling() and level() is None


def wrap_func_grad(torch, session) -> None:
    """torch.func.grad and torch.func.grad_and_value: each call of the function they return, made
    outside any other torch.func transform and not while compiling, is a pass that starts a step
    (session.on_pass, fresh "func"). The wrappers are in place when torch's import ends, so a
    script's `from torch.func import grad` gets them."""
    func, top_level = getattr(torch, "func", None), outside_transforms(torch)
    if func is None or top_level is None:
        return
    compiling = compiling_check(torch)
    for name in ("grad", "grad_and_value"):
        orig = getattr(func, name, None)
        if orig is None or getattr(orig, "_perfdoctor", False):
            continue

        def transform(*args, _orig=orig, **kwargs):
            g = _orig(*args, **kwargs)
            if compiling():
                return g

            @functools.wraps(g)
            def call(*a, **k):
                if not top_level():
                    return g(*a, **k)
                return run_pass(session, None, "func", lambda: g(*a, **k))
            return call
        functools.update_wrapper(transform, orig)
        transform._perfdoctor = True
        setattr(func, name, transform)
