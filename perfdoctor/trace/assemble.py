"""Parts of a load (perfdoctor.trace.columns) -> one numpy EventTable.

`join` puts consecutive parts together exactly as one pass over them all would have built
them; `build_table` wraps the result's buffers as numpy arrays (no copy) in an EventTable.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.trace import schema
from perfdoctor.trace.columns import INPUT_SHAPES, LAYOUT, STRING_COLUMNS, Interner, Part
from perfdoctor.trace.legacy import legacy_categories
from perfdoctor.trace.table import STEP_RX, EventTable, TraceMeta

DTYPES = {k: np.dtype({"B": np.uint8, "i": np.int32, "d": np.float64}[t]) for k, t in LAYOUT.items()}


def column(part: Part, key: str) -> np.ndarray:
    col = part.cols[key]
    return col if isinstance(col, np.ndarray) else np.frombuffer(col, DTYPES[key])


def empty_part(header: dict) -> Part:
    """A part with the header's fields and uninitialised columns to read the buffers into."""
    cols = {k: np.empty(header["rows"], DTYPES[k]) for k in LAYOUT}
    return Part(cols=cols, **header)


def part_in(buffer, header: dict) -> Part:
    """A part whose columns lie one after the other (LAYOUT order) at the start of `buffer`."""
    cols, at, rows = {}, 0, header["rows"]
    for key, dtype in DTYPES.items():
        cols[key] = np.frombuffer(buffer, dtype, count=rows, offset=at)
        at += rows * dtype.itemsize
    return Part(cols=cols, **header)


def codes_in(table: Interner, values: list) -> np.ndarray:
    """Each of `values` (a column's strings, in code order) as its code in `table`, new ones
    added in order: the lookup array that maps those codes onto the table's."""
    return np.fromiter(map(table.__getitem__, values), np.int32, len(values))


def kept_labels(labels: dict[int, str], keep: np.ndarray) -> dict[int, str]:
    """M-event labels by row, after the rows `keep` leaves out: each kept row moves up by the
    rows dropped before it."""
    if not labels:
        return labels
    shift = np.cumsum(~keep)
    return {int(r - shift[r]): v for r, v in labels.items() if keep[r]}


def join(parts: list[Part]) -> Part:
    """Consecutive parts as one pass over them all would have built them. Each part's string
    codes are its own: they are mapped onto one table per column, extended with each part's
    new strings in its first-seen order (the order a single pass meets them in)."""
    if len(parts) == 1:
        return parts[0]
    tables = {k: Interner() for k in STRING_COLUMNS}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in LAYOUT}
    labels: dict[int, str] = {}
    rows = 0
    for p in parts:
        for row, lab in p.labels.items():
            labels[row + rows] = lab
        rows += p.rows
        for key in LAYOUT:
            col = column(p, key)
            if key in STRING_COLUMNS:
                col = codes_in(tables[key], p.strings[key])[col]
            cols[key].append(col)
    meta: dict = {}
    for p in parts:
        meta.update(p.meta)
    return Part(cols={k: np.concatenate(v) for k, v in cols.items()}, rows=rows,
                strings={k: t.values_list() for k, t in tables.items()}, labels=labels,
                n_flow=sum(p.n_flow for p in parts), meta=meta,
                warnings=[w for p in parts for w in p.warnings],
                truncated=any(p.truncated for p in parts), ended_at=parts[-1].ended_at)


def _seconds(v) -> float | None:
    """A non-negative finite number of seconds from a header value (a string, as kineto writes
    user metadata), else None."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if 0 <= x < float("inf") else None


def _number(v) -> float | None:
    """A finite number from a header value, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:       # an integer beyond a float's range
        return None
    return x if np.isfinite(x) else None


LONGEST_US = 3600e6           # a complete event longer than this and than 10x the trace's span is damage
SPAN_FACTOR = 10.0
FAR_US = 86400e6              # a start a day beyond the bulk of the starts (plus 10x their spread) is damage


