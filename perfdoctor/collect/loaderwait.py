"""The wait for data: DataLoader iterators' __next__, timed for the step records (hooks.py).

Time inside __next__ (the workers' queue wait, or the whole loading work with num_workers=0) is
summed per step, with the batches drawn; without workers the process's CPU meanwhile (its
intra-op threads too) tells computing from sleeping on storage, a socket or a lock. The
iterators' starts and peeks (loaderiters.py), what each loader reads (loaderkinds.py) and the
workers' own fetch times (loaderfetch.py) are installed here as well.
"""

from __future__ import annotations

import time

from perfdoctor.collect.modules import IN_LOADER


def wrap_next(session) -> None:
    """Time every DataLoader iterator's __next__ for `session` (hooks.Session): its wait, batches,
    the trainer's CPU inside it without workers, iterator starts and peeks, and the workers' fetches."""
    import torch
    from torch.utils.data import dataloader as dl
    base = dl._BaseDataLoaderIter
    grad = torch.is_grad_enabled
    orig = base.__next__
    drew = session.iters.drew
    kinds = session.loader_kinds.count
    try:
        session.iters.install(dl)
    except Exception as exc:
        session.notes.append(f"DataLoader iterator starts cannot be timed ({type(exc).__name__}: {exc})")
    try:
        import torch.storage
        from torch.utils.data._utils import fetch, worker
        session.fetches.install(fetch, worker, torch.storage)
    except Exception as exc:
        session.notes.append(f"DataLoader workers' batches cannot be timed ({type(exc).__name__}: {exc})")

    def __next__(it):
        t0 = time.perf_counter()
        session.window.check_memory(t0)         # a step of many batches can outgrow the trace's budget
        session.dataset_kinds.add(getattr(it, "_dataset_kind", None))
        if session.mode != "optimizer":
            session._on_batch_request(t0)
        got = False
        outer = not getattr(IN_LOADER, "n", 0)
        IN_LOADER.n = 1
        # without workers the trainer makes the batch here: the process's CPU meanwhile (its
        # intra-op threads too) tells computing from sleeping on storage, a socket or a lock
        c0 = time.process_time() if outer and not getattr(it, "_num_workers", 1) else None
        try:
            batch = orig(it)
            got = True                      # the StopIteration ending an epoch is no batch
            return batch
        finally:
            if outer:
                IN_LOADER.n = 0
            dt = time.perf_counter() - t0
            if c0 is not None:
                session.cum_wait_cpu += time.process_time() - c0
            session.cum_wait += dt
            session.cum_batches += got
            drew(it, got, dt)
            if got:
                kinds(it, grad())
    base.__next__ = __next__

