"""Communication: how much of the step collectives take, how much of it compute hides, when
they are launched, and which steps carry them (the comm.* metrics).

Collectives are the collective kernels (NCCL/RCCL), each timed by its duration and placed by its
launch call; without any, the host collectives that do the work (gloo), placed by their start.

- comm.share / exposed_share / overlap: from the step time line (timeline.py).
- comm.launched_in_backward: DDP starts all-reducing a gradient bucket as soon as backward has
  filled it, FSDP its reduce-scatter; gradients reduced by hand after backward (or by one bucket,
  or at the tail of a compiled graph) start when the backward's compute has all been issued. The
  order the host launched things in tells the two apart whatever the link's speed: a collective
  counts as launched during backward when at least a tenth (REMAINING) of its step's backward
  compute (kernel time launched from autograd engine ops) was launched after it. The last bucket
  of a bucketed all-reduce is issued when backward ends and does not count; a collective in the
  forward pass (an FSDP all-gather) does. The tenth keeps the gradient copies that follow a
  reduction done after backward (AccumulateGrad's kernels) from counting as backward left to
  hide behind.
- comm.sync_steps: steps that synchronise gradients. Gradient accumulation under DDP's no_sync()
  skips the all-reduce and the optimizer step together, so where the trace records optimizer steps
  (Optimizer.step#... annotations) the steps that run one are counted: a collective that runs on
  every micro-batch anyway (DDP's forward broadcast of buffers) does not make a micro-batch a
  synchronising step. Without optimizer annotations, the steps that launch collectives.
- comm.exposed_reduce_share: the exposed part of the collectives that reduce (all_reduce,
  reduce_scatter, reduce: kernels, or host collectives on gloo, by name), the gradient reduction
  that DDP's and FSDP1's no_sync() and FSDP2's set_requires_gradient_sync(False) skip. What else
  is exposed runs on every micro-batch whatever the synchronisation: FSDP's parameter all-gathers,
  DDP's buffer broadcasts. On gloo FSDP's reduce-scatter runs as an all_reduce (a reduction too).
  An all_reduce of a logged loss counts as well: the name alone cannot tell it from gradients.
- comm.reduce_calls_per_step / reduce_call_mean_us / reduce_call_mean_bytes: those reducing
  collectives counted one per call as the collective table counts them (kernels, else the gloo ops),
  per analysed step, their mean duration, and their mean size where the trace records it
  (`In msg nelems` x the dtype's size on every call; None otherwise, as on gloo CPU traces).
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.collectives import collective_rows
from perfdoctor.analyze.intervals import clip
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import launches_inside
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.analyze.timeline import BREAKDOWN, Timeline
from perfdoctor.trace.table import EventTable

BACKWARD = "autograd::engine::evaluate_function"
OPTIMIZER_STEP = "Optimizer.step#"
REDUCING_RX = re.compile(r"reduce", re.I)   # all_reduce, reduce_scatter, reduce; NCCL's AllReduce, ReduceScatter
REMAINING = 0.1      # share of the step's backward compute still to be launched after a collective


def comm_metrics(t: EventTable, k: Kinds, steps: Steps, tl: Timeline, total: float) -> dict:
    out = _shares(tl, k, total)
    out["comm.exposed_reduce_share"] = _exposed_reduce_share(t, k, steps, tl, total) if out["comm.share"] else 0.0
    at, dur = collectives(t, k, steps)
    out.update(_reduce_calls(t, k, steps))
    out["comm.launched_in_backward"] = launched_in_backward(t, k, steps, at, dur)
    out["comm.sync_steps"] = sync_steps(t, k, steps, at)
    return out


def _shares(tl: Timeline, k: Kinds, total: float) -> dict:
    comm = tl.cover["communication"]
    ct = tl.total(comm)
    if ct == 0:
        return {"comm.share": 0.0, "comm.exposed_share": 0.0, "comm.overlap": None}
    overlap = None if k.platform == "cpu" else tl.total(comm & tl.cover["compute"]) / ct
    return {"comm.share": ct / total,
            "comm.exposed_share": tl.total(tl.role == BREAKDOWN.index("communication")) / total,
            "comm.overlap": overlap}


def _exposed_reduce_share(t: EventTable, k: Kinds, steps: Steps, tl: Timeline, total: float) -> float:
    """Exposed communication (the breakdown's role) that a reducing collective covers / step time.
    The rows are the timeline's communication rows, so their clipped ends are segment boundaries."""
    comm = k.comm_host | (k.comm_kernel if k.platform != "cpu" else False)
    rows = np.flatnonzero(comm & t.name_mask(lambda n: REDUCING_RX.search(n) is not None))
    if not len(rows):
        return 0.0
    covered = tl.seg.covered(*clip(t.ts[rows], t.ts[rows] + t.dur[rows], *steps.span))
    return tl.total(covered & (tl.role == BREAKDOWN.index("communication"))) / total


def _reduce_calls(t: EventTable, k: Kinds, steps: Steps) -> dict:
    rows = collective_rows(t, k, steps)
    rows = rows[t.name_mask(lambda n: REDUCING_RX.search(n) is not None)[rows]]
    out = {"comm.reduce_calls_per_step": len(rows) / len(steps) if len(steps) else None,
           "comm.reduce_call_mean_us": float(t.dur[rows].mean()) if len(rows) else None,
           "comm.reduce_call_mean_bytes": None}
    nbytes = t.args["in_nelems"][rows] * t.args["dtype_bytes"][rows]
    if len(rows) and not np.isnan(nbytes).any():
        out["comm.reduce_call_mean_bytes"] = float(nbytes.mean())
    return out


def collectives(t: EventTable, k: Kinds, steps: Steps) -> tuple[np.ndarray, np.ndarray]:
    """(launch time, duration) of the collectives launched inside the steps: kernels placed by
    their launch call, else host collectives (gloo) by their start."""
    dev, launch = device_launch_index(t, k)
    ok = (launch >= 0) & k.comm_kernel[dev] if len(dev) else np.zeros(0, bool)
    if ok.any():
        at, dur = t.ts[launch[ok]], t.dur[dev[ok]]
    else:
        rows = np.flatnonzero(k.comm_host)
        at, dur = t.ts[rows], t.dur[rows]
    inside = steps.host_range_of(np.asarray(at, np.float64)) >= 0
    return np.asarray(at, np.float64)[inside], np.asarray(dur, np.float64)[inside]


def launched_in_backward(t: EventTable, k: Kinds, steps: Steps, at: np.ndarray, dur: np.ndarray) -> float | None:
    """Share of collective time launched with at least REMAINING of its step's backward compute
    still to launch; None without collectives, or without backward compute in their steps."""
    if not len(at) or k.platform == "cpu":
        return None
    ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith(BACKWARD)))
    kern, launch = launches_inside(t, k, ops)
    keep = ~k.comm_kernel[kern]
    kern, launch = kern[keep], launch[keep]
    k_step = steps.host_range_of(t.ts[launch].astype(np.float64))
    c_step = steps.host_range_of(at)
    counted = timed = 0.0
    for s in unique(c_step):
        mine = k_step == s
        lt, d = t.ts[launch[mine]].astype(np.float64), t.dur[kern[mine]].astype(np.float64)
        if not len(lt) or d.sum() <= 0:
            continue                # a step without backward compute: nothing to launch during
        order = np.argsort(lt, kind="stable")
        lt, d = lt[order], d[order]
        after = np.append(np.cumsum(d[::-1])[::-1], 0.0)      # after[i]: compute launched from i on
        c = c_step == s
        left = after[np.searchsorted(lt, at[c], side="right")] / after[0]
        timed += float(dur[c].sum())
        counted += float(dur[c][left >= REMAINING].sum())
    return counted / timed if timed > 0 else None


def sync_steps(t: EventTable, k: Kinds, steps: Steps, at: np.ndarray) -> int | None:
    """Steps that synchronise gradients: those running an optimizer step when the trace records
    any in its steps, else those launching collectives; None without collectives in the steps."""
    if not len(at):
        return None
    opt = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith(OPTIMIZER_STEP)))
    with_opt = steps.host_range_of(t.ts[opt].astype(np.float64))
    with_opt = unique(with_opt[with_opt >= 0])
    if len(with_opt):
        return int(len(with_opt))
    return int(len(unique(steps.host_range_of(at))))
