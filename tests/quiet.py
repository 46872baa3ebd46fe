"""Timing acceptance tests need the machine to themselves: how busy is it, before and during?

Some tests compare perfdoctor's figures with independent reruns of a script (tune's trials, a
checkpoint fix's gain). On a 2-core machine one busy neighbour halves a DataLoader worker's
speed, so a neighbour that starts halfway through such a test changes the truth it measures.
`busy_cores()` looks before the test starts; `Foreign()` measures, over the whole test, the CPU
time this test's own processes did not use (every core's busy time from /proc/stat, less the
CPU time of this process and of the children it waited for: perfdoctor, the scripts, their
DataLoader workers). A test skips, with the figure, when either says the machine was shared.

The suite runs in parallel worker processes (pytest-xdist, `-n` in pyproject's addopts), so such a
test would always find the other worker busy. It is marked `quiet`, and conftest runs every test
inside `machine_share()`: a quiet test holds the machine exclusively (it waits for the test the
other workers are running to end, and they start no other until it is done), every other test
holds it shared. A quiet test whose next test is quiet too (parametrized ones, neighbours in a
file) passes its hold on to it, which would otherwise wait again for a test the other worker
started. (Moving a file's quiet tests to its end, to make more of them neighbours, put the
checkpoint gain test after a test that writes 1.5 GB of checkpoints, and it failed its 25% in two
CI runs in a row, 28% off, cause not proven: tests keep the order they are written in.)
"""

from __future__ import annotations

import fcntl
import os
import resource
import time
from contextlib import contextmanager

import pytest

QUIET = 0.5            # cores of other work a timing acceptance test tolerates
_exclusive = False     # this worker holds the machine for a quiet test (machine_share)


_held: list = []        # the lock files of a quiet test's exclusive hold, kept for the next quiet test


@contextmanager
def machine_share(config: pytest.Config, exclusive: bool, keep: bool = False):
    """Hold the machine shared, or exclusively for a quiet test, across the workers of one session.

    A readers-writer lock from two flock(2) files: every test passes through the gate; a quiet
    test keeps the gate while it waits for the main lock exclusively, so no test starts in the
    meantime and none starves it. A worker that dies releases its locks with its files.
    `keep`: the next test of this worker is quiet too, and the exclusive hold passes on to it
    (taking it again meant waiting, the whole machine idle but one worker, for the test the
    other worker had started in between: the 38 quiet tests waited ~2 minutes of a suite)."""
    if not hasattr(config, "workerinput"):     # one process runs every test: nothing to share
        with _holding(exclusive):
            yield
        return
    if _held and not exclusive:                # never: a hold is kept only for a quiet test
        _release()
    if not _held:
        # xdist gives each worker a base temp folder inside the session's, which pytest cleans up
        base = config._tmp_path_factory.getbasetemp().parent / "machine"
        gate, main = open(f"{base}.gate", "a"), open(f"{base}.main", "a")
        _held[:] = [gate, main]
        fcntl.flock(gate, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(main, fcntl.LOCK_EX)
        else:
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        with _holding(exclusive):
            yield
    finally:
        if not (exclusive and keep):
            _release()


def _release() -> None:
    """Unlock and close the held lock files: unlocked, not only closed, since a process the test
    forked (a DataLoader worker) shares the open files, and closing ours would leave the lock
    held while it lives."""
    for f in _held:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
    _held.clear()


@contextmanager
def _holding(exclusive: bool):
    """Says to skip_if_shared, for the test's length, whether this worker holds the machine alone."""
    global _exclusive
    _exclusive = exclusive
    try:
        yield
    finally:
        _exclusive = False


def _stat() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]     # guest time is in user already
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / hz, sum(v) / hz          # idle and iowait are not busy


def _own() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def busy_cores(seconds: float = 1.0) -> float:
    """Cores busy right now (over a few seconds), while this test runs nothing."""
    try:
        b0, _ = _stat()
        t0 = time.monotonic()
        time.sleep(seconds)
        b1, _ = _stat()
    except OSError:
        return 0.0
    return (b1 - b0) / (time.monotonic() - t0)


class Foreign:
    """Cores of other processes' work, on average, from start() to cores()."""

    def __init__(self):
        self.start()

    def start(self) -> "Foreign":
        try:
            self.b0, self.o0, self.t0 = _stat()[0], _own(), time.monotonic()
        except OSError:
            self.b0 = None
        return self

    def cores(self) -> float:
        if self.b0 is None:
            return 0.0
        b1, o1, t1 = _stat()[0], _own(), time.monotonic()
        return max(0.0, ((b1 - self.b0) - (o1 - self.o0)) / max(t1 - self.t0, 1e-6))


def skip_if_shared(foreign: Foreign | None = None, seconds: float = 1.0) -> None:
    """Skip the calling test when other work kept QUIET cores or more busy (before it, or during
    it when `foreign` is given)."""
    if not _exclusive:
        pytest.fail("a test that judges timings must be marked @pytest.mark.quiet: it would share the "
                    "machine with the other test workers")
    busy = busy_cores(seconds) if foreign is None else foreign.cores()
    when = "before this test" if foreign is None else "while this test ran"
    if busy > QUIET:
        pytest.skip(f"other processes kept {busy:.1f} cores busy {when}: the timings would measure them")


def interleaved_speedup(before, after, pairs: int) -> float:
    """How many times faster `after()` runs than `before()`: the median over `pairs` interleaved
    pairs of wall times (an odd count), timed on a quiet machine (the test skips otherwise)."""
    skip_if_shared()
    foreign = Foreign()
    ratios = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        before()
        t1 = time.perf_counter()
        after()
        ratios.append((t1 - t0) / (time.perf_counter() - t1))
    skip_if_shared(foreign)
    return sorted(ratios)[len(ratios) // 2]
