"""--duration with several ranks: the ranks agree on one step to stop after (collect/sharedstop.py)."""

from __future__ import annotations

import math

from perfdoctor.collect.sharedstop import CHECK_S, LEAD_STEPS, RECENT, SharedStop, lead


def test_the_first_request_writes_the_step_and_every_rank_stops_after_it(tmp_path):
    """Two ranks in step (one collective a step), 2 s steps: rank 0's clock comes due at its
    boundary 10, rank 1's a little later. Both stop after step 11; rank 1 learns it by looking."""
    path = str(tmp_path / ".stop-job")
    r0, r1 = SharedStop(path), SharedStop(path)
    assert not r1.due(10, False, 2.0, now=100.0)             # nothing written yet
    assert not r0.due(10, True, 2.0) and r0.at == 10 + LEAD_STEPS == 11
    assert not r0.due(10, True, 2.0)                         # the request is made once
    assert r1.due(11, False, 2.0, now=102.0) and r1.at == 11
    assert r0.due(11, True, 2.0)
    # rank 1's own clock came due after the step was written: it takes that step, not its own
    late = SharedStop(path)
    assert late.due(11, True, 2.0) and late.at == 11 and late.info() == {"step": 11, "requested": True}
    assert r1.info() == {"step": 11, "requested": False}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".stop-job"]      # no file left aside


def test_short_steps_are_looked_at_every_check_interval_and_the_lead_covers_it(tmp_path):
    """1 ms steps: a rank looks once per CHECK_S, so the step written lies that many steps ahead,
    twice over (another rank's step may be half as long)."""
    assert lead(1e-3) == LEAD_STEPS + 2 * math.ceil(CHECK_S / 1e-3) + 1
    assert lead(5.0) == LEAD_STEPS and lead(None) == LEAD_STEPS + 1 and lead(float("nan")) == LEAD_STEPS + 1
    path = str(tmp_path / ".stop")
    reader = SharedStop(path)
    assert not reader.due(1, False, 1e-3, now=10.0)          # looked: nothing
    SharedStop(path).due(5, True, 1e-3)                      # another rank writes 5 + lead
    assert not reader.due(2, False, 1e-3, now=10.0 + CHECK_S / 2) and reader.at is None    # not looked again yet
    assert not reader.due(3, False, 1e-3, now=10.0 + CHECK_S) and reader.at == 5 + lead(1e-3)
    assert reader.due(reader.at, False, 1e-3)


def test_the_lead_is_set_by_the_shortest_recent_step_not_the_last(tmp_path):
    """A CI run of 2 ranks at ~2 ms steps: the writer's last step took 4 ms, and the step it wrote
    (12 ahead) came after the other rank had passed 25 boundaries without looking; that rank was
    in its next all-reduce when the writer left (Connection closed by peer)."""
    w = SharedStop(str(tmp_path / ".stop"))
    for i, s in enumerate([0.003, 0.0019, 0.0025] * 30):
        assert not w.due(i + 1, False, s, now=float(i))
    assert not w.due(91, True, 0.004) and w.at == 91 + lead(0.0019) and lead(0.0019) > 2 * CHECK_S / 0.0019
    old = SharedStop(str(tmp_path / ".stop2"))
    for i in range(RECENT):                                  # only the last RECENT steps count
        old.due(i + 1, False, 0.001 if i == 0 else 0.01, now=float(i))
    old.due(RECENT + 1, True, 0.01)
    assert old.at == RECENT + 1 + lead(0.01)


def test_a_damaged_or_unwritable_file_leaves_each_rank_its_own_clock(tmp_path):
    path = tmp_path / ".stop"
    path.write_text("7 and some")                            # not a step
    r = SharedStop(str(path))
    assert not r.due(3, False, 1.0, now=50.0) and r.at is None
    assert not r.due(3, True, 1.0) and r.at == 3 + LEAD_STEPS       # its own step: the file says none
    assert r.due(r.at, True, 1.0)
    gone = SharedStop(str(tmp_path / "missing-dir" / ".stop"))
    assert not gone.due(3, True, 1.0) and gone.at == 3 + LEAD_STEPS
    assert SharedStop.from_cfg({"stop_file": None}) is None and SharedStop.from_cfg({}) is None
