"""Speed-ups between runs: one comparison of two steady windows, the run-to-run spread, and the
interval of a speed-up measured in one run or in two (`perfdoctor tune`). Step times and their
within-run intervals come from perfdoctor.stats.steptime, the one estimator.

- speedup / wait_share_change: base over new step time, and the change of the data-wait share,
  each with its interval from independent block bootstraps of the two steady windows (compare,
  gate, tune). speedup's interval pairs the two runs by step number instead where the caller
  says step n does the same work in both (`by_step`: tune, and compare and gate for runs of
  one command) and the windows share enough step numbers (paired_means): a multi-scale CNN
  whose seeded image sizes make steps 4x apart repeats that spread step for step in every run,
  and an independent bootstrap counts it as noise (1.10x [0.94, 1.31] on an H200 whose three
  baseline runs agreed within 0.2%).
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

from perfdoctor.stats.blockboot import BOOTSTRAP, MIN_BLOCKS, block_length, bootstrap_means, relative_means
from perfdoctor.stats.steptime import LEVEL, MAD_SCALE, MIN_STEPS, SEED, StepEstimate, estimate, estimate_durations


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


def pooled(runs) -> StepEstimate:
    """Several runs of one command as one window: their steady windows end to end, re-estimated
    (tune's baselines before and after a trial); one run as it is."""
    runs = list(runs)
    if len(runs) == 1:
        return runs[0]
    return estimate_durations(np.concatenate([r.durs * r.scale for r in runs]),
                              np.concatenate([r.waits for r in runs]))


def speedup(base, new, level: float = LEVEL, *, by_step: bool = False) -> tuple[float, tuple[float, float]]:
    """base.step_s / new.step_s and its `level` CI (fixed seeds). base and new: step records, a
    StepEstimate, or a plain series of durations; base may also be a list of StepEstimates,
    several runs of the baseline, pooled end to end (`pooled`).

    The interval: independent block bootstraps of the two steady windows (each with its own block
    length), unless `by_step` and the windows share enough step numbers (`paired_means`): then
    the common steps are resampled in the same blocks of step numbers on both sides, so work that
    repeats step for step (image sizes drawn from a seeded generator, an evaluation every 50
    steps) cancels instead of counting as noise. `by_step` is the caller's word that step n does
    the same work in both runs: the same script with the same data order (tune: one command, run
    again). Where it does not, pairing costs nothing but is no help either: step-aligned
    differences that do not repeat are independent, and the interval stays as wide."""
    runs = list(base) if isinstance(base, (list, tuple)) and base and all(isinstance(x, StepEstimate) for x in base) \
        else None
    b, n = (pooled(runs) if runs else _as_estimate(base)), _as_estimate(new)
    if not b.step_s or not n.step_s or b.n < 2 or n.n < 2:
        raise ValueError("speedup needs a steady step time on both sides")
    pair = paired_means(runs or [b], n) if by_step else None
    if pair is not None:
        rb, rn = relative_means(pair[0]), relative_means(pair[1])
    else:
        rb = relative_means(bootstrap_means(b.durs, b.block, np.random.default_rng([SEED, 1])))
        rn = relative_means(bootstrap_means(n.durs, n.block, np.random.default_rng([SEED, 2])))
    point = b.step_s / n.step_s
    lo, hi = point * np.percentile(rb / rn, [50 * (1 - level), 100 - 50 * (1 - level)])
    return point, (float(min(lo, point)), float(max(hi, point)))


def common_steps(runs, new: StepEstimate) -> np.ndarray | None:
    """The step numbers in the steady window of `new` and of every run in `runs`, as the longest
    run of consecutive numbers (the bootstrap's blocks are consecutive steps); None when a window
    has no step numbers or repeats one."""
    ids = None
    for e in [*runs, new]:
        s = np.asarray(e.step_ids)
        if len(s) != len(e.durs) or len(s) == 0 or len(np.unique(s)) != len(s):
            return None
        ids = s if ids is None else np.intersect1d(ids, s)
    ids = np.unique(ids)
    if len(ids) == 0:
        return ids
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return max(np.split(ids, cuts), key=len)


def min_common(runs, new: StepEstimate) -> int:
    """Common steps a paired bootstrap needs: MIN_BLOCKS blocks of the longest block any of the
    windows needs (the estimator's own rule for a conclusive window), and MIN_STEPS."""
    return max(MIN_STEPS, MIN_BLOCKS * max(e.block for e in [*runs, new]))


def paired_means(runs, new: StepEstimate, resamples: int = BOOTSTRAP) -> tuple[np.ndarray, np.ndarray] | None:
    """Bootstrap means of the baseline (`runs`, pooled) and of `new`, paired by step number; None
    when they share fewer than `min_common` consecutive step numbers (then: independent bootstraps).

    Each side's mean is split as the point estimate is: its steps at the common step numbers, and
    the rest (`extra`: a faster trial runs more steps in the same time; another run's warm-up
    ended a few steps later). The common part is one series per side (the baseline's: the mean of
    its runs at each step number), resampled in the same blocks of step numbers on both sides,
    with blocks as long as the longest any window needs and the Politis-White length of the
    paired relative difference. The extra steps are unmatched work: their mean is resampled as the
    mean of as many steps drawn in blocks from that side's own window, independently of the other
    side, so the interval holds what the point estimate leaves unpaired."""
    common = common_steps(runs, new)
    if common is None or len(common) < min_common(runs, new):
        return None
    base = [(r.durs * r.scale, np.isin(r.step_ids, common)) for r in runs]
    xb = np.mean([d[m][np.argsort(r.step_ids[m])] for (d, m), r in zip(base, runs)], axis=0)
    mn = np.isin(new.step_ids, common)
    xn = (new.durs * new.scale)[mn][np.argsort(new.step_ids[mn])]
    _, pw = block_length(xb / xb.mean() - xn / xn.mean())
    block = max(pw, *(e.block for e in [*runs, new]))
    cb = bootstrap_means(xb, block, np.random.default_rng([SEED, 5]), resamples)
    cn = bootstrap_means(xn, block, np.random.default_rng([SEED, 5]), resamples)     # the same blocks
    eb = np.concatenate([d[~m] for d, m in base])
    whole_b = np.concatenate([d for d, _ in base])
    bmean = _with_extra(cb, len(runs) * len(common), len(eb), whole_b, max(r.block for r in runs), 6, resamples)
    nmean = _with_extra(cn, len(common), int((~mn).sum()), new.durs * new.scale, new.block, 7, resamples)
    return bmean, nmean


def _with_extra(common: np.ndarray, m: int, e: int, window: np.ndarray, block: int, seed: int,
                resamples: int) -> np.ndarray:
    """Resampled means of a side: (m steps at the common means + e extra steps at means of e
    steps drawn in blocks from its window) / (m + e)."""
    if e == 0:
        return common
    k = max(1, int(round(e / max(1, min(block, len(window))))))
    extra = bootstrap_means(window, block, np.random.default_rng([SEED, seed]), resamples, blocks=k)
    return (m * common + e * extra) / (m + e)


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
