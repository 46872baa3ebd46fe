"""What the pictures of a report need from the analysis: one representative step as lanes of
intervals, and each step's dominant share.

Pure functions of the analysed time line (timeline.py), so the renderers (report/html.py,
report/annotate.py) only draw what was measured:
- `representative_step`: the traced step whose duration is closest to the traced steps' median
  (the one the report shows), the first (warm-up) left out: a typical step, neither the warm-up
  nor an outlier (every step still counts in the metrics);
- `step_view`: that step's breakdown role over time (run-length merged), the device's busy
  intervals (not on CPU-only traces) and the host's activity (HOST_LANE order: gaps.py's
  HOST_ACTIVITY with the host's own collectives, gloo's, before its other ops);
  runs shorter than a `MIN_RUN_FRACTION` of the step are drawn, where several follow each other,
  as the value holding most of their time, and alone join the run before them (device idle
  gaps that short are closed), so the view stays small whatever the trace size;
- `step_dominant`: per step, the largest of the four verdict shares (device, input, host,
  communication), computed as analyze/pipeline.verdict_shares does for the whole trace, and
  under DataParallel as replicas.replica_shares does: the device share is the mean per-device
  busy time of the step, the replicas' idle beyond it is host. The view's device lane stays the
  union of the devices' busy intervals (when some device works).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.gaps import HOST_ACTIVITY
from perfdoctor.analyze.steps import Steps
from perfdoctor.analyze.timeline import BREAKDOWN, Timeline

MIN_RUN_FRACTION = 1 / 1500      # shorter runs are invisible at any screen width
MAX_RUNS = 1500                  # per lane, after merging
HOST_LANE = HOST_ACTIVITY[:3] + ("communication",) + HOST_ACTIVITY[3:]


def representative_step(steps: Steps) -> int:
    """The traced step closest to the median of all traced steps (steps.time_median_ms, which the
    report shows), the first left out where there are others (a warm-up): the median of the rest
    had picked a step 145 ms under a header's "median traced step 135.9 ms" that another step had."""
    idx = steps.steady()
    d = steps.duration[idx]
    return int(idx[int(np.argmin(np.abs(d - median(steps.duration))))])


def _runs(start: np.ndarray, length: np.ndarray, value: np.ndarray, lo: float, min_len: float) -> list[list]:
    """Run-length merge of per-segment values (contiguous segments): [[offset_ms, duration_ms,
    value], ...]. Runs of min_len or longer stay as they are; consecutive shorter ones form a
    cluster drawn as one run of the value that holds most of its time (a step of a hundred
    thousand small ops with a little Python between each is drawn as ops, not as the first
    run's value: every short run once joined the run before it, and an LBFGS step 82% in ops
    was drawn all "other"); a cluster shorter than min_len joins the run before it (or, first
    in the step, the run after it)."""
    if len(start) == 0:
        return []
    new = np.ones(len(start), bool)
    new[1:] = value[1:] != value[:-1]
    first = np.flatnonzero(new)
    ends = np.append(start[first[1:]], start[-1] + length[-1])
    out: list[list] = []
    cluster: dict = {}            # a cluster of short runs: value -> time
    c0 = c1 = 0.0

    def close() -> None:
        if not cluster:
            return
        v = max(cluster, key=cluster.get)
        if c1 - c0 >= min_len or not out:
            out.append([c0, c1 - c0, v])
        else:
            out[-1][1] = c1 - out[-1][0]
        cluster.clear()

    for s, e, v in zip(start[first].tolist(), ends.tolist(), value[first].tolist()):
        if e - s < min_len:
            if not cluster:
                c0 = s
            cluster[v] = cluster.get(v, 0.0) + (e - s)
            c1 = e
            continue
        close()
        out.append([s, e - s, v])
    close()
    merged: list[list] = []
    for s, n, v in out:
        if merged and merged[-1][2] == v:
            merged[-1][1] = s + n - merged[-1][0]
        elif len(merged) == 1 and merged[0][1] < min_len:   # a first cluster too short to show
            merged[0] = [merged[0][0], s + n - merged[0][0], v]
        else:
            merged.append([s, n, v])
    return [[(s - lo) / 1e3, n / 1e3, v] for s, n, v in merged[:MAX_RUNS]]


