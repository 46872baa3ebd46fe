"""Where the host's op time goes: one row per op name with its self time (TraceAnalysis.tables
`host_ops`), as torch.profiler's own table sorts it (`key_averages()`, "Self CPU") and
torch-tb-profiler's operator view shows it (host self duration).

- Rows: the ops (`cpu_op`/`operator` events) and `record_function` blocks (`user_annotation`:
  Optimizer.step, module hooks, the user's labels) that start inside the analysed steps, on every
  host thread; not the step itself, loader waits or Python frames (`python_function`, recorded
  with with_stack), which are not ops.
- Self time: an op's duration (up to the last step's end) less that of the ops directly inside
  it (nesting.self_time), so the rows sum to the time the host spent in ops without counting a
  nested one twice; an annotation's self time is the Python between its ops. `total_us` sums
  whole durations (torch's "CPU total"; a row nested in one of the same name counts in both).
- `share`: self time over the analysed steps' wall time; on a CPU-only trace, with one host
  thread, the shares of the rows and "other / untraced" sum to about 1 (ops on other threads,
  DataLoader or intra-op pools, add theirs on top). On a GPU trace the host's op time overlaps
  the device's work: a large share there is not by itself the step's cost.
The top TOP_ROWS rows by self time are kept.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.kinds import CPU_OP_CATS, Kinds
from perfdoctor.analyze.nesting import self_time
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

TOP_ROWS = 30


def op_self_times(t: EventTable, k: Kinds, steps: Steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, is aten op, self time) of the ops and annotations that start in the analysed steps;
    computed once per trace (threads.py reads the aten ops' self time too: seconds on a trace of
    millions of ops)."""
    key = ("op_self_times", steps.span)
    if key not in k.cache:
        lo, hi = steps.span
        rows = np.flatnonzero(k.cpu_op & t.cat_mask(*CPU_OP_CATS, "user_annotation") & (t.ts >= lo) & (t.ts < hi))
        aten = t.name_mask(lambda n: n.startswith("aten::"))[rows]
        # an op still running when the last step ended (the profiler stopped inside an
        # Optimizer.step: 22 ms past a 7 ms step) counts up to that end only
        inside = np.minimum(t.dur[rows], hi - t.ts[rows])      # (ts + dur - ts is not dur at epoch scale)
        k.cache[key] = (rows, aten, self_time(t, rows, inner=aten, dur=inside))
    return k.cache[key]


def host_op_table(t: EventTable, k: Kinds, steps: Steps, top: int = TOP_ROWS) -> list[dict]:
    total = float(steps.duration.sum())
    rows, _, own = op_self_times(t, k, steps)
    if not len(rows) or total <= 0:
        return []
    codes = t.name[rows]
    n = len(t.names)
    calls = np.bincount(codes, minlength=n)
    self_us = np.bincount(codes, weights=own, minlength=n)
    total_us = np.bincount(codes, weights=t.dur[rows].astype(np.float64), minlength=n)
    used = np.flatnonzero(calls)
    best = used[np.lexsort((used, -self_us[used]))][:top]     # by self time, ties by first seen
    return [{"name": t.names[c], "calls": int(calls[c]), "self_us": float(self_us[c]),
             "total_us": float(total_us[c]), "mean_self_us": float(self_us[c] / calls[c]),
             "share": float(self_us[c]) / total} for c in best]
