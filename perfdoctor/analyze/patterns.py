"""Model-level patterns: DataParallel and its wrappers, optimizer fusion, kernel-count churn (the
attention implementation is attention.py's)."""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.fusedcpu import annotated_class, fused_cpu_metrics
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained, launches_inside
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

FUSED_OPTIMIZER_KERNEL = re.compile(r"multi_tensor_apply|fused_adam|FusedAdam|fused_sgd|_fused_", re.I)
FUSED_OPTIMIZER_OP = re.compile(r"^aten::_(fused|foreach)_")      # fused=True / foreach=True
# which of the two: a fused update is one kernel (op) per tensor list; foreach runs a multi-tensor
# kernel (op) per arithmetic step (a fused step also bumps its step counters with a foreach op)
FUSED_ONLY_KERNEL = re.compile(r"fused_adam|FusedAdam|fused_sgd|Fused\w*Functor|_fused_", re.I)
FUSED_ONLY_OP = re.compile(r"^aten::_fused_")


def implementation(names: set[str], fused: re.Pattern, multi: re.Pattern) -> str | None:
    """'fused', 'foreach' or 'for-loop' from the names of the ops (kernels) an optimizer step ran;
    None without any."""
    if not names:
        return None
    if any(fused.search(x) for x in names):
        return "fused"
    return "foreach" if any(multi.search(x) for x in names) else "for-loop"


BACKWARD = "autograd::engine::evaluate_function"


OPEN_AT_CUT_US = 1000.0    # a range ending this close to the trace's last event was open at the cut


def optimizer_step_rows(t: EventTable, k: Kinds, steps: Steps) -> np.ndarray:
    """The Optimizer.step ranges (torch's `Optimizer.step#<class>.step` annotation) that start
    inside a step."""
    opt = np.flatnonzero(k.cpu_op & t.name_mask(lambda s: s.startswith("Optimizer.step#")))
    return opt[steps.of_events(t)[opt] >= 0]


class OwnPart:
    """The optimizer's own part of each Optimizer.step range. optimizer.step(closure) (LBFGS,
    Lightning's automatic optimization) runs the model's forward and backward inside the range;
    torch's optimizers call the closure first and update after it, so what follows the last
    backward pass that started in a range is the optimizer's own work (LBFGS also works between
    its closure calls: that part is missed, and LBFGS has no foreach or fused version anyway).
    Backward passes are found by their autograd engine events starting inside a range, on any
    thread (a GPU's backward runs on the autograd device threads). A range ends no later than the
    host range of the step it starts in (`steps.host_range_end`): the last step's Optimizer.step
    span can run on past its ProfilerStep, over the sync that stops the profiler, and the time
    after the step's host range is no step's update."""

    def __init__(self, t: EventTable, opt: np.ndarray, steps: Steps | None = None):
        lo, hi = intervals.union(t.ts[opt], t.ts[opt] + t.dur[opt])     # nested ranges: one
        self.starts, self.ends = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        open_at_cut = len(hi) and t.meta.cut_s is not None and len(t.ts) and \
            hi[-1] >= float(np.max(t.ts + t.dur)) - OPEN_AT_CUT_US
        if steps is not None and len(self.starts):
            self.ends = np.minimum(self.ends, steps.host_range_end(self.starts))
        self.cut = self.starts.copy()
        bwd = (np.flatnonzero(t.name_mask(lambda name: name.startswith(BACKWARD))) if len(opt)
               else np.zeros(0, int))
        i = self._range_of(t.ts[bwd].astype(np.float64))
        ok = i >= 0
        np.maximum.at(self.cut, i[ok], (t.ts[bwd] + t.dur[bwd])[ok].astype(np.float64))
        self.cut = np.minimum(self.cut, self.ends)
        self.closure = bool(ok.any())
        if open_at_cut and self.closure:
            # `perfdoctor run` stopped recording inside a step (trace header perfdoctor_cut_s): a
            # range still open then ends with the trace, and what follows its last backward pass
            # is the next closure call's forward, not the update: it has no own part here
            self.cut[-1] = self.ends[-1]

    def _range_of(self, x: np.ndarray) -> np.ndarray:
        """The range each time lies in (-1: none)."""
        i = np.searchsorted(self.starts, x, side="right") - 1
        inside = i >= 0
        inside[inside] = x[inside] < self.ends[i[inside]]
        return np.where(inside, i, -1)

    def own(self, x: np.ndarray) -> np.ndarray:
        """Whether each time lies in a range's own part (after its closure's last backward)."""
        i = self._range_of(x.astype(np.float64))
        ok = i >= 0
        ok[ok] = x[ok] >= self.cut[i[ok]]
        return ok


