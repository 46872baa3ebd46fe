"""Backward passes: the step signal of training loops without a torch.optim optimizer.

A hand-written loop (parameters updated by `p.data.add_(p.grad, alpha=-lr)` or `p -= lr * p.grad`
under no_grad, batches sliced from a tensor, no DataLoader) still calls `loss.backward()` once
per update, or several times with gradient accumulation. `torch.autograd.backward` (which
`Tensor.backward` calls) is wrapped: the session hears of each pass before it runs, and after.

Which passes start a new step? The one after the gradients were *reset*. GradResets watches a
few leaf tensors that receive gradients (found once by walking the first pass's graph back to
its AccumulateGrad nodes; weak references, so the model is never kept alive). Between the end of
one pass and the start of the next, a gradient set to None (`zero_grad()`), replaced, or changed
in place (`grad.zero_()`, clipping: the tensor's version counter moves) means an update
happened: a new step. Untouched gradients mean accumulation: the same step. Reading `.grad`
and `._version` is host-only (no device sync) and costs microseconds for a handful of leaves.
A reset done through `.grad.data` (it has its own version counter) is invisible: when no reset
is ever seen, the session counts each pass as a step and says so.
"""

from __future__ import annotations

import time
import weakref

MAX_LEAVES = 8
MAX_NODES = 4096     # graph nodes visited to find the leaves (the first pass only)


class GradResets:
    def __init__(self):
        self.leaves: list[weakref.ref] = []
        self.after: list | None = None     # gradient states right after the last pass
        self.tries = 0

    def _states(self) -> list:
        out = []
        for ref in self.leaves:
            p = ref()
            if p is None:
                out.append(None)
                continue
            g = p.grad
            out.append(None if g is None else (id(g), g._version))
        return out

    def before_pass(self, roots) -> bool | None:
        """Were the gradients reset since the last pass ended? True for the first pass; None
        when no leaf can be watched (each pass is then its own step)."""
        if not self.leaves and self.tries < 3:
            self.tries += 1
            self.leaves = find_leaves(roots)
        if not self.leaves or not any(ref() is not None for ref in self.leaves):
            return None
        if self.after is None:
            return True
        return self._states() != self.after

    def after_pass(self) -> None:
        if self.leaves:
            self.after = self._states()


def find_leaves(roots) -> list[weakref.ref]:
    """Up to MAX_LEAVES leaf tensors that the graph of `roots` accumulates gradients into."""
    if not isinstance(roots, (list, tuple)):
        roots = (roots,)
    stack, leaves, seen, keep = [], [], set(), []     # keep: visited nodes stay alive, ids stay unique
    for t in roots:
        fn = getattr(t, "grad_fn", None)
        if fn is not None:
            stack.append(fn)
        elif getattr(t, "requires_grad", False):      # a leaf itself
            leaves.append(weakref.ref(t))
    visited = 0
    while stack and len(leaves) < MAX_LEAVES and visited < MAX_NODES:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        keep.append(fn)
        visited += 1
        var = getattr(fn, "variable", None)           # AccumulateGrad nodes hold their leaf
        if var is not None:
            try:
                leaves.append(weakref.ref(var))
            except TypeError:
                pass
            continue
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    return leaves


def wrap_backward(torch, session) -> None:
    """torch.autograd.backward -> session.on_pass(roots, t0) before, session.after_pass() after.
    Tensor.backward looks torch.autograd.backward up at call time, so both are covered."""
    orig = torch.autograd.backward
    if getattr(orig, "_perfdoctor", False):
        return

    def backward(tensors, *args, **kwargs):
        if session.mode == "optimizer":               # steps are settled: stay out of the way
            return orig(tensors, *args, **kwargs)
        try:
            session.on_pass(tensors, time.perf_counter())
        except Exception:                             # never break the script's backward (StopRun passes)
            pass
        try:
            return orig(tensors, *args, **kwargs)
        finally:
            session.after_pass()
    backward._perfdoctor = True
    backward.__wrapped__ = orig
    backward.__doc__ = orig.__doc__
    torch.autograd.backward = backward
