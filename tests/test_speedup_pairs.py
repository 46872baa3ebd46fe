"""The speed-up interval paired by step number (perfdoctor/stats/speedups.py, `by_step`): runs
of one script whose steps do different work (image sizes drawn from a seeded generator, so the
same size at the same step in every run), and runs whose step-to-step variation does not
repeat. Fixed seeds throughout; the truth is known (the trial's factor)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from perfdoctor.stats.speedups import common_steps, min_common, paired_means, speedup
from perfdoctor.stats.steptime import estimate, estimate_durations


def sizes_work(seed: int, n: int) -> np.ndarray:
    """Seconds per step of a multi-scale CNN: image side 96..224 px drawn per step from a seeded
    generator (the same sequence in every run), time proportional to the pixels (5.4x apart)."""
    side = np.random.default_rng(seed).integers(96, 225, n)
    return 0.2 * (side / 224.0) ** 2


def run(work: np.ndarray, noise_seed: int, factor: float = 1.0, noise: float = 0.02,
        first: int = 0, last: int | None = None):
    """One run's estimate: the work of steps first..last-1 times `factor`, with log-normal noise
    of its own (not repeated by another run); records carry their step numbers."""
    d = work * factor * np.random.default_rng(noise_seed).lognormal(0, noise, len(work))
    return estimate([{"step": i, "dur": float(x)} for i, x in enumerate(d)][first:last])


def width(ci) -> float:
    """An interval's width on the log scale (a speed-up's interval is multiplicative)."""
    return float(np.log(ci[1] / ci[0]))


def test_a_seeded_variable_workload_pairs_to_a_clear_speedup():
    """The H200 case: 65 steady baseline steps, a 10% faster trial (more steps in the same
    time). The independent bootstrap counts the 5x spread of the image sizes as noise and
    reaches 1; paired by step number the spread cancels and the interval excludes 1, and it
    holds the true 1.10."""
    w = sizes_work(1, 120)
    base, trial = run(w, 10, last=67), run(w, 11, 1 / 1.10, last=75)
    assert base.n == 65 and trial.n == 73
    point, indep = speedup(base, trial)
    same, paired = speedup(base, trial, by_step=True)
    assert same == point == pytest.approx(base.step_s / trial.step_s)      # the point estimate stays
    assert indep[0] < 1 < indep[1]
    assert 1 < paired[0] <= 1.10 <= paired[1]
    assert width(paired) < 0.6 * width(indep)
    # two baseline runs, averaged at each step number, pair the same way
    again = run(w, 12, last=67)
    pooled, both = speedup([base, again], trial, by_step=True)
    assert pooled != point and 1 < both[0] <= 1.10 <= both[1]
    assert speedup([base, again], trial)[1][0] < 1                        # unpaired: inconclusive


def test_independent_noise_keeps_the_interval_as_wide():
    """Pairing cancels only what repeats: two runs of pure independent noise, and two runs of an
    unseeded multi-scale workload (another size sequence each run), give paired intervals about
    as wide as the independent ones."""
    rng = np.random.default_rng(5)
    for _ in range(3):
        a, b = (0.1 * rng.lognormal(0, 0.1, 200) for _ in range(2))
        recs = [[{"step": i, "dur": float(v)} for i, v in enumerate(x)] for x in (a, b)]
        r = width(speedup(*recs, by_step=True)[1]) / width(speedup(*recs)[1])
        assert 0.8 < r < 1.25
    for seed in range(3):
        a, b = run(sizes_work(20 + seed, 120), 1), run(sizes_work(40 + seed, 120), 2)
        assert paired_means([a], b) is not None                     # paired, not the fallback
        r = width(speedup(a, b, by_step=True)[1]) / width(speedup(a, b)[1])
        assert 0.8 < r < 1.25


def test_paired_interval_holds_the_unpaired_steps():
    """Equal speed, but the trial's window runs 10 steps past the baseline's: those steps did
    work the baseline's window never did, and the point estimate includes them. The paired
    interval resamples them independently, so it still covers 1 about 95% of the time (pairing
    the common steps alone missed 43 of these 60)."""
    misses = 0
    for s in range(60):
        w = sizes_work(100 + s, 120)
        base, trial = run(w, 1000 + s, last=67), run(w, 2000 + s, last=77)
        _, (lo, hi) = speedup(base, trial, by_step=True)
        misses += not lo <= 1 <= hi
    assert misses <= 6


def test_too_few_common_steps_fall_back_to_independent_bootstraps():
    w = sizes_work(3, 200)
    base = run(w, 1, last=60)
    late = run(w, 2, first=50, last=120)              # shares steps 50..59 only
    common = common_steps([base], late)
    assert 3 <= len(common) <= 10 and set(common) <= set(range(50, 60))     # less the warm-up, partial cycles
    assert len(common) < min_common([base], late) and paired_means([base], late) is None
    assert speedup(base, late, by_step=True) == speedup(base, late)
    apart = run(w, 3, first=120, last=200)            # no common step at all
    assert len(common_steps([base], apart)) == 0
    assert speedup(base, apart, by_step=True) == speedup(base, apart)
    # a plain series of durations has no step numbers: its places stand in for them
    a, b = (estimate_durations(w[:80] * np.random.default_rng(k).lognormal(0, 0.02, 80)) for k in (5, 6))
    assert list(a.step_ids) == list(range(a.first, a.first + a.n))
    assert paired_means([a], b) is not None
    assert width(speedup(a, b, by_step=True)[1]) < 0.6 * width(speedup(a, b)[1])


VARIABLE = textwrap.dedent("""
    import sys, time
    import torch
    factor = float(sys.argv[1])
    sizes = torch.Generator().manual_seed(1)           # seeded: the same per-step work in every run
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10 ** 6):
        work_ms = 2 + 20 * torch.rand(1, generator=sizes).item()     # 2..22 ms by step number
        time.sleep(factor * work_ms / 1e3)
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.mark.quiet
def test_tune_pairs_real_runs_of_a_seeded_variable_script(tmp_path):
    """Two real runs of one script (perfdoctor's launcher, as tune runs them) whose steps sleep
    2..22 ms by step number from a seeded generator, the second 10% faster: tune's speed-up
    (measure.speedup) pairs them by step number and excludes 1; the independent bootstraps of
    the same two windows do not. (The hooks and the tiny model add a fixed ~1 ms a step: the
    true ratio is a little under 1.10; a sleep overshoots by up to a few ms on a busy machine,
    noise that does not repeat and stays in the paired interval.)"""
    pytest.importorskip("torch")
    from perfdoctor.collect.launcher import RunConfig, launch
    from perfdoctor.tune.measure import measure_dir
    from perfdoctor.tune.measure import speedup as tune_speedup

    script = tmp_path / "train.py"
    script.write_text(VARIABLE)
    runs = []
    for name, factor in (("base", 1.0), ("fast", 1 / 1.10)):
        d = tmp_path / name
        res = launch(RunConfig(argv=[str(script), str(factor)], run_dir=d, max_steps=40, trace=False, changes={}))
        assert res.exit_code == 0
        runs.append(measure_dir(d, {}, res.exit_code, res.child, res.wall_s))
    base, fast = runs
    assert base.ok and fast.ok, (base.error, fast.error)
    assert paired_means([base.estimate], fast.estimate) is not None
    ratio, (lo, hi) = tune_speedup([base], fast)
    assert 1 < lo <= ratio <= hi and ratio < 1.25
    assert speedup(base.estimate, fast.estimate)[1][0] < 1          # unpaired: the sizes' spread is noise


def test_hand_edited_step_numbers_never_break_the_estimate_and_repeats_are_not_paired():
    """steps.jsonl is read, not trusted: a step number too large for an int64, a boolean or a
    float stands as the record's place; a window that repeats a step number is not paired."""
    w = sizes_work(4, 60)
    odd = [{"step": v, "dur": float(x)} for v, x in zip([10 ** 30, True, 2.5] + list(range(3, 60)), w)]
    e = estimate(odd)
    assert e.n == 58 and list(e.step_ids[:3]) == [2, 3, 4]
    twice = estimate([{"step": i // 2, "dur": float(x)} for i, x in enumerate(w)])
    assert paired_means([e], twice) is None
    assert speedup(e, twice, by_step=True) == speedup(e, twice)
