"""What a DataLoader worker spends making one batch: `perfdoctor run` times torch's fetcher in the workers.

A worker makes a batch in torch's fetcher: `_MapDatasetFetcher.fetch` (the dataset's
__getitem__ per index, or __getitems__, then collate_fn) or `_IterableDatasetFetcher.fetch`
(next() on the dataset's iterator, batch_size times, then collate_fn). Handing the batch to the
trainer (pickling, shared memory, the result queue) comes after it and is not timed. The wrapper
is installed in the trainer and inherited by forked workers (Linux's default start method); a
worker started by spawn or forkserver imports torch afresh without it, and nothing is recorded.
With num_workers=0 the trainer makes its batches itself inside DataLoader.__next__, which the
step records already time (`wait`): those fetches are not recorded here.

Each fetch in a worker adds its wall time, the time the worker's thread waited in the run queue
for a CPU meanwhile (/proc/thread-self/schedstat, read before and after through one open file),
and the time it spent allocating shared memory (UntypedStorage._new_shared, timed while a fetch
runs): in a worker, default_collate stacks each batch straight into a new shared-memory storage,
which costs ~50-75 us per tensor (shm_open, ftruncate, mmap) where the trainer's own collate
allocates ordinary memory; a 32-sample batch of two small tensors took 315 us to collate in a
worker and 45 us in the trainer. `wall - runq - shm` is what making the batch costs on a core of
its own: the dataset's CPU work, any wait on storage, and the collate. The queueing is the price
of sharing the cores, which a trainer loading its own batches on a machine it no longer shares
with its workers would not pay.

Each worker appends a line of its totals to RUN_DIR/loaderfetch.jsonl (one short write with
O_APPEND: lines from several workers do not mix) when its batch count reaches a power of two from
FIRST_FLUSH on, every FLUSH_S while it fetches, and when it exits as its loop returns
(multiprocessing runs its finalizers then). Persistent workers are often not let return: at the
trainer's exit multiprocessing terminates daemonic children (SIGTERM) before the loader shuts
them down. The doubling keeps at least half of such a worker's batches in its last line.
A line: {"pid", "batches", "wall_s", "runq_s", "shm_s", "cpu_s", "first", "last", "at", "probed",
"drew"} (probed, drew: its first fetches probed for random draws, and those that drew: samplerandom.py;
the trainer's own fetches' are child.json "sample_random"; cpu_s:
the worker process's CPU time from its first fetch to the line; first, last, at: Unix times of
its first and latest fetch and of the line). The totals are cumulative: a reader keeps each pid's last line
(analyze/loaderfetch.py). Cost per batch in a worker: two clock reads and two 60-byte procfs
reads, a few microseconds (two more clock reads per shared-memory tensor); the trainer pays a
flag test per shared-memory allocation of its own.
"""

from __future__ import annotations

import json
import os
import sys
import time

from perfdoctor.collect.samplerandom import RandomDraws

FILE = "loaderfetch.jsonl"
FLUSH_S = 10.0          # seconds between a fetching worker's lines
FIRST_FLUSH = 8         # batches before a worker's first line (then at 16, 32, ...)


def _without_this_frame(e: BaseException) -> None:
    """Take the wrapper's own frame (the caller's) off a dataset's exception: a worker's "Original
    Traceback" reads as under plain Python, not through perfdoctor's fetch. A bare `raise` after
    this re-raises without adding the frame again."""
    tb = e.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        e.__traceback__ = tb.tb_next


