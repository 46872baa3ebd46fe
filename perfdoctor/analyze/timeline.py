"""One segmentation of the analysed time line, with which event roles cover each segment.

Built once per trace; the step breakdown, idle-gap attribution, communication overlap and
data-wait shares are all sums over these segments (see intervals.Segments).

"CPU ops" (cpu_exec) are the ops torch records (cpu_op/operator events), not the blocks around
them: a record_function label (user_annotation) or a with_stack Python frame (python_function)
covers the Python between its ops too, and counting it as op time told a step 80% in Python
"compute-bound, 98.6% in ops" once PD319's advice to label the step was followed. Their time
outside any op is the host's other time, as without the label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdoctor.analyze import kinds as K
from perfdoctor.analyze.intervals import Segments, clip
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

# Priority order of the step breakdown (TensorBoard plugin / TF profiler convention).
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loading", "cpu_exec")
BREAKDOWN = ROLES + ("other",)


@dataclass
class Timeline:
    seg: Segments
    step_of: np.ndarray                # step index per segment, -1 outside steps
    cover: dict[str, np.ndarray]       # role -> bool per segment (also "sync", "device", "compute")
    role: np.ndarray                   # breakdown role index per segment (len(ROLES) = other)

    def per_step(self, mask: np.ndarray | None = None, n_steps: int = 0) -> np.ndarray:
        """Sum of segment lengths per step, optionally restricted to mask."""
        ok = self.step_of >= 0
        if mask is not None:
            ok &= mask
        return np.bincount(self.step_of[ok], weights=self.seg.length[ok], minlength=n_steps)

    def total(self, mask: np.ndarray) -> float:
        return float(self.seg.length[mask & (self.step_of >= 0)].sum())


def build_timeline(t: EventTable, k: K.Kinds, steps: Steps) -> Timeline:
    lo, hi = steps.span
    end = t.ts + t.dur
    sync_rt = k.runtime & t.name_mask(lambda n: K.SYNC_RUNTIME_RX.match(n) is not None)
    rows = np.flatnonzero(sync_rt)
    sync_rt[rows[~steps.in_host_range(t.ts[rows])]] = False     # no step made a sync outside them
    cpu = k.platform == "cpu"
    masks = {
        "kernel": k.kernel & ~k.comm_kernel,
        "memcpy": k.memcpy,
        "memset": k.memset,
        "communication": k.comm_host | (k.comm_kernel if not cpu else False),
        "runtime": k.runtime,
        "data_loading": k.dataloader,
        "cpu_exec": k.cpu_op & ~t.cat_mask(*K.HOST_ANNOTATION_CATS),
        "sync": sync_rt,
    }
    if k.comm_host.any() and not cpu:
        masks["comm_kernel"] = k.comm_kernel
    spans = {}
    for name, m in masks.items():
        rows = np.flatnonzero(m)
        spans[name] = clip(t.ts[rows], end[rows], lo, hi)
    seg = Segments(steps.start, steps.end, *[x for s in spans.values() for x in s])
    cover = {name: seg.covered(*s) for name, s in spans.items()}
    # Collective kernels keep the device busy; host-side (gloo) collectives do not.
    comm_dev = np.zeros(len(seg), bool) if cpu else cover.get("comm_kernel", cover["communication"])
    cover["device"] = cover["kernel"] | cover["memcpy"] | cover["memset"] | comm_dev
    cover["compute"] = cover["kernel"]
    role = seg.assign([cover[r] for r in ROLES], default=len(ROLES))
    return Timeline(seg=seg, step_of=steps.index_of(seg.start), cover=cover, role=role)


def breakdown_matrix(tl: Timeline, n_steps: int) -> np.ndarray:
    """(n_steps, 8) microseconds per step per breakdown role; rows sum to step durations."""
    ok = tl.step_of >= 0
    flat = tl.step_of[ok] * len(BREAKDOWN) + tl.role[ok]
    m = np.bincount(flat, weights=tl.seg.length[ok], minlength=n_steps * len(BREAKDOWN))
    return m.reshape(n_steps, len(BREAKDOWN))
