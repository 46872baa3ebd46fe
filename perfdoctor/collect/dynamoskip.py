"""perfdoctor's hooks under torch.compile: which of their frames Dynamo must leave alone.

A script that compiles its whole training step (`@torch.compile def train_step(x, y): loss =
...; loss.backward(); opt.step()`) meets perfdoctor's hooks in Dynamo two ways.

Inlined: Dynamo traces the compiled Optimizer.step, and with it the global optimizer-step hooks
(and a root module's class __call__). A hook that reads a clock or takes a lock breaks the graph
there. So each hook Dynamo can inline starts with torch.compiler.is_compiling(), true only while
Dynamo traces: the graph holds nothing of ours, and a step taken inside compiled code is not
seen by that hook (the backward pass, which Dynamo hands back to Python, still is).

Intercepted: what runs eagerly inside a compiled call (the `loss.backward()` Dynamo cannot trace,
so it calls it as Python) still passes every new frame to Dynamo's frame callback, which compiles
any frame outside torch's own files: the backward wrapper and the bookkeeping it calls were
compiled, broke their graphs at the first lock or clock, and were guarded on every call after. A
fully compiled step of a small MLP ran 1.10-1.50x slower under `perfdoctor run --no-trace`.
Their code objects are marked to run as they are (Dynamo's frame strategy SKIP): `keep_out`
marks a frame and, with `recursive`, everything it calls (bookkeeping: ours alone), or only the
frame itself for a wrapper around torch's own call, whose callees (a user's backward hooks, the
model's forward) Dynamo treats as it would without perfdoctor. And passes.py never reaches a
graph: its file joins Dynamo's skipped files (never_inline), as torch's own are, since Dynamo
can trace Tensor.backward down into the backward wrapper itself (it then breaks the graph at the
wrapper's call, where it breaks it at backward() without perfdoctor).

perfdoctor never imports Dynamo itself (~1 s of CPU in a script that never compiles), so the
marks are set once Dynamo is loaded: torch.compile is wrapped to set them when it is first
called (it imports Dynamo), and mark_all() sets any left later (modules.py calls it).
"""

from __future__ import annotations

import functools
import importlib
import sys

_CODES: list = []          # [code, recursive, marked]
_MODULES: list = []        # [module name, marked]: modules whose files Dynamo skips


def keep_out(fn, *, recursive: bool):
    """Register `fn`'s frames to be left alone by Dynamo (marked now if Dynamo is loaded); returns fn."""
    if not any(entry[0] is fn.__code__ for entry in _CODES):   # one code object per def, however often run
        _CODES.append([fn.__code__, recursive, False])
        mark_all()
    return fn


def never_inline(module_name: str) -> None:
    """Register a module of ours whose functions Dynamo must call, never trace into: its file
    joins Dynamo's skipped files (trace_rules.add), so a call of them in traced code is a graph
    break there and they run as Python."""
    if not any(entry[0] == module_name for entry in _MODULES):
        _MODULES.append([module_name, False])
        mark_all()


def dynamo_loaded() -> bool:
    """Has the script loaded Dynamo (torch.compile, or torch._dynamo directly)? Never imports it."""
    return "torch._dynamo.eval_frame" in sys.modules


def mark_all() -> bool:
    """Mark the registered code objects and modules not marked yet; False while Dynamo is not loaded."""
    if not dynamo_loaded():
        return False
    for entry in _CODES:
        if not entry[2]:
            entry[2] = True
            _mark(entry[0], entry[1])
    for entry in _MODULES:
        if not entry[1]:
            entry[1] = True
            try:
                importlib.import_module("torch._dynamo.trace_rules").add(entry[0])
            except Exception:
                pass
    return True


def _mark(code, recursive: bool) -> None:
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
        after = FrameAction.SKIP if recursive else FrameAction.DEFAULT
        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, after))
    except Exception:                  # an older torch: skip the frame alone, if it can
        try:
            sys.modules["torch._dynamo.eval_frame"].skip_code(code)
        except Exception:
            pass


def wrap_compile(torch) -> None:
    """torch.compile sets the marks once it has loaded Dynamo (also for nn.Module.compile and
    `torch.compile(mode=...)(fn)`, which call it again through the torch module)."""
    orig = getattr(torch, "compile", None)
    if orig is None or getattr(orig, "_perfdoctor", False):
        return

    @functools.wraps(orig)
    def compile(*args, **kwargs):
        try:
            return orig(*args, **kwargs)
        finally:
            mark_all()
    compile._perfdoctor = True
    torch.compile = compile


def compiling_check(torch):
    """torch.compiler.is_compiling (true while torch.compile traces), or a check that is always
    false on a torch without it."""
    return getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def graphs_compiled() -> int | None:
    """The graphs Dynamo compiled in this process so far (its own counters), or None where the
    script never loaded Dynamo (it compiled nothing: perfdoctor does not import it to say so)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else None
    except Exception:
        return None
