"""The successive profiler windows of one process, found among a directory's traces and joined.

torch.profiler with `schedule(wait, warmup, active, repeat=N)` and tensorboard_trace_handler
writes one file per active window: `host_pid.<time>.pt.trace.json`, steps 2-5, then 8-11... On
their own, each is a few steps, the first (still warming up) is "the slowest trace", and the
windows of one rank look like several ranks. Traces are one process's windows when:
- they name the same rank (or none) and the same host process ids (the pids of their CPU ops);
- their clock base (kineto's baseTimeNanoseconds) is the same where both files give one;
- they hold ProfilerStep annotations, and in start order each window begins after the one before
  it ends, with a higher step number (a second run of the same script starts again at its low
  step numbers, even where a container gives it the same pid).

A joined window keeps only its steps' time at the seams: the first window's events up to its
last step's end, the next one's from its first step's start (as each window's own analysis
keeps them: a kernel still running after a window's last step is outside every step). The time
between windows holds no event and no step.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.kinds import STEP_RX, classify
from perfdoctor.trace.assemble import kept_labels
from perfdoctor.trace.concat import concat
from perfdoctor.trace.table import EventTable

HOST_CATS = ("cpu_op", "user_annotation", "python_function", "Operator")


class _Window:
    """One trace as a candidate window: its process (rank and host pids), and, once asked, its
    ProfilerStep numbers and their time span."""

    def __init__(self, t: EventTable):
        self.table = t
        host = t.cat_mask(*HOST_CATS)
        self.key = (t.meta.rank, frozenset(t.pids[c] for c in np.unique(t.pid[host])))
        self.steps = 0
        self.first_step = self.last_step = None
        self.start = self.end = 0.0

    def read_steps(self) -> bool:
        """Reads the ProfilerStep annotations (classify: only for traces that share a process
        with another); False when there are none."""
        t = self.table
        rows = np.flatnonzero(classify(t).step)
        self.steps = len(rows)
        if self.steps:
            numbers = [int(STEP_RX.match(t.names[c]).group(1)) for c in t.name[rows]]
            self.first_step, self.last_step = min(numbers), max(numbers)
            self.start, self.end = float(t.ts[rows].min()), float((t.ts[rows] + t.dur[rows]).max())
        return self.steps > 0

    def follows(self, before: "_Window") -> bool:
        a, b = before.table.meta.base_time_ns, self.table.meta.base_time_ns
        return ((a is None or b is None or a == b) and self.start >= before.end
                and self.first_step > before.last_step)


def join_windows(tables: list[EventTable]) -> list[EventTable]:
    """`tables` with each process's successive windows joined into one table (at the place of
    its first window, with a note saying what was joined); every other table as it was."""
    if len(tables) < 2:
        return tables
    windows = [_Window(t) for t in tables]
    groups: dict = {}
    for i, w in enumerate(windows):
        if w.key[1]:                                  # no host op: not a process's trace to join
            groups.setdefault(w.key, []).append(i)
    runs: dict[int, list[int]] = {}                   # first member -> the windows joined there
    for members in groups.values():
        if len(members) < 2 or not all(windows[i].read_steps() for i in members):
            continue
        order = sorted(members, key=lambda i: windows[i].start)
        if all(windows[b].follows(windows[a]) for a, b in zip(order, order[1:])):
            runs[min(members)] = order
    joined = {i for run in runs.values() for i in run}
    return [_joined([windows[j] for j in runs[i]]) if i in runs else w.table
            for i, w in enumerate(windows) if i in runs or i not in joined]


def _joined(run: list[_Window]) -> EventTable:
    parts = []
    for n, w in enumerate(run):
        t = w.table
        keep = np.ones(len(t), bool)
        if n > 0:
            keep &= t.ts >= w.start
        if n < len(run) - 1:
            keep &= t.ts < w.end
        parts.append(_rows(t, keep))
    joined = concat(parts)
    names = ", ".join(w.table.meta.path.rsplit("/", 1)[-1] for w in run)
    steps = sum(w.steps for w in run)
    joined.meta.notes = [f"{len(run)} profiler windows of one process joined into this trace "
                         f"(steps {run[0].first_step}-{run[-1].last_step}, {steps} traced; the time between "
                         f"windows is no step's): {names}", *joined.meta.notes]
    return joined


def _rows(t: EventTable, keep: np.ndarray) -> EventTable:
    """`t` with only the rows `keep` marks (process/thread labels move with their rows)."""
    if keep.all():
        return t
    labels = kept_labels(t.str_args.get("labels") or {}, keep)
    return EventTable(ph=t.ph[keep], cat=t.cat[keep], name=t.name[keep], pid=t.pid[keep], tid=t.tid[keep],
                      ts=t.ts[keep], dur=t.dur[keep], args={k: v[keep] for k, v in t.args.items()},
                      cats=t.cats, names=t.names, pids=t.pids, tids=t.tids, meta=t.meta,
                      str_args={**t.str_args, "labels": labels})
