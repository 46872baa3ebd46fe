"""A run directory's Python stacks read back: the py-spy recording collect/stacks.py wrote
(pyspy.meta.json and one chrometrace file per process), as analyze/stacks.py reads it.

The files are untrusted (a run directory from a CI artifact, a hand edit, a hostile one): the
meta file must be an object, each process's file a plain name in the directory and a regular
file, times finite; events of other shapes are left out."""

from __future__ import annotations

import json
import math
from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.collect.stacks import META


def load_recording(stacks_dir) -> tuple[list[dict], dict] | None:
    """([{'pid', 'role', 't0_unix', 'events', ...}, ...] per recorded process, meta) of a run; None
    when there is none. A process whose file is unreadable (py-spy killed mid-write) is left out.

    The files are untrusted (a run directory from an artifact, a hand edit): meta must be an
    object, each process's file a plain name in the directory and a regular file (a FIFO blocked,
    "/dev/zero" read until the memory ran out), t0_unix a finite number, and only B/E events of
    the types py-spy writes are kept (`stack_events`)."""
    d = Path(stacks_dir)
    try:
        meta = json.loads(inputjson.read_bytes(d / META))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict):
        return None
    meta = dict(meta)
    rate = meta.get("rate_hz")
    if rate is not None and not (_finite(rate) and 0.01 <= rate <= 1e6):
        meta["rate_hz"] = None          # unknown: the attribution assumes its default
    try:
        import msgspec
        decode = msgspec.json.decode
    except ImportError:  # pragma: no cover - msgspec is a dependency
        decode = json.loads
    procs = []
    entries = meta.get("processes")
    for entry in entries if isinstance(entries, list) else []:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int) or isinstance(entry["pid"], bool):
            continue
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            continue
        try:
            events = decode(inputjson.read_bytes(d / name))
        except Exception:   # noqa: BLE001 - missing, truncated, not a regular file
            continue
        if isinstance(events, dict):
            events = events.get("traceEvents", [])
        if isinstance(events, list):
            proc = {**entry, "events": stack_events(events)}
            t0 = proc.get("t0_unix")
            if t0 is not None and not _finite(t0):
                del proc["t0_unix"]          # unknown: the attribution says so
            procs.append(proc)
    return (procs, meta) if procs else None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def stack_events(events: list) -> list[dict]:
    """py-spy's chrometrace events as analyze/stacks.py reads them: B/E events with a finite
    numeric ts; name a string, args an object with a string filename and an integer line (others
    read as unknown). Anything else is left out."""
    out = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") not in ("B", "E"):
            continue
        ts = e.get("ts", 0)
        if not _finite(ts) or abs(ts) > 1e15:
            continue
        pid, tid = e.get("pid"), e.get("tid")
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        line = a.get("line")
        out.append({**e, "ts": ts, "pid": pid if isinstance(pid, (int, str)) else None,
                    "tid": tid if isinstance(tid, (int, str)) else None,
                    "name": e.get("name") if isinstance(e.get("name"), str) else "?",
                    "args": {"filename": a.get("filename") if isinstance(a.get("filename"), str) else "",
                             "line": line if isinstance(line, int) and not isinstance(line, bool)
                             and abs(line) < 2 ** 31 else 0}})
    return out
