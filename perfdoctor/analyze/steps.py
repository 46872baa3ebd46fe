"""Training steps: where each step starts and ends on the wall clock.

Primary source: `ProfilerStep#N` host annotations. As in the TensorBoard plugin, a step is
extended to the end of the device work its host range launched (the GPU runs behind the CPU),
and starts no earlier than the previous step ended, so steps tile the time line without
overlap (the host range, the ProfilerStep span, is kept: a call the host makes after it, such
as the sync that stops the profiler, lies in the extended step but no step made it); device work
is attributed by its launch (correlation to a runtime call inside the step), so the first step
starts after the device work of the unprofiled step before it. A last step whose kernels were only partly captured (fewer than 80% of the previous
step's) is dropped; without device work, a last step with under 80% of the usual step's host ops
and time (the profiler stopped inside it) is dropped. A last step whose range runs on past its
last traced work, with nothing traced, where no earlier step's does, ends as long after that work
as the usual step (the profiler stopping inside the range); a first step whose host waits in a
runtime call, before any device event is traced, for more than a tenth of the usual step is
dropped (it waited on work launched before the profiler started: the device state is unknown). Without ProfilerStep we fall back, in order, to DataLoader iterations,
optimizer steps, or the whole trace as one pseudo-step, and say which.

A truncated file (the profiler killed mid-write, a gzip stream cut short) loses every event after
the cut. Kineto writes its events in sections (host events in start-time order, then the device
events one launching thread after the other in launch order, then device annotations; metadata and
its own span last), so the last complete event that parsed marks how far the section being
written got: a step whose host range ends after it may miss events, and is dropped with the steps
after it (`Steps.cut_off`). No complete step left: the analysis is inconclusive (pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfdoctor.analyze.arrays import median, unique
from perfdoctor.analyze.kinds import STEP_RX, Kinds, trailer
from perfdoctor.trace.table import EventTable

TAIL_KEEP_RATIO = 0.8
STOP_TAIL = 0.10      # of the usual step: an untraced tail of the last step this long is the profiler's stop


@dataclass
class Steps:
    start: np.ndarray
    end: np.ndarray
    labels: list[str]
    source: str                      # "ProfilerStep" | "DataLoader iterations" | "optimizer steps" | "whole trace"
    notes: list[str] = field(default_factory=list)
    cut_off: list[str] = field(default_factory=list)   # labels of the steps a truncated file cut (dropped)
    host_end: np.ndarray | None = None   # ProfilerStep: where each step's host range ends (end: its device work's)
    host_start: np.ndarray | None = None  # ProfilerStep: where it begins (start: no earlier than the last step's device work)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def span(self) -> tuple[float, float]:
        return float(self.start[0]), float(self.end[-1])

    def index_of(self, times: np.ndarray) -> np.ndarray:
        """Step index containing each time, or -1."""
        return containing(self.start, self.end, times)

    def host_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Each step's host range: its ProfilerStep span (the step itself for the other sources)."""
        if self.host_start is None or self.host_end is None:
            return self.start, self.end
        return self.host_start, self.host_end

    def host_range_of(self, times: np.ndarray) -> np.ndarray:
        """Index of the step whose host range holds each time, or -1."""
        return containing(*self.host_ranges(), times)

    def in_host_range(self, times: np.ndarray) -> np.ndarray:
        """Whether each time lies in a step and inside a step's host range. A call the host makes
        after the last ProfilerStep (a timing sync, the profiler's stop) or between two of them
        is no step's, even where a step extended to its device work covers it."""
        return (self.host_range_of(times) >= 0) & (self.index_of(times) >= 0)

    def host_range_end(self, times: np.ndarray) -> np.ndarray:
        """The end of the host range each time lies in (the time itself where it lies in none)."""
        i = self.host_range_of(times)
        return np.where(i >= 0, self.host_ranges()[1][np.maximum(i, 0)], times) if len(self) else times

    def of_events(self, t: EventTable) -> np.ndarray:
        """Step index of every event's start (-1 outside steps), computed once per table."""
        cached = getattr(self, "_of_events", None)
        if cached is None or cached[0] is not t:
            self._of_events = (t, self.index_of(t.ts))
        return self._of_events[1]

    def inside(self, t: EventTable, rows: np.ndarray) -> np.ndarray:
        """The rows among `rows` whose event starts inside a step."""
        return rows[self.of_events(t)[rows] >= 0]

    def steady(self) -> np.ndarray:
        """Indices of steady-state steps: all but the first (warm-up) when there are 2 or more."""
        n = len(self)
        return np.arange(1, n) if n >= 2 else np.arange(n)


