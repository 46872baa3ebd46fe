"""DataLoader iterators of `perfdoctor run`: what starting them costs, and the ones started for a peek.

`for batch in loader` (and `iter(loader)`) starts an iterator: the sampler's order is drawn and,
with num_workers > 0 and persistent_workers=False, the worker processes are started afresh. Two
costs of that are easy to miss in a trace and easy to remove:

- a peek: `next(iter(loader))` to read a batch's shape before the epoch (pytorch/examples' DDP
  tutorial does it), or an iterator re-created every step. The iterator draws a batch or two,
  is dropped, and the next iterator over the same loader starts over. Its start, and the batch
  it drew when that batch was extra to the step (analyze/loaderstarts.py), is wasted time.
- a restart: every epoch's iterator starts its workers again unless persistent_workers=True.

On the training thread, per step (steps.jsonl, seconds): the time inside DataLoader.__iter__
(`istart`), inside the worker shutdown of an iterator that ran out or was dropped (`ishut`), and
inside the first __next__ of each iterator (`ifirst`, `nfirst` of them: fresh workers make their
first batch while the trainer waits). Each iterator's start (a persistent iterator's reset too)
begins a generation: its batches, the time of its __next__ calls, of its start and of its
shutdown, and whether it ran out (StopIteration).

When a new generation of the same loader starts, the previous one is a peek if it drew at most
PEEK_MAX batches, fewer than the loader's length (a loop that stops at len(loader) never sees
StopIteration), and did not run out. Its time (start, batches, shutdown) is added to the step
where that is found (`peek` seconds, of which `peek_start` its start, and `peek_batches`):
normally the step of the peek itself, since the loop's own iterator starts right after. A peek
started in an earlier step (an iterator re-created every step, whose one batch was that step's
batch) adds its start only. A generation called a peek that draws again later was not one (two
iterators of one loader used in turn): child.json `loader_iters.relabelled` counts them, and the
analysis then claims nothing.
"""

from __future__ import annotations

import threading
import time

PEEK_MAX = 2          # batches a dropped iterator may have drawn and still be a peek


class LoaderIters:
    def __init__(self):
        self.thread = threading.get_ident()     # the thread that runs the steps
        # since the last take(): seconds in DataLoader.__iter__, in worker shutdowns, in the first
        # __next__ of each iterator and how many such first draws; peeks found (seconds, of which
        # start, batches)
        self.acc = [0.0, 0.0, 0.0, 0, 0.0, 0.0, 0]
        self.last: dict[int, list] = {}         # id(loader) -> its current generation
        self.loaders: dict[int, dict] = {}      # id(loader) -> {"workers", "persistent"} (its first start's)
        self.serial = 0                         # take() calls: the step now running
        self.peeks = 0
        self.relabelled = 0
        self.installed = False

    def install(self, dl) -> None:
        """Wrap DataLoader.__iter__ and the worker shutdown (module torch.utils.data.dataloader)."""
        cls = dl.DataLoader
        orig = cls.__iter__
        if getattr(orig, "_perfdoctor", False):
            return
        iters = self

        def __iter__(loader):
            t0 = time.perf_counter()
            it = orig(loader)
            if threading.get_ident() == iters.thread:
                try:
                    iters.started(loader, it, time.perf_counter() - t0)
                except Exception:               # an iterator without attributes (a subclass's own)
                    pass
            return it
        __iter__._perfdoctor = True
        cls.__iter__ = __iter__
        mp = getattr(dl, "_MultiProcessingDataLoaderIter", None)
        shut = getattr(mp, "_shutdown_workers", None)
        if shut is not None:
            def _shutdown_workers(it):
                if getattr(it, "_shutdown", False) or threading.get_ident() != iters.thread:
                    return shut(it)             # already down (a second call), or another thread
                t0 = time.perf_counter()
                try:
                    return shut(it)
                finally:
                    dt = time.perf_counter() - t0
                    iters.acc[1] += dt
                    gen = getattr(it, "_perfdoctor_gen", None)
                    if gen is not None:
                        gen[6] += dt
            mp._shutdown_workers = _shutdown_workers
        self.installed = True

    def started(self, loader, it, dt: float) -> None:
        key = id(loader)
        acc = self.acc
        acc[0] += dt
        prev = self.last.get(key)
        if prev is not None and prev[0] <= PEEK_MAX and prev[0] < prev[7] and not prev[3] and not prev[4]:
            prev[4] = True                      # a peek: found now, counted in this step
            same = prev[5] == self.serial       # it drew in this step: those batches are this step's extra
            acc[4] += prev[2] + ((prev[1] + prev[6]) if same else 0.0)
            acc[5] += prev[2]
            acc[6] += prev[0] if same else 0
            self.peeks += 1
        if key not in self.loaders:
            self.loaders[key] = {"workers": int(getattr(loader, "num_workers", 0) or 0),
                                 "persistent": bool(getattr(loader, "persistent_workers", False))}
        try:                                    # a loop that stops at len(loader) never sees StopIteration
            size = len(loader)
        except Exception:                       # an IterableDataset without __len__
            size = PEEK_MAX + 1
        # batches, draw seconds, start seconds, ran out, called a peek, the step it started in,
        # shutdown seconds, the loader's length
        gen = [0, 0.0, dt, False, False, self.serial, 0.0, size]
        self.last[key] = gen
        it._perfdoctor_gen = gen

    @staticmethod
    def drew(it, got: bool, dt: float, iters: "LoaderIters") -> None:
        """After one __next__ of an iterator started through DataLoader.__iter__."""
        gen = getattr(it, "_perfdoctor_gen", None)
        if gen is None:
            return
        if got:
            if gen[0] == 0:
                iters.acc[2] += dt
                iters.acc[3] += 1
            gen[0] += 1
            gen[1] += dt
            if gen[4]:                          # called a peek, and drawing again: it was not one
                gen[4] = False
                iters.relabelled += 1
        else:
            gen[3] = True

    def take(self) -> tuple:
        """(istart, ishut, ifirst, nfirst, peek, peek_start, peek_batches) since the last take:
        the step that just ended (takes and iterator starts both run on the training thread)."""
        out, self.acc = tuple(self.acc), [0.0, 0.0, 0.0, 0, 0.0, 0.0, 0]
        self.serial += 1
        return out

    def info(self) -> dict:
        """child.json `loader_iters`."""
        loaders = list(self.loaders.values())
        return {"installed": self.installed, "loaders": len(loaders), "peeks": self.peeks,
                "relabelled": self.relabelled,
                "workers": max((x["workers"] for x in loaders), default=0),
                "restarting": any(x["workers"] > 0 and not x["persistent"] for x in loaders)}
