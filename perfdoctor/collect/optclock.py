"""The time a training thread spends inside optimizer.step(), per step, on every step.

torch's global optimizer pre- and post-hooks bracket each step() call: their difference is the
host time of the update, un-profiled (the trace's Optimizer.step share is inflated by the
profiler's per-op cost, which a for-loop optimizer's many small ops pay the most). steps.jsonl
`opt` holds it per step (analyze/callshares.py: calls.optimizer_share).

A call given a closure (LBFGS, Lightning's automatic optimization) runs the forward and backward
passes inside step(): its time is not the update's, so it is not counted. On a GPU the host time
is the launches' (the update runs asynchronously); the rules use it on the CPU only.

child.json `optimizer`: the first optimizer's class and the settings that decide what its fused
implementation gains (momentum for SGD) and whether it already runs one (fused, foreach).
"""

from __future__ import annotations

import time

SETTINGS = ("momentum", "fused", "foreach")


class OptimizerClock:
    def __init__(self) -> None:
        self.t0: float | None = None     # perf_counter at the running step()'s pre-hook
        self.step_s = 0.0                # time inside step() since the last take()
        self.closures = 0                # calls not counted (a closure ran inside them)
        self.first: dict | None = None   # the first optimizer that stepped: class and settings

    def pre(self) -> None:
        self.t0 = time.perf_counter()

    def post(self, optimizer, args, kwargs, skipped: bool) -> None:
        t0, self.t0 = self.t0, None
        if self.first is None:
            self.first = describe(optimizer)
        if skipped or t0 is None:        # GradScaler skipped the step: step() never ran
            return
        rest = args[1:] if args and args[0] is optimizer else args or ()   # torch passes the optimizer first
        if (rest and any(callable(a) for a in rest)) or (kwargs and callable(kwargs.get("closure"))):
            self.closures += 1
            return
        self.step_s += time.perf_counter() - t0

    def take(self) -> float:
        s, self.step_s = self.step_s, 0.0
        return s

    def info(self) -> dict:
        return {**(self.first or {}), "closure_calls": self.closures}


LARGE = 1 << 20      # elements of a parameter whose update streams from memory (see below)


def describe(optimizer) -> dict:
    """{"class": "SGD", "momentum": 0.9, "fused": None, "foreach": None, "tensors": 26,
    "elements": 3536, "large_elements": 0}: the first param group's settings where the optimizer
    has them (None where it does not, or for an object that is not a torch optimizer), and its
    parameters: tensors, elements, and elements in tensors of LARGE elements or more. An Adam
    update of such a tensor touches 16 MB or more (parameter, gradient, two states in float32),
    past what a core's share of the caches holds, so each of the for-loop's passes over it
    streams from memory, where the fused update makes one (analyze/fusedcpu.py)."""
    out: dict = {"class": type(optimizer).__name__}
    try:
        groups = list(optimizer.param_groups)
    except Exception:
        groups = []
    group = groups[0] if groups and isinstance(groups[0], dict) else {}
    for k in SETTINGS:
        v = group.get(k)
        out[k] = v if isinstance(v, (bool, int, float)) or v is None else None
    try:
        sizes = [int(p.numel()) for g in groups for p in g["params"]] if groups else None
    except Exception:
        sizes = None
    if sizes is not None:
        out.update(tensors=len(sizes), elements=sum(sizes), large_elements=sum(n for n in sizes if n >= LARGE))
    return out
