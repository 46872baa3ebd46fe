"""Activation checkpointing: forward work recomputed during the backward pass.

torch.utils.checkpoint drops a block's activations in the forward pass and runs the block's
forward again in the backward pass when its gradients are needed: memory for compute. In a
trace the recomputation is plain: module-level forward ops (aten::linear, aten::conv2d,
aten::layer_norm, aten::gelu, aten::scaled_dot_product_attention, ...) nested inside a backward
node's span (`autograd::engine::evaluate_function: ...`: the non-reentrant checkpoint reruns
the forward from a saved-tensor unpack hook of the node that needs it; the reentrant one from
`CheckpointFunctionBackward`). Backward formulas themselves call other ops (mm, the *_backward
kernels, elementwise math), so the op names below are the module forward ops that no backward
formula calls: only the outermost ones count (linear's own matmul is inside it).

The cost is what the recomputation takes from the step. Not only the ops: the checkpoint's own
machinery (saved-tensor hooks, the RNG state it restores, Python around the rerun) runs in the
same place, inside the backward node that needed the tensors. So the cost of each outermost
backward span that holds recomputed ops is that span less the backward work in it: its outermost
ops that are neither recomputed ops nor the node's own wrapper op (the formula's mm/sum/*_backward
calls, and nested backward nodes of a reentrant checkpoint), nor hold a recomputed op: a
record_function range around a block, or with_stack's Python frames (the unpack hook, the
block's nn.Module forward), wrap the rerun too, and are not backward work. On the CPU it is that time; on a
GPU (gpu_share) the device time of the kernels launched there (outside the backward work) where
the device is the critical path, and that host time where the host is: an H200 GPT stack with
every block checkpointed was host-bound (the device busy 46% of the profiled step), its
recomputation 30% of the host's step and 8% of the device's, and it ran 1.34-1.69x faster
without the checkpoints (bench/holdout/h_recompute.py). Counting
the ops alone came to 0.14 of a profiled CPU step, the spans to 0.186, where the profiled steps
with and without the checkpoint differed by ~0.17 (tests/test_recompute.py; un-profiled runs
differ by 0.19-0.25: the profiler slows ops more than the checkpoint's Python bookkeeping).

One exception: backward formulas that call aten::matmul themselves. Under torch.func (vmap over
grad, as per-sample gradients are taken) the batching rule of mm's backward formula does; so do
cdist's (EuclideanDistBackward0: a triplet loss's batch-hard mining read as recomputation, PD345
first at ~1.09x with no checkpoint anywhere) and every torch.linalg formula (solve, cholesky, inv,
eigh, svd, pinv, lstsq, lu_factor, matrix_exp: recorded on the CPU with torch 2.13). So a backward
node holding nothing recomputed but matmuls (einsum) reruns nothing, whatever its name, except
the reentrant checkpoint's own node (CheckpointFunctionBackward), which is nothing but a rerun. A
checkpoint's rerun of a block holds its other forward ops too (linear, layer_norm, gelu) and still
counts whole; a non-reentrant checkpoint of a block of bare matmuls would be missed.
A TorchScript model's backward node (DifferentiableGraphBackward) runs the scripted graph's
derivative formulas, which call aten::matmul too, and torch.utils.checkpoint cannot be scripted:
it reruns nothing (a user's scripted MLP had read PD345 first, ~2x, with no checkpoint anywhere).
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained, kernels_launched_inside, outermost, parents, start_order
from perfdoctor.analyze.precision import device_weight
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

FORWARD_RX = re.compile(r"^aten::(linear|conv[123]d|conv_transpose[123]d|layer_norm|group_norm|batch_norm|rms_norm|"
                        r"instance_norm|gelu|silu|mish|dropout|embedding|scaled_dot_product_attention|softmax|"
                        r"log_softmax|matmul|einsum)$")
BACKWARD_RX = re.compile(r"^autograd::engine::evaluate_function: ")
CHECKPOINT_NODE_RX = re.compile(r"CheckpointFunctionBackward")   # the reentrant checkpoint's: only a rerun
MATMUL_OPS = frozenset({"aten::matmul", "aten::einsum"})
SCRIPTED_NODE_RX = re.compile(r"DifferentiableGraphBackward")   # TorchScript's: its formulas, never a rerun


def recompute_metrics(t: EventTable, k: Kinds, steps: Steps, device_share: float | None,
                      on: np.ndarray | None = None) -> dict:
    """`on`: the one device whose kernels count (replicas.critical_device), None: every device."""
    out = {"recompute.ops_per_step": None, "recompute.share": None}
    lo, hi = steps.span
    total = float(steps.duration.sum())
    if total <= 0:
        return out
    in_span = k.cpu_op & (t.ts >= lo) & (t.ts < hi)
    node = t.name_regex(BACKWARD_RX.pattern) & ~t.name_regex(SCRIPTED_NODE_RX.pattern)
    backward = np.flatnonzero(in_span & node)
    forward = np.flatnonzero(in_span & t.name_regex(FORWARD_RX.pattern))
    rec = outermost(t, forward[contained(t, forward, backward)])
    rec = rec[~_formula_matmuls(t, rec, backward)]
    out["recompute.ops_per_step"] = len(rec) / len(steps)
    if not len(rec):
        out["recompute.share"] = 0.0
        return out
    # the outermost backward spans holding recomputed ops, and the backward work inside them
    spans = outermost(t, backward)
    spans = spans[_holds(t, spans, rec)]
    wrappers = {n.split(": ", 1)[1] for n in (t.names[c] for c in unique(t.name[backward]))}
    cand = np.flatnonzero(in_span & ~t.name_mask(lambda n: n in wrappers))
    cand = cand[contained(t, cand, spans) & ~contained(t, cand, rec) & ~isin(cand, spans)]
    cand = cand[~_encloses(t, cand, rec)]          # a range or Python frame around the rerun is not backward work
    work = outermost(t, cand[~isin(cand, rec)])
    # per thread: the backward passes of several threads (DataParallel's replicas, one autograd
    # thread per device) run at once, and the step waits for the longest, not for their sum
    host = max(float(t.dur[spans[t.tid[spans] == tid]].sum()) - float(t.dur[work[t.tid[work] == tid]].sum())
               for tid in unique(t.tid[spans])) / total
    if k.platform == "cpu":
        out["recompute.share"] = host
        return out
    there = np.setdiff1d(kernels_launched_inside(t, k, spans), kernels_launched_inside(t, k, work))
    there = there if on is None else there[on[there]]
    out["recompute.share"] = gpu_share(host, float(t.dur[there].sum()) / total, device_share)
    return out


def gpu_share(host: float, kernels: float, device_share: float | None) -> float:
    """What the recomputation takes from a GPU step: its host time where the host is the critical
    path, its kernel time where the device is. The step is the longer of the host's work (taken as
    the whole step) and the device's busy time D; without the recomputation it is the longer of
    1 - host and D - kernels. So at least the kernel time weighted by the device's busy share,
    and on a host-bound step the host time, until the device's remaining work bounds the step."""
    d = device_weight(device_share)
    return max(kernels * d, min(host, max(0.0, 1.0 - d + kernels)))


