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

A functional loop takes its gradients from `torch.autograd.grad(loss, params)` instead: they
are returned, never accumulated into `.grad`, so a call that takes the gradients of weights
starts a step (it is also wrapped; weights_updated: an nn.Parameter among its inputs, or the
same tensors as the last call's, changed in place since). Not a step: a call with
`create_graph=True` (a gradient penalty, a derivative inside the loss, a meta-learning inner
loop: the step is the pass that follows), a batched call, the gradient of new tensors each call
(an adversarial attack's input), and a pass started while another runs (reentrant
checkpointing runs a backward inside the backward, on the autograd engine's device thread for
CUDA tensors: so any thread, not only the caller's).

A torch.func loop (`grad(loss_fn)(params, x, y)`, then new params) calls torch.autograd.grad
with create_graph=True on tensors functorch wraps anew each call: none of that says "step". So
the functions torch.func.grad and grad_and_value return are wrapped (wrap_func_grad): a call
made outside any other torch.func transform is a step's pass; one inside vmap (per-sample
gradients) or inside another grad is part of that transform's call.
"""

from __future__ import annotations

import functools
import threading
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


_RUNNING = [0]     # passes running now, on any thread (a pass started inside another is no step)
_LOCK = threading.Lock()
_LEAVES: dict = {"refs": None, "versions": None}   # the last autograd.grad call's inputs


def _watched(session, roots, fresh: bool | str, run):
    """Run a pass. An outermost one is counted in the census step (modules.Census) and, unless
    steps follow optimizer steps, told to the session before and after."""
    with _LOCK:
        nested = _RUNNING[0] > 0
        _RUNNING[0] += 1
    watching = not nested and session.mode != "optimizer"
    window = getattr(session, "window", None)
    try:
        if not nested and window is not None:
            window.check_memory()                 # an LBFGS step of many passes can outgrow the trace's budget
        if not nested:
            census = getattr(session, "census", None)
            if census is not None and census.state == "counting":
                census.passes += 1
        if watching:
            try:
                session.on_pass(roots, time.perf_counter(), fresh=fresh)
            except Exception:                         # never break the script's backward (StopRun passes)
                pass
        return run()
    finally:
        with _LOCK:
            _RUNNING[0] -= 1
        if not nested and window is not None:
            window.check_memory()                 # the backward pass's own events
        if watching and not fresh:
            session.after_pass()


def weights_updated(torch, inputs) -> bool:
    """Does this autograd.grad call take the gradients of weights (a functional training step)?
    Yes when an input is an nn.Parameter, or when its inputs are the same tensors as the last
    call's and one was changed in place since (the weights were updated). No for gradients of
    new tensors each call (an adversarial attack's input, a data-dependent penalty) or of the
    same tensors left as they were (the rows of a Jacobian)."""
    ts = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    ts = [t for t in ts if isinstance(t, torch.Tensor)]
    if any(isinstance(t, torch.nn.Parameter) for t in ts):
        return True
    refs, versions = _LEAVES["refs"], _LEAVES["versions"]
    now = [t._version for t in ts]
    try:
        _LEAVES["refs"], _LEAVES["versions"] = [weakref.ref(t) for t in ts], now
    except TypeError:
        _LEAVES["refs"] = None
    return (refs is not None and len(refs) == len(ts) and all(r() is t for r, t in zip(refs, ts))
            and versions != now)


def _replace(torch, name: str, wrapper) -> None:
    orig = getattr(torch.autograd, name)
    wrapper._perfdoctor = True
    wrapper.__wrapped__ = orig
    wrapper.__doc__ = orig.__doc__
    setattr(torch.autograd, name, wrapper)


def wrap_backward(torch, session) -> None:
    """torch.autograd.backward and torch.autograd.grad -> session.on_pass(roots, t0, fresh) before,
    session.after_pass() after a backward. Tensor.backward looks torch.autograd.backward up at call
    time, so both are covered; the wrappers are in place when torch's import ends, so a script's
    `from torch.autograd import grad` gets the wrapped one."""
    backward_orig, grad_orig = torch.autograd.backward, torch.autograd.grad
    if not getattr(backward_orig, "_perfdoctor", False):
        def backward(tensors, *args, **kwargs):
            return _watched(session, tensors, False, lambda: backward_orig(tensors, *args, **kwargs))
        _replace(torch, "backward", backward)
    if not getattr(grad_orig, "_perfdoctor", False):
        def grad(outputs, inputs, *args, **kwargs):
            batched = kwargs.get("is_grads_batched", args[5] if len(args) > 5 else False)
            if creates_graph(args, kwargs) or batched or not weights_updated(torch, inputs):
                return grad_orig(outputs, inputs, *args, **kwargs)
            return _watched(session, outputs, True, lambda: grad_orig(outputs, inputs, *args, **kwargs))
        _replace(torch, "grad", grad)


def creates_graph(args: tuple, kwargs: dict) -> bool:
    """torch.autograd.grad's create_graph, from its arguments after (outputs, inputs):
    grad_outputs, retain_graph, create_graph, only_inputs, allow_unused, is_grads_batched
    (torch 1.13 to 2.13 alike)."""
    return bool(kwargs.get("create_graph", args[2] if len(args) > 2 else False))


def compiling_check(torch):
    """torch.compiler.is_compiling (true while torch.compile traces), or a check that is always
    false on a torch without it."""
    return getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


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
                return _watched(session, None, "func", lambda: g(*a, **k))
            return call
        functools.update_wrapper(transform, orig)
        transform._perfdoctor = True
        setattr(func, name, transform)
