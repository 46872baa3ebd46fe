"""Hand-written attention: matmul, (scale, mask), softmax, (dropout), matmul.

`scores = q @ k.transpose(-2, -1) / sqrt(d); attn = scores.masked_fill(mask, -inf).softmax(-1);
out = attn @ v` materialises the [B, H, T, T] score matrix and runs several kernels over it,
where torch.nn.functional.scaled_dot_product_attention runs one fused kernel that never builds
it. A trace without shapes still shows the pattern as a sequence of outermost aten ops on one
thread: a softmax whose nearest neighbours (within WINDOW outermost ops each side, not counting
the view, copy and cast ops between them: autocast's casts and the backward's views and
expands of the batched operands) are batched matrix multiplies. The backward shows the same
shape on the autograd thread (BmmBackward, SoftmaxBackward, BmmBackward). Softmax inside SDPA's
own math path is counted by patterns.py, not here.

The cost is the device time of the kernels (and the device-to-device copies and fills among
them) launched from the host span of each match (first matmul to last), over the step time: the
T^2 work a fused kernel replaces. The part of it in GEMM kernels (the two matmuls, by kernel name:
analyze/precision.py) is the work a fused kernel still does; the rest (scale, mask, softmax,
dropout passes over the score matrix) it removes.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import outermost
from perfdoctor.analyze.precision import CLASSES, class_of_rows
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

WINDOW = 4
GEMM_CLASSES = [CLASSES.index(c) for c in ("gemm_fp32", "gemm_tf32", "gemm_half", "gemm_fp64")]
OP_RX = re.compile(r"^(aten::|autograd::engine::evaluate_function: )")
MM_RX = re.compile(r"^aten::(matmul|bmm|baddbmm|einsum)$|"
                   r"^autograd::engine::evaluate_function: (Bmm|Baddbmm|Matmul|Einsum|UnsafeView)Backward")
# the view a matmul's result goes through: its backward node sits next to the BmmBackward that
# does the GEMMs, and stands for the matmul only where no BmmBackward is in reach
VIEW_OF_MM_RX = re.compile(r"^autograd::engine::evaluate_function: UnsafeViewBackward")
# Ops that only reshape, view or cast: they sit between the matmuls and the softmax in any
# hand-written attention (the backward puts up to six between BmmBackward and SoftmaxBackward).
SHAPE_RX = re.compile(r"^aten::(view|reshape|_unsafe_view|expand|transpose|t|permute|contiguous|clone|to|_to_copy|"
                      r"detach|unsqueeze|squeeze|select|slice|as_strided|unflatten|flatten)$|"
                      r"^autograd::engine::evaluate_function: (View|UnsafeView|Expand|Transpose|T|Permute|Clone|"
                      r"ToCopy|Reshape|Unsqueeze|Squeeze|Select|Slice|AsStrided|Unflatten|Flatten)Backward")
SOFTMAX_RX = re.compile(r"^aten::(softmax|_softmax|_safe_softmax)$|"
                        r"^autograd::engine::evaluate_function: (Softmax|SafeSoftmax)Backward")


def attention_metrics(t: EventTable, k: Kinds, steps: Steps, on: np.ndarray | None = None) -> dict:
    """`on`: the one device whose kernels count (replicas.critical_device), None: every device."""
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
    n_max = max(forward, len(spans) - forward)
    out["attention.manual_per_step"] = n_max / len(steps)
    # A window edge cuts at most one step's worth of one direction; a larger difference is real
    # (a frozen encoder's forward, evaluation inside the window) and each direction counts as seen.
    cut = abs(2 * forward - len(spans)) <= n_max / len(steps) + 0.5
    if k.platform == "cpu":
        return out
    dev, launch = device_launch_index(t, k)
    ok = launch >= 0
    on_device = k.kernel[dev] | k.memset[dev] | (k.memcpy[dev] & t.name_mask(lambda n: "DtoD" in n)[dev])
    if on is not None:
        on_device &= on[dev]
    dev, launch = dev[ok & on_device], launch[ok & on_device]
    if not total:
        return out
    # A layer's forward and backward both run every step, but the trace's window can cut the
    # forward passes the host ran ahead of the device (or the backward of the last step): then
    # each direction counts at its mean per match, as often as the direction seen more often.
    share = gemm_share = 0.0
    for backward in (False, True):
        mine = [(s, e) for s, e, bwd in spans if bwd == backward]
        if not mine:
            continue
        inside = np.zeros(len(dev), bool)
        for tid_code, a, b in ((t.tid[s], t.ts[s], t.ts[e] + t.dur[e]) for s, e in mine):
            inside |= (t.tid[launch] == tid_code) & (t.ts[launch] >= a) & (t.ts[launch] <= b)
        rows = dev[inside]               # kernels, and the device-to-device copies and fills they need
        kern = rows[k.kernel[rows]]
        gemm = kern[isin(class_of_rows(t, k, kern), GEMM_CLASSES)]
        scale = n_max / len(mine) if cut else 1.0
        share += float(t.dur[rows].sum()) * scale
        gemm_share += float(t.dur[gemm].sum()) * scale
    out["attention.manual_kernel_share"] = min(1.0, share / total)
    out["attention.manual_gemm_share"] = min(1.0, gemm_share / total)
    return out


def _luts(t: EventTable) -> tuple[np.ndarray, ...]:
    """Per name code, in one pass over the names: is an op, a matmul, a softmax, backward, a
    view/cast op, a matmul's view."""
    flags = np.zeros((6, len(t.names)), bool)
    for i, n in enumerate(t.names):
        if OP_RX.match(n):
            flags[0, i] = True
            flags[1, i] = MM_RX.match(n) is not None
            flags[2, i] = SOFTMAX_RX.match(n) is not None
            flags[3, i] = n.startswith("autograd")
            flags[4, i] = SHAPE_RX.match(n) is not None
            flags[5, i] = VIEW_OF_MM_RX.match(n) is not None
    return flags[0], flags[1], flags[2], flags[3], flags[4], flags[5]


def _matches(t: EventTable, rows: np.ndarray, luts) -> list[tuple[int, int, bool]]:
    """(first row, last row, is backward) of each matmul-softmax-matmul among outermost ops.

    Each side of a softmax reaches to its nearest matmul within WINDOW outermost ops that are
    not views, nor past another softmax; a matmul's UnsafeViewBackward counts only where its
    BmmBackward is not in reach (the span must hold the GEMMs). Both matmuls are in the
    softmax's own pass (a forward softmax and the backward matmuls that follow it on the same
    thread are a softmax head, not attention)."""
    top = outermost(t, rows)                        # in time order (rows: one thread)
    names = t.name[top]
    # an outermost softmax is never SDPA's own math path
    sm, mm, bwd, view_of_mm = luts[2][names], luts[1][names], luts[3][names], luts[5][names]
    counted = np.cumsum(~luts[4][names])
    out = []
    for i in np.flatnonzero(sm):
        ends = []
        for step, stop in ((-1, -1), (1, len(top))):
            found, j = None, i + step
            while j != stop and abs(int(counted[j]) - int(counted[i])) <= WINDOW and not sm[j]:
                if mm[j] and bwd[j] == bwd[i]:
                    found = j
                    if not view_of_mm[j]:
                        break
                j += step
            ends.append(found)
        if ends[0] is not None and ends[1] is not None:
            out.append((int(top[ends[0]]), int(top[ends[1]]), bool(bwd[i])))
    return out
