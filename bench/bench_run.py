"""Overhead of `perfdoctor run` (samplers on, no --stacks) over the bare script.

    python bench/bench_run.py [--repeat 5] [-- SCRIPT ARGS...]

Runs the script alone and under `perfdoctor run` alternately (interleaved, so machine noise hits
both), `--repeat` times each, and prints the wall times and the median ratio. The default script
is examples/compute_bound.py with a fixed number of steps, so both runs do the same work; the
profiled window is part of the measured cost (it is part of what a user pays).
Target: median ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [str(REPO / "examples" / "compute_bound.py"), "--steps", "300"]


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
    print(f"median ratio perfdoctor run / bare: {med:.3f}  (target <= 1.02: {'met' if med <= 1.02 else 'NOT met'})")


if __name__ == "__main__":
    main()
