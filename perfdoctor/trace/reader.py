"""Stream a (possibly gzipped, possibly truncated) Chrome trace as decoded event chunks.

A trace file is HEADER `"traceEvents": [` BODY `]` TRAILER (or a bare JSON list of events).
The body is cut into chunks of about CHUNK_BYTES at `}, {` boundaries and each chunk is decoded
on its own with msgspec, so memory stays bounded by one read buffer plus the columns built so far
(an 8x concatenated 54 MB trace stays far below 1 GB). A cut that lands inside a nested value
makes the chunk invalid JSON, which the decoder reports; we then move to the next boundary, so
the cut is always correct. JSON strings cannot hold raw newlines or unbalanced quotes across a
cut without failing the decode, so no false positive is possible.

Where the cuts fall depends only on the decompressed bytes, never on how they were read: a chunk
is cut at the first of up to MAX_CUT_TRIES boundaries after `pos + CHUNK_BYTES` that decodes,
provided at least CHUNK_BYTES + READ_BYTES bytes follow `pos`; what is left is the tail, decoded
with the trailer. So a second process can start mid-file (`ChunkStream.skip_to`) and, if it
starts on a cut the single pass makes, decode exactly what that pass would from there on (see
perfdoctor.trace.parallel).

Memory is reused rather than allocated: one read buffer filled with `readinto`, and chunks small
enough (CHUNK_BYTES) that each chunk's Python objects fit in memory freed by the previous one.
Touching fresh pages is expensive on small VMs (~2.5 us a page fault): allocating per read and
per 8 MB chunk used to cost ~50k faults on a 54 MB trace.

Each chunk is decoded by trace/decode.py (leniently: odd field types, bad UTF-8, odd numbers);
this module owns where chunks are cut, the header, and a damaged end (salvage).
"""
from __future__ import annotations

import mmap
import re
from typing import Callable, Iterator

import msgspec

from perfdoctor.errors import TraceFormatError
from perfdoctor.inputjson import perfdoctor_doc
from perfdoctor.trace import decode, schema
from perfdoctor.trace.source import ReadState, Source

__all__ = ["ChunkStream", "ReadState", "iter_event_chunks"]

CHUNK_BYTES = 256 << 10    # JSON bytes per msgspec decode: small chunks reuse warm memory
READ_BYTES = 256 << 10     # bytes that must follow a chunk for it to be cut; also the read size
MAX_CUT_TRIES = 64
BUFFER_BYTES = 4 << 20     # read buffer (grows only for events of several MiB)
# Memory cap: the bytes one decode may need at once (the header before "traceEvents", or the span
# between two event boundaries). A gzip bomb or a file of one multi-GB string is refused when it
# reaches this, keeping the process far below 1 GiB (buffer, one copy and the decoded objects).
MAX_SPAN_BYTES = 128 << 20
KEEP_BYTES = 16            # consumed bytes kept before the next chunk (see ChunkStream._tail)
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
BOM = b"\xef\xbb\xbf"
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
TAIL_PREFIX = b'{"traceEvents":['
assert len(TAIL_PREFIX) == KEEP_BYTES


LFS_POINTER = b"version https://git-lfs.github.com/spec/"     # what a clone without git-lfs holds


