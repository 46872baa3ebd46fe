"""Zero-code changes injected into the user's script for `perfdoctor tune`'s trials.

Called by the run hooks right after the script imports torch: `apply(torch, changes, run_dir)`
with `changes` a dict from the run configuration (None outside `tune`: nothing is touched). Each
key is one change the user could make by hand; the script itself is never edited:

| key | effect |
|---|---|
| num_workers, persistent_workers, prefetch_factor, pin_memory | DataLoader(...) arguments, replaced at construction |
| threads | torch intra-op threads of the trainer (the script's own set_num_threads is overridden) |
| cudnn_benchmark | torch.backends.cudnn.benchmark = True |
| tf32 | torch.set_float32_matmul_precision("high") and cuDNN TF32 |
| expandable_segments | PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before the first CUDA allocation) |
| keep_host_memory | True: glibc's malloc keeps freed blocks in the process: MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ in the script's environment (set by the launcher: inject_switches.launch_env), PD393 |
| optimizer | "foreach" or "fused": the torch.optim implementation, where the optimizer class accepts it |
| autocast | "bfloat16" or "float16": torch.autocast around the outermost call of a module with parameters, and around the loss (a torch.nn loss module; functional binary_cross_entropy and huber_loss, which refuse a 16-bit input beside a float32 target) |
| float32 | True: a model with float64 (or bfloat16, float16) parameters trains in float32: at its outermost call it is converted in place (Module.float(): the optimizer keeps the same Parameter objects), tensors of that dtype entering it or any of its submodules become float32, and its float32 outputs take that dtype again, so the code around the model (loss, targets, metrics) still sees it |
| channels_last | True: at its outermost call a module with 4-D (convolution) parameters is converted in place to torch.channels_last (Module.to(memory_format=...): the optimizer keeps the same Parameter objects), and the 4-D floating-point tensors entering it become channels_last |
| compile | True: that outermost module's calls run through torch.compile(module), made at its first call, as `model = torch.compile(model)` would (collect/inject_model.py); a string: that mode |
| recompute | "off": torch.utils.checkpoint.checkpoint(fn, *args) calls fn(*args) directly (activations kept) |
| empty_cache | "off": torch.cuda.empty_cache() returns at once (the caching allocator keeps its free blocks) |
| index_batches | True: a DataLoader over a TensorDataset fetching sample by sample gets a BatchSampler as its sampler and batch_size=None: one indexing a batch (collect/inject_iter.py) |
| store_samples | True: a DataLoader over a dataset (not a TensorDataset; a map-style one or a stream) serves a pool of samples prepared once, when it is built: what preprocessing the data set once (PD306) can give at most (collect/inject_store.py) |
| keep_iterator | True: `iter(loader)` hands out the loader's last iterator again when it was a peek (at most two batches drawn) with batches left, until it runs out (collect/inject_iter.py) |
| anomaly | "off": autograd anomaly detection stays off: the script's set_detect_anomaly(True) and detect_anomaly() (torch.set_anomaly_enabled(True, ...)) leave it off; the numerics are the same (PD374) |
| distribution_checks | "off": torch.distributions checks no arguments (the default validate_args is False, and a distribution built with validate_args=True, or after set_default_validate_args(True), checks none either); the numerics are the same (PD379) |
| attention_dropout | "off": torch.nn.functional.scaled_dot_product_attention runs with dropout_p=0 (nn.MultiheadAttention and the models that call it through torch.nn.functional alike): on a CPU, its fused kernel instead of the math path dropout forces (PD381); training without attention dropout changes the numerics |
| batch_scale | k: a DataLoader built with an int batch_size (no batch_sampler) gets k times that batch_size, so each step trains on k times the samples (PD385: a step that is mostly a fixed cost; tune compares samples per second); the numerics change with the batch |
| gather_select | True: x[idx] on a CPU tensor with a 1-D integer tensor of non-negative row numbers is x.index_select(0, idx), the same rows; its backward index_add_ instead of index_put_(accumulate=True) (PD386; collect/inject_switches.py) |
| save_every | N: the script's checkpoint saves to a file (torch.save, safetensors' save_file, Lightning's TorchCheckpointIO; collect/inject_saves.py) are written in one step of N, the first step that saves included (every save of that step); the others return at once; saves to a buffer always run |

Whatever the changes, the session also records what the script asked for (DataLoader arguments and where each was built,
optimizer classes, its thread count, its activation-checkpoint, torch.cuda.empty_cache,
anomaly-detection and checkpoint-save calls, its DataLoader iterator starts; under float32, the submodules the model's own code fed float64) and each step's loss (inject_loss.py: backward() on a scalar, autograd.grad, torch.func.grad_and_value), and
writes them to <run>/inject.json when the process exits: `tune` needs the script's original
settings to word the code change, and the losses to compare numerics between runs. A CPU loss is
kept as its value, a device's as a detached tensor converted at exit, so no device sync is added
to the step (inject_loss.py).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading

from perfdoctor.collect.inject_iter import index_batches, keep_iterators
from perfdoctor.collect.inject_loss import record_losses
from perfdoctor.collect.inject_model import module_call
from perfdoctor.collect.inject_saves import saves
from perfdoctor.collect.inject_store import StoredSamples, StoredStream, store_samples
from perfdoctor.collect.inject_switches import (attention_dropout, distribution_checks, gather_select, keep_host_memory,
                                               set_anomaly)

DATALOADER_KEYS = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


class _State:
    def __init__(self, torch, changes: dict, run_dir: str):
        self.torch = torch
        self.changes = changes
        self.run_dir = run_dir
        self.pid = os.getpid()
        self.loaders: list[dict] = []            # what each DataLoader(...) asked for, and what it got
        self.optimizers: list[dict] = []
        self.threads_asked: list[int] = []
        self.losses: list = []
        self.notes: list[str] = []
        self.applied: set[str] = set()
        self.local = threading.local()
        self.watch = None                        # child.py's import watcher (apply's `watch`)
        self.steps = None                        # the run's step count so far (apply's `steps`)
        self.saved_at: int | None = None         # the step whose saves save_every last let through
        self.compiled: dict = {}                 # id(module) -> torch.compile(module), from its first call (compile)
        self.converted: dict = {}                # id of each module made float32 -> its former dtype (float32)
        self.channels_last: dict = {}            # id of each outermost module seen -> made channels_last (channels_last)
        self.inner_f64: set[str] = set()         # classes of submodules the model's own code fed float64
        self.checkpoint_calls = 0                # torch.utils.checkpoint.checkpoint calls seen
        self.empty_cache_calls = 0               # torch.cuda.empty_cache calls seen
        self.anomaly_calls = 0                   # calls asking for autograd anomaly detection on (restores too)
        self.save_calls = 0                      # checkpoint saves the script asked for (save_every)
        self.iterator_starts = 0                 # DataLoader iterators started (keep_iterator)
        self.iterator_reuses = 0                 # iter(loader) calls that got the kept one back (keep_iterator)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


_state: _State | None = None


def apply(torch, changes: dict | None, run_dir: str, watch=None, steps=None) -> None:
    """Inject `changes` (None: do nothing at all) and start recording; idempotent per process.
    `watch(module name, on_import)`: child.py's import watcher, for functions of modules the
    script imports later (safetensors); `steps()`: the steps the run has counted so far."""
    global _state
    if changes is None or _state is not None:
        return
    st = _state = _State(torch, dict(changes), run_dir)
    st.watch, st.steps = watch, steps or (lambda: st.save_calls)
    for key, fn in ((("expandable_segments",), _alloc), (("keep_host_memory",), keep_host_memory),
                    (("threads",), _threads), (DATALOADER_KEYS, _loader),
                    (("cudnn_benchmark", "tf32"), _cuda_flags), (("optimizer",), _optimizer),
                    (("autocast", "compile", "float32", "channels_last"), module_call), (("recompute",), _checkpoint),
                    (("empty_cache",), _empty_cache), (("save_every",), saves), (("keep_iterator",), keep_iterators),
                    (("anomaly",), set_anomaly), (("distribution_checks",), distribution_checks),
                    (("attention_dropout",), attention_dropout), (("gather_select",), gather_select)):
        try:
            fn(torch, st)
        except Exception as exc:   # an injection that cannot be made is reported, the run goes on
            st.note(f"{'/'.join(key)}: could not be applied ({type(exc).__name__}: {exc})")
    try:
        record_losses(torch, st)
    except Exception as exc:
        st.note(f"loss recording unavailable ({type(exc).__name__}: {exc})")
    atexit.register(write_record)


def _alloc(torch, st: _State) -> None:
    if st.changes.get("expandable_segments"):
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments" not in conf:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(x for x in (conf, "expandable_segments:True") if x)
        st.applied.add("expandable_segments")


def _threads(torch, st: _State) -> None:
    orig = torch.set_num_threads
    want = st.changes.get("threads")

    def set_num_threads(n):
        if os.getpid() != st.pid:          # a DataLoader worker (fork): its own setting stands
            return orig(n)
        st.threads_asked.append(int(n))
        return orig(int(want) if want else n)
    torch.set_num_threads = set_num_threads
    if want:
        orig(int(want))
        st.applied.add("threads")


def _loader(torch, st: _State) -> None:
    import inspect

    from torch.utils.data import DataLoader

    orig = DataLoader.__init__
    sig = inspect.signature(orig)
    want = {k: st.changes[k] for k in DATALOADER_KEYS if k in st.changes}

    # the original's signature, name and docstring (functools.wraps: inspect.signature follows
    # __wrapped__): Lightning reads the DataLoader's parameters from its signature to build it
    # again with a DistributedSampler, and from (*args, **kwargs) it rebuilt the loader with
    # batches of one sample (a DDP job's 32 became 1 in every tune run, 7x "faster")
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        try:
            ba = sig.bind(self, *args, **kwargs)
        except TypeError:                       # let torch say what is wrong with the call
            return orig(self, *args, **kwargs)
        ba.apply_defaults()
        a = ba.arguments
        asked = {k: a.get(k) for k in (*DATALOADER_KEYS, "batch_size")}
        ctx = a.get("multiprocessing_context")
        asked["multiprocessing_context"] = ctx if ctx is None or isinstance(ctx, str) else type(ctx).__name__
        if want and os.getpid() == st.pid:
            a.update(want)
            if not a.get("num_workers"):       # torch refuses these without worker processes
                a["persistent_workers"], a["prefetch_factor"] = False, None
                if "multiprocessing_context" in a:
                    a["multiprocessing_context"] = None
            if a.get("pin_memory") and not torch.cuda.is_available():
                a["pin_memory"] = False
            st.applied.update(want)
        if st.changes.get("batch_scale") and os.getpid() == st.pid and _scale_batch(a, st.changes["batch_scale"]):
            st.applied.add("batch_scale")
        if st.changes.get("index_batches") and os.getpid() == st.pid and index_batches(a):
            st.applied.add("index_batches")
        if st.changes.get("store_samples") and os.getpid() == st.pid:
            why = store_samples(a, torch)
            if why is None:
                st.applied.add("store_samples")
            elif why.startswith(("dataset[", "the stream's")):
                st.note(f"store_samples: {why}")
        out = orig(*ba.args, **ba.kwargs)
        ds = a.get("dataset")
        st.loaders.append({"asked": asked, "got": {k: getattr(self, k, None) for k in DATALOADER_KEYS},
                           "built": _built(ds.dataset if isinstance(ds, (StoredSamples, StoredStream)) else ds)})
        return out
    DataLoader.__init__ = __init__


def _scale_batch(a: dict, k) -> bool:
    """batch_scale: the DataLoader's int batch_size times k (a batch_sampler, or batch_size=None,
    leaves nothing to scale: the change is not applied)."""
    bs = a.get("batch_size")
    if a.get("batch_sampler") is not None or not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        return False
    a["batch_size"] = bs * int(k)
    return True


CHECKPOINT_ONLY_KW = ("use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state")


def _checkpoint(torch, st: _State) -> None:
    """Count the script's activation-checkpoint calls; with recompute="off", run the function
    directly: its activations are kept for backward, nothing is recomputed (the numerics are the
    same: the checkpoint reruns the forward with the RNG state it had)."""
    import torch.utils.checkpoint as cp

    orig = cp.checkpoint
    off = st.changes.get("recompute") == "off"

    def checkpoint(function, *args, **kwargs):
        st.checkpoint_calls += 1
        if off and os.getpid() == st.pid:
            st.applied.add("recompute")
            for k in CHECKPOINT_ONLY_KW:
                kwargs.pop(k, None)
            return function(*args, **kwargs)
        return orig(function, *args, **kwargs)
    checkpoint.__wrapped__ = orig
    cp.checkpoint = checkpoint


def _empty_cache(torch, st: _State) -> None:
    """Count the script's torch.cuda.empty_cache() calls; with empty_cache="off", skip them: the
    caching allocator keeps its free blocks, as it does in a script that never called it (PD343).
    Both names the function has (torch.cuda and torch.cuda.memory) are replaced."""
    import torch.cuda.memory as mem

    orig = mem.empty_cache
    off = st.changes.get("empty_cache") == "off"

    def empty_cache():
        if os.getpid() == st.pid:
            st.empty_cache_calls += 1
            if off:
                st.applied.add("empty_cache")
                return None
        return orig()
    empty_cache.__wrapped__ = orig
    empty_cache.__doc__ = orig.__doc__
    mem.empty_cache = torch.cuda.empty_cache = empty_cache


def _cuda_flags(torch, st: _State) -> None:
    if st.changes.get("cudnn_benchmark"):
        torch.backends.cudnn.benchmark = True
        st.applied.add("cudnn_benchmark")
    if st.changes.get("tf32"):
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
        st.applied.add("tf32")


def _optimizer(torch, st: _State) -> None:
    import inspect

    impl = st.changes.get("optimizer")
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
            continue
        if "__init__" not in cls.__dict__:
            continue
        params = inspect.signature(cls.__init__).parameters
        orig = cls.__init__

        @functools.wraps(orig)
        def __init__(self, *args, _orig=orig, _cls=cls, _params=params, **kwargs):
            rec = {"class": _cls.__name__, "foreach": kwargs.get("foreach"), "fused": kwargs.get("fused"),
                   "supports": [k for k in ("foreach", "fused") if k in _params]}
            if type(self) is _cls and impl and os.getpid() == st.pid:
                if impl in _params:
                    other = "fused" if impl == "foreach" else "foreach"
                    kwargs[impl] = True
                    if other in _params:
                        kwargs[other] = None        # torch refuses both at once
                    st.applied.add("optimizer")
                else:
                    st.note(f"{_cls.__name__} has no {impl} implementation")
            if type(self) is _cls:
                st.optimizers.append(rec)
            return _orig(self, *args, **kwargs)
        cls.__init__ = __init__


def _built(dataset) -> str:
    """Where and on what a DataLoader was built: the script's line making it, the dataset's class
    and length. Loaders alike in all of it were the same loader built again (per epoch, in a
    function the loop calls): its workers, persistent or not, start again with each one."""
    f = sys._getframe(2)
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename == __file__):
        f = f.f_back                           # a DataLoader subclass's super().__init__
    try:
        n = len(dataset)
    except Exception:
        n = None
    where = f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"
    return f"{where} {type(dataset).__name__} {n}"


def write_record() -> None:
    """Write <run>/inject.json (at exit; also before an os._exit, which skips atexit)."""
    st = _state
    if st is None or os.getpid() != st.pid:
        return
    losses = []
    for t in st.losses:
        try:
            v = t if isinstance(t, float) else float(t.float().cpu())
            losses.append(v if v == v and abs(v) != float("inf") else str(v))
        except Exception:
            losses.append(None)
    try:
        threads = int(st.torch.get_num_threads())
    except Exception:
        threads = None
    doc = {"changes": st.changes, "applied": sorted(st.applied), "loaders": st.loaders,
           "optimizers": st.optimizers, "threads_asked": st.threads_asked, "threads": threads,
           "checkpoint_calls": st.checkpoint_calls, "empty_cache_calls": st.empty_cache_calls,
           "anomaly_calls": st.anomaly_calls,
           "save_calls": st.save_calls, "iterator_starts": st.iterator_starts,
           "iterator_reuses": st.iterator_reuses, "channels_last_modules": sum(st.channels_last.values()), "float32_inner": sorted(st.inner_f64),
           "float32_from": sorted({str(v).replace("torch.", "") for v in st.converted.values()}),
           "losses": losses, "notes": st.notes}
    try:
        with open(os.path.join(st.run_dir, "inject.json"), "w") as f:
            json.dump(doc, f)
    except OSError:
        pass
