"""Use a second core for one trace: a forked helper decodes the head while we get ready.

`Helper.start(work, into)` forks a child that runs `work(channel)` and hands its result back:
a small pickled header (protocol 5) through a pipe, and the column buffers through a shared
anonymous map reserved before the fork, which the parent reads in place (through the pipe
too, if they do not fit). The child starts at the beginning of the file as soon as the load is
started, which is early: `perfdoctor report` starts it before importing numpy, the analysis and
the rules, so the child decodes while this process imports. Through the channel the child
publishes how far it has got (`progress`, a shared word) and learns where to stop
(`stop_for`: 8-byte requests on a second pipe that it polls after each chunk).

When this process is ready, it looks at the child's progress `p` and picks the point where
both finish together (`choose_cut`): the child still decodes [p, x) while this process skims
[0, x) (inflating and finding event boundaries without decoding, SKIM_SPEEDUP times faster)
and decodes [x, end). Positions are compressed bytes for gzip files (`work_total`). It skims
to the first cut after x, sends that exact offset, and decodes from there. The child stops exactly there when its own cuts land on it (they do unless a cut
had to skip a boundary inside a nested value); if it is already past it, or its cuts never hit
it, the child decodes to the end and this process's part is dropped. Either way the table is
the single pass's.

The child never returns into the caller's code: it leaves through `os._exit` (no atexit
handlers, no flushing of buffers inherited from the parent), and a Ctrl-C waits from before
the fork until the parent has registered the child (and, in `close`, until the child is reaped),
so it always ends with the child reaped (`_sigint_deferred`).
Both processes stream the file themselves, so nothing the size of the file is held or copied.

This module imports neither numpy nor the column code: the child imports what it needs.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import struct
import sys
import threading
from contextlib import contextmanager
from typing import Callable

PARALLEL_MIN_BYTES = 4 << 20     # below this the fork costs more than it saves
PARALLEL_MAX_BYTES = 256 << 20   # above this: single pass (memory bound first)
SKIM_SPEEDUP = 12                # skimming vs decoding the same bytes (measured 12-40x)
MIN_PART_BYTES = 64 << 10        # a split leaves each process at least this much (work_total unit)
DONE = 1 << 62                   # progress value: the child has decoded to the end
JOBS_ENV = "PERFDOCTOR_JOBS"     # PERFDOCTOR_JOBS=1: never fork
PIPE_BYTES = 1 << 20
MAX_RATIO = 128                  # most a trace's JSON can plausibly compress
GZIP_MAGIC = b"\x1f\x8b"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_said_bad_jobs = False


def jobs_allowed() -> int | None:
    """The PERFDOCTOR_JOBS limit, or None when unset/unreadable (said once on stderr: a typo had
    passed silently, the user thinking the load ran in one process)."""
    global _said_bad_jobs
    raw = os.environ.get(JOBS_ENV, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        if not _said_bad_jobs:
            _said_bad_jobs = True
            print(f"perfdoctor: warning: {JOBS_ENV}={ascii(raw[:40])} is not a whole number: ignored",
                  file=sys.stderr)
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


def work_total(path: str, size: int) -> int:
    """The file's length in the unit progress and cuts are measured in: its compressed size for
    gzip, whose compressed bytes track decoding work (kineto's CPU events carry long strings
    that compress well; its GPU events are short: per JSON byte the head of a trace can cost
    1.4x what its tail does), else the JSON size."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size if f.read(2) == GZIP_MAGIC else size
    except OSError:
        return size