class ChunkStream:
    """The decompressed trace in one reusable buffer, cut into decoded event chunks.

    `open()` reads the header, `chunks()` yields event lists in file order (the body's chunks,
    then the tail with the trailer). `offset` is the absolute offset of the next chunk and
    `at_cut` says the last list yielded was a body chunk."""

    def __init__(self, path: str, state: ReadState):
        self.state = state
        self.src = Source(path, state)
        # An anonymous map, not a bytearray: pages are touched only as data arrives (small files
        # cost a few pages) and no zero-fill pass is needed.
        self.buf = mmap.mmap(-1, BUFFER_BYTES)
        self.base = 0      # absolute offset of buf[0]
        self.end = 0       # buf[:end] holds data
        self.pos = 0       # start of the next chunk, relative to buf
        self.bare = False
        self.at_cut = False
        self._no_boundary_before = 0   # absolute offset before which a chunk search found no boundary

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def position(self) -> int:
        """How far into the file we are, in the unit a parallel load balances in: compressed
        bytes read for gzip (source.GZ_INPUT_BYTES granular), else `offset`."""
        return self.src.compressed_pos() if self.src.is_gz else self.offset

    def close(self) -> None:
        self.src.close()
        try:
            self.buf.close()
        except BufferError:  # pragma: no cover - a view is still alive; the GC unmaps it later
            pass

    def _fill(self, need: int) -> None:
        """Append at least `need` bytes (fewer only at EOF)."""
        want = max(need, READ_BYTES)
        if self.end + want > len(self.buf):
            keep_from = max(self.pos - KEEP_BYTES, 0)
            if keep_from:
                n = self.end - keep_from
                with memoryview(self.buf) as mv:
                    mv[:n] = mv[keep_from:self.end]
                self.base += keep_from
                self.pos -= keep_from
                self.end = n
            if self.end + want > len(self.buf):  # events bigger than the buffer: grow it
                if self.end + want > MAX_SPAN_BYTES:
                    raise TraceFormatError(
                        f"refused: {self.end >> 20} MiB from offset {self.base + self.pos:,} without an event "
                        f"boundary (a single event, a header or a string over the {MAX_SPAN_BYTES >> 20} MiB cap: "
                        "not a profiler trace, or a decompression bomb)")
                bigger = mmap.mmap(-1, max(self.end + want, 2 * len(self.buf)))
                bigger[:self.end] = self.buf[:self.end]
                self.buf = bigger  # the old map goes when its last view does
        got = 0
        with memoryview(self.buf) as mv:
            while got < need:
                n = self.src.readinto(mv[self.end:self.end + want - got])
                if not n:
                    break
                self.end += n
                got += n

    def open(self) -> None:
        """Read the header: sets `bare` and the first chunk's position, `state.meta`."""
        while not self.src.eof and self.end < 4096:
            self._fill(4096 - self.end)
        buf = self.buf
        head = bytes(buf[:min(64, self.end)])
        skip = len(BOM) if head.startswith(BOM) else 0       # a UTF-8 byte order mark (Windows editors)
        start = head[skip:].lstrip()[:1]
        if start == b"[":
            self.bare, self.pos = True, buf.find(b"[", 0, self.end) + 1
        elif start == b"{":
            m = EVENTS_KEY.search(buf, 0, self.end)
            while m is None and not self.src.eof:
                seen = max(self.end - 64, 0)     # searched already (the key is shorter): linear, not quadratic
                self._fill(1)
                m = EVENTS_KEY.search(self.buf, seen, self.end)
            if m is None:
                _whole_document(bytes(self.buf[skip:self.end]))
            decode.decode_header(bytes(self.buf[skip:m.start()]), self.state)
            self.pos = m.end()
        else:  # judged on the first 4 MiB, as always
            while not self.src.eof and self.end < 4 << 20:
                self._fill((4 << 20) - self.end)
            head = bytes(self.buf[:min(self.end, 4 << 20)])
            kind = ("empty file" if not head.strip() else
                    "a Git LFS pointer, not the trace itself (`git lfs pull` in its repository fetches it)"
                    if head[skip:].startswith(LFS_POINTER) else "not a JSON trace (expected '{' or '[')")
            raise TraceFormatError(kind)

    def chunks(self) -> Iterator[list[schema.Event]]:
        need = CHUNK_BYTES + READ_BYTES
        while True:
            ahead = self.end - self.pos
            if not self.src.eof and ahead < need:
                self._fill(need - ahead)
                continue
            if self.src.eof:
                break
            events, cut_at = _cut_chunk(self.buf, self.pos, self.end, self.state,
                                        max(self._no_boundary_before - self.base, self.pos))
            if events is None:  # no valid cut in the buffer yet: read more
                if cut_at is None:   # not even a boundary: do not scan these bytes again
                    self._no_boundary_before = self.base + self.end - (64 << 10)   # whitespace inside a boundary
                self._fill(1)
                continue
            self.pos = cut_at
            self.at_cut = True
            yield events
        self.at_cut = False
        yield from self._tail()

    def skip_to(self, stop: Callable[[], bool]) -> bool:
        """Follow the cuts a single pass makes when every cut is the first boundary tried, without
        decoding anything, until `stop()` says so (checked after each cut, so at least one).
        False when the stream ends first (a single pass would be in its tail by then)."""
        need = CHUNK_BYTES + READ_BYTES
        while True:
            while not self.src.eof and self.end - self.pos < need:
                self._fill(need - (self.end - self.pos))
            if self.end - self.pos < need:
                return False
            m = BOUNDARY.search(self.buf, self.pos + CHUNK_BYTES, self.end)
            while m is None:
                if self.src.eof:
                    return False
                seen = self.base + self.end - (64 << 10)
                self._fill(1)
                m = BOUNDARY.search(self.buf, max(self.pos + CHUNK_BYTES, seen - self.base), self.end)
            self.pos = m.end() - 1
            if stop():
                return True

    def _tail(self) -> Iterator[list[schema.Event]]:
        buf, pos, end = self.buf, self.pos, self.end
        if not self.bare:
            # '{"traceEvents":[' + tail, written over consumed bytes instead of copying the tail
            p0 = pos - KEEP_BYTES
            saved = bytes(buf[p0:pos])
            buf[p0:pos] = TAIL_PREFIX
            try:
                with memoryview(buf) as mv, mv[p0:end] as payload:
                    doc = schema.DOC_DECODER.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                doc = None  # the general path below sorts it out (untyped, truncated ...)
            finally:
                buf[p0:pos] = saved
            if doc is not None:
                decode.merge_meta(doc, self.state)
                yield doc.traceEvents
                return
        yield from _decode_tail(bytes(buf[pos:end]), self.bare, self.state)


