"""Device-side metrics: kernel statistics, launch-boundness, graph replay and tensor-core use.

A graph launch (cudaGraphLaunch, hipGraphLaunch; cuGraphLaunch in driver traces) replays a
whole captured graph: every kernel of it carries the launch's correlation id, so dozens of
kernels join one call (torch.compile mode="reduce-overhead", torch.cuda.graph,
make_graphed_callables). Launch-boundness compares a kernel with the call that launched it
alone, so it counts the kernels launched one by one only; `gpu.graph_kernel_share` says how many
of the linked kernels replayed from graphs instead.

Tensor-core use comes from each kernel's precision class (precision.py: TF32, bf16/fp16/fp8
GEMMs and attention use tensor cores; fp32 SIMT ones do not); GEMM/convolution and attention
kernels are tensor-core *eligible*, batch-norm and layout kernels are not.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.precision import CLASSES, class_of_rows
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

GRAPH_LAUNCH_RX = re.compile(r"^(cuda|hip|cu)GraphLaunch(_v\d+|_ptsz|_spt)?$")


def device_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    total = float(steps.duration.sum())
    lo, hi = steps.span
    kr = np.flatnonzero(k.kernel)
    kr = kr[(t.ts[kr] >= lo) & (t.ts[kr] < hi)]
    out: dict = {"gpu.kernels_per_step": len(kr) / len(steps),
                 "gpu.kernel_median_us": median(t.dur[kr]) if len(kr) else None}
    s, e = intervals.clip(t.ts[kr], t.ts[kr] + t.dur[kr], lo, hi)
    out["gpu.kernel_busy_share"] = intervals.total(s, e) / total
    out.update(_launches(t, k, steps))
    out.update(_tensor_cores(t, k, kr, total))
    return out


def _launches(t: EventTable, k: Kinds, steps: Steps) -> dict:
    """Launch-boundness of the kernels launched one by one, and the share replayed from graphs
    (over the kernels joined to their launching call)."""
    dev, launch = device_launch_index(t, k)
    is_k = k.kernel[dev] & (launch >= 0)
    kd, lr = dev[is_k], launch[is_k]
    graph_call = t.name_mask(lambda s: GRAPH_LAUNCH_RX.match(s) is not None)
    from_graph = graph_call[lr]
    single = ~from_graph
    calls = np.flatnonzero(k.runtime & graph_call)
    calls = steps.inside(t, calls)
    return {"gpu.launch_bound_kernel_fraction": float(np.mean(t.dur[kd[single]] < t.dur[lr[single]]))
            if single.any() else None,
            "gpu.graph_kernel_share": float(np.mean(from_graph)) if len(kd) else None,
            "gpu.graph_launches_per_step": len(calls) / len(steps)}


def _tensor_cores(t: EventTable, k: Kinds, kr: np.ndarray, total: float) -> dict:
    """Tensor-core use from the precision classes (precision.py): GEMM/convolution and attention
    kernels are eligible (batch-norm and layout kernels are not); TF32, bf16/fp16/fp8 ones use
    tensor cores."""
    ktime = float(t.dur[kr].sum())
    if ktime <= 0:
        return {"tensor_core.kernel_share": None, "tensor_core.eligible_share": None,
                "tensor_core.eligible_step_share": None}
    cls = class_of_rows(t, k, kr)
    tc = _lut("gemm_tf32", "gemm_half", "attention_half")[cls]
    eligible = tc | _lut("gemm_fp32", "attention_fp32")[cls]
    etime = float(t.dur[kr][eligible].sum())
    return {"tensor_core.kernel_share": float(t.dur[kr][tc].sum()) / ktime,
            "tensor_core.eligible_share": etime / ktime,
            "tensor_core.eligible_step_share": etime / total}


def _lut(*classes: str) -> np.ndarray:
    m = np.zeros(len(CLASSES), bool)
    m[[CLASSES.index(c) for c in classes]] = True
    return m
