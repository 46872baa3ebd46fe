"""The step-time estimator (perfdoctor/stats/steptime.py) on step series with known truth:
bursty loaders (periodic and simulated), drift, unimodal noise, warm-up, prefetch fill and the
profiled window. Fixed seeds throughout."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from perfdoctor.stats import StepEstimate, estimate, estimate_durations, speedup, wait_share_change
from perfdoctor.stats.blockboot import block_length
from perfdoctor.stats.steptime import left_out_text, ms

NOISE = 0.10                        # log-normal jitter: E[exp(N(0, s))] = exp(s^2 / 2)
MEAN_JITTER = float(np.exp(NOISE ** 2 / 2))


def loader_sim(rng, n, workers=3, load=0.3, compute=0.01, setup=0.0, prefetch=2):
    """A trainer fed by `workers` DataLoader workers that take `load` s per batch (log-normal
    jitter): worker w makes batches w, w + W, ... in order, at most `prefetch` batches ahead of
    what the trainer consumed. The trainer computes `compute` s per step and starts after
    `setup` s. Load-bound: the truth is load x E[jitter] / workers per step, and the batches
    arrive in bursts of `workers`. Returns (durations, waits)."""
    t_load = load * rng.lognormal(0, NOISE, n)
    ready, end = np.zeros(n), np.zeros(n)
    prev = setup
    for j in range(n):
        start = ready[j - workers] if j >= workers else 0.0
        if j >= workers * prefetch:
            start = max(start, end[j - workers * prefetch] - compute)
        ready[j] = start + t_load[j]
        end[j] = max(prev, ready[j]) + compute
        prev = end[j]
    durs = np.diff(np.concatenate([[setup], end]))
    return durs, durs - compute


def records(durs, waits=None, **flags):
    waits = np.zeros(len(durs)) if waits is None else waits
    return [{"step": i + 1, "dur": float(d), "wait": float(w), "batches": 1, "mode": "optimizer",
             "profiled": False, "perturbed": False} for i, (d, w) in enumerate(zip(durs, waits))]


def bursty(rng, n=300, k=3, short=0.02, long=0.34):
    """k short steps then one long, repeated, with jitter: truth = (k short + long) / (k + 1)."""
    pattern = np.array([short] * k + [long])
    return np.tile(pattern, n // len(pattern) + 1)[:n] * rng.lognormal(0, NOISE, n), \
        float(pattern.mean()) * MEAN_JITTER


# --- known truth --------------------------------------------------------------------------------

def test_bursty_mean_is_the_truth_and_the_median_is_not():
    rng = np.random.default_rng(0)
    x, truth = bursty(rng)
    e = estimate_durations(x)
    assert e.conclusive and e.n == 296 and e.dropped == {"warmup": 2, "partial_cycle": 2}   # whole cycles of 4
    assert e.step_s == pytest.approx(float(x[2:298].mean()), rel=1e-12)    # wall time / steps, no long step dropped
    assert e.step_s == pytest.approx(truth, rel=0.05)
    assert e.ci95[0] <= truth <= e.ci95[1]
    assert e.median_s < 0.3 * truth                                          # the median is a short step
    assert e.block >= 8                                                      # at least 2 burst cycles of 4


def test_simulated_loader_3_workers():
    rng = np.random.default_rng(1)
    d, w = loader_sim(rng, 400)
    truth = 0.3 * MEAN_JITTER / 3
    e = estimate(records(d, w))
    assert e.step_s == pytest.approx(truth, rel=0.05) and e.ci95[0] <= truth <= e.ci95[1]
    assert e.median_s < 0.75 * truth
    window = slice(e.first, e.first + e.n)
    assert e.n >= 396 and set(e.dropped) <= {"warmup", "partial_cycle"}
    assert e.wait_share == pytest.approx(float(w[window].sum() / d[window].sum()), rel=1e-9) and e.wait_share > 0.85


@pytest.mark.parametrize("kind", ["unimodal", "bursty", "loader", "drift", "random walk"])
def test_ci_covers_the_truth(kind):
    """Coverage of the 95% CI over 60 seeds: at least 88% (binomial sd of 95% over 60 is ~2.8%)."""
    hits, conclusive = 0, 0
    for seed in range(60):
        rng = np.random.default_rng(1000 + seed)
        n = 300
        if kind == "unimodal":
            x, truth = 0.1 * rng.lognormal(0, NOISE, n), 0.1 * MEAN_JITTER
        elif kind == "bursty":
            x, truth = bursty(rng, n)
        elif kind == "loader":
            x, _ = loader_sim(rng, n + 40)
            x, truth = x[40:], 0.1 * MEAN_JITTER
        elif kind == "drift":                 # 30% slower by the end: the truth is the window's mean level
            level = 0.1 * (1 + 0.3 * np.arange(n) / n)
            x, truth = level * rng.lognormal(0, NOISE, n), float(level[2:].mean()) * MEAN_JITTER
        else:                                 # a slowly wandering level
            level = 0.1 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
            x, truth = level * rng.lognormal(0, NOISE, n), float(level[2:].mean()) * MEAN_JITTER
        e = estimate_durations(x)
        hits += e.ci95[0] <= truth <= e.ci95[1]
        conclusive += e.conclusive
        if kind == "drift":                   # a drift is kept, not cut off as a transient
            assert e.dropped == {"warmup": 2}, e.dropped
    assert hits >= 53, hits
    assert conclusive == 60


def test_unimodal_ci_is_tight_and_iid_blocks_are_short():
    rng = np.random.default_rng(2)
    e = estimate_durations(0.1 * rng.lognormal(0, 0.05, 500))
    assert e.block <= 3
    assert (e.ci95[1] - e.ci95[0]) / e.step_s < 0.02
    assert e.median_s == pytest.approx(e.step_s, rel=0.02)                   # no burst: both agree


def test_warmup_transient_is_detected():
    rng = np.random.default_rng(3)
    x = 0.1 * rng.lognormal(0, 0.05, 300)
    x[:30] *= 1 + 3 * np.exp(-np.arange(30) / 6)      # 4x at the start, decaying
    x[0] = 5.0                                         # lazy initialisation in the first step
    e = estimate_durations(x)
    assert 12 <= e.dropped["warmup"] <= 40 and e.first == e.dropped["warmup"]
    assert e.step_s == pytest.approx(0.1 * np.exp(0.05 ** 2 / 2), rel=0.01)
    everything = float(x.mean())
    assert everything > 1.2 * e.step_s                  # what a mean over every step would say


def test_prefetch_fill_is_dropped_with_num_workers():
    rng = np.random.default_rng(4)
    d, w = loader_sim(rng, 300, workers=3, setup=1.0)  # 6 batches wait ready after a 1 s setup
    assert (d[:6] < 0.02).all() and d[6] > 0.2
    e = estimate(records(d, w), num_workers=3)
    assert e.dropped == {"warmup": 2, "prefetch_fill": 4} and e.first == 6
    e4 = estimate(records(d, w), num_workers=3, prefetch_factor=4)   # 12 batches could have waited:
    assert e4.first == 6                                             # only the fast ones are dropped
    blind = estimate(records(d, w))                     # without num_workers: a fast start, cut in
    assert blind.first >= 6 and blind.dropped["fast_start"] % 3 == 0    # whole burst cycles
    assert blind.step_s == pytest.approx(e.step_s, rel=0.03)


def test_profiled_window_and_export_are_excluded():
    rng = np.random.default_rng(5)
    d, w = loader_sim(rng, 300)
    recs = records(d, w)
    for i in range(5, 11):
        recs[i]["profiled"] = True
        recs[i]["dur"] *= 3
    recs[11]["perturbed"] = True
    recs[11]["dur"] += 0.5
    e = estimate(recs, num_workers=3)
    assert e.dropped == {"warmup": 2, "outside_window": 3, "profiled": 6, "perturbed": 1}    # 288: whole cycles
    assert e.first == 12 and e.n == 288
    assert e.step_s == pytest.approx(float(d[12:].mean()), rel=1e-12)
    assert "6 profiled" in e.describe() and "1 perturbed" in e.describe()
    # what reports print beside the steady count, most first; a hand-edited report's junk says nothing
    assert left_out_text(e.dropped) == ("6 profiled, 3 outside the longest undisturbed run, 2 warm-up, "
                                        "1 after the trace export")
    assert left_out_text({"warmup": True, "x": 3, "profiled": -1}) is None and left_out_text("2 warm-up") is None


def test_wall_time_from_end_timestamps():
    """end[last] - end[first - 1] when the timestamps agree with the durations (here 1 ms of
    bookkeeping between steps), else the sum of durations (a clock jump)."""
    rng = np.random.default_rng(6)
    d = 0.1 * rng.lognormal(0, 0.05, 100)
    recs = records(d)
    t = 1000.0
    for r in recs:
        t += r["dur"] + 0.001
        r["end"] = t
    e = estimate(recs)
    assert e.source == "end timestamps"
    assert e.step_s == pytest.approx((recs[-1]["end"] - recs[1]["end"]) / 98, rel=1e-12)
    assert e.step_s == pytest.approx(float(d[2:].mean()) + 0.001, rel=1e-9)
    assert e.ci95[0] < e.step_s < e.ci95[1] and e.ci95[0] > float(d[2:].mean()) - 0.002
    for r in recs[50:]:                                   # the clock jumped: fall back to the durations
        r["end"] += 3600
    jumped = estimate(recs)
    assert jumped.source == "durations" and jumped.step_s == pytest.approx(float(d[2:].mean()))


def test_inconclusive_and_empty():
    e = estimate_durations([0.1] * 8)
    assert not e.conclusive and "only 6 steady steps" in e.reason and e.step_s == pytest.approx(0.1)
    none = estimate([{"dur": 0.1, "profiled": True}] * 5)
    assert none.step_s is None and none.n == 0 and not none.conclusive
    assert "no steady" in none.describe()
    assert estimate([]).total == 0
    # 32 steps of a burst cycle of 6: blocks of 2 cycles fit fewer than 3 times
    x, _ = bursty(np.random.default_rng(7), 32, k=5)
    e = estimate_durations(x)
    assert e.conclusive is False and "correlated over" in e.reason and e.n == 30


def test_whole_burst_cycles_remove_the_phase_bias():
    """A strict burst of 3 (one 0.3 s step, two instant ones): 100.3 ms/step whatever the
    window's length; the 31 steps after the warm-up hold only 10 long ones (97.1 ms/step)."""
    x = np.tile([0.3, 0.0005, 0.0005], 11) + 1e-6 * np.random.default_rng(14).random(33)
    truth = 0.301 / 3 + 0.5e-6
    e = estimate_durations(x)
    assert e.dropped == {"warmup": 2, "partial_cycle": 1} and e.n == 30
    assert e.step_s == pytest.approx(truth, rel=1e-4) and e.ci95[1] - e.ci95[0] < 1e-3 * truth
    assert float(x[2:].mean()) < 0.98 * truth


