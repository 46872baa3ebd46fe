"""The memory budget of the profiler window (window.py, "Memory"): how far the process may grow
past its earlier peak while torch.profiler records, read from /proc where Linux has it.

torch.profiler holds about 0.25-0.3 KB per op event while recording, and its stop() and export
take about 1.5 KB per event more for a moment (measured with torch 2.13 on a CPU LSTM, an
LSTMCell loop, a 40-layer MLP and a small conv net, whose steps record 0.3k-11k events; with
record_shapes, `--memory`: ~0.6 KB and ~2.6-3 KB, and profile_memory's allocator events add
~1 KB an op event to the stop); a long step of tiny ops (millions of events) can outgrow the
machine.

The resident size also grows by memory that is free: the profiler's small records, allocated
between the script's tensors, fragment glibc's heap, so the memory a step frees is kept and the
next step's tensors take new pages. That grows with the script's tensor traffic, not with the
events: 12.5 MB a step for an nn.LSTM (hidden 128, batch 32, 100 time steps, 10.5k events a
step: ~1.2 KB an event), 50 MB at batch 128 (~4.5 KB an event), 12 MB with 320 events for a
conv net (12-35 KB an event), none for the MLP; malloc_trim(0) gives it back (~0.27 KB an
event stay). So a window past its budget first returns the free heap (release_free_heap) and
stops only when the process is still over it (window.py).
Used inside the script's process: standard library only."""

from __future__ import annotations

import os
import sys

TRACE_MB = 512.0          # the window's memory budget above the process's earlier peak
AVAILABLE_PART = 20       # ... and at most this part of the memory available when recording begins
FLOOR_MB = 32.0           # a budget is never below this
CHECK_S = 0.05            # at most one resident-size reading per CHECK_S while recording


def resident_bytes() -> int | None:
    """This process's resident size (Linux /proc/self/statm), None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def peak_resident_bytes() -> int | None:
    """The process's peak resident size so far (ru_maxrss: KiB on Linux)."""
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 if sys.platform.startswith("linux") else None
    except (ImportError, OSError, ValueError):
        return None


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for row in f:
                if row.startswith("MemAvailable:"):
                    return int(row.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_free_heap() -> bool:
    """Return the free memory of glibc's heaps to the system (malloc_trim(0): every arena, free
    pages inside the heap too). False where there is no glibc (macOS, musl) or it fails."""
    global _trim
    if _trim is None:
        _trim = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
                _trim = fn
            except (ImportError, OSError, AttributeError):
                pass
    if not _trim:
        return False
    try:
        _trim(0)
        return True
    except Exception:
        return False


_trim = None      # glibc's malloc_trim (ctypes), False where there is none


def memory_limit(trace_mb: float) -> tuple[int, int] | None:
    """(resident size at which recording stops, the budget) for a window starting now, or None
    where resident sizes cannot be read."""
    now, peak = resident_bytes(), peak_resident_bytes()
    if now is None:
        return None
    budget = trace_mb * 2 ** 20
    avail = available_bytes()
    if avail is not None:
        budget = min(budget, avail / AVAILABLE_PART)
    budget = int(max(budget, FLOOR_MB * 2 ** 20))
    return max(now, peak or 0) + budget, budget
