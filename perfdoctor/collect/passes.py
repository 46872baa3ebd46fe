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

A torch.func loop's passes are funcpasses.py's. Under torch.compile Dynamo never traces into this
module: a backward pass it hands back to Python runs these wrappers as Python (dynamoskip.py).
"""

from __future__ import annotations

import threading
import time
import weakref

from perfdoctor.collect import dynamoskip
from perfdoctor.collect.dynamoskip import compiling_check

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


def run_pass(session, roots, fresh: bool | str, run):
    """Run a pass between _enter and _exit."""
    state = _enter(session, roots, fresh)
    try:
        return run()
    finally:
        _exit(session, state, fresh)


def _enter(session, roots, fresh: bool | str) -> tuple:
    """A pass starts. An outermost one is counted in the census step (modules.Census) and, unless
    steps follow optimizer steps, told to the session (and, at _exit, that it ended)."""
    with _LOCK:
        nested = _RUNNING[0] > 0
        _RUNNING[0] += 1
    census = getattr(session, "census", None)
    census = census if not nested and census is not None and census.state == "counting" else None
    resets = getattr(session, "resets", None) if census is not None and not fresh else None
    state = (nested, not nested and session.mode != "optimizer", getattr(session, "window", None), resets)
    try:
        if not nested and state[2] is not None:
            state[2].check_memory()               # an LBFGS step of many passes can outgrow the trace's budget
        if census is not None:
            census.passes += 1
            # gradients of this call alone: autograd.grad's, or a backward pass after a reset
            # (per-sample gradients by a loop, against accumulation over micro-batches)
            census.fresh += bool(fresh) or (resets is not None and resets.before_pass(roots) is True)
        if state[1]:
            try:
                session.on_pass(roots, time.perf_counter(), fresh=fresh)
            except Exception:                     # never break the script's backward (StopRun passes)
                pass
    except BaseException:
        _exit(session, state, fresh)
        raise
    return state


def _exit(session, state: tuple, fresh: bool | str) -> None:
    nested, watching, window, resets = state
    with _LOCK:
        _RUNNING[0] -= 1
    if not nested and window is not None:
        window.check_memory()                     # the backward pass's own events
    if watching and not fresh:
        session.after_pass()
    if resets is not None:                        # the census's pass, steps or not (idempotent)
        resets.after_pass()


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
    compiling = compiling_check(torch)
    if not getattr(backward_orig, "_perfdoctor", False):
        def backward(tensors, *args, **kwargs):
            # nothing to tell (session.quiet_passes), or traced by Dynamo all the same: nothing
            # of ours in its graph
            if session.quiet_passes or compiling():
                return backward_orig(tensors, *args, **kwargs)
            state = _enter(session, tensors, False)
            try:
                return backward_orig(tensors, *args, **kwargs)
            finally:
                _exit(session, state, False)
        _replace(torch, "backward", dynamoskip.keep_out(backward, recursive=False))
    if not getattr(grad_orig, "_perfdoctor", False):
        def grad(outputs, inputs, *args, **kwargs):
            if compiling() or not _takes_weights_grads(torch, inputs, args, kwargs):
                return grad_orig(outputs, inputs, *args, **kwargs)
            state = _enter(session, outputs, True)
            try:
                return grad_orig(outputs, inputs, *args, **kwargs)
            finally:
                _exit(session, state, True)
        _replace(torch, "grad", dynamoskip.keep_out(grad, recursive=False))
    for fn in (_enter, _exit, _takes_weights_grads):
        dynamoskip.keep_out(fn, recursive=True)


def _takes_weights_grads(torch, inputs, args: tuple, kwargs: dict) -> bool:
    """Is this torch.autograd.grad call a step's pass: no create_graph, not batched, and the
    gradients of weights (weights_updated)?"""
    batched = kwargs.get("is_grads_batched", args[5] if len(args) > 5 else False)
    return not (creates_graph(args, kwargs) or batched) and weights_updated(torch, inputs)


def creates_graph(args: tuple, kwargs: dict) -> bool:
    """torch.autograd.grad's create_graph, from its arguments after (outputs, inputs):
    grad_outputs, retain_graph, create_graph, only_inputs, allow_unused, is_grads_batched
    (torch 1.13 to 2.13 alike)."""
    return bool(kwargs.get("create_graph", args[2] if len(args) > 2 else False))


dynamoskip.never_inline(__name__)
