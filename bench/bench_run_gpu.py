"""Overhead of `perfdoctor run` on GPU scripts: steady step time under `run` over bare, per script.

    python bench/bench_run_gpu.py [--pairs 5] [--scripts-dir DIR] [--only g_launch.py ...]
                                  [--args 'g_loader.py=--fast-exit'] [--run-args='--stacks'] [--json FILE]

GPU only: without a CUDA device (torch.cuda.is_available() in this interpreter) it prints why and
exits 0 (--cpu runs it anyway, to check the bench itself). Every *.py in --scripts-dir (default
../shared/workloads/gpu beside the checkout; on a GPU machine that lacks ../shared, copy the
scripts into an ignored folder of the project and pass it) runs bare (`python SCRIPT`) and under
`perfdoctor run` (default options, or --run-args), in interleaved pairs whose order alternates
(bare first, then run first), so drift of the machine hits both. Each script prints its own
steady step time as `STEADY_MS <ms>` (after its warm-up, synchronised); a script that does not
(framework scripts) is compared on wall time, marked `wall` (start-up and the diagnosis
included: an upper bound on the overhead). Prints per script the medians, the per-pair
ratios run/bare, their median and a bootstrap 90% interval of that median, and whether the
target (median ratio <= 1.02) is met.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO.parent / "shared" / "workloads" / "gpu"
STEADY = re.compile(r"^STEADY_MS\s+([0-9.]+)\s*$", re.M)
TARGET = 1.02


def cuda_available() -> tuple[bool, str]:
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available(), torch.version.cuda, "
                        "torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return False, "torch cannot be imported: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    ok, cuda, name = (r.stdout.strip().split(" ", 2) + ["", ""])[:3]
    return ok == "True", f"torch CUDA {cuda}, {name or 'no CUDA device'}"


def steady_ms(stdout: str) -> float | None:
    found = STEADY.findall(stdout)
    return float(found[-1]) if found else None


def bootstrap_median(ratios: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """90% bootstrap interval of the median of `ratios`."""
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    return boot[n // 20], boot[-n // 20 - 1]


def once(cmd: list[str], timeout: float) -> tuple[float | None, float]:
    """(STEADY_MS or None, wall seconds) of one run; exits on failure."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"failed ({r.returncode}): {shlex.join(cmd)}\n{tail}")
    return steady_ms(r.stdout), wall


def bench_script(script: Path, args: list[str], run_args: list[str], pairs: int, tmp: Path,
                 timeout: float) -> dict:
    bare_cmd = [sys.executable, str(script), *args]
    bare, under = [], []
    for i in range(pairs):
        run_cmd = [sys.executable, "-m", "perfdoctor", "run", *run_args, "--out", str(tmp / f"{script.stem}-{i}"),
                   str(script), *args]
        order = (("bare", bare_cmd), ("run", run_cmd)) if i % 2 == 0 else (("run", run_cmd), ("bare", bare_cmd))
        got = {}
        for kind, cmd in order:
            got[kind] = once(cmd, timeout)
        bare.append(got["bare"])
        under.append(got["run"])
        print(f"  {script.name} pair {i + 1}: bare {_fmt(got['bare'])}   perfdoctor run {_fmt(got['run'])}",
              flush=True)
    steady = all(b[0] is not None for b in bare) and all(u[0] is not None for u in under)
    pick = 0 if steady else 1
    b = [x[pick] for x in bare]
    u = [x[pick] for x in under]
    ratios = [y / x for x, y in zip(b, u)]
    lo, hi = bootstrap_median(ratios)
    med = statistics.median(ratios)
    return {"script": script.name, "args": args, "measure": "steady_ms" if steady else "wall_s",
            "bare": b, "run": u, "bare_median": statistics.median(b), "run_median": statistics.median(u),
            "ratios": ratios, "median_ratio": med, "ci90": [lo, hi], "target_met": med <= TARGET}


def _fmt(x: tuple[float | None, float]) -> str:
    return f"{x[0]:.2f} ms/step ({x[1]:.1f} s)" if x[0] is not None else f"{x[1]:.1f} s wall"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5, help="interleaved bare/run pairs per script (default 5)")
    ap.add_argument("--scripts-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="only these script names")
    ap.add_argument("--args", action="append", default=[], metavar="NAME=ARGS",
                    help="arguments for one script, e.g. 'g_loader.py=--fast-exit' (repeatable)")
    ap.add_argument("--run-args", default="", help="options for `perfdoctor run`, as one string: --run-args='--stacks'")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per single run")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--cpu", action="store_true", help="run without a CUDA device (to check the bench itself)")
    a = ap.parse_args(argv)
    ok, what = cuda_available()
    if not ok and not a.cpu:
        print(f"bench_run_gpu: skipped: no CUDA GPU here ({what}); this bench measures `perfdoctor run` "
              "on GPU scripts and needs one (--cpu runs it anyway)")
        return 0
    if not a.scripts_dir.is_dir():
        print(f"bench_run_gpu: no scripts directory {a.scripts_dir} (pass --scripts-dir)", file=sys.stderr)
        return 2
    per_script = {}
    for spec in a.args:
        name, _, rest = spec.partition("=")
        per_script[name] = shlex.split(rest)
    scripts = sorted(p for p in a.scripts_dir.glob("*.py") if not a.only or p.name in a.only)
    if not scripts:
        print(f"bench_run_gpu: no scripts in {a.scripts_dir}", file=sys.stderr)
        return 2
    print(f"bench_run_gpu: {what}; {len(scripts)} script(s), {a.pairs} pairs each; "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    env_note = os.environ.get("TEARDOWN_CUPTI")
    if env_note is not None:
        print(f"  note: TEARDOWN_CUPTI={env_note!r} is set here, so both runs use it (perfdoctor keeps it)")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-run-gpu-") as tmp:
        for s in scripts:
            results.append(bench_script(s, per_script.get(s.name, []), shlex.split(a.run_args), a.pairs,
                                        Path(tmp), a.timeout))
    print()
    print(f"{'script':<22} {'measure':<9} {'bare':>10} {'run':>10} {'ratio':>7}  {'90% interval':<13} target <= {TARGET}")
    for r in results:
        unit = "ms" if r["measure"] == "steady_ms" else "s"
        print(f"{r['script']:<22} {r['measure']:<9} {r['bare_median']:>8.2f}{unit:>2} {r['run_median']:>8.2f}{unit:>2} "
              f"{r['median_ratio']:>7.3f}  {r['ci90'][0]:.3f}-{r['ci90'][1]:.3f}   "
              f"{'met' if r['target_met'] else 'NOT met'}")
        print(f"{'':<22} per-pair ratios: " + " ".join(f"{x:.3f}" for x in r["ratios"]))
    if a.json is not None:
        a.json.write_text(json.dumps({"device": what, "date": time.strftime("%Y-%m-%d"), "pairs": a.pairs,
                                      "run_args": a.run_args, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