# The record_function labels each data-parallel wrapper puts in a trace, FSDP's before DDP's (a
# model could nest one in the other; FSDP's sharding decides what its collectives are).
WRAPPERS = (("fully_shard", "FSDP::"), ("FullyShardedDataParallel", "FullyShardedDataParallel."),
            ("DistributedDataParallel", "DistributedDataParallel.forward"))


def parallel_wrapper(t: EventTable, k: Kinds) -> str | None:
    """fully_shard (FSDP2), FullyShardedDataParallel (FSDP1) or DistributedDataParallel from their
    annotations; None without any (a trace without them, or gradients reduced by hand)."""
    for name, prefix in WRAPPERS:
        if (k.cpu_op & t.name_mask(lambda s, p=prefix: s.startswith(p))).any():
            return name
    return None


def pattern_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    n, total = len(steps), float(steps.duration.sum())
    out = {"parallel.data_parallel": bool((k.cpu_op & t.name_mask(lambda s: s.startswith("DataParallel.forward"))).any()),
           "parallel.wrapper": parallel_wrapper(t, k),
           "trace.devices_used": None,
           "optimizer.kernels_per_step": None, "optimizer.ops_per_step": None, "optimizer.fused": None,
           "optimizer.implementation": None, "optimizer.closure": None,
           "gpu.kernels_per_step_cv": None,
           "gpu.kernel_time_per_step_cv": None}
    opt = optimizer_step_rows(t, k, steps)
    part = OwnPart(t, opt, steps)
    s_, e_ = intervals.clip(part.cut, part.ends, *steps.span)
    out["optimizer.step_share"] = intervals.total(s_, e_) / total if len(opt) else None
    if len(opt):
        out["optimizer.closure"] = part.closure
        ops = np.flatnonzero(k.cpu_op)
        ops = ops[~isin(ops, opt)]
        inside = ops[contained(t, ops, opt)]            # any depth, same thread
        inside = inside[part.own(t.ts[inside])]
        out["optimizer.ops_per_step"] = len(inside) / n
        if k.platform == "cpu":         # no kernels: the ops say which implementation ran
            names = {t.names[c] for c in unique(t.name[inside])}
            out["optimizer.fused"] = any(FUSED_OPTIMIZER_OP.match(x) for x in names) if names else None
            out["optimizer.implementation"] = implementation(names, FUSED_ONLY_OP, FUSED_OPTIMIZER_OP)
    # `run` adds SGD's momentum and the tensor sizes (analyze/fusedcpu.py)
    out.update(fused_cpu_metrics(annotated_class([t.names[c] for c in t.name[opt]]),
                                 base=out["optimizer.implementation"]))
    if k.platform == "cpu":
        return out
    kr = np.flatnonzero(k.kernel)
    dev_ids = t.args["device"][kr]
    out["trace.devices_used"] = int(len(unique(dev_ids[~np.isnan(dev_ids)]))) or (1 if len(kr) else 0)
    if len(opt):
        kernels, launches = launches_inside(t, k, opt)
        in_opt = kernels[part.own(t.ts[launches])]
        out["optimizer.kernels_per_step"] = len(in_opt) / n
        names = {t.names[c] for c in unique(t.name[in_opt])}
        out["optimizer.fused"] = any(FUSED_OPTIMIZER_KERNEL.search(x) for x in names) if names else None
        out["optimizer.implementation"] = implementation(names, FUSED_ONLY_KERNEL, FUSED_OPTIMIZER_KERNEL)
    steady = steps.steady()
    if len(steady) >= 2:
        per = np.bincount(steps.index_of(t.ts[kr]) + 1, minlength=n + 1)[1:][steady]
        out["gpu.kernels_per_step_cv"] = float(per.std() / per.mean()) if per.mean() > 0 else None
        busy = np.bincount(steps.index_of(t.ts[kr]) + 1, weights=t.dur[kr], minlength=n + 1)[1:][steady]
        out["gpu.kernel_time_per_step_cv"] = float(busy.std() / busy.mean()) if busy.mean() > 0 else None
    return out
