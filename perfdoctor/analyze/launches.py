"""Kernel launch delay and launch queue depth (HTA's kernel launch statistics and queue length).

For every runtime call that launched device work inside the analysed steps:
- launch delay: start of the first device work it launched minus the end of the call (HTA's
  `launch_delay`: how long the work waited on the device after the host handed it over);
- queue depth: device work launched before the call but not started when it began (kernels,
  copies and memsets queued on the device, all streams), sampled at each launch.
Both are summarised as p50/p90/max (and the mean).

Device work cannot start before the call that launched it began. Where it does in more than
CLOCK_SHARE of the launches (by more than CLOCK_SKEW_US: CUPTI's host/device clock conversion;
on 23 real traces, HTA's, torch-tb-profiler's and H100 runs, none did), the trace's clocks
disagree (host and device clocks out of sync, or timestamps rewritten: negated ones put every
kernel before its launch) and the figures that set host time against device time are not to be
trusted: clock_warning says so.
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


CLOCK_SKEW_US = 1.0
CLOCK_SHARE = 0.05


def clock_check(t: EventTable, k: Kinds) -> tuple[float | None, float]:
    """(trace.clock_early_share, how long before its call the earliest work started, in us): the
    share of the trace's linked launches whose device work started more than CLOCK_SKEW_US before
    the call began (see the module docstring); None on the CPU or without linked launches."""
    if k.platform == "cpu":
        return None, 0.0
    dev, launch = device_launch_index(t, k)
    ok = launch >= 0
    if not ok.any():
        return None, 0.0
    early = t.ts[launch[ok]] - t.ts[dev[ok]]           # how long before the call began the work did
    return float(np.mean(early > CLOCK_SKEW_US)), float(max(early.max(), 0.0))


def clock_warning(share: float | None, early_us: float) -> str | None:
    """The warning for a trace whose clocks disagree (share over CLOCK_SHARE), else None."""
    if share is None or share <= CLOCK_SHARE:
        return None
    return (f"device work starts before the call that launched it in {share:.0%} of the launches (by up to "
            f"{early_us / 1e3:,.1f} ms): the trace's host and device clocks disagree, so the shares that set "
            "host time against device time (idle gaps, overlap, the verdict) may be wrong")


def _summary(x: np.ndarray) -> dict:
    s = np.sort(x)
    return {"p50": _quantile(s, 0.5), "p90": _quantile(s, 0.9), "max": float(s[-1]), "mean": float(s.mean())}


def _quantile(s: np.ndarray, q: float) -> float:
    """As arrays.percentile (numpy's linear method) on an already sorted array, without sorting it again."""
    pos = q * (len(s) - 1)
    lo = int(np.floor(pos))
    return percentile(s[[lo, min(lo + 1, len(s) - 1)]], 100 * (pos - lo))
