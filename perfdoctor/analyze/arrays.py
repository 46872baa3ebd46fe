"""numpy helpers that keep the analysis off numpy.ma.

In numpy 2, np.unique, np.median, np.percentile and np.isin (sort path) import numpy.ma on first use (for a
masked-array check perfdoctor never needs): 20 ms on a cold start, a tenth of a whole analysis.
These give the same values on the plain, NaN-free arrays the analysis passes them.
"""

from __future__ import annotations

import math

import numpy as np


def unique(a) -> np.ndarray:
    """Sorted distinct values, as np.unique."""
    a = np.sort(np.asarray(a).ravel())
    if len(a) < 2:
        return a
    keep = np.empty(len(a), bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def isin(values, candidates) -> np.ndarray:
    """Boolean per value: is it among `candidates`? (as np.isin)"""
    values = np.asarray(values)
    c = unique(candidates)
    if len(c) == 0:
        return np.zeros(values.shape, bool)
    i = np.minimum(np.searchsorted(c, values), len(c) - 1)
    return c[i] == values


def median(a) -> float:
    """As np.median: the middle value, or the mean of the two middle values."""
    s = np.sort(np.asarray(a, np.float64).ravel())
    n = len(s)
    if n == 0:
        return math.nan
    mid = n // 2
    return float(s[mid]) if n % 2 else float(np.mean(s[mid - 1:mid + 1]))


def percentile(a, q: float) -> float:
    """As np.percentile(a, q) with its default (linear) method."""
    s = np.sort(np.asarray(a, np.float64).ravel())
    n = len(s)
    if n == 0:
        return math.nan
    pos = q / 100 * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    t = pos - lo
    x, y = float(s[lo]), float(s[hi])
    diff = y - x
    return x + diff * t if t < 0.5 else y - diff * (1 - t)   # numpy's _lerp, for the same bits
