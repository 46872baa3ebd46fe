"""Outermost module calls: the step signal of loops with no optimizer, backward pass or DataLoader.

An inference or benchmarking loop (`with torch.inference_mode(): for ...: y = model(x)`) has
none of the other signals, but it calls its model once per iteration. Until a step source is
chosen, `torch.nn.Module.__call__` is wrapped class-wide: a call made while no other module call
is running (on any thread) is an *outermost* call, and the session hears of it with its module.
Calls inside it (every submodule) pass straight through.

The wrapper is taken off as soon as any step source is chosen (an optimizer's first step, the
backward or DataLoader fallback, or this one), so a training loop pays for it during its first
step only (a Python frame per module call, ~0.3 us). When this source is chosen, the module
whose outermost calls reached the fallback first gets a forward pre-hook instead: one call per
step, on that module only. Under torch.compile the wrapper steps aside at trace time
(torch.compiler.is_compiling), so it never breaks a graph.
"""

from __future__ import annotations

import time

_RUNNING = [0]      # module calls running now (any thread): a call inside another is not outermost


def watch(torch, session) -> None:
    """Wrap Module.__call__ until the session has a step source (session.on_root_call)."""
    Module = torch.nn.Module
    orig = Module.__call__
    if getattr(orig, "_perfdoctor", False):
        return
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)

    def __call__(self, *args, **kwargs):
        if compiling() or _RUNNING[0]:
            return orig(self, *args, **kwargs)
        if session.mode is not None:          # a source was chosen: leave the class as it was
            if Module.__call__ is __call__:
                Module.__call__ = orig
            return orig(self, *args, **kwargs)
        try:
            session.on_root_call(self, time.perf_counter())
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
