"""Across the traces of one run (one per rank or worker): spread and the overall verdict."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass
class RankSummary:
    count: int
    step_time_median_ms: dict[str, float]     # trace label -> median step time
    spread: float                            # step_time_spread of the medians
    slowest: str
    fastest: str
    verdicts: dict[str, str]
    agree: bool


def step_time_spread(times) -> float | None:
    """How much longer the slowest rank's step is than the fastest's: (slowest - fastest) /
    fastest (0.25: 25% longer). None for fewer than two times or a fastest of zero. The one
    definition for the traces of a run (summarize) and the ranks of a job (straggler.py)."""
    times = [t for t in times if t is not None]
    if len(times) < 2 or min(times) <= 0:
        return None
    return (max(times) - min(times)) / min(times)


def spread_text(spread: float) -> str:
    """A spread as printed: '25.0%' up to twice the fastest, then as the ratio of the slowest to
    the fastest ('77238x': a folder of one job's traces reads 3%, one of unrelated experiments
    had read 7723650.0%)."""
    if spread < 1.0:
        return f"{100 * spread:.1f}%"
    r = 1.0 + spread
    if r < 10:
        return f"{r:.2f}x"
    return f"{round(r, 2 - int(math.floor(math.log10(r)))):.0f}x"      # 3 figures: 77200x


def bound_name(bound: str, platform: str | None) -> str:
    """A trace's or a rank's verdict in a list of them: the CPU's "device" named as compute."""
    return "compute (CPU)" if bound == "device" and platform == "cpu" else str(bound)


def summarize(labels: list[str], metrics: list[dict], bounds: list[str]) -> RankSummary:
    med = {lab: m["steps.time_median_ms"] for lab, m in zip(labels, metrics)}
    slowest = max(med, key=med.get)
    fastest = min(med, key=med.get)
    spread = step_time_spread(list(med.values())) or 0.0
    verdicts = dict(zip(labels, bounds))
    return RankSummary(len(labels), med, spread, slowest, fastest, verdicts, len(set(bounds)) == 1)


def overall_bound(bounds: list[str], slowest_index: int) -> str:
    """Majority verdict; ties go to the slowest rank's verdict (it sets the pace in sync training)."""
    counts = Counter(bounds).most_common()
    best = [b for b, c in counts if c == counts[0][1]]
    return best[0] if len(best) == 1 else bounds[slowest_index]
