"""Path -> EventTable(s): the public entry points of perfdoctor.trace."""

from __future__ import annotations

import gc
import os
from itertools import compress
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np

from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import parallel, schema
from perfdoctor.trace.reader import ChunkStream, ReadState
from perfdoctor.trace.table import EventTable, Interner, TraceMeta

TRACE_SUFFIXES = (".json", ".json.gz")
ROW_BYTES_MIN = 128     # JSON bytes per stored row, at least (real traces: 240-840)
MIN_CAPACITY = 4096
ARG_FIELDS = schema.Args.__struct_fields__


def find_trace_files(path: str | os.PathLike) -> list[Path]:
    """A file, or the trace files directly inside a directory (one per rank/worker), sorted."""
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"no such file or directory: {p}")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceFormatError(f"no trace files (*.json, *.json.gz) in directory {p}")
    return files


def load_traces(path: str | os.PathLike) -> list[EventTable]:
    return [load_trace(f) for f in find_trace_files(path)]


def load_trace(path: str | os.PathLike) -> EventTable:
    """Read one trace file. Raises TraceFormatError (one line) on unusable input."""
    path = str(path)
    if os.path.isdir(path):
        raise TraceFormatError(f"{path} is a directory; use load_traces")
    state = ReadState()
    size = parallel.decompressed_size(path)
    acc = _Columns(capacity=(size // ROW_BYTES_MIN) if size else 0)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived, acyclic objects: GC passes only cost time
    try:
        cols = _read(path, state, acc, size)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc}") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    interners, labels, n_flow = acc.interners, acc.labels, acc.n_flow
    cols = cols or _empty_columns()
    if len(cols["ts"]) == 0 and not state.truncated and n_flow == 0:
        raise TraceFormatError("trace has no events")
    if len(cols["ts"]) == 0:
        raise TraceFormatError("no events could be parsed (file truncated or damaged at its start)")
    meta = _meta(path, state, n_flow)
    return EventTable(
        ph=cols["ph"], cat=cols["cat"], name=cols["name"], pid=cols["pid"], tid=cols["tid"],
        ts=cols["ts"], dur=cols["dur"], args={k: cols[k] for k in schema.NUMERIC_ARGS},
        cats=interners["cat"].values_list(), names=interners["name"].values_list(),
        pids=interners["pid"].values_list(), tids=interners["tid"].values_list(), meta=meta,
        str_args={"labels": labels})


class _Columns:
    """Columns of the chunks decoded so far (file order), their string tables, M-event labels.

    Rows go straight into arrays sized from the file (ROW_BYTES_MIN JSON bytes per row or more:
    the pages past the last row are never touched), so no per-chunk parts are kept and
    concatenated; `result()` returns views of the filled rows."""

    STRING_COLUMNS = ("cat", "name", "pid", "tid")

    def __init__(self, capacity: int = 0):
        self.interners = {k: Interner() for k in ("ph", *self.STRING_COLUMNS)}
        self.capacity = max(capacity, MIN_CAPACITY)
        self.cols: dict[str, np.ndarray] | None = None
        self.labels: dict[int, str] = {}
        self.n_flow = 0
        self.rows = 0

    def add(self, events: list[schema.Event]) -> None:
        cols, chunk_labels, flows = _to_columns(events, self.interners)
        self.n_flow += flows
        for row, lab in chunk_labels.items():
            self.labels[row + self.rows] = lab
        if cols:
            start, n = self.rows, len(cols["ts"])
            self.reserve(start + n, cols)
            for k, v in cols.items():
                self.cols[k][start:start + n] = v
            self.rows += n

    def reserve(self, rows: int, like: dict[str, np.ndarray] | list[tuple[str, str]]) -> None:
        """Room for `rows` rows; `like` gives the columns (names and dtypes) on first use."""
        if self.cols is None:
            items = like.items() if isinstance(like, dict) else like
            self.capacity = max(self.capacity, rows)
            self.cols = {k: np.empty(self.capacity, getattr(v, "dtype", v)) for k, v in items}
        elif rows > self.capacity:
            self.capacity = max(rows, self.capacity * 3 // 2)
            for k, old in self.cols.items():
                new = self.cols[k] = np.empty(self.capacity, old.dtype)
                new[:self.rows] = old[:self.rows]

    def result(self) -> dict[str, np.ndarray]:
        """The filled rows ({} when there are none)."""
        if self.cols is None:
            return {}
        return {k: v[:self.rows] for k, v in self.cols.items()}


def _read(path: str, state: ReadState, acc: _Columns, size: int | None) -> dict[str, np.ndarray]:
    """Decode the whole file into `acc`/`state`; returns the columns ({} if there are none).

    When perfdoctor.trace.parallel says so, a forked child skims to a chunk cut about halfway,
    says where it is, and decodes from there to the end while this process decodes from the
    start. If one of this process's cuts lands exactly where the child started, the child has
    done what this pass would do from there on: its columns are merged and reading stops.
    Otherwise (a cut had to skip a boundary inside a nested value, or the child failed) the child
    is dropped and this process carries on alone. Either way the table is the single pass's."""
    split = parallel.plan(path, size)
    helpers: list[parallel.Helper] = []
    stream = None
    try:
        helper = None
        if split is not None:
            helper = parallel.Helper.start(lambda announce: _decode_from(path, split, size, announce), helpers)
        stream = ChunkStream(path, state)
        stream.open()
        for events in stream.chunks():
            acc.add(events)
            del events
            if helper is not None and stream.at_cut:
                start = helper.poll_start()
                if start is not None and stream.offset >= start:
                    merged = stream.offset == start and _merge_child(acc, state, helper)
                    helper.close()
                    helper = None
                    if merged:
                        break
        return acc.result()
    finally:
        if stream is not None:
            stream.close()
        for h in helpers:
            h.close()


def _decode_from(path: str, split: parallel.Split, size: int, announce):
    """Child side: skim to the split, announce the cut there, decode from it to the end."""
    state = ReadState()
    stream = ChunkStream(path, state)
    try:
        stream.open()
        if split.compressed_at is not None:
            def stop():
                return stream.offset >= split.last or stream.src.compressed_pos() >= split.compressed_at
        else:
            def stop():
                return stream.offset >= split.at
        if not stream.skip_to(stop):
            return {"ok": False, "why": "the file ends before the split"}, []
        announce(stream.offset)
        state.meta, state.warnings = {}, []   # the header's are the parent's
        acc = _Columns(capacity=max(0, size - stream.offset) // ROW_BYTES_MIN)
        for events in stream.chunks():
            acc.add(events)
            del events
    finally:
        stream.close()
    cols = acc.result()
    header = {
        "ok": True, "rows": acc.rows, "n_flow": acc.n_flow, "labels": acc.labels,
        "layout": [(k, v.dtype.str) for k, v in cols.items()],
        "strings": {k: acc.interners[k].values_list() for k in _Columns.STRING_COLUMNS},
        "meta": state.meta, "warnings": state.warnings, "truncated": state.truncated,
        "untyped_chunks": state.untyped_chunks, "bytes_read": state.bytes_read,
    }
    return header, list(cols.values())


def _merge_child(acc: _Columns, state: ReadState, helper: parallel.Helper) -> bool:
    """Append the child's rows to ours; False (and nothing changed) if the child failed."""
    hdr = helper.receive()
    if hdr is None:
        return False
    start, n = acc.rows, hdr["rows"]
    if n:
        acc.reserve(start + n, hdr["layout"])
        for key, _ in hdr["layout"]:  # the child's bytes go straight into place
            with memoryview(acc.cols[key][start:start + n]) as v, v.cast("B") as view:
                if not helper.read_into(view):
                    return False
    # Commit. The child's string codes are local: map them to ours, interning its strings in
    # its first-seen order, which is the order a single pass would have met them in.
    for key in _Columns.STRING_COLUMNS:
        values = hdr["strings"][key]
        lut = np.fromiter(map(acc.interners[key].__getitem__, values), np.int32, len(values))
        if n:
            codes = acc.cols[key][start:start + n]
            np.take(lut, codes, out=codes)
    for row, lab in hdr["labels"].items():
        acc.labels[row + start] = lab
    acc.rows += n
    acc.n_flow += hdr["n_flow"]
    state.meta.update(hdr["meta"])
    state.warnings.extend(hdr["warnings"])
    state.truncated = state.truncated or hdr["truncated"]
    state.untyped_chunks += hdr["untyped_chunks"]
    state.bytes_read = hdr["bytes_read"]
    return True


def _to_columns(events: list[schema.Event], interners: dict[str, Interner]):
    """Transpose a chunk of Event structs into numpy columns (C-speed via astuple + zip).

    Flow events (ph s/f/t: a third of a kineto trace's events) are dropped first, by a C-level
    filter on their phase, so no work is spent transposing them."""
    n_all = len(events)
    kept = list(map(_KEPT_PHASE.__getitem__, map(_PH, events)))
    if not all(kept):
        events = list(compress(events, kept))
    n = len(events)
    if n == 0:
        return None, {}, n_all
    ph, cat, name, pid, tid, ts, dur, args = zip(*map(msgspec.structs.astuple, events))
    ph_intern = interners["ph"]
    ph_idx = np.fromiter(map(ph_intern.__getitem__, ph), np.int32, n)
    ph_lut = np.array([ord(p[:1]) if p and ord(p[0]) < 256 else 63 for p in ph_intern.values_list()], np.uint8)
    ph_codes = ph_lut[ph_idx]
    arg_cols = list(zip(*map(msgspec.structs.astuple, args)))
    cols = {
        "ph": ph_codes,
        "cat": np.fromiter(map(interners["cat"].__getitem__, cat), np.int32, n),
        "name": np.fromiter(map(interners["name"].__getitem__, name), np.int32, n),
        "pid": np.fromiter(map(interners["pid"].__getitem__, pid), np.int32, n),
        "tid": np.fromiter(map(interners["tid"].__getitem__, tid), np.int32, n),
        "ts": np.fromiter(ts, np.float64, n),
        "dur": np.fromiter(dur, np.float64, n),
    }
    for i, f in enumerate(ARG_FIELDS):
        if f in schema.NUMERIC_ARGS:
            cols[f] = _float_column(arg_cols[i])
    label_cols = {}
    m_rows = np.flatnonzero(ph_codes == ord("M"))
    if len(m_rows):
        li, lsi = ARG_FIELDS.index("label"), ARG_FIELDS.index("labels")
        for r in m_rows:
            lab = arg_cols[lsi][r] or arg_cols[li][r]
            if lab is not None:
                label_cols[int(r)] = lab
    return cols, label_cols, n_all - n


class _KeptPhase(dict):
    """phase string -> False for flow events (s, f, t), True otherwise; filled on first sight."""

    def __missing__(self, ph):
        kept = self[ph] = not (isinstance(ph, str) and ph[:1] in ("s", "f", "t"))
        return kept


_KEPT_PHASE = _KeptPhase()
_PH = attrgetter("ph")


def _float_column(values: tuple) -> np.ndarray:
    try:
        return np.fromiter(values, np.float64, len(values))  # None -> NaN; as np.array, faster
    except (TypeError, ValueError):          # a string among numbers (e.g. ROCm "stream")
        return np.array([v if isinstance(v, (int, float)) else np.nan for v in values], np.float64)


def _empty_columns() -> dict[str, np.ndarray]:
    cols = {k: np.zeros(0, np.int32) for k in ("cat", "name", "pid", "tid")}
    cols.update(ph=np.zeros(0, np.uint8), ts=np.zeros(0), dur=np.zeros(0))
    cols.update({k: np.zeros(0) for k in schema.NUMERIC_ARGS})
    return cols


def _meta(path: str, state: ReadState, n_flow: int) -> TraceMeta:
    m = state.meta
    props = m.get("deviceProperties") or []
    dist = m.get("distributedInfo") or {}
    warnings = list(dict.fromkeys(state.warnings))
    return TraceMeta(
        path=path,
        device_properties=[p for p in props if isinstance(p, dict)],
        distributed_info=dist if isinstance(dist, dict) else {},
        display_time_unit=m.get("displayTimeUnit"),
        warnings=warnings, truncated=state.truncated, n_flow_events=n_flow)
