"""DataLoader iterators of `perfdoctor run`: what starting them costs, and the ones started for a peek.

`for batch in loader` (and `iter(loader)`) starts an iterator: the sampler's order is drawn and,
with num_workers > 0 and persistent_workers=False, the worker processes are started afresh. Two
costs of that are easy to miss in a trace and easy to remove:

- a peek: `next(iter(loader))` to read a batch's shape before the epoch (pytorch/examples' DDP
  tutorial does it), or an iterator re-created every step. The iterator draws a batch or two,
  is dropped, and the next iterator over the same loader starts over. Its start, and the batch
  it drew and its shutdown when that batch was extra to the step, is wasted time.
- a restart: every epoch's iterator starts its workers again unless persistent_workers=True.

On the training thread, per step (steps.jsonl, seconds): the time inside DataLoader.__iter__
(`istart`), inside the shutdown of an iterator that ran out or was dropped (`ishut`: its
workers', or without workers the release of its sampler's order), and inside the first __next__
of each iterator (`ifirst`, `nfirst` of them: fresh workers make their first batch while the
trainer waits). Each iterator's start (a persistent iterator's reset too) begins a generation:
its batches, the time of its __next__ calls, of its start and of its shutdown, and whether it
ran out (StopIteration).

When a new generation of the same loader starts, the previous one is a peek if it drew at most
PEEK_MAX batches, fewer than the loader's length (a loop that stops at len(loader) never sees
StopIteration), and did not run out. Its time (start, batches, shutdown) is added to the step
where that is found (`peek` seconds, of which `peek_start` its start, and `peek_batches`):
normally the step of the peek itself, since the loop's own iterator starts right after; a
shutdown after that (`it = iter(loader)` drops the old iterator once the new one has started) is
added to its own step. A peek started in an earlier step (an iterator re-created every step,
whose one batch was that step's batch) adds its start and shutdown, and, when the loader has
workers, its first draw (`peek_first`, `npeek_first` of them): fresh workers make that batch
while the trainer waits, where a kept iterator's workers would have had it ready; the analysis
counts its wait beyond the usual one (analyze/loaderstarts.py). Without workers, a new
iterator's first draw draws the sampler's order (RandomSampler's randperm of the whole dataset
and a list of it, in the first __next__), and dropping the iterator frees that list: the draw
(`peek_order`, also in `peek`) is added, less the one order an epoch a kept iterator still draws,
and the release is the iterator's shutdown (both timed by a wrapper of the iterator's sampler
iterator). A 2-core VM, a shuffled TensorDataset of 2M rows and `next(iter(loader))` every step:
they were nearly all of a 197 ms step (14.5 ms with one iterator kept), and nothing counted them.

A generation called a peek that draws again later was not one (two iterators of one loader used
in turn): child.json `loader_iters.relabelled` counts them, and the analysis then claims nothing.
"""

from __future__ import annotations

import threading
import time

PEEK_MAX = 2          # batches a dropped iterator may have drawn and still be a peek


class Generation:
    """One start of a loader's iterator (a persistent iterator's reset too), until the next one."""
    __slots__ = ("batches", "draw_s", "first_s", "order_s", "start_s", "shut_s", "ran_out", "peek", "step", "size",
                 "workers")

    def __init__(self, start_s: float, step: int, size: int, workers: int = 0):
        self.batches, self.draw_s, self.first_s, self.start_s, self.shut_s = 0, 0.0, 0.0, start_s, 0.0
        self.order_s = 0.0                      # without workers: the sampler's first draw (its order)
        self.ran_out = self.peek = False
        self.step = step                        # the step it started in (LoaderIters.serial)
        self.size = size                        # the loader's length: a loop may stop there
        self.workers = workers                  # the loader's num_workers


_NONE = (0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 0, 0.0)   # take() of a step with no iterator event


class _TimedOrder:
    """A single-process iterator's sampler iterator, wrapped: the time of its first draw (the
    sampler draws its order there: RandomSampler's randperm of the whole dataset, and a list of
    it) and of its release with the iterator (that list freed). One flag test a batch after that."""
    __slots__ = ("inner", "gen", "iters", "first")

    def __init__(self, inner, gen: Generation, iters: "LoaderIters"):
        self.inner, self.gen, self.iters, self.first = inner, gen, iters, True

    def __iter__(self):
        return self

    def __next__(self):
        if not self.first:
            return next(self.inner)
        self.first = False
        t0 = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.gen.order_s = time.perf_counter() - t0

    def __del__(self):
        try:
            inner, self.inner = self.inner, None
            t0 = time.perf_counter()
            del inner
            if threading.get_ident() == self.iters.thread:
                self.iters.shut(self.gen, time.perf_counter() - t0)
        except Exception:                       # at interpreter exit; never the script's stderr
            pass


