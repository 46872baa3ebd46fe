"""Host-device synchronisation and host-to-device copy metrics.

A sync point is a blocking runtime call (cudaStreamSynchronize, cudaDeviceSynchronize,
cudaEventSynchronize, blocking cudaMemcpy, their HIP twins) or a device-to-host copy issued by
aten::item / aten::_local_scalar_dense / aten::nonzero (a Python-visible scalar read). A sync
call made inside such an op counts once, with its copy. Only the calls inside a step's host range
count: a cudaDeviceSynchronize after the last ProfilerStep (a timing call, the profiler's stop)
waits for the last step's device work, but no step makes it.

What a sync costs is not the host time it blocks: while the host waits, the device runs the work
already queued, and a host waiting for a busy device loses nothing. It costs the device idle it
exposes: the device runs out of queued work while the host waits, and stays idle until the host,
released, queues the next kernels (sync.exposed_idle_share). That idle is counted from the gap's
start to its end, across a step boundary too, less the part that other fixes claim: the host
waiting for a batch (the input pipeline's) and the allocator calls of memory.alloc_idle_share.

What the host-to-device copies carry (memcpy.h2d_float_share, memcpy.h2d_uint8_share): the
type of each HtoD copy's source tensor.

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

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.kinds import SYNC_RUNTIME_RX, Kinds
from perfdoctor.analyze.nesting import contained, parents, start_order
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.analyze.timeline import Timeline
from perfdoctor.trace.schema import TENSOR_TYPES
from perfdoctor.trace.table import EventTable

SCALAR_OP_RX = re.compile(r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero)$")
FLOAT = [TENSOR_TYPES.index(n) for n in ("float32", "float64")]
EIGHT_BIT = [TENSOR_TYPES.index(n) for n in ("uint8", "int8", "bool")]
MIN_KNOWN = 0.5      # of the HtoD copy time whose source type is known, for either share to be known


def host_metrics(t: EventTable, k: Kinds, steps: Steps, tl: Timeline, claimed: np.ndarray | None = None) -> dict:
    """`claimed`: the timeline segments whose device idle another fix claims (allocator calls)."""
    n, total = len(steps), float(steps.duration.sum())
    end = t.ts + t.dur
    sync_rows = np.flatnonzero(k.runtime & t.name_mask(lambda s: SYNC_RUNTIME_RX.match(s) is not None))
    sync_rows = sync_rows[steps.in_host_range(t.ts[sync_rows])]
    dev, launch = device_launch_index(t, k)
    dtoh = k.memcpy[dev] & (launch >= 0) & t.name_mask(lambda s: "DtoH" in s)[dev]
    dtoh_launch = launch[dtoh]
    dtoh_launch = dtoh_launch[steps.in_host_range(t.ts[dtoh_launch])]
    scalar_ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda s: SCALAR_OP_RX.match(s) is not None))
    in_scalar = contained(t, dtoh_launch, scalar_ops)
    scalar_launches = dtoh_launch[in_scalar]
    # Syncs inside scalar ops that already issued a DtoH copy are the same sync point.
    sync_in_scalar = contained(t, sync_rows, scalar_ops) if len(scalar_launches) else np.zeros(len(sync_rows), bool)
    n_sync = len(scalar_launches) + int((~sync_in_scalar).sum())
    blocking = np.concatenate([sync_rows, scalar_launches])
    s, e = intervals.clip(t.ts[blocking], end[blocking], *steps.span)
    # blocking copy calls (cudaMemcpy, hipMemcpyWithStream: a .to(device) without non_blocking on
    # ROCm) that carry a host-to-device copy: the host waits to send data, not to read a value
    h2d = (k.memcpy[dev] & (launch >= 0)) & t.name_mask(lambda name: "HtoD" in name)[dev]
    sends = sync_rows[t.name_mask(lambda name: name.endswith(("Memcpy", "MemcpyWithStream")))[sync_rows]
                      & isin(sync_rows, launch[h2d])]
    hs, he = intervals.clip(t.ts[sends], end[sends], *steps.span)
    out = {"sync.per_step": n_sync / n, "sync.share": intervals.total(s, e) / total,
           "sync.scalar_dtoh_per_step": len(scalar_launches) / n,
           "sync.exposed_idle_share": exposed_idle(tl, s, e, claimed) / total,
           "sync.h2d_copy_per_step": len(sends) / n,
           "sync.h2d_copy_exposed_idle_share": exposed_idle(tl, hs, he, claimed) / total}
    out.update(_copies(t, k, steps, total, tl))
    out.update(copy_type_metrics(t, k, steps))
    return out


def exposed_idle(tl: Timeline, s: np.ndarray, e: np.ndarray, claimed: np.ndarray | None = None) -> float:
    """Device idle (us, inside steps) in the idle stretches that begin while the host is blocked in
    one of the calls [s, e) and outlast it, less the host's data waits and `claimed` segments."""
    # a stretch: adjacent idle segments, across step boundaries and the host's gaps between steps
    idx = np.flatnonzero(~tl.cover["device"])
    if not len(idx) or not len(s):
        return 0.0
    new = np.ones(len(idx), bool)
    new[1:] = np.diff(idx) != 1
    gid = np.cumsum(new) - 1
    g_start = tl.seg.start[idx[new]]
    g_end = g_start + np.bincount(gid, weights=tl.seg.length[idx])
    s, e = intervals.union(s, e)            # disjoint blocked stretches, sorted
    j = np.maximum(np.searchsorted(s, g_start, side="right") - 1, 0)
    exposed = (s[j] <= g_start) & (g_start <= e[j]) & (g_end > e[j])
    keep = exposed[gid] & (tl.step_of[idx] >= 0) & ~tl.cover["data_loading"][idx]
    if claimed is not None:
        keep &= ~claimed[idx]
    return float(tl.seg.length[idx][keep].sum())


def _copies(t: EventTable, k: Kinds, steps: Steps, total: float, tl: Timeline) -> dict:
    rows = steps.inside(t, np.flatnonzero(k.memcpy))
    h2d = t.name_mask(lambda s: "HtoD" in s)[rows]
    pageable = h2d & t.name_mask(lambda s: "Pageable" in s)[rows]
    # copy time no kernel runs beside: the copies serialise with compute (one stream), so the
    # step waits for them on the device (a side stream's prefetch would run them beside kernels)
    s, e = intervals.clip(t.ts[rows[h2d]], (t.ts + t.dur)[rows[h2d]], *steps.span)
    alone = tl.seg.covered(s, e) & ~tl.cover["compute"] if len(s) else np.zeros(len(tl.seg), bool)
    return {"memcpy.pageable_h2d_per_step": int(pageable.sum()) / len(steps),
            "memcpy.pageable_h2d_share": float(t.dur[rows[pageable]].sum()) / total,
            "memcpy.h2d_share": float(t.dur[rows[h2d]].sum()) / total,
            "memcpy.h2d_alone_share": tl.total(alone) / total}


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
