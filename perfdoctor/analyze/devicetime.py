"""Where the device time goes, as the reference tools tabulate it.

- Per kernel (torch-tb-profiler's kernel view, HTA's kernel breakdown): one row per kernel name
  over the analysed steps: calls, total and mean time, share of all kernel time, and on CUDA the
  math precision class (precision.kernel_class) and whether that class runs on tensor cores (None
  for collective kernels). Sorted by total time; the totals cover every kernel.
- Per op (torch-tb-profiler's operator view): the device time (kernels, copies, memsets) of the
  work an op launched itself, joined on the `External id` the op and the runtime call that
  launched the work share (the innermost op: torch-tb-profiler's "self device duration"; nested
  ops do not count it twice, so the rows sum to the device time ops launched). `calls` counts the
  op's instances in the steps. Traces whose runtime calls do not carry their op's External id
  (some older kineto versions put the correlation id there) give no rows.
- Per annotation (HTA's user-annotation breakdown; `user_annotation` category: `record_function`
  blocks, `Optimizer.step`, module hooks; ProfilerStep and DataLoader waits excluded): the device
  time of work whose runtime call lies inside the annotation on the same thread (so the nested
  ops' work counts too).
Only device work that starts inside the analysed steps counts. The top TOP_ROWS rows are kept.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import CPU_OP_CATS, Kinds
from perfdoctor.analyze.precision import CLASSES, class_of_rows
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

TOP_ROWS = 30
TENSOR_CORE_CLASSES = ("gemm_tf32", "gemm_half", "attention_half")


def kernel_rows(t: EventTable, k: Kinds, steps: Steps) -> np.ndarray:
    """Kernel rows that start inside the analysed steps."""
    lo, hi = steps.span
    kr = np.flatnonzero(k.kernel)
    return kr[(t.ts[kr] >= lo) & (t.ts[kr] < hi)]


def kernel_table(t: EventTable, k: Kinds, steps: Steps, top: int = TOP_ROWS) -> dict:
    """{"kernels": count, "kernel_time_us": total, "distinct": names, "rows": [...top rows]}."""
    kr = kernel_rows(t, k, steps)
    ktime = float(t.dur[kr].sum())
    out = {"kernels": int(len(kr)), "kernel_time_us": ktime, "distinct": 0, "rows": []}
    if not len(kr):
        return out
    codes = t.name[kr]
    calls = np.bincount(codes, minlength=len(t.names))
    total = np.bincount(codes, weights=t.dur[kr], minlength=len(t.names))
    used = np.flatnonzero(calls)
    out["distinct"] = int(len(used))
    best = used[np.lexsort((used, -total[used]))][:top]      # by total time, ties by first seen
    first = np.zeros(len(t.names), np.int64)
    first[codes[::-1]] = kr[::-1]                             # a row of each name
    comm = k.comm_kernel[first[best]]
    classes = class_of_rows(t, k, first[best]) if k.platform == "cuda" else None
    for i, c in enumerate(best):
        name = t.names[c]
        cls = None if classes is None or comm[i] else CLASSES[classes[i]]
        out["rows"].append({
            "name": name, "calls": int(calls[c]), "total_us": float(total[c]),
            "mean_us": float(total[c] / calls[c]), "share": float(total[c]) / ktime if ktime > 0 else None,
            "precision": cls, "tensor_cores": (cls in TENSOR_CORE_CLASSES) if cls is not None else None})
    return out


def device_time_tables(t: EventTable, k: Kinds, steps: Steps, top: int = TOP_ROWS) -> dict:
    lo, hi = steps.span
    dev, launch = device_launch_index(t, k)
    keep = (t.ts[dev] >= lo) & (t.ts[dev] < hi)
    dev, launch = dev[keep], launch[keep]
    return {"ops": _per_op(t, k, dev, launch, lo, hi, top),
            "annotations": _per_annotation(t, k, dev, launch, lo, hi, top)}


def _ext(t: EventTable, rows: np.ndarray) -> np.ndarray:
    e = t.args["external_id"][rows]
    return np.where(np.isnan(e), t.args["external_id_legacy"][rows], e)


def _per_op(t: EventTable, k: Kinds, dev: np.ndarray, launch: np.ndarray, lo: float, hi: float,
            top: int) -> list[dict]:
    ops = np.flatnonzero(k.cpu_op & t.cat_mask(*CPU_OP_CATS))
    if not len(ops) or not len(dev):
        return []
    oe = _ext(t, ops)
    ok = ~np.isnan(oe) & (oe > 0)
    ops_e, oe = ops[ok], oe[ok]
    order = np.argsort(oe, kind="stable")
    ops_e, oe = ops_e[order], oe[order]
    de = _ext(t, np.where(launch >= 0, launch, dev))   # the launch's id (some kineto versions put
    # the correlation id in the device event's External id)
    pos = np.minimum(np.searchsorted(oe, de), max(len(oe) - 1, 0))
    hit = (len(oe) > 0) & (oe[pos] == de) if len(oe) else np.zeros(len(dev), bool)
    owner_name = t.name[ops_e[pos[hit]]]
    device = np.bincount(owner_name, weights=t.dur[dev[hit]], minlength=len(t.names))
    in_steps = ops[(t.ts[ops] >= lo) & (t.ts[ops] < hi)]
    calls = np.bincount(t.name[in_steps], minlength=len(t.names))
    return _rows(t, device, calls, top)


def _per_annotation(t: EventTable, k: Kinds, dev: np.ndarray, launch: np.ndarray, lo: float, hi: float,
                    top: int) -> list[dict]:
    ann = np.flatnonzero(k.cpu_op & t.cat_mask("user_annotation"))
    ann = ann[(t.ts[ann] < hi) & (t.ts[ann] + t.dur[ann] > lo)]
    linked = launch >= 0
    dev, launch = dev[linked], launch[linked]
    if not len(ann) or not len(dev):
        return []
    device = np.zeros(len(t.names))
    for tid in unique(t.tid[ann]):
        on = t.tid[launch] == tid
        if not on.any():
            continue
        lt, ld = t.ts[launch[on]], t.dur[dev[on]]
        order = np.argsort(lt, kind="stable")
        lt, cum = lt[order], np.concatenate([[0.0], np.cumsum(ld[order])])
        a = ann[t.tid[ann] == tid]
        i0 = np.searchsorted(lt, t.ts[a], side="left")
        i1 = np.searchsorted(lt, t.ts[a] + t.dur[a], side="right")
        np.add.at(device, t.name[a], cum[i1] - cum[i0])
    calls = np.bincount(t.name[ann], minlength=len(t.names))
    return _rows(t, device, calls, top)


def _rows(t: EventTable, device: np.ndarray, calls: np.ndarray, top: int) -> list[dict]:
    used = np.flatnonzero(device > 0)
    best = used[np.lexsort((used, -device[used]))][:top]
    return [{"name": t.names[c], "calls": int(calls[c]), "device_us": float(device[c]),
             "mean_device_us": float(device[c] / calls[c]) if calls[c] else None} for c in best]
