"""Statistics for `compare` and `gate`, numpy only (no scipy).

The steady-state rule (documented in the README, "Performance gate"):
1. the steps of the run's final step mode, in order (steps.jsonl);
2. drop the warm-up: the first max(2, ceil(10% of them)) steps;
3. drop the steps perfdoctor disturbed: profiled (inside the torch.profiler window) or
   perturbed (right after the trace export);
4. drop outliers: steps further than K_MAD (5) times max(scaled MAD, 1% of the median) from
   the median (scaled MAD = 1.4826 * median(|x - median|), the standard deviation for normal
   noise; the 1% floor keeps a perfectly regular run from losing steps to rounding);
5. at least MIN_STEPS (10) steps must remain, or the run is "inconclusive".
The run is then summarised by the median of those steps, never the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

WARMUP_FRACTION = 0.10
WARMUP_MIN = 2
K_MAD = 5.0
MIN_STEPS = 10
MAD_SCALE = 1.4826
MAD_FLOOR = 0.01
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240601     # fixed: the same inputs always give the same answer


@dataclass
class Steady:
    """Steady-state step times (seconds) of one run and what was dropped, by reason."""

    durs: np.ndarray
    waits: np.ndarray
    total: int
    dropped: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(len(self.durs))

    @property
    def median(self) -> float | None:
        return float(np.median(self.durs)) if self.n else None

    @property
    def p90(self) -> float | None:
        return float(np.percentile(self.durs, 90)) if self.n else None

    @property
    def wait_share(self) -> float | None:
        s = float(self.durs.sum()) if self.n else 0.0
        return float(self.waits.sum()) / s if s > 0 else None

    def describe(self) -> str:
        parts = [f"{v} {k}" for k, v in self.dropped.items() if v]
        return f"{self.n} of {self.total} steps" + (f" (dropped {', '.join(parts)})" if parts else "")


def mad(x: np.ndarray) -> float:
    """Scaled median absolute deviation (1.4826 * MAD: the standard deviation for normal data)."""
    if len(x) == 0:
        return 0.0
    return MAD_SCALE * float(np.median(np.abs(x - np.median(x))))


def steady_state(steps: list[dict], k_mad: float = K_MAD) -> Steady:
    """Apply the steady-state rule (module docstring) to step records {"dur", "wait", "profiled", "perturbed"}."""
    total = len(steps)
    warm = max(WARMUP_MIN, math.ceil(WARMUP_FRACTION * total))
    rest = steps[warm:]
    kept = [s for s in rest if not s.get("profiled") and not s.get("perturbed")
            and isinstance(s.get("dur"), (int, float)) and s["dur"] > 0]
    durs = np.array([float(s["dur"]) for s in kept], dtype=float)
    waits = np.array([float(s.get("wait") or 0.0) for s in kept], dtype=float)
    outliers = 0
    if len(durs) >= 3:
        med = float(np.median(durs))
        spread = max(mad(durs), MAD_FLOOR * med)
        keep = np.abs(durs - med) <= k_mad * spread
        outliers = int((~keep).sum())
        durs, waits = durs[keep], waits[keep]
    return Steady(durs, waits, total, {"warm-up": min(warm, total), "profiled/perturbed": len(rest) - len(kept),
                                       "outliers": outliers})


def mann_whitney_greater(a: np.ndarray, b: np.ndarray) -> float:
    """One-sided p-value that values of `b` tend to be larger than those of `a`
    (Mann-Whitney U, normal approximation with tie and continuity correction)."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    allv = np.concatenate([a, b])
    order = np.argsort(allv, kind="mergesort")
    ranks = np.empty(len(allv), dtype=float)
    sorted_v = allv[order]
    # average ranks over ties
    uniq, start, counts = np.unique(sorted_v, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u_b = ranks[n1:].sum() - n2 * (n2 + 1) / 2.0     # U of b: pairs where b > a (+ half ties)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie = float((counts ** 3 - counts).sum())
    var = n1 * n2 / 12.0 * ((n + 1) - tie / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 0.5
    z = (u_b - mu - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, stat=np.median, level: float = 0.95,
                       resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of stat(b) / stat(a) (fixed seed: deterministic)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    ia = rng.integers(0, len(a), size=(resamples, len(a)))
    ib = rng.integers(0, len(b), size=(resamples, len(b)))
    sa = stat(a[ia], axis=1)
    sb = stat(b[ib], axis=1)
    ok = sa > 0
    r = sb[ok] / sa[ok]
    lo, hi = np.percentile(r, [50 * (1 - level), 100 - 50 * (1 - level)])
    return float(lo), float(hi)


def p90(x, axis=None):
    return np.percentile(x, 90, axis=axis)