def test_deterministic():
    rng = np.random.default_rng(8)
    x, _ = bursty(rng)
    a, b = estimate_durations(x), estimate_durations(x)
    assert a.ci95 == b.ci95 and a.block == b.block


def test_block_length_covers_the_burst_cycle():
    rng = np.random.default_rng(9)
    for k in (2, 3, 5):
        x, _ = bursty(rng, 400, k=k)
        want, used = block_length(x)
        assert used >= 2 * (k + 1), (k, used)
    assert block_length(np.full(50, 0.1))[1] == 1
    assert block_length(0.1 * rng.lognormal(0, 0.1, 50), num_workers=4)[1] >= 8


# --- comparisons ----------------------------------------------------------------------------------

def test_speedup_of_bursty_runs_follows_the_means_not_the_medians():
    """The issue's case: the 2-worker run is truly ~15% faster yet has the longer median."""
    rng = np.random.default_rng(10)
    slow, _ = loader_sim(rng, 400, workers=3, load=0.36)      # 120 ms/step, median ~10 ms
    fast, _ = loader_sim(rng, 400, workers=2, load=0.21)      # 105 ms/step, median ~100 ms
    e_slow, e_fast = estimate_durations(slow), estimate_durations(fast)
    assert e_fast.median_s > 2 * e_slow.median_s
    s, (lo, hi) = speedup(slow, fast)
    assert s == pytest.approx(e_slow.step_s / e_fast.step_s) and s == pytest.approx(120 / 105, rel=0.04)
    assert 1 < lo < s < hi
    back, (blo, bhi) = speedup(e_fast, e_slow)                 # a StepEstimate works too
    assert back == pytest.approx(1 / s) and bhi < 1


