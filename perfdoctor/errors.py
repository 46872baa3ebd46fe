"""Errors that reach the user as one line and a documented exit code (see docs/exit-codes.md), and
`exit_with`, which turns whatever a command raises into them."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

EXIT_OK = 0
EXIT_INPUT = 2        # usage error, unreadable / unsupported / malformed input
EXIT_INTERNAL = 70    # a bug in perfdoctor (EX_SOFTWARE); rerun with --debug for the traceback
EXIT_PIPE = 141       # stdout's reader went away (`| head`): 128 + SIGPIPE, what the shell shows for tools it kills


_END_BY_SIGNAL: list[int] = []


def end_by_signal(sig: int | None = None) -> int | None:
    """With `sig`: ask the console script to end by that signal once its output is flushed (a run
    whose script died of SIGINT ends as `python script.py` does, killed by SIGINT, not by exiting
    130: a shell loop or `make` around it stops at Ctrl-C only for a command that died of it).
    Without: the signal asked for, if any."""
    if sig is not None:
        _END_BY_SIGNAL[:] = [sig]
    return _END_BY_SIGNAL[0] if _END_BY_SIGNAL else None


class PerfdoctorError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class TraceFormatError(PerfdoctorError):
    """The input is not a torch.profiler / Chrome trace we can read."""


def exit_with(command: Callable[[], object]) -> NoReturn:
    """Run the parsed command line and leave with its exit code (a command's typer.Exit(code), or 0):
    an error is one line on stderr and a documented exit code. PERFDOCTOR_DEBUG=1 prints the
    traceback of a PerfdoctorError or a bug before that line; the exit code stays the documented one
    (re-raised, both had left with Python's 1 where `report` documents 2 for bad input)."""
    debug = os.environ.get("PERFDOCTOR_DEBUG") == "1"
    try:
        rv = command()
    except SystemExit as exc:
        if _stdout_gone(exc):
            # rich and click turn EPIPE into exit 1, which reads as `gate`'s regression or
            # `rules check`'s failed case: a closed pipe is neither
            sys.exit(EXIT_PIPE)
        raise
    except PerfdoctorError as exc:
        if debug:       # the traceback, then the same line and exit code (a CI script branches on it)
            traceback.print_exc()
        print(f"perfdoctor: error: {_safe(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug: one line, and how to get the traceback
        if _click_error(exc, "Abort"):
            sys.exit(130)
        if _click_error(exc, "ClickException"):       # a usage error: a bad option or value, a missing argument
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if _click_error(exc, "UsageError") and ctx else ""
            print(f"perfdoctor: error: {_safe(exc.format_message())}{hint}", file=sys.stderr)
            sys.exit(exc.exit_code)
        if debug:
            traceback.print_exc()
        print(f"perfdoctor: internal error: {type(exc).__name__}: {_safe(exc)} "
              "(set PERFDOCTOR_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)
    sys.exit(rv if isinstance(rv, int) else 0)


def _safe(msg: object) -> str:
    """An error message for the terminal: it echoes paths and parse errors, so control
    characters are shown escaped and it stays one line (perfdoctor/report/sanitize.py)."""
    from perfdoctor.report.sanitize import terminal
    return terminal(msg)


def _click_error(exc: Exception, name: str) -> bool:
    """`exc` is click's exception class `name` (ClickException, UsageError, Abort) or a subclass,
    whichever click typer brings: its own copy from typer 0.20 on, the click package before."""
    return any(c.__name__ == name and "click" in c.__module__ for c in type(exc).__mro__)


def _stdout_gone(exc: SystemExit) -> bool:
    """The exit is rich's or click's answer to a closed pipe: both raise SystemExit(1) while
    handling the BrokenPipeError (EPIPE) a write to stdout met."""
    import errno
    ctx = exc.__context__
    return isinstance(ctx, OSError) and ctx.errno == errno.EPIPE
