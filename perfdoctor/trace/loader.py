"""Path -> EventTable(s): the public entry points of perfdoctor.trace.

`load_trace(path)` reads one file. `PendingLoad(path).start()` starts the same load and returns
at once: on a big enough trace a helper process (perfdoctor.trace.parallel) begins decoding from
the start while the caller imports and prepares the rest; `PendingLoad.finish()` then decodes the
other part here and joins both (perfdoctor.trace.columns). The caller keeps the PendingLoad where
its cleanup (`close()`) will find it *before* calling `start()`: a Ctrl-C that lands just after
the fork then still reaps the helper. Importing this module does not import numpy, so the helper
can be started first thing.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import msgspec

from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import parallel
from perfdoctor.trace.reader import ChunkStream, ReadState
from perfdoctor.trace.source import GZIP_MAGIC

TRACE_SUFFIXES = (".json", ".json.gz")


def find_trace_files(path: str | os.PathLike, skipped: list[str] | None = None) -> list[Path]:
    """A file, or the trace files directly inside a directory (one per rank/worker), sorted.
    PyTorch execution traces (ExecutionTraceObserver's JSON) are not profiler traces: one given
    alone is an error; in a directory each is left out, with a warning appended to `skipped`."""
    p = checked_input_path(path)
    if p.is_file():
        if is_execution_trace(p):
            raise TraceFormatError(f"{p} is a PyTorch execution trace (ExecutionTraceObserver), not a "
                                   "torch.profiler trace: give the Kineto trace recorded with it")
        return [p]
    files = []
    try:
        entries = sorted(f for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES))
    except OSError as exc:
        raise TraceFormatError(f"cannot list directory {p}: {exc.strerror or exc}") from None
    for f in entries:
        why = _not_readable(f)
        if why:
            if skipped is not None:
                skipped.append(f"skipped {f.name}: {why}")
            continue
        if is_execution_trace(f):
            if skipped is not None:
                skipped.append(f"skipped {f.name}: a PyTorch execution trace (ExecutionTraceObserver), "
                               "not a torch.profiler trace")
        else:
            files.append(f)
    if not files:
        runs = _run_dirs_in(p)
        if runs:        # perfdoctor-runs/, or a folder of runs: the user meant one of them
            named = ", ".join(r.name for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
            raise TraceFormatError(f"{p} holds {len(runs)} perfdoctor run director{'y' if len(runs) == 1 else 'ies'} "
                                   f"({named}), not traces: give one of them")
        raise TraceFormatError(f"no trace files (*.json, *.json.gz) in directory {p}")
    return files


def _run_dirs_in(p: Path) -> list[Path]:
    """The subdirectories of `p` that are perfdoctor run directories (a run.json or steps.jsonl)."""
    try:
        subs = sorted(d for d in p.iterdir() if d.is_dir())
    except OSError:
        return []
    return [d for d in subs if (d / "run.json").is_file() or (d / "steps.jsonl").is_file()]


def checked_input_path(path: str | os.PathLike) -> Path:
    """`path` as a Path when it names a regular file or a directory (links followed); else
    TraceFormatError, one line that says what it is: missing, a dangling or looping symbolic
    link, or a FIFO, socket or device (refused, never opened: a FIFO would block). Every command
    that reads an input path (report, compare, gate) checks it here."""
    p = Path(path)
    if not p.exists():
        why = "a dangling or looping symbolic link" if p.is_symlink() else "no such file or directory"
        raise TraceFormatError(f"{why}: {p}")
    if not p.is_file() and not p.is_dir():
        raise TraceFormatError(f"{p} is not a regular file or a directory (a FIFO, socket or device): refused")
    return p


ET_HEAD_BYTES = 4096


def _not_readable(f: Path) -> str | None:
    """Why a directory entry named like a trace is not loaded (None: it is a readable file).
    FIFOs and devices are never opened (a FIFO would block), links are followed at most as the
    OS allows (a loop is reported, not followed)."""
    import stat

    try:
        st = f.stat()
    except OSError as exc:
        return "a dangling symbolic link" if f.is_symlink() and exc.errno == 2 else \
            f"cannot stat it ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
    if not os.access(f, os.R_OK):
        return "not readable (permission denied)"
    return None


def plain_head(data: bytes, n: int) -> bytes:
    """The first `n` bytes of a file's content from its first bytes `data`: decompressed when it
    is gzip (raises zlib.error when that gzip is damaged), as they are otherwise."""
    import zlib

    return zlib.decompressobj(31).decompress(data, n) if data[:2] == GZIP_MAGIC else data[:n]


def is_execution_trace(path: str | os.PathLike) -> bool:
    """Does the file start as an execution trace does ({"schema": ..., ..., "nodes": [...)?
    Only its first few KB are read (decompressed); unreadable files are left to the loader."""
    import re
    import zlib

    try:
        with open(path, "rb") as f:
            head = f.read(ET_HEAD_BYTES)
            if head[:2] == GZIP_MAGIC:
                head += f.read(16 * ET_HEAD_BYTES)
            head = plain_head(head, ET_HEAD_BYTES)
    except (OSError, zlib.error):
        return False
    head = head.decode("utf-8", "replace")
    return (re.match(r'\s*\{\s*"schema"\s*:', head) is not None and '"nodes"' in head
            and '"traceEvents"' not in head)


def run_trace_files(trace_dir: str | os.PathLike, skipped: list[str] | None = None) -> list[Path]:
    """The traces of a `perfdoctor run` directory's trace/ folder: each .pt.trace.json.gz, or its
    plain .pt.trace.json while (or if) it was never compressed; hidden partial files are not traces.
    An entry named so that is no readable regular file (a FIFO would block the load, a looping
    link) is left out, with a line in `skipped`, as find_trace_files does."""
    d = Path(trace_dir)
    if not d.is_dir():
        return []
    try:
        names = {p.name: p for p in d.iterdir() if not p.name.startswith(".")}
    except OSError:
        return []
    out = []
    for n, p in sorted(names.items()):
        if not (n.endswith(".pt.trace.json.gz") or (n.endswith(".pt.trace.json") and n + ".gz" not in names)):
            continue
        why = _not_readable(p)
        if why:
            if skipped is not None:
                skipped.append(f"skipped {d.name}/{n}: {why}")
            continue
        out.append(p)
    return out


def load_traces(path: str | os.PathLike):
    return [load_trace(f) for f in find_trace_files(path)]


def load_trace(path: str | os.PathLike):
    """Read one trace file into an EventTable. Raises TraceFormatError (one line) on unusable input."""
    pending = PendingLoad(path)
    try:
        return pending.start().finish()
    finally:
        pending.close()   # a Ctrl-C between the fork and finish()'s own cleanup still reaps


class PendingLoad:
    """One trace file's load: `start()` may fork a helper, `finish()` returns the table, `close()`
    (idempotent) abandons the load and reaps the helper."""

    def __init__(self, path: str | os.PathLike):
        path = str(path)
        if os.path.isdir(path):
            raise TraceFormatError(f"{path} is a directory; use load_traces")
        self.path = path
        self.size = parallel.decompressed_size(path)
        self.total = self.size   # the file's length in parallel.work_total's unit
        self.helpers: list[parallel.Helper] = []
        self.started = False

    def start(self) -> PendingLoad:
        """Let a helper begin decoding from the start, if the file is big enough and a core is
        free. The helper is in `self.helpers` before a Ctrl-C can interrupt again."""
        if not self.started:
            self.started = True
            if parallel.can_fork(self.size):
                self.total = parallel.work_total(self.path, self.size)
                parallel.Helper.start(lambda channel: _decode_head_in_child(self.path, channel), self.helpers,
                                      transfer_bytes=self.size)   # columns take ~113 bytes per row of >= 128 JSON bytes
        return self

    def finish(self):
        """The EventTable (blocks until the helper, if any, is done)."""
        from perfdoctor.trace import assemble

        gc_was_enabled = gc.isenabled()
        gc.disable()  # millions of short-lived, acyclic objects: GC passes only cost time
        try:
            part = self._read()
        except OSError as exc:
            raise TraceFormatError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"not valid JSON: {exc}") from None
        finally:
            self.close()
            if gc_was_enabled:
                gc.enable()
        if part.rows == 0 and not part.truncated and part.n_flow == 0:
            raise TraceFormatError("trace has no events")
        if part.rows == 0:
            raise TraceFormatError("no events could be parsed (file truncated or damaged at its start)")
        return assemble.build_table(self.path, part)

    def close(self) -> None:
        for h in self.helpers:
            h.close()
        self.helpers.clear()

    def _read(self):
        """The whole file as one columns.Part.

        With a helper: take over from the cut parallel.choose_cut picks and decode from there;
        while the helper still has a lot left when we are done, take over again from a cut
        before the last one (the head of a trace often costs more per byte than its tail, so
        no fixed point balances both). The helper stops at the last cut it has not passed; the
        parts that follow on from where it stopped are joined to its head, the others dropped.
        If the helper failed, its head is decoded here."""
        from perfdoctor.trace import assemble, columns

        helper = self.helpers[0] if self.helpers else None
        if helper is None:
            return decode_head(self.path)
        pieces: dict[int, columns.Part] = {}   # cut offset -> the part decoded here from it
        bound, limit = None, self.total
        while (x := parallel.choose_cut(limit, helper.progress())) is not None:
            taken = self._take_over(x, bound, helper)
            if taken is None:
                break
            cut, limit, pieces[cut] = taken
            bound = cut
        head = _receive(helper) or decode_head(self.path, stop=bound)
        chain = [head]
        while chain[-1].ended_at is not None:
            chain.append(pieces[chain[-1].ended_at])
        return assemble.join(chain)

    def _take_over(self, x: int, bound: int | None, helper: parallel.Helper):
        """Skim to the first cut at or after position x (before `bound`), ask the helper to stop
        there, and decode from it to `bound` (or the end). (cut offset, cut position, Part) or
        None if there is no such cut or the helper cannot be told."""
        from perfdoctor.trace import columns

        state = ReadState()
        stream = ChunkStream(self.path, state)
        try:
            stream.open()
            if not stream.skip_to(lambda: stream.position() >= x):
                return None
            cut, position = stream.offset, stream.position()
            if (bound is not None and cut >= bound) or not helper.request_stop(cut):
                return None
            state.meta, state.warnings = {}, []   # the header's: the head has them
            acc = columns.Columns()
            ended_at = _decode(stream, acc, stop=bound)
            return cut, position, acc.part(state, ended_at)
        finally:
            stream.close()


def decode_head(path: str, stop: int | None = None, channel=None):
    """Decode from the start to the cut at offset `stop` (or the channel's stop request), or to
    the end when there is none or this pass's cuts miss it. Returns a columns.Part."""
    from perfdoctor.trace import columns

    state = ReadState()
    acc = columns.Columns()
    stream = ChunkStream(path, state)
    try:
        stream.open()
        ended_at = _decode(stream, acc, stop, channel)
    finally:
        stream.close()
    return acc.part(state, ended_at)


def _decode(stream: ChunkStream, acc, stop: int | None = None, channel=None) -> int | None:
    """Decode chunks into `acc` until a cut lands exactly on `stop` (returns it) or the end
    (None; also when the cuts pass `stop` without landing on it). With a channel (the helper),
    report progress at every cut and take the stop from the parent's latest request."""
    for events in stream.chunks():
        acc.add(events)
        del events
        if not stream.at_cut:
            continue
        offset = stream.offset
        if channel is not None:
            channel.progress(stream.position())
            stop = channel.stop_for(offset)
        if stop is not None and offset >= stop:
            if offset == stop:
                return offset
            stop, channel = None, None   # past it: read to the end
    return None


def _decode_head_in_child(path: str, channel):  # pragma: no cover - runs in the helper
    gc.disable()  # as in finish(); the helper leaves through os._exit, nothing to collect
    part = decode_head(path, channel=channel)
    return {"ok": True, **part.header()}, part.buffers()


def _receive(helper: parallel.Helper):
    """The helper's Part, or None if it failed or died."""
    from perfdoctor.trace import assemble

    hdr = helper.receive()
    if hdr is None:
        return None
    hdr.pop("ok")
    if hdr.pop("shared"):   # the columns are in the shared map: use them in place
        return assemble.part_in(helper.transfer, hdr)
    part = assemble.empty_part(hdr)
    for col in part.buffers():  # the child's bytes go straight into place
        with memoryview(col) as v, v.cast("B") as view:
            if len(view) and not helper.read_into(view):
                return None
    return part
