"""What more intra-op threads could split, on a CPU-only run.

torch runs one aten op at a time per thread and splits a large one (a matrix multiply, a
convolution, an elementwise op over many elements) across its intra-op threads; a small op runs
on one thread (below torch's grain size) or pays a fork/join that costs more than it saves
(BLAS libraries split even small GEMMs: measured 0.90x for a 64-wide MLP at batch 16 going from
1 to 2 threads on the project's VM). So the work more threads act on is the own time (self time,
children excluded) of the aten ops long enough to split: SPLIT_MIN_US, about 10x what a
parallel region's fork and join cost with a few threads (a few microseconds), so splitting pays.
Optimizer and user annotations (record_function spans, `Optimizer.step#...`) are Python around
the ops, not op work, and are left out.

Measured on the project's VM (bench/bench_threads.py, one thread per op before): ops of 1-15 ms
(wide MLP, convolutions, an LSTM, a Transformer layer) fill 94-97% of the step; a 64-wide MLP's
ops last 1-9 us and fill none of it.
"""

from __future__ import annotations

from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.hostops import op_self_times
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

SPLIT_MIN_US = 50.0


def thread_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = {"threads.splittable_share": None}
    total = float(steps.duration.sum())
    if k.platform != "cpu" or total <= 0:
        return out
    _, aten, own = op_self_times(t, k, steps)     # Python frames (with_stack) hold no aten op
    out["threads.splittable_share"] = float(own[aten & (own >= SPLIT_MIN_US)].sum()) / total
    return out
