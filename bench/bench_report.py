"""Benchmark `perfdoctor report` against a bare decode baseline and HolisticTraceAnalysis 0.5.0.

Run from the project venv:  python bench/bench_report.py [--trace PATH] [--repeat N] [--no-hta]

Every measurement is a child process, so interpreter start-up counts on all sides. Peak RSS comes
from os.wait4 (ru_maxrss of that one child). Caveat: on Linux a child's ru_maxrss is never below the
parent's own peak RSS at spawn time (vfork/exec keeps it), so this script keeps itself small and
builds the 8x trace in a forked child; its own peak is printed as the floor of every RSS reading.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (REPO / "../shared/traces/hta/df_index_resolver/df_index_resolver.json.gz").resolve()
HTA_VERSION = "0.5.0"
HTA_REFERENCE = (3.5, 333.0)  # wall s, peak MB; used when HTA cannot be installed
BASELINE = "baseline (gunzip+msgspec)"

BASELINE_CODE = """
import gzip, sys, msgspec
class Ev(msgspec.Struct):
    ph: str = ''; cat: str = ''; name: str = ''; pid: int | str = 0; tid: int | str = 0
    ts: float = 0; dur: float = 0
class Trace(msgspec.Struct):
    traceEvents: list[Ev] = []
msgspec.json.decode(gzip.decompress(open(sys.argv[1], 'rb').read()), type=Trace)
"""
HTA_CODE = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(ranks=sorted(a.t.traces), visualize=False)  # default ranks=[0] only
"""


class Run(NamedTuple):
    wall: float
    rss_mib: float
    rc: int
    stderr: str


