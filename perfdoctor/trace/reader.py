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
"""
from __future__ import annotations

import gzip
import mmap
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import msgspec

from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import schema

CHUNK_BYTES = 256 << 10    # JSON bytes per msgspec decode: small chunks reuse warm memory
READ_BYTES = 256 << 10     # bytes that must follow a chunk for it to be cut; also the read size
MAX_CUT_TRIES = 64
BUFFER_BYTES = 4 << 20     # read buffer (grows only for events of several MiB)
KEEP_BYTES = 16            # consumed bytes kept before the next chunk (see ChunkStream._tail)
RECOVER_STEP = 64 << 10    # inflate step when salvaging a damaged gzip stream
GZ_INPUT_BYTES = 64 << 10  # compressed bytes the gzip reader reads at a time (see compressed_pos)
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
GZIP_MAGIC = b"\x1f\x8b"
TAIL_PREFIX = b'{"traceEvents":['
assert len(TAIL_PREFIX) == KEEP_BYTES


@dataclass
class ReadState:
    """What the reader learnt besides the events: metadata, warnings, truncation."""

    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    untyped_chunks: int = 0
    bytes_read: int = 0


def _open(path: str):
    """(raw reader with readinto, the underlying file, is_gz)."""
    f = open(path, "rb", buffering=0)
    try:
        is_gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not is_gz:
            return f, f, False
        # isal's raw gzip reader inflates ~1.7x faster than zlib, straight into our buffer. It and
        # gzip._GzipReader are private APIs: any surprise falls back to the public GzipFile.
        try:
            from isal import isal_zlib
            return isal_zlib._GzipReader(f, GZ_INPUT_BYTES), f, True
        except Exception:  # pragma: no cover - isal is a dependency; versions may differ
            pass
        try:
            return gzip._GzipReader(f), f, True
        except Exception:  # pragma: no cover
            return gzip.GzipFile(fileobj=f, mode="rb"), f, True
    except BaseException:
        f.close()
        raise


def _recover_gz(path: str, skip: int) -> bytes:
    """After the gzip reader failed: everything that still inflates past the first `skip` bytes.

    The gzip reader drops the output of the call that fails, so how much it delivered depends
    on how it was read. Here each member is inflated as raw deflate (no CRC verdict) up to the
    last byte that decodes, so the salvaged bytes are a function of the file alone: a single
    pass and both processes of a parallel load see the same data."""
    kept = bytearray()
    total = 0

    def take(piece: bytes) -> None:
        nonlocal total
        total += len(piece)
        if total > skip:
            kept.extend(piece[max(0, len(piece) - (total - skip)):])

    with open(path, "rb") as f:
        data = b""
        while True:  # one gzip member per round
            while True:
                data = data.lstrip(b"\x00")  # zero padding between members, as gzip.GzipFile allows
                hl = _gzip_header_len(data)
                if hl is None:  # need more bytes
                    more = f.read(1 << 20)
                    if not more:
                        return bytes(kept)
                    data += more
                    continue
                if hl < 0:  # not a member: trailing garbage
                    return bytes(kept)
                break
            data = data[hl:]
            d = zlib.decompressobj(-15)
            while not d.eof:
                before = d.copy()
                try:
                    piece = d.decompress(data, RECOVER_STEP)
                except zlib.error:
                    take(_clean_prefix(before, data))
                    return bytes(kept)
                take(piece)
                data = d.unconsumed_tail
                if not data and not piece and not d.eof:
                    data = f.read(1 << 20)
                    if not data:
                        return bytes(kept)  # the stream is cut here
            data = d.unused_data
            while len(data) < 8:  # CRC32 + ISIZE
                more = f.read(1 << 20)
                if not more:
                    return bytes(kept)
                data += more
            data = data[8:]


def _clean_prefix(d, data: bytes) -> bytes:
    """The most output `d` gives from `data` without an error. A smaller max_length stops
    earlier, so success is monotonic in it: bisect."""
    lo, hi, best = 0, RECOVER_STEP, b""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            out = d.copy().decompress(data, mid)
        except zlib.error:
            hi = mid - 1
        else:
            lo, best = mid, out
    return best


def _gzip_header_len(buf: bytes) -> int | None:
    """Length of the gzip member header at buf[0] (RFC 1952); None: incomplete; -1: not one."""
    if len(buf) < 10:
        return -1 if buf[:2] and buf[:2] != GZIP_MAGIC[:len(buf[:2])] else None
    if buf[:2] != GZIP_MAGIC or buf[2] != 8:
        return -1
    flags, pos = buf[3], 10
    if flags & 4:  # FEXTRA
        if len(buf) < pos + 2:
            return None
        pos += 2 + int.from_bytes(buf[pos:pos + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            end = buf.find(b"\x00", pos)
            if end < 0:
                return None
            pos = end + 1
    if flags & 2:  # FHCRC
        pos += 2
    return pos if pos <= len(buf) else None


class _Source:
    """Decompressed bytes into the caller's buffer; a corrupt/short gzip stream becomes a clean
    EOF plus a flag and a warning (everything that still inflated is delivered first)."""

    def __init__(self, path: str, state: ReadState):
        self.path, self.state = path, state
        self.f, self.file, self.is_gz = _open(path)
        self.eof = False
        self.error: BaseException | None = None
        self.recovered: memoryview | None = None

    def readinto(self, mv: memoryview) -> int:
        if self.recovered is not None:
            n = min(len(mv), len(self.recovered))
            if n:
                mv[:n] = self.recovered[:n]
                self.recovered = self.recovered[n:]
                self.state.bytes_read += n
                return n
            self.recovered = None
            return self._end()
        if self.eof:
            return 0
        try:
            n = self.f.readinto(mv)
        except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
            rest = _recover_gz(self.path, self.state.bytes_read) if self.is_gz else b""
            self.close()
            if self.state.bytes_read == 0 and not rest:
                raise TraceFormatError(f"cannot decompress: {exc}") from None
            self.error = exc
            if rest:
                self.recovered = memoryview(rest)
                return self.readinto(mv)
            return self._end()
        if not n:
            return self._end()
        self.state.bytes_read += n
        return n

    def compressed_pos(self) -> int:
        """Bytes of the file read so far (compressed bytes for gzip, GZ_INPUT_BYTES granular)."""
        try:
            return self.file.tell()
        except (OSError, ValueError):  # closed: all of it
            return 1 << 62

    def _end(self) -> int:
        """EOF. A stream error is reported here, not where the reader happened to hit it, so the
        warning's place among the others does not depend on read sizes."""
        self.eof = True
        self.close()
        if self.error is not None:
            self.state.truncated = True
            self.state.warnings.append(
                f"compressed stream ends early ({self.error}); using what decompressed")
            self.error = None
        return 0

    def close(self) -> None:
        for f in (self.f, self.file):
            try:
                f.close()
            except Exception:  # pragma: no cover
                pass


