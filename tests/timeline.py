"""Where a test suite's wall time went, from a PERFDOCTOR_TEST_TIMELINE file (tests/conftest.py).

    PERFDOCTOR_TEST_TIMELINE=/tmp/tl.jsonl python -m pytest -q
    python tests/timeline.py /tmp/tl.jsonl

Prints the suite's span, each worker's busy time, the time quiet tests held the machine alone,
the time workers waited for a hold (a quiet test waiting for the other workers' tests to end,
the others waiting for a quiet test), each worker's idle tail, and the longest tests.
"""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    main(*sys.argv[1:2])