class _Worker:
    """One worker process's totals (a forked worker inherits the trainer's object: keyed by pid)."""
    __slots__ = ("pid", "batches", "wall", "runq", "shm", "inside", "first", "last", "flushed", "fd", "cpu0", "draws")

    def __init__(self):
        self.pid = os.getpid()
        self.batches, self.wall, self.runq, self.shm = 0, 0.0, 0.0, 0.0
        self.inside = False                 # a fetch is running (shared-memory allocations count)
        self.first = self.last = self.flushed = 0.0
        self.draws = RandomDraws()          # its first fetches' random draws (samplerandom.py)
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:                     # not Linux, or no schedstat: the queueing is unknown (0)
            self.fd = None

    def run_delay(self) -> float:
        """Seconds this thread has waited in the run queue (schedstat's second field)."""
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 96, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0


class FetchTimes:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, FILE)
        self.worker: _Worker | None = None
        self.installed = False
        self.trainer = RandomDraws()        # the trainer's own fetches' draws (num_workers=0)

    def install(self, fetch_module, worker_module, storage_module) -> None:
        """Wrap fetch() of torch.utils.data._utils.fetch's fetchers (`worker_module`:
        torch.utils.data._utils.worker, whose get_worker_info tells a worker process) and
        torch.storage's UntypedStorage._new_shared."""
        times = self
        self._wrap_shared(storage_module)
        for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            cls = getattr(fetch_module, name, None)
            orig = getattr(cls, "fetch", None)
            if orig is None or getattr(orig, "_perfdoctor", False):
                continue

            def fetch(fetcher, index, _orig=orig):
                w = times._mine() if worker_module.get_worker_info() is not None else None   # None: the trainer
                draws = times.trainer if w is None else w.draws
                state = draws.before()
                if w is not None:
                    q0, t0 = w.run_delay(), time.perf_counter()
                    w.inside = True
                try:
                    out = _orig(fetcher, index)
                    draws.after(state)
                    return out
                except BaseException as e:
                    _without_this_frame(e)
                    raise
                finally:
                    if w is not None:
                        w.inside = False
                        w.wall += time.perf_counter() - t0
                        w.runq += w.run_delay() - q0
                        w.batches += 1
                        w.last = time.time()
                        n = w.batches
                        if (n >= FIRST_FLUSH and not n & (n - 1)) or w.last - w.flushed >= FLUSH_S:
                            times.flush()
            fetch._perfdoctor = True
            cls.fetch = fetch
            self.installed = True

    def _wrap_shared(self, storage_module) -> None:
        cls = getattr(storage_module, "UntypedStorage", None)
        orig = getattr(cls, "_new_shared", None)
        func = getattr(orig, "__func__", None)          # a classmethod, bound to the class
        if func is None or getattr(func, "_perfdoctor", False):
            return
        times = self

        def _new_shared(klass, *a, **kw):
            w = times.worker
            if w is None or not w.inside or w.pid != os.getpid():
                return func(klass, *a, **kw)
            t0 = time.perf_counter()
            try:
                return func(klass, *a, **kw)
            finally:
                w.shm += time.perf_counter() - t0
        _new_shared._perfdoctor = True
        cls._new_shared = classmethod(_new_shared)

    def _mine(self) -> _Worker:
        w = self.worker
        if w is None or w.pid != os.getpid():   # the first fetch of this worker process
            w = self.worker = _Worker()
            w.first = w.flushed = time.time()
            w.cpu0 = time.process_time()        # the worker's CPU from its first fetch on
            try:
                from multiprocessing import util
                util.Finalize(None, self.flush, exitpriority=10)   # runs as the worker exits
            except Exception:
                pass
        return w

    def flush(self) -> None:
        w = self.worker
        if w is None or w.pid != os.getpid() or not w.batches:
            return
        w.flushed = time.time()
        line = json.dumps({"pid": w.pid, "batches": w.batches, "wall_s": round(w.wall, 6),
                           "runq_s": round(w.runq, 6), "shm_s": round(w.shm, 6),
                           "cpu_s": round(time.process_time() - w.cpu0, 6),
                           "first": w.first, "last": w.last, "at": w.flushed,
                           "probed": w.draws.probed, "drew": w.draws.drew}) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:                     # the run directory is gone: the totals are lost
            pass