class LoaderIters:
    def __init__(self):
        self.thread = threading.get_ident()     # the thread that runs the steps
        self._reset()
        self.last: dict[int, Generation] = {}   # id(loader) -> its current generation
        self.loaders: dict[int, dict] = {}      # id(loader) -> {"workers", "persistent", "prefetch"} (its first start's)
        self.serial = 0                         # take() calls: the step now running
        self.peeks = 0
        self.relabelled = 0
        self.installed = False
        self.single = None                      # torch's single-process iterator class

    def _reset(self) -> None:
        """The step's sums (take() reads them): seconds in DataLoader.__iter__, in iterator
        shutdowns, in each iterator's first __next__ and how many; the peeks found (seconds, of
        which their start, and the batches they drew in this step; the first draws of those
        started in an earlier step with workers, and how many; without workers, their orders)."""
        self.istart = self.ishut = self.ifirst = 0.0
        self.nfirst = 0
        self.peek_s = self.peek_start = self.peek_first = self.peek_order = 0.0
        self.peek_batches = self.npeek_first = 0
        self.dirty = False                      # any of them set since: take() builds its tuple

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
        self.single = getattr(dl, "_SingleProcessDataLoaderIter", None)
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
                    iters.shut(getattr(it, "_perfdoctor_gen", None), time.perf_counter() - t0)
            mp._shutdown_workers = _shutdown_workers
        self.installed = True

    def started(self, loader, it, dt: float) -> None:
        key = id(loader)
        if getattr(it, "_perfdoctor_again", False):     # tune's keep_iterator handed it out again: no start
            it._perfdoctor_again = False
            return
        self.istart += dt
        self.dirty = True
        prev = self.last.get(key)
        if (prev is not None and prev.batches <= PEEK_MAX and prev.batches < prev.size
                and not prev.ran_out and not prev.peek):
            prev.peek = True                    # a peek: found now, counted in this step
            if prev.step == self.serial:        # it drew in this step: those batches are this step's extra
                self.peek_s += prev.draw_s + prev.shut_s
                self.peek_batches += prev.batches
            else:                               # re-created every step: its batch was its step's own
                # and the sampler's order it drew, which a kept iterator draws once an epoch
                order = prev.order_s * max(0.0, 1.0 - 1.0 / max(1, prev.size))
                self.peek_s += prev.shut_s + order
                self.peek_order += order
                if prev.workers > 0 and prev.batches > 0:
                    self.peek_first += prev.first_s
                    self.npeek_first += 1
            self.peek_s += prev.start_s
            self.peek_start += prev.start_s
            self.peeks += 1
        if key not in self.loaders:
            pf = getattr(loader, "prefetch_factor", None)
            self.loaders[key] = {"workers": int(getattr(loader, "num_workers", 0) or 0),
                                 "persistent": bool(getattr(loader, "persistent_workers", False)),
                                 "prefetch": pf if isinstance(pf, int) and not isinstance(pf, bool) else None}
        try:                                    # a loop that stops at len(loader) never sees StopIteration
            size = len(loader)
        except Exception:                       # an IterableDataset without __len__
            size = PEEK_MAX + 1
        gen = self.last[key] = Generation(dt, self.serial, size, self.loaders[key]["workers"])
        it._perfdoctor_gen = gen
        inner = getattr(it, "_sampler_iter", None)
        if self.single is not None and type(it) is self.single and inner is not None:   # torch's own
            it._sampler_iter = _TimedOrder(inner, gen, self)

    def shut(self, gen: Generation | None, dt: float) -> None:
        """An iterator's shutdown on the training thread (dt seconds): its workers', or without
        workers the release of its sampler's order (the list freed with it). Before the next start
        it is the generation's, counted with it when it is called a peek; after (`it = iter(loader)`
        drops the old iterator once the new one has started) it is this step's peek time when the
        generation was called one."""
        self.ishut += dt
        self.dirty = True
        if gen is None:
            return
        if gen.peek:
            self.peek_s += dt
        else:
            gen.shut_s += dt

    def drew(self, it, got: bool, dt: float) -> None:
        """After one __next__ of an iterator started through DataLoader.__iter__."""
        gen = getattr(it, "_perfdoctor_gen", None)
        if gen is None:
            return
        if not got:
            gen.ran_out = True
            return
        if gen.batches == 0:
            self.ifirst += dt
            self.nfirst += 1
            self.dirty = True
            gen.first_s = dt
        gen.batches += 1
        gen.draw_s += dt
        if gen.peek:                            # called a peek, and drawing again: it was not one
            gen.peek = False
            self.relabelled += 1

    def take(self) -> tuple:
        """(istart, ishut, ifirst, nfirst, peek, peek_start, peek_batches, peek_first, npeek_first,
        peek_order) since the last take: the step that just ended (takes and iterator starts both
        run on the training thread)."""
        self.serial += 1
        if not self.dirty:                      # most steps: nothing started, shut or drawn first
            return _NONE
        out = (self.istart, self.ishut, self.ifirst, self.nfirst, self.peek_s, self.peek_start, self.peek_batches,
               self.peek_first, self.npeek_first, self.peek_order)
        self._reset()
        return out

    def info(self) -> dict:
        """child.json `loader_iters`."""
        loaders = list(self.loaders.values())
        return {"installed": self.installed, "loaders": len(loaders), "peeks": self.peeks,
                "relabelled": self.relabelled,
                "workers": max((x["workers"] for x in loaders), default=0),
                "prefetch": max((x["prefetch"] for x in loaders if x.get("prefetch")), default=None),
                "restarting": any(x["workers"] > 0 and not x["persistent"] for x in loaders)}
