"""The gain models against GPU measurements of scripts outside the H100 corpus.

bench/holdout/h200-2026-11-26.json holds, for ten scripts with a known bottleneck (bench/holdout/),
the step times an H200 measured with and without the textbook fix, and the metrics perfdoctor
read from the script's own `perfdoctor run` (bench/record_holdout.py). Today's rules, evaluated
on those metrics, must rank the applied fix first, expect a gain within 25% of the measured
speed-up, and not be beaten by the measurement (their ceiling). The metrics are recorded: a
change to an analysis is checked here only once the runs are re-recorded with it (a GPU is
needed for new runs, not for re-recording).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.gain import combined
from perfdoctor.rules.loader import load_rules

RECORDED = Path(__file__).resolve().parent.parent / "bench" / "holdout" / "h200-2026-11-26.json"
ROWS = json.loads(RECORDED.read_text())
RULES = load_rules()


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_applied_fix_ranks_first_and_its_gain_is_sized_right(name):
    row = ROWS[name]
    measured = statistics.mean(row["bare_ms"]) / statistics.mean(row["fixed_ms"])
    fixes = evaluate(RULES, row["metrics"]).fixes
    slugs = [f.rule.slug for f in fixes]
    applied = [f for f in fixes if f.rule.slug in row["applied"]]
    assert len(applied) == len(row["applied"]), (name, slugs)
    assert slugs[0] in row["applied"], (name, slugs[:3])
    expected = combined([f.expected for f in applied])
    assert expected == pytest.approx(measured, rel=0.25), (name, expected, measured)
    ceilings = [f.ceiling for f in applied]
    assert None in ceilings or measured <= combined(ceilings) * 1.05, (name, ceilings, measured)


def test_the_record_is_of_the_scripts_in_the_repository():
    holdout = RECORDED.parent
    assert len(ROWS) == 10 and all((holdout / name).is_file() for name in ROWS)
    assert all("H200" in row["device"] and len(row["bare_ms"]) == len(row["fixed_ms"]) >= 2 for row in ROWS.values())
