"""Keep a GPU holdout run as numbers the CPU tests can check the gain models against.

    python bench/record_holdout.py OUT.json RESULTS.json [RESULTS.json ...]

RESULTS.json: what `validate_holdout.py --json` wrote, with the run directories `--keep` kept
beside it (one per script, named after it). For every script this re-diagnoses its run
directory with the current code (`perfdoctor report DIR`, no GPU needed), or where the directory
is missing takes the metrics the run reported (in RESULTS.json), and records the device,
the measured step times (bare and fixed), the fix rules the fixed arm applies, and every metric
of the run (None too: a rule tells an unknown metric from a missing one).
tests/test_holdout_recorded.py evaluates today's rules on those metrics and holds them to
validate_holdout's bar: the applied fix ranks first, its expected gain lies within 25% of the
measured speed-up and its ceiling is not beaten. The traces stay out of the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_holdout import APPLIED  # noqa: E402


def record(results: Path) -> dict:
    doc = json.loads(results.read_text())
    out = {}
    for name, row in doc["rows"].items():
        # a row whose diagnosis failed on the device (its "error") holds the measurement alone:
        # its run directory, when kept, is diagnosed here like any other
        run_dir = results.parent / name.removesuffix(".py")
        if run_dir.is_dir():
            r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(run_dir), "-f", "json"],
                               capture_output=True, text=True, check=True)
            metrics = json.loads(r.stdout)["traces"][0]["metrics"]
        elif "metrics" in row:
            metrics = row["metrics"]           # as the run reported them (the code of that run)
        else:
            raise SystemExit(f"{name}: no run directory {run_dir} and no metrics in {results}")
        out[name] = {"device": doc["device"], "bare_ms": row["bare_ms"], "fixed_ms": row["fixed_ms"],
                     "applied": APPLIED[name],
                     "metrics": dict(sorted(metrics.items()))}
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    rows = {}
    for results in argv[1:]:
        rows.update(record(Path(results)))
    Path(argv[0]).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(rows)} scripts recorded in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
