"""What the caching allocator costs the step: device idle time it exposes, and empty_cache calls.

Host time inside cudaMalloc/cudaFree is not step time: while the device still has queued work,
those calls overlap it. What the step loses is the time the *device* sits idle while the host is
in an allocator call (or in the synchronisation that releasing memory needs), so that is the
cost counted here (`memory.alloc_idle_share`).

`torch.cuda.empty_cache()` has a signature in a kineto trace: it is Python, not an aten op, so
the cudaFree calls it makes (after a device synchronisation) sit outside every CPU op, while
the allocator's own frees (an allocation retried after freeing the cache) sit inside the op
that allocated. Out-of-op cudaFree calls, grouped into bursts (calls closer than BURST_GAP_US
after the previous one ended), count as explicit empty_cache calls.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.nesting import contained
from perfdoctor.analyze.intervals import clip
from perfdoctor.analyze.kinds import FREE_RX, MALLOC_RX, SYNC_RUNTIME_RX, Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.analyze.timeline import Timeline
from perfdoctor.trace.table import EventTable

BURST_GAP_US = 1000.0


def allocator_metrics(t: EventTable, k: Kinds, steps: Steps, tl: Timeline) -> dict:
    out = {"memory.alloc_idle_share": None, "memory.empty_cache_per_step": None}
    total = float(steps.duration.sum())
    if k.platform == "cpu" or total <= 0:
        return out
    covered, outside = _claimed(t, k, steps, tl)
    out["memory.alloc_idle_share"] = tl.total(covered & ~tl.cover["device"]) / total
    if len(outside):
        order = np.argsort(t.ts[outside])
        start, end = t.ts[outside][order], (t.ts + t.dur)[outside][order]
        bursts = 1 + int((start[1:] - np.maximum.accumulate(end)[:-1] > BURST_GAP_US).sum())
    else:
        bursts = 0
    out["memory.empty_cache_per_step"] = bursts / len(steps)
    return out


def allocator_segments(t: EventTable, k: Kinds, steps: Steps, tl: Timeline) -> np.ndarray:
    """The timeline segments whose device idle memory.alloc_idle_share counts (the host in an
    allocator call, or in a loose synchronisation when empty_cache runs): no other fix claims it."""
    return _claimed(t, k, steps, tl)[0]


def _claimed(t: EventTable, k: Kinds, steps: Steps, tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(segments covered by the counted calls, the out-of-op cudaFree rows), once per trace."""
    cached = k.cache.get("allocator")
    if cached is not None and cached[0] is tl:
        return cached[1]
    lo, hi = steps.span
    in_span = (t.ts >= lo) & (t.ts < hi)
    alloc = k.runtime & in_span & t.name_mask(
        lambda n: MALLOC_RX.match(n) is not None or FREE_RX.match(n) is not None)
    frees = np.flatnonzero(k.runtime & in_span & t.name_mask(lambda n: FREE_RX.match(n) is not None))
    ops = np.flatnonzero(k.cpu_op)
    outside = frees[~contained(t, frees, ops)] if len(frees) and len(ops) else frees
    syncs = np.flatnonzero(k.runtime & in_span & t.name_mask(lambda n: SYNC_RUNTIME_RX.match(n) is not None))
    syncs = syncs[steps.in_host_range(t.ts[syncs])]      # a sync after the last step is no step's
    loose_syncs = syncs[~contained(t, syncs, ops)] if len(syncs) and len(ops) else syncs
    rows = np.concatenate([np.flatnonzero(alloc), loose_syncs if len(outside) else np.zeros(0, int)])
    covered = np.zeros(len(tl.seg), bool)
    if len(rows):
        s, e = clip(t.ts[rows], t.ts[rows] + t.dur[rows], lo, hi)
        covered = tl.seg.covered(s, e)
    k.cache["allocator"] = (tl, (covered, outside))
    return covered, outside
