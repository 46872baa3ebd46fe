"""Speed-ups between runs: one comparison of two steady windows, the run-to-run spread, and the
interval of a speed-up measured in one run or in two (`perfdoctor tune`). Step times and their
within-run intervals come from perfdoctor.stats.steptime, the one estimator.

- speedup / wait_share_change: base over new step time, and the change of the data-wait share,
  each with its interval from independent block bootstraps of the two steady windows (compare,
  gate, tune).
- spread: the scaled MAD of several runs' step times (gate's several baselines).

- run_spread: the sample standard deviation of the log step times of a command's runs.
- with_run_spread: a speed-up interval widened by that spread (two runs of one command differ by
  more than either run's interval on a shared machine).
- two_runs: one speed-up from two independent runs of the same comparison (each against its own
  fresh baseline): the inverse-variance weighted mean of their log speed-ups (a fixed-effect
  mean of two estimates), only when the two intervals overlap: runs that disagree beyond their
  intervals show noise the intervals did not hold, and then the interval spans both instead.
  The first run of tune's best setting was picked as the fastest of several, so its estimate
  leans high: whether the setting is confirmed is the second run's to say (tune/session.py), this
  is the estimate reported.
"""

from __future__ import annotations

import math

import numpy as np

from perfdoctor.stats.steptime import (LEVEL, MAD_SCALE, SEED, StepEstimate, bootstrap_means, estimate,
                                       estimate_durations, relative_means)


def run_spread(step_times) -> float | None:
    """Run-to-run spread of one command: the sample standard deviation of the log step times of
    its runs (relative; two runs give |log ratio| / sqrt(2)). Not a robust spread: with the few
    runs a tune makes, a MAD ignores the one run that differs, which is the noise to allow for.
    None for fewer than two runs."""
    x = np.asarray([v for v in step_times if v and v > 0], dtype=float)
    return float(np.std(np.log(x), ddof=1)) if len(x) >= 2 else None


def with_run_spread(point: float, ci: tuple[float, float], sigma: float | None,
                    level: float = LEVEL) -> tuple[float, float]:
    """A two-run speed-up interval that also spans the run-to-run spread `sigma`: each side's
    half-width (log scale) added in quadrature to z x sqrt(2) x sigma, the difference between two
    runs of one command (each run has its own offset). Unchanged without a spread."""
    if not sigma:
        return ci
    from statistics import NormalDist
    w = NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(2) * sigma
    lo = point * math.exp(-math.hypot(math.log(point / ci[0]), w))
    hi = point * math.exp(math.hypot(math.log(ci[1] / point), w))
    return float(lo), float(hi)


def two_runs(r1: float, ci1: tuple[float, float], r2: float, ci2: tuple[float, float]) -> tuple[float, tuple[float, float], bool]:
    """(speed-up, 95% interval, consistent) of two runs' speed-ups and intervals (module docstring):
    when the intervals overlap (consistent), the inverse-variance weighted mean of the two log
    speed-ups and its interval (half-width 1 / sqrt(1/h1^2 + 1/h2^2)); else the geometric mean and
    an interval that spans both."""
    consistent = ci1[0] <= ci2[1] and ci2[0] <= ci1[1]
    if not consistent:
        return math.sqrt(r1 * r2), (min(ci1[0], ci2[0]), max(ci1[1], ci2[1])), False
    h = [max((math.log(hi) - math.log(lo)) / 2, 1e-9) for lo, hi in (ci1, ci2)]
    w = [1 / x ** 2 for x in h]
    mid = (w[0] * math.log(r1) + w[1] * math.log(r2)) / sum(w)
    half = 1 / math.sqrt(sum(w))
    return float(math.exp(mid)), (float(math.exp(mid - half)), float(math.exp(mid + half))), True


# --- one comparison: two steady windows -------------------------------------------------------

def _as_estimate(x) -> StepEstimate:
    if isinstance(x, StepEstimate):
        return x
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], dict):
        return estimate(list(x))
    return estimate_durations(x)


def speedup(base, new, level: float = LEVEL) -> tuple[float, tuple[float, float]]:
    """base.step_s / new.step_s and its `level` CI from independent block bootstraps of the two
    steady windows (each with its own block length; fixed seeds). base and new: step records,
    a StepEstimate, or a plain series of durations."""
    b, n = _as_estimate(base), _as_estimate(new)
    if not b.step_s or not n.step_s or b.n < 2 or n.n < 2:
        raise ValueError("speedup needs a steady step time on both sides")
    rb = relative_means(bootstrap_means(b.durs, b.block, np.random.default_rng([SEED, 1])))
    rn = relative_means(bootstrap_means(n.durs, n.block, np.random.default_rng([SEED, 2])))
    point = b.step_s / n.step_s
    lo, hi = point * np.percentile(rb / rn, [50 * (1 - level), 100 - 50 * (1 - level)])
    return point, (float(min(lo, point)), float(max(hi, point)))


def wait_share_change(base, new, level: float = LEVEL) -> tuple[float, tuple[float, float]]:
    """new.wait_share - base.wait_share (data wait / wall time of the steady windows) and its
    `level` CI from independent block bootstraps of (wait, duration) pairs."""
    b, n = _as_estimate(base), _as_estimate(new)
    if b.wait_share is None or n.wait_share is None or b.n < 2 or n.n < 2:
        raise ValueError("wait_share_change needs a steady window on both sides")

    def deviations(e: StepEstimate, seed: int) -> np.ndarray:
        w = bootstrap_means(e.waits, e.block, np.random.default_rng([SEED, seed]))
        d = bootstrap_means(e.durs, e.block, np.random.default_rng([SEED, seed]))   # same blocks
        share = w / (d * e.scale)
        return share - share.mean()

    point = n.wait_share - b.wait_share
    lo, hi = point + np.percentile(deviations(n, 4) - deviations(b, 3), [50 * (1 - level), 100 - 50 * (1 - level)])
    return point, (float(min(lo, point)), float(max(hi, point)))


def spread(values) -> float:
    """Scaled MAD (1.4826 x median absolute deviation: the standard deviation for normal noise)."""
    x = np.asarray(values, dtype=float)
    return MAD_SCALE * float(np.median(np.abs(x - np.median(x)))) if len(x) else 0.0
