"""Unfused memory-bound kernels: what torch.compile's kernel fusion acts on.

Eager PyTorch runs every elementwise op, norm and reduction as its own kernel: each reads its
inputs from device memory and writes its output back, so a chain like `x * w + b -> gelu ->
dropout -> + residual` moves the activations four times. torch.compile (TorchInductor) fuses
such chains into one generated kernel that reads and writes them once. The kernels it acts on
are memory-bound: their time is bytes moved, not math.

A kernel counts as unfused memory-bound work when its name (ATen/cuDNN naming) says elementwise,
reduction, normalisation, softmax outside attention, activation, dropout, indexing, concatenation,
fill or pooling, and it is none of: a GEMM/convolution or attention kernel (precision.py's
classes), a layout transpose (channels_last removes those), an optimizer kernel (fused
optimizers cover those), a collective, or a kernel compile already generated (`triton_*`).

What fusion removes: the pointwise arithmetic, copies and casts (add, mul, scale, dtype casts:
ATen's *Functor and copy kernels, `fusion.pointwise_share`) fold into the kernel next to them and
stop reading and writing memory of their own; norms, reductions, softmax, dropout and activations
keep about one pass each (their outputs are what backward saves). Measured on an H200: a bf16
MLP written op by op (33% of its step in pointwise arithmetic, copies and casts, 22% in the rest)
ran 1.71x faster compiled, 1.49x expected so; a GELU MLP stack of library modules (12% and 32%)
1.11x, 1.13x expected so, where the length of the chains alone promised 1.4x.

`fusion.compiled` is true when the steps already run compiled code (Triton kernels, or
compiled-region ops on the host): then compile is not news. Kernel time only shortens the step
where the device is the critical path, so the share is weighted by the device's busy share of
the step, as precision.py does.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import isin
from perfdoctor.analyze.kinds import COMM_KERNEL_RX, Kinds
from perfdoctor.analyze.precision import CLASSES, OPTIMIZER_KERNEL_RX, _in_optimizer, class_of_rows, device_weight
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

MEMORY_BOUND_RX = re.compile(
    r"elementwise|reduce_kernel|reduction|norm|softmax|activation|gelu|silu|relu|tanh|sigmoid|dropout|"
    r"fused_dropout|masked|index|gather|scatter|CatArray|cat_|fill|pool|bn_|clamp|where|copy_kernel|"
    r"GammaBeta|RowwiseMoments", re.I)
NOT_FUSABLE_RX = re.compile(r"^triton_|nccl|multi_tensor_apply|Memcpy|Memset", re.I)
COMPILED_KERNEL_RX = re.compile(r"^triton_")
COMPILED_OP_RX = re.compile(r"^(CompiledFunction|CompiledFxGraph|Torch-Compiled Region|## Call CompiledFxGraph)")
# pointwise arithmetic, copies and casts: ATen's functor kernels (CUDAFunctor_add, BinaryFunctor,
# AUnaryFunctor, MulFunctor...), direct/dtype copy kernels and fills; not the reductions, whose
# kernels name functors too (reduce_kernel<..., sum_functor / MaxNanFunctor>)
POINTWISE_RX = re.compile(r"^(?!.*(?:reduce_kernel|reduction|Reduce)).*(?:Functor|copy_kernel|fill_kernel)", re.I)
UNCHANGED = ("gemm_fp32", "gemm_tf32", "gemm_half", "gemm_fp64", "attention_fp32", "attention_half", "layout")


def is_memory_bound(name: str) -> bool:
    return bool(MEMORY_BOUND_RX.search(name)) and not NOT_FUSABLE_RX.search(name) \
        and not OPTIMIZER_KERNEL_RX.search(name) and not COMM_KERNEL_RX.search(name)


def fusion_metrics(t: EventTable, k: Kinds, steps: Steps, device_share: float | None,
                   on: np.ndarray | None = None) -> dict:
    """`on`: the one device to measure (replicas.critical_device), None: every device."""
    out = {"fusion.unfused_share": None, "fusion.unfused_kernels_per_step": None, "fusion.compiled": None,
           "fusion.pointwise_share": None}
    lo, hi = steps.span
    total = float(steps.duration.sum())
    ops = k.cpu_op & (t.ts >= lo) & (t.ts < hi)
    compiled_op = bool((ops & t.name_mask(lambda s: bool(COMPILED_OP_RX.search(s)))).any())
    kr = np.flatnonzero(k.kernel if on is None else k.kernel & on)
    kr = kr[(t.ts[kr] >= lo) & (t.ts[kr] < hi)]
    if not len(kr) or total <= 0:
        # no kernels in the steps (a CPU-only trace): compiled regions show as host ops alone
        out["fusion.compiled"] = compiled_op if total > 0 else None
        return out
    names = t.name[kr]
    compiled_kernel = np.fromiter((bool(COMPILED_KERNEL_RX.search(n)) for n in t.names), bool, len(t.names))
    lut = np.fromiter((is_memory_bound(n) for n in t.names), bool, len(t.names))
    pointwise = np.fromiter((bool(POINTWISE_RX.search(n)) for n in t.names), bool, len(t.names))
    cls = class_of_rows(t, k, kr)
    keep = lut[names] & ~isin(cls, [CLASSES.index(c) for c in UNCHANGED]) & ~_in_optimizer(t, k, kr)
    n_steps = max(len(steps.duration), 1)
    out.update({"fusion.unfused_share": float(t.dur[kr][keep].sum()) / total * device_weight(device_share),
                "fusion.unfused_kernels_per_step": float(keep.sum()) / n_steps,
                "fusion.compiled": bool(compiled_kernel[names].any()) or compiled_op,
                "fusion.pointwise_share": float(t.dur[kr][keep & pointwise[names]].sum()) / total
                * device_weight(device_share)})
    return out
