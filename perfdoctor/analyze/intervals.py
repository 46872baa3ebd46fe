"""Vectorised interval algebra on [start, end) arrays (microseconds).

The central tool is `Segments`: cut the time line at every start/end of every interval set of
interest, then ask per elementary segment which sets cover it. Priority breakdowns, unions,
overlaps and idle gaps all reduce to bincounts over those segments: O(n log n), no Python loops.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze import arrays


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals; returns sorted disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, len(s) - 1)
    return s[idx], run_end[last]


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = union(starts, ends)
    return float((e - s).sum())


def clip(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.maximum(starts, lo), np.minimum(ends, hi)
    keep = e > s
    return s[keep], e[keep]


class Segments:
    """Elementary segments of the time line between all given boundaries."""

    def __init__(self, *boundaries: np.ndarray):
        pts = arrays.unique(np.concatenate([np.asarray(b, np.float64).ravel() for b in boundaries]))
        self.points = pts
        self.start = pts[:-1]
        self.length = np.diff(pts)

    def __len__(self) -> int:
        return len(self.length)

    def covered(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Boolean per segment: is it inside any of the intervals? (their ends must be boundaries)"""
        n = len(self.points)
        if len(starts) == 0 or len(self) == 0:
            return np.zeros(len(self), bool)
        i0 = np.searchsorted(self.points, starts)
        i1 = np.searchsorted(self.points, ends)
        depth = np.cumsum(np.bincount(i0, minlength=n + 1) - np.bincount(i1, minlength=n + 1))
        return depth[: n - 1] > 0

    def assign(self, layers: list[np.ndarray], default: int) -> np.ndarray:
        """Priority assignment: first layer (in list order) whose mask covers a segment wins."""
        out = np.full(len(self), default, np.int64)
        for i in range(len(layers) - 1, -1, -1):
            out[layers[i]] = i
        return out
