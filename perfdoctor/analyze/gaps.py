"""Idle-device gaps inside steps, attributed HTA-style and by what the host was doing.

A gap is a maximal run of time inside one step with no kernel, copy or memset on any device.
Classification (after HTA's idle-time breakdown, with the threshold in microseconds):
- kernel wait: the gap is shorter than KERNEL_WAIT_US (back-to-back launch latency);
- host wait: the work that ends the gap was launched after the gap began (the CPU was late),
  or nothing follows in the step;
- other: the work was already launched before the gap began (waiting on a dependency).
Independently, idle time is split by the host's activity: data wait > sync > other runtime
calls > traced CPU ops > untraced. Untraced idle in stretches of LONG_UNTRACED_US or more is
counted apart: the Python between a model's ops lasts microseconds per op, so a millisecond with
no op, runtime call or data wait is the loop's own code (a checkpoint write, logging, batch
preparation), which compiling the model does not touch. So is idle time inside one runtime call
(not a sync) of LONG_UNTRACED_US or more: a launch costs microseconds, so a millisecond in
cudaMalloc/cudaFree, context creation or a first launch's module load is not per-op dispatch,
and graph replay does not remove it; nor idle time inside the host's collective calls, which a
loop issues outside the model; nor idle time inside an op's first call of a millisecond or more
that its later calls take a tenth of: one-time setup in the traced window (a library handle,
lazy initialisation, autotuning), which later steps do not pay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdoctor.analyze.arrays import isin, median
from perfdoctor.analyze.intervals import clip
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.analyze.timeline import Timeline
from perfdoctor.trace.table import EventTable

KERNEL_WAIT_US = 30.0
LONG_UNTRACED_US = 1000.0
TOP_GAPS = 5
HOST_ACTIVITY = ("data_wait", "sync", "runtime", "cpu_ops", "untraced")


@dataclass
class Gap:
    step: str
    offset_ms: float
    duration_ms: float
    kind: str              # host_wait | kernel_wait | other
    host_activity: str     # one of HOST_ACTIVITY
    host_event: str | None  # the traced host event overlapping the gap most


def idle_gaps(t: EventTable, k: Kinds, steps: Steps, tl: Timeline, top: int = TOP_GAPS) -> tuple[dict, list[Gap]]:
    """Idle-time metrics and the `top` longest gaps, longest first."""
    total = float(steps.duration.sum())
    idle = ~tl.cover["device"] & (tl.step_of >= 0)
    out = {"gpu.kernel_wait_threshold_us": KERNEL_WAIT_US, "gpu.idle_share": tl.total(idle) / total}
    # Host activity during idle time (priority as in HOST_ACTIVITY).
    layers = [tl.cover["data_loading"], tl.cover["sync"], tl.cover["runtime"], tl.cover["cpu_exec"]]
    host_role = tl.seg.assign(layers, default=len(layers))
    for i, name in enumerate(("data_wait", "sync", "runtime", "cpu_ops", "untraced")):
        key = {"data_wait": "gpu.idle_while_data_wait_share", "sync": "gpu.idle_while_sync_share",
               "runtime": "gpu.idle_while_runtime_share", "cpu_ops": "gpu.idle_while_cpu_ops_share",
               "untraced": "gpu.idle_while_untraced_share"}[name]
        out[key] = tl.total(idle & (host_role == i)) / total
    out["gpu.idle_while_long_untraced_share"] = _long_stretches(tl, idle & (host_role == len(layers))) / total
    # inside one call of a millisecond or more, not a run of short calls (several threads
    # launching one after another can cover a millisecond between them: dispatch all the same)
    long_rt = np.flatnonzero(k.runtime & (t.dur >= LONG_UNTRACED_US))
    inside = tl.seg.covered(*clip(t.ts[long_rt], t.ts[long_rt] + t.dur[long_rt], *steps.span))
    out["gpu.idle_while_long_runtime_share"] = tl.total(idle & (host_role == 2) & inside) / total
    # inside the host's collective calls (c10d::allreduce_, record_param_comms...), less what the
    # long runtime calls above hold: a loop that reduces its gradients by hand issues them outside
    # the model, so neither compiling it nor replaying it as a graph removes that idle (HTA's
    # df_index_resolver: 404 all_reduce calls a step after backward, the device idle 14% of the
    # step among them, which the graph-replay fix had counted)
    comm = np.flatnonzero(k.comm_op & k.complete)
    in_comm = tl.seg.covered(*clip(t.ts[comm], t.ts[comm] + t.dur[comm], *steps.span))
    out["gpu.idle_while_comm_op_share"] = tl.total(idle & in_comm & ~((host_role == 2) & inside)) / total
    # inside the first call of an op whose later calls take a tenth of it or less, less what the
    # long runtime calls and collectives above hold: one-time setup in the window (a cuBLAS handle,
    # lazy initialisation, autotuning), which no later step pays (a trace of 5 GEMMs found on
    # GitHub: the first aten::mm 2.14 ms, its repeats 24-39 us, 90% of the window)
    first, ratio = _first_calls(t, k)
    in_first = tl.seg.covered(*clip(t.ts[first], t.ts[first] + t.dur[first], *steps.span))
    out["gpu.idle_while_first_call_share"] = tl.total(idle & in_first & ~in_comm & ~((host_role == 2) & inside)) / total
    top_first = first[np.argmax(t.dur[first])] if len(first) else None
    out["gpu.first_call_op"] = t.names[t.name[top_first]] if top_first is not None else None
    out["gpu.first_call_repeat_ratio"] = ratio.get(int(top_first)) if top_first is not None else None

    # Merge idle segments into gaps (a new gap starts where the previous segment was not idle,
    # or at a step boundary).
    idx = np.flatnonzero(idle)
    if len(idx) == 0:
        out.update({"gpu.idle_host_wait_share": 0.0, "gpu.idle_kernel_wait_share": 0.0,
                    "gpu.idle_other_share": 0.0})
        return out, []
    new, gid, g_len = _runs(tl, idx)
    g_start = tl.seg.start[idx[new]]
    g_end = g_start + g_len
    g_step = tl.step_of[idx[new]]

    # What ends each gap: the first device activity starting at or after its end.
    dev, launch = device_launch_index(t, k)
    order = np.argsort(t.ts[dev], kind="stable")
    dev, launch = dev[order], launch[order]
    d_ts = t.ts[dev]
    nxt = np.searchsorted(d_ts, g_end - 1e-6)
    has_next = nxt < len(dev)
    nxt_c = np.minimum(nxt, max(len(dev) - 1, 0))
    in_step = has_next & (steps.index_of(d_ts[nxt_c]) == g_step) if len(dev) else has_next
    lrow = launch[nxt_c] if len(dev) else np.full(len(g_start), -1)
    launched_late = np.where(lrow >= 0, t.ts[np.maximum(lrow, 0)] >= g_start, False)
    kind = np.where(g_len <= KERNEL_WAIT_US, 0, np.where(~in_step | launched_late, 1, 2))
    for i, key in enumerate(("gpu.idle_kernel_wait_share", "gpu.idle_host_wait_share",
                             "gpu.idle_other_share")):
        out[key] = float(g_len[kind == i].sum()) / total

    gap_role = np.bincount(gid * (len(layers) + 1) + host_role[idx], weights=tl.seg.length[idx],
                           minlength=len(g_start) * (len(layers) + 1)).reshape(len(g_start), -1)
    top = np.argsort(-g_len, kind="stable")[:top]
    host_rows = np.flatnonzero(k.cpu_op | k.dataloader | k.runtime)
    gaps = [Gap(step=steps.labels[g_step[g]],
                offset_ms=float(g_start[g] - steps.start[g_step[g]]) / 1e3,
                duration_ms=float(g_len[g]) / 1e3,
                kind=("kernel_wait", "host_wait", "other")[kind[g]],
                host_activity=HOST_ACTIVITY[int(np.argmax(gap_role[g]))],
                host_event=_main_host_event(t, host_rows, g_start[g], g_end[g]))
            for g in top if g_len[g] > 0]
    return out, gaps


FIRST_CALL_RATIO = 10.0     # a first call an order of magnitude past its repeats: no call-to-call variation


def _first_calls(t: EventTable, k: Kinds) -> tuple[np.ndarray, dict[int, float]]:
    """The rows of CPU ops whose first call (by name, in the trace) lasted LONG_UNTRACED_US or more
    and FIRST_CALL_RATIO times the median of the name's later calls, and each one's ratio. A name
    called once has no repeat to compare with: not counted."""
    rows = np.flatnonzero(k.cpu_op & k.complete)
    # only the names with a call that long can have a first call that long: a few, where the ops
    # number hundreds of thousands
    rows = rows[isin(t.name[rows], t.name[rows[t.dur[rows] >= LONG_UNTRACED_US]])]
    if len(rows) < 2:
        return np.zeros(0, np.int64), {}
    rows = rows[np.lexsort((t.ts[rows], t.name[rows]))]
    names = t.name[rows]
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    out, ratio = [], {}
    for s, e in zip(starts, np.r_[starts[1:], len(rows)]):
        first = rows[s]
        if e - s < 2 or t.dur[first] < LONG_UNTRACED_US:
            continue
        typical = median(t.dur[rows[s + 1:e]])
        if t.dur[first] >= FIRST_CALL_RATIO * typical:
            out.append(first)
            ratio[int(first)] = float(t.dur[first]) / typical if typical > 0 else None
    return np.array(out, np.int64), ratio


def _runs(tl: Timeline, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of adjacent segments `idx` (sorted, non-empty) inside one step: (each segment
    starts a run, each segment's run, each run's length in us)."""
    new = np.ones(len(idx), bool)
    new[1:] = (np.diff(idx) != 1) | (tl.step_of[idx[1:]] != tl.step_of[idx[:-1]])
    gid = np.cumsum(new) - 1
    return new, gid, np.bincount(gid, weights=tl.seg.length[idx])


def _long_stretches(tl: Timeline, mask: np.ndarray) -> float:
    """Time (us) of the runs of adjacent `mask` segments, inside one step, lasting LONG_UNTRACED_US
    or more."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return 0.0
    length = _runs(tl, idx)[2]
    return float(length[length >= LONG_UNTRACED_US].sum())


def _main_host_event(t: EventTable, rows: np.ndarray, a: float, b: float) -> str | None:
    """The host event overlapping [a, b) the most; the shorter (more specific) one on ties."""
    s, e = t.ts[rows], t.ts[rows] + t.dur[rows]
    ov = np.minimum(e, b) - np.maximum(s, a)
    hit = ov > 0
    if not hit.any():
        return None
    cand = rows[hit]
    score = ov[hit] - 1e-9 * t.dur[cand]
    return t.names[t.name[cand[int(np.argmax(score))]]]
