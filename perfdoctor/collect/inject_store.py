"""store_samples, in `perfdoctor tune`'s trials: the most that preprocessing the data set once (PD306) can give.

PD306's fix is the script's own work (resize, convert, tokenise once and save the result); tune
cannot write it, but it can measure a loader that has nothing left to prepare. With
store_samples=True a DataLoader over a map-style dataset is built over StoredSamples instead:
when the loader is built, in the trainer, a pool of samples (dataset[i] for indices drawn with a
fixed seed: POOL_BATCHES batches' worth, at most POOL_BYTES and POOL_S seconds, at least one
sample) is prepared, and dataset[i] then returns the pool's sample i % len(pool). Every step the
loader still fetches samples one by one, collates them, pins them and, with workers, hands them
over (workers get the pool with the dataset): what stays after preprocessing. The epoch keeps its
length and its batch count; attributes (`loader.dataset.classes`) read through to the dataset.

An upper bound of the fix, said so wherever it is shown: random augmentations are frozen with
the sample (the fix keeps them per sample), a pool of a few batches is read from the CPU's caches
where a stored data set is read from RAM or storage, and the steps train on the pool's samples
(tune does not compare the losses of this trial). Never a setting to apply (session: not a
"best"), a measurement of PD306's ceiling and of the room it leaves.

An IterableDataset (a stream of parsed files, say) is built over StoredStream: the pool is its
first samples, and an epoch replays the pool in order for as many samples as the stream's own
epoch holds: its len() where it has one, else the samples its first pass yields, counted while
the loader is built within the same POOL_S (a stream that runs past it replays without end: the
trial's run stops at its duration, and the epoch ends the stream's baseline pays are left out).
A stream built again (a loader made per epoch over a new instance: `for b in
DataLoader(Files(), ...)`) gets the pool and count of the first instance of its class with the
same plain attributes (strings, numbers: a path, a split), not a new pass inside the run's
steps; two streams of one class told apart only by other attributes (a list of files) share
the first one's pool. With workers each worker yields its share of the epoch, as a stream
sharded by get_worker_info does (one that every worker replays whole has epochs that many times
longer in the baseline).

Left alone: a TensorDataset or a Subset of one (its samples are stored tensors already: PD358's
case), a map-style dataset without a length or an empty one, an empty stream, a dataset already
stored (a loader built again on `loader.dataset`: Lightning's re-instantiation), and one whose
first samples raise (the trial then fails as not applied, with the error in its notes).
"""

from __future__ import annotations

import operator
import random
import time

POOL_BATCHES = 4              # batches' worth of samples prepared ahead
POOL_MIN = 64                 # samples, whatever the batch size (batch_size=None, 1)
POOL_BYTES = 256 * 2 ** 20    # the pool's tensors and arrays, at most
POOL_S = 10.0                 # seconds preparing it, at most (the loader's construction waits for it)
_STREAMS: dict = {}           # a stream's class and plain attributes -> (pool, count) prepared for it


class StoredSamples:
    """A map-style dataset whose samples were prepared once (module doc)."""

    def __init__(self, dataset, pool: list):
        self.dataset = dataset
        self.pool = pool

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        # Any integer is an index: a SubsetRandomSampler over a numpy array of indices (a train/val
        # split) yields numpy.int64, a sampler over torch.randperm 0-d tensors; served from the dataset,
        # they left the trial measuring the unprepared loader as the bound.
        try:
            k = None if isinstance(i, bool) else operator.index(i)
        except TypeError:
            k = None
        if k is not None:
            return self.pool[k % len(self.pool)]
        return self.dataset[i]                 # a key that is no index (a sampler of lists, strings)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("dataset", "pool"):   # __getitems__: per-index fetches, stored
            raise AttributeError(name)
        return getattr(self.dataset, name)


