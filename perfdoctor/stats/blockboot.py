"""The moving-block bootstrap of the mean of a step series: how long its blocks must be, and
the means of its resamples. perfdoctor.stats.steptime's interval and perfdoctor.stats.speedups'
intervals are made of these (numpy only).

Block length ("blocks longer than the burst cycle"): at least 2 burst cycles (the lag of the
first significant autocorrelation peak after negative ones: a long step, short ones,
the next long one) and 2 x num_workers; at least the Politis & White (2004) automatic block
length of the block bootstrap (a periodic burst pattern cancels in the long-run
variance, so the PW length alone can be shorter than the cycle); a whole number of those 2
cycles; at most n / MIN_BLOCKS.

CI95: moving-block bootstrap of the mean (BOOTSTRAP resamples of round(n / block) blocks,
fixed seed: the same input gives the same answer); the percentiles of the resampled means
relative to their average, applied to step_s (so `end`-timestamp wall time scales with them).
A window of more than MAX_SERIES steps is resampled as the means of m = ceil(n / MAX_SERIES)
consecutive steps, in blocks of ceil(block / m) of them: blocks of consecutive steps still, at
least as long, in bounded memory (400,000 steps of a 67-minute run took 3.2 GB and 15 s).
"""

from __future__ import annotations

import math

import numpy as np

MIN_BLOCKS = 3                # blocks a window holds at least: its block length is at most n / MIN_BLOCKS
BOOTSTRAP = 2000
MAX_SERIES = 10_000           # elements one bootstrap resamples (its draws: BOOTSTRAP x n / block)


def block_length(x: np.ndarray, num_workers: int | None = None) -> tuple[int, int]:
    """(needed, used) block lengths for the block bootstrap of the mean of `x`.
    needed: 2 burst cycles and 2 x num_workers (the structure the blocks must keep whole);
    used: max(needed, the Politis-White length) rounded up to whole multiples of needed (at most
    n / MIN_BLOCKS). A window shorter than MIN_BLOCKS needed blocks is too short to tell."""
    n = len(x)
    if n < 4:
        return 1, 1
    need = max(1, 2 * (num_workers or 0))
    pw = 1
    acf = _acf(x)
    if acf is not None:
        acv, rho, cv, m_max = acf
        kn = max(5, int(math.log10(n)))
        small = np.abs(rho[1:]) < cv                 # small[k - 1]: lag k insignificant
        opt_m = next((m for m in range(0, m_max - kn + 1) if small[m:m + kn].all()), None)
        m = max(1, min(2 * max(opt_m, 1) if opt_m is not None else m_max, m_max))
        lam = np.array([1.0 if k / m <= 0.5 else 2 * (1 - k / m) for k in range(1, m + 1)])
        ks = np.arange(1, m + 1)
        g = float(np.sum(2 * lam * ks * acv[1:m + 1]))
        lr = float(acv[0] + np.sum(2 * lam * acv[1:m + 1]))
        if lr > 0:
            b_cb = (2 * g * g / (4 / 3 * lr * lr)) ** (1 / 3) * n ** (1 / 3)
            if math.isfinite(b_cb):
                pw = int(math.ceil(min(b_cb, 3 * math.sqrt(n), n)))
        need = max(need, 2 * burst_cycle(x, acf))
    cap = max(1, n // MIN_BLOCKS)
    used = need * math.ceil(max(need, pw) / need)     # whole cycles: a block cut mid-burst adds phase noise
    if used > cap:
        used = need * (cap // need) if cap >= need else cap
    return need, used


def burst_cycle(x: np.ndarray, acf=None) -> int:
    """Steps per burst cycle: short steps after a long one (negative autocorrelations), then the
    next long one (the first significant autocorrelation peak after them); 1 without bursts."""
    acf = acf if acf is not None else _acf(x)
    if acf is None:
        return 1
    _, rho, cv, m_max = acf
    for k in range(2, m_max + 1):
        if rho[k] > cv and rho[k] >= rho[k - 1] and rho[k] >= rho[k + 1] and rho[1:k].mean() < 0:
            return k
    return 1


def _acf(x: np.ndarray):
    """(autocovariances, autocorrelations up to m_max + 1, the 2 sqrt(log10(n) / n) significance
    bound, m_max = ceil(sqrt(n)) + max(5, log10 n)) of x; None for a constant or tiny series."""
    n = len(x)
    if n < 4 or float(np.ptp(x)) <= 1e-9 * abs(float(x.mean())):     # constant (rounding aside)
        return None
    acv = _autocov(x - x.mean())
    m_max = min(int(math.ceil(math.sqrt(n))) + max(5, int(math.log10(n))), n - 2)
    return acv, acv[:m_max + 2] / acv[0], 2 * math.sqrt(math.log10(n) / n), m_max


def _autocov(eps: np.ndarray) -> np.ndarray:
    n = len(eps)
    f = np.fft.rfft(eps, 2 * n)
    return np.fft.irfft(f * np.conj(f))[:n] / n


def bootstrap_means(x: np.ndarray, block: int, rng: np.random.Generator,
                    resamples: int = BOOTSTRAP, blocks: int | None = None) -> np.ndarray:
    """Means of `resamples` moving-block-bootstrap resamples of x: round(n / block) blocks of
    `block` consecutive steps (or `blocks` of them: the mean of fewer steps than x holds), each
    starting anywhere in [0, n - block] (no wrap-around: joining the end to the start would cut a
    burst cycle). Two calls with generators of one seed draw the same blocks. Over MAX_SERIES
    steps: the same over the means of m consecutive steps (module docstring)."""
    n = len(x)
    block = max(1, min(block, n))
    if n > MAX_SERIES:
        m = -(-n // MAX_SERIES)
        k = n // m
        b = -(-block // m)
        nb = None if blocks is None else max(1, int(round(blocks * block / (b * m))))
        return bootstrap_means(x[:k * m].reshape(k, m).mean(axis=1), b, rng, resamples, nb)
    k = max(1, int(round(n / block)) if blocks is None else blocks)
    c = np.concatenate([[0.0], np.cumsum(x)])
    sums = c[block:] - c[:n - block + 1]                   # sum of the block starting at each step
    starts = rng.integers(0, n - block + 1, size=(resamples, k))
    return sums[starts].sum(axis=1) / (k * block)


def relative_means(means: np.ndarray) -> np.ndarray:
    """Bootstrap means relative to their own average: the moving-block bootstrap under-weights
    the window's ends, so its spread is used around the point estimate, not its centre."""
    m = float(means.mean())
    return means / m if m > 0 else np.ones_like(means)
