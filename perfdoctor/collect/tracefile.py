"""The trace file of the profiler window (window.py): its name, its compression, its removal.

Kineto writes <run>/trace/<host>_<pid>.pt.trace.json on the training thread (its C++ writer,
the least the script can be held up); a background thread then compresses it to
.pt.trace.json.gz (isal, which releases the GIL) while training goes on, joined at the end.
A window placed again after the step source changed writes a file of its own
(<host>_<pid>-<generation>.pt.trace.json); the file of the window it replaced is removed at the
end, once its compression is done.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading

COMPRESS_WAIT_S = 120.0   # at the end, how long to wait for the trace's compression


def trace_path(run_dir: str, generation: int) -> str:
    """The plain trace file of the run's window `generation` (0: the first), its folder made."""
    d = os.path.join(run_dir, "trace")
    os.makedirs(d, exist_ok=True)
    again = f"-{generation}" if generation else ""     # a window placed again (rebase)
    return os.path.join(d, f"{socket.gethostname()}_{os.getpid()}{again}.pt.trace.json")


def compress_trace(path: str) -> None:
    """path -> path + ".gz" (written under a hidden name, then renamed), then the plain file is
    removed. Any failure leaves the plain trace in place: readers take it as well."""
    d, name = os.path.split(path)
    partial = os.path.join(d, f".{name}.gz.partial")
    try:
        try:
            from isal import igzip as gz   # releases the GIL while compressing; ~4x zlib's speed
            level = 2
        except ImportError:  # pragma: no cover - isal is a dependency, but the child runs in the user's env
            import gzip as gz
            level = 6
        with open(path, "rb") as src, gz.open(partial, "wb", compresslevel=level) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, path + ".gz")
        os.remove(path)
    except Exception:
        try:
            os.remove(partial)
        except OSError:
            pass


def compress_in_background(path: str) -> threading.Thread:
    """compress_trace(path) on a thread of its own, started."""
    thread = threading.Thread(target=compress_trace, args=(path,), name="perfdoctor-trace-gzip", daemon=True)
    thread.start()
    return thread


def remove_dropped(dropped: list[tuple[str, threading.Thread | None]]) -> None:
    """Remove the traces (plain and compressed) of dropped windows, each once its compressor ends."""
    for path, compressor in dropped:
        if compressor is not None:
            compressor.join(timeout=COMPRESS_WAIT_S)
        for name in (path, path + ".gz"):
            try:
                os.remove(name)
            except OSError:
                pass
