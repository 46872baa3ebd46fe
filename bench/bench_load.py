"""Benchmark `load_trace`: single pass (PERFDOCTOR_JOBS=1) against the forked two-process load.

Run from the project venv:  python bench/bench_load.py [--trace PATH] [--repeat N] [--in-process]

Each timing is `load_trace` alone, measured inside a fresh child interpreter (imports excluded),
because a fresh process is what `perfdoctor report` runs in: on small VMs its first-touch page
faults are a real part of the cost, and a warm process that has loaded before hides them.
`--in-process` times repeated loads in this process instead. The two modes are interleaved, so
machine noise hits both alike; the script prints medians, the ratio, and whether the tables match.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (REPO / "../shared/traces/hta/df_index_resolver/df_index_resolver.json.gz").resolve()

CHILD = r"""
import json, resource, sys, time
from perfdoctor.trace import assemble, loader
path = sys.argv[1]
merged = []
real_join = assemble.join
assemble.join = lambda parts: merged.append(len(parts) > 1) or real_join(parts)
t = time.perf_counter()
table = loader.load_trace(path)
dt = time.perf_counter() - t
rss = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"s": dt, "rows": len(table), "names": len(table.names), "merged": bool(merged and merged[-1]),
                  "maxrss_mib": rss / 1024,
                  "sig": [float(table.ts.sum()), int(table.name.sum()), len(table.str_args["labels"])]}))
"""


def run_child(trace: str, jobs: str) -> dict:
    env = dict(os.environ, PERFDOCTOR_JOBS=jobs)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", CHILD, trace], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"load failed (PERFDOCTOR_JOBS={jobs}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_in_process(trace: str, jobs: str) -> dict:
    from perfdoctor.trace import loader
    os.environ["PERFDOCTOR_JOBS"] = jobs
    t = time.perf_counter()
    table = loader.load_trace(trace)
    dt = time.perf_counter() - t
    return {"s": dt, "rows": len(table), "merged": None, "maxrss_mib": None,
            "sig": [float(table.ts.sum()), int(table.name.sum()), len(table.str_args["labels"])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--in-process", action="store_true", help="time repeated loads in this process")
    args = ap.parse_args()
    if not os.path.exists(args.trace):
        sys.exit(f"no such trace: {args.trace}")
    run = run_in_process if args.in_process else run_child
    modes = {"sequential": "1", "parallel": ""}
    times: dict[str, list[float]] = {m: [] for m in modes}
    last: dict[str, dict] = {}
    run(args.trace, "1")  # warm the page cache and the interpreter's .pyc files
    for _ in range(args.repeat):
        for mode, jobs in modes.items():
            r = run(args.trace, jobs)
            times[mode].append(r["s"])
            last[mode] = r
    size = os.path.getsize(args.trace)
    print(f"trace: {args.trace} ({size / 2**20:.1f} MiB on disk, {last['sequential']['rows']:,} rows)")
    for mode in modes:
        ts = times[mode]
        extra = ""
        if last[mode]["maxrss_mib"] is not None:
            extra = f"  peak RSS {last[mode]['maxrss_mib']:.0f} MiB (either process)  child merged: {last[mode]['merged']}"
        print(f"{mode:>10}: median {statistics.median(ts):.3f} s  (min {min(ts):.3f}, max {max(ts):.3f}, n={len(ts)}){extra}")
    ratio = statistics.median(times["sequential"]) / statistics.median(times["parallel"])
    print(f"     ratio: {ratio:.2f}x faster with the second process")
    same = last["sequential"]["sig"] == last["parallel"]["sig"]
    print(f"    tables: {'identical checksums' if same else 'DIFFER: ' + str((last['sequential']['sig'], last['parallel']['sig']))}")


if __name__ == "__main__":
    main()
