"""One step record of `perfdoctor run`: the readings at a step boundary and the steps.jsonl line.

A mark is (perf_counter, cumulative data wait, cumulative batches, unix time, schedstat (SchedReads:
at most once a millisecond), cumulative process CPU inside the data wait of loaders without
workers) taken at a boundary; a step's record is the difference of two marks. steps.jsonl is
written in batches by the session (hooks.py): each of the first FLUSH_FIRST steps at once, then
whenever a step ends FLUSH_S or more after the last write, and at the end. A write(2) a step was
a third of the hooks' cost on a 0.4 ms step. What a batch can lose: a SIGKILL or a
default-action SIGTERM drops the steps not yet written (those since the last write, more if the
script paused after them).
"""

from __future__ import annotations

import os
import threading
import time

FLUSH_S = 0.1                # a step that ends this long after the last write writes the batch
FLUSH_FIRST = 16             # the first steps are written one by one (the live readers wait for them)
REREAD_S = 0.001             # bookkeeping at a boundary longer than this: the next step's start is read afresh
SCHED_EVERY_S = 0.001        # schedstat is read at a boundary this long after the last read (SchedReads)

_JS = {True: "true", False: "false"}


def first_step_recorded(steps_path) -> bool:
    """steps.jsonl holds a step: the first steps are written one by one as they end
    (FLUSH_FIRST), so the live readers in the parent see the first at once."""
    try:
        return os.stat(steps_path).st_size > 0
    except OSError:
        return False


def steps_after_trace(steps_path, want: int) -> int:
    """How many steps (up to `want`) steps.jsonl's last lines hold after its last profiled or
    perturbed step: the undisturbed steps a measurement of a traced run can use so far. `want`
    where the file holds no such step (the trace window not reached, or never recorded: a script
    running its own profiler), so that nothing is waited for. Reads the file's tail only (a fast
    loop writes thousands of lines a second); records not yet written (FLUSH_S) are not counted."""
    try:
        with open(steps_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - 512 * (want + 1))      # ~250 bytes a record
            f.seek(start)
            lines = f.read().splitlines()[1 if start else 0:]     # the first may be cut
    except OSError:
        return 0
    n = 0
    for line in reversed(lines):
        if b'"profiled": true' in line or b'"perturbed": true' in line or n >= want:
            return min(n, want)
        n += line.startswith(b"{") and line.endswith(b"}")
    return want          # no trace window in the file (none yet, or none recorded): nothing to wait for


_SCHED_FDS: dict[int, int] = {}      # threading.get_ident() -> open /proc/thread-self/schedstat
if hasattr(os, "register_at_fork"):  # a forked child keeps the thread's ident, not its thread: open anew
    os.register_at_fork(after_in_child=_SCHED_FDS.clear)


def schedstat() -> tuple[int, int, int] | None:
    """This thread's nanoseconds on a CPU and waiting in a run queue, and its threading ident
    (None where the kernel has no schedstat): per step, `cpu` and `runq` in steps.jsonl.

    The CPU time is the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID), not schedstat's first
    field: the kernel brings a running thread's schedstat runtime up to date only at a scheduler
    tick or a context switch, so on steps shorter than a tick (4 ms at 250 Hz) it read 0 or a
    whole tick, and the tick clipped to a shorter step's wall time lost the rest (a busy Python
    loop read 60% on a CPU). The run-queue wait is only added while the thread is not running,
    so a running thread reads it current.

    The file stays open per thread and is re-read with pread (1 us here, against 9 us for an
    open, read and close: two reads a step were most of the hooks' cost on a 0.4 ms step). A
    new thread opens its own, and a forked child (a DataLoader worker) opens its thread's anew;
    a dead thread's file fails to read and is opened again."""
    tid = threading.get_ident()
    for _ in range(2):
        fd = _SCHED_FDS.get(tid)
        try:
            if fd is None:
                fd = _SCHED_FDS[tid] = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            wait = os.pread(fd, 128, 0).split()[1]
            return time.thread_time_ns(), int(wait), tid
        except (OSError, ValueError):
            if _SCHED_FDS.pop(tid, None) is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                continue                  # a stale file (the thread id was reused): once more
            return None
    return None


class SchedReads:
    """schedstat at step boundaries, read at most once every SCHED_EVERY_S on a thread.

    A boundary closer than that to the last read on its thread (after the first FLUSH_FIRST
    steps) gets [None, None, ident]: not read. Before its steps are written, spread() fills it in
    place with the reading interpolated in wall time between the reads around it (the flush
    reads once more where the last boundary was not read), so a group of steps shorter than
    SCHED_EVERY_S shares its CPU and run-queue time in proportion to their wall time: sums over
    any stretch of steps are exact to within one group, a step's own split is its group's.
    Steps of SCHED_EVERY_S or more are read at both ends, as before. A read costs ~10 us in a
    training loop (cold caches), a few percent of a 0.4 ms step."""

    def __init__(self) -> None:
        self.at = float("-inf")           # perf_counter of the last read
        self.tid = None                   # the thread it was made on
        self.last: tuple | None = None    # (time, reading) of the last read spread() went past

    def at_boundary(self, t: float, steps: int):
        tid = threading.get_ident()
        if tid == self.tid and t - self.at < SCHED_EVERY_S and steps >= FLUSH_FIRST:
            return [None, None, tid]
        got = schedstat()
        if got is not None:
            self.at, self.tid = t, tid
        return got

    def spread(self, recs: list, clock=time.perf_counter) -> None:
        """Fill the unread readings of recs (pending step records, in time order, holding a
        start and an end mark) in place; those with no read after them on their thread keep
        none. A step's start that shares its reading with the last step's end (start_mark) gets
        the same value: the bookkeeping between them is neither step's. The flush's own read,
        where the last boundary was not read, is stamped by `clock`."""
        left, run = self.last, []         # the last read, and the unread readings since: (time, reading)
        for r in recs:
            for m in (r[1], r[2]):
                got = m[4]
                if got is None:
                    continue
                if got[0] is None:
                    if not run or run[-1][1] is not got:
                        run.append((m[0], got))
                    continue
                if run:
                    _fill(left, run, (m[0], got))
                    run = []
                left = (m[0], got)
        if run and run[-1][1][2] == threading.get_ident():
            now = schedstat()                  # the flush's own read closes the last group
            if now is not None:
                right = (clock(), now)
                _fill(left, run, right)
                left = right
        self.last = left


