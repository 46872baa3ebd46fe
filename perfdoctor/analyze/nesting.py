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
        r = r[start_order(t.ts[r], t.dur[r])]
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


def self_time(t: EventTable, rows: np.ndarray, inner: np.ndarray | None = None,
              dur: np.ndarray | None = None) -> np.ndarray:
    """Each row's duration less that of the rows directly inside it (same thread): its own time,
    never below 0. Rows are taken as well nested (host ops are); a parent and a child that start
    on the same microsecond are told apart by length, as in outermost(), and where the length is
    the same too, the rows flagged `inner` (e.g. aten ops inside a wrapper span) are the child.
    `dur`: the rows' durations to use (one per row: cut at a window's end), else the trace's."""
    d = (t.dur[rows] if dur is None else dur).astype(np.float64)
    own = d.copy()
    flag = np.zeros(len(rows), bool) if inner is None else inner
    for tid in unique(t.tid[rows]) if len(rows) else []:
        on = np.flatnonzero(t.tid[rows] == tid)
        on = on[start_order(t.ts[rows[on]], t.dur[rows[on]], flag[on])]
        parent = parents(t.ts[rows[on]].astype(np.float64), t.dur[rows[on]].astype(np.float64))
        child = np.flatnonzero(parent >= 0)
        np.subtract.at(own, on[parent[child]], d[on[child]])
    return np.maximum(own, 0.0)


def start_order(ts: np.ndarray, dur: np.ndarray, inner: np.ndarray | None = None) -> np.ndarray:
    """The permutation that puts intervals in start order, an enclosing one first where two start
    together (the longer; at equal length the one not flagged `inner`). As np.lexsort((inner,
    -dur, ts)), but it sorts by start alone and re-sorts only the tied rows: three full sorts of
    millions of rows took seconds."""
    order = np.argsort(ts, kind="stable")
    s = ts[order]
    same = s[1:] == s[:-1]
    if not same.any():
        return order
    tied = np.zeros(len(s), bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)
    group = np.cumsum(np.concatenate([[True], ~same]))[at]      # one id per start time
    sub = order[at]
    keys = (-dur[sub], group) if inner is None else (inner[sub], -dur[sub], group)
    order[at] = sub[np.lexsort(keys)]
    return order


def parents(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """For intervals in start order (an enclosing one before its child on a tie), the position of
    each one's innermost enclosing interval, -1 for none. Without a Python loop (a 2 GB trace holds
    millions of ops): an interval is open from its start until the first later one that starts at
    or after its end; an interval's depth is how many earlier ones are open at its start, and its
    parent is the last earlier interval one level up (well nested: a later one at that level
    would be inside the parent, one level deeper)."""
    n = len(ts)
    pos = np.arange(n)
    closes = np.maximum(np.searchsorted(ts, ts + dur, side="left"), pos + 1)
    depth = pos - np.searchsorted(np.sort(closes), pos, side="right")
    key = depth * n + pos                              # depth first, then position
    sorted_key = np.sort(key)
    want = (depth - 1) * n + pos                       # the level above, before this position
    i = np.searchsorted(sorted_key, want, side="left") - 1
    ok = (depth > 0) & (i >= 0)
    found = sorted_key[np.maximum(i, 0)]
    ok &= found >= (depth - 1) * n                     # still on the level above
    return np.where(ok, found % max(n, 1), -1)
