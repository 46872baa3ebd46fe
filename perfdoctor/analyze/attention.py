"""Unfused attention: hand-written (matmul, (scale, mask), softmax, (dropout), matmul) and SDPA's
math path.

`scores = q @ k.transpose(-2, -1) / sqrt(d); attn = scores.masked_fill(mask, -inf).softmax(-1);
out = attn @ v` materialises the [B, H, T, T] score matrix and runs several kernels over it,
where torch.nn.functional.scaled_dot_product_attention runs one fused kernel that never builds
it. A trace without shapes still shows the pattern as a sequence of outermost aten ops on one
thread: a softmax whose nearest neighbours (within WINDOW outermost ops each side, not counting
the view, copy and cast ops between them: autocast's casts and the backward's views and
expands of the batched operands) are batched matrix multiplies. The backward shows the same
shape on the autograd thread (BmmBackward, SoftmaxBackward, BmmBackward). A softmax inside SDPA's
own math path is no outermost op: that forward is the kernels launched inside
aten::_scaled_dot_product_attention_math, and its backward is those autograd nodes (hand-written
backward passes with no hand-written forward beside a math path are the math path's). The math
path upcasts bf16/fp16 inputs to fp32, so autocast never changes its kernels (precision.py
leaves them out); a fused kernel does.

The cost is the device time of the kernels (and the device-to-device copies and fills among
them) launched from the host span of each match (first matmul to last), over the step time: the
T^2 work a fused kernel replaces. The part of it in GEMM kernels (the two matmuls, by kernel name:
analyze/precision.py) is the work a fused kernel still does; the rest (scale, mask, softmax,
dropout passes over the score matrix) it removes. That GEMM work runs in bf16/fp16 in a fused
kernel: fp32 and TF32 GEMM time shrinks by the GPU's damped peak ratio (attention.gemm_half_speedup).

On a CPU-only trace the matches are host ops: attention.manual_cpu_share is their time (each
match's first op start to last op end, forward and backward) over the step time, and
attention.manual_cpu_gemm_share the part in their matmul ops, the work SDPA's fused CPU kernel
still does (PD378).
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained, outermost
from perfdoctor.analyze.precision import CLASSES, DAMP, class_of_rows
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

WINDOW = 4
EDGE = 8        # view and cast ops taken in at each end of a match
GEMM_CLASSES = [CLASSES.index(c) for c in ("gemm_fp32", "gemm_tf32", "gemm_half", "gemm_fp64")]
MATH_ATTENTION = re.compile(r"^aten::_scaled_dot_product_attention_math")
FUSED_ATTENTION = re.compile(r"^aten::_(scaled_dot_product_(flash|efficient|cudnn)_attention|flash_attention_forward|"
                             r"efficient_attention_forward)")
OP_RX = re.compile(r"^(aten::|autograd::engine::evaluate_function: )")
MM_RX = re.compile(r"^aten::(matmul|bmm|baddbmm|einsum)$|"
                   r"^autograd::engine::evaluate_function: (Bmm|Baddbmm|Matmul|Einsum|UnsafeView)Backward")
# the view a matmul's result goes through: its backward node sits next to the BmmBackward that
# does the GEMMs, and stands for the matmul only where no BmmBackward is in reach
VIEW_OF_MM_RX = re.compile(r"^autograd::engine::evaluate_function: UnsafeViewBackward")
# A matmul that folds into one 2-D GEMM had a 2-D operand: a weight (a Linear over a strided 3-D
# input: x @ W), not the product of two activations that builds attention scores. Its view's
# backward node is followed (past views) by this node; additive (Bahdanau) attention, whose scores
# come from Linear layers, showed a Linear's UnsafeViewBackward beside SoftmaxBackward.
WEIGHT_MM_RX = re.compile(r"^autograd::engine::evaluate_function: (Mm|Addmm)Backward")
# Ops that only reshape, view or cast: they sit between the matmuls and the softmax in any
# hand-written attention (the backward puts up to six between BmmBackward and SoftmaxBackward).
SHAPE_RX = re.compile(r"^aten::(view|reshape|_unsafe_view|expand|transpose|t|permute|contiguous|clone|to|_to_copy|"
                      r"detach|unsqueeze|squeeze|select|slice|as_strided|unflatten|flatten)$|"
                      r"^autograd::engine::evaluate_function: (View|UnsafeView|Expand|Transpose|T|Permute|Clone|"
                      r"ToCopy|Reshape|Unsqueeze|Squeeze|Select|Slice|AsStrided|Unflatten|Flatten)Backward")
# Ops that build a mask inside the attention (a causal mask made on every call: ones, tril,
# bitwise_not before the masked_fill; an H200 GPT block put three between its matmul and softmax):
# they do not count towards the window either.
MASK_RX = re.compile(r"^aten::(ones|zeros|full|empty|tril|triu|bitwise_not|logical_not|arange|ones_like|zeros_like|"
                     r"full_like|empty_like)$")
SOFTMAX_RX = re.compile(r"^aten::(softmax|_softmax|_safe_softmax)$|"
                        r"^autograd::engine::evaluate_function: (Softmax|SafeSoftmax)Backward")


def attention_metrics(t: EventTable, k: Kinds, steps: Steps, on: np.ndarray | None = None,
                      ratios: tuple[float, float] | None = None) -> tuple[dict, np.ndarray]:
    """(the attention.* metrics, the kernels of SDPA's math path, forward and backward: they run
    fp32 whatever autocast does, and precision_metrics leaves them out). `on`: the one device
    whose kernels count (replicas.critical_device), None: every device. `ratios`: the GPU's
    (fp32 -> half, tf32 -> half) peak ratios (precision.peak_ratios), None when unknown."""
    out = {"attention.manual_per_step": 0.0, "attention.manual_cpu_share": None, "attention.manual_cpu_gemm_share": None,
           "attention.math_cpu_share": None, "attention.math_cpu_gemm_share": None,
           "attention.manual_kernel_share": None,
           "attention.manual_gemm_share": None, "attention.math_kernel_share": None,
           "attention.math_gemm_share": None, "attention.gemm_half_speedup": None}
    math_path = np.zeros(0, np.int64)
    lo, hi = steps.span
    total = float(steps.duration.sum())
    luts = _luts(t)
    ops = np.flatnonzero(k.cpu_op & (t.ts >= lo) & (t.ts < hi) & luts[0][t.name])
    spans = []
    for tid in unique(t.tid[ops]) if len(ops) else []:
        spans += _matches(t, ops[t.tid[ops] == tid], luts)
    in_steps = k.cpu_op & (steps.of_events(t) >= 0)
    math_ops = np.flatnonzero(in_steps & t.name_mask(lambda s: MATH_ATTENTION.match(s) is not None))
    out["attention.math_ops_per_step"] = len(math_ops) / len(steps)
    out["attention.fused_ops_per_step"] = int((in_steps & t.name_mask(
        lambda s: FUSED_ATTENTION.match(s) is not None)).sum()) / len(steps)
    forward = sum(1 for _, _, bwd in spans if not bwd)
    n_max = max(forward, len(spans) - forward)
    out["attention.manual_per_step"] = n_max / len(steps)
    # SDPA's math path runs its forward inside the op and its backward as the autograd nodes of the
    # ops it decomposes into (BmmBackward, SoftmaxBackward): hand-written backward passes with no
    # hand-written forward are that backward.
    math_bwd = len(math_ops) > 0 and forward == 0 and len(spans) > 0
    if k.platform == "cpu":
        if math_bwd:     # on the CPU SDPA takes its math path whenever dropout is on (a tiny BERT
            out["attention.manual_per_step"] = 0.0      # trained with accelerate read as hand-written)
        # the matches are the math path's backward or hand-written attention, timed alike
        back = _cpu_shares(t, ops, spans if math_bwd else [], total)
        out.update(_cpu_shares(t, ops, [] if math_bwd else spans, total))
        if total:
            fwd, fwd_gemm = _math_forward(t, math_ops)
            out["attention.math_cpu_share"] = min(1.0, back["attention.manual_cpu_share"] + fwd / total)
            out["attention.math_cpu_gemm_share"] = min(1.0, back["attention.manual_cpu_gemm_share"] + fwd_gemm / total)
        return out, math_path
    dev, launch = device_launch_index(t, k)
    ok = launch >= 0
    out["attention.math_kernel_share"] = 0.0 if len(math_ops) or (k.kernel[dev] & ok).any() else None
    out["attention.math_gemm_share"] = out["attention.math_kernel_share"]
    out["attention.manual_kernel_share"] = out["attention.manual_gemm_share"] = 0.0
    if not (spans or len(math_ops)) or not total:
        return out, math_path
    on_device = k.kernel[dev] | k.memset[dev] | (k.memcpy[dev] & t.name_mask(lambda n: "DtoD" in n)[dev])
    if on is not None:
        on_device &= on[dev]
    dev, launch = dev[ok & on_device], launch[ok & on_device]
    if math_bwd:
        out["attention.manual_per_step"] = 0.0
    # A layer's forward and backward both run every step, but the trace's window can cut the
    # forward passes the host ran ahead of the device (or the backward of the last step): then
    # each direction counts at its mean per match, as often as the direction seen more often.
    # A window edge cuts at most one step's worth of one direction; a larger difference is real
    # (a frozen encoder's forward, evaluation inside the window) and each direction counts as seen.
    passes = [len(math_ops), len(spans)] if math_bwd else [forward, len(spans) - forward]
    most = max(passes)
    cut = abs(passes[0] - passes[1]) <= most / len(steps) + 0.5
    gemm_by_class = np.zeros(len(GEMM_CLASSES))
    for kind, backward in (("manual", False), ("manual", True), ("math", False)):
        mine = [(int(r), int(r)) for r in math_ops] if kind == "math" else \
            [(s, e) for s, e, bwd in spans if bwd == backward]
        if not mine:
            continue
        rows = dev[_launched_in(t, dev, launch, mine)]   # kernels, and the copies and fills they need
        kern = rows[k.kernel[rows]]
        cls = class_of_rows(t, k, kern)
        scale = most / len(mine) if cut and (math_bwd or kind == "manual") else 1.0
        gemm = np.array([float(t.dur[kern[cls == c]].sum()) for c in GEMM_CLASSES]) * scale
        gemm_by_class += gemm
        name = "math" if kind == "math" or math_bwd else "manual"    # the math path's backward is its own
        out[f"attention.{name}_kernel_share"] += float(t.dur[rows].sum()) * scale / total
        out[f"attention.{name}_gemm_share"] += float(gemm.sum()) / total
        if kind == "math" or math_bwd:
            math_path = np.concatenate([math_path, kern])
    for key in ("manual_kernel_share", "manual_gemm_share", "math_kernel_share", "math_gemm_share"):
        if out[f"attention.{key}"] is not None:      # None: no kernel the trace ties to a launch
            out[f"attention.{key}"] = min(1.0, out[f"attention.{key}"])
    out["attention.gemm_half_speedup"] = _half_speedup(gemm_by_class, ratios)
    return out, math_path


def _cpu_shares(t: EventTable, ops: np.ndarray, spans: list[tuple[int, int, bool]], total: float) -> dict:
    """On a CPU the hand-written attention's cost is its host ops: the time of each match (first
    op's start to last op's end: its ops and the Python between them) over the step time, and the
    part of it in its matmuls (the outermost matmul ops and BmmBackward nodes inside the span),
    the work a fused kernel still does."""
    if not spans or not total:
        return {"attention.manual_cpu_share": 0.0 if total else None,
                "attention.manual_cpu_gemm_share": 0.0 if total else None}
    mm = t.name_mask(lambda n: MM_RX.match(n) is not None and VIEW_OF_MM_RX.match(n) is None)
    span_us = gemm_us = 0.0
    for first, last, _ in spans:
        a, b = t.ts[first], t.ts[last] + t.dur[last]
        rows = ops[(t.tid[ops] == t.tid[first]) & (t.ts[ops] >= a) & (t.ts[ops] + t.dur[ops] <= b)]
        top = outermost(t, rows)
        span_us += float(b - a)
        gemm_us += float(t.dur[top[mm[top]]].sum())
    return {"attention.manual_cpu_share": min(1.0, span_us / total),
            "attention.manual_cpu_gemm_share": min(1.0, gemm_us / total)}


def _math_forward(t: EventTable, math_ops: np.ndarray) -> tuple[float, float]:
    """SDPA's math path forward on the CPU (us): its ops' time, and the matmuls' in it (the
    outermost aten::matmul/bmm inside them)."""
    if not len(math_ops):
        return 0.0, 0.0
    top = outermost(t, math_ops)
    mm = np.flatnonzero(t.name_mask(lambda n: n in ("aten::matmul", "aten::bmm", "aten::baddbmm")))
    return float(t.dur[top].sum()), float(t.dur[outermost(t, mm[contained(t, mm, top)])].sum())


def _launched_in(t: EventTable, dev: np.ndarray, launch: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Which of the device rows were launched inside one of the host spans (first row, last row)."""
    inside = np.zeros(len(dev), bool)
    for tid_code, a, b in ((t.tid[s], t.ts[s], t.ts[e] + t.dur[e]) for s, e in spans):
        inside |= (t.tid[launch] == tid_code) & (t.ts[launch] >= a) & (t.ts[launch] <= b)
    return inside