def containing(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Index of the range [starts[i], ends[i]) holding each time (ranges sorted, not
    overlapping), or -1."""
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = idx >= 0
    ok[ok] = times[ok] < ends[idx[ok]]
    return np.where(ok, idx, -1)


def device_launch_index(t: EventTable, k: Kinds) -> tuple[np.ndarray, np.ndarray]:
    """(device rows, the runtime row that launched each, or -1), joined on `correlation`.
    Computed once per trace (cached on the Kinds)."""
    if "launch" not in k.cache:
        k.cache["launch"] = _device_launch_index(t, k)
    return k.cache["launch"]


def _device_launch_index(t: EventTable, k: Kinds) -> tuple[np.ndarray, np.ndarray]:
    dev = np.flatnonzero(k.device_activity)
    rt = np.flatnonzero(k.runtime)
    corr = t.args["correlation"]
    rt_corr = corr[rt]
    ok = ~np.isnan(rt_corr)
    rt, rt_corr = rt[ok], rt_corr[ok]
    order = np.argsort(rt_corr, kind="stable")
    rt, rt_corr = rt[order], rt_corr[order]
    dc = corr[dev]
    pos = np.searchsorted(rt_corr, dc)
    pos_c = np.minimum(pos, max(len(rt_corr) - 1, 0))
    hit = (len(rt_corr) > 0) & (pos < len(rt_corr)) & (rt_corr[pos_c] == dc) if len(rt_corr) else np.zeros(len(dev), bool)
    launch = np.where(hit, rt[pos_c] if len(rt) else -1, -1)
    return dev, launch


def find_steps(t: EventTable, k: Kinds) -> Steps:
    steps = _find_steps(t, k)
    return _before_cut(t, k, steps) if t.meta.truncated else steps


def _find_steps(t: EventTable, k: Kinds) -> Steps:
    rows = np.flatnonzero(k.step)
    if len(rows):
        return _profiler_steps(t, k, rows)
    for finder in (_loader_steps, _optimizer_steps):
        s = finder(t, k)
        if s is not None:
            return s
    return _whole_trace(t, k)


def _before_cut(t: EventTable, k: Kinds, steps: Steps) -> Steps:
    """The steps of a truncated file whose host range ended before the cut; the steps from the
    first one that did not on are dropped. The cut's time is the start of the last complete event
    in file order, or, in the device events, the host time of the last runtime call: kineto writes
    the device events one launching thread after the other, each pass in launch order, so a step
    whose launches all came before it has its kernels. The profiler's trailer (its `Trace` span,
    metadata) follows every activity: a cut inside it cut no step. No step has all its device work
    in a GPU trace (deviceProperties) cut before its first device event, or cut in the device
    events before those of a host thread that ran ops: all are dropped."""
    after = trailer(t)
    rows = np.flatnonzero(k.complete & ~after)
    if not len(rows) or not len(steps) or after[rows[-1]:].any():
        return steps
    device = k.device_activity | k.runtime | t.cat_mask("gpu_user_annotation")
    launches = np.flatnonzero(k.runtime)
    in_device = bool(device[rows[-1]])
    cut = float(t.ts[launches[-1] if in_device and len(launches) else rows[-1]])
    why = "during step {}"
    if t.meta.device_properties and not (device & k.complete).any():
        cut, why = -np.inf, "before its first device event"
    elif in_device and set(unique(t.tid[k.cpu_op]).tolist()) - set(unique(t.tid[launches]).tolist()):
        # a host thread's pass (the autograd thread's, say) was never reached: every step may lack its kernels
        cut, why = -np.inf, "before it reached the device events of every launching thread"
    late = np.flatnonzero((steps.end if steps.host_end is None else steps.host_end) > cut)
    if not len(late):
        return steps
    keep = int(late[0])
    gone = steps.labels[keep:]
    if steps.source == "whole trace":
        note = "dropped the whole-trace pseudo-step: the trace file was cut off inside it"
    else:
        what = f"step {gone[0]}" if len(gone) == 1 else f"steps {gone[0]}-{gone[-1]}"
        note = f"dropped {what}: the trace file was cut off " + why.format(gone[0])
    note += " (the events after the cut are missing)"
    return Steps(steps.start[:keep], steps.end[:keep], steps.labels[:keep], steps.source, steps.notes + [note], gone,
                 None if steps.host_end is None else steps.host_end[:keep],
                 None if steps.host_start is None else steps.host_start[:keep])


def _profiler_steps(t: EventTable, k: Kinds, rows: np.ndarray) -> Steps:
    # One annotation per step number: keep the longest (some traces repeat them per thread).
    nums = np.array([int(STEP_RX.match(t.names[c]).group(1)) for c in t.name[rows]])
    best: dict[int, int] = {}
    for r, n in zip(rows, nums):
        if n not in best or t.dur[r] > t.dur[best[n]]:
            best[n] = r
    notes: list[str] = []
    # a repeat outside the kept span is another step under the same number (a second profiler,
    # a step count restarted), not a per-thread copy: it is left out, and the report says so
    apart = sum(1 for r, n in zip(rows, nums) if t.ts[r] >= t.ts[best[n]] + t.dur[best[n]]
                or t.ts[r] + t.dur[r] <= t.ts[best[n]])
    if apart:
        notes.append(f"left out {apart} ProfilerStep span(s) that repeat another step's number at another time "
                     "(a second profiler, or a step count restarted): only the longest span of each number "
                     "is analysed")
    rows = np.array(sorted(best.values(), key=lambda r: t.ts[r]))
    hs, he = t.ts[rows], t.ts[rows] + t.dur[rows]
    labels = [str(int(STEP_RX.match(t.names[c]).group(1))) for c in t.name[rows]]
    dev, launch = device_launch_index(t, k)
    linked = launch >= 0
    if not linked.any():
        keep = len(rows) - (0 if t.meta.truncated else _host_tail_cut(t, k, hs, he))   # a cut file: _before_cut
        if keep < len(rows):
            notes.append("dropped the last step: the profiler stopped inside it (it holds under "
                         f"{TAIL_KEEP_RATIO:.0%} of the usual step's host ops and time)")
        start, end, he = hs[:keep].copy(), np.maximum(he, hs)[:keep], he[:keep].copy()
        _cut_stop_tail(t, k, start, end, he, np.full(keep, -np.inf), notes)
        return Steps(start, end, labels[:keep], "ProfilerStep", notes, host_end=he, host_start=hs[:keep])
    lr = launch[linked]
    # A launch belongs to the step whose host range contains it entirely.
    si = np.searchsorted(hs, t.ts[lr], side="right") - 1
    inside = (si >= 0) & (t.ts[lr] + t.dur[lr] <= he[np.maximum(si, 0)])
    si, dend = si[inside], (t.ts + t.dur)[dev[linked]][inside]
    dev_end = np.full(len(rows), -np.inf)
    np.maximum.at(dev_end, si, dend)
    counts = np.bincount(si, minlength=len(rows))
    start, end = np.empty(len(rows)), np.empty(len(rows))
    matched = np.zeros(len(dev), bool)
    matched[np.flatnonzero(linked)[inside]] = True
    prev = _first_step_start(t, dev, matched, si, dev[linked][inside], hs[0])
    for i in range(len(rows)):
        start[i] = max(prev, hs[i])
        end[i] = max(he[i], dev_end[i]) if counts[i] else max(he[i], start[i])
        end[i] = max(end[i], start[i])
        prev = end[i]
    keep = len(rows)
    if len(rows) > 1:
        last = np.flatnonzero(counts)
        if len(last):
            keep = last[-1] + 1
            if last[-1] > 0 and counts[last[-1] - 1] * TAIL_KEEP_RATIO > counts[last[-1]]:
                keep = last[-1]
        if keep < len(rows):
            notes.append(f"dropped the last {len(rows) - keep} step(s): the profiler did not capture "
                         "all the device work they launched")
    start, end, he = start[:keep], end[:keep], he[:keep].copy()
    _cut_stop_tail(t, k, start, end, he, np.where(counts[:keep] > 0, dev_end[:keep], -np.inf), notes)
    first = _waited_on_unseen_work(t, k, dev, start, end, he, notes)
    return Steps(start[first:], end[first:], labels[first:keep], "ProfilerStep", notes, host_end=he[first:],
                 host_start=hs[first:keep])


def _waited_on_unseen_work(t: EventTable, k: Kinds, dev: np.ndarray, start: np.ndarray, end: np.ndarray,
                           he: np.ndarray, notes: list[str]) -> int:
    """1 (drop the first step) when, before the trace's first device event, its host waits in one
    runtime call for more than STOP_TAIL of the usual step, and 3 steps or more are left: the call
    waited for device work launched before the profiler started, which it did not trace, so the
    device reads idle there while it ran (the TensorBoard plugin's ResNet-50 with 4 workers: a
    cudaMemcpyAsync blocked 45.7 ms, no device event before 47.9 ms into the window); else 0."""
    if len(start) < 4 or not len(dev):
        return 0
    first_dev = float(t.ts[dev].min())
    rt = np.flatnonzero(k.runtime & k.complete & (t.ts >= start[0]) & (t.ts < min(first_dev, he[0]))
                        & (t.ts + t.dur >= first_dev))
    if not len(rt):
        return 0
    waited = first_dev - float(t.ts[rt].min())
    if waited <= STOP_TAIL * median(end[1:] - start[1:]):
        return 0
    call = t.names[t.name[rt[np.argmin(t.ts[rt])]]]
    notes.append(f"dropped the first step: its host waited {waited / 1e3:.1f} ms in {call} before any device "
                 "work was traced (work launched before the profiler started, which it did not record: the "
                 "device's state there is not known)")
    return 1


def _cut_stop_tail(t: EventTable, k: Kinds, start: np.ndarray, end: np.ndarray, he: np.ndarray,
                   dev_end: np.ndarray, notes: list[str]) -> None:
    """The last step ends as long after its last traced work as the usual step does where its host
    range runs on past that work, with nothing traced, by more than STOP_TAIL of the usual step
    while no earlier step's does (a quarter of that at most): the profiler stopping inside the
    range, not the script's work. The TensorBoard plugin's ResNet-50 sample (num_workers=4) ends
    its window with a step of 206 ms whose last op ends at 122 ms, every earlier step at its last
    op: the 85 ms made the window's mean host-bound where each steady step was 83-86% device.
    In place: `end`, `he`."""
    n = len(start)
    if n < 3:
        return
    host = _host_work(k)
    hend = t.ts[host] + t.dur[host]
    si = containing(start, end, t.ts[host])
    last_work = np.full(n, -np.inf)
    np.maximum.at(last_work, si[si >= 0], hend[si >= 0])
    last_work = np.maximum(np.minimum(last_work, he), dev_end)
    tails = end - np.maximum(last_work, start)
    usual = median(end[:-1] - start[:-1])
    if tails[-1] > STOP_TAIL * usual and tails[:-1].max() <= tails[-1] / 4 and np.isfinite(last_work[-1]):
        cut = float(last_work[-1]) + median(tails[:-1])       # as long after it as the usual step
        notes.append(f"cut the last step after its last traced work: its range ran on {(end[-1] - cut) / 1e3:.1f} ms "
                     "longer with nothing traced than the earlier steps' (the profiler stopping)")
        end[-1] = cut
        he[-1] = min(he[-1], cut)


def _host_work(k: Kinds) -> np.ndarray:
    """Rows of the host's own traced work: ops, loader calls, collectives, runtime calls."""
    return np.flatnonzero((k.cpu_op | k.dataloader | k.comm_op | k.runtime) & k.complete)


