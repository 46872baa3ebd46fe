"""Stream a (possibly gzipped, possibly truncated) Chrome trace as decoded event chunks.

A trace file is HEADER `"traceEvents": [` BODY `]` TRAILER (or a bare JSON list of events).
The body is cut into chunks of about CHUNK_BYTES at `}, {` boundaries and each chunk is decoded
on its own with msgspec, so memory stays bounded by one chunk plus the columns built so far
(an 8x concatenated 54 MB trace stays far below 1 GB). A cut that lands inside a nested value
makes the chunk invalid JSON, which the decoder reports; we then move to the next boundary, so
the cut is always correct. JSON strings cannot hold raw newlines or unbalanced quotes across a
cut without failing the decode, so no false positive is possible.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator

import msgspec

from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import schema

CHUNK_BYTES = 8 << 20
READ_BYTES = 4 << 20
MAX_CUT_TRIES = 64
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ReadState:
    """What the reader learnt besides the events: metadata, warnings, truncation."""

    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    untyped_chunks: int = 0
    bytes_read: int = 0


def _open(path: str) -> tuple[BinaryIO, bool]:
    f = open(path, "rb")
    is_gz = f.read(2) == GZIP_MAGIC
    f.seek(0)
    if not is_gz:
        return f, False
    f.close()
    try:
        from isal import igzip  # ~1.7x faster inflate than zlib
        return igzip.open(path, "rb"), True
    except ImportError:  # pragma: no cover - isal is a dependency, zlib is the fallback
        return gzip.open(path, "rb"), True


class _Source:
    """Buffered reader that turns a corrupt/short gzip stream into a clean EOF plus a flag."""

    def __init__(self, path: str, state: ReadState):
        self.f, self.is_gz = _open(path)
        self.state = state
        self.eof = False

    def read(self) -> bytes:
        if self.eof:
            return b""
        try:
            data = self.f.read(READ_BYTES)
        except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
            data = b""
            if self.state.bytes_read == 0:
                raise TraceFormatError(f"cannot decompress: {exc}") from None
            self.state.truncated = True
            self.state.warnings.append(f"compressed stream ends early ({exc}); using what decompressed")
        if not data:
            self.eof = True
            self.f.close()
        self.state.bytes_read += len(data)
        return data


def _decode_events(chunk: bytes, state: ReadState) -> list[schema.Event]:
    """Decode `[chunk]`; raises msgspec.DecodeError on syntax errors (bad cut / corrupt data)."""
    return _decode_payload(b"[" + chunk + b"]", state)


def _decode_span(buf: bytearray, start: int, end: int, state: ReadState) -> list[schema.Event]:
    """Decode buf[start:end] as a list without copying: the bytes just outside the span (a
    separator or whitespace) are swapped for brackets during the decode and then restored."""
    before, after = buf[start - 1], buf[end]
    buf[start - 1], buf[end] = 0x5B, 0x5D  # '[' ']'
    try:
        with memoryview(buf) as mv:
            return _decode_payload(mv[start - 1:end + 1], state)
    finally:
        buf[start - 1], buf[end] = before, after


def _decode_payload(payload, state: ReadState) -> list[schema.Event]:
    try:
        return schema.EVENTS_DECODER.decode(payload)
    except msgspec.ValidationError:
        state.untyped_chunks += 1
        return coerce_events(schema.ANY_DECODER.decode(payload), state)


def coerce_events(items: list, state: ReadState) -> list[schema.Event]:
    """Slow path for events whose field types do not match the schema (odd producers)."""
    out = []
    bad = 0
    for d in items:
        if not isinstance(d, dict):
            bad += 1
            continue
        try:
            out.append(schema.Event(
                ph=str(d.get("ph", "")), cat=str(d.get("cat") or ""), name=str(d.get("name", "")),
                pid=_id(d.get("pid", 0)), tid=_id(d.get("tid", 0)),
                ts=float(d.get("ts") or 0.0), dur=float(d.get("dur") or 0.0),
                args=_coerce_args(d.get("args"))))
        except (TypeError, ValueError):
            bad += 1
    if bad:
        state.warnings.append(f"skipped {bad} malformed events")
    return out


def _id(v: Any) -> int | str:
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else str(v)


def _coerce_args(a: Any) -> schema.Args:
    if not isinstance(a, dict):
        return schema.NO_ARGS
    kw = {}
    for f in schema.Args.__struct_fields__:
        key = schema.Args.__struct_encode_fields__[schema.Args.__struct_fields__.index(f)]
        v = a.get(key)
        if f in ("label", "labels"):
            kw[f] = v if isinstance(v, str) else None
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            kw[f] = v
        elif f == "stream" and isinstance(v, str):
            kw[f] = v
    return schema.Args(**kw)


def iter_event_chunks(path: str, state: ReadState) -> Iterator[list[schema.Event]]:
    """Yield lists of events in file order; fills `state` with metadata and warnings."""
    src = _Source(path, state)
    buf = bytearray()
    while not src.eof and len(buf) < 4096:
        buf += src.read()
    start = bytes(buf[:64]).lstrip()[:1]
    if start == b"[":
        bare, pos = True, buf.index(b"[") + 1
    elif start == b"{":
        bare = False
        m = EVENTS_KEY.search(buf)
        while m is None and not src.eof:
            buf += src.read()
            m = EVENTS_KEY.search(buf)
        if m is None:
            yield from _whole_document(bytes(buf), state)
            return
        _decode_header(bytes(buf[:m.start()]), state)
        pos = m.end()
    else:
        kind = "empty file" if not bytes(buf).strip() else "not a JSON trace (expected '{' or '[')"
        raise TraceFormatError(kind)

    while True:
        if not src.eof and len(buf) - pos < CHUNK_BYTES + READ_BYTES:
            buf += src.read()
            continue
        if src.eof:
            break
        events, cut_at = _cut_chunk(buf, pos, state)
        if events is None:  # no valid cut in the buffer yet: read more
            buf += src.read()
            continue
        yield events
        del buf[:cut_at - 1]   # keep one byte before the next event for _decode_span
        pos = 1
    yield from _decode_tail(bytes(buf[pos:]), bare, state)


def _cut_chunk(buf: bytearray, pos: int, state: ReadState):
    m = BOUNDARY.search(buf, pos + CHUNK_BYTES)
    tries = 0
    while m is not None and tries < MAX_CUT_TRIES:
        try:
            return _decode_span(buf, pos, m.start() + 1, state), m.end() - 1
        except msgspec.DecodeError:
            tries += 1
            m = BOUNDARY.search(buf, m.end())
    return None, pos


def _decode_header(header: bytes, state: ReadState) -> None:
    text = header.rstrip()
    text = text[:-1] if text.endswith(b",") else text
    try:
        doc = schema.DOC_DECODER.decode(text + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        state.warnings.append("could not read the trace header (deviceProperties etc.)")
        return
    _merge_meta(doc, state)


def _merge_meta(doc: schema.TraceDoc, state: ReadState) -> None:
    for f in schema.META_FIELDS:
        v = getattr(doc, f)
        if v is not None:
            state.meta[f] = v


def _decode_tail(tail: bytes, bare: bool, state: ReadState) -> Iterator[list[schema.Event]]:
    try:
        if bare:
            text = tail.rstrip()
            if text.endswith(b"]"):
                text = text[:-1]
            yield _decode_events(text, state) if text.strip() else []
            return
        doc = schema.DOC_DECODER.decode(b'{"traceEvents":[' + tail)
        _merge_meta(doc, state)
        yield doc.traceEvents
        return
    except msgspec.ValidationError:
        try:
            doc = schema.ANY_DECODER.decode(b'{"traceEvents":[' + tail)
            state.untyped_chunks += 1
            yield coerce_events(doc.get("traceEvents", []), state)
            return
        except msgspec.DecodeError:
            pass
    except msgspec.DecodeError:
        pass
    yield _salvage(tail, state)


def _salvage(tail: bytes, state: ReadState) -> list[schema.Event]:
    """The end does not parse: keep the longest prefix of whole events that does."""
    cuts = [m.start() + 1 for m in BOUNDARY.finditer(tail)]
    for cut in reversed(cuts[-MAX_CUT_TRIES:]):
        try:
            events = _decode_events(tail[:cut], state)
        except msgspec.DecodeError:
            continue
        _warn_truncated(state, len(tail) - cut)
        return events
    # Fewer than two whole events, or damage early in the tail: try the first event alone.
    end = tail.find(b"}")
    while end != -1:
        try:
            events = _decode_events(tail[:end + 1], state)
            _warn_truncated(state, len(tail) - end - 1)
            return events
        except msgspec.DecodeError:
            end = tail.find(b"}", end + 1)
    _warn_truncated(state, len(tail))
    return []


def _warn_truncated(state: ReadState, dropped: int) -> None:
    state.truncated = True
    state.warnings.append(
        f"trace is truncated or damaged near its end; ignored the last {dropped:,} bytes "
        "and used every event that parsed before them")


def _whole_document(buf: bytes, state: ReadState) -> Iterator[list[schema.Event]]:
    """An object without a `traceEvents` key where we expected one."""
    try:
        obj = schema.ANY_DECODER.decode(buf)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc}") from None
    raise TraceFormatError(
        "JSON object has no 'traceEvents' array; keys: " + ", ".join(list(obj)[:6]))
    yield []  # pragma: no cover
