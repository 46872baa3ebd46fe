"""`--annotate OUT.json.gz`: a copy of the trace with perfdoctor's findings on the timeline.

Every original event is kept as it was (the JSON object is decoded and written back with only
`traceEvents` extended). The findings are added as complete ('X') events of category
`perfdoctor`, on a process of their own ("perfdoctor", sorted first) with one named thread per
kind, so Perfetto UI, chrome://tracing and TensorBoard's trace viewer show them above the
trace's own tracks:
- "verdict": one event over the analysed steps (the verdict, its confidence and summary);
- "steps": one event per step: the step's dominant share (traces[].steps[].dominant) and its
  breakdown in ms;
- "idle gaps": each kept idle gap (traces[].marked_gaps: the longest, kernel waits left out)
  labelled with its cause and the host event that ran in it;
- one thread per flag: the flag over each step of the window it was raised on (rules judge the
  window as a whole, so a flag marks all its steps).
Times come from the document (origin_us + offsets, ms rounded to 6 significant digits): within
microseconds of the trace's own events. The events are data from the trace; JSON encoding keeps
them data.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import msgspec

from perfdoctor.errors import PerfdoctorError, TraceFormatError
from perfdoctor.report.sanitize import json_bytes, json_safe
from perfdoctor.report.labels import bound_title
from perfdoctor.trace.source import GZIP_MAGIC
from perfdoctor.trace.surrogates import lone_surrogates_replaced

CATEGORY = "perfdoctor"
PID = 2 ** 31 - 2           # a process id no real process has (the next lower free one if a trace uses it)
TIDS = {"verdict": 1, "steps": 2, "idle gaps": 3}


def annotation_events(doc: dict, trace: dict, pid: int = PID) -> list[dict]:
    """The perfdoctor events for one trace of the document (traces[] entry)."""
    origin, steps = trace.get("origin_us"), trace.get("steps") or []
    if origin is None or not steps:
        return []
    _meta = (lambda name, tid, args: {"ph": "M", "name": name, "pid": pid, "args": args,
                                      **({"tid": tid} if tid is not None else {})})
    _x = (lambda name, tid, ts, dur, args: {"ph": "X", "cat": CATEGORY, "name": name, "pid": pid, "tid": tid,
                                            "ts": round(ts, 3), "dur": round(max(dur, 0.0), 3), "args": args})
    ev: list[dict] = [_meta("process_name", None, {"name": "perfdoctor"}),
                      _meta("process_sort_index", None, {"sort_index": -1000})]
    for name, tid in TIDS.items():
        ev.append(_meta("thread_name", tid, {"name": name}))
        ev.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
    at = (lambda ms: origin + ms * 1e3)
    first, last = steps[0], steps[-1]
    v = trace["verdict"]
    ev.append(_x(f"{bound_title(v['bound'], trace.get('metrics') or {})} ({v['confidence_label']} confidence)", TIDS["verdict"],
                 at(first["start_ms"]), (last["start_ms"] + last["duration_ms"] - first["start_ms"]) * 1e3,
                 {"summary": v["summary"], "confidence": v["confidence"], "rule": v.get("rule"),
                  "notes": v.get("notes") or [], "report": doc.get("tool")}))
    for s in steps:
        d = s.get("dominant") or {}
        ev.append(_x(f"step {s['label']}: {d.get('bound', '?')} {100 * (d.get('share') or 0):.0f}%", TIDS["steps"],
                     at(s["start_ms"]), s["duration_ms"] * 1e3,
                     {"dominant": d.get("bound"), "share": d.get("share"), "duration_ms": s["duration_ms"],
                      **{f"{k}_ms": x for k, x in s["breakdown_ms"].items() if x}}))
    start_of = {s["label"]: s["start_ms"] for s in steps}
    for g in trace.get("marked_gaps") or []:
        if g["step"] not in start_of:
            continue
        host = g.get("host_event") or g["host_activity"]
        ev.append(_x(f"idle {g['duration_ms']:.2f} ms: {g['kind'].replace('_', ' ')} ({host})", TIDS["idle gaps"],
                     at(start_of[g["step"]] + g["offset_ms"]), g["duration_ms"] * 1e3,
                     {"kind": g["kind"], "host_activity": g["host_activity"], "host_event": g.get("host_event"),
                      "step": g["step"]}))
    for j, f in enumerate(trace.get("flags") or [], start=len(TIDS) + 1):
        ev.append(_meta("thread_name", j, {"name": f"flag {f['id']}: {f['title']}"}))
        ev.append(_meta("thread_sort_index", j, {"sort_index": j}))
        for s in steps:
            ev.append(_x(f"{f['id']} {f['title']}", j, at(s["start_ms"]), s["duration_ms"] * 1e3,
                         {"severity": f["severity"], "summary": f["summary"], "step": s["label"]}))
    return ev


def write_annotated(doc: dict, out: str | os.PathLike) -> int:
    """Write the annotated copy of the document's trace to `out` (gzip when the name ends in .gz);
    returns the number of events added.

    The trace's bytes are not decoded: the events are spliced in right after the `[` of its
    top-level traceEvents (`_events_start`), so a trace of millions of events costs a
    decompression, a few byte scans and a compression (a 7.7M-event LBFGS trace of 2 GB: ~20 s
    and its size in memory, where decoding it alone took 67 s and several times its size). The bytes
    pass through as the report read them (lone surrogate escapes as U+FFFD) with what terminals act
    on escaped (sanitize.json_bytes). A layout the splice does not know is decoded and written
    back whole."""
    traces = doc.get("traces") or []
    if len(traces) > 1:
        raise PerfdoctorError(f"--annotate writes one trace; {doc.get('input')} holds {len(traces)}: "
                              "annotate each trace file on its own")
    t = traces[0] if traces else None
    if t is None or t.get("origin_us") is None or not os.path.isfile(t.get("path") or ""):
        raise PerfdoctorError("--annotate: no trace was recorded to annotate")
    raw = json_bytes(lone_surrogates_replaced(_raw(t["path"]))[0])
    at = _events_start(raw)
    if at is None:
        data = _decoded(raw, t["path"])
        added = annotation_events(doc, t, free_pid(data["traceEvents"]))
        data["traceEvents"] = added + data["traceEvents"]
        try:
            body = msgspec.json.encode(data)
        except UnicodeEncodeError:          # a lone surrogate in a name (an escape in the trace's JSON)
            body = msgspec.json.encode(json_safe(data))
        parts = [json_bytes(body)]
    else:
        added = annotation_events(doc, t, _free_pid_in(raw))
        items = json_bytes(msgspec.json.encode(json_safe(added))[1:-1])   # the list's items, without [ ]
        empty = raw[at:at + 64].lstrip()[:1] == b"]"
        whole = memoryview(raw)                 # slices without copies
        parts = [whole[:at], items + (b"" if empty or not added else b","), whole[at:]]
    _write(Path(out), parts)
    return len(added)


def _gzip():
    """(gzip module, compression level): isal's, ~7x zlib's speed at a similar size and ~3x at
    inflating, else the standard library's."""
    try:
        from isal import igzip
        return igzip, 2
    except ImportError:                         # pragma: no cover - isal is a dependency
        return gzip, 5


