"""What the host-to-device copies carry: the type of each HtoD copy's source tensor.

A trace recorded with record_shapes=True names each op's input types; the loader keeps them for
the copy ops (aten::copy_'s source, aten::to / aten::_to_copy's input: trace/schema.COPY_SOURCE)
as the `copy_src` column. An HtoD copy on the device is joined to its launch call (correlation),
and the launch call to the innermost copy op on its thread that holds it: that op's source is
what the copy carried from the host, as the input pipeline produced it (for `x.to(dev,
dtype=torch.float)` of a uint8 batch that is uint8, though a blocking copy converts on the host
first: the fix is then to cast after the copy, which the uint8 share still points to).

Shares are of the HtoD copy device time inside the steps. Unknown (None) when the copies whose
source type is known hold less than half of that time (record_shapes off, the usual case for
`perfdoctor run` without --memory, or copies issued outside any recorded op): the remainder could
be anything, so no claim about it.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import parents, start_order
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.schema import TENSOR_TYPES
from perfdoctor.trace.table import EventTable

FLOAT = [TENSOR_TYPES.index(n) for n in ("float32", "float64")]
EIGHT_BIT = [TENSOR_TYPES.index(n) for n in ("uint8", "int8", "bool")]
MIN_KNOWN = 0.5      # of the HtoD copy time whose source type is known, for either share to be known


def copy_type_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    none = {"memcpy.h2d_float_share": None, "memcpy.h2d_uint8_share": None}
    dev, launch = device_launch_index(t, k)
    h2d = k.memcpy[dev] & t.name_mask(lambda s: "HtoD" in s)[dev] if len(dev) else np.zeros(0, bool)
    dev, launch = dev[h2d], launch[h2d]
    inside = steps.index_of(t.ts[dev]) >= 0 if len(dev) else np.zeros(0, bool)
    dev, launch = dev[inside], launch[inside]
    total = float(t.dur[dev].sum())
    if total <= 0:
        return none
    src = source_types(t, launch)
    known = ~np.isnan(src)
    if float(t.dur[dev[known]].sum()) < MIN_KNOWN * total:
        return none
    return {"memcpy.h2d_float_share": float(t.dur[dev[isin(src, FLOAT)]].sum()) / total,
            "memcpy.h2d_uint8_share": float(t.dur[dev[isin(src, EIGHT_BIT)]].sum()) / total}


def source_types(t: EventTable, launch: np.ndarray) -> np.ndarray:
    """For each launch call row (-1: none), the copy_src code of the innermost copy op with a
    known source type that holds it on its thread; NaN when none does."""
    out = np.full(len(launch), np.nan)
    code = t.args["copy_src"]
    ops = np.flatnonzero(~np.isnan(code))
    has = launch >= 0
    if not len(ops) or not has.any():
        return out
    for tid in unique(t.tid[launch[has]]):
        on_ops = ops[t.tid[ops] == tid]
        if not len(on_ops):
            continue
        at = np.flatnonzero(has & (t.tid[np.maximum(launch, 0)] == tid))
        rows = np.concatenate([on_ops, launch[at]])
        is_launch = np.arange(len(rows)) >= len(on_ops)
        order = start_order(t.ts[rows], t.dur[rows], is_launch)     # a launch is inside an op that starts with it
        parent = parents(t.ts[rows[order]].astype(np.float64), t.dur[rows[order]].astype(np.float64))
        pos = np.empty(len(rows), np.int64)
        pos[order] = np.arange(len(rows))
        p = parent[pos[len(on_ops):]]
        ok = p >= 0
        found = rows[order[np.maximum(p, 0)]]
        ok &= ~is_launch[order[np.maximum(p, 0)]]
        out[at[ok]] = code[found[ok]]
    return out