def _half_speedup(gemm_by_class: np.ndarray, ratios: tuple[float, float] | None) -> float | None:
    """How much faster the attention's GEMM work runs in a fused bf16/fp16 kernel: its time over
    that time with the fp32 and TF32 parts at the GPU's damped peak ratio to half precision
    (precision.DAMP; fp64 and half unchanged). None without GEMM time, or with fp32/TF32 GEMM time
    on a GPU whose ratios are unknown."""
    total = float(gemm_by_class.sum())
    fp32, tf32 = gemm_by_class[0], gemm_by_class[1]
    if total <= 0 or (ratios is None and fp32 + tf32 > 0):
        return None
    fp32_r, tf32_r = ratios or (1.0, 1.0)
    return total / (total - fp32 - tf32 + fp32 / fp32_r ** DAMP + tf32 / tf32_r ** DAMP)


def _luts(t: EventTable) -> tuple[np.ndarray, ...]:
    """Per name code, in one pass over the names: is an op, a matmul, a softmax, backward, a
    view/cast op, a matmul's view, a mask-building op, a 2-D GEMM's backward."""
    flags = np.zeros((8, len(t.names)), bool)
    for i, n in enumerate(t.names):
        if OP_RX.match(n):
            flags[0, i] = True
            flags[1, i] = MM_RX.match(n) is not None
            flags[2, i] = SOFTMAX_RX.match(n) is not None
            flags[3, i] = n.startswith("autograd")
            flags[4, i] = SHAPE_RX.match(n) is not None
            flags[5, i] = VIEW_OF_MM_RX.match(n) is not None
            flags[6, i] = MASK_RX.match(n) is not None
            flags[7, i] = WEIGHT_MM_RX.match(n) is not None
    return tuple(flags)