def test_speedup_of_the_same_process_covers_1():
    misses = 0
    for seed in range(40):
        rng = np.random.default_rng(300 + seed)
        a, b = loader_sim(rng, 300)[0], loader_sim(rng, 300)[0]
        _, (lo, hi) = speedup(records(a), records(b))
        misses += not lo <= 1 <= hi
    assert misses <= 4


def test_wait_share_change():
    rng = np.random.default_rng(11)
    d0 = 0.1 * rng.lognormal(0, 0.05, 200)
    d1 = 0.1 * rng.lognormal(0, 0.05, 200)
    w0, w1 = d0 * rng.uniform(0.05, 0.15, 200), d1 * rng.uniform(0.25, 0.35, 200)
    diff, (lo, hi) = wait_share_change(records(d0, w0), records(d1, w1))
    assert diff == pytest.approx(0.2, abs=0.01) and 0.18 < lo < diff < hi < 0.22
    same, (lo, hi) = wait_share_change(records(d0, w0), records(d1, d1 * rng.uniform(0.05, 0.15, 200)))
    assert lo < 0 < hi


def test_api_shape_and_no_torch():
    e = estimate_durations([0.1, 0.2] * 20)
    assert isinstance(e, StepEstimate)
    assert set(e.to_dict()) >= {"step_s", "ci95", "median_s", "n", "total", "first", "dropped", "wait_share",
                                "block", "conclusive", "reason"}
    code = "import sys, perfdoctor.stats; assert 'torch' not in sys.modules and 'scipy' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_step_times_print_with_three_significant_figures():
    """A sub-millisecond step no longer reads '0.3 ms'; an interval prints with its estimate's decimals."""
    assert [ms(v) for v in (193.64, 24.06, 1.234, 0.3123, 0.03123, 0.0)] == ["193.6", "24.1", "1.23", "0.312", "0.0312",
                                                                             "0.0"]
    assert (ms(0.30994, like=0.3123), ms(1.2, like=0.3123)) == ("0.310", "1.200")
    # from a second up, no decimal (a user trial read '7820.8 ms/step (95% CI 4386.5-12798.3)')
    assert (ms(7820.8), ms(4386.5, like=7820.8), ms(12798.3, like=7820.8), ms(999.94)) == ("7821", "4386", "12798", "999.9")
    e = estimate_durations(np.full(40, 0.0003123))
    assert e.describe().startswith("0.312 ms/step") and "median 0.312 ms" in e.describe()


