"""Host-device synchronisation and host-to-device copy metrics.

A sync point is a blocking runtime call (cudaStreamSynchronize, cudaDeviceSynchronize,
cudaEventSynchronize, blocking cudaMemcpy, their HIP twins) or a device-to-host copy issued by
aten::item / aten::_local_scalar_dense / aten::nonzero (a Python-visible scalar read). A sync
call made inside such an op counts once, with its copy. Only the calls inside a step's host range
count: a cudaDeviceSynchronize after the last ProfilerStep (a timing call, the profiler's stop)
waits for the last step's device work, but no step makes it.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.kinds import SYNC_RUNTIME_RX, Kinds
from perfdoctor.analyze.nesting import contained
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

SCALAR_OP_RX = re.compile(r"^aten::(item|_local_scalar_dense|nonzero|is_nonzero)$")


def host_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
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
    out = {"sync.per_step": n_sync / n, "sync.share": intervals.total(s, e) / total,
           "sync.scalar_dtoh_per_step": len(scalar_launches) / n}
    out.update(_copies(t, k, steps, total))
    return out


def _copies(t: EventTable, k: Kinds, steps: Steps, total: float) -> dict:
    rows = np.flatnonzero(k.memcpy)
    rows = rows[steps.index_of(t.ts[rows]) >= 0]
    h2d = t.name_mask(lambda s: "HtoD" in s)[rows]
    pageable = h2d & t.name_mask(lambda s: "Pageable" in s)[rows]
    return {"memcpy.pageable_h2d_per_step": int(pageable.sum()) / len(steps),
            "memcpy.pageable_h2d_share": float(t.dur[rows[pageable]].sum()) / total,
            "memcpy.h2d_share": float(t.dur[rows[h2d]].sum()) / total}
