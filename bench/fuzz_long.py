"""The fuzzing suite (tests/test_fuzz.py) run longer: every property with N examples.

    python bench/fuzz_long.py --examples 2000 [--seed-random]

The CI run uses a fixed seed and 40-120 examples per property (about a minute on 2 cores).
Here each property gets --examples examples; --seed-random draws new inputs instead of the
fixed derandomized sequence (hypothesis prints a reproducer blob for any failure). Prints
the examples tried per property and the wall time; exit code: pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--seed-random", action="store_true", help="new random inputs, not the fixed sequence")
    args = ap.parse_args()
    env = {**os.environ, "PERFDOCTOR_FUZZ_EXAMPLES": str(args.examples)}
    if args.seed_random:
        env["PERFDOCTOR_FUZZ_RANDOM"] = "1"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                        "--durations=0", "tests/test_fuzz.py", "-k", "not console_script"], cwd=REPO, env=env)
    print(f"fuzz_long: {args.examples} examples per property, {time.monotonic() - t0:.0f} s, exit {r.returncode}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
