"""What each DataLoader the script iterates reads, and how it fetches a batch (for child.json).

LoaderKinds.count(it) runs for every batch a DataLoader iterator yields (hooks.py's __next__
wrapper): the first batch of an iterator describes it (a dict lookup a batch after that), and
batches are counted per description. info() lists the descriptions, most batches first:

  dataset        the dataset's class name ("Subset of X" for a Subset of X); module: its module
  per_sample     True when a batch is made sample by sample: map-style, automatic batching
                 (batch_size set), and a dataset without __getitems__, so the fetcher calls
                 dataset[i] once per sample and default_collate stacks the results
  batch_size     the loader's batch_size (None: batch_size=None, the sampler yields batches)
  workers        num_workers
  start          how its workers started: fork, spawn or forkserver (None without workers): a
                 forked worker inherits perfdoctor's get_worker_info watch, others do not
  default_collate  torch's default_collate makes the batch (False: the script's collate_fn)
  batches        batches drawn from loaders so described
  grad_batches   of which drawn with autograd on: a validation loop under torch.no_grad() (or
                 inference_mode) draws its batches with it off, a training loop with it on

A TensorDataset fetched sample by sample indexes each of its tensors batch_size times and stacks
the rows again, where one indexing with the batch's indices would do (PD358).

watch_worker_info(run_dir): whether the dataset reads get_worker_info() in its workers (an
IterableDataset that shards its stream), a marker file in the run directory.
"""

from __future__ import annotations

import os
import sys

MAX_KINDS = 16          # descriptions kept (a script making loaders of many dataset classes)
WORKER_INFO_MARKER = "worker_info.marker"     # a DataLoader worker read get_worker_info()


class LoaderKinds:
    def __init__(self):
        self.batches: dict[tuple, list] = {}      # description -> [batches, of which with autograd on]

    def count(self, it, grad: bool = True) -> None:
        key = it.__dict__.get("_perfdoctor_kind")
        if key is None:
            key = it.__dict__["_perfdoctor_kind"] = _describe(it)
        c = self.batches.get(key)
        if c is None:
            if len(self.batches) >= MAX_KINDS:
                return
            c = self.batches[key] = [0, 0]
        c[0] += 1
        c[1] += bool(grad)

    def info(self) -> list[dict]:
        return [{"dataset": k[0], "module": k[1], "per_sample": k[2], "batch_size": k[3], "workers": k[4],
                 "default_collate": k[5], "start": k[6], "batches": n, "grad_batches": g}
                for k, (n, g) in sorted(self.batches.items(), key=lambda kv: -kv[1][0])]


def _describe(it) -> tuple:
    try:
        ds, name = it._dataset, None
        # a Subset (random_split) indexes the dataset it wraps one sample at a time whatever
        # __getitems__ it has: it is named, and judged, by that dataset
        for _ in range(8):
            if type(ds).__name__ != "Subset" or not hasattr(ds, "dataset"):
                break
            ds, name = ds.dataset, "Subset of "
        cls = type(ds)
        auto = bool(getattr(it, "_auto_collation", False))
        per_sample = getattr(it, "_dataset_kind", None) == 0 and auto and not callable(getattr(ds, "__getitems__", None))
        loader_bs = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        collate = getattr(it, "_collate_fn", None)
        default = getattr(collate, "__name__", None) == "default_collate" and \
            getattr(collate, "__module__", "").startswith("torch.utils.data")
        return ((name or "") + cls.__name__, cls.__module__, per_sample,
                loader_bs if isinstance(loader_bs, int) else None, int(getattr(it, "_num_workers", 0) or 0), default,
                _start_method(it))
    except Exception:           # an iterator of a torch we do not know
        return ("?", "?", None, None, 0, None, None)


_STARTS = {"ForkProcess": "fork", "SpawnProcess": "spawn", "ForkServerProcess": "forkserver"}


def _start_method(it) -> str | None:
    """fork, spawn or forkserver: how the iterator's worker processes started (their class for a
    loader given a multiprocessing_context, else the process's start method, which starting them
    fixed); None without workers."""
    workers = getattr(it, "_workers", None)
    if not workers:
        return None
    name = type(workers[0]).__name__
    if name in _STARTS:
        return _STARTS[name]
    import multiprocessing
    method = multiprocessing.get_start_method(allow_none=True)
    return method if method in ("fork", "spawn", "forkserver") else None


def watch_worker_info(run_dir: str) -> None:
    """An IterableDataset that shards its stream reads get_worker_info() in the workers: the
    first such read from outside torch (default_collate reads it too) leaves a marker file (a
    forked worker inherits this wrapper; a spawned one does not, and then nothing is seen).
    child.json's worker_info_used says it (PD310)."""
    try:
        import torch.utils.data as data
    except Exception:
        return
    orig = getattr(data, "get_worker_info", None)
    if orig is None or getattr(orig, "_perfdoctor", False):
        return
    marker, seen = os.path.join(run_dir, WORKER_INFO_MARKER), []
    torch_dir = os.path.dirname(os.path.dirname(os.path.dirname(data.__file__))) + os.sep

    def get_worker_info():
        info = orig()
        # torch's own callers (default_collate's shared-memory check) are not the dataset's
        if info is not None and not seen and not sys._getframe(1).f_code.co_filename.startswith(torch_dir):
            seen.append(True)
            try:
                open(marker, "a").close()
            except OSError:
                pass
        return info
    get_worker_info._perfdoctor = True
    data.get_worker_info = get_worker_info