def _busy(start: np.ndarray, length: np.ndarray, busy: np.ndarray, lo: float, min_gap: float) -> list[list]:
    """Busy intervals [[offset_ms, duration_ms], ...]; idle gaps shorter than min_gap are closed
    (however short, a busy interval is kept: a launch-bound step is short kernels far apart)."""
    out: list[list] = []
    for s, n, b in zip(start.tolist(), length.tolist(), busy.tolist()):
        if not b:
            continue
        if out and s - (out[-1][0] + out[-1][1]) < min_gap:
            out[-1][1] = s + n - out[-1][0]
        else:
            out.append([s, n])
    return [[(s - lo) / 1e3, n / 1e3] for s, n in out[:MAX_RUNS]]


def step_view(steps: Steps, tl: Timeline, platform: str, devices: int | None = None) -> dict:
    """The representative step as lanes: offsets and durations in ms from the step's start.
    devices: how many devices the process drove; above one, the view says its device lane is
    the union over them ("devices")."""
    i = representative_step(steps)
    lo, hi = float(steps.start[i]), float(steps.end[i])
    sel = np.flatnonzero(tl.step_of == i)
    start, length = tl.seg.start[sel], tl.seg.length[sel]
    min_len = (hi - lo) * MIN_RUN_FRACTION
    role = np.array(BREAKDOWN, dtype=object)[tl.role[sel]]
    cover = tl.cover
    if platform == "cpu":              # the host's collectives: all communication on a CPU run
        comm = cover["communication"]
    else:                              # gloo beside device collectives: the host part only
        comm = cover["communication"] & ~cover["comm_kernel"] if "comm_kernel" in cover else \
            np.zeros(len(tl.role), bool)
    layers = [cover["data_loading"][sel], cover["sync"][sel], cover["runtime"][sel], comm[sel], cover["cpu_exec"][sel]]
    host = np.full(len(sel), len(layers), np.int64)
    for j in range(len(layers) - 1, -1, -1):
        host[layers[j]] = j
    view = {"step": steps.labels[i], "index": i, "start_ms": (lo - float(steps.start[0])) / 1e3,
            "duration_ms": (hi - lo) / 1e3,
            "breakdown": _runs(start, length, role, lo, min_len),
            "host": _runs(start, length, np.array(HOST_LANE, dtype=object)[host], lo, min_len),
            "device": None}
    if platform != "cpu":
        busy = tl.cover["device"][sel]
        view["device"] = _busy(start, length, busy, lo, min_len)
        if (devices or 1) > 1:
            view["devices"] = int(devices)
    return view


def step_dominant(breakdown_ms: np.ndarray, platform: str,
                  device_ms: np.ndarray | None = None) -> list[tuple[str, float]]:
    """Per step (rows of the breakdown matrix, BREAKDOWN order): the largest verdict share.
    device_ms: per step, the mean per-device busy time under DataParallel (replicas.py), which
    replaces the union's device time; what the union holds beyond it moves to host."""
    b = {r: breakdown_ms[:, j] for j, r in enumerate(BREAKDOWN)}
    if platform == "cpu":
        device, host = b["cpu_exec"] + b["kernel"], b["runtime"] + b["other"]
    else:
        device = b["kernel"] + b["memcpy"] + b["memset"]
        host = b["runtime"] + b["cpu_exec"] + b["other"]
        if device_ms is not None:
            mean = np.minimum(device, device_ms)
            device, host = mean, host + (device - mean)
    shares = np.stack([device, b["data_loading"], host, b["communication"]], axis=1)
    tot = breakdown_ms.sum(axis=1)
    names = ("device", "input", "host", "communication")
    best = np.argmax(shares, axis=1)
    return [(names[j], float(shares[r, j] / tot[r]) if tot[r] > 0 else 0.0) for r, j in enumerate(best)]
