"""Memory that grows step after step: the trainer's resident memory and the GPU's memory in use,
from `perfdoctor run`'s system samples (collect/samplers.py), over the steady steps.

A leak in a training loop is memory that every step adds and none gives back: a loss summed or
appended with its autograd graph (`total += loss` instead of `loss.item()`), outputs kept for
logging, a history list. It grows linearly with the steps until the process is killed or the
machine swaps; a batch-size search then finds less room each time. Memory that only warms up
(the caching allocator's first segments, the profiler's buffers) rises once and levels off.

growth(series, window, steps) fits memory against time by least squares over the samples of one
window, and calls the growth persistent when

- the window holds MIN_SAMPLES samples and MIN_STEPS steps (after its first WARM_FRACTION, where
  caches still fill),
- both halves of it grow, each at least HALF_RATE of the whole window's slope (one jump, a
  cache filling once, grows only one half), and
- the fitted growth over the window is at least MIN_GROWTH_BYTES: 64 MiB, the size of one glibc
  malloc arena on a 64-bit machine, the largest step a healthy process's resident memory takes
  at once (and many CUDA caching-allocator segments): less than that is not told from noise.

The window is the steady phase of analyze/windows.step_windows: after the profiled steps (the
profiler holds its events in the trainer's memory while it records, and frees them at once), or
all the steps without a trace. Memory is fitted against the steps ended by each sample's time, not
against time: a step keeps its bytes however long it took, and on a machine whose load comes and
goes the steps' pace changes inside the window (a time slope times the mean step measured 1.69 MiB
a step for 2 MiB kept each step, under a CI neighbour's load).

Metrics (None: the samples cannot tell; 0.0: measured, and no persistent growth):
  host.rss_growth_per_step_bytes   the trainer's resident memory (RSS)
  host.rss_growth_slowdown         of that growth, the second half's slope over the first's: ~1 for a
                                   leak, well under 1 for a cache filling up (PD225)
  host.rss_peak_bytes              the trainer's peak RSS over the run
  loader.workers_rss_growth_per_step_bytes  the DataLoader workers', each judged on its own
                                   samples and summed (a cache in the Dataset grows in every worker);
                                   0.0 without workers
  host.ram_runway_steps            steps until the machine's available RAM is gone at the trainer's
                                   and the workers' rates together
  gpu.memory_growth_per_step_bytes the GPUs' memory in use (NVML, summed over the devices the
                                   trainer uses; other processes on them count too)
  gpu.memory_runway_steps          steps until the device memory is full at that rate
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.system import our_pids, used_devices
from perfdoctor.analyze.windows import select, step_windows

MIN_SAMPLES = 8
MIN_STEPS = 20
WARM_FRACTION = 0.1
HALF_RATE = 0.3
MIN_GROWTH_BYTES = 64 * 2 ** 20

NAMES = ("host.rss_growth_per_step_bytes", "host.rss_growth_slowdown", "host.rss_peak_bytes",
         "host.ram_runway_steps", "loader.workers_rss_growth_per_step_bytes",
         "gpu.memory_growth_per_step_bytes", "gpu.memory_runway_steps")


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    t = t - t.mean()
    d = float(np.dot(t, t))
    return float(np.dot(t, y - y.mean()) / d) if d > 0 else 0.0


def growth_rate(points: list[tuple[float, float]]) -> float | None:
    """Bytes per unit of x (a step, a second) of persistent growth over (x, bytes) points; 0.0 when
    the memory does not grow for good; None with fewer than MIN_SAMPLES points."""
    return growth(points)[0]


def growth_slowdown(points: list[tuple[float, float]]) -> float | None:
    """Of a persistent growth, the second half's slope over the first's: ~1 for a leak, which
    keeps its pace; well under 1 for a cache filling towards its size (a user's detection loop,
    new padded shapes each step: 2.2 then 0.9 MiB a step, flat from ~375 of 500 steps); None
    without persistent growth."""
    return growth(points)[1]


def growth(points: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(growth_rate, growth_slowdown) of (x, bytes) points, from one fit."""
    pts = sorted(p for p in points if p[1] is not None)
    if len(pts) < MIN_SAMPLES:
        return None, None
    t = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    whole = _slope(t, y)
    if whole <= 0 or whole * (t[-1] - t[0]) < MIN_GROWTH_BYTES:
        return 0.0, None
    mid = len(t) // 2
    first, second = _slope(t[:mid + 1], y[:mid + 1]), _slope(t[mid:], y[mid:])
    if min(first, second) < HALF_RATE * whole:
        return 0.0, None
    return whole, second / first


