"""Amdahl-bounded expected gains.

A fix attacks a measured share f of the step and assumes that part gets s times faster
(s = inf: removed). The whole step then speeds up by at most 1 / ((1 - f) + f / s), which is
always <= 1 / (1 - f): no fix can claim more than removing its share entirely.
"""

from __future__ import annotations

import math

MIN_REPORTED_GAIN = 1.01   # below 1% a "speed-up" is noise: listed, not ranked


def amdahl(share: float, speedup: float) -> float:
    f = min(max(float(share), 0.0), 1.0)
    s = float(speedup)
    if s <= 0:
        raise ValueError("speed-up must be positive")
    if f >= 1.0:
        return math.inf if math.isinf(s) else s
    return 1.0 / ((1.0 - f) + (0.0 if math.isinf(s) else f / s))


def describe(bound: float, share: float, label: str) -> str:
    cap = "unbounded" if math.isinf(bound) else f"{bound:.2f}x"
    return f"up to {cap} ({label} is {100 * share:.1f}% of each step)"