def _write(out: Path, parts: list) -> None:
    gz, level = _gzip()
    try:
        with gz.open(out, "wb", compresslevel=level) if out.name.endswith(".gz") else open(out, "wb") as f:
            for p in parts:
                f.write(p)
    except OSError as exc:
        raise PerfdoctorError(f"cannot write {out}: {exc.strerror or exc}") from None


def free_pid(events: list) -> int:
    used = {e.get("pid") for e in events if isinstance(e, dict)}
    pid = PID
    while pid in used or str(pid) in used:
        pid -= 1
    return pid


def _free_pid_in(raw: bytes) -> int:
    """free_pid on the undecoded trace: a pid whose digits appear nowhere as a pid value."""
    pid = PID
    while re.search(rb'"pid"\s*:\s*"?%d\b' % pid, raw):
        pid -= 1
    return pid


_TOKEN = re.compile(rb'\s*(?:"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+)', re.S)
PREFIX_SCAN = 1 << 20       # bytes read token by token for the traceEvents key (metadata precedes it)


def _events_start(raw: bytes) -> int | None:
    """The offset just after the `[` of the top-level traceEvents array (of the array itself for
    a bare event list), found token by token within the first PREFIX_SCAN bytes; None when it is
    not there."""
    pos, depth, prev, key = 0, 0, None, None
    end = min(len(raw), PREFIX_SCAN)
    while pos < end:
        m = _TOKEN.match(raw, pos)
        if m is None:
            return None
        tok, pos = m.group().strip(), m.end()
        if tok == b"[" and (depth == 0 or (depth == 1 and prev == b":" and key == b'"traceEvents"')):
            return pos
        if depth == 1 and tok[:1] == b'"' and prev in (b"{", b","):
            key = tok                                   # a key of the top-level object
        if tok in (b"{", b"["):
            depth += 1
        elif tok in (b"}", b"]"):
            depth -= 1
        prev = tok
    return None


def _raw(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise TraceFormatError(f"--annotate: cannot read the trace {path}: {exc.strerror or exc}") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = _gzip()[0].decompress(raw)
        except Exception as exc:                # a damaged or cut gzip stream (zlib's or isal's error)
            raise TraceFormatError(f"--annotate: cannot read the trace {path}: {exc}") from None
    return raw[3:] if raw[:3] == b"\xef\xbb\xbf" else raw     # a byte order mark: not JSON


def _decoded(raw: bytes, path: str) -> dict:
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"--annotate: cannot read the trace {path}: {exc}") from None
    if isinstance(data, list):                  # a bare event list (legal Chrome trace)
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"--annotate: {path} has no traceEvents list")
    return data
