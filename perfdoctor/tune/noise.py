"""Is the machine tune measures on noisy? Judged from the baseline run (session.py, step 2):
other processes' load during a run, the width of the run's own step-time interval. A noisy
machine makes tune interleave a baseline run after every trial."""

from __future__ import annotations

NOISY_OTHER_LOAD = 0.25      # share of the cores used by other processes (as `gate --max-other-load`)
NOISY_CI = 0.05              # baseline 95% interval half-width, relative to its step time
NOISY_RUNS = 0.05            # run-to-run spread of the baseline's step time (relative)


def own_half(m) -> float:
    """Half the width of a run's own 95% interval, relative to its step time (0 without one)."""
    lo, hi = m.estimate.ci95
    return (hi - lo) / 2 / m.step_s if m.step_s else 0.0


def busy(m) -> bool:
    """Other processes used a material share of the cores during this run."""
    load, cores = getattr(m, "other_load", None), getattr(m, "cores", None)
    return load is not None and bool(cores) and load > max(NOISY_OTHER_LOAD * cores, 0.5)


def baseline_noise(b) -> tuple[bool, str]:
    """(noisy, what to say) from the first baseline run."""
    half = own_half(b)
    if busy(b):
        return True, (f"other processes used {b.other_load:.1f} of {b.cores} cores: noisy machine, each "
                      "trial is compared with the baseline runs just before and after it")
    if half > NOISY_CI:
        return True, (f"the baseline's 95% interval is +-{100 * half:.0f}%: noisy unless a second run agrees step "
                      "for step; if noisy, each trial is compared with the baseline runs just before and after it")
    return False, f"quiet machine (baseline interval +-{100 * half:.1f}%)"
