"""JSON read from files a user hands us (report.json, a run directory's files, tune's JSON).

Python's json reads NaN and Infinity, but an integer of hundreds of digits becomes an int that
float() refuses (OverflowError deep in a comparison) and one of over 4300 digits is refused
outright. Such files are damaged or hostile; here an integer of more than 18 digits is read as
the float it is closest to (inf beyond a float's range), so every number is one the checks for
finite, positive values can judge.

`read_bytes(path)` reads such a file only when it is a regular file: a FIFO named steps.jsonl
blocked `perfdoctor report RUN_DIR` forever, and a link to /dev/zero read until the memory ran out.
"""

from __future__ import annotations

import errno
import json
import os
import stat


def _int(digits: str) -> int | float:
    return int(digits) if len(digits.lstrip("-")) <= 18 else float(digits)


def loads(data: str | bytes):
    """json.loads with long integers as floats. ValueError (JSONDecodeError) / RecursionError as
    json.loads."""
    return json.loads(data, parse_int=_int)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the file at `path`, which must be a regular file: opened without blocking
    (a FIFO with no writer would block the open), then refused unless fstat says regular.
    OSError as open() (FileNotFoundError for a missing file), EINVAL for a FIFO, socket, device
    or directory, its strerror saying so."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket, device or directory)", str(path))
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, errors: str = "strict") -> str:
    """read_bytes(path) as UTF-8 text (UnicodeDecodeError, a ValueError, with errors="strict")."""
    return read_bytes(path).decode("utf-8", errors)


def perfdoctor_doc(obj, kind: str) -> bool:
    """`obj` is a document perfdoctor wrote: kind "report" (report.json, --format json: a verdict)
    or "tune" (tune.json, tune -o FILE: its trials, a list)."""
    if not (isinstance(obj, dict) and str(obj.get("tool")).startswith("perfdoctor")):
        return False
    return "verdict" in obj if kind == "report" else isinstance(obj.get("trials"), list)
