"""The files of a run directory, read as untrusted data (issue 12).

A run directory may come from a CI artifact, an older perfdoctor or a hand edit: any field may
hold any JSON. Each file is conformed to the shape perfdoctor writes (collect/hooks.py,
collect/samplers.py, collect/launcher.py) before the diagnosis reads it: a field of the wrong
type is dropped (read as unknown), numbers must be finite, and a record without what its readers
index (a step's duration, a sample's times) is dropped and counted in a note. Fields not listed
here pass through untouched. A damaged run.json, child.json or steps.jsonl (not JSON, a line cut
short, fields missing or of the wrong type) also gets a one-line warning naming the file and the
fault, and what it leaves unknown (`read_record`, `read_steps`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from perfdoctor import inputjson

NUM, INT, STR, BOOL, ANY = "num", "int", "str", "bool", "any"
MAX_FETCH_LINES = 200_000       # loaderfetch.jsonl: a worker writes a line per 10 s of fetching
_MISSING = object()
_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")

# "!": keys its readers index (present and not None, else the object is dropped); "=": defaults.
PROC = {"!": ("pid", "role"), "pid": INT, "ppid": INT, "role": STR, "name": STR, "create_time": NUM, "cpu_percent": NUM, "state": STR,
        "num_threads": NUM, "read_bytes": NUM, "read_chars": NUM, "rss_bytes": NUM, "sched_cpu_s": NUM, "runq_wait_s": NUM}
PSI = {"!": ("some_total_us",), "some_avg10": NUM, "some_total_us": NUM}
SYSTEM = {"cpu_count": NUM, "usable_cpus": NUM, "usable_physical_cores": NUM, "cpu_quota_cores": NUM, "cpu_percent": [NUM],
          "cpu_total_percent": NUM, "cpu_usable_percent": NUM, "iowait_percent": NUM, "loadavg": [NUM],
          "psi": {"cpu": PSI, "io": PSI, "memory": PSI},
          "disk": {"!": ("read_bytes",), "read_bytes": NUM, "read_count": NUM, "busy_ms": {"*": NUM}},
          "ram_available_bytes": NUM, "ram_total_bytes": NUM}
GPU = {"!": ("index",), "=": {"util_percent": None}, "index": INT, "util_percent": NUM, "mem_util_percent": NUM, "memory_used_bytes": NUM,
       "memory_total_bytes": NUM, "sm_clock_mhz": NUM, "pids": [INT]}
SAMPLE = {"t": NUM, "unix": NUM, "trainer": PROC, "workers": [PROC], "helpers": [PROC], "system": SYSTEM,
          "gpu": [GPU], "cost_s": NUM}
SAMPLE_REQUIRED = ("t", "unix", "system")
STEP = {"step": INT, "end": NUM, "dur": NUM, "wait": NUM, "batches": NUM, "mode": STR, "profiled": BOOL,
        "perturbed": BOOL, "skipped": BOOL, "save": NUM, "log": NUM, "gc": NUM, "conv": NUM, "pre": NUM, "opt": NUM, "nograd": NUM, "istart": NUM,
        "ishut": NUM, "ifirst": NUM, "nfirst": INT, "peek": NUM, "peek_start": NUM, "peek_batches": INT,
        "peek_first": NUM, "npeek_first": INT, "peek_order": NUM}
FETCH = {"!": ("pid", "batches", "wall_s"), "pid": INT, "batches": INT, "wall_s": NUM, "runq_s": NUM, "shm_s": NUM,
         "cpu_s": NUM, "first": NUM, "last": NUM, "at": NUM, "probed": INT, "drew": INT}
RUN = {"argv": [STR], "module": STR, "exit_code": INT, "signal": INT, "wall_s": NUM, "stopped_by": STR,
       "forwarded_signals": [INT], "notes": [STR], "config": {"*": ANY}}
CHILD = {"outcome": STR, "exit_code": INT, "error": STR, "steps": INT, "mode": STR, "step_source": STR,
         "profiler": STR, "trace_enabled": BOOL, "window": {"*": ANY}, "notes": [STR], "torch_imported": BOOL,
         "torch_version": STR, "cuda_available": BOOL, "torch_threads": INT, "cpu_bf16": BOOL, "cpu_fp16": BOOL,
         "dataset_kind": STR, "timed_calls": BOOL, "convert_timed": BOOL, "optimizer_timed": BOOL, "nograd_timed": BOOL, "pre_timed": BOOL, "cpu_clock": STR,
         "first_step_timed": BOOL,
         "loaders": [{"!": ("dataset", "batches"), "dataset": STR, "module": STR, "per_sample": BOOL,
                      "batch_size": INT, "workers": INT, "default_collate": BOOL, "start": STR, "batches": INT}],
         "optimizer": {"class": STR, "momentum": NUM, "fused": BOOL, "foreach": BOOL, "closure_calls": INT,
                       "rebuilt": INT, "tensors": INT, "elements": INT, "large_elements": INT}, "worker_info_used": BOOL,
         "loader_iters": {"installed": BOOL, "loaders": INT, "peeks": INT, "relabelled": INT, "workers": INT,
                          "restarting": BOOL, "prefetch": INT},
         "param_dtypes": {"*": INT},
         "process_starts": [{"!": ("count",), "method": STR, "target": STR, "via": STR, "count": INT}],
         "sample_random": {"probed": INT, "drew": INT},       # collect/samplerandom.py
         "root_calls": {"module": STR, "calls": INT, "grad_calls": INT, "batch": INT, "batch_share": NUM,
                        "modules": INT, "passes": INT, "fresh_passes": INT, "cpu_autocast": STR,
                        "dense_embeddings": {"elements": INT, "touched": INT, "tables": INT},
                        "conv_layout": {"calls": INT, "channels_last": INT},
                        "padding": {"pad": INT, "positions": INT, "source": STR},
                        # collect/chainedcalls.py; "rnn" and "rnn_layers" are collect/rebuild.config's
                        "chained": INT, "sliced": INT, "rnn_module": STR, "rnn": {"kind": STR, "*": ANY},
                        "rnn_calls": INT, "rnn_chained": INT, "rnn_fed_sliced": INT, "rnn_fed_back": INT,
                        "rnn_layers": [{"!": ("kind",), "kind": STR, "*": ANY}],
                        "compiled_in_place": BOOL, "dynamo_graphs": INT}}
RANK = {"rank": INT, "world_size": INT, "local_rank": INT, "local_world_size": INT, "node": STR, "source": STR,
        "host": STR, "pid": INT, "exit_code": INT, "signal": INT, "wall_s": NUM, "end_unix": NUM}


def conform(value: Any, shape: Any) -> Any:
    """`value` in `shape` (a kind, a [item shape] or a {key: shape} dict, "*" for any key), or
    _MISSING. None is kept wherever a value may be unknown."""
    if value is None:
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return _MISSING
        items = (conform(v, shape[0]) for v in value)
        return [v for v in items if v is not _MISSING and v is not None]
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return _MISSING
        out = dict(shape.get("=", {}))
        for k, v in value.items():
            if k in ("!", "="):
                continue
            sub = shape.get(k, shape.get("*", _MISSING)) if isinstance(k, str) else _MISSING
            if sub is _MISSING:
                if "*" not in shape and isinstance(k, str):
                    out[k] = v            # a field we do not read: passed through
                continue
            c = conform(v, sub)
            if c is not _MISSING:
                out[k] = c
        if any(out.get(k) is None for k in shape.get("!", ())):
            return _MISSING
        if shape is PROC and out.get("sched_cpu_s") is not None and out.get("runq_wait_s") is None:
            out["sched_cpu_s"] = None      # read as a pair
        return out
    if shape == ANY:
        return value
    if shape == STR:
        return value if isinstance(value, str) else _MISSING
    if shape == BOOL:
        return value if isinstance(value, bool) else _MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _MISSING
    if shape == INT:
        return value if isinstance(value, int) and abs(value) < 2 ** 63 else _MISSING
    return value if math.isfinite(value) and abs(value) < 1e300 else _MISSING


def record(value: Any, shape: dict) -> dict:
    """A whole file's object (run.json, child.json): {} when it is not an object."""
    out = conform(value, shape)
    return out if isinstance(out, dict) else {}


