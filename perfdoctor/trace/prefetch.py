"""Start loading the trace of `perfdoctor report PATH` before the CLI is even imported.

The console script calls `start_from_argv` first thing: if the arguments are a plain
`report PATH [options]` and PATH is a big enough trace (or a directory of them), the helper
process of perfdoctor.trace.loader starts decoding the first file while this process imports
typer, numpy, the analysis and the rules (about 0.2 s it would otherwise spend before the load
even started). `take(path)` hands the pending load to the report pipeline; `abandon()` (always
called on the way out) stops a helper whose load was never taken, e.g. after a usage error.

Anything unexpected in the arguments means no prefetch: typer then parses them as always.
"""

from __future__ import annotations

import os

from perfdoctor.collect.rundir import is_run_dir
from perfdoctor.trace import loader

# `report`'s options (tests/test_prefetch.py checks them against the CLI's)
VALUE_OPTIONS = {"-f", "--format", "-o", "--output", "--rules", "--annotate", "--tune"}   # take a value
FLAG_OPTIONS = {"--details"}

_pending: dict[str, loader.PendingLoad] = {}


def report_path(argv: list[str]) -> str | None:
    """PATH of `report PATH [options]`, or None if argv is anything else or is not plain."""
    if not argv or argv[0] != "report":
        return None
    positional: list[str] = []
    it = iter(argv[1:])
    for arg in it:
        if arg == "--":
            positional += list(it)
            break
        if arg in VALUE_OPTIONS:
            if next(it, None) is None:
                return None
        elif arg in FLAG_OPTIONS:
            continue
        elif arg.startswith("-") and arg != "-":
            if arg.split("=", 1)[0] not in VALUE_OPTIONS or "=" not in arg:
                return None   # --help, a typo, a flag we do not know: leave it all to typer
        else:
            positional.append(arg)
    return positional[0] if len(positional) == 1 else None


def start_from_argv(argv: list[str]) -> None:
    path = report_path(argv)
    if path is None:
        return
    try:
        if is_run_dir(path):     # `report RUN_DIR`: the run's own trace
            first = loader.run_trace_files(os.path.join(path, "trace"))[0]
        else:
            first = loader.find_trace_files(path)[0]
        pending = _pending[_key(first)] = loader.PendingLoad(first)   # where abandon() finds it
        pending.start()
    except Exception:  # any problem is reported by the real run, one line, as always
        return


def take(path: str | os.PathLike) -> loader.PendingLoad | None:
    """The load started for `path`, if any. It stays registered, so abandon() still reaps its
    helper if a Ctrl-C lands before the caller's own cleanup is in place (close() is idempotent)."""
    return _pending.get(_key(path))


def abandon() -> None:
    while _pending:
        _pending.popitem()[1].close()


def _key(path: str | os.PathLike) -> str:
    return os.path.realpath(path)
