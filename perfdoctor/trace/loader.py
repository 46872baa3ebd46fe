"""Path -> EventTable(s): the public entry points of perfdoctor.trace."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import msgspec
import numpy as np

from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import schema
from perfdoctor.trace.reader import ReadState, iter_event_chunks
from perfdoctor.trace.table import EventTable, Interner, TraceMeta, concat_columns

TRACE_SUFFIXES = (".json", ".json.gz")
FLOW_PHASES = np.frombuffer(b"sft", np.uint8)
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
    interners = {k: Interner() for k in ("ph", "cat", "name", "pid", "tid")}
    parts, labels, n_flow, offset = [], {}, 0, 0
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived, acyclic objects: GC passes only cost time
    try:
        for events in iter_event_chunks(path, state):
            cols, chunk_labels, flows = _to_columns(events, interners)
            n_flow += flows
            for row, lab in chunk_labels.items():
                labels[row + offset] = lab
            offset += len(cols["ts"]) if cols else 0
            if cols:
                parts.append(cols)
            del events
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc}") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    cols = concat_columns(parts) or _empty_columns()
    if len(cols["ts"]) == 0 and not state.truncated and n_flow == 0:
        raise TraceFormatError("trace has no events")
    if len(cols["ts"]) == 0:
        raise TraceFormatError("no events could be parsed (file truncated or damaged at its start)")
    meta = _meta(path, state, n_flow)
    str_args = {"label": [None] * 0}
    table = EventTable(
        ph=cols["ph"], cat=cols["cat"], name=cols["name"], pid=cols["pid"], tid=cols["tid"],
        ts=cols["ts"], dur=cols["dur"], args={k: cols[k] for k in schema.NUMERIC_ARGS},
        cats=interners["cat"].values_list(), names=interners["name"].values_list(),
        pids=interners["pid"].values_list(), tids=interners["tid"].values_list(), meta=meta,
        str_args=str_args)
    table.str_args = {"labels": labels}
    return table


def _to_columns(events: list[schema.Event], interners: dict[str, Interner]):
    """Transpose a chunk of Event structs into numpy columns (C-speed via astuple + zip)."""
    n = len(events)
    if n == 0:
        return None, {}, 0
    ph, cat, name, pid, tid, ts, dur, args = zip(*map(msgspec.structs.astuple, events))
    ph_intern = interners["ph"]
    ph_idx = np.fromiter(map(ph_intern.__getitem__, ph), np.int32, n)
    ph_lut = np.array([ord(p[:1]) if p and ord(p[0]) < 256 else 63 for p in ph_intern.values_list()], np.uint8)
    ph_codes = ph_lut[ph_idx]
    keep = ~np.isin(ph_codes, FLOW_PHASES)
    n_flow = int(n - keep.sum())
    arg_cols = list(zip(*map(msgspec.structs.astuple, args)))
    cols = {
        "ph": ph_codes,
        "cat": np.fromiter(map(interners["cat"].__getitem__, cat), np.int32, n),
        "name": np.fromiter(map(interners["name"].__getitem__, name), np.int32, n),
        "pid": np.fromiter(map(interners["pid"].__getitem__, pid), np.int32, n),
        "tid": np.fromiter(map(interners["tid"].__getitem__, tid), np.int32, n),
        "ts": np.array(ts, np.float64),
        "dur": np.array(dur, np.float64),
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
    if n_flow:
        cols = {k: v[keep] for k, v in cols.items()}
        new_index = np.cumsum(keep) - 1
        label_cols = {int(new_index[r]): v for r, v in label_cols.items() if keep[r]}
    return cols, label_cols, n_flow


def _float_column(values: tuple) -> np.ndarray:
    try:
        return np.array(values, np.float64)  # None -> NaN
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
