"""Which host rows lie inside which, on one thread: containment, the outermost rows of a set,
and the kernels launched from inside a set of ops (by correlation to their launch calls)."""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import device_launch_index
from perfdoctor.trace.table import EventTable


def contained(t: EventTable, rows: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """Is each row inside one of `ops` on the same thread?"""
    res = np.zeros(len(rows), bool)
    if len(rows) == 0 or len(ops) == 0:
        return res
    for tid in unique(t.tid[rows]):
        r = rows[t.tid[rows] == tid]
        o = ops[t.tid[ops] == tid]
        if len(o) == 0:
            continue
        s, e = intervals.union(t.ts[o], t.ts[o] + t.dur[o])
        i = np.searchsorted(s, t.ts[r], side="right") - 1
        ok = i >= 0
        ok[ok] = t.ts[r][ok] + t.dur[r][ok] <= e[i[ok]]
        res[np.flatnonzero(t.tid[rows] == tid)] = ok
    return res


def outermost(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """The rows not nested in an earlier row of the same thread, in time order per thread (a
    parent and its child may start on the same microsecond: the longer one comes first)."""
    keep = []
    for tid in unique(t.tid[rows]) if len(rows) else []:
        r = rows[t.tid[rows] == tid]
        r = r[np.lexsort((-t.dur[r], t.ts[r]))]
        end = t.ts[r] + t.dur[r]
        prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
        keep.append(r[t.ts[r] >= prev_end])
    return np.concatenate(keep) if keep else rows[:0]


def launches_inside(t: EventTable, k: Kinds, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel rows, their launch call rows) for the launch calls inside one of `ops` (same thread)."""
    dev, launch = device_launch_index(t, k)
    ok = (launch >= 0) & k.kernel[dev] if len(dev) else np.zeros(0, bool)
    dev, launch = dev[ok], launch[ok]
    inside = contained(t, launch, ops)
    return dev[inside], launch[inside]


def kernels_launched_inside(t: EventTable, k: Kinds, ops: np.ndarray) -> np.ndarray:
    """Kernel rows whose launch call lies inside one of `ops` (same thread)."""
    return launches_inside(t, k, ops)[0]


def self_time(t: EventTable, rows: np.ndarray, inner: np.ndarray | None = None) -> np.ndarray:
    """Each row's duration less that of the rows directly inside it (same thread): its own time,
    never below 0. Rows are taken as well nested (host ops are); a parent and a child that start
    on the same microsecond are told apart by length, as in outermost(), and where the length is
    the same too, the rows flagged `inner` (e.g. aten ops inside a wrapper span) are the child."""
    own = t.dur[rows].astype(np.float64)
    flag = np.zeros(len(rows), bool) if inner is None else inner
    for tid in unique(t.tid[rows]) if len(rows) else []:
        on = np.flatnonzero(t.tid[rows] == tid)
        on = on[np.lexsort((flag[on], -t.dur[rows[on]], t.ts[rows[on]]))]
        ts, dur = t.ts[rows[on]].tolist(), t.dur[rows[on]].tolist()
        stack: list[int] = []            # positions in `on` of the open ancestors
        for j in range(len(on)):
            while stack and ts[j] >= ts[stack[-1]] + dur[stack[-1]]:
                stack.pop()
            if stack:
                own[on[stack[-1]]] -= dur[j]
            stack.append(j)
    return np.maximum(own, 0.0)
