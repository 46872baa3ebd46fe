"""Errors that reach the user as one line and a documented exit code (see docs/exit-codes.md)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_INPUT = 2        # usage error, unreadable / unsupported / malformed input
EXIT_INTERNAL = 70    # a bug in perfdoctor (EX_SOFTWARE); rerun with --debug for the traceback
EXIT_PIPE = 141       # stdout's reader went away (`| head`): 128 + SIGPIPE, what the shell shows for tools it kills


class PerfdoctorError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class TraceFormatError(PerfdoctorError):
    """The input is not a torch.profiler / Chrome trace we can read."""
