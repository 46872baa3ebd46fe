"""The profiler's start, kept from touching the script: what it imports, warns and prints.

- inductor_left_unloaded: torch.profiler's start would import torch._inductor (~1 s of CPU).
- cycle_warning_hidden: torch 2.10-2.11's warning that a cycle clears events.
- kineto_line_dropped: Kineto's line on stderr when the first profiler starts off the thread
  that imported torch.

That line. torch registers its Kineto client when it is imported, and Kineto calls the client's
init from the thread that first starts a profiler; from any other thread it skips the call and
prints instead, with fprintf straight to the process's stderr:

    ERROR: External init callback must run in same thread as registerClient (<tid> != <tid>)

torch's client's init() does nothing ("TODO: implement", torch/csrc/profiler/
kineto_client_interface.cpp), so nothing is lost; but the line is ours, not the script's: a
script that trains in a thread of its own would print it under `perfdoctor run` only. Starting
Kineto in the importing thread beforehand is no way out: Kineto's start-up asks whether CUDA is
there (at::hasCUDA), which at `import torch` would fix CUDA_VISIBLE_DEVICES before the script
sets it and initialise CUDA in a parent its DataLoader workers fork from.

So while the window's first profiler starts in a thread other than the one that imported torch,
file descriptor 2 points at an anonymous file; then everything written there goes back to the
real stderr, byte for byte, except that line. Other threads' writes in those milliseconds (up
to a second or two while CUPTI starts on a GPU) reach stderr when the start returns, in their
order; child processes keep the real stderr throughout.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

LINE = re.compile(rb"(?m)^ERROR: External init callback must run in same thread as registerClient "
                  rb"\(-?\d+ != -?\d+\)\n")


@contextlib.contextmanager
def inductor_left_unloaded(torch):
    """While the profiler starts, `torch._inductor` reads as absent unless it is loaded already.

    torch.profiler's prepare_trace asks `hasattr(torch, "_inductor")` for inductor's cudagraphs
    setting, and torch's lazy module __getattr__ answers by importing torch._inductor and
    torch._dynamo: ~1 s of CPU inside a training step of a script that never compiles (a script
    that builds a torch.optim optimizer has paid it already). A script that never loaded inductor
    has no inductor cudagraphs, so the answer "absent" is the true one. Only the attribute lookup
    is affected, only for the call: `import torch._inductor` works as always. (Some torch versions
    ask in start_trace, at the profiler warm-up's end: the window's step() calls are wrapped too.)
    The lookup is module-wide while it lasts: another thread reading `torch._inductor` as an
    attribute, never having imported it, in those microseconds would get an AttributeError."""
    lazy = torch.__dict__.get("__getattr__")
    if "torch._inductor" in sys.modules or lazy is None:
        yield
        return

    def lookup(name):
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)
    torch.__getattr__ = lookup
    try:
        yield
    finally:
        torch.__getattr__ = lazy


CYCLE = re.compile(r".*Profiler clears events at the end of each cycle")


@contextlib.contextmanager
def cycle_warning_hidden():
    """torch 2.10-2.11 warn on the user's stderr, at a scheduled profiler's start, that a cycle
    clears events (pytorch/pytorch issue 180348), though this window has one cycle. The way out
    torch offers, acc_events=True, turns every stop() into a Python parse of all events: 41 s and
    +3.4 GB for 20k-op passes where stop() and export take 4.9 s and +1 GB without it (measured
    here, torch 2.13). So the warning is hidden around the window's own calls instead.

    Hidden where it would be shown (`warnings._showwarnmsg`, which CPython calls for every warning
    its filters let through), not by a filter: entering or leaving `catch_warnings`, or adding a
    filter, clears every module's record of the warnings it has shown, so each of the window's
    calls (its start and each step) made the script's once-per-line warnings print again (a
    pytorch/examples script's UserWarning 7 times under `run`, once under python). Only where a
    filter turns warnings into errors (`-W error`), which would raise this one before it is shown,
    is it filtered out as before."""
    import warnings
    show = warnings.__dict__.get("_showwarnmsg")
    if show is None or any(f[0] == "error" for f in warnings.filters):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=CYCLE.pattern)
            yield
        return

    def hidden(msg):
        if not CYCLE.match(str(getattr(msg, "message", ""))):
            show(msg)
    warnings._showwarnmsg = hidden
    try:
        yield
    finally:
        if warnings.__dict__.get("_showwarnmsg") is hidden:
            warnings._showwarnmsg = show


_first = [True]        # Kineto starts once a process: the line can come only from the first start


def kineto_line_dropped(import_thread: int | None):
    """For the window's profiler start: the line filtered out on the first start in a thread
    other than the one that imported torch (`import_thread`), else nothing done."""
    first, _first[0] = _first[0], False
    if first and import_thread is not None and threading.get_ident() != import_thread:
        return without_kineto_line()
    return contextlib.nullcontext()


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create("perfdoctor-stderr")
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix="perfdoctor-stderr-")
    os.unlink(path)
    return fd


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _capture() -> tuple[int, int] | None:
    """(a copy of the real fd 2, the anonymous file fd 2 now points at), or None."""
    saved = sink = None
    try:
        saved, sink = os.dup(2), _anonymous_file()
        os.dup2(sink, 2)
        return saved, sink
    except OSError:
        for fd in (saved, sink):
            if fd is not None:
                os.close(fd)
        return None


@contextlib.contextmanager
def without_kineto_line():
    """Run the block with fd 2 captured; pass on what was written, less Kineto's line."""
    _flush()
    fds = _capture()
    try:
        yield
    finally:
        if fds is not None:
            _flush()
            _release(*fds)


def _release(saved: int, sink: int) -> None:
    try:
        captured = os.pread(sink, os.fstat(sink).st_size, 0)
        _write_all(saved, LINE.sub(b"", captured))
        os.dup2(saved, 2)
        _write_all(2, os.pread(sink, os.fstat(sink).st_size, len(captured)))   # written meanwhile by others
    except OSError:
        os.dup2(saved, 2)
    finally:
        os.close(saved)
        os.close(sink)
