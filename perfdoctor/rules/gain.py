"""Gains: the Amdahl ceiling of a fix, and how its expected gain is worded.

A fix attacks a measured share f of the step and assumes that part gets s times faster
(s = inf: removed). The whole step then speeds up by at most 1 / ((1 - f) + f / s), which is
always <= 1 / (1 - f): no fix can claim more than removing its share entirely.
"""

from __future__ import annotations

import math
from collections.abc import Callable

MIN_REPORTED_GAIN = 1.01   # below 1% a "speed-up" is noise: listed, not ranked
# How far the models' expected gains have landed from measured ones: on 21 GPU cases (the H100
# corpus, docs/rules.md's calibration table, and the H200 held-out runs in bench/holdout) the
# measured speed-up was 0.80-1.29 times the expected one. A range narrower than that claimed a
# precision no model here has shown (9 of those 21 measurements fell outside their model's own
# range): every expected gain's range reaches at least this far, within its ceiling and never
# under no gain.
MODEL_ERROR = (0.8, 1.3)


def amdahl(share: float, speedup: float) -> float:
    f = min(max(float(share), 0.0), 1.0)
    s = float(speedup)
    if s <= 0:
        raise ValueError("speed-up must be positive")
    if f >= 1.0:
        return math.inf if math.isinf(s) else s
    return 1.0 / ((1.0 - f) + (0.0 if math.isinf(s) else f / s))


def calibrated_range(expected: float, low: float | None, high: float | None,
                     ceiling: float | None) -> tuple[float, float]:
    """The expected gain's range: the model's own (low, high) widened to MODEL_ERROR around the
    expected gain, then held within [1, ceiling]."""
    lo = min(low if low is not None else expected, expected * MODEL_ERROR[0])
    hi = max(high if high is not None else expected, expected * MODEL_ERROR[1])
    return max(lo, 1.0), min(hi, ceiling if ceiling is not None else math.inf)


PRINTED_MAX = 1000.0     # a ceiling from a share above 99.9%: no share is measured that finely


def times(v: float) -> str:
    """A speed-up as printed everywhere: '1.52x', '13x' from 10x on, and '>1000x' from PRINTED_MAX
    on: a ceiling 1 / (1 - share) that large comes from a share within a tenth of a percent of the
    whole step, finer than any share here is measured (sampled, traced, inflated by the profiler),
    so its digits say nothing (pytorch/examples' regression.py read "max 14996x")."""
    return f"{v:.2f}x" if v < 10 else f"{v:.0f}x" if v < PRINTED_MAX else f">{PRINTED_MAX:.0f}x"


def describe(expected: float | None, low: float | None, high: float | None, ceiling: float | None,
             share: float, label: str, ceiling_share: float | None = None, timed: bool = False,
             unbounded: str | None = None, setting: str | None = None) -> str:
    """'expected ~1.30x (1.20-1.45x), at most 1.50x (data wait is 33.0% of each step)'; with a
    ceiling share above the share (the profiler slowed the traced steps): '... of each traced
    step, up to 41.0% of an un-profiled one' (where that reaches the whole step: 'may be nearly all
    of an un-profiled one'); `timed`: the ceiling share was timed on un-profiled
    steps: '... 37.9% of each un-profiled step (timed), 44.5% of each traced one'; `unbounded`: why
    the share bounds nothing here (gain.unbounded): 'no ceiling (why), ...'; `setting`: what the
    expected gain assumes is done (gain.expected_with): 'expected ~3.58x with 8 workers ...'."""
    cap = "no ceiling from this trace" if ceiling is None else f"at most {times(ceiling)}"
    if unbounded and ceiling is None:
        cap = f"no ceiling ({unbounded})"
    basis = f"{label} is {100 * share:.1f}% of each step"
    if share >= 1:      # the whole step: no measured share bounds it, or the label says what does
        basis = f"nothing measured bounds {label}" if ceiling is None else label
    elif timed and ceiling_share is not None:
        basis = (f"{label} is {100 * ceiling_share:.1f}% of each un-profiled step (timed), "
                 f"{100 * share:.1f}% of each traced one")
    elif ceiling_share is not None and ceiling_share > share + 0.0005:
        basis = f"{label} is {100 * share:.1f}% of each traced step, up to {100 * ceiling_share:.1f}% of an un-profiled one"
        if ceiling_share >= 0.9995:
            # the profiler slowed the traced steps so much that the share, scaled to an un-profiled
            # step, reached all of it: '65.8% ..., up to 100.0% of an un-profiled one' read as nonsense
            basis = (f"{label} is {100 * share:.1f}% of each traced step; the profiler slowed those steps "
                     "so much that it may be nearly all of an un-profiled one")
    if expected is None:
        return f"{cap}, no model of the expected gain ({basis})"
    assumes = f" {setting}" if setting else ""
    return f"expected ~{times(expected)}{assumes}{range_text(low, high)}, {cap} ({basis})"


def range_text(low: float | None, high: float | None) -> str:
    """' (1.20-1.45x)' after an expected gain, ' (1.20x or more)' without an upper end, '' where
    there is no range or its two ends print alike (not '(1.01-1.01x)')."""
    if low is None or high is None:
        return ""
    if math.isinf(high):
        return f" ({times(low)} or more)"
    return f" ({times(low)[:-1]}-{times(high)})" if high > low * 1.005 and times(low) != times(high) else ""


def combined(gains: list[float]) -> float:
    """Step speed-up of several fixes on disjoint shares: each saves 1 - 1/g of the step."""
    saved = sum(1.0 - 1.0 / g for g in gains if g and g > 0)
    return math.inf if saved >= 1.0 else 1.0 / (1.0 - saved)


def stacked(gains: dict[str, dict], pick: Callable[[dict], float | None]) -> float | None:
    """Expected step speed-up of several fixes applied together: `gains` maps each fix's slug to its
    report gain (`expected`, `range`, `overlaps`), `pick` takes the number to combine from one.
    Fixes whose shares overlap (a gain's `overlaps` names another fix) compose multiplicatively,
    the second acting on what the first leaves (their savings cannot add up: they would count the
    shared kernels twice); groups that do not overlap add their savings (combined). None when a
    number is unknown. For ceilings use combined: the union of shares is at most their sum."""
    values = {slug: pick(g or {}) for slug, g in gains.items()}
    if not values or any(v is None for v in values.values()):
        return None
    group = {slug: slug for slug in gains}

    def root(slug: str) -> str:
        while group[slug] != slug:
            slug = group[slug]
        return slug
    for slug, g in gains.items():
        for other in (g or {}).get("overlaps") or ():
            if other in group:
                group[root(other)] = root(slug)
    products: dict[str, float] = {}
    for slug, v in values.items():
        products[root(slug)] = products.get(root(slug), 1.0) * v
    return combined(list(products.values()))
