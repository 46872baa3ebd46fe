"""Caching-allocator activity: malloc/free in steady state and reserved memory over time.

The caching allocator should stop calling cudaMalloc/cudaFree once warm; calls in steady-state
steps, or reserved memory ([memory] events, `Total Reserved`) falling (and rising again), mean it
keeps returning memory to the driver and asking again (fragmentation / varying shapes, or
empty_cache). Reserved memory that only grows is the allocator warming up to a new largest shape.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.kinds import FREE_RX, MALLOC_RX, Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

DEVICE_TYPE_CPU = 0


def memory_metrics(t: EventTable, k: Kinds, steps: Steps) -> tuple[dict, dict]:
    steady = steps.steady()
    n = len(steady)
    in_steady = isin(steps.of_events(t), steady)
    steady_time = float(steps.duration[steady].sum())
    mal = k.runtime & t.name_mask(lambda s: MALLOC_RX.match(s) is not None) & in_steady
    fre = k.runtime & t.name_mask(lambda s: FREE_RX.match(s) is not None) & in_steady
    out: dict = {"memory.malloc_per_step": int(mal.sum()) / n if n else None,
                 "memory.free_per_step": int(fre.sum()) / n if n else None,
                 "memory.alloc_api_share": float(t.dur[mal | fre].sum()) / steady_time if steady_time else None}
    mem = np.flatnonzero(k.memory)
    out["memory.events"] = len(mem)
    dev_mem = mem[(t.args["device_type"][mem] != DEVICE_TYPE_CPU) & ~np.isnan(t.args["device_type"][mem])]
    reserved = t.args["total_reserved"][dev_mem]
    has = ~np.isnan(reserved)
    series: dict = {}
    if not has.any():
        out.update({"memory.peak_reserved_bytes": None, "memory.peak_allocated_bytes": None,
                    "memory.reserved_swing": None, "memory.reserved_changes_per_step": None,
                    "memory.peak_reserved_fraction": None, "memory.used_fraction_peak": None})
        return out, series
    rows = dev_mem[has]
    rows = rows[np.argsort(t.ts[rows], kind="stable")]
    res, alloc = t.args["total_reserved"][rows], t.args["total_allocated"][rows]
    out["memory.peak_reserved_bytes"] = float(res.max())
    out["memory.peak_allocated_bytes"] = float(np.nanmax(alloc)) if (~np.isnan(alloc)).any() else None
    st = in_steady[rows]
    if st.sum() >= 2:
        r = res[st]
        out["memory.reserved_swing"] = reserved_swing(r)
        out["memory.reserved_changes_per_step"] = int((np.diff(r) != 0).sum()) / n
    else:
        out["memory.reserved_swing"] = None
        out["memory.reserved_changes_per_step"] = None
    out["memory.peak_reserved_fraction"] = _fraction_of_device(t, rows, res)
    out["memory.used_fraction_peak"] = out["memory.peak_reserved_fraction"]
    series = _downsample(t.ts[rows] - steps.start[0], res, alloc)
    return out, series


def used_fraction(m: dict) -> dict:
    """memory.used_fraction_peak of a `perfdoctor run`: the trace's peak reserved fraction where it
    recorded memory, else NVML's peak used on the run's devices, which counts the CUDA context and
    any other process too: at least what the allocator reserved. An upper bound, so a rule may
    read headroom from it (under half in use), never pressure (a run recorded without --memory had
    left the larger-batch advice unknown on four host-bound H100 runs using 2-4% of the device)."""
    reserved = m.get("memory.peak_reserved_fraction")
    return {"memory.used_fraction_peak": reserved if reserved is not None else m.get("gpu.memory_used_fraction_peak")}


def reserved_swing(reserved: np.ndarray) -> float:
    """The deepest fall of reserved memory below its running peak, relative to the peak: memory
    the allocator gave back (cudaFree, empty_cache) and, where it rose again, asked for anew.
    Growth alone is 0: a caching allocator that reserves once for a new largest shape (a new
    bucket, the first long batch) and keeps it is warming up, not thrashing."""
    if not len(reserved) or reserved.max() <= 0:
        return 0.0
    peak = np.maximum.accumulate(reserved)
    return float((peak - reserved).max() / reserved.max())


def _fraction_of_device(t: EventTable, rows: np.ndarray, res: np.ndarray) -> float | None:
    totals = {p.get("id"): p.get("totalGlobalMem") for p in t.meta.device_properties}
    best = None
    dev_ids = t.args["device_id"][rows]
    for d in unique(dev_ids[~np.isnan(dev_ids)]):
        mem = totals.get(int(d))
        if isinstance(mem, (int, float)) and mem > 0:
            frac = float(res[dev_ids == d].max()) / mem
            best = frac if best is None else max(best, frac)
    return best


def _downsample(ts: np.ndarray, res: np.ndarray, alloc: np.ndarray, points: int = 200) -> dict:
    """Reserved/allocated over time for reports: at most `points` samples, each bin of time at its
    first event's time with each series' largest value in the bin (its first value had been kept,
    so a peak between two kept events, the one that matters for running out, was not drawn)."""
    alloc = np.nan_to_num(alloc, nan=0.0)
    if len(ts) <= points:
        return {"t_ms": (ts / 1e3).round(3).tolist(), "reserved_bytes": res.tolist(), "allocated_bytes": alloc.tolist()}
    bins = np.linspace(ts[0], ts[-1], points + 1)
    b = np.clip(np.searchsorted(bins, ts, side="right") - 1, 0, points - 1)
    first = unique(np.searchsorted(b, np.arange(points)))
    first = first[first < len(ts)]                 # the first event of each bin that has one
    return {"t_ms": (ts[first] / 1e3).round(3).tolist(),
            "reserved_bytes": np.maximum.reduceat(res, first).tolist(),
            "allocated_bytes": np.maximum.reduceat(alloc, first).tolist()}
