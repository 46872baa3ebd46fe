"""Use a second core for one trace: a forked child decodes the second part of the file.

`plan(path, size)` decides (cheaply, before reading) whether a load forks and where the child
should take over; `Helper.start(work, into)` forks a child that runs `work(announce)` and
streams its result back through a pipe: first the absolute offset of the chunk where it started
decoding (`announce`; the parent polls for it without blocking), then, once done, a small
pickled header (protocol 5) and raw column buffers, which the parent reads straight into the
merged arrays. The parent merges only if one of its own chunk cuts lands exactly on that offset.
The child never returns into the caller's code: it leaves through `os._exit` (no atexit
handlers, no flushing of buffers inherited from the parent), and SIGINT is blocked from the
fork until the parent has registered the child, so a Ctrl-C always ends with the child reaped.

Both processes stream the file themselves (the child inflates the first part too, without
decoding it), so nothing the size of the file is held or copied, and memory per process stays
what a single pass needs.

Where to split: decoding cost follows the number of events more than bytes (kineto's CPU events
carry long strings, its GPU events are short), and for gzip files the compressed size tracks it
well: the child takes over at the first cut after SPLIT_AT_GZ of the compressed input has been
read (a little over half: the child also inflates the parent's part). On the tb_plugin samples
that is 0.62-0.70 of the JSON, where half of their decoding work lies; on the HTA traces about
half. Plain JSON files split at SPLIT_AT of their bytes.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
from typing import Callable, NamedTuple

PARALLEL_MIN_BYTES = 4 << 20     # below this the fork costs more than it saves
PARALLEL_MAX_BYTES = 256 << 20   # above this: single pass (memory bound first)
SPLIT_AT = 0.49                  # plain JSON: share of the bytes the parent decodes (the child
                                 # also reads the parent's part and sends its columns)
SPLIT_AT_GZ = 0.54               # gzip: share of the compressed bytes read before the child starts
SPLIT_MAX = 0.85                 # the child takes at least the last 15% of the JSON
JOBS_ENV = "PERFDOCTOR_JOBS"     # PERFDOCTOR_JOBS=1: never fork
PIPE_BYTES = 1 << 20
MAX_RATIO = 128                  # most a trace's JSON can plausibly compress
GZIP_MAGIC = b"\x1f\x8b"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def jobs_allowed() -> int | None:
    """The PERFDOCTOR_JOBS limit, or None when unset/unreadable."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def decompressed_size(path: str) -> int | None:
    """The JSON size: the file size, or a gzip's ISIZE field when it is plausible."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) != GZIP_MAGIC:
                return size
            if size < 20:
                return None
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
    except OSError:
        return None
    # JSON always compresses, and a trace does not compress 128x: anything else means several
    # members, a size past 4 GiB or a cut stream (ISIZE is then whatever bytes ended the file)
    return isize if size <= isize <= MAX_RATIO * size else None


def plan(path: str, size: int | None) -> Split | None:
    """Where the child should take over, or None for a single pass.
    `size` is decompressed_size(path)."""
    from perfdoctor.trace import reader

    jobs = jobs_allowed()
    if jobs is not None and jobs <= 1:
        return None
    if not (hasattr(os, "fork") and hasattr(signal, "pthread_sigmask")) or usable_cpus() < 2:
        return None
    if threading.active_count() > 1:
        return None  # fork() with other threads running is unsafe
    if size is None or not PARALLEL_MIN_BYTES < size <= PARALLEL_MAX_BYTES:
        return None
    room = reader.CHUNK_BYTES + reader.READ_BYTES  # no cut in the last `room` bytes (the tail)
    last = min(int(size * SPLIT_MAX), size - room)
    if last < reader.CHUNK_BYTES:
        return None
    try:
        with open(path, "rb") as f:
            is_gz = f.read(2) == GZIP_MAGIC
            compressed = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    return Split(at=min(int(size * SPLIT_AT), last), last=last,
                 compressed_at=int(compressed * SPLIT_AT_GZ) if is_gz else None)


class Split(NamedTuple):
    """The child starts at the first chunk cut at or after `at` (plain JSON) or after
    `compressed_at` compressed bytes have been read (gzip), but never after `last`."""

    at: int
    last: int
    compressed_at: int | None


class Helper:
    """A forked child working on `work()`; the parent side of its pipe."""

    def __init__(self, pid: int, fd: int):
        self.pid: int | None = pid
        self.fd: int | None = fd
        self.start_offset: int | None = None   # where the child started decoding (-1: gave up)

    @classmethod
    def start(cls, work: Callable[[Callable[[int], None]], tuple[dict, list]],
              into: list[Helper]) -> Helper | None:
        """Fork; the child runs `work(announce)`, where `announce(offset)` must be called once
        with the offset it starts decoding at, and returns (header, column buffers).

        The helper is appended to `into` before a Ctrl-C can interrupt this process again, so
        the caller's `finally` (which closes everything in `into`) always reaps the child."""
        r, w = os.pipe()
        try:
            import fcntl
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # fewer wake-ups while we read
        except (ImportError, AttributeError, OSError):
            pass
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # until registered
        try:
            try:
                pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                return None
            if pid == 0:  # pragma: no cover - the child's coverage is not collected
                code = 1
                try:
                    os.close(r)
                    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: just die
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    code = _serve(w, work)
                except BaseException:
                    pass
                finally:
                    os._exit(code)
            os.close(w)
            helper = cls(pid, r)
            into.append(helper)
            return helper
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending Ctrl-C is raised here

    def poll_start(self) -> int | None:
        """The child's start offset if it has said (-1: it gave up or died), else None. Does not
        block (the child skims to its start ~10x faster than we decode to it)."""
        if self.start_offset is None and self.fd is not None:
            if _readable(self.fd):
                raw = self._read(8)
                self.start_offset = int.from_bytes(raw, "little", signed=True) if raw else -1
        return self.start_offset

    def receive(self) -> dict | None:
        """The child's header once it is done (blocks); None if it failed or died."""
        size = self._read(8)
        if size is None:
            return None
        blob = self._read(int.from_bytes(size, "little"))
        if blob is None:
            return None
        try:
            header = pickle.loads(blob)
        except Exception:
            return None
        return header if isinstance(header, dict) and header.get("ok") else None

    def read_into(self, view: memoryview) -> bool:
        """Fill `view` (a byte view) from the child; False if it ended early."""
        got, n = 0, len(view)
        with open(self.fd, "rb", buffering=0, closefd=False) as f:
            while got < n:
                k = f.readinto(view[got:])
                if not k:
                    return False
                got += k
        return True

    def _read(self, n: int) -> bytes | None:
        buf = bytearray(n)
        return bytes(buf) if self.read_into(memoryview(buf)) else None

    def close(self) -> None:
        """Stop and reap the child (it has sent everything or its result is not wanted).
        SIGINT waits meanwhile: a Ctrl-C is raised after the reap, never instead of it."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            if self.pid is not None:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:  # pragma: no cover
                    pass
                try:
                    os.waitpid(self.pid, 0)
                except ChildProcessError:  # pragma: no cover - SIGCHLD ignored: reaped already
                    pass
                self.pid = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):  # no FD_SETSIZE limit
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover


def _serve(fd: int, work) -> int:  # pragma: no cover - child
    announced = []

    def announce(offset: int) -> None:
        announced.append(offset)
        _write_all(fd, memoryview(offset.to_bytes(8, "little", signed=True)))

    try:
        header, buffers = work(announce)
    except Exception as exc:
        header, buffers = {"ok": False, "why": f"{type(exc).__name__}: {exc}"}, []
    if not announced:
        announce(-1)
    blob = pickle.dumps(header, protocol=5)
    _write_all(fd, memoryview(len(blob).to_bytes(8, "little") + blob))
    for b in buffers:
        with memoryview(b) as v, v.cast("B") as view:
            _write_all(fd, view)
    return 0


def _write_all(fd: int, view: memoryview) -> None:  # pragma: no cover - child
    while len(view):
        view = view[os.write(fd, view):]
