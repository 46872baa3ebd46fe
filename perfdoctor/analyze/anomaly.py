"""Autograd anomaly detection left on in training (autograd.anomaly_* metrics).

`torch.autograd.set_detect_anomaly(True)` (or `with torch.autograd.detect_anomaly():` around the
loop) is a debugging mode. Every forward op that records a backward node stores the Python stack
that created it, and after every backward node the engine checks each of its outputs for NaN:
`aten::isnan`, then `aten::_is_any_true` (older torch: `aten::any`) and `aten::item`, a
host-device synchronisation per node on a GPU. The check is the signature in a trace: ops run by
the engine itself, directly inside `autograd::engine::evaluate_function: XBackward0` and beside
the node's own event, where without anomaly mode only a gradient's reduction or reshape to its
input's shape runs (aten::sum, aten::view). A custom Function's backward runs inside the node's
event, so its own isnan is not one.

    autograd.anomaly_checked_share = backward nodes (evaluate_function events in the steps, but
                          AccumulateGrad's, which returns nothing) with an aten::isnan directly
                          inside / all of them
    autograd.anomaly_check_share   = time of those checks (the isnan and the ops beside it that
                          finish the check: any/_is_any_true, item) / the steps' time

Both None when the steps run no backward node. The stacks stored in the forward pass are
inside each forward op's own time and untraced: the trace cannot tell how much they cost, so
the check's time is only part of what anomaly mode costs. (A user trial: an 8-block MLP at
batch 64 on a 2-core CPU, 1.9-2.0x slower with anomaly mode on, measured alternately.)
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import parents, start_order
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

EVALUATE = "autograd::engine::evaluate_function: "
CHECK_OPS = frozenset({"aten::isnan", "aten::any", "aten::_is_any_true", "aten::item"})
NAMES = ("autograd.anomaly_checked_share", "autograd.anomaly_check_share")


def anomaly_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if total <= 0:
        return out
    rows = steps.inside(t, np.flatnonzero(k.cpu_op))
    # AccumulateGrad returns nothing to check (it writes the leaf's .grad)
    evaluate = t.name_mask(lambda n: n.startswith(EVALUATE) and not n.endswith("AccumulateGrad"))
    if not evaluate[rows].any():
        return out
    isnan = t.name_mask(lambda n: n == "aten::isnan")
    check = t.name_mask(lambda n: n in CHECK_OPS)
    nodes = checked = 0
    check_us = 0.0
    for tid in unique(t.tid[rows[evaluate[rows]]]):           # the threads that run the backward pass
        r = rows[t.tid[rows] == tid]
        r = r[start_order(t.ts[r], t.dur[r])]
        up = parents(t.ts[r].astype(np.float64), t.dur[r].astype(np.float64))
        has_parent = up >= 0
        parent_row = np.where(has_parent, r[np.maximum(up, 0)], -1)
        under_evaluate = has_parent & evaluate[np.maximum(parent_row, 0)]
        nodes += int(evaluate[r].sum())
        checked += len(np.unique(parent_row[under_evaluate & isnan[r]]))
        # the check's ops: directly inside a node's evaluate_function that holds an isnan
        flagged = np.isin(parent_row, parent_row[under_evaluate & isnan[r]])
        check_us += float(t.dur[r[under_evaluate & check[r] & flagged]].astype(np.float64).sum())
    if nodes == 0:
        return out
    out["autograd.anomaly_checked_share"] = checked / nodes
    out["autograd.anomaly_check_share"] = min(1.0, check_us / total)
    return out
