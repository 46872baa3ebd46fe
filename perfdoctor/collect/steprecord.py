"""One step record of `perfdoctor run`: the readings at a step boundary and the steps.jsonl line.

A mark is (perf_counter, cumulative data wait, cumulative batches, unix time, schedstat, cumulative
process CPU inside the data wait of loaders without workers) taken at a boundary; a step's record is the difference of two marks. steps.jsonl is written in batches by
the session (hooks.py): each of the first FLUSH_FIRST steps at once, then whenever a step ends
FLUSH_S or more after the last write, and at the end. A write(2) a step was a third of the hooks'
cost on a 0.4 ms step. What a batch can lose: a SIGKILL or a default-action SIGTERM drops the
steps not yet written (those since the last write, more if the script paused after them).
"""

from __future__ import annotations

import os
import threading
import time

FLUSH_S = 0.1                # a step that ends this long after the last write writes the batch
FLUSH_FIRST = 16             # the first steps are written one by one (the live readers wait for them)
REREAD_S = 0.001             # bookkeeping at a boundary longer than this: the next step's start is read afresh

_JS = {True: "true", False: "false"}


def first_step_recorded(steps_path) -> bool:
    """steps.jsonl holds a step: the first steps are written one by one as they end
    (FLUSH_FIRST), so the live readers in the parent see the first at once."""
    try:
        return os.stat(steps_path).st_size > 0
    except OSError:
        return False


_SCHED_FDS: dict[int, int] = {}      # native thread id -> open /proc/thread-self/schedstat


def schedstat() -> tuple[int, int] | None:
    """This thread's nanoseconds on a CPU and waiting in a run queue (None where the kernel has
    no schedstat): per step, `cpu` and `runq` in steps.jsonl.

    The CPU time is the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID), not schedstat's first
    field: the kernel brings a running thread's schedstat runtime up to date only at a scheduler
    tick or a context switch, so on steps shorter than a tick (4 ms at 250 Hz) it read 0 or a
    whole tick, and the tick clipped to a shorter step's wall time lost the rest (a busy Python
    loop read 60% on a CPU). The run-queue wait is only added while the thread is not running,
    so a running thread reads it current.

    The file stays open per thread and is re-read with pread (1 us here, against 9 us for an
    open, read and close: two reads a step were most of the hooks' cost on a 0.4 ms step). A
    forked DataLoader worker or a new thread has another id and opens its own; a dead thread's
    file fails to read and is opened again."""
    tid = threading.get_native_id()
    for _ in range(2):
        fd = _SCHED_FDS.get(tid)
        try:
            if fd is None:
                fd = _SCHED_FDS[tid] = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            wait = os.pread(fd, 128, 0).split()[1]
            return time.thread_time_ns(), int(wait)
        except (OSError, ValueError):
            if _SCHED_FDS.pop(tid, None) is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                continue                  # a stale file (the thread id was reused): once more
            return None
    return None


def line(step: int, mark: tuple, end: tuple, dur: float, mode: str, profiled: bool, perturbed: bool,
          skipped: bool, save: float = 0.0, log: float = 0.0, starts: tuple = (0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 0),
          opt: float = 0.0, nograd: float = 0.0) -> str:
    """One steps.jsonl line. Formatted by hand (the values are numbers, booleans and a mode from
    SOURCES): json.dumps of the dict cost more than the rest of the hook together."""
    line = (f'{{"step": {step}, "end": {end[3]:.6f}, "dur": {dur:.6f}, '
            f'"wait": {end[1] - mark[1]:.6f}, "batches": {end[2] - mark[2]}, '
            f'"mode": "{mode}", "profiled": {_JS[bool(profiled)]}, "perturbed": {_JS[bool(perturbed)]}')
    if end[4] and mark[4]:   # the step's thread on a CPU / waiting for one (schedstat, s)
        # schedstat is read just after the clock: a preemption between the two reads at the
        # step's end moves a few ms between this step and the next; clip to the step's wall
        cpu = min(max(0.0, (end[4][0] - mark[4][0]) / 1e9), max(dur, 0.0))
        runq = min(max(0.0, (end[4][1] - mark[4][1]) / 1e9), max(dur - cpu, 0.0))
        line += f', "cpu": {cpu:.6f}, "runq": {runq:.6f}'
    if len(end) > 5 and len(mark) > 5 and end[5] > mark[5]:  # the process's CPU in that wait (num_workers=0), s
        line += f', "wcpu": {end[5] - mark[5]:.6f}'
    if save > 0:             # inside torch.save and other checkpoint writers (timedcalls.py), s
        line += f', "save": {min(save, max(dur, 0.0)):.6f}'
    if log > 0:              # inside TensorBoard's add_* calls, s
        line += f', "log": {min(log, max(dur, 0.0)):.6f}'
    if opt > 0:              # inside optimizer.step() (optclock.py), s
        line += f', "opt": {min(opt, max(dur, 0.0)):.6f}'
    if nograd > 0:           # inside the root module's calls with grad mode off (nogradcalls.py), s
        line += f', "nograd": {min(nograd, max(dur, 0.0)):.6f}'
    if starts[0] > 0 or starts[1] > 0 or starts[3] > 0:   # DataLoader iterators (loaderiters.py), s
        line += (f', "istart": {starts[0]:.6f}, "ishut": {starts[1]:.6f}, "ifirst": {starts[2]:.6f}, '
                 f'"nfirst": {starts[3]}')
    if starts[4] > 0 or starts[6] > 0:     # peeks found in this step: their time, start and batches
        line += f', "peek": {starts[4]:.6f}, "peek_start": {starts[5]:.6f}, "peek_batches": {starts[6]}'
    if len(starts) > 8 and starts[8] > 0:  # the first draws of iterators re-created every step, with workers
        line += f', "peek_first": {starts[7]:.6f}, "npeek_first": {starts[8]}'
    if len(starts) > 9 and starts[9] > 0:  # the sampler orders those drew without workers (in `peek`)
        line += f', "peek_order": {starts[9]:.6f}'
    return line + (', "skipped": true}\n' if skipped else '}\n')


def dataset_kind(kinds: set) -> str | None:
    """"iterable" when any DataLoader the script iterated reads an IterableDataset (torch's
    _DatasetKind 1: a validation or statistics loader must not hide the training one), "map"
    when all of them are map-style, None when none was iterated."""
    return "iterable" if 1 in kinds else "map" if 0 in kinds else None


def start_mark(end: tuple, now: float) -> tuple:
    """The next step's start at `now`, from the boundary's readings `end` (no second schedstat
    read). The bookkeeping between the two ran on this thread's CPU, so that time is added to
    the CPU reading: the step's `cpu` then covers the same span as its wall time."""
    sched = end[4]
    if sched is not None:
        sched = (sched[0] + int((now - end[0]) * 1e9), sched[1])
    return (now, end[1], end[2], end[3], sched, *end[5:])