def test_run_to_run_spread_widens_a_two_run_interval():
    from perfdoctor.stats.speedups import run_spread, with_run_spread
    assert run_spread([0.1]) is None and run_spread([]) is None
    assert run_spread([0.1, 0.1, 0.1]) == 0.0
    # two runs: |log ratio| / sqrt(2); not robust on purpose (a third run that agrees with one of
    # them does not make the other vanish, as a MAD would)
    assert run_spread([0.1067, 0.1676]) == pytest.approx(math.log(0.1676 / 0.1067) / math.sqrt(2))
    assert run_spread([0.1067, 0.1676, 0.1676]) > 0.2
    assert with_run_spread(0.7, (0.66, 0.74), None) == (0.66, 0.74)
    lo, hi = with_run_spread(1.0, (1.0, 1.0), 0.1)                  # spread alone: z * sqrt(2) * sigma
    assert math.log(hi) == pytest.approx(1.959964 * math.sqrt(2) * 0.1, rel=1e-4) and lo == pytest.approx(1 / hi)
    lo, hi = with_run_spread(1.2, (1.1, 1.25), 0.02)                # in quadrature, each side its own
    w = 1.959964 * math.sqrt(2) * 0.02
    assert math.log(1.2 / lo) == pytest.approx(math.hypot(math.log(1.2 / 1.1), w), rel=1e-4)
    assert math.log(hi / 1.2) == pytest.approx(math.hypot(math.log(1.25 / 1.2), w), rel=1e-4)


