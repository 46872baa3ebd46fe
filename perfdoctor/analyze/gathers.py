"""Rows gathered by advanced indexing, and its backward (gather.index_share, CPU traces).

`x[idx]` with a tensor of row numbers runs aten::index, and its backward (IndexBackward0) adds the
gradient back with aten::index_put_(accumulate=True), which on a CPU runs one row at a time (a
message-passing GNN: _index_put_impl_ 27% of the step, aten::index 22%). x.index_select(0, idx)
gathers the same rows with a kernel made for it, and its backward is index_add_: a GNN of three
layers over 200K edges measured 1.31-1.62x from that change alone (bench/bench_gathers.py).

    gather.index_share          = host time of the outermost aten::index ops and IndexBackward0
                                  backward nodes in the steps / the steps' time. CPU traces only:
                                  on a GPU the host time is the kernels' launch (None there).
    gather.index_backward_share = the IndexBackward0 nodes' part of it.

Both are None where the steps run none of those ops, and 0 is never reported for them (a trace
without aten::index says nothing of its cost).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import outermost
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

FORWARD = "aten::index"
BACKWARD = "autograd::engine::evaluate_function: IndexBackward0"
NAMES = ("gather.index_share", "gather.index_backward_share")


def gather_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if k.platform != "cpu" or total <= 0:
        return out
    rows = steps.inside(t, np.flatnonzero(k.cpu_op))
    back = t.name_mask(lambda n: n == BACKWARD)
    ours = rows[(t.name_mask(lambda n: n == FORWARD) | back)[rows]]
    if not len(ours):
        return out
    top = outermost(t, ours)
    dur = t.dur[top].astype(np.float64)
    out["gather.index_share"] = min(1.0, float(dur.sum()) / total)
    out["gather.index_backward_share"] = min(1.0, float(dur[back[top]].sum()) / total)
    return out