def _host_tail_cut(t: EventTable, k: Kinds, hs: np.ndarray, he: np.ndarray) -> int:
    """1 when the last of several steps (a trace without device work joined to its launches) holds
    fewer host ops, and lasts less, than TAIL_KEEP_RATIO of the other steps' medians: the profiler
    stopped inside it (the script ended or was stopped mid-window, leaving a stub of a step), else
    0. Both: a lighter step of the usual length is a step. The medians, not the previous step: a
    step with an evaluation before it must not make the usual one look cut."""
    if len(hs) < 2:
        return 0
    host = _host_work(k)
    si = containing(hs, he, t.ts[host])
    counts = np.bincount(si[si >= 0], minlength=len(hs))
    durs = he - hs
    return int(counts[-1] < TAIL_KEEP_RATIO * median(counts[:-1])
               and durs[-1] < TAIL_KEEP_RATIO * median(durs[:-1]))


def _first_step_start(t: EventTable, dev: np.ndarray, matched: np.ndarray, si: np.ndarray,
                      step_dev: np.ndarray, host_start: float) -> float:
    """Where the first step starts: its host start, or later if device work that no step launched
    (the previous, unprofiled step's) ends after it but before the first step's own device work
    begins; that work belongs to no step (torch-tb-profiler's rule, its tests
    test_multiple_profilersteps_with_overlap and test_last_steps_no_kernel)."""
    own = step_dev[si == 0]
    if not len(own):
        return host_start
    first_own = float(t.ts[own].min())
    other = dev[~matched]
    ends = t.ts[other] + t.dur[other]
    ends = ends[ends < first_own]
    return max(host_start, float(ends.max())) if len(ends) else host_start


