"""Strings in a trace's JSON that are not text, read as U+FFFD: lone UTF-16 surrogate escapes
and raw bytes that are not UTF-8.

Python's json writes "\\udc80" for a str holding an undecodable byte (os.fsdecode of a path, a
name read with surrogateescape): valid JSON, which msgspec refuses as "truncated". A writer that
copies a name's bytes as they are (Latin-1, a damaged byte) makes JSON msgspec refuses as
"Invalid UTF-8 encoded string". The reader retries a chunk that fails to decode with either
replaced (trace/decode.py), and --annotate does so for surrogate escapes (report/annotate.py).
"""

from __future__ import annotations

import re

from perfdoctor.trace.source import ReadState

# A \uD800-\uDFFF escape outside a high+low pair, and only a real escape: one after an even
# number of backslashes ("C:\\udc80" is text).
_HI, _LO = rb"[dD][89abAB][0-9a-fA-F]{2}", rb"[dD][c-fC-F][0-9a-fA-F]{2}"
LONE_SURROGATE = re.compile(rb"(?<!\\)((?:\\\\)*)(?:\\u" + _HI + rb"(?!\\u" + _LO + rb")|(?<!\\u" + _HI + rb")\\u" + _LO + rb")")
SURROGATE_WARNING = ("the trace's strings hold lone UTF-16 surrogate escapes (bytes that were not text): "
                     "read as U+FFFD")
NOT_UTF8_WARNING = "some of the trace's names and strings were not valid UTF-8: the bad bytes read as U+FFFD"


def lone_surrogates_replaced(raw: bytes) -> tuple[bytes, int]:
    """`raw` JSON with its lone surrogate escapes as \\ufffd, and how many there were. The
    pattern has no literal start, so the regex engine tries it at every byte (a 1.4 GB trace:
    140 s): a trace without a surrogate escape at all is known so by two byte searches."""
    if b"\\ud" not in raw and b"\\uD" not in raw:
        return raw, 0
    return LONE_SURROGATE.subn(rb"\1\\ufffd", raw)


def replaced_or_none(payload, state: ReadState) -> bytes | None:
    """`payload` with its lone surrogate escapes read as U+FFFD (and a warning), or None when it
    holds none."""
    fixed, n = lone_surrogates_replaced(bytes(payload))
    if not n:
        return None
    if SURROGATE_WARNING not in state.warnings:
        state.warnings.append(SURROGATE_WARNING)
    return fixed


def not_utf8_replaced_or_none(payload, state: ReadState) -> bytes | None:
    """`payload` with its bytes that are not UTF-8 read as U+FFFD (and a warning), or None when it
    is valid UTF-8. Outside strings such bytes are invalid JSON either way: the retry fails too."""
    raw = bytes(payload)
    try:
        raw.decode("utf-8")
        return None
    except UnicodeDecodeError:
        pass
    if NOT_UTF8_WARNING not in state.warnings:
        state.warnings.append(NOT_UTF8_WARNING)
    return raw.decode("utf-8", "replace").encode("utf-8")
