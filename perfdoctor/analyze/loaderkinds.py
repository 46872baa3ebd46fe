"""input.dataset_class, input.per_sample_fetch, input.loader_batch_size and
input.default_collate from child.json's `loaders`
(collect/loaderkinds.py): the loader that yielded the most batches is the training one (an
evaluation loader yields fewer: it runs once per epoch or less)."""

from __future__ import annotations


def loader_metrics(loaders) -> dict:
    out = {"input.dataset_class": None, "input.per_sample_fetch": None, "input.loader_batch_size": None,
           "input.default_collate": None}
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
    return out
