"""input.dataset_class, input.per_sample_fetch, input.loader_batch_size, input.default_collate,
input.loader_workers and input.worker_start from child.json's `loaders`
(collect/loaderkinds.py): the loader that yielded the most batches is the training one (an
evaluation loader yields fewer: it runs once per epoch or less)."""

from __future__ import annotations


def loader_metrics(loaders) -> dict:
    out = {"input.dataset_class": None, "input.per_sample_fetch": None, "input.loader_batch_size": None,
           "input.default_collate": None, "input.loader_workers": None, "input.worker_start": None}
    rows = [x for x in loaders or [] if isinstance(x, dict) and isinstance(x.get("batches"), int)]
    if not rows:
        return out
    top = max(rows, key=lambda x: x["batches"])
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
