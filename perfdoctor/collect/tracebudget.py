"""The memory budget of the profiler window (window.py, "Memory"): how far the process may grow
past its earlier peak while torch.profiler records, read from /proc where Linux has it.

torch.profiler holds about 1 KB per op event while recording, and its stop() and export take
about twice that again; a long step of tiny ops (millions of events) can outgrow the machine.
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