def iter_event_chunks(path: str, state: ReadState) -> Iterator[list[schema.Event]]:
    """Yield lists of events in file order; fills `state` with metadata and warnings."""
    stream = ChunkStream(path, state)
    try:
        stream.open()
        yield from stream.chunks()
    finally:
        stream.close()


def _cut_chunk(buf: mmap.mmap, pos: int, end: int, state: ReadState, scan_from: int = 0):
    """(events, position after the cut), or (None, pos) when no boundary decodes yet, or (None,
    None) when there is no boundary at all after max(pos + CHUNK_BYTES, scan_from)."""
    m = BOUNDARY.search(buf, max(pos + CHUNK_BYTES, scan_from), end)
    if m is None:
        return None, None
    tries = 0
    while m is not None and tries < MAX_CUT_TRIES:
        try:
            return decode.decode_span(buf, pos, m.start() + 1, state), m.end() - 1
        except msgspec.DecodeError:
            tries += 1
            m = BOUNDARY.search(buf, m.end(), end)
    return None, pos


def _decode_tail(tail: bytes, bare: bool, state: ReadState) -> Iterator[list[schema.Event]]:
    try:
        if bare:
            text = tail.rstrip()
            if text.endswith(b"]"):
                text = text[:-1]
            yield decode.decode_events(text, state) if text.strip() else []
        else:
            yield decode.decode_document(b'{"traceEvents":[' + tail, state)
        return
    except msgspec.DecodeError:
        pass
    yield _salvage(tail, state)


def _salvage(tail: bytes, state: ReadState) -> list[schema.Event]:
    """The end does not parse: keep the longest prefix of whole events that does."""
    cuts = [m.start() + 1 for m in BOUNDARY.finditer(tail)]
    for cut in reversed(cuts[-MAX_CUT_TRIES:]):
        try:
            events = decode.decode_events(tail[:cut], state)
        except msgspec.DecodeError:
            continue
        _warn_truncated(state, len(tail) - cut)
        return events
    # Fewer than two whole events, or damage early in the tail: try the first event alone, ending
    # at one of the first MAX_CUT_TRIES '}' (its nested args close a few). Each try decodes from
    # the start, so trying every '}' was quadratic: 100k of them (a deep nest) ran for hours.
    end, tries = tail.find(b"}"), 0
    while end != -1 and tries < MAX_CUT_TRIES:
        try:
            events = decode.decode_events(tail[:end + 1], state)
            _warn_truncated(state, len(tail) - end - 1)
            return events
        except msgspec.DecodeError:
            end, tries = tail.find(b"}", end + 1), tries + 1
    _warn_truncated(state, len(tail))
    return []


def _warn_truncated(state: ReadState, dropped: int) -> None:
    state.truncated = True
    state.warnings.append(
        f"trace is truncated or damaged near its end; ignored the last {dropped:,} bytes "
        "and used every event that parsed before them")


def _whole_document(buf: bytes) -> None:
    """An object without a `traceEvents` key where we expected one: always raises."""
    try:
        obj = schema.ANY_DECODER.decode(buf)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc}") from None
    keys = list(obj)[:6] if isinstance(obj, dict) else []
    if isinstance(obj, dict) and "traceEvents" in obj:       # present, but null, a string, an object
        kind = {type(None): "null", str: "a string", dict: "an object", bool: "a boolean"}.get(
            type(obj["traceEvents"]), "a number")
        raise TraceFormatError(f"'traceEvents' is {kind}, not an array of events")
    if perfdoctor_doc(obj, "report"):
        # a report perfdoctor wrote (report.json, --format json): its input is what to diagnose
        raise TraceFormatError("this is a perfdoctor report, not a trace: give `perfdoctor report` the trace or "
                               "the run directory it came from, or `perfdoctor compare` two such reports")
    if perfdoctor_doc(obj, "tune"):
        raise TraceFormatError("this is the result of `perfdoctor tune`, not a trace: give `perfdoctor report` "
                               "its tune directory (the baseline's report with the gains measured), or the baseline "
                               "run with --tune FILE")
    raise TraceFormatError("JSON object has no 'traceEvents' array" + ("; keys: " + ", ".join(keys) if keys else
                                                                       " (an empty object)"))