# What a run file must hold, and what is unknown without it (the warnings' words).
NEEDED = {"run.json": (("argv", "exit_code"), "the command and the exit code are unknown"),
          "child.json": (("outcome",), "how the script ended is unknown")}


def read_record(path: Path, shape: dict, warnings: list[str]) -> dict:
    """run.json or child.json conformed to `shape` ({} when absent or unusable). A file that is
    there but damaged adds one warning to `warnings`; a missing file is not a fault here."""
    needed, unknown = NEEDED[path.name]
    try:
        data = inputjson.loads(inputjson.read_bytes(path))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.append(f"{path.name} could not be read ({exc.strerror or exc}): {unknown}")
        return {}
    except UnicodeDecodeError:
        warnings.append(f"{path.name} is not JSON (not UTF-8 text): {unknown}")
        return {}
    except (ValueError, RecursionError) as exc:
        warnings.append(f"{path.name} is not JSON ({getattr(exc, 'msg', None) or type(exc).__name__}): {unknown}")
        return {}
    if not isinstance(data, dict):
        warnings.append(f"{path.name} holds a JSON {type(data).__name__}, not an object: {unknown}")
        return {}
    out = record(data, shape)
    wrong = [k for k, v in data.items() if isinstance(k, str) and k in shape and v is not None and k not in out]
    missing = [k for k in needed if data.get(k) is None]
    if wrong:
        warnings.append(f"{path.name}: {', '.join(wrong)} of the wrong type, read as unknown")
    if missing:
        warnings.append(f"{path.name} lacks {', '.join(missing)}: {unknown}")
    return out


