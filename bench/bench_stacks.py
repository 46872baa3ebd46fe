"""Overhead of `perfdoctor run --stacks` (py-spy record at 100 Hz) over `perfdoctor run --no-stacks`.

    python bench/bench_stacks.py [--pairs 4] [--only NAME ...] [--auto]

With --auto the second arm is `run`'s default (stacks only when a core is idle at the first
step), and each pair says whether that run recorded stacks and how many cores were idle.
`overhead_bound_1thread` (one intra-op thread) leaves a core idle on a 2-core machine.

For each example script, runs it under `perfdoctor run --no-stacks` and `--stacks` in
interleaved pairs (the order alternates from pair to pair, so drift and other jobs on the machine
hit both arms), and compares their steady-state step time: the wall time of the steady window
over its steps (perfdoctor.stats.steptime, the one estimator `run` itself reports). Prints the
per-pair ratios stacks / no-stacks, their median and a bootstrap 90% interval of that median,
per script and over all pairs, and py-spy's own CPU time per wall second (what it takes from
the machine, measured by the recorder: robust where the ratios drown in a busy machine's noise).
The decision to record stacks by default rests on this number
(README: "Python stacks").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
SCRIPTS = {
    "compute_bound": [str(EX / "compute_bound.py"), "--steps", "50"],
    "overhead_bound": [str(EX / "overhead_bound.py"), "--steps", "1000"],
    "cpu_bound_loader": [str(EX / "cpu_bound_loader.py"), "--workers", "1", "--steps", "200"],
    "checkpoint_every_100": [str(EX / "checkpoint_every_step.py"), "--every", "100", "--steps", "250"],
    "overhead_bound_1thread": [str(EX / "overhead_bound.py"), "--steps", "1000"],
}
ENV = {"overhead_bound_1thread": {"OMP_NUM_THREADS": "1"}}
AUTO = "(default)"


def steady_step_s(run_dir: Path) -> float:
    from perfdoctor.stats.steptime import estimate

    recs = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines() if x.strip()]
    mode = recs[-1].get("mode")
    est = estimate([r for r in recs if r.get("mode") == mode])
    if est.step_s is None:
        raise SystemExit(f"no steady step time in {run_dir}: {est.reason}")
    return est.step_s


def pyspy_core_share(run_dir: Path) -> float | None:
    """py-spy's own CPU time / its wall time (1.0 = a whole core), as the recorder measured it."""
    try:
        meta = json.loads((run_dir / "stacks" / "pyspy.meta.json").read_text())
        return meta["pyspy_cpu_s"] / meta["pyspy_wall_s"]
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return None


def auto_state(run_dir: Path) -> str:
    try:
        meta = json.loads((run_dir / "stacks" / "pyspy.meta.json").read_text())
    except (OSError, ValueError):
        return "no meta"
    return f"{'skipped' if meta.get('skipped') else 'recorded'}, {meta.get('idle_cores')} cores idle"


def run(flag: str, script: list[str], out: Path, env: dict) -> float:
    cmd = [sys.executable, "-m", "perfdoctor", "run", *([] if flag == AUTO else [flag]), "--out", str(out), *script]
    env = {**{k: v for k, v in os.environ.items() if k != "PERFDOCTOR_STACKS"}, **env}
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    if flag == "--stacks" and not list((out / "stacks").glob("pyspy-*.json")):
        raise SystemExit(f"no stacks were recorded in {out} (py-spy missing or ptrace refused?)")
    return steady_step_s(out)


def interval(ratios: list[float]) -> tuple[float, float]:
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return boot[len(boot) // 20], boot[-len(boot) // 20 - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--only", nargs="*", choices=sorted(SCRIPTS), help="scripts to run (default: all)")
    ap.add_argument("--auto", action="store_true", help="compare run's default (auto stacks) with --no-stacks")
    args = ap.parse_args()
    on = AUTO if args.auto else "--stacks"
    every: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or SCRIPTS:
            ratios, cost = [], []
            for i in range(args.pairs):
                arms = ["--no-stacks", on] if i % 2 == 0 else [on, "--no-stacks"]
                dirs = {flag: Path(tmp) / f"{name}-{i}-{'auto' if flag == AUTO else flag.strip('-')}" for flag in arms}
                got = {flag: run(flag, SCRIPTS[name], dirs[flag], ENV.get(name, {})) for flag in arms}
                ratios.append(got[on] / got["--no-stacks"])
                cost.append(pyspy_core_share(dirs[on]) or float("nan"))
                print(f"  {name} pair {i + 1}: no-stacks {1e3 * got['--no-stacks']:.2f} ms/step, "
                      f"{on} {1e3 * got[on]:.2f} ms/step, ratio {ratios[-1]:.3f}; "
                      f"py-spy used {100 * cost[-1]:.1f}% of one core"
                      + (f" ({auto_state(dirs[on])})" if on == AUTO else ""), flush=True)
            lo, hi = interval(ratios)
            print(f"{name}: median ratio {statistics.median(ratios):.3f} (90% interval {lo:.3f}-{hi:.3f}); "
                  f"py-spy {100 * statistics.median(cost):.1f}% of one core", flush=True)
            every += ratios
    lo, hi = interval(every)
    print(f"all {len(every)} pairs: median ratio stacks / no-stacks {statistics.median(every):.3f} "
          f"(90% interval {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
