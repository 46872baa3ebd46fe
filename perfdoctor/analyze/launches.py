"""Kernel launch delay and launch queue depth (HTA's kernel launch statistics and queue length).

For every runtime call that launched device work inside the analysed steps:
- launch delay: start of the first device work it launched minus the end of the call (HTA's
  `launch_delay`: how long the work waited on the device after the host handed it over);
- queue depth: device work launched before the call but not started when it began (kernels,
  copies and memsets queued on the device, all streams), sampled at each launch.
Both are summarised as p50/p90/max (and the mean).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import percentile
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable


def launch_stats(t: EventTable, k: Kinds, steps: Steps) -> dict | None:
    """{"launches": n, "delay_us": {...}, "queue_depth": {...}}, or None without linked launches."""
    lo, hi = steps.span
    dev, launch = device_launch_index(t, k)
    ok = (launch >= 0)
    ok[ok] = (t.ts[launch[ok]] >= lo) & (t.ts[launch[ok]] < hi)
    dev, launch = dev[ok], launch[ok]
    if not len(dev):
        return None
    order = np.argsort(launch, kind="stable")
    dev, launch = dev[order], launch[order]
    first = np.ones(len(launch), bool)
    first[1:] = launch[1:] != launch[:-1]
    starts = np.flatnonzero(first)
    calls = launch[starts]
    dev_ts = t.ts[dev]
    begin = np.minimum.reduceat(dev_ts, starts)   # the first device work of each call (graphs: many)
    delay = begin - (t.ts[calls] + t.dur[calls])
    at = t.ts[calls]
    launched = np.sort(t.ts[launch])
    started = np.sort(dev_ts)
    depth = np.searchsorted(launched, at, side="left") - np.searchsorted(started, at, side="right")
    return {"launches": int(len(calls)), "delay_us": _summary(delay),
            "queue_depth": _summary(np.maximum(depth, 0).astype(np.float64))}


def _summary(x: np.ndarray) -> dict:
    s = np.sort(x)
    return {"p50": _quantile(s, 0.5), "p90": _quantile(s, 0.9), "max": float(s[-1]), "mean": float(s.mean())}


def _quantile(s: np.ndarray, q: float) -> float:
    """As arrays.percentile (numpy's linear method) on an already sorted array, without sorting it again."""
    pos = q * (len(s) - 1)
    lo = int(np.floor(pos))
    return percentile(s[[lo, min(lo + 1, len(s) - 1)]], 100 * (pos - lo))
