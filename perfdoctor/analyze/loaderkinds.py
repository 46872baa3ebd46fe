"""input.dataset_class, input.per_sample_fetch, input.loader_batch_size, input.default_collate,
input.loader_workers and input.worker_start from child.json's `loaders`
(collect/loaderkinds.py): the training loader is the one that yielded the most batches with
autograd on (an evaluation loop under torch.no_grad() draws its batches with it off: a user's loop
validated 32 batches of 64 every 10 steps, 3.2 a step, beside one training batch of 256), else,
where none says (an older run; a validation loop without no_grad), the one that yielded the most
(an evaluation loader yields fewer: it runs once per epoch or less).

input.dataset_kind from a trace alone (traced_dataset_kind), where it holds Python frames
(with_stack=True) of a loader that fetches in the trainer: torch's map-style fetcher indexes the
dataset, so its `fetch` frame (or the list comprehension in it) calls the Dataset's `__getitem__`
or `__getitems__`; the iterable one calls next() on the dataset's iterator, resuming its
`__iter__` generator (or calling its `__next__`). Only the frames the fetcher calls count: a
`__getitem__` deeper down (an IterableDataset that indexes a map-style one) is the dataset's own
business. (From Python 3.12 the list comprehension has no frame of its own: fetch calls
`__getitem__` itself.)
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import isin, unique
from perfdoctor.analyze.nesting import parents, start_order
from perfdoctor.trace.table import EventTable

FETCH_FRAME_RX = re.compile(r"torch[/\\]utils[/\\]data[/\\]_utils[/\\]fetch\.py\(\d+\): (fetch|<listcomp>)$")
MAP_CALL_RX = re.compile(r"\): __getitems?__$")
ITERABLE_CALL_RX = re.compile(r"\): __(iter|next)__$")


def loader_metrics(loaders) -> dict:
    out = {"input.dataset_class": None, "input.per_sample_fetch": None, "input.loader_batch_size": None,
           "input.default_collate": None, "input.loader_workers": None, "input.worker_start": None}
    rows = [x for x in loaders or [] if isinstance(x, dict) and isinstance(x.get("batches"), int)]
    if not rows:
        return out
    top = max(rows, key=lambda x: (_count(x.get("grad_batches")), x["batches"]))
    cls = top.get("dataset")
    out["input.dataset_class"] = cls if isinstance(cls, str) and cls != "?" else None
    per = top.get("per_sample")
    out["input.per_sample_fetch"] = per if isinstance(per, bool) else None
    dc = top.get("default_collate")
    out["input.default_collate"] = dc if isinstance(dc, bool) else None
    bs = top.get("batch_size")
    out["input.loader_batch_size"] = bs if isinstance(bs, int) and not isinstance(bs, bool) else None
    nw = top.get("workers")
    out["input.loader_workers"] = nw if isinstance(nw, int) and not isinstance(nw, bool) and nw >= 0 else None
    start = top.get("start")
    out["input.worker_start"] = start if start in ("fork", "spawn", "forkserver") else None
    return out


def _count(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def iterable_replayed(m: dict) -> bool | None:
    """input.iterable_replayed: every worker of the training loader iterates its own copy of an
    IterableDataset from the start. True: an IterableDataset read by two or more forked workers
    none of which called get_worker_info() (the usual way to shard); False: a map-style dataset,
    or fewer than two workers, or workers that shard; None where it cannot be known (a trace
    alone, an older run, spawned workers: only forked ones inherit the watch)."""
    kind, workers = m.get("input.dataset_kind"), m.get("input.loader_workers")
    if kind == "map" or (kind == "iterable" and workers is not None and workers < 2):
        return False
    if kind != "iterable" or workers is None or m.get("input.worker_start") != "fork":
        return None
    used = m.get("input.worker_info_used")
    return None if used is None else not used


def traced_dataset_kind(t: EventTable) -> str | None:
    """'map' or 'iterable' from the frames the fetcher's frames call directly; None without such
    frames (no with_stack, or workers fetch: their frames are in other processes)."""
    py = np.flatnonzero((t.ph == ord("X")) & t.cat_mask("python_function"))
    fetch = py[t.name_mask(lambda n: FETCH_FRAME_RX.search(n) is not None)[py]]
    if not len(fetch):
        return None
    is_map, is_iter = t.name_mask(lambda n: MAP_CALL_RX.search(n) is not None), \
        t.name_mask(lambda n: ITERABLE_CALL_RX.search(n) is not None)
    is_next = t.name_mask(lambda n: n == "<built-in function next>")
    kinds = set()
    for tid in unique(t.tid[fetch]):
        rows = py[t.tid[py] == tid]
        rows = rows[start_order(t.ts[rows], t.dur[rows])]
        up = parents(t.ts[rows], t.dur[rows])
        child = up >= 0
        called_by_fetch = np.zeros(len(rows), bool)
        called_by_fetch[child] = isin(rows[up[child]], fetch)
        # next(self.dataset_iter) is a frame of its own (<built-in function next>) between them
        via_next = called_by_fetch & is_next[rows]
        called_by_next = np.zeros(len(rows), bool)
        called_by_next[child] = via_next[up[child]]
        if (called_by_fetch & is_map[rows]).any():
            kinds.add("map")
        if ((called_by_fetch | called_by_next) & is_iter[rows]).any():
            kinds.add("iterable")
    return kinds.pop() if len(kinds) == 1 else None