def _formula_matmuls(t: EventTable, rec: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Which of the recomputed rows `rec` are a backward formula's own matmuls: matmul or einsum
    rows whose innermost enclosing backward node (same thread) holds no other recomputed row than
    matmuls and is not the reentrant checkpoint's node."""
    res = np.zeros(len(rec), bool)
    is_mm = np.array([t.names[c] in MATMUL_OPS for c in t.name[rec]], bool)
    if not is_mm.any():
        return res
    node = np.full(len(rec), -1)
    for tid in unique(t.tid[rec]):
        on = np.flatnonzero(t.tid[rec] == tid)
        n = nodes[t.tid[nodes] == tid]
        rows = np.concatenate([n, rec[on]])
        inner = np.concatenate([np.zeros(len(n), bool), np.ones(len(on), bool)])
        order = start_order(t.ts[rows], t.dur[rows], inner)
        par = parents(t.ts[rows[order]].astype(np.float64), t.dur[rows[order]].astype(np.float64))
        pos = np.empty(len(rows), int)
        pos[order] = np.arange(len(rows))
        p = par[pos[len(n):]]
        node[on] = np.where(p >= 0, rows[order][np.maximum(p, 0)], -1)
    for nd in unique(node[is_mm]):
        here = node == nd
        if nd >= 0 and is_mm[here].all() and not CHECKPOINT_NODE_RX.search(t.names[t.name[nd]]):
            res |= here
    return res


def _encloses(t: EventTable, rows: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Does each row contain one of `inner` (same thread)? `inner` are outermost rows, so on one
    thread they neither overlap nor nest: in start order their ends rise too, and the first one
    starting at or after a row's start is the one that ends first."""
    res = np.zeros(len(rows), bool)
    for tid in unique(t.tid[rows]) if len(rows) and len(inner) else []:
        on = np.flatnonzero(t.tid[rows] == tid)
        i_ = inner[t.tid[inner] == tid]
        if not len(i_):
            continue
        i_ = i_[np.argsort(t.ts[i_], kind="stable")]
        r = rows[on]
        j = np.searchsorted(t.ts[i_], t.ts[r], side="left")
        ok = j < len(i_)
        ok[ok] = t.ts[i_[j[ok]]] + t.dur[i_[j[ok]]] <= t.ts[r][ok] + t.dur[r][ok]
        res[on] = ok
    return res


def _holds(t: EventTable, spans: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Does each of the (non-overlapping) spans contain at least one of `rows` (same thread)?"""
    res = np.zeros(len(spans), bool)
    for tid in unique(t.tid[rows]) if len(rows) else []:
        on = np.flatnonzero(t.tid[spans] == tid)
        if not len(on):
            continue
        on = on[np.argsort(t.ts[spans[on]], kind="stable")]
        r = rows[t.tid[rows] == tid]
        i = np.searchsorted(t.ts[spans[on]], t.ts[r], side="right") - 1
        ok = i >= 0
        ok[ok] = t.ts[r][ok] + t.dur[r][ok] <= t.ts[spans[on[i[ok]]]] + t.dur[spans[on[i[ok]]]]
        res[on[i[ok]]] = True
    return res
