"""Hand-written attention: matmul, (scale, mask), softmax, (dropout), matmul.

`scores = q @ k.transpose(-2, -1) / sqrt(d); attn = scores.masked_fill(mask, -inf).softmax(-1);
out = attn @ v` materialises the [B, H, T, T] score matrix and runs several kernels over it,
where torch.nn.functional.scaled_dot_product_attention runs one fused kernel that never builds
it. A trace without shapes still shows the pattern as a sequence of outermost aten ops on one
thread: a softmax whose nearest neighbours (within WINDOW outermost ops each side) are batched
matrix multiplies. The backward shows the same shape on the autograd thread (BmmBackward,
SoftmaxBackward, BmmBackward). Softmax inside SDPA's own math path is counted by patterns.py,
not here.

The cost is the device time of the kernels launched from the host span of each match (first
matmul to last), over the step time: the T^2 work a fused kernel replaces. The part of it in
GEMM kernels (the two matmuls, by kernel name: analyze/precision.py) is the work a fused kernel
still does; the rest (scale, mask, softmax, dropout passes over the score matrix) it removes.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import outermost
from perfdoctor.analyze.precision import CLASSES, class_of_rows
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

WINDOW = 4
GEMM_CLASSES = [CLASSES.index(c) for c in ("gemm_fp32", "gemm_tf32", "gemm_half")]
OP_RX = re.compile(r"^(aten::|autograd::engine::evaluate_function: )")
MM_RX = re.compile(r"^aten::(matmul|bmm|baddbmm|einsum)$|"
                   r"^autograd::engine::evaluate_function: (Bmm|Baddbmm|Matmul|Einsum|UnsafeView)Backward")
SOFTMAX_RX = re.compile(r"^aten::(softmax|_softmax|_safe_softmax)$|"
                        r"^autograd::engine::evaluate_function: (Softmax|SafeSoftmax)Backward")


def attention_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = {"attention.manual_per_step": 0.0, "attention.manual_kernel_share": None,
           "attention.manual_gemm_share": None}
    lo, hi = steps.span
    total = float(steps.duration.sum())
    luts = _luts(t)
    ops = np.flatnonzero(k.cpu_op & (t.ts >= lo) & (t.ts < hi) & luts[0][t.name])
    spans = []
    for tid in unique(t.tid[ops]) if len(ops) else []:
        spans += _matches(t, ops[t.tid[ops] == tid], luts)
    if not spans:
        none = 0.0 if k.platform != "cpu" else None
        out.update({"attention.manual_kernel_share": none, "attention.manual_gemm_share": none})
        return out
    forward = sum(1 for _, _, bwd in spans if not bwd)
    out["attention.manual_per_step"] = forward / len(steps)
    if k.platform == "cpu":
        return out
    dev, launch = device_launch_index(t, k)
    ok = launch >= 0
    dev, launch = dev[ok], launch[ok]
    inside = np.zeros(len(dev), bool)
    for tid_code, a, b, _ in ((t.tid[s], t.ts[s], t.ts[e] + t.dur[e], bwd) for s, e, bwd in spans):
        inside |= (t.tid[launch] == tid_code) & (t.ts[launch] >= a) & (t.ts[launch] <= b)
    if not total:
        return out
    rows = dev[inside & k.kernel[dev]]
    gemm = np.isin(class_of_rows(t, k, rows), GEMM_CLASSES)
    out["attention.manual_kernel_share"] = float(t.dur[rows].sum()) / total
    out["attention.manual_gemm_share"] = float(t.dur[rows[gemm]].sum()) / total
    return out


def _luts(t: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per name code, in one pass over the names: is an op, a matmul, a softmax, backward."""
    flags = np.zeros((4, len(t.names)), bool)
    for i, n in enumerate(t.names):
        if OP_RX.match(n):
            flags[0, i] = True
            flags[1, i] = MM_RX.match(n) is not None
            flags[2, i] = SOFTMAX_RX.match(n) is not None
            flags[3, i] = n.startswith("autograd")
    return flags[0], flags[1], flags[2], flags[3]


def _matches(t: EventTable, rows: np.ndarray, luts) -> list[tuple[int, int, bool]]:
    """(first row, last row, is backward) of each matmul-softmax-matmul among outermost ops."""
    top = outermost(t, rows)                        # in time order (rows: one thread)
    sm = luts[2][t.name[top]]          # an outermost softmax is never SDPA's own math path
    mm = luts[1][t.name[top]]
    idx = np.flatnonzero(sm)
    if not len(idx):
        return []
    pos = np.arange(len(top))
    # nearest matmul before / after each softmax, within WINDOW outermost ops
    last_mm = np.maximum.accumulate(np.where(mm, pos, -1))
    next_mm = np.minimum.accumulate(np.where(mm, pos, len(top))[::-1])[::-1]
    before = last_mm[np.maximum(idx - 1, 0)]
    before = np.where(idx > 0, before, -1)
    after = next_mm[np.minimum(idx + 1, len(top) - 1)]
    after = np.where(idx + 1 < len(top), after, len(top))
    ok = (before >= 0) & (idx - before <= WINDOW) & (after < len(top)) & (after - idx <= WINDOW)
    bwd = luts[3][t.name[top[idx]]]
    return [(int(top[b]), int(top[a]), bool(w)) for b, a, w in zip(before[ok], after[ok], bwd[ok])]

