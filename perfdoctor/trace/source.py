"""A trace file's decompressed bytes: plain JSON or gzip (isal), salvaging damaged gzip streams.

`Source(path, state).readinto(view)` fills the caller's buffer. A corrupt or cut gzip stream
becomes a clean end of data plus a warning and `state.truncated`, after everything that still
inflates has been delivered; what is salvaged depends on the file alone, never on read sizes,
so the two processes of a parallel load see the same bytes. `ReadState` collects what the
reader learns besides the events.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

from perfdoctor.errors import TraceFormatError

RECOVER_STEP = 64 << 10    # inflate step when salvaging a damaged gzip stream
GZ_INPUT_BYTES = 64 << 10  # compressed bytes the gzip reader reads at a time (see compressed_pos)
GZIP_MAGIC = b"\x1f\x8b"


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


def _recover_gz(path: str, skip: int) -> tuple[bytes, bool]:
    """After the gzip reader failed: (everything that still inflates past the first `skip` bytes,
    whether the file is whole members followed by bytes that are not gzip data).

    The gzip reader drops the output of the call that fails, so how much it delivered depends
    on how it was read. Here each member is inflated as raw deflate up to the last byte that
    decodes, so the salvaged bytes are a function of the file alone: a single pass and both
    processes of a parallel load see the same data. Each member's CRC and length are checked
    only to tell junk after whole members (nothing lost) from a damaged stream."""
    kept = bytearray()
    total = 0
    whole = True            # every member so far inflated to its end with a matching trailer

    def take(piece: bytes) -> None:
        nonlocal total
        total += len(piece)
        if total > skip:
            kept.extend(piece[max(0, len(piece) - (total - skip)):])

    with open(path, "rb") as f:
        data = b""
        members = 0
        while True:  # one gzip member per round
            while True:
                data = data.lstrip(b"\x00")  # zero padding between members, as gzip.GzipFile allows
                hl = _gzip_header_len(data)
                if hl is None:  # need more bytes
                    more = f.read(1 << 20)
                    if not more:
                        return bytes(kept), False
                    data += more
                    continue
                if hl < 0:  # not a member: trailing garbage
                    return bytes(kept), whole and members > 0
                break
            data = data[hl:]
            d = zlib.decompressobj(-15)
            crc = size = 0
            while not d.eof:
                before = d.copy()
                try:
                    piece = d.decompress(data, RECOVER_STEP)
                except zlib.error:
                    take(_clean_prefix(before, data))
                    return bytes(kept), False
                take(piece)
                crc, size = zlib.crc32(piece, crc), size + len(piece)
                data = d.unconsumed_tail
                if not data and not piece and not d.eof:
                    data = f.read(1 << 20)
                    if not data:
                        return bytes(kept), False  # the stream is cut here
            data = d.unused_data
            while len(data) < 8:  # CRC32 + ISIZE
                more = f.read(1 << 20)
                if not more:
                    return bytes(kept), False
                data += more
            whole = whole and data[:8] == crc.to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little")
            members += 1
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


class Source:
    """Decompressed bytes into the caller's buffer; a corrupt/short gzip stream becomes a clean
    EOF plus a flag and a warning (everything that still inflated is delivered first)."""

    def __init__(self, path: str, state: ReadState):
        self.path, self.state = path, state
        self.f, self.file, self.is_gz = _open(path)
        self.eof = False
        self.error: BaseException | None = None
        self.junk = False       # the error is bytes that are not gzip after whole members
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
            rest, junk = _recover_gz(self.path, self.state.bytes_read) if self.is_gz else (b"", False)
            self.close()
            if self.state.bytes_read == 0 and not rest:
                raise TraceFormatError(f"cannot decompress: {exc}") from None
            self.error = exc
            self.junk = junk
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
        if self.error is not None and self.junk:
            # every member inflated whole, its CRC checked: nothing of the trace is lost (the
            # JSON reader still says so if the document ended early)
            self.state.warnings.append("the bytes after the compressed stream's end are not gzip data: ignored")
        elif self.error is not None:
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