def _loader_steps(t: EventTable, k: Kinds) -> Steps | None:
    rows = np.flatnonzero(k.dataloader)
    if len(rows) < 2:
        return None
    st = np.sort(t.ts[rows])
    return Steps(st[:-1], st[1:], [str(i) for i in range(len(st) - 1)], "DataLoader iterations",
                 ["no ProfilerStep annotations: a step is the time from one DataLoader batch request "
                  "to the next (the last, open-ended iteration is not counted)"])


def _optimizer_steps(t: EventTable, k: Kinds) -> Steps | None:
    rows = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith("Optimizer.step#")))
    if len(rows) < 2:
        return None
    ends = np.sort(t.ts[rows] + t.dur[rows])
    return Steps(ends[:-1], ends[1:], [str(i) for i in range(len(ends) - 1)], "optimizer steps",
                 ["no ProfilerStep or DataLoader annotations: a step is the time between the ends of "
                  "consecutive optimizer steps"])


def _whole_trace(t: EventTable, k: Kinds) -> Steps:
    rows = np.flatnonzero(k.cpu_op | k.runtime | k.device_activity | k.dataloader)
    if len(rows) == 0:
        rows = np.flatnonzero(k.complete & ~t.cat_mask("Trace"))
    if len(rows) == 0:
        return Steps(np.zeros(0), np.zeros(0), [], "whole trace", ["no timed events"])
    # CUPTI's own overhead records ("overhead", pid -1: buffer requests, instrumentation) are
    # the tracer's, not the workload's
    if not t.meta.truncated and not (k.complete & ~k.runtime & ~t.cat_mask("Trace", "overhead")).any():
        return Steps(np.zeros(0), np.zeros(0), [], "whole trace", [_runtime_only(t, rows)])
    lo, hi = float(t.ts[rows].min()), float((t.ts[rows] + t.dur[rows]).max())
    return Steps(np.array([lo]), np.array([hi]), ["all"], "whole trace",
                 ["no ProfilerStep, DataLoader or optimizer annotations: the whole trace is analysed "
                  "as one pseudo-step, so per-step numbers are whole-trace numbers"])


def _runtime_only(t: EventTable, rows: np.ndarray) -> str:
    """Why a trace of device-API calls alone (no operator, kernel, copy, annotation or Python
    frame, whatever CUPTI's own overhead records: typically cudaGetDeviceCount and
    cudaGetDeviceProperties as the profiler starts, and its own cudaDeviceSynchronize as it
    stops) holds nothing to diagnose: the workload ran outside the recorded window. Analysed, it
    read as a host-bound 'step' of setup calls."""
    names = list(dict.fromkeys(t.names[c] for c in t.name[rows]))
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"nothing to analyse: the trace holds {len(rows)} runtime call(s) ({shown}) and no operator, "
            "kernel or annotation: the workload ran outside the profiler's recorded window")
