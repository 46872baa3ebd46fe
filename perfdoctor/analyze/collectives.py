"""Per-collective detail: what HTA's communication analysis and nccl-tests report.

Rows are the collectives of the analysed steps: NCCL/RCCL kernels on a device, else the host-side
collectives that do the work (gloo: its `gloo:*` ops, or c10d ops / record_param_comms). They are
grouped by collective and message size: count, total and mean duration, and when the trace
records the size (kineto's `In msg nelems` and `dtype` args) and the group size (`Group size`, else
distributedInfo's world size), nccl-tests' bandwidths for one call of mean duration t:
- algbw = S / t, with S as nccl-tests sizes it: all_reduce the buffer (count x element size),
  all_gather the gathered output (per-rank count x n x element size), reduce_scatter the input
  (count x element size);
- busbw = algbw x 2(n-1)/n for all_reduce, algbw x (n-1)/n for all_gather and reduce_scatter
  (the bytes each rank's link carries, comparable with the hardware's bandwidth).
Other collectives get no bandwidth. GB/s are 1e9 bytes per second.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.kinds import GLOO_OP_RX, Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

KERNEL_NAME_RX = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.I)
CANONICAL = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
             "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
             "sendrecv": "send_recv", "send": "send", "recv": "recv", "barrier": "barrier",
             "gather": "gather", "scatter": "scatter"}
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
TOP_ROWS = 30


def collective_name(name: str) -> str:
    """all_reduce, all_gather, ... from a kernel or host op name; the name itself when unknown."""
    m = KERNEL_NAME_RX.search(name)
    raw = m.group(1) if m else re.sub(r"^(gloo:|nccl:|c10d::)", "", name)
    key = re.sub(r"(_?base|_?into_?tensor|_?coalesced|_?tensor)+_*$", "", raw.lower()).replace("_", "")
    return CANONICAL.get(key, name)


def collective_table(t: EventTable, k: Kinds, steps: Steps, world_size: int | None,
                     top: int = TOP_ROWS) -> list[dict]:
    rows = collective_rows(t, k, steps)
    if not len(rows):
        return []
    codes = t.name[rows]
    nbytes = np.nan_to_num(t.args["in_nelems"][rows] * t.args["dtype_bytes"][rows], nan=-1.0)
    group = t.args["group_size"][rows]
    group = np.nan_to_num(np.where(np.isnan(group), float(world_size or "nan"), group), nan=-1.0)
    order = np.lexsort((group, nbytes, codes))
    c, b, g, d = codes[order], nbytes[order], group[order], t.dur[rows][order]
    new = np.ones(len(c), bool)
    new[1:] = (c[1:] != c[:-1]) | (b[1:] != b[:-1]) | (g[1:] != g[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(c)))
    totals = np.add.reduceat(d, starts)
    merged: dict[tuple, list] = {}     # kernel names that differ only in algorithm/protocol merge
    for s0, cnt, tot in zip(starts.tolist(), counts.tolist(), totals.tolist()):
        key = (collective_name(t.names[c[s0]]), int(b[s0]) if b[s0] >= 0 else None, int(g[s0]) if g[s0] >= 0 else None)
        acc = merged.setdefault(key, [0, 0.0])
        acc[0] += cnt
        acc[1] += tot
    out = []
    for (name, size, n), (cnt, tot) in merged.items():
        row = {"name": name, "count": cnt, "bytes": size, "group_size": n,
               "total_us": tot, "mean_us": tot / cnt, "algbw_gbps": None, "busbw_gbps": None}
        if size is not None and n and name in BUS_FACTOR and row["mean_us"] > 0:
            s = size * n if name == "all_gather" else size
            row["algbw_gbps"] = s / row["mean_us"] / 1e3
            row["busbw_gbps"] = row["algbw_gbps"] * BUS_FACTOR[name](n) if n > 1 else None
        out.append(row)
    out.sort(key=lambda r: (-r["total_us"], r["name"]))
    return out[:top]


def collective_rows(t: EventTable, k: Kinds, steps: Steps) -> np.ndarray:
    """Collective kernels in the steps; without any, the host collectives doing the work (gloo ops
    when present, so a c10d wrapper and its gloo op are not counted twice)."""
    lo, hi = steps.span
    rows = np.flatnonzero(k.comm_kernel)
    if not len(rows):
        rows = np.flatnonzero(k.comm_host)
        gloo = t.name_mask(lambda n: GLOO_OP_RX.match(n) is not None)[rows]
        if gloo.any():
            rows = rows[gloo]
    return rows[(t.ts[rows] >= lo) & (t.ts[rows] < hi)]