def test_an_inconclusive_step_time_says_why_in_the_run_line():
    """Lightning, an evaluation every 10 steps in 60: 40 steady steps, a burst cycle of 10. The
    run line said '(too few to tell)' after its 95% CI, which left a reader asking: too few of
    what? It gives the estimate's reason."""
    from perfdoctor.report.terminal import _run_steps_line
    from perfdoctor.stats.steptime import inconclusive_text
    durs = [0.05 if i % 10 == 9 else 0.012 for i in range(40)]
    recs = [{"step": i + 1, "dur": d, "wait": 0.0, "batches": 10 if d > 0.02 else 2} for i, d in enumerate(durs)]
    e = estimate(recs)
    assert not e.conclusive and e.reason
    m = {"run.steps": 40, "run.step_time_ms": 1e3 * e.step_s, "run.step_time_ci95_ms": None,
         "run.steady_steps": e.n, "run.step_time_conclusive": e.conclusive}
    line = _run_steps_line(m, 10.0, None, None, e.reason)
    assert line.endswith(f" steady steps (inconclusive: {e.reason})"), line
    assert "too few to tell" not in line
    # a run.json from an older perfdoctor has no reason: the old words; a hand-edited one's junk too
    assert _run_steps_line(m, 10.0).endswith(" (too few to tell)")
    assert inconclusive_text(3) == inconclusive_text("") == " (too few to tell)"
    assert inconclusive_text("only 6 steady steps (need 10)") == " (inconclusive: only 6 steady steps (need 10))"


def test_the_run_line_says_when_a_step_holds_several_backward_passes():
    """Gradient accumulation over 8 micro-batches (a user trial): the step is the optimizer step,
    8 forward/backward passes, 8x the script's own time per micro-batch; the line says so. One
    backward pass a step, or none counted, adds nothing."""
    from perfdoctor.report.labels import passes_text
    from perfdoctor.report.terminal import _run_steps_line
    m = {"run.steps": 59, "run.step_time_ms": 764.0, "run.step_time_ci95_ms": None, "run.steady_steps": 47,
         "run.step_time_conclusive": True, "loop.backward_passes_per_step": 8}
    assert _run_steps_line(m, 56.0).startswith("60 steps (8 backward passes a step), 59 timed, in a 56.0 s run: 764.0 ms/step")
    line = _run_steps_line(m, 56.0, None, "backward passes (a step from one gradient reset to the next)")
    assert line.startswith("60 steps of backward passes (a step from one gradient reset to the next) "
                           "(8 backward passes a step), 59 timed, in a 56.0 s run")
    for n in (1, 0, None, True, "8"):
        assert passes_text({"loop.backward_passes_per_step": n}) == "", n
        assert _run_steps_line({**m, "loop.backward_passes_per_step": n}, 56.0).startswith("60 steps, 59 timed, in a 56.0 s run")


