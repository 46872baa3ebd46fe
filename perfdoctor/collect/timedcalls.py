"""Checkpoint saves, logging and gc.collect() calls of `perfdoctor run`, timed where the training thread makes them.

py-spy names the frames that take the step's time, but only where it may run (an idle core, the
ptrace permission). Two costs that decide a fix are plain function calls: a checkpoint written
on the training thread (torch.save, safetensors' save_file: what Lightning's, transformers' and
most hand-written checkpoints call) and logging to TensorBoard (SummaryWriter.add_*; tensorboardX's
too). Each is wrapped, and the wall time inside it, on the thread that runs the steps, is summed
per step (steps.jsonl `save` and `log`, seconds). So is gc.collect() called by the script (`gc`): a
full collection walks every Python object the process holds. The cost is two clock reads per call, none for a
script that never calls them. A call inside another timed call counts once (the outer one).

torch.tensor and torch.as_tensor are timed where their data is a Python list or tuple (`convert`):
each element is unboxed one at a time, ~230 ns a float, where a batch indexed out of a tensor
copies ~2 ns an element (a 128 x 256 batch of floats: 7.6 ms against 75 us). A call with anything
else (a scalar, an array, a tensor) pays one Python frame and a type test; calls made while Dynamo
traces are not timed (the check is folded into the graph), nor those inside a DataLoader's
__next__ (a batch made there is the step's data wait: collate's torch.tensor over Python numbers).
torch warns from C++ at the innermost Python frame, which the wrapper now is: where it may warn (a
tensor copy-constructed, a list of NumPy arrays, a read-only array) the call is made from a frame
compiled for the script's own file and line, so the warning reads as it does without the wrapper
(~2 us more on such a call).

torch.save is wrapped when torch is imported (before the script reads it); the others as their
module's import finishes (child.py's import watcher), before the script binds a name from it
(`from safetensors.torch import save_file`), and else when a step ends and their module has been
imported by then (a dict lookup per step while any is missing).
Saves on another thread (an asynchronous checkpoint) are not on the step's path: not counted.
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import time

from perfdoctor.collect.dynamoskip import compiling_check
from perfdoctor.collect.modules import IN_LOADER

CONVERTERS = ("tensor", "as_tensor")    # torch.<name>(a Python list or tuple): timed as `convert`
SEQUENCES = (list, tuple)
SCALARS = (float, int, bool, complex)
SAFETENSORS_SAVE = ("safetensors.torch", "save_file")    # a checkpoint save besides torch.save
# (module, class or None, attribute prefix or name): what is timed, and as which kind
LATER = (("torch.utils.tensorboard.writer", "SummaryWriter", "add_", "log"),
         ("tensorboardX.writer", "SummaryWriter", "add_", "log"),
         (SAFETENSORS_SAVE[0], None, SAFETENSORS_SAVE[1], "save"))


def replace_torch_save(torch, wrap) -> None:
    """torch.save, one function under two names (torch.save, torch.serialization.save): both
    become wrap(it)."""
    orig = torch.serialization.save
    torch.serialization.save = wrapped = wrap(orig)
    if getattr(torch, "save", None) is orig:
        torch.save = wrapped


def _may_warn(data, tensor_type) -> bool:
    """Data whose conversion torch may warn about: a tensor (copy-constructed), a list of NumPy
    arrays (slow), a read-only NumPy array."""
    kind = type(data)
    if kind in SEQUENCES:
        return bool(data) and type(data[0]).__module__ == "numpy"
    if kind.__module__ == "numpy":
        return not getattr(getattr(data, "flags", None), "writeable", True)
    return isinstance(data, tensor_type)


_TRAMPOLINES: dict = {}     # (file, line) -> code that makes the call from that line


def _at_caller(fn, *a, **kw):
    """fn(*a, **kw) made from a frame that stands for the line that called the wrapper (two frames
    up): its file, its line and its module's globals, so that a warning torch raises there is
    located, filtered and shown once per line as it is without the wrapper (warnings.catch_warnings
    would reset every module's once-per-line registry at each call)."""
    caller = sys._getframe(2)
    where = (caller.f_code.co_filename, caller.f_lineno)
    code = _TRAMPOLINES.get(where)
    if code is None:
        code = _TRAMPOLINES[where] = compile("\n" * (where[1] - 1) + "_pd_out = _pd_fn(*_pd_a, **_pd_kw)",
                                             where[0], "exec")
    scope = {"_pd_fn": fn, "_pd_a": a, "_pd_kw": kw}
    exec(code, caller.f_globals, scope)
    return scope["_pd_out"]


class TimedCalls:
    def __init__(self):
        self.step = {"save": 0.0, "log": 0.0, "gc": 0.0, "convert": 0.0}  # seconds in each since the last take()
        self.thread = threading.get_ident()     # the thread that runs the script (and its steps)
        self.depth = 0
        self.pending = list(LATER)
        self.known = 0                          # len(sys.modules) at the last poll
        self.installed = False                  # torch.save is wrapped: steps.jsonl's save/log mean it
        self.converts = False                   # torch.tensor is wrapped: steps.jsonl's conv means it

    def _wrap(self, fn, kind: str):
        if getattr(fn, "_perfdoctor_timed", False):
            return fn
        calls = self

        @functools.wraps(fn)
        def timed(*a, **kw):
            if calls.depth or threading.get_ident() != calls.thread:
                return fn(*a, **kw)
            calls.depth = 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                calls.step[kind] += time.perf_counter() - t0
                calls.depth = 0
        timed._perfdoctor_timed = True
        return timed

    def _wrap_convert(self, fn, compiling, tensor_type=()):
        """torch.tensor or torch.as_tensor, timed where `data` is a Python list or tuple."""
        if getattr(fn, "_perfdoctor_timed", False):
            return fn
        calls, step, thread, clock, ident = self, self.step, self.thread, time.perf_counter, threading.get_ident

        @functools.wraps(fn)
        def convert_timed(data, *a, **kw):
            kind = type(data)
            if kind in SCALARS or compiling():  # the common call in a loop; Dynamo tracing: nothing of ours
                return fn(data, *a, **kw)
            if kind not in SEQUENCES or calls.depth or getattr(IN_LOADER, "n", 0) or ident() != thread:
                return _at_caller(fn, data, *a, **kw) if _may_warn(data, tensor_type) else fn(data, *a, **kw)
            calls.depth = 1
            t0 = clock()
            try:
                if data and type(data[0]).__module__ == "numpy":    # a list of arrays: torch warns
                    return _at_caller(fn, data, *a, **kw)
                return fn(data, *a, **kw)
            finally:
                step["convert"] += clock() - t0
                calls.depth = 0
        convert_timed._perfdoctor_timed = True
        return convert_timed

    def install_torch(self, torch) -> None:
        """torch.save (one function, also torch.serialization.save), and gc.collect (imported by
        every Python process: the script's `gc.collect()` looks it up at call time, and its
        `from gc import collect`, made later, gets the wrapped one)."""
        replace_torch_save(torch, lambda fn: self._wrap(fn, "save"))
        gc.collect = self._wrap(gc.collect, "gc")
        self.installed = True
        compiling = compiling_check(torch)
        for name in CONVERTERS:
            setattr(torch, name, self._wrap_convert(getattr(torch, name), compiling, torch.Tensor))
        self.converts = True

    def modules(self) -> list[str]:
        """The modules whose calls are wrapped when they are imported (on_import)."""
        return [t[0] for t in self.pending]

    def on_import(self, mod) -> None:
        """`mod` has just been imported: wrap what it holds now."""
        for target in [t for t in self.pending if t[0] == getattr(mod, "__name__", None)]:
            try:
                self._install(mod, *target[1:])
            except Exception:                   # an unexpected version: not timed, never fatal
                pass
            self.pending.remove(target)

    def poll(self) -> None:
        """At a step's end: wrap what the script has imported since (nothing to do while no module
        was imported since the last poll)."""
        if not self.pending or len(sys.modules) == self.known:
            return
        self.known = len(sys.modules)
        left = []
        for target in self.pending:
            mod = sys.modules.get(target[0])
            if mod is None:
                left.append(target)
                continue
            try:
                self._install(mod, *target[1:])
            except Exception:                   # an unexpected version: not timed, never fatal
                pass
        self.pending = left

    def _install(self, mod, cls_name: str | None, attr: str, kind: str) -> None:
        if cls_name is None:
            fn = getattr(mod, attr, None)
            if callable(fn):
                setattr(mod, attr, self._wrap(fn, kind))
            return
        cls = getattr(mod, cls_name, None)
        for name, fn in list(vars(cls).items()) if isinstance(cls, type) else ():
            if name.startswith(attr) and callable(fn):
                setattr(cls, name, self._wrap(fn, kind))

    def take(self) -> tuple[float, float, float, float]:
        """(save, log, gc, convert) seconds since the last take: the step that just ended. Timed calls
        and takes both run on the training thread, so nothing is added between the read and the reset."""
        step = self.step
        out = step["save"], step["log"], step["gc"], step["convert"]
        step["save"] = step["log"] = step["gc"] = step["convert"] = 0.0
        return out
