"""Number tokens strict JSON lacks, read as the floats they mean.

Python's json writes NaN, Infinity and -Infinity for such floats; C++ writers print nan and inf;
and a damaged or hostile file may hold numbers beyond a float's range (1e999, a 401-digit
integer). msgspec refuses the first kinds as malformed and the last as "out of range", which cut
a trace off at the first such event. The reader retries a chunk that fails with them quoted
(trace/decode.py): the untyped path then reads "NaN" as nan and "1e999" as inf, and the table's
check for impossible events (trace/assemble.py) leaves such an event out, with its warning.
"""

from __future__ import annotations

import math
import re

from perfdoctor.trace.source import ReadState

# A token in a value's place (after ':' ',' or '['; before ',' ']' or '}'): not inside a string
# unless the string itself holds such punctuation, and then the retry fails as the first try did.
_WORDS = rb"-?(?:NaN|nan|Infinity|inf)"
_HUGE = rb"-?(?:\d{20,}(?:\.\d*)?(?:[eE][+-]?\d+)?|\d+(?:\.\d*)?[eE]\+?\d{3,})"
ODD_TOKEN = re.compile(rb"([:,\[]\s*)(" + _WORDS + rb"|" + _HUGE + rb")(?=\s*[,\]\}])")
WARNING = ("the trace holds numbers strict JSON lacks (NaN, Infinity, or beyond a float's range): "
           "read as not-a-number or infinite")


def quoted_or_none(payload, state: ReadState, out_of_range: bool = False) -> bytes | None:
    """`payload` with its odd number tokens as strings (and a warning), or None when it holds
    none. The costly search runs only where a byte search finds a word, or where msgspec said a
    number was out of range (`out_of_range`)."""
    raw = bytes(payload)
    if not out_of_range and b"NaN" not in raw and b"nan" not in raw and b"inf" not in raw and b"Inf" not in raw:
        return None
    fixed, n = ODD_TOKEN.subn(rb'\1"\2"', raw)
    if not n:
        return None
    if WARNING not in state.warnings:
        state.warnings.append(WARNING)
    return fixed


def as_float(v) -> float:
    """float(v) for a JSON number or a quoted odd token; an integer beyond a float's range is
    infinite with its sign (float() raises OverflowError for it). ValueError/TypeError as float()."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
