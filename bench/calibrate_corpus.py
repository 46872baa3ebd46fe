"""Expected vs measured gains on the H100 corpus (../shared/traces/h100, measured speed-ups in
its README). For each case: the fixes perfdoctor ranks that correspond to the fix applied, their
expected gains (combined as validate_holdout.judge does: savings add, or multiply where their
shares overlap), the ceiling, the measured speed-up and the error.

    python bench/calibrate_corpus.py [--corpus ../shared/traces/h100]

Prints a markdown table; docs/rules.md quotes it (tests/test_h100_corpus.py checks). No GPU
needed: the run directories were recorded on an H100 and are re-diagnosed here.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from perfdoctor.diagnose.offline import diagnose_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_holdout import judge  # noqa: E402  (the held-out check's bar, on the corpus)

# corpus row (run, fix column text) -> perfdoctor fixes that make the same change
APPLIED = {
    ("compute", "bf16 autocast"): ["mixed-precision", "channels-last"],
    ("loader", "8 workers"): ["loader-workers", "pin-memory"],
    ("sync", "pinned batch"): ["pin-memory", "remove-host-syncs"],
    ("launch", "Adam(fused=True)"): ["fused-optimizer"],
    ("launch", "torch.compile"): ["fused-optimizer", "compile-reduce-overhead"],
    ("alloc", "no empty_cache"): ["remove-empty-cache"],
}
ROW = re.compile(r"^\| `(\w+)` \|[^|]*\| ([\d.]+)[^|]*\| ([^|]+)\| ([\d.]+)[^|]*\| ([\d.]+)x \|")


def corpus_rows(readme: Path):
    for line in readme.read_text().splitlines():
        m = ROW.match(line)
        if m:
            run, bare, fix, fixed, speedup = m.groups()
            yield run, fix.strip(), float(bare), float(fixed), float(speedup)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/traces/h100")
    a = ap.parse_args(argv)
    readme = a.corpus / "README.md"
    if not readme.is_file():
        print(f"no corpus at {a.corpus}", file=sys.stderr)
        return 2
    print("| run | fix applied | perfdoctor's fixes (rank) | expected | range | ceiling | measured | error |")
    print("|---|---|---|---|---|---|---|---|")
    docs: dict = {}
    for run, fix, bare, fixed, measured in corpus_rows(readme):
        slugs = next((v for (r, key), v in APPLIED.items() if r == run and key in fix), None)
        if slugs is None:
            continue
        doc = docs.setdefault(run, diagnose_path(str(a.corpus / run)))
        row = judge(doc, slugs, measured)
        exp, (lo, hi), cap = row["expected"], row["range"] or (None, None), row["ceiling"]
        names = ", ".join(f"{s} (#{r})" if r else f"{s} (absent)" for s, r in zip(slugs, row["ranks"]))
        err = f"{100 * row['error']:+.0f}%" if exp else "-"
        fmt = lambda v: ("unbounded" if v == float("inf") else f"{v:.2f}x") if v else "-"   # noqa: E731
        print(f"| {run} | {fix[:40]} | {names} | {fmt(exp)} | {fmt(lo)}-{fmt(hi)} | {fmt(cap)} | {measured:.2f}x | {err} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
