"""Outermost module calls: the step signal of loops with no optimizer, backward pass or DataLoader.

An inference or benchmarking loop (`with torch.inference_mode(): for ...: y = model(x)`) has
none of the other signals, but it calls its model once per iteration. Until a step source is
chosen, `torch.nn.Module.__call__` is wrapped class-wide: a call made while no other module call
runs on its thread is an *outermost* call, and the session hears of it with its module. Calls
inside it (every submodule) pass straight through, and so do calls made inside a DataLoader's
`__next__` (transforms that are modules, with num_workers=0: batch preparation, not the model).

Once a step source is chosen (an optimizer's first step, the backward or DataLoader fallback,
or this one), the wrapper counts the outermost calls of one whole step (Census: a per-sample
loop calls its model once per sample, `model(x[i:i+1])`), then it is taken off: a training loop
pays for it during its first two steps only (a Python frame per module call, ~0.3 us). When this
source is chosen, the module whose outermost calls reached the fallback first gets a forward
pre-hook instead: one call per step, on that module only; a module compiled in place
(`model.compile()`: its hooks run inside the compiled call) keeps the class wrapper instead, which
runs before the compiled code. Under torch.compile the wrapper steps aside at trace time
(torch.compiler.is_compiling), so it never breaks a graph, and its own frames are skipped by
dynamo as torch's are (dynamoskip.keep_out: what they call is still compiled). A forked process
(a DataLoader worker) puts the class back as it was: its module calls are not the trainer's.
"""

from __future__ import annotations

import os
import threading
import time

from perfdoctor.collect import dynamoskip
from perfdoctor.collect.dynamoskip import compiling_check
from perfdoctor.collect.embeddings import DenseTables
from perfdoctor.collect.padding import Padding
from perfdoctor.collect.convlayout import ConvLayouts
from perfdoctor.collect.chainedcalls import Chain, weak_ref as _ref

MAX_MODULES = 64    # distinct modules counted in the census step
_DEPTH = threading.local()     # module calls running on this thread: a call inside another is not outermost
IN_LOADER = threading.local()  # this thread is inside a DataLoader's __next__ (hooks.py): batch preparation


