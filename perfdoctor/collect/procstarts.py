"""The processes the script starts through multiprocessing, counted in the launched process.

A trainer the script starts with the spawn or forkserver start method (torch.multiprocessing.spawn,
`mp.get_context("spawn").Process`, the usual way to start one DDP rank per device) begins as a
fresh interpreter without perfdoctor's hooks: its steps are not timed, and without this record
the only sign of it is a child process's CPU. So each `Process.start()` in the launched process is
counted by start method and target function, and a run whose launched process stepped no
optimizer can say which function its children ran, how and how many (diagnose/childtrainers.py).

child.json "process_starts": [{"method": "spawn", "target": "main_worker",
"via": "torch.multiprocessing.spawn", "count": 2}, ...], at most MAX_KINDS entries. DataLoader
workers are the loader's own and left out. Stdlib only; torch is never imported here.
"""

from __future__ import annotations

import functools
import sys

WORKER_LOOP = "torch.utils.data._utils.worker._worker_loop"
TORCH_WRAP = "torch.multiprocessing.spawn._wrap"       # torch's spawn: Process(target=_wrap, args=(fn, i, ...))
MAX_KINDS = 16
MAX_NAME = 200


def qualname(fn) -> str | None:
    """A callable's dotted name; the script's own functions (module __main__) by their bare name,
    a functools.partial by the function it wraps."""
    if fn is None:
        return None
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    full = name if module in (None, "__main__", "__mp_main__") else f"{module}.{name}"
    return str(full)[:MAX_NAME]


def _start_method(proc) -> str | None:
    """The start method proc starts with: its context's, or for the default context's Process the
    method set now. Never fixes the default context itself (get_start_method() without
    allow_none would, and a later set_start_method in the script would then fail)."""
    method = getattr(proc, "_start_method", None)
    if method:
        return method
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return None
    method = mp.get_start_method(allow_none=True)
    if method:
        return method
    default = getattr(getattr(getattr(mp, "context", None), "_default_context", None), "_default_context", None)
    return getattr(default, "_name", None)


class ProcStarts:
    def __init__(self):
        self.counts: dict[tuple, int] = {}

    def install(self) -> None:
        import multiprocessing.process as mpp
        orig = mpp.BaseProcess.start
        if getattr(orig, "_perfdoctor_counted", False):
            return

        @functools.wraps(orig)
        def start(proc, *a, **kw):
            try:
                self.saw(proc)
            except Exception:          # never the script's failure
                pass
            return orig(proc, *a, **kw)

        start._perfdoctor_counted = True
        mpp.BaseProcess.start = start

    def saw(self, proc) -> None:
        target, args = getattr(proc, "_target", None), getattr(proc, "_args", ()) or ()
        name, via = qualname(target), None
        if name == WORKER_LOOP:
            return
        if name == TORCH_WRAP and args:
            name, via = qualname(args[0]), "torch.multiprocessing.spawn"
        key = (_start_method(proc), name, via)
        if key in self.counts or len(self.counts) < MAX_KINDS:
            self.counts[key] = self.counts.get(key, 0) + 1

    def info(self) -> list[dict]:
        return [{"method": m, "target": t, "via": v, "count": n} for (m, t, v), n in self.counts.items()]
