"""Per-device busy time when one process drives several GPUs (torch.nn.DataParallel, or a model
split over devices by hand).

The step breakdown (timeline.py) takes the union of device work over every device: a step in
which GPU 0 works 90% of the time and GPUs 1..3 work 30% reads "device busy 90%", although three
quarters of the devices idle most of the step. Here each device is measured on its own, from the
`device` argument Kineto gives every kernel, copy and memset:

- busy: kernels, copies and memsets on that device (collective kernels excluded, as share.device
  excludes them: communication is its own share), their union inside the analysed steps / step
  time;
- compute: that device's compute kernels alone (no copies, memsets or collective kernels) / step
  time: the work a replica would still run as its own process under DistributedDataParallel,
  without DataParallel's per-step replicate (broadcast of the parameters), scatter of the inputs,
  gather of the outputs and reduce of the gradients. Copy kernels DataParallel's gather launches
  as ordinary kernels (a cat on GPU 0) count as compute: the split errs on the side of less gain.

All None unless work ran on two devices or more of this process, so single-device results are
untouched. `replica_shares` makes the verdict honest for DataParallel (see its docstring);
`critical_device` gives the kernel-time analyses (precision, fusion, recomputation, attention) the
one device whose kernels the step waits for under DataParallel.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.intervals import Segments, clip
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

NAMES = ("gpu.device_busy_max", "gpu.device_busy_min", "gpu.device_busy_mean", "gpu.device_imbalance",
         "parallel.replica_compute_share_max", "parallel.replica_compute_share_mean")


def replica_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out: dict = dict.fromkeys(NAMES)
    work = np.flatnonzero((k.kernel & ~k.comm_kernel) | k.memcpy | k.memset)
    dev = t.args["device"][work]
    known = ~np.isnan(dev) & (dev >= 0)
    devices = unique(dev[known])
    if len(devices) < 2:
        return out
    work, dev = work[known], dev[known]
    compute = k.kernel[work]                      # comm kernels are not in `work`
    total = float(steps.duration.sum())
    per_step = np.array([_per_step(t, work[dev == d], steps) for d in devices])
    busy = per_step.sum(axis=1) / total
    own = np.array([_per_step(t, work[(dev == d) & compute], steps).sum() for d in devices]) / total
    k.cache["replicas"] = (devices, busy, own, per_step.mean(axis=0))
    out.update({"gpu.device_busy_max": float(busy.max()), "gpu.device_busy_min": float(busy.min()),
                "gpu.device_busy_mean": float(busy.mean()),
                "gpu.device_imbalance": 1.0 - float(busy.mean() / busy.max()) if busy.max() > 0 else None,
                "parallel.replica_compute_share_max": float(own.max()),
                "parallel.replica_compute_share_mean": float(own.mean())})
    return out


def _per_step(t: EventTable, rows: np.ndarray, steps: Steps) -> np.ndarray:
    """Union of the rows' intervals inside each analysed step, in microseconds."""
    out = np.zeros(len(steps.duration))
    s, e = clip(t.ts[rows], t.ts[rows] + t.dur[rows], *steps.span)
    if not len(s):
        return out
    seg = Segments(steps.start, steps.end, s, e)
    idx = steps.index_of(seg.start)
    keep = seg.covered(s, e) & (idx >= 0)
    np.add.at(out, idx[keep], seg.length[keep])
    return out


def critical_device(t: EventTable, k: Kinds, m: dict) -> tuple[np.ndarray | None, float | None]:
    """Under DataParallel on several devices: a mask over the table's rows of the busiest replica
    (by its compute kernels) and that device's busy share of the step; (None, None) otherwise.

    The replicas run side by side, so a fix that shortens every replica's kernels (mixed
    precision, fusion, less recomputation, fused attention) shortens the step by what it
    shortens on the busiest one: its kernels' classes, weighted by its own busy share, not the
    kernel time summed over the devices (N replicas' copies of one kernel are not N times the
    step) nor a union mixing GPU 0's loss and optimizer with the replicas' GEMMs. A model split
    over devices by hand runs them in turn: all their kernels are on the critical path, so those
    traces, like single-device ones, keep every device (None)."""
    per = k.cache.get("replicas")
    if not m.get("parallel.data_parallel") or per is None:
        return None, None
    devices, busy, own, _ = per
    i = int(np.argmax(own))
    return t.args["device"] == devices[i], float(busy[i])


def replica_shares(m: dict) -> dict:
    """The verdict's device and host shares under DataParallel on several devices.

    share.device answers "would faster devices make the step faster?". With N replicas that
    should run side by side, the device capacity the step uses is the mean per-device busy share,
    not the union over devices (the union is the busiest device's time plus whatever the others
    add outside it). The difference, union - mean, is time the replicas idle while the one
    driving process replicates the model, scatters the batch, gathers the outputs and computes
    the loss on GPU 0: DataParallel's orchestration, which PD330 removes, so it moves to
    share.host. The four shares still sum to 1. Other multi-device traces (a model split over
    GPUs by hand runs its devices in turn, and the union is then the step's critical path) and
    single-device traces keep the union. parallel.replica_idle_share says how much moved: fixes
    of the host's own overhead (compile, graph replay) leave it out of their share."""
    mean = m.get("gpu.device_busy_mean")
    if not m.get("parallel.data_parallel") or mean is None or m.get("share.device") is None:
        return {"parallel.replica_idle_share": None}
    device = min(m["share.device"], mean)
    idle = m["share.device"] - device
    return {"share.device": device, "share.host": (m["share.host"] or 0.0) + idle,
            "parallel.replica_idle_share": idle}


def replica_step_device_ms(k: Kinds, m: dict) -> np.ndarray | None:
    """Per step, the mean per-device busy time (ms) where replica_shares makes share.device the
    mean (DataParallel on several devices), for the per-step view (stepview.step_dominant);
    None where share.device stays the union."""
    per = k.cache.get("replicas")
    if m.get("parallel.replica_idle_share") is None or per is None:
        return None
    return per[3] / 1e3
