"""Several EventTables as one: the profiler windows of one process, joined in time order.

torch.profiler with `schedule(..., repeat=N)` (or repeat=0) and tensorboard_trace_handler writes
one file per active window of the same process, on the same clock: steps 2-5 in one, 8-11 in the
next. Analysed apart, each window is a few steps and the first (warming up) looks like the
slowest "trace"; joined, they are one trace of all the traced steps. Time between the windows
is no step's: every step-based measure ignores it.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.trace.assemble import codes_in
from perfdoctor.trace.columns import Interner
from perfdoctor.trace.table import EventTable, TraceMeta

_STRINGS = {"cat": "cats", "name": "names", "pid": "pids", "tid": "tids"}


def concat(tables: list[EventTable]) -> EventTable:
    """`tables` (in time order) as one table: each column's string codes mapped onto one list,
    extended in first-seen order; the first table's metadata, with every table's warnings."""
    if len(tables) == 1:
        return tables[0]
    interners = {k: Interner() for k in _STRINGS}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("ph", "ts", "dur", *_STRINGS)}
    args: dict[str, list[np.ndarray]] = {k: [] for k in tables[0].args}
    labels: dict = {}
    rows = 0
    for t in tables:
        for key, strings in _STRINGS.items():
            cols[key].append(codes_in(interners[key], getattr(t, strings))[getattr(t, key)])
        for key in ("ph", "ts", "dur"):
            cols[key].append(getattr(t, key))
        for key in args:
            args[key].append(t.args[key])
        for row, lab in (t.str_args.get("labels") or {}).items():
            labels[row + rows] = lab
        rows += len(t)
    first, last = tables[0].meta, tables[-1].meta
    meta = TraceMeta(path=first.path, device_properties=first.device_properties,
                     distributed_info=first.distributed_info, display_time_unit=first.display_time_unit,
                     warnings=list(dict.fromkeys(w for t in tables for w in t.meta.warnings)),
                     truncated=any(t.meta.truncated for t in tables),
                     n_flow_events=sum(t.meta.n_flow_events for t in tables), cut_s=last.cut_s,
                     base_time_ns=first.base_time_ns, notes=[n for t in tables for n in t.meta.notes],
                     windows=sum(t.meta.windows for t in tables),
                     input_shapes=any(t.meta.input_shapes for t in tables))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    return EventTable(ph=c["ph"], cat=c["cat"], name=c["name"], pid=c["pid"], tid=c["tid"], ts=c["ts"], dur=c["dur"],
                      args={k: np.concatenate(v) for k, v in args.items()},
                      cats=interners["cat"].values_list(), names=interners["name"].values_list(),
                      pids=interners["pid"].values_list(), tids=interners["tid"].values_list(),
                      meta=meta, str_args={"labels": labels})