def _fill(left, run: list, right) -> None:
    """The unread readings of `run` between the reads `left` and `right`, in wall time, where
    all are of one thread (a thread's reading never decreases, so neither do the results)."""
    if left is None or left[1][2] != right[1][2]:
        return
    (t0, a), (t1, b) = left, right
    span = t1 - t0
    for t, got in run:
        if got[2] != b[2]:
            continue
        f = min(max((t - t0) / span, 0.0), 1.0) if span > 0 else 1.0
        got[0], got[1] = a[0] + int(f * (b[0] - a[0])), a[1] + int(f * (b[1] - a[1]))


_HEAD = ('{"step": %d, "end": %.6f, "dur": %.6f, "wait": %.6f, "batches": %d, "mode": "%s", "profiled": %s, '
         '"perturbed": %s')


def line(step: int, mark: tuple, end: tuple, dur: float, mode: str, profiled: bool, perturbed: bool,
          skipped: bool, save: float = 0.0, log: float = 0.0, starts: tuple = (0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 0),
          opt: float = 0.0, nograd: float = 0.0, collect: float = 0.0, convert: float = 0.0,
          pre: float = 0.0) -> str:
    """One steps.jsonl line. Formatted by hand (the values are numbers, booleans and a mode from
    SOURCES): json.dumps of the dict cost more than the rest of the hook together, and %-formats
    with the clipping spelled out take 2.2 us a line where f-strings with min/max took 3.6."""
    span = dur if dur > 0 else 0.0          # what a part of the step is clipped to
    out = _HEAD % (step, end[3], dur, end[1] - mark[1], end[2] - mark[2], mode, _JS[bool(profiled)],
                   _JS[bool(perturbed)])
    a, b = mark[4], end[4]
    if a and b and a[0] is not None and b[0] is not None:   # the step's thread on a CPU / waiting for one (schedstat, s)
        # schedstat is read just after the clock: a preemption between the two reads at the
        # step's end moves a few ms between this step and the next; clip to the step's wall
        cpu = (b[0] - a[0]) / 1e9
        cpu = 0.0 if cpu < 0 else span if cpu > span else cpu
        runq, rest = (b[1] - a[1]) / 1e9, span - cpu
        runq = 0.0 if runq < 0 else rest if runq > rest else runq
        out += ', "cpu": %.6f, "runq": %.6f' % (cpu, runq)
    if len(end) > 5 and len(mark) > 5 and end[5] > mark[5]:  # the process's CPU in that wait (num_workers=0), s
        out += ', "wcpu": %.6f' % (end[5] - mark[5])
    if save > 0:             # inside torch.save and other checkpoint writers (timedcalls.py), s
        out += ', "save": %.6f' % (save if save < span else span)
    if log > 0:              # inside TensorBoard's add_* calls, s
        out += ', "log": %.6f' % (log if log < span else span)
    if opt > 0:              # inside optimizer.step() (optclock.py), s
        out += ', "opt": %.6f' % (opt if opt < span else span)
    if nograd > 0:           # inside the root module's calls with grad mode off (nogradcalls.py), s
        out += ', "nograd": %.6f' % (nograd if nograd < span else span)
    if collect > 0:          # inside gc.collect() (timedcalls.py), s
        out += ', "gc": %.6f' % (collect if collect < span else span)
    if convert > 0:          # inside torch.tensor / as_tensor on a Python list or tuple (timedcalls.py), s
        out += ', "conv": %.6f' % (convert if convert < span else span)
    if pre > 0:              # from the step's start to the model's first training call, less the data wait, s
        out += ', "pre": %.6f' % (pre if pre < span else span)
    if starts[0] > 0 or starts[1] > 0 or starts[3] > 0:   # DataLoader iterators (loaderiters.py), s
        out += ', "istart": %.6f, "ishut": %.6f, "ifirst": %.6f, "nfirst": %d' % starts[:4]
    if starts[4] > 0 or starts[6] > 0:     # peeks found in this step: their time, start and batches
        out += ', "peek": %.6f, "peek_start": %.6f, "peek_batches": %d' % starts[4:7]
    if len(starts) > 8 and starts[8] > 0:  # the first draws of iterators re-created every step, with workers
        out += ', "peek_first": %.6f, "npeek_first": %d' % starts[7:9]
    if len(starts) > 9 and starts[9] > 0:  # the sampler orders those drew without workers (in `peek`)
        out += ', "peek_order": %.6f' % starts[9]
    return out + (', "skipped": true}\n' if skipped else '}\n')


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
    if sched is not None and sched[0] is not None:
        sched = (sched[0] + int((now - end[0]) * 1e9), *sched[1:])
    return (now, end[1], end[2], end[3], sched, *end[5:])