def _window(samples: list[dict], steps: list[dict]) -> tuple[list[dict], np.ndarray | None]:
    """The steady window's samples past its warm-up part, and the steps' end times (sorted), by
    which each sample's time becomes the count of steps ended by then."""
    win = step_windows(steps).get("steady")
    if win is None:
        return [], None
    lo, hi = win
    lo += WARM_FRACTION * (hi - lo)
    ends = np.sort([s["end"] for s in steps if isinstance(s.get("end"), (int, float))])
    if int(((ends > lo) & (ends <= hi)).sum()) < MIN_STEPS or hi <= lo:
        return [], None
    return select(samples, (lo, hi)), ends


def _at_steps(points: list[tuple[float, float]], ends: np.ndarray) -> list[tuple[float, float]]:
    """(time, bytes) points as (steps ended by that time, bytes)."""
    return [(float(np.searchsorted(ends, t, side="right")), y) for t, y in points]


def _gpu_points(picked: list[dict], ours: set[int]) -> tuple[list[tuple[float, float]], float | None]:
    """(time, memory in use summed over the trainer's devices) and the free memory at the end."""
    used = used_devices(picked, ours)
    pts, free = [], None
    for s in picked:
        devs = [d for d in (s.get("gpu") or []) if (d["index"] in used if used else True)]
        vals = [d.get("memory_used_bytes") for d in devs]
        if devs and all(v is not None for v in vals):
            pts.append((s["unix"], float(sum(vals))))
            tot = [d.get("memory_total_bytes") for d in devs]
            free = float(sum(tot)) - pts[-1][1] if all(x for x in tot) else None
    return pts, free


def _runway(per_step: float | None, room: float | None) -> float | None:
    return float(room / per_step) if per_step and room is not None and room > 0 else None


def _workers_growth(picked: list[dict], ends: np.ndarray) -> float | None:
    """The DataLoader workers' persistent growth per step, summed over the workers (each judged
    on its own samples: a worker restarted every epoch lives too short to be judged, and a
    cache of the samples it read grows in each worker). 0.0 when the steps ran without workers
    (num_workers=0: no worker memory to grow); None when the workers lived too short to judge."""
    series: dict = {}
    for s in picked:
        for w in s.get("workers") or []:
            series.setdefault((w.get("pid"), w.get("create_time")), []).append((s["unix"], w.get("rss_bytes") or None))
    if not series:
        return 0.0
    rates = [growth_rate(_at_steps(pts, ends)) for pts in series.values()]
    return sum(r for r in rates if r) if any(r is not None for r in rates) else None


def memory_growth(samples: list[dict], steps: list[dict]) -> dict:
    out = dict.fromkeys(NAMES)
    rss = [s["trainer"]["rss_bytes"] for s in samples if (s.get("trainer") or {}).get("rss_bytes")]
    out["host.rss_peak_bytes"] = int(max(rss)) if rss else None
    picked, ends = _window(samples, steps)
    if not picked:
        return out
    host = [(s["unix"], (s.get("trainer") or {}).get("rss_bytes") or None) for s in picked]   # 0: exiting
    per, out["host.rss_growth_slowdown"] = growth(_at_steps(host, ends))
    out["host.rss_growth_per_step_bytes"] = per
    wper = _workers_growth(picked, ends)
    out["loader.workers_rss_growth_per_step_bytes"] = wper
    avail = [v for s in picked if (v := (s.get("system") or {}).get("ram_available_bytes"))]
    both = None if per is None and wper is None else (per or 0.0) + (wper or 0.0)
    out["host.ram_runway_steps"] = _runway(both, avail[-1] if avail else None)
    pts, free = _gpu_points(picked, our_pids(samples))
    gper = growth_rate(_at_steps(pts, ends))
    out["gpu.memory_growth_per_step_bytes"] = gper
    out["gpu.memory_runway_steps"] = _runway(gper, free)
    return out