class Census:
    """The outermost module calls of the first whole step after the step source is chosen: per
    module, how many, and the leading dimension of each call's first tensor argument (its batch
    size, for a model that takes a batch; 1 for a 1-D tensor: one unbatched sample); and the
    backward passes of that step, and how many of them began from no gradients (fresh_passes:
    gradients per call, not accumulated). `result` (child.json "root_calls"): the module called
    most, {"module", "calls", "grad_calls" (of them, those made with autograd on), "batch", "batch_share",
    "modules", "passes", "fresh_passes",
    "cpu_autocast", "dense_embeddings" (embeddings.py), "conv_layout" (convlayout.py), "padding"
    (padding.py), "chained",
    "sliced", "rnn_module", "rnn", "rnn_calls", "rnn_chained", "rnn_fed_sliced", "rnn_fed_back",
    "rnn_layers" (chainedcalls.py), "compiled_in_place" (the module was compiled in place:
    model.compile()), and "dynamo_graphs" (hooks.py adds it at the exit: dynamoskip.graphs_compiled)},
    where batch is the most common leading dimension of the calls of the modules called at least
    half as often as it, and batch_share that dimension's share of those calls; None until the
    step ends.

    Evaluation calls (a module in eval mode called with autograd off: a validation loop inside the
    step) are counted apart and describe the step only where it made no other call: a user's loop
    that validated 32 batches of 64 in the counted step read 33 calls of batch 64 a step, where
    it trained on one batch of 256 (an inference loop makes only such calls)."""

    def __init__(self, tensor_type, cpu_autocast=None, embedding_types: tuple = (), rnn_types: tuple = (),
                 layouts=None, capturing=None, grad=None):
        self.tensor = tensor_type
        self.grad = grad                  # () -> autograd is on (torch.is_grad_enabled); None: always
        self.capturing = capturing        # () -> a CUDA graph is being captured (padding.py reads no count then)
        self.cpu_autocast = cpu_autocast  # () -> the CPU autocast dtype's name in force, or None
        self.embedding_types = embedding_types
        self.rnn_types = rnn_types
        self.new_layouts = layouts or ConvLayouts   # () -> a ConvLayouts (convlayout.py)
        self.reset()

    def reset(self) -> None:
        self.state = "wait"               # wait -> counting (a step boundary with a source) -> done
        self.counts: dict = {}            # id(module) -> [class name, calls, {leading dim: calls}, ref, grad calls]
        self.evals: dict = {}             # the same, of evaluation calls (eval mode, autograd off)
        self.passes = 0                   # backward passes and autograd.grad calls in the counted step
        self.fresh = 0                    # of which start from no gradients: autograd.grad calls, or
                                          # backward passes after a gradient reset (passes.py)
        self.result = None
        self.root = None                  # a weak reference to the module called most, once done (nogradcalls.py)
        self.last = None                  # (counts, id(module), leading dim, autograd on) of the last call counted
        self.autocast = None              # the CPU autocast dtype a counted call ran under
        self.tables = DenseTables(self.embedding_types)   # embedding tables with dense gradients (embeddings.py)
        self.padding = Padding(self.tensor, self.embedding_types, self.capturing)   # padded positions (padding.py)
        self.chain = Chain(self.tensor, self.rnn_types)   # calls that take the last one's state (chainedcalls.py)
        self.layouts = self.new_layouts()   # the convolutions' input formats (convlayout.py)

    def boundary(self, mode) -> None:
        if (self.state == "counting" and mode == "module" and getattr(_DEPTH, "n", 0)
                and self.last is not None):
            # a boundary inside an outermost call: the chosen module's pre-hook, which runs after
            # the class wrapper counted the call; that call starts the next step, not this one
            # (an inference loop calling its model once per iteration read as 2 calls a step)
            counts, key, lead, grad = self.last
            c = counts[key]
            c[1] -= 1
            c[4] -= grad
            c[2][lead] -= 1
            if not c[2][lead]:
                del c[2][lead]
            if not c[1]:
                del counts[key]
        self.last = None
        self._boundary(mode)

    def _boundary(self, mode) -> None:
        if self.state == "wait":
            if mode is not None:
                self.state, self.passes, self.fresh = "counting", 0, 0
        elif self.state == "counting":
            self.state = "done"
            self.counts = self.counts or self.evals
            if self.counts:
                key, (name, calls, _, ref, grad_calls) = max(self.counts.items(), key=lambda kc: kc[1][1])
                self.root = ref
                # the batch of the modules called about as often (half as often or more): a step
                # that calls submodules itself (a decoder unrolled over time steps: its embedding
                # of one token per sequence, 1-D, beside attention, GRU and output layers at batch
                # 32, 12 calls each) is judged on them all, not on the first of a tie
                leads: dict = {}
                for c in self.counts.values():
                    if 2 * c[1] >= calls:
                        for lead, k in c[2].items():
                            leads[lead] = leads.get(lead, 0) + k
                batch, n = max(leads.items(), key=lambda kv: kv[1])
                self.result = {"module": name, "calls": calls, "grad_calls": grad_calls, "batch": batch,
                               "batch_share": n / sum(leads.values()), "modules": len(self.counts),
                               "passes": self.passes, "fresh_passes": self.fresh, "cpu_autocast": self.autocast,
                               "dense_embeddings": self.tables.result(), "conv_layout": self.layouts.result(),
                               "padding": self.padding.result(),
                               "compiled_in_place": getattr(ref(), "_compiled_call_impl", None) is not None
                               if ref is not None else None,
                               **self.chain.result(key)}
            self.counts, self.evals = {}, {}

    def count(self, module, args, kwargs) -> None:
        self.last = None
        grad = self.grad() if self.grad is not None else True
        counts = self.evals if not module.training and not grad else self.counts
        c = counts.get(id(module))
        if c is None:
            if len(counts) >= MAX_MODULES:
                return
            c = counts[id(module)] = [type(module).__name__, 0, {}, _ref(module), 0]
        c[1] += 1
        c[4] += grad
        if self.autocast is None and self.cpu_autocast is not None:
            self.autocast = self.cpu_autocast()
        lead = self._lead(args, kwargs)
        c[2][lead] = c[2].get(lead, 0) + 1
        self.last = (counts, id(module), lead, grad)
        self.tables.call(module, args, kwargs)
        self.layouts.call(module, args, kwargs)
        self.padding.call(module, args, kwargs)
        self.chain.call(id(module), args, kwargs)
        self.chain.inner(module, args, kwargs, outermost=True)   # a loop that calls its nn.LSTM itself

    def returned(self, module, out) -> None:
        """A counted outermost call (or an RNN module's call inside one) returned `out`."""
        self.chain.returned(id(module), out)

    def inner(self, module, args, kwargs) -> None:
        """A module called inside a counted outermost call: the autocast in force there (a model
        whose forward enters autocast itself, as accelerate's prepare wraps model.forward in
        torch.autocast, runs its layers under it, though the outermost call began without it),
        and the embedding tables with dense gradients."""
        if self.autocast is None and self.cpu_autocast is not None:
            self.autocast = self.cpu_autocast()
        self.tables.call(module, args, kwargs)
        self.layouts.call(module, args, kwargs)
        self.padding.call(module, args, kwargs)
        self.chain.inner(module, args, kwargs)

    def _lead(self, args, kwargs):
        """The batch size of a call: the leading dimension of its first tensor argument; 1 for a
        1-D tensor, which torch's layers read as one unbatched sample (Linear's features,
        Embedding's one sequence: an RL policy called on one state of 4 numbers is no batch of 4)."""
        for v in (*args, *kwargs.values()):
            if isinstance(v, self.tensor):
                return None if v.dim() == 0 else 1 if v.dim() == 1 else int(v.shape[0])
        return None