@contextmanager
def _sigint_deferred():
    """A Ctrl-C waits until the block is done, then is raised as it would have been.

    Blocking SIGINT in this thread is not enough: the kernel may hand the signal to another
    thread (numpy's BLAS threads leave it unblocked), and CPython then runs the handler in the
    main thread at its next bytecode check, mask or not. So the main thread's handler is swapped
    for one that only records the signal; the original one runs after the block. Yields the
    signal mask from before (a forked child restores it) and the handler it replaced."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    caught: list = []
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield mask, old
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)   # one pending on this thread arrives here
        if caught:
            if callable(old):
                old(signal.SIGINT, caught[0])              # default: raises KeyboardInterrupt
            elif old == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


def can_fork(size: int | None) -> bool:
    """Whether a load of a trace of `size` JSON bytes (decompressed_size) may use a helper."""
    jobs = jobs_allowed()
    if jobs is not None and jobs <= 1:
        return False
    if not (hasattr(os, "fork") and hasattr(signal, "pthread_sigmask")) or usable_cpus() < 2:
        return False
    if threading.active_count() > 1:
        return False  # fork() with other threads running is unsafe
    return size is not None and PARALLEL_MIN_BYTES < size <= PARALLEL_MAX_BYTES


def choose_cut(total: int, progress: int) -> int | None:
    """Where this process should take over (in work_total's unit), given that the child has got
    `progress` of the way through `total`; None when too little is left to share (the child
    finishes alone)."""
    if not 0 <= progress < total:
        return None
    x = int((total + progress) / (2 - 1 / SKIM_SPEEDUP))
    if x - progress < MIN_PART_BYTES or total - x < max(MIN_PART_BYTES, x / SKIM_SPEEDUP):
        return None   # too little to share, or less to decode than to skim: not worth it
    return x


class Channel:
    """The child's side of the coordination: publish progress, learn where to stop."""

    def __init__(self, shared: mmap.mmap, stop_fd: int, transfer: mmap.mmap | None):
        self.shared, self.stop_fd, self.transfer = shared, stop_fd, transfer
        self.stop: int | None = None
        self.open = True

    def progress(self, position: int) -> None:
        struct.pack_into("<q", self.shared, 0, position)

    def stop_for(self, offset: int) -> int | None:
        """Where to stop, now that we are at `offset` (never blocks). Each request the parent
        sends is earlier in the file than the one before; a request we are already past is
        ignored, so the stop is always the latest one still ahead (or None)."""
        while self.open and _readable(self.stop_fd):
            raw = os.read(self.stop_fd, 8)
            if len(raw) != 8:   # the parent has closed its end
                self.open = False
                break
            request = int.from_bytes(raw, "little", signed=True)
            if request >= offset:
                self.stop = request
        return self.stop


class Helper:
    """A forked child working on `work()`; the parent side of its pipe."""

    def __init__(self, pid: int, fd: int, stop_fd: int, shared: mmap.mmap, transfer: mmap.mmap | None):
        self.pid: int | None = pid
        self.fd: int | None = fd            # results, child -> parent
        self.stop_fd: int | None = stop_fd  # where to stop, parent -> child
        self.shared = shared                # the child's progress
        self.transfer = transfer            # the child's column buffers, when they fit

    @classmethod
    def start(cls, work: Callable[[Channel], tuple[dict, list]], into: list[Helper],
              transfer_bytes: int = 0) -> Helper | None:
        """Fork; the child runs `work(channel)`, which returns (header, column buffers).
        `transfer_bytes` of shared memory are reserved for the buffers (pages that are never
        written cost nothing); header["shared"] then says whether they went that way.

        The helper is appended to `into` before a Ctrl-C can interrupt this process again, so
        the caller's `finally` (which closes everything in `into`) always reaps the child."""
        shared = mmap.mmap(-1, 8)  # anonymous and MAP_SHARED: the child's writes are seen here
        transfer = mmap.mmap(-1, transfer_bytes) if transfer_bytes > 0 else None
        r, w = os.pipe()
        stop_r, stop_w = os.pipe()
        try:
            import fcntl
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # fewer wake-ups while we read
        except (ImportError, AttributeError, OSError):
            pass
        with _sigint_deferred() as (mask, handler):   # until registered
            try:
                pid = os.fork()
            except OSError:
                for fd in (r, w, stop_r, stop_w):
                    os.close(fd)
                shared.close()
                if transfer is not None:
                    transfer.close()
                return None
            if pid == 0:  # pragma: no cover - the child's coverage is not collected
                code = 1
                try:
                    os.close(r)
                    os.close(stop_w)
                    if handler is None or handler is signal.default_int_handler:
                        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: just die
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    code = _serve(w, work, Channel(shared, stop_r, transfer))
                except BaseException:
                    pass
                finally:
                    os._exit(code)
            os.close(w)
            os.close(stop_r)
            helper = cls(pid, r, stop_w, shared, transfer)
            into.append(helper)
        return helper                                  # a Ctrl-C that waited was raised above

    def progress(self) -> int:
        """How far the child has decoded (ChunkStream.position() at its last cut; DONE at the end)."""
        return struct.unpack_from("<q", self.shared, 0)[0]

    def request_stop(self, offset: int) -> bool:
        """Ask the child to stop at the cut at `offset`; False if it cannot be told (gone)."""
        if self.stop_fd is None:
            return False
        try:
            return os.write(self.stop_fd, offset.to_bytes(8, "little", signed=True)) == 8
        except OSError:
            return False

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
        with _sigint_deferred():
            for attr in ("fd", "stop_fd"):
                fd = getattr(self, attr)
                if fd is not None:
                    os.close(fd)
                    setattr(self, attr, None)
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
            self.shared.close()
            if self.transfer is not None:
                try:
                    self.transfer.close()
                except BufferError:   # the table still uses the child's columns in place
                    pass


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):  # no FD_SETSIZE limit
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover


def _serve(fd: int, work, channel: Channel) -> int:  # pragma: no cover - child
    try:
        header, buffers = work(channel)
    except Exception as exc:
        header, buffers = {"ok": False, "why": f"{type(exc).__name__}: {exc}"}, []
    channel.progress(DONE)
    views = [memoryview(b).cast("B") for b in buffers]
    room = channel.transfer
    header["shared"] = room is not None and sum(len(v) for v in views) <= len(room)
    if header["shared"]:
        at = 0
        for v in views:
            room[at:at + len(v)] = v
            at += len(v)
    blob = pickle.dumps(header, protocol=5)
    _write_all(fd, memoryview(len(blob).to_bytes(8, "little") + blob))
    if not header["shared"]:
        for view in views:
            _write_all(fd, view)
    return 0


def _write_all(fd: int, view: memoryview) -> None:  # pragma: no cover - child
    while len(view):
        view = view[os.write(fd, view):]