def _matches(t: EventTable, rows: np.ndarray, luts) -> list[tuple[int, int, bool]]:
    """(first row, last row, is backward) of each matmul-softmax-matmul among outermost ops.

    Each side of a softmax reaches to its nearest matmul within WINDOW outermost ops that are
    not views, nor past another softmax, and each end then takes in up to EDGE adjacent view and
    cast ops; a matmul's UnsafeViewBackward counts only where its BmmBackward is not in reach (the
    span must hold the GEMMs), and never where the next op past views is a 2-D GEMM's backward
    (a weight's product: a Linear's, in additive attention). Both matmuls are in the
    softmax's own pass (a forward softmax and the backward matmuls that follow it on the same
    thread are a softmax head, not attention)."""
    top = outermost(t, rows)                        # in time order (rows: one thread)
    names = t.name[top]
    # an outermost softmax is never SDPA's own math path
    sm, mm, bwd, view_of_mm = luts[2][names], luts[1][names], luts[3][names], luts[5][names]
    shape = luts[4][names]
    counted = np.cumsum(~(shape | luts[6][names]))
    # the first op from each position on that is not a view or cast: a view's own product
    pos = np.where(shape, len(top), np.arange(len(top)))
    next_op = np.minimum.accumulate(pos[::-1])[::-1]
    after = np.append(next_op[1:], len(top))
    weight_view = view_of_mm & (after < len(top)) & luts[7][names[np.minimum(after, len(top) - 1)]]
    out = []
    for i in np.flatnonzero(sm):
        ends = []
        for step, stop in ((-1, -1), (1, len(top))):
            found, j = None, i + step
            while j != stop and abs(int(counted[j]) - int(counted[i])) <= WINDOW and not sm[j]:
                if mm[j] and bwd[j] == bwd[i] and not weight_view[j]:
                    found = j
                    if not view_of_mm[j]:
                        break
                j += step
            ends.append(found)
        if ends[0] is not None and ends[1] is not None:
            first, last = ends
            # the casts and views that feed the first matmul and take the last one's result (the
            # inputs upcast by hand for a stable softmax, and their ToCopyBackward) are the
            # attention's too: a fused kernel takes the bf16/fp16 tensors as they are
            while first > 0 and ends[0] - first < EDGE and shape[first - 1] and bwd[first - 1] == bwd[i]:
                first -= 1
            while last + 1 < len(top) and last - ends[1] < EDGE and shape[last + 1] and bwd[last + 1] == bwd[i]:
                last += 1
            out.append((int(top[first]), int(top[last]), bool(bwd[i])))
    return out