# the census's bookkeeping runs as Python, never compiled: called from the class wrapper inside a
# module compiled in place, Dynamo compiled Census.inner as a frame of its own and guarded it on
# the census's counts, recompiling at every call until its recompile limit (dynamoskip.py)
for _fn in (Census.count, Census.inner, Census.returned, Census.boundary):
    dynamoskip.keep_out(_fn, recursive=True)


def _cpu_autocast(torch) -> str | None:
    """The dtype torch.autocast("cpu") casts to where it is on ("bfloat16"), or None."""
    try:
        if torch.is_autocast_enabled("cpu"):
            return str(torch.get_autocast_dtype("cpu")).replace("torch.", "")
    except Exception:                     # an older torch without the device argument
        return None
    return None


def _capturing(torch) -> bool:
    """A CUDA graph is being captured on the current stream (True where that cannot be told)."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return True


def watch(torch, session) -> None:
    """Wrap Module.__call__ until the session has a step source and its census is done
    (session.on_root_call, Census), or for good while a module compiled in place marks the
    steps (session.module_watch). Again after an optimizer took over from a fallback: a new census."""
    Module = torch.nn.Module
    orig = Module.__call__
    nn = torch.nn
    convs = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    session.census = Census(torch.Tensor, lambda: _cpu_autocast(torch), (nn.Embedding, nn.EmbeddingBag),
                            (nn.RNNBase, nn.RNNCellBase), lambda: ConvLayouts(torch, convs),
                            lambda: _capturing(torch), torch.is_grad_enabled)
    if getattr(orig, "_perfdoctor", False):
        return
    compiling = compiling_check(torch)

    dynamo_told = [False]

    def __call__(self, *args, **kwargs):
        if compiling() or getattr(IN_LOADER, "n", 0):
            return orig(self, *args, **kwargs)
        if getattr(_DEPTH, "n", 0):
            census = session.census
            if census.state != "counting":
                return orig(self, *args, **kwargs)
            try:
                census.inner(self, args, kwargs)
            except Exception:                 # never break the script's forward
                pass
            out = orig(self, *args, **kwargs)
            if isinstance(self, census.rnn_types):      # its state passed on (chainedcalls.py)
                try:
                    census.returned(self, out)
                except Exception:
                    pass
            return out
        if not dynamo_told[0]:                # dynamo loaded without torch.compile (its optimize())
            dynamo_told[0] = dynamoskip.mark_all()
        census = session.census
        if census.state == "done" and session.module_watch is None:
            if Module.__call__ is __call__:   # counted: leave the class as it was
                Module.__call__ = orig
            return orig(self, *args, **kwargs)
        try:
            if session.mode is None:
                session.on_root_call(self, time.perf_counter())
            elif session.module_watch == id(self):
                session.on_module_step(time.perf_counter(), hooked=False)
            if census.state == "counting":
                census.count(self, args, kwargs)
        except Exception:                     # never break the script's forward (StopRun passes)
            pass
        _DEPTH.n = 1
        try:
            out = orig(self, *args, **kwargs)
        finally:
            _DEPTH.n = 0
        if census.state == "counting":
            try:
                census.returned(self, out)
            except Exception:
                pass
        return out

    def forget():                             # a forked child: not the trainer
        if Module.__call__ is __call__:
            Module.__call__ = orig
    __call__._perfdoctor = True
    __call__.__wrapped__ = orig
    # a module compiled in place whose submodules run eagerly (a Sequential's forward is torch
    # code) reaches them through the wrapper: dynamo must not compile its frames where it would
    # not compile Module.__call__'s
    Module.__call__ = dynamoskip.keep_out(__call__, recursive=False)
    try:
        os.register_at_fork(after_in_child=forget)
    except AttributeError:                    # no fork on this platform
        pass


def hook_steps(module, session):
    """Each call of the chosen module is a step boundary while the session's steps follow it:
    a forward pre-hook (its handle), or None for a module compiled in place, whose calls the
    class wrapper marks instead (session.module_watch)."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        session.module_watch = id(module)
        return None

    compiling = compiling_check(session.torch)

    def pre(mod, args):
        if not compiling():           # traced inside a compiled function: nothing of ours in its graph
            session.on_module_step(time.perf_counter())
    return module.register_forward_pre_hook(dynamoskip.keep_out(pre, recursive=True))