def _far(ts: np.ndarray, x: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Starts no profiler writes: more than a day plus 10x the spread of the middle half of the
    complete events' starts before their first quartile or after their third (a start of 1e308
    us among starts of 1.7e15 made a step of 1e305 ms and overflowed the statistics; so would a
    start in ns among starts in us). A trace's events lie within one recording, so no real one
    has such a start (the reference traces of ../shared/traces have none, of any phase)."""
    xs = ts[x & finite]
    if not len(xs):
        return np.zeros(len(ts), bool)
    q1, q3 = _quartiles(xs)
    with np.errstate(over="ignore", invalid="ignore"):
        if q3 - q1 > FAR_US:
            # the middle half spans more than a day: over a quarter of the starts are damage (a third
            # at 1e300 made the quartiles' spread 1e300 and kept them all). The median is still
            # one of the recording's while under half are: its bulk is the starts within a day of it.
            med = float(np.median(xs))
            bulk = xs[np.abs(xs - med) <= FAR_US]
            q1, q3 = _quartiles(bulk) if len(bulk) else (q1, q3)
        reach = FAR_US + SPAN_FACTOR * (q3 - q1)
        return finite & ((ts < q1 - reach) | (ts > q3 + reach))


def _quartiles(xs: np.ndarray) -> tuple[float, float]:
    k1, k3 = (len(xs) - 1) // 4, 3 * (len(xs) - 1) // 4     # the quartiles' ranks (np.percentile would load
    q1, q3 = np.partition(xs, [k1, k3])[[k1, k3]]           # numpy.ma: 20 ms of a cold report)
    return float(q1), float(q3)


def _impossible(cols: dict, strings: dict) -> tuple[np.ndarray | None, str | None]:
    """The events no profiler writes: complete ('X') events with a missing (NaN) or non-finite
    start, a missing, negative or non-finite duration, or one longer than an hour and 10x the
    span of all the events' starts (one step of 1e30 us made every share 0%; ProfilerSteps
    without a start all began at 0); and events of any phase but metadata with an infinite
    start or one far outside the others (_far). (mask of the rows to keep or None when all are,
    the warning)."""
    ph, ts, dur = cols["ph"], cols["ts"], cols["dur"]
    x = ph == ord("X")
    if not x.any():
        return None, None
    finite = np.isfinite(ts)
    far = _far(ts, x, finite)
    near = finite & ~far
    span = float(ts[near].max() - ts[near].min()) if near.any() else 0.0
    with np.errstate(invalid="ignore"):
        bad = x & (~finite | ~np.isfinite(dur) | (dur < 0) | ((dur > LONGEST_US) & (dur > SPAN_FACTOR * span)))
        bad |= (ph != ord("M")) & (np.isinf(ts) | far)
        bad |= _across_a_step(cols, strings, x & ~bad)
    n = int(bad.sum())
    if not n:
        return None, None
    first = int(np.flatnonzero(bad)[0])
    name = strings["name"][cols["name"][first]] if 0 <= cols["name"][first] < len(strings["name"]) else "?"
    example = f"{str(name)[:60]!r}: start {ts[first]:g} us, duration {dur[first]:g} us"
    return ~bad, (f"ignored {n:,} event(s) with a missing, negative, non-finite or impossible start or duration "
                  f"(the first: {example})")


def _across_a_step(cols: dict, strings: dict, ok: np.ndarray) -> np.ndarray:
    """Events on a step's thread that start inside one step and last past the end of the next:
    one thread's ranges nest, so no op can hold the whole of a later step it began before. An op
    of 500 s in steps of 46 ms, under the hour that makes a duration impossible by itself, had
    moved a verdict without a word; no trace of the corpus holds one. An op in the last step may
    run on past it (the profiler stopped inside an Optimizer.step: 22.9 ms past a 7 ms step), and
    device work runs on streams, other threads: neither is judged."""
    names = strings["name"]
    step_name = np.array([isinstance(n, str) and STEP_RX.match(n) is not None for n in names] + [False])
    idx = cols["name"]
    idx = np.where((idx >= 0) & (idx < len(names)), idx, len(names)).astype(np.int64)
    ts, end = cols["ts"], cols["ts"] + cols["dur"]
    step = ok & step_name[idx]
    bad = np.zeros(len(ts), bool)
    if step.sum() < 2:
        return bad
    thread = cols["pid"].astype(np.int64) * (int(cols["tid"].max(initial=0)) + 1) + cols["tid"].astype(np.int64)
    for key in set(thread[step].tolist()):          # a few step threads (np.unique loads numpy.ma)
        mine = thread == key
        rows = np.flatnonzero(step & mine)
        rows = rows[np.argsort(ts[rows], kind="stable")]
        first, last = ts[rows], end[rows]
        j = np.searchsorted(first, ts, side="right")                  # the first step begun after each event
        inside = (j >= 1) & (ts < last[np.maximum(j - 1, 0)])
        later = j < len(rows)
        bad |= ok & mine & ~step & inside & later & (end >= last[np.minimum(j, len(rows) - 1)])
    return bad


def _untimed_as_zero(cols: dict) -> None:
    """Events of other phases than X (metadata, instants, counters) without a start or duration
    (NaN) read 0 there, as they always have: they are kept, only X events need both."""
    not_x = cols["ph"] != ord("X")
    for key in ("ts", "dur"):
        absent = np.isnan(cols[key]) & not_x
        if absent.any():
            cols[key] = np.where(absent, 0.0, cols[key])


def build_table(path: str, part: Part) -> EventTable:
    cols = {k: column(part, k) for k in LAYOUT}
    keep, warning = _impossible(cols, part.strings)
    if keep is not None:
        cols = {k: c[keep] for k, c in cols.items()}
        part.labels = kept_labels(part.labels, keep)
        part.warnings = [*part.warnings, warning]
    _untimed_as_zero(cols)
    legacy = legacy_categories(path, cols, part.strings)
    if legacy:
        part.warnings = [*part.warnings, legacy]
    m = part.meta
    props = m.get("deviceProperties") or []
    dist = m.get("distributedInfo") or {}
    meta = TraceMeta(
        path=path, device_properties=[p for p in props if isinstance(p, dict)],
        distributed_info=dist if isinstance(dist, dict) else {},
        display_time_unit=m.get("displayTimeUnit"), warnings=list(dict.fromkeys(part.warnings)),
        truncated=part.truncated, n_flow_events=part.n_flow, cut_s=_seconds(m.get("perfdoctor_cut_s")),
        base_time_ns=_number(m.get("baseTimeNanoseconds")),
        input_shapes=bool(m.get(INPUT_SHAPES)) or m.get("record_shapes") in (1, True))
    s = part.strings
    return EventTable(
        ph=cols["ph"], cat=cols["cat"], name=cols["name"], pid=cols["pid"], tid=cols["tid"],
        ts=cols["ts"], dur=cols["dur"], args={k: cols[k] for k in schema.NUMERIC_ARGS + schema.DERIVED_ARGS},
        cats=s["cat"], names=s["name"], pids=s["pid"], tids=s["tid"],
        meta=meta, str_args={"labels": part.labels})
