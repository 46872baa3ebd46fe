"""Overhead of `perfdoctor run` (samplers on, no --stacks) over the bare script.

    python bench/bench_run.py [--repeat 5] [-- SCRIPT ARGS...]

Runs the script alone and under `perfdoctor run` alternately (interleaved, so machine noise hits
both), `--repeat` times each, and prints the wall times, the per-pair ratios, their median and
a bootstrap 90% interval of that median (on a shared VM whose speed drifts by 15%, the interval
says whether the runs can tell 1.02 from 1.00). The default script is examples/compute_bound.py
with a fixed number of steps (about a minute here), so both runs do the same work; the profiled
window and the diagnosis after the run are part of the measured cost (a user pays them).
Target: median ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [str(REPO / "examples" / "compute_bound.py"), "--steps", "200"]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("script", nargs=argparse.REMAINDER, help="script and args (after --)")
    args = ap.parse_args()
    script = [a for a in args.script if a != "--"] or DEFAULT
    if not Path(script[0]).is_file():
        raise SystemExit(f"no such script: {script[0]}")
    bare, under = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            bare.append(timed([sys.executable, *script]))
            under.append(timed([sys.executable, "-m", "perfdoctor", "run", "--out", f"{tmp}/run{i}", *script]))
            print(f"  rep {i + 1}: bare {bare[-1]:.2f} s   perfdoctor run {under[-1]:.2f} s", flush=True)
    ratios = [u / b for u, b in zip(under, bare)]
    print(f"script: {' '.join(script)}")
    print(f"bare median {statistics.median(bare):.2f} s, perfdoctor run median {statistics.median(under):.2f} s")
    med = statistics.median(ratios)
    print("per-pair ratios: " + " ".join(f"{r:.3f}" for r in ratios))
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    lo, hi = boot[len(boot) // 20], boot[-len(boot) // 20 - 1]
    print(f"median ratio perfdoctor run / bare: {med:.3f}  (bootstrap 90% interval {lo:.3f}-{hi:.3f}; "
          f"target <= 1.02: {'met' if med <= 1.02 else 'NOT met'})")


if __name__ == "__main__":
    main()
