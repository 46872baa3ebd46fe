"""How the loader draws batches, in `perfdoctor tune`'s trials: keep_iterator (PD355), index_batches (PD358).

keep_iterator: a loader's peeking iterator kept, not re-created.

With keep_iterator=True, `iter(loader)` hands out the loader's last iterator again when that one
drew at most PEEK_MAX batches since it was handed out (a peek: `next(iter(loader))` every step,
or to read a batch's shape before the epoch) and has batches left: a new iterator starts only
when the last one has yielded the loader's length (it ran out) or was used for more than a peek.
That is the fix's code (`it = iter(loader)` once, `next(it)` each step, a new iterator when it runs
out): the sampler's order is drawn, and workers are started, once an epoch. An epoch loop that
stops early starts its next epoch afresh, as it did; a loader without a length or over an
IterableDataset is left alone (where it ran out is only known by its StopIteration). A peek
before an epoch is then the epoch's first batch: the epoch trains on one batch fewer.

Either way the script's iterator starts are counted (inject.json `iterator_starts`; under the
trial also `iterator_reuses`, and `keep_iterator` applied once an iterator was handed out again).

index_batches: a DataLoader over a TensorDataset (or a Subset of one) that fetches sample by
sample (batch_size set, torch's default collate, no batch_sampler) is built with a BatchSampler
over the sampler it would have had (its own, else RandomSampler with shuffle=True, else
SequentialSampler) as its sampler and batch_size=None: the dataset is indexed once per batch with
the batch's indices, one gather per tensor, PD358's code. The batches hold the same rows in the
same order (the same sampler draws them); `loader.batch_size` reads None.
"""

from __future__ import annotations

import os
import weakref

from perfdoctor.collect.loaderiters import PEEK_MAX    # what the run calls a peek, the trial keeps


def keep_iterators(torch, st) -> None:
    from torch.utils.data import DataLoader

    orig = DataLoader.__iter__
    on = bool(st.changes.get("keep_iterator"))
    last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # loader -> [its iterator, yielded when handed out]

    def __iter__(loader):
        if os.getpid() != st.pid:
            return orig(loader)
        if on:
            entry = last.get(loader)
            drawn = _reusable(loader, entry) if entry is not None else None
            if drawn is not None:
                entry[1] = drawn
                st.iterator_reuses += 1
                st.applied.add("keep_iterator")
                it = entry[0]
                it._perfdoctor_again = True     # for the run's own iterator timing: not a start
                return it
        it = orig(loader)
        st.iterator_starts += 1
        if on:
            try:
                last[loader] = [it, 0]
            except TypeError:                   # a loader that takes no weak reference: left alone
                pass
        return it
    __iter__.__wrapped__ = orig
    DataLoader.__iter__ = __iter__


def _reusable(loader, entry: list) -> int | None:
    """The batches the kept iterator has yielded when it is a peek's (at most PEEK_MAX drawn since
    it was handed out) with batches left, else None."""
    it, handed = entry
    drawn = getattr(it, "_num_yielded", None)
    if not isinstance(drawn, int) or getattr(it, "_dataset_kind", None) != 0:    # 0: map-style
        return None
    try:
        left = drawn < len(loader)
    except TypeError:
        return None
    return drawn if left and drawn - handed <= PEEK_MAX else None


def index_batches(a: dict) -> bool:
    """Rewrite DataLoader(...)'s bound arguments `a` for index_batches (module doc); whether it did."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, Subset, TensorDataset

    ds = a.get("dataset")
    base = ds.dataset if isinstance(ds, Subset) else ds
    bs = a.get("batch_size")
    if (not isinstance(base, TensorDataset) or not isinstance(bs, int) or isinstance(bs, bool) or bs < 2
            or a.get("batch_sampler") is not None or a.get("collate_fn") is not None):
        return False
    sampler = a.get("sampler")
    if sampler is None:
        sampler = RandomSampler(ds, generator=a.get("generator")) if a.get("shuffle") else SequentialSampler(ds)
    a.update(sampler=BatchSampler(sampler, bs, bool(a.get("drop_last"))), batch_size=None, shuffle=None,
             drop_last=False)
    return True