class StoredStream:
    """An IterableDataset whose first samples were prepared once (module doc). Registered as an
    IterableDataset when first used (no torch import here); a worker only iterates it."""

    def __init__(self, dataset, pool: list, count: int | None):
        self.dataset = dataset
        self.pool = pool
        self.count = count                     # samples in the stream's epoch; None: without end

    def __len__(self):
        if self.count is None:
            raise TypeError(f"{type(self.dataset).__name__} has no len()")
        return self.count

    def __iter__(self):
        from torch.utils.data import get_worker_info
        info, n, start = get_worker_info(), self.count, 0
        if info is not None and n is not None:
            n, start = n // info.num_workers + (info.id < n % info.num_workers), info.id
        i = 0
        while n is None or i < n:
            yield self.pool[(start + i) % len(self.pool)]
            i += 1

    def __getattr__(self, name):
        if name.startswith("__") or name in ("dataset", "pool", "count"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def store_samples(a: dict, torch) -> str | None:
    """Rewrite DataLoader(...)'s bound arguments `a` for store_samples (module doc): None when it
    did, else why the loader is left alone (said in the notes only when it is a failure)."""
    from torch.utils.data import IterableDataset, Subset, TensorDataset

    ds = a.get("dataset")
    base = ds.dataset if isinstance(ds, Subset) else ds
    if isinstance(ds, (StoredSamples, StoredStream)):
        return "stored already"
    if isinstance(ds, IterableDataset):
        return _store_stream(a, ds, IterableDataset, torch)
    if isinstance(base, TensorDataset) or not hasattr(ds, "__getitem__"):
        return "not a map-style dataset to prepare"
    try:
        n = len(ds)
    except TypeError:
        return "a dataset without a length"
    if n <= 0:
        return "an empty dataset"
    want = min(n, _pool_size(a))
    order = random.Random(0).sample(range(n), want)
    pool, size, t0 = [], 0, time.monotonic()
    for i in order:
        try:
            sample = ds[i]
        except Exception as exc:
            return f"dataset[{i}] failed ({type(exc).__name__}: {exc})"
        pool.append(sample)
        size += _nbytes(sample, torch)
        if size >= POOL_BYTES or time.monotonic() - t0 >= POOL_S:
            break
    a["dataset"] = StoredSamples(ds, pool)
    return None


def _pool_size(a: dict) -> int:
    bs = a.get("batch_size")
    return max(POOL_MIN, POOL_BATCHES * (bs if isinstance(bs, int) and bs > 0 else 1))


def _store_stream(a: dict, ds, iterable_class, torch) -> str | None:
    """store_samples for an IterableDataset: the pool is its first samples; the epoch's length is
    its len(), or counted on through its first pass within POOL_S (module doc)."""
    key = _stream_key(ds)
    got = _STREAMS.get(key) if key is not None else None
    if got is None:
        got = _prepare_stream(ds, _pool_size(a), torch)
        if isinstance(got, str):
            return got
        if key is not None:
            _STREAMS[key] = got
    iterable_class.register(StoredStream)
    a["dataset"] = StoredStream(ds, *got)
    return None


def _prepare_stream(ds, want: int, torch) -> tuple[list, int | None] | str:
    """(pool, count) of a stream, or why it is left alone."""
    try:
        count = len(ds)
    except Exception:
        count = None
    pool, size, seen, t0 = [], 0, 0, time.monotonic()
    try:
        for sample in iter(ds):
            seen += 1
            if len(pool) < want and size < POOL_BYTES:
                pool.append(sample)
                size += _nbytes(sample, torch)
            elif count is not None:
                break
            if time.monotonic() - t0 >= POOL_S:
                break
        else:
            count = seen if count is None else count   # the whole first pass: its length
    except Exception as exc:
        return f"the stream's sample {len(pool)} failed ({type(exc).__name__}: {exc})"
    return (pool, count) if pool else "an empty stream"


def _stream_key(ds) -> tuple | None:
    """A stream's class and its plain attributes: the same stream built again (module doc)."""
    try:
        plain = tuple(sorted((k, v) for k, v in vars(ds).items()
                             if isinstance(v, (str, bytes, int, float, bool, type(None)))))
    except TypeError:                    # no __dict__ (slots)
        return None
    return type(ds).__module__, type(ds).__qualname__, plain


def _nbytes(x, torch, depth: int = 0) -> int:
    """The bytes of a sample's tensors and arrays (containers walked a few levels deep)."""
    if isinstance(x, torch.Tensor):
        return x.element_size() * x.nelement()
    nb = getattr(x, "nbytes", None)
    if isinstance(nb, int):
        return nb
    if depth < 3 and isinstance(x, (list, tuple)):
        return sum(_nbytes(v, torch, depth + 1) for v in x)
    if depth < 3 and isinstance(x, dict):
        return sum(_nbytes(v, torch, depth + 1) for v in x.values())
    return 0
