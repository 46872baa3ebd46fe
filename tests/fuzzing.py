"""Generators and the outcome check of the fuzzing suite (tests/test_fuzz.py, bench/fuzz_long.py).

Every input perfdoctor reads (traces, run directories, report.json files, rule files) is
generated at random, structured (wrong types in every field, NaN/Infinity, huge, negative and
zero numbers, missing fields, duplicate keys, deep nesting, floods) or as byte mutations and
truncations of small real traces (tests/tracegen.py). The CLI runs in-process on each one;
`outcome` accepts exactly what README promises: a report (exit 0; gate 0/1/3) or one line on
stderr and exit 2. Exit 70 (a perfdoctor bug), a traceback, another exception or a run longer
than HANG_S fails.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import signal
from pathlib import Path

from hypothesis import strategies as st

import tracegen as tg

HANG_S = 60      # generous: the CI machine may be loaded; a real hang never ends

# --- JSON text with what json.dumps cannot write: NaN/Infinity tokens, duplicate keys, deep nests

NUMBERS = st.one_of(
    st.integers(-3, 3), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.0, 1e308, -1e308, 1e-320, 2 ** 63, -(2 ** 63) - 1, 10 ** 30, 1.7e15, 1.7e18]))
STRINGS = st.one_of(st.text(max_size=12), st.sampled_from(
    ["", "ProfilerStep#1", "ProfilerStep#x", "ProfilerStep#", "cpu_op", "kernel", "cuda_runtime", "gpu_memcpy",
     "user_annotation", "X", "M", "i", "B", "E", "f", "s", "cudaLaunchKernel", "cudaStreamSynchronize",
     "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "Optimizer.step#SGD.step",
     "Memcpy HtoD (Pageable -> Device)", "[memory]", "thread_name", "nccl:all_reduce", "\x1b]52;c;eA==\x07",
     "1.5", "nan", "null"]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
ANY_JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(STRINGS, inner, max_size=4)), max_leaves=12)


def dumps(v) -> str:
    """JSON text of v; floats as Python writes them (NaN, Infinity: not JSON, traces have them)."""
    if isinstance(v, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(x)}" for k, x in v) + "}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    return json.dumps(v, allow_nan=True)


class Pairs(list):
    """A JSON object as (key, value) pairs: keys may repeat."""


EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp", "flow_in", "flow_out"]
ARG_KEYS = ["External id", "correlation", "device", "stream", "Bytes", "Total Reserved", "Total Allocated",
            "name", "labels", "Device Type", "In msg nelems", "dtype", "Group size", "grid", "block",
            "sort_index", "Ev Idx", "Python parent id"]


def _field(key: str):
    good = {
        "ph": st.sampled_from(["X", "M", "i", "f", "s", "B", "E", "C"]),
        "cat": st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "gpu_memcpy", "gpu_memset", "user_annotation",
                                "python_function", "cuda_driver", "Operator", "Runtime", "Kernel", "Memcpy",
                                "gpu_user_annotation", "Trace", "ac2g"]),
        "name": STRINGS, "pid": st.one_of(st.integers(-2, 5), STRINGS), "tid": st.one_of(st.integers(-2, 5), STRINGS),
        "ts": st.one_of(st.floats(1.7e15, 1.7e15 + 1e6), NUMBERS), "dur": st.one_of(st.floats(0, 1e4), NUMBERS),
        "args": st.one_of(st.dictionaries(st.sampled_from(ARG_KEYS), SCALARS, max_size=5), ANY_JSON),
    }.get(key, SCALARS)
    return st.one_of(good, good, ANY_JSON)        # mostly well-typed, often not


@st.composite
def events(draw):
    keys = draw(st.lists(st.sampled_from(EVENT_KEYS), max_size=9))
    keys = draw(st.sampled_from([keys, ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"] + keys]))
    return Pairs((k, draw(_field(k))) for k in keys)


@st.composite
def trace_texts(draw) -> bytes:
    """A trace file's bytes: structured events (some flooded, some zero-length), random metadata,
    a bare list, or arbitrary JSON; sometimes non-UTF-8 or deeply nested."""
    evs = draw(st.lists(events(), max_size=25))
    if draw(st.booleans()) and evs:                      # a flood of identical (zero-duration) events
        evs = evs + [evs[0]] * draw(st.integers(1, 3000))
    shape = draw(st.sampled_from(["doc", "doc", "doc", "bare", "any", "nested"]))
    if shape == "bare":
        text = dumps(evs)
    elif shape == "any":
        text = dumps(draw(ANY_JSON))
    elif shape == "nested":
        depth = draw(st.sampled_from([100, 5000, 100_000]))
        text = '{"traceEvents": [' + "[" * depth + "]" * draw(st.sampled_from([0, depth])) + "]}"
    else:
        extra = draw(st.lists(st.tuples(st.sampled_from(["deviceProperties", "distributedInfo", "schemaVersion",
                                                          "traceEvents", "displayTimeUnit", "baseTimeNanoseconds"]),
                                        ANY_JSON), max_size=3))
        text = dumps(Pairs([("schemaVersion", 1), *extra, ("traceEvents", evs)]))
    data = text.encode()
    if draw(st.integers(0, 9)) == 0:                     # bytes that are not UTF-8
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[at:]
    return data


# --- byte mutations of small real traces -------------------------------------------------------

def seed_traces() -> list[bytes]:
    """Small real traces (tracegen: CUDA, CPU, legacy 2021, ROCm), as JSON text."""
    specs = [tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500, kernels=3, syncs=1, mallocs=1) for _ in range(3)],
                          memory_events=True),
             tg.TraceSpec(steps=[tg.StepSpec(kernels=2) for _ in range(3)], device="cpu"),
             tg.TraceSpec(steps=[tg.StepSpec(kernels=2, memsets=1) for _ in range(3)], fmt="legacy2021"),
             tg.TraceSpec(steps=[tg.StepSpec(kernels=2, nccl_kernels=1) for _ in range(3)], device="rocm",
                          rank=0, world_size=2)]
    return [tg.render(tg.build(s)[0]).encode() for s in specs]


@st.composite
def mutations(draw, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "dup", "digit"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.sampled_from([b"{", b"}", b"[", b"]", b",", b'"', b":", b"NaN", b"-1e999", b"\\u0000",
                                              b'"ts":', b"\xff", b"null", b"99999999999999999999"]))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 64))]
        elif op == "dup":
            j = draw(st.integers(i, min(len(data), i + 400)))
            data[j:j] = data[i:j]
        elif op == "digit" and data and chr(data[i]).isdigit():
            data[i:i + 1] = draw(st.sampled_from([b"9" * 30, b"-", b".", b"e308", b"0"]))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]        # truncated, as a killed profiler leaves it
    if draw(st.booleans()):
        data = bytearray(gzip.compress(bytes(data), compresslevel=1))
        if draw(st.booleans()):
            data = data[:draw(st.integers(0, len(data)))]    # a cut gzip stream
    return bytes(data)


# --- run directories and reports --------------------------------------------------------------

def _num(lo=0.0, hi=1.0):
    return st.one_of(st.floats(lo, hi), st.floats(lo, hi), NUMBERS, SCALARS)


@st.composite
def step_records(draw) -> str:
    n = draw(st.integers(0, 60))
    dur = draw(st.floats(0.001, 0.5))
    lines, end = [], 1.7e9
    for i in range(n):
        d = draw(st.one_of(st.just(dur), st.floats(0, 1), NUMBERS)) if draw(st.integers(0, 4)) == 0 else dur
        end += d if isinstance(d, (int, float)) and math.isfinite(d) else 0.1
        rec = {"step": i + 1, "end": end, "dur": d, "wait": draw(_num(0, 0.01)), "batches": 1,
               "mode": draw(st.sampled_from(["optimizer", "backward", "dataloader", None])),
               "profiled": draw(st.sampled_from([False, False, True, None, "yes"])), "perturbed": False}
        for k in draw(st.lists(st.sampled_from(list(rec)), max_size=2, unique=True)):
            if draw(st.booleans()):
                del rec[k]
            else:
                rec[k] = draw(ANY_JSON)
        lines.append(dumps(rec) if draw(st.integers(0, 20)) else draw(st.sampled_from(["{", "[]", "null", "x", "1"])))
    return "\n".join(lines) + ("\n" if draw(st.booleans()) else "")


@st.composite
def samples_doc(draw):
    def proc(role):
        return {"pid": draw(st.integers(1, 5)), "role": role, "cpu_percent": draw(_num(0, 200)),
                "state": draw(st.sampled_from(["running", "disk-sleep", "sleeping", None, 3])),
                "num_threads": draw(_num(0, 8)), "read_bytes": draw(_num(0, 1e9)),
                "sched_cpu_s": draw(_num(0, 10)), "runq_wait_s": draw(_num(0, 10))}
    samples = []
    for i in range(draw(st.integers(0, 12))):
        s = {"t": 0.5 * i, "unix": 1.7e9 + 0.5 * i, "trainer": proc("trainer"),
             "workers": [proc("worker") for _ in range(draw(st.integers(0, 2)))], "helpers": [],
             "system": {"cpu_count": draw(_num(0, 8)), "usable_cpus": draw(_num(0, 8)),
                        "cpu_usable_percent": draw(_num(0, 100)), "iowait_percent": draw(_num(0, 100)),
                        "psi": draw(st.one_of(st.none(), ANY_JSON)), "disk": draw(st.one_of(st.none(), ANY_JSON)),
                        "ram_available_bytes": draw(_num(0, 1e10))},
             "gpu": draw(st.one_of(st.none(), ANY_JSON))}
        samples.append(draw(st.one_of(st.just(s), st.just(s), ANY_JSON)))
    return draw(st.one_of(st.just({"samples": samples, "notes": []}),
                          st.just({"samples": samples, "notes": draw(ANY_JSON)}), ANY_JSON))


@st.composite
def run_json(draw):
    doc = {"argv": draw(st.one_of(st.just(["train.py", "--batch-size", "32"]), ANY_JSON)),
           "module": None, "exit_code": draw(st.one_of(st.just(0), SCALARS)), "signal": draw(SCALARS),
           "wall_s": draw(_num(0, 100)), "stopped_by": draw(st.sampled_from([None, "max-steps", "duration", 5])),
           "forwarded_signals": [], "notes": draw(st.one_of(st.just([]), ANY_JSON)),
           "config": draw(st.one_of(st.just({"skip": 2, "active": 2, "trace": True}), ANY_JSON))}
    return _perturb(draw, doc)


@st.composite
def child_json(draw):
    doc = {"outcome": draw(st.sampled_from(["completed", "stopped", "exit", "crashed", "interrupted", "killed",
                                            "weird", None, 1])),
           "exit_code": draw(SCALARS), "error": draw(st.one_of(st.none(), STRINGS, ANY_JSON)),
           "steps": draw(_num(0, 100)), "mode": draw(st.sampled_from(["optimizer", "backward", "dataloader", None])),
           "step_source": draw(st.one_of(st.none(), STRINGS)), "profiler": draw(st.sampled_from(["done", None, 0])),
           "trace_enabled": draw(st.sampled_from([True, False, None])), "window": draw(ANY_JSON),
           "notes": draw(st.one_of(st.just([]), ANY_JSON)), "torch_imported": True,
           "torch_version": draw(st.one_of(st.just("2.13.0+cpu"), SCALARS)), "cuda_available": False}
    return _perturb(draw, doc)


def _perturb(draw, doc: dict):
    for k in draw(st.lists(st.sampled_from(list(doc)), max_size=3)):
        if draw(st.booleans()):
            doc.pop(k, None)
        else:
            doc[k] = draw(ANY_JSON)
    return draw(st.one_of(st.just(doc), st.just(doc), st.just(doc), ANY_JSON))


def perturb_report(draw, doc: dict):
    """A real report document with fields deleted or replaced by random values, at any depth
    (one seed drawn, the walk by random.Random: thousands of hypothesis draws are slow)."""
    import random

    doc = json.loads(json.dumps(doc))
    rng = random.Random(draw(st.integers(0, 2 ** 32)))
    pool = draw(st.lists(ANY_JSON, min_size=1, max_size=6))
    rate = draw(st.sampled_from([0.002, 0.02, 0.1]))

    def walk(node):
        if isinstance(node, dict):
            for k in list(node):
                r = rng.random()
                if r < rate / 2:
                    del node[k]
                elif r < rate:
                    node[k] = rng.choice(pool)
                else:
                    walk(node[k])
        elif isinstance(node, list):
            for i in range(len(node)):
                if rng.random() < rate:
                    node[i] = rng.choice(pool)
                else:
                    walk(node[i])
    walk(doc)
    return doc


def write_run_dir(d: Path, files: dict[str, str | bytes | None]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if content is None:
            continue
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape"))
    return d


# --- rule files -------------------------------------------------------------------------------

RULE_FIELDS = {
    "id": st.one_of(st.just("PD950"), SCALARS), "slug": st.one_of(st.just("fuzz"), SCALARS),
    "kind": st.one_of(st.sampled_from(["verdict", "flag", "fix"]), SCALARS),
    "title": st.one_of(st.just("t"), SCALARS), "devices": st.one_of(st.just(["any"]), ANY_JSON),
    "when": st.one_of(st.sampled_from(["share.input >= 0.5", "share.input >", "1/0 > 0", "input.loader * 3 == ''",
                                       "max() > 0", "min(share.input) > 0", "abs(share.input, 1) > 0",
                                       "verdict.bound == 'host'", "flag.fuzz", "share.input in (1, 2)",
                                       "inf > share.input", "true and false"]), SCALARS),
    "summary": st.one_of(st.sampled_from(["x {share.input:pct}", "{share.input:.1f}", "{", "}", "{share.input:x}",
                                          "{input.loader:.2f}", "{share.input!r}"]), SCALARS),
    "severity": st.one_of(st.just("low"), SCALARS), "priority": st.one_of(st.just(5), SCALARS, ANY_JSON),
    "bound": st.one_of(st.just("host"), SCALARS), "targets": st.one_of(st.just(["input"]), ANY_JSON),
    "evidence": st.one_of(st.just(["share.input"]), ANY_JSON),
    "source": st.one_of(st.just({"article": "a", "section": "b"}), ANY_JSON),
    "gain": st.one_of(st.just({"share": "share.input", "speedup": "inf", "assumption": "a", "label": "l",
                               "expected_speedup": "2", "model": "m", "expected_range": ["1.5", "1/0"]}), ANY_JSON),
    "fix": st.one_of(st.just({"text": "do it", "snippet": "x = 1"}), ANY_JSON),
    "no_gain_reason": SCALARS,
    "cases": st.one_of(st.just([{"name": "a", "metrics": {"share.input": 0.9}, "fires": True},
                                {"name": "b", "metrics": {"share.input": 0.1}, "fires": False}]),
                       st.lists(st.one_of(st.fixed_dictionaries(
                           {"name": SCALARS, "metrics": st.one_of(st.dictionaries(
                               st.sampled_from(["share.input", "input.loader", "nope"]), SCALARS), ANY_JSON),
                            "fires": SCALARS, "gain": ANY_JSON, "expected": ANY_JSON}), ANY_JSON), max_size=3),
                       ANY_JSON),
}


def toml_value(v) -> str | None:
    """TOML for a JSON-like value (None: the key is left out, TOML has no null)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if -(2 ** 63) <= v < 2 ** 63 else json.dumps(str(v))
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(x for x in map(toml_value, v) if x is not None) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {x}" for k, x in ((k, toml_value(x)) for k, x in v.items())
                                if x is not None) + " }"
    return json.dumps(str(v))


