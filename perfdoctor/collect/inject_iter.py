"""`perfdoctor tune`'s keep_iterator trial (PD355): a loader's peeking iterator kept, not re-created.

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
"""

from __future__ import annotations

import os
import weakref

PEEK_MAX = 2          # batches a dropped iterator may have drawn and still be a peek (collect/loaderiters.py)


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
