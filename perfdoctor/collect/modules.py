"""Outermost module calls: the step signal of loops with no optimizer, backward pass or DataLoader.

An inference or benchmarking loop (`with torch.inference_mode(): for ...: y = model(x)`) has
none of the other signals, but it calls its model once per iteration. Until a step source is
chosen, `torch.nn.Module.__call__` is wrapped class-wide: a call made while no other module call
is running (on any thread) is an *outermost* call, and the session hears of it with its module.
Calls inside it (every submodule) pass straight through.

Once a step source is chosen (an optimizer's first step, the backward or DataLoader fallback,
or this one), the wrapper counts the outermost calls of one whole step (Census: a per-sample
loop calls its model once per sample, `model(x[i:i+1])`), then it is taken off: a training loop
pays for it during its first two steps only (a Python frame per module call, ~0.3 us). When this
source is chosen, the module whose outermost calls reached the fallback first gets a forward
pre-hook instead: one call per step, on that module only. Under torch.compile the wrapper steps
aside at trace time (torch.compiler.is_compiling), so it never breaks a graph.
"""

from __future__ import annotations

import time

_RUNNING = [0]      # module calls running now (any thread): a call inside another is not outermost
MAX_MODULES = 64    # distinct modules counted in the census step


class Census:
    """The outermost module calls of the first whole step after the step source is chosen: per
    module, how many, and the leading dimension of each call's first tensor argument (its batch
    size, for a model that takes a batch). `result` (child.json "root_calls"): the module called
    most, {"module", "calls", "batch", "batch_share", "modules"}; None until the step ends."""

    def __init__(self, tensor_type):
        self.tensor = tensor_type
        self.state = "wait"               # wait -> counting (a step boundary with a source) -> done
        self.counts: dict = {}            # id(module) -> [class name, calls, {leading dim: calls}]
        self.result = None

    def reset(self) -> None:
        self.state, self.counts = "wait", {}

    def boundary(self, mode) -> None:
        if self.state == "wait":
            if mode is not None:
                self.state = "counting"
        elif self.state == "counting":
            self.state = "done"
            if self.counts:
                name, calls, leads = max(self.counts.values(), key=lambda c: c[1])
                batch, n = max(leads.items(), key=lambda kv: kv[1])
                self.result = {"module": name, "calls": calls, "batch": batch, "batch_share": n / calls,
                               "modules": len(self.counts)}
            self.counts = {}

    def count(self, module, args, kwargs) -> None:
        c = self.counts.get(id(module))
        if c is None:
            if len(self.counts) >= MAX_MODULES:
                return
            c = self.counts[id(module)] = [type(module).__name__, 0, {}]
        c[1] += 1
        lead = self._lead(args, kwargs)
        c[2][lead] = c[2].get(lead, 0) + 1

    def _lead(self, args, kwargs):
        for v in (*args, *kwargs.values()):
            if isinstance(v, self.tensor):
                return int(v.shape[0]) if v.dim() else None
        return None


def watch(torch, session) -> None:
    """Wrap Module.__call__ until the session has a step source (session.on_root_call)."""
    Module = torch.nn.Module
    orig = Module.__call__
    if getattr(orig, "_perfdoctor", False):
        return
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)

    census = session.census = Census(torch.Tensor)

    def __call__(self, *args, **kwargs):
        if compiling() or _RUNNING[0]:
            return orig(self, *args, **kwargs)
        if census.state == "done":            # a source chosen and its step counted: leave the class as it was
            if Module.__call__ is __call__:
                Module.__call__ = orig
            return orig(self, *args, **kwargs)
        try:
            if session.mode is None:
                session.on_root_call(self, time.perf_counter())
            elif census.state == "counting":
                census.count(self, args, kwargs)
        except Exception:                     # never break the script's forward (StopRun passes)
            pass
        _RUNNING[0] += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            _RUNNING[0] -= 1

    __call__._perfdoctor = True
    __call__.__wrapped__ = orig
    Module.__call__ = __call__


def hook_steps(module, session):
    """A forward pre-hook on the chosen module: each of its calls is a step boundary while the
    session's steps follow it; the hook's handle (removed when an optimizer takes over)."""
    def pre(mod, args):
        session.on_module_step(time.perf_counter())
    return module.register_forward_pre_hook(pre)