@st.composite
def rule_files(draw) -> str:
    keys = draw(st.lists(st.sampled_from(list(RULE_FIELDS)), unique=True, min_size=6))
    lines = []
    for k in keys:
        v = toml_value(draw(RULE_FIELDS[k]))
        if v is not None:
            lines.append(f"{k} = {v}")
    text = "\n".join(lines) + "\n"
    if draw(st.integers(0, 9)) == 0:
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(["[", "=", "\x00", "'''", "\n[[cases]]\n"])) + text[i:]
    return text


# --- the outcome ------------------------------------------------------------------------------

class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no result within {HANG_S} s")


def run_cli(argv: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, str, str]:
    """perfdoctor's main in-process on argv: returns (exit code, stdout, stderr) after checking
    the outcome is a documented one: a code in `ok`, or 2 with one line on stderr."""
    from perfdoctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    env = os.environ.pop("PERFDOCTOR_DEBUG", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        if env is not None:
            os.environ["PERFDOCTOR_DEBUG"] = env
    o, e = out.getvalue(), err.getvalue()
    assert "Traceback" not in e, e
    if code not in ok and code != 2:
        e += _traceback(argv)
    assert code in ok or code == 2, f"exit {code}: {e}"
    if code == 2:
        lines = [ln for ln in e.splitlines() if ln.strip()]
        assert lines and all(ln.startswith("perfdoctor: error:") for ln in lines), e
        assert len(lines) == 1 or all("invalid rule" in ln or "rules directory not found" in ln for ln in lines), e
    return code, o, e


def _traceback(argv: list[str]) -> str:
    """The failure again, with PERFDOCTOR_DEBUG=1: its traceback for the assertion message."""
    import traceback

    from perfdoctor.cli import main
    os.environ["PERFDOCTOR_DEBUG"] = "1"
    err = io.StringIO()                  # (debug prints the traceback and keeps the exit code)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit:
        return "\n" + err.getvalue()[-4000:] if "Traceback" in err.getvalue() else ""
    except BaseException:
        return "\n" + traceback.format_exc(limit=-8)
    finally:
        del os.environ["PERFDOCTOR_DEBUG"]
    return ""