def measure(cmd: list[str], env: dict | None = None) -> Run:
    """Run cmd to completion; wall time and this child's own peak RSS."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return Run(wall, usage.ru_maxrss / 1024, proc.returncode, err.read().decode(errors="replace"))


def ensure_installed(venv: Path) -> Path | None:
    """Python of a venv holding perfdoctor as pip installs it for a user (not editable: an
    editable install adds ~20 ms of import-hook set-up to every interpreter start), with its
    dependencies pinned by constraints.txt. Created on first use; perfdoctor is reinstalled
    from this checkout on every run. None on failure."""
    py = venv / "bin" / "python"
    steps = [] if py.exists() else [[sys.executable, "-m", "venv", str(venv)],
                                    [str(py), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt"), str(REPO)]]
    steps.append([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(REPO)])
    print(f"installing perfdoctor from {REPO} into {venv} ...", flush=True)
    for step in steps:
        res = subprocess.run(step, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"  install failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
            return None
    return py


def perfdoctor_cmd() -> tuple[list[str], dict | None]:
    script = Path(sys.executable).with_name("perfdoctor")
    if script.exists():
        return [str(script)], None
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    return [sys.executable, "-m", "perfdoctor"], env


def ensure_hta(venv: Path) -> Path | None:
    """Python of a venv holding HolisticTraceAnalysis==0.5.0, created on first use; None on failure."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import hta, importlib.metadata as m; "
             f"assert m.version('HolisticTraceAnalysis') == '{HTA_VERSION}'"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    print(f"installing HolisticTraceAnalysis=={HTA_VERSION} into {venv} ...", flush=True)
    for step in ([sys.executable, "-m", "venv", str(venv)],
                 [str(py), "-m", "pip", "install", "-q", f"HolisticTraceAnalysis=={HTA_VERSION}"], check):
        res = subprocess.run(step, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"  HTA install failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
            return None
    return py


def build_scaled(src: Path, plain: Path, gz: Path, copies: int) -> None:
    """Write src with its traceEvents repeated `copies` times back to back, as plain JSON and fast gzip.

    The events' original text (kineto's formatting, hence its size) is kept; only timestamps and the
    flow/correlation ids are shifted per copy, so copies follow each other and ids never collide.
    """
    import gzip
    import re

    import msgspec
    try:
        from isal.igzip import open as gz_open
    except ImportError:
        gz_open = gzip.open

    class Ev(msgspec.Struct):
        ts: float | None = None
        dur: float = 0

    data = gzip.decompress(src.read_bytes())
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    events_text = bytes(top.pop("traceEvents")).strip()[1:-1]  # inside the [ ]
    parsed = msgspec.json.decode(b"[" + events_text + b"]", type=list[Ev])
    times = [(e.ts, e.dur) for e in parsed if e.ts is not None]
    t0 = min(ts for ts, _ in times)
    span = int(max(ts + dur for ts, dur in times) - t0) + 1000  # 1 ms gap between copies
    number = re.compile(rb'("(ts|id|correlation|External id|Ev Idx)":\s*)(-?\d+)')
    id_step = 1 + max([0] + [int(m[3]) for m in number.finditer(events_text) if m[2] != b"ts"])
    del data, parsed, times

    head = b"{" + b"".join(b'"%s": %s, ' % (k.encode(), bytes(v)) for k, v in top.items())
    head += b'"traceEvents": ['

    def copy(k: int) -> bytes:
        ts_off, id_off = k * span, k * id_step
        return number.sub(lambda m: m[1] + b"%d" % (int(m[3]) + (ts_off if m[2] == b"ts" else id_off)),
                          events_text) if k else events_text

    with open(plain, "wb") as fp, gz_open(gz, "wb", compresslevel=1) as fz:
        for k in range(copies):
            chunk = (head if k == 0 else b",") + copy(k) + (b"]}\n" if k == copies - 1 else b"")
            fp.write(chunk)
            fz.write(chunk)


def in_forked_child(fn, *args) -> None:
    """Run fn in a forked child so its memory never raises this process's (inherited) peak RSS."""
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
            os._exit(0)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(1)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        sys.exit("bench_report: building the scaled trace failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per tool (median reported)")
    ap.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    ap.add_argument("--hta-venv", type=Path, default=Path("/tmp/perfdoctor-bench-hta-venv"))
    ap.add_argument("--no-scale", action="store_true", help="skip the 8x memory-at-scale runs")
    ap.add_argument("--dev", action="store_true",
                    help="time the perfdoctor of this venv (an editable install) instead of a pip-installed copy")
    ap.add_argument("--venv", type=Path, default=Path("/tmp/perfdoctor-bench-venv"),
                    help="venv for the pip-installed copy")
    ap.add_argument("--copies", type=int, default=8)
    args = ap.parse_args()
    trace = args.trace.resolve()
    if not trace.is_file():
        sys.exit(f"bench_report: trace not found: {trace} (pass --trace PATH)")

    hta_py = None if args.no_hta else ensure_hta(args.hta_venv)
    pd_cmd, pd_env = perfdoctor_cmd()
    base_py = sys.executable
    if not args.dev:
        py = ensure_installed(args.venv)
        if py is None:
            print("timing this venv's perfdoctor instead (--dev)")
        else:
            pd_cmd, pd_env, base_py = [str(py.with_name("perfdoctor"))], None, str(py)
    results: dict[str, list[Run]] = {}
    failed: set[str] = set()

    def record(label: str, run: Run) -> None:
        if run.rc != 0 and label not in failed:
            failed.add(label)
            print(f"[{label}] exited {run.rc}; stderr tail:\n" + "\n".join(run.stderr.splitlines()[-15:]))
        results.setdefault(label, []).append(run)

    with tempfile.TemporaryDirectory(prefix="perfdoctor-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "hta").mkdir()
        (tmp / "hta" / trace.name).symlink_to(trace)  # HTA loads every trace in its dir

        def report(path: Path) -> list[str]:
            return pd_cmd + ["report", str(path), "--format", "json", "-o", str(tmp / "r.json")]

        tools = {BASELINE: ([base_py, "-c", BASELINE_CODE, str(trace)], None),
                 "perfdoctor report": (report(trace), pd_env)}
        if hta_py:
            tools[f"HTA {HTA_VERSION}"] = ([str(hta_py), "-c", HTA_CODE, str(tmp / "hta")], None)
        for i in range(args.repeat):  # interleaved, so machine noise hits every tool
            print(f"round {i + 1}/{args.repeat} ...", flush=True)
            for label, (cmd, env) in tools.items():
                record(label, measure(cmd, env))
        for _ in range(5):
            record("perfdoctor --help", measure(pd_cmd + ["--help"], pd_env))
        if not args.no_scale:
            plain, gz = tmp / f"x{args.copies}.json", tmp / f"x{args.copies}.json.gz"
            print(f"building {args.copies}x trace ...", flush=True)
            in_forked_child(build_scaled, trace, plain, gz, args.copies)
            for path in (gz, plain):
                size = path.stat().st_size / 2**20
                label = f"report {args.copies}x {'.json.gz' if path == gz else '.json'} ({size:.0f} MiB)"
                record(label, measure(report(path), pd_env))

    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n{'measurement':<38} {'wall s (median)':>15} {'peak RSS MiB (max)':>19} {'runs':>5}")
    med: dict[str, tuple[float, float]] = {}
    for label, runs in results.items():
        ok = [r for r in runs if r.rc == 0]
        if ok:
            med[label] = (statistics.median(r.wall for r in ok), max(r.rss_mib for r in ok))
            print(f"{label:<38} {med[label][0]:>15.3f} {med[label][1]:>19.0f} {len(ok):>5}")
        else:
            print(f"{label:<38} {'FAILED':>15}")
    print(f"(RSS floor: this bench process peaked at {floor:.0f} MiB; no child reading can be lower)")
    if f"HTA {HTA_VERSION}" not in med:
        med[f"HTA {HTA_VERSION}"] = HTA_REFERENCE
        print(f"HTA not measured: using reference numbers {HTA_REFERENCE[0]} s / {HTA_REFERENCE[1]:.0f} MB")

    def verdict(name: str, value: float | None, target: str, met) -> None:
        shown = "n/a" if value is None else f"{value:.3g}"
        status = "(perfdoctor failed)" if value is None else ("met" if met(value) else "NOT met")
        print(f"{name:<44} {shown:>10}  target {target:<9} {status}")

    pd_run = med.get("perfdoctor report")
    print()
    hta_wall = med[f"HTA {HTA_VERSION}"][0]
    verdict("perfdoctor / baseline wall", pd_run and pd_run[0] / med[BASELINE][0], "<= 2.0", lambda v: v <= 2.0)
    verdict(f"HTA {HTA_VERSION} / perfdoctor wall", pd_run and hta_wall / pd_run[0], ">= 10", lambda v: v >= 10)
    for label in (lb for lb in results if lb.startswith("report ")):
        verdict(f"{label} peak RSS MiB", med[label][1] if label in med else None, "< 1024", lambda v: v < 1024)
    help_run = med.get("perfdoctor --help")
    verdict("perfdoctor --help wall s", help_run and help_run[0], "< 0.3", lambda v: v < 0.3)


if __name__ == "__main__":
    main()
