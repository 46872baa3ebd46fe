"""The console script (`perfdoctor`, `python -m perfdoctor`).

Before the CLI is imported, a `report` starts loading its trace (perfdoctor.trace.prefetch):
a helper process decodes while typer, numpy, the analysis and the rules are imported. It also
keeps freed memory for reuse (`_keep_freed_memory`). After
the command, the process leaves without interpreter teardown: freeing a big trace's objects
and modules costs ~70 ms that nobody waits for usefully. Output is flushed first and every
file perfdoctor writes is closed by then, so nothing is lost. In-process callers (tests) use
perfdoctor.cli.main(), which raises SystemExit as usual.
"""

from __future__ import annotations

import os
import sys


def entry() -> None:
    prefetch = None
    try:
        if sys.argv[1:2] == ["report"]:  # other commands do not pay for importing the loader
            _keep_freed_memory()
            from perfdoctor.trace import prefetch

            prefetch.start_from_argv(sys.argv[1:])
        from perfdoctor.cli import main

        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): what Python would print, and status 1
            print(exc.code, file=sys.stderr)
            code = 1
    finally:
        if prefetch is not None:
            prefetch.abandon()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): its reader has gone
            pass
    _end_by_signal()
    os._exit(code)


def _end_by_signal() -> None:
    """A run whose script died of SIGINT ends the same way (errors.end_by_signal); no return then."""
    from perfdoctor.errors import end_by_signal
    sig = end_by_signal()
    if sig is not None:
        import signal
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


def _keep_freed_memory() -> None:
    """glibc returns every freed block above 128 KiB to the kernel, so each of the analysis's
    large temporary arrays costs fresh page faults (and zeroing) in a new process: a third of
    a cold analysis. Keeping freed memory for reuse takes that off; the process is short-lived,
    so holding its peak until exit costs nothing. Not glibc: nothing to do."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)   # M_MMAP_THRESHOLD: large blocks from the heap, not mmap
        libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD: do not give the heap's top back
    except (OSError, AttributeError):  # musl or another libc
        pass
