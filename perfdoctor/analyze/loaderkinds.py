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
