"""JSON read from files a user hands us (report.json, a run directory's files, tune's JSON).

Python's json reads NaN and Infinity, but an integer of hundreds of digits becomes an int that
float() refuses (OverflowError deep in a comparison) and one of over 4300 digits is refused
outright. Such files are damaged or hostile; here an integer of more than 18 digits is read as
the float it is closest to (inf beyond a float's range), so every number is one the checks for
finite, positive values can judge.
"""

from __future__ import annotations

import json


def _int(digits: str) -> int | float:
    return int(digits) if len(digits.lstrip("-")) <= 18 else float(digits)


def loads(data: str | bytes):
    """json.loads with long integers as floats. ValueError (JSONDecodeError) / RecursionError as
    json.loads."""
    return json.loads(data, parse_int=_int)