class ChunkStream:
    """The decompressed trace in one reusable buffer, cut into decoded event chunks.

    `open()` reads the header, `chunks()` yields event lists in file order (the body's chunks,
    then the tail with the trailer). `offset` is the absolute offset of the next chunk and
    `at_cut` says the last list yielded was a body chunk."""

    def __init__(self, path: str, state: ReadState):
        self.state = state
        self.src = _Source(path, state)
        # An anonymous map, not a bytearray: pages are touched only as data arrives (small files
        # cost a few pages) and no zero-fill pass is needed.
        self.buf = mmap.mmap(-1, BUFFER_BYTES)
        self.base = 0      # absolute offset of buf[0]
        self.end = 0       # buf[:end] holds data
        self.pos = 0       # start of the next chunk, relative to buf
        self.bare = False
        self.at_cut = False

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def position(self) -> int:
        """How far into the file we are, in the unit a parallel load balances in: compressed
        bytes read for gzip (GZ_INPUT_BYTES granular), else `offset`."""
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
        start = bytes(buf[:min(64, self.end)]).lstrip()[:1]
        if start == b"[":
            self.bare, self.pos = True, buf.find(b"[", 0, self.end) + 1
        elif start == b"{":
            m = EVENTS_KEY.search(buf, 0, self.end)
            while m is None and not self.src.eof:
                self._fill(1)
                m = EVENTS_KEY.search(self.buf, 0, self.end)
            if m is None:
                _whole_document(bytes(self.buf[:self.end]))
            _decode_header(bytes(self.buf[:m.start()]), self.state)
            self.pos = m.end()
        else:  # judged on the first 4 MiB, as always
            while not self.src.eof and self.end < 4 << 20:
                self._fill((4 << 20) - self.end)
            head = bytes(self.buf[:min(self.end, 4 << 20)])
            kind = "empty file" if not head.strip() else "not a JSON trace (expected '{' or '[')"
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
            events, cut_at = _cut_chunk(self.buf, self.pos, self.end, self.state)
            if events is None:  # no valid cut in the buffer yet: read more
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
                self._fill(1)
                m = BOUNDARY.search(self.buf, self.pos + CHUNK_BYTES, self.end)
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
                _merge_meta(doc, self.state)
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


def _cut_chunk(buf: mmap.mmap, pos: int, end: int, state: ReadState):
    m = BOUNDARY.search(buf, pos + CHUNK_BYTES, end)
    tries = 0
    while m is not None and tries < MAX_CUT_TRIES:
        try:
            return _decode_span(buf, pos, m.start() + 1, state), m.end() - 1
        except msgspec.DecodeError:
            tries += 1
            m = BOUNDARY.search(buf, m.end(), end)
    return None, pos


def _decode_events(chunk: bytes, state: ReadState) -> list[schema.Event]:
    """Decode `[chunk]`; raises msgspec.DecodeError on syntax errors (bad cut / corrupt data)."""
    return _decode_payload(b"[" + chunk + b"]", state)


def _decode_span(buf, start: int, end: int, state: ReadState) -> list[schema.Event]:
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


def _whole_document(buf: bytes) -> None:
    """An object without a `traceEvents` key where we expected one: always raises."""
    try:
        obj = schema.ANY_DECODER.decode(buf)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc}") from None
    keys = list(obj)[:6] if isinstance(obj, dict) else []
    raise TraceFormatError("JSON object has no 'traceEvents' array; keys: " + ", ".join(keys))