def test_no_prefetch_fill_without_loader_batches():
    # A trainer with no DataLoader whose preprocessing runs in a multiprocessing Pool: the
    # samplers count the pool's 2 processes as workers, but its steps draw no loader batch
    # ("batches": 0), so none of them is a prefetched one, however short it is.
    rng = np.random.default_rng(11)
    d = 0.2 * rng.lognormal(0, 0.3, 120)
    d[2:12] = 0.12                                     # short early steps, below the level
    recs = [{**r, "batches": 0} for r in records(d)]
    e = estimate(recs, num_workers=2)
    assert "prefetch_fill" not in e.dropped and e.first == 2
    with_loader = estimate(records(d), num_workers=2)  # the same series drawing a batch a step
    assert with_loader.dropped["prefetch_fill"] == 2 and with_loader.first == 4


def test_a_long_window_is_resampled_in_bounded_memory_with_the_same_interval(monkeypatch):
    """Over MAX_SERIES steps the bootstrap resamples the means of m consecutive steps in blocks
    of ceil(block / m) of them: the interval of 40,000 bursty steps is the exact bootstrap's, and
    100,000 steps of blocks of one are drawn in a tenth of the memory (400,000 steps of a
    67-minute run took 3.2 GB)."""
    import tracemalloc

    from perfdoctor.stats import blockboot
    rng = np.random.default_rng(1)
    bursty = 0.01 + 0.002 * rng.standard_normal(40_000)
    bursty[::5] += 0.01                                  # a burst every 5 steps
    flat = 0.01 + 0.002 * rng.standard_normal(100_000)
    _, block = block_length(bursty)
    assert block >= 10                                   # 2 burst cycles at least

    def interval(x, block: int, resamples: int) -> tuple[float, int]:
        tracemalloc.start()
        means = blockboot.bootstrap_means(x, block, np.random.default_rng(7), resamples)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        lo, hi = np.percentile(blockboot.relative_means(means), [2.5, 97.5])
        return hi - lo, peak
    width, _ = interval(bursty, block, 2000)
    _, peak = interval(flat, 1, 100)
    monkeypatch.setattr(blockboot, "MAX_SERIES", 10 ** 9)
    exact, _ = interval(bursty, block, 2000)
    _, exact_peak = interval(flat, 1, 100)
    print(f"95% width {width:.5f} vs exact {exact:.5f}; peak {peak / 2**20:.1f} vs {exact_peak / 2**20:.1f} MiB")
    assert width == pytest.approx(exact, rel=0.15)
    assert peak < exact_peak / 5


def test_a_short_window_drops_a_leading_level_it_never_returns_to():
    """15 steps of a 0.6 ms script whose first steps its start-up slowed (88, 88, 88, 48 ms, half
    of each waiting for a core, as `perfdoctor run --max-steps 15` recorded): too few for blocks,
    and kept they made it 11.2 ms/step and an unchanged rerun a 23x regression. Those leading
    steps each outlast every later one: a transient. A burst's long steps come back, and stay."""
    slow = [0.0877, 0.0877, 0.0880, 0.0480, 0.0018]
    rng = np.random.default_rng(3)
    fast = list(rng.uniform(0.00059, 0.00077, 10))
    e = estimate([{"dur": d} for d in slow + fast])
    assert e.dropped == {"warmup": 5} and e.n == 10 and e.conclusive
    assert e.step_s == pytest.approx(np.mean(fast))
    # a loader that bursts: every third step waits; nothing but the run's first two steps leaves
    bursty = [0.1, 0.001, 0.001] * 5
    e = estimate([{"dur": d} for d in bursty])
    assert e.dropped.get("warmup") == 2 and e.step_s > 0.03
    # noise around one level: only the first two steps (warm-up by rule)
    e = estimate([{"dur": d} for d in rng.normal(0.01, 0.0005, 14)])
    assert e.dropped == {"warmup": 2}