def read_steps(path: Path, warnings: list[str] | None = None) -> list[dict]:
    """steps.jsonl's step records. A line that is not JSON or not a step record is left out; with
    `warnings`, each such fault adds one line to it (a last line cut short: killed mid-write), and
    so does a steps.jsonl that is there but cannot be read (a FIFO, a directory, no permission)."""
    try:
        text = inputjson.read_text(path, errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        if warnings is not None:
            warnings.append(f"steps.jsonl cannot be read ({exc.strerror or exc}): no step records")
        return []
    lines = [x for x in text.splitlines() if x.strip()]
    parsed = _json_lines(lines)
    recs, dropped = steps(parsed)
    if warnings is not None and dropped:
        cut = bool(lines) and parsed[-1] is None and not text.endswith("\n")
        if cut:
            warnings.append("steps.jsonl: its last line is cut short (not JSON); that step is left out")
        if dropped - cut:
            warnings.append(f"steps.jsonl: {dropped - cut} line(s) are not step records (not JSON, or no duration "
                            "and data wait); left out")
    return recs


def read_fetches(path: Path) -> list[dict]:
    """loaderfetch.jsonl's lines (collect/loaderfetch.py: a worker's cumulative totals), those
    with a pid, batches and wall time of the right types; [] when the file is absent."""
    try:
        text = inputjson.read_text(path, errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines()[:MAX_FETCH_LINES]:
        c = conform(_json_line(line), FETCH)
        if isinstance(c, dict) and all(c.get(k) is not None for k in FETCH["!"]) and c["batches"] >= 0 and c["wall_s"] >= 0:
            out.append(c)
    return out


def _json_line(line: str):
    try:
        return inputjson.loads(line)
    except (ValueError, RecursionError):
        return None


def _json_lines(lines: list[str]) -> list:
    """Each line's JSON value (None where it is not JSON), as _json_line gives them. A run of hours
    writes hundreds of thousands of step lines: they are decoded as one array by msgspec (1 s
    for 400,000 lines, where json.loads line by line took 3 s), and a file that does not decode so
    is read line by line: a line that is no JSON value or more than one, NaN, a number beyond a
    float, nesting past the decoder's depth, and any run of 19 digits (an integer inputjson reads
    as a float, which msgspec would keep as an int)."""
    data = ("[" + ",".join(lines) + "]").encode("utf-8", "surrogatepass")
    values = None
    if data.translate(_DIGITS_AS_0).find(b"0" * 19) < 0:      # no run of 19 digits (0.2 s where a regex took 2)
        try:
            import msgspec
            values = msgspec.json.decode(data)
        except Exception:  # noqa: BLE001 - msgspec.DecodeError, ValidationError, RecursionError: line by line
            values = None
    if not isinstance(values, list) or len(values) != len(lines):
        return [_json_line(x) for x in lines]
    return values


def steps(recs: list) -> tuple[list[dict], int]:
    """Step records with a finite duration and data wait >= 0 (the hooks always write both);
    the rest dropped and counted."""
    out = []
    for r in recs:
        c = _step(r)
        if c is not None and all(isinstance(c.get(k), (int, float)) and c[k] >= 0 for k in ("dur", "wait")):
            out.append(c)
    return out, len(recs) - len(out)


def _step(r) -> dict | None:
    """conform(r, STEP) for STEP's flat shape, without the recursion (a step record is read per
    step of the run): a field of the wrong kind dropped, other fields passed through, None for
    what is not an object."""
    if not isinstance(r, dict):
        return None
    out = {}
    for k, v in r.items():
        kind = STEP.get(k)
        if kind is None:
            if k not in ("!", "="):
                out[k] = v
            continue
        t = type(v)
        if v is None or (t is float and kind == NUM and math.isfinite(v) and abs(v) < 1e300):
            out[k] = v
        elif t is int and (kind == NUM or (kind == INT and abs(v) < 2 ** 63)):
            out[k] = v
        elif (kind == STR and t is str) or (kind == BOOL and t is bool):
            out[k] = v
    return out


def samples(data: Any) -> tuple[dict, int]:
    """samples.json: {"samples": [...], "notes": [str]} with each sample conformed; samples
    without their times or system section dropped and counted."""
    if not isinstance(data, dict):
        return {"samples": [], "notes": []}, 0
    raw = data.get("samples") if isinstance(data.get("samples"), list) else []
    kept = []
    for s in raw:
        c = conform(s, SAMPLE)
        if isinstance(c, dict) and all(isinstance(c.get(k), (int, float, dict)) for k in SAMPLE_REQUIRED) \
                and isinstance(c.get("system"), dict):
            c.setdefault("workers", [])
            c.setdefault("helpers", [])
            if not isinstance(c.get("trainer"), dict):
                c["trainer"] = None
            kept.append(c)
    notes = [n for n in data.get("notes") or [] if isinstance(n, str)] if isinstance(data.get("notes"), list) else []
    return {**data, "samples": kept, "notes": notes}, len(raw) - len(kept)


def _metric_shape(name: str, unit: str):
    if name == "run.step_time_ci95_ms":
        return [NUM]
    return {"str": STR, "bool": BOOL, "version": ANY}.get(unit, NUM)


def report(doc: dict) -> dict:
    """A report.json (compare, gate): verdict, findings, each trace's metrics (typed by the
    metric registry; unknown metric names dropped) and the run section conformed."""
    from perfdoctor.analyze import registry

    metrics = {name: _metric_shape(name, m.unit) for name, m in registry.REGISTRY.items()}
    shape = {"schema_version": ANY, "verdict": {"bound": STR, "*": ANY}, "findings": [{"id": STR, "*": ANY}],
             "flags": [{"*": ANY}], "traces": [{"metrics": metrics, "steps": [{"duration_ms": NUM, "breakdown_ms": {"*": NUM}, "*": ANY}],
                         "*": ANY}],
             "run": {"command": STR, "outcome": STR, "exit_code": INT, "stopped_by": STR, "dir": STR, "*": ANY}}
    out = conform(doc, shape)
    out = out if isinstance(out, dict) else {}
    for t in out.get("traces") or []:
        m = t.get("metrics")
        if isinstance(m, dict):
            t["metrics"] = {k: v for k, v in m.items() if k in metrics}
            version = t["metrics"].get("trace.compute_capability")
            if version is not None and not isinstance(version, (int, float, str)):
                t["metrics"]["trace.compute_capability"] = None
    for key in ("verdict", "run"):
        if out.get(key) is None:
            out.pop(key, None)
    return out
