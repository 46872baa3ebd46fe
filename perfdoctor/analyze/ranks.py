"""Across the traces of one run (one per rank or worker): spread and the overall verdict."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class RankSummary:
    count: int
    step_time_median_ms: dict[str, float]     # trace label -> median step time
    spread: float                            # (slowest - fastest) / median of medians
    slowest: str
    fastest: str
    verdicts: dict[str, str]
    agree: bool


def summarize(labels: list[str], metrics: list[dict], bounds: list[str]) -> RankSummary:
    med = {lab: m["steps.time_median_ms"] for lab, m in zip(labels, metrics)}
    vals = sorted(med.values())
    mid = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
    slowest = max(med, key=med.get)
    fastest = min(med, key=med.get)
    spread = (med[slowest] - med[fastest]) / mid if mid > 0 else 0.0
    verdicts = dict(zip(labels, bounds))
    return RankSummary(len(labels), med, spread, slowest, fastest, verdicts, len(set(bounds)) == 1)


def overall_bound(bounds: list[str], slowest_index: int) -> str:
    """Majority verdict; ties go to the slowest rank's verdict (it sets the pace in sync training)."""
    counts = Counter(bounds).most_common()
    best = [b for b, c in counts if c == counts[0][1]]
    return best[0] if len(best) == 1 else bounds[slowest_index]
