"""input.wait_busy_share: how much of its data wait the training thread provably spent awake."""

from __future__ import annotations

import pytest

from perfdoctor.analyze.stepwait import wait_busy_share


def rec(dur, wait, cpu, runq):
    return {"dur": dur, "wait": wait, "cpu": cpu, "runq": runq}


def test_a_thread_awake_through_the_step_was_awake_through_its_wait():
    # 10 ms steps, 2 ms of wait, on a CPU or queued all the time: the wait is the trainer's work
    assert wait_busy_share([rec(0.010, 0.002, 0.009, 0.001)] * 5) == pytest.approx(1.0)


def test_sleep_is_charged_to_the_wait_first():
    # 3 ms asleep in a 10 ms step with a 4 ms wait: at least 1 ms of the wait was awake
    assert wait_busy_share([rec(0.010, 0.004, 0.006, 0.001)]) == pytest.approx(0.25)
    # asleep longer than the wait: nothing is proven
    assert wait_busy_share([rec(0.010, 0.002, 0.005, 0.0)]) == 0.0


def test_per_step_bounds_add_up_and_unknowns_are_left_out():
    steps = [rec(0.010, 0.004, 0.010, 0.0),      # 4 ms awake
             rec(0.010, 0.004, 0.004, 0.0),      # asleep 6 ms: 0 proven
             {"dur": 0.010, "wait": 0.004}]      # no schedstat: not counted
    assert wait_busy_share(steps) == pytest.approx(0.5)


def test_no_schedstat_or_no_wait_is_unknown():
    assert wait_busy_share([{"dur": 0.01, "wait": 0.005}] * 3) is None
    assert wait_busy_share([rec(0.010, 0.00005, 0.01, 0.0)] * 3) is None      # 0.5% wait: nothing to split
    assert wait_busy_share([]) is None
