"""Where a test suite's wall time went, from a PERFDOCTOR_TEST_TIMELINE file (tests/conftest.py).

    PERFDOCTOR_TEST_TIMELINE=/tmp/tl.jsonl python -m pytest -q
    python tests/timeline.py /tmp/tl.jsonl

Prints the suite's span, each worker's busy time, the time quiet tests held the machine alone,
the time workers waited for a hold (a quiet test waiting for the other workers' tests to end,
the others waiting for a quiet test), each worker's idle tail, the longest tests, and where the
rows record CPU time: the CPU the tests used against the cores' time, inside quiet holds and
outside, and the long tests that mostly wait (their scripts sleep, or wait for a subprocess).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict


def main(path: str, top: int = 15) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no tests recorded")
    start, end = min(r["asked"] for r in rows), max(r["done"] for r in rows)
    print(f"{len(rows)} tests over {end - start:.0f} s")
    by = defaultdict(list)
    for r in rows:
        by[r["worker"]].append(r)
    for w, rs in sorted(by.items()):
        run = sum(r["done"] - r["held"] for r in rs)
        wait = sum(r["held"] - r["asked"] for r in rs)
        quiet = sum(r["done"] - r["held"] for r in rs if r["quiet"])
        print(f"{w}: {len(rs)} tests, running {run:.0f} s (quiet {quiet:.0f} s), waiting for a hold "
              f"{wait:.0f} s, idle at the end {end - max(r['done'] for r in rs):.0f} s")
    waits = sorted(rows, key=lambda r: r["held"] - r["asked"], reverse=True)[:top]
    print("longest waits:")
    for r in waits:
        print(f"  {r['held'] - r['asked']:6.1f} s  {'quiet ' if r['quiet'] else ''}{r['test']}")
    print("longest tests:")
    for r in sorted(rows, key=lambda r: r["done"] - r["held"], reverse=True)[:top]:
        print(f"  {r['done'] - r['held']:6.1f} s  {'quiet ' if r['quiet'] else ''}{r['test']}")
    if all("cpu" in r for r in rows):
        _cpu(rows, end - start, top)


def _cpu(rows: list[dict], span: float, top: int) -> None:
    """The CPU the tests used against the time the cores had, inside quiet holds and outside."""
    cores = os.cpu_count() or 1
    quiet = [r for r in rows if r["quiet"]]
    held = sum(r["done"] - r["held"] for r in quiet)
    cpu, busy = sum(r["cpu"] for r in quiet), sum(r.get("busy", 0.0) for r in quiet)
    print(f"quiet holds: {held:.0f} s, their tests using {cpu / max(held, 1e-9):.2f} of {cores} cores "
          f"(the machine {busy / max(held, 1e-9):.2f})")
    rest = span - held
    cpu = sum(r["cpu"] for r in rows if not r["quiet"])
    print(f"the rest: {rest:.0f} s, the tests using {cpu / max(rest, 1e-9):.2f} of {cores} cores")
    waiting = [r for r in rows if r["done"] - r["held"] >= 5]
    waiting.sort(key=lambda r: r["cpu"] / (r["done"] - r["held"]))
    print("long tests using the least CPU (cores each):")
    for r in waiting[:top]:
        print(f"  {r['cpu'] / (r['done'] - r['held']):5.2f}  {r['done'] - r['held']:6.1f} s  "
              f"{'quiet ' if r['quiet'] else ''}{r['test']}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
