"""The backward pass's dense gradients of embedding tables (embedding.dense_backward_share).

An nn.Embedding (or EmbeddingBag) with sparse=False makes its weight's gradient as large as the
whole table each backward pass: aten::embedding_dense_backward (EmbeddingBag:
aten::_embedding_bag_dense_backward) allocates a table of zeros and adds the looked-up rows'
gradients into it; a table looked up twice in a step gets two, which its backward node adds.
With sparse=True the gradient holds the looked-up rows alone, so this time is what a sparse
gradient saves in the backward pass (the optimizer's share is PD383's other part, from the
census: collect/embeddings.py).

    embedding.dense_backward_share = host time of the backward nodes that run those ops (or of
                                     the ops outside a node) in the steps / the steps' time;
                                     on a CPU that is their work. None on a GPU (its
                                     work is kernels, and the host time of the op is their launch)
                                     and where the steps run no backward node.
    optimizer.zero_grad_share      = time inside Optimizer.zero_grad ranges in the steps / the
                                     steps' time, CPU traces: setting a table-sized gradient to
                                     None hands its memory back to the system (a 2M x 64 table:
                                     32 ms of a 717 ms step, no op in the range). None on a GPU
                                     (the caching allocator keeps freed memory: host time) and
                                     without such ranges.

A user's recommender (a 2M x 64 item table, Adam, 2-core CPU), one traced step of 717 ms: Adam's
step 558 ms, the table's backward 123 ms, zero_grad 32 ms, the rest 4 ms.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import outermost
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

EVALUATE = "autograd::engine::evaluate_function: "
DENSE_OPS = frozenset({"aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward"})
NAMES = ("embedding.dense_backward_share", "optimizer.zero_grad_share")


def embedding_grad_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if k.platform != "cpu" or total <= 0:
        return out
    rows = steps.inside(t, np.flatnonzero(k.cpu_op))
    zero = rows[t.name_mask(lambda n: n.startswith("Optimizer.zero_grad#"))[rows]]
    if len(zero):
        start = t.ts[zero].astype(np.float64)
        s_, e_ = intervals.clip(start, start + t.dur[zero], *steps.span)
        out["optimizer.zero_grad_share"] = min(1.0, intervals.total(s_, e_) / total)
    if not t.name_mask(lambda n: n.startswith(EVALUATE))[rows].any():
        return out
    # the backward node of each lookup (evaluate_function: EmbeddingBackward0 / EmbeddingBagBackward0)
    # that runs a dense backward op: the op fills the table-sized gradient, and where the table
    # was looked up twice in the step the node also adds one dense gradient to the other (a
    # word2vec's context table, called for the positives and the negatives: its second node took
    # 35.5 ms where the op alone takes ~24); an op outside such a node counts alone
    inner = t.name_mask(lambda n: n in DENSE_OPS)
    nodes = t.name_mask(lambda n: n.startswith(EVALUATE) and "Embedding" in n)
    dense = rows[(inner | nodes)[rows]]
    top = outermost(t, dense) if len(dense) else dense
    top = np.array([r for r in top if inner[r] or _holds(t, r, dense, inner)], dtype=np.int64)
    dense_us = float(t.dur[top].astype(np.float64).sum()) if len(top) else 0.0
    out["embedding.dense_backward_share"] = min(1.0, dense_us / total)
    return out


def _holds(t: EventTable, row: int, rows: np.ndarray, inner: np.ndarray) -> bool:
    """Does `row` hold one of the `inner` rows of `rows` on its thread?"""
    r = rows[inner[rows] & (t.tid[rows] == t.tid[row])]
    end = t.ts[row] + t.dur[row]
    return bool(((t.ts[r] >= t.ts[row]) & (t.ts[r] + t.dur[r] <= end)).any())
