"""Multi-rank `perfdoctor run` (torchrun, DDP over gloo on the CPU) and the merged diagnosis."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from quiet import Foreign, skip_if_shared

from perfdoctor.analyze.straggler import RankInput, cross_rank
from perfdoctor.collect.ranks import DistOptions, identity, rank_dirs
from perfdoctor.errors import PerfdoctorError

REPO = Path(__file__).resolve().parent.parent
DDP = REPO / "examples" / "ddp_gloo.py"
RANK_FILES = {"run.json", "child.json", "steps.jsonl", "samples.json", "rank.json", "report.json"}


def _steps(durs_waits):
    return {str(i + 1): dw for i, dw in enumerate(durs_waits)}


# -- pure: analyze/straggler.py -----------------------------------------------------------------
def test_straggler_from_durations():
    # rank 1 works 31 ms per step, rank 0 1 ms: rank 0 waits 31 ms of its 33 ms step
    r0 = RankInput(0, 33.0, 32.0 / 33.0, _steps([(33.0, 32.0), (34.0, 32.5), (32.5, 31.6), (33.1, 32.0)]))
    r1 = RankInput(1, 33.0, 1.0 / 33.0, _steps([(33.0, 1.0), (34.0, 1.5), (32.5, 0.9), (33.1, 1.1)]))
    m, rows = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_rank"] == 1 and m["ranks.fastest_rank"] == 0
    assert m["ranks.slowest_ratio"] == pytest.approx(32.0 / 1.0)
    assert m["ranks.network_wait_share"] == pytest.approx(1 / 33)
    assert m["ranks.straggler_wait_share_max"] == pytest.approx(31 / 33)
    assert m["ranks.straggler_wait_share"] == pytest.approx(31 / 66)
    assert m["ranks.straggler_consistent"] is True and m["ranks.paired_steps"] == 4
    assert m["ranks.wait_cause"] == "straggler"
    assert rows[0].straggler_wait_ms == pytest.approx(31.0) and rows[1].straggler_wait_ms == 0


def test_a_two_rank_straggler_is_judged_by_the_wait_of_the_rank_that_waits():
    """The shape of a CI failure (the live test below on a loaded 2-core machine read 'network'):
    rank 1 loads each batch 30 ms longer; rank 0 waits 68% of its step, 44% of it for rank 1
    beyond the 24% both ranks spend in the CPU-starved transfer. Averaged over both ranks (the
    slowest waits for nobody) the straggler wait reads 22%, under the transfer: 'network'. The
    ranks that wait for the slowest wait more for it than for the transfer."""
    steps0 = _steps([(50.0, 34.0), (51.0, 35.0), (49.0, 33.5), (50.5, 34.2), (50.2, 34.0), (49.8, 33.8)])
    steps1 = _steps([(50.0, 12.0), (51.0, 12.5), (49.0, 11.5), (50.5, 12.1), (50.2, 11.9), (49.8, 12.0)])
    m, _ = cross_rank([RankInput(0, 50.0, 0.68, steps0), RankInput(1, 50.0, 0.24, steps1)], 2)
    # (the transfer step by step: rank 1's waits, 72.0 ms over 300.5 ms of steps)
    assert m["ranks.network_wait_share"] == pytest.approx(0.24, abs=1e-3)
    assert m["ranks.straggler_wait_share"] == pytest.approx(0.22, abs=1e-3)        # over both ranks
    assert m["ranks.others_wait_share"] == pytest.approx(0.44, abs=1e-3)           # rank 0's wait for rank 1
    assert m["ranks.wait_cause"] == "straggler" and m["ranks.slowest_rank"] == 1
    # three ranks, one slow: the two that wait are the mean
    steps2 = _steps([(50.0, 24.0), (51.0, 25.0), (49.0, 23.5), (50.5, 24.2), (50.2, 24.0), (49.8, 23.8)])
    m, _ = cross_rank([RankInput(0, 50.0, 0.68, steps0), RankInput(1, 50.0, 0.24, steps1),
                       RankInput(2, 50.0, 0.48, steps2)], 3)
    assert m["ranks.others_wait_share"] == pytest.approx((0.44 + 0.24) / 2, abs=1e-3)
    assert m["ranks.straggler_wait_share"] == pytest.approx((0.44 + 0.24) / 3, abs=1e-3)


def test_contention_when_the_slow_rank_waited_for_a_core():
    steps0 = _steps([(20.0, 12.0), (21.0, 13.0), (20.5, 12.4), (20.2, 12.1)])
    steps1 = _steps([(20.0, 2.0), (21.0, 3.0), (20.5, 2.5), (20.2, 2.2)])
    # rank 1 is 10 ms busier per step, and its step thread queued 9 ms more for a CPU
    m, _ = cross_rank([RankInput(0, 20.4, 12.4 / 20.4, steps0, runq_ms=1.0),
                       RankInput(1, 20.4, 2.4 / 20.4, steps1, runq_ms=10.0)], 2)
    assert m["ranks.slowest_rank"] == 1 and m["ranks.slowest_runq_excess"] == pytest.approx(0.9, abs=0.01)
    assert m["ranks.wait_cause"] == "contention"
    m, _ = cross_rank([RankInput(0, 20.4, 12.4 / 20.4, steps0, runq_ms=1.0),
                       RankInput(1, 20.4, 2.4 / 20.4, steps1, runq_ms=2.0)], 2)   # its own work: a straggler
    assert m["ranks.wait_cause"] == "straggler"
    # with CPU times: rank 1 ran 8 ms on a CPU like rank 0's 7 ms and queued 10 ms to rank 0's 1 ms
    m, _ = cross_rank([RankInput(0, 20.4, 12.4 / 20.4, steps0, runq_ms=1.0, cpu_ms=7.0),
                       RankInput(1, 20.4, 2.4 / 20.4, steps1, runq_ms=10.0, cpu_ms=8.0)], 2)
    assert m["ranks.slowest_runq_excess"] == pytest.approx((10 - 8 / 7) / 10, abs=0.01)
    assert m["ranks.wait_cause"] == "contention"
    # a host both ranks share, its cores half taken by other jobs: each rank queues 1 ms per CPU ms,
    # rank 1 runs 5 ms more and so queues 5 ms more: its work, not its own contention
    m, _ = cross_rank([RankInput(0, 20.4, 12.4 / 20.4, steps0, runq_ms=4.0, cpu_ms=4.0),
                       RankInput(1, 20.4, 2.4 / 20.4, steps1, runq_ms=9.0, cpu_ms=9.0)], 2)
    assert m["ranks.slowest_runq_excess"] == pytest.approx(0.0)
    assert m["ranks.wait_cause"] == "straggler"


def test_a_rank_that_also_does_more_cpu_work_is_a_straggler_though_it_queued_more():
    """Measured (helper75, `perfdoctor run --nproc-per-node 2` on a loaded 2-core host): rank 1 given
    2x the batch of rank 0 in DDP ran 10.5 ms of CPU per profiled step to rank 0's 6.5 ms, and
    queued 10.7 ms for a core to rank 0's 1.1 ms (rank 0 sleeps in its all-reduce and wakes
    briefly; the scheduler favours it). Per CPU second rank 1 queued 6x more: the rate model read
    'contention' and the report said 'not more work', though its extra CPU alone is 18% of the
    step, above the 12% transfer: a straggler. Its queueing stays the host's (runq excess kept)."""
    steps0 = _steps([(23.0, 17.0), (22.5, 16.4), (23.4, 17.5), (22.0, 15.9), (22.8, 16.8), (23.1, 16.9)])
    steps1 = _steps([(22.6, 2.9), (22.2, 2.6), (23.0, 3.0), (21.8, 2.7), (22.5, 2.8), (22.7, 2.9)])
    r0 = RankInput(0, 22.8, 16.75 / 22.8, steps0, runq_ms=1.1, cpu_ms=6.5)
    r1 = RankInput(1, 22.4, 2.8 / 22.4, steps1, runq_ms=10.7, cpu_ms=10.5)
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_rank"] == 1 and m["ranks.slowest_runq_excess"] > 0.5     # the rate model alone
    assert m["ranks.slowest_extra_cpu_share"] == pytest.approx(4.0 / 22.4)
    assert m["ranks.wait_cause"] == "straggler"
    # the same queueing with the same CPU on both ranks: no more work, the host's contention
    m, _ = cross_rank([RankInput(0, 22.8, 16.75 / 22.8, steps0, runq_ms=1.1, cpu_ms=6.5),
                       RankInput(1, 22.4, 2.8 / 22.4, steps1, runq_ms=10.7, cpu_ms=6.9)], 2)
    assert m["ranks.slowest_extra_cpu_share"] == pytest.approx(0.4 / 22.4)
    assert m["ranks.wait_cause"] == "contention"
    # more CPU, but less than the transfer every rank waits for (a balanced job on a loaded host:
    # rank 0 ran 26.6 ms to rank 1's 22.2 ms of a 67 ms step with a 28% transfer): contention stays
    s0 = _steps([(67.0, 19.0), (66.0, 18.5), (68.0, 19.5), (67.5, 19.0)])
    s1 = _steps([(67.0, 40.0), (66.0, 39.5), (68.0, 40.5), (67.5, 40.0)])
    m, _ = cross_rank([RankInput(0, 67.0, 19.0 / 67.0, s0, runq_ms=31.3, cpu_ms=26.6),
                       RankInput(1, 67.0, 40.0 / 67.0, s1, runq_ms=12.7, cpu_ms=22.2)], 2)
    assert m["ranks.slowest_rank"] == 0 and m["ranks.slowest_extra_cpu_share"] < m["ranks.network_wait_share"]
    assert m["ranks.wait_cause"] == "contention"


def test_a_rank_busier_in_every_step_is_a_straggler_despite_one_long_step():
    """Rank 0 evaluates every 10 steps (rank 0 only) and is busier in each traced step; one of
    them holds the evaluation (829 ms of own work against rank 1's 6 ms). The spread of that one
    step made the mean's standard error as large as the mean: 'uneven, the ranks take turns being
    last', though rank 1 was never last. A sign test sees it, at 5% over the ranks: the rank tested
    is the busier of two on these steps, so 5 of 5 (2 x 1/32) is no proof, 6 of 6 (2 x 1/64) is;
    short of it the uneven wait names rank 0. Recorded per-step (dur, wait) of such a run."""
    five0 = [(21.9, 9.5), (23.2, 9.4), (15.3, 1.5), (35.8, 16.2), (832.4, 3.3)]
    five1 = [(14.8, 10.2), (29.7, 24.1), (14.2, 8.4), (30.3, 26.2), (837.1, 831.5)]
    r0, r1 = RankInput(0, 86.3, 0.043, _steps(five0)), RankInput(1, 86.3, 0.972, _steps(five1))
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_rank"] == 0 and m["ranks.straggler_consistent"] is False
    assert m["ranks.wait_cause"] == "uneven" and m["ranks.slowest_last_wait_share"] > 0.99
    assert m["ranks.slowest_last_steps"] == 5
    # a sixth traced step where rank 0 is busier again
    r0, r1 = (RankInput(0, 86.3, 0.043, _steps(five0 + [(20.1, 8.0)])),
              RankInput(1, 86.3, 0.972, _steps(five1 + [(20.3, 12.9)])))
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.straggler_consistent"] is True and m["ranks.wait_cause"] == "straggler"
    # busier in 5 of 6, the same long step among them (p 7/64 x 2): turns cannot be told from it
    r0.steps["1"] = (14.8, 10.2)
    r1.steps["1"] = (21.9, 9.5)
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.straggler_consistent"] is False and m["ranks.wait_cause"] == "uneven"


def test_network_when_all_ranks_wait_alike():
    r0 = RankInput(0, 10.0, 0.41, _steps([(10, 4.0), (10, 4.2), (10, 4.1), (10, 4.0)]))
    r1 = RankInput(1, 10.0, 0.40, _steps([(10, 4.1), (10, 3.9), (10, 4.2), (10, 4.0)]))
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.wait_cause"] == "network"
    assert m["ranks.network_wait_share"] == pytest.approx(0.40)


def test_ranks_taking_turns_are_no_straggler():
    # a material skew on average, but rank 1 is last only in some steps: not consistent
    r0 = RankInput(0, 10.0, 0.35, _steps([(10, 0.5), (10, 6.0), (10, 0.5), (10, 6.0), (10, 0.5), (10, 6.0)]))
    r1 = RankInput(1, 10.0, 0.05, _steps([(10, 6.0), (10, 0.5), (10, 6.0), (10, 0.5), (10, 6.0), (10, 0.5)]))
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.straggler_consistent"] is False
    assert m["ranks.wait_cause"] == "uneven"
    # each rank is last in 3 of the 6 steps, holding half the 5.5 ms waits
    assert m["ranks.slowest_last_wait_share"] == pytest.approx(0.5) and m["ranks.slowest_last_steps"] == 3


def test_ranks_that_take_turns_wait_for_each_other_not_for_the_network():
    """Two ranks adding 15 ms of work on alternate steps, the transfer 2.2 ms of a 20 ms step: each
    rank's mean wait is 49% of the step, and their smallest mean had read as the network's wait
    ('communication-bound', 'synchronise gradients less often'). Step by step the smallest wait
    is the transfer's; the rest is the turns'."""
    r0 = RankInput(0, 20.0, 0.485, _steps([(20, 2.2), (20, 17.2)] * 4))
    r1 = RankInput(1, 20.0, 0.485, _steps([(20, 17.2), (20, 2.2)] * 4))
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.network_wait_share"] == pytest.approx(0.11)
    assert m["ranks.straggler_consistent"] is False and m["ranks.wait_cause"] == "uneven"


def test_a_rank_the_others_wait_for_in_its_long_step_only_is_named():
    """Rank 0 evaluates in one of 5 traced steps and is otherwise even with rank 1: no straggler step
    after step (rightly uneven), but the line said 'the ranks take turns being last' while 99% of
    the wait for a slower rank was for rank 0."""
    import io

    from perfdoctor.report.ranks_view import render_ranks
    from perfdoctor.report.sanitize import console

    r0 = RankInput(0, 60.0, 0.05, _steps([(20, 3.0), (20, 2.0), (20, 2.5), (820, 2.0), (20, 2.0)]))
    r1 = RankInput(1, 60.0, 0.9, _steps([(20, 2.0), (20, 3.0), (20, 2.0), (820, 802.0), (20, 2.5)]))
    m, rows = cross_rank([r0, r1], 2)
    assert m["ranks.wait_cause"] == "uneven" and m["ranks.slowest_rank"] == 0
    assert m["ranks.slowest_last_wait_share"] == pytest.approx(801.5 / 803.0) and m["ranks.slowest_last_steps"] == 3
    row = {"host": "vm", "exit_code": 0, "data_wait_share": 0.0, "verdict": "device", "steps": 40}
    sec = {"count": 2, "world_size": 2, "slowest_rank": 0, "metrics": m,
           "per_rank": [dict(row, rank=r.rank, step_time_ms=r.step_ms, busy_ms=r.busy_ms, collective_wait_ms=r.wait_ms,
                             collective_wait_share=r.wait_share, straggler_wait_ms=r.straggler_wait_ms) for r in rows]}
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    out = c.file.getvalue()
    assert "take turns" not in out
    assert ("uneven: no rank is slower step after step (uneven work or a noisy machine); of the wait for slower "
            "ranks, 100% was for rank 0, the busiest in 3 of 5 paired steps") in out


def test_a_straggler_job_is_bound_by_what_bounds_the_slow_rank():
    from perfdoctor.diagnose.ranks import _straggler_verdict
    m = {"ranks.straggler_wait_share": 0.45, "ranks.others_wait_share": 0.9, "ranks.network_wait_share": 0.05, "ranks.paired_steps": 8}
    v = {"bound": "communication", "rule": "PD115", "summary": "Straggler: rank 1 ...", "confidence": 1.0,
         "confidence_label": "high", "secondary": [], "notes": []}
    own = {"bound": "input_io", "summary": "Input-bound (IO): ...", "confidence": 0.7, "notes": ["few steps"]}
    job = _straggler_verdict(v, m, own, 1)
    assert job["bound"] == "input_io" and job["secondary"] == ["communication"] and job["rule"] == "PD115"
    assert job["summary"] == "Straggler: rank 1 ... Rank 1 itself: Input-bound (IO): ..."
    assert job["confidence"] == 0.7 and job["confidence_label"] == "medium"   # no surer than the rank itself
    assert job["notes"] == ["few steps", "no surer than rank 1's own verdict (input_io, 0.70), whose pace the job runs at"]
    for bound in ("communication", "inconclusive"):   # nothing better to say: the wait is the verdict
        kept = _straggler_verdict(v, m, {**own, "bound": bound}, 1)
        assert kept["bound"] == "communication" and kept["secondary"] == []
    # docs/commands.md: "Its confidence is at most the slow rank's", a communication-bound slow rank
    # too (a 128x batch on rank 1: its own verdict 0.40, near the CPU-bound line; the job's was 1.00)
    own = {"bound": "communication", "summary": "Communication-bound: ...", "confidence": 0.4,
           "notes": ["the CPU ops run 80% of the step, near the 80% that would make the step compute-bound"]}
    job = _straggler_verdict(v, m, own, 1)
    assert job["bound"] == "communication" and job["confidence"] == 0.4 and job["confidence_label"] == "low"
    assert own["notes"][0] in job["notes"] and job["summary"] == "Straggler: rank 1 ..."
    # a slow rank that judged nothing (inconclusive, confidence 0) leaves the straggler's own confidence
    assert _straggler_verdict(v, m, {**own, "bound": "inconclusive", "confidence": 0.0}, 1)["confidence"] == 1.0


def test_the_straggler_is_named_by_what_it_does_more_of_not_by_its_largest_share():
    """A user trial: rank 1 given 4x the batch (gloo, 2 ranks). Its own verdict read input-bound
    (its data wait, 25% of its step, outgrew the transfer, 18%; its compute 48% is under the 80%
    that makes a CPU step compute-bound), and so did the job's, though of its extra work over
    rank 0 (traced: compute +20.2 ms, data loading +11.7 ms, other +3.4 ms) most is compute."""
    from perfdoctor.diagnose.ranks import _straggler_verdict
    steps0 = _steps([(56.0, 43.5), (54.0, 46.4), (55.0, 45.0), (57.0, 46.0), (55.5, 45.5), (56.5, 46.2)])
    steps1 = _steps([(56.0, 8.0), (54.0, 5.6), (55.0, 6.0), (57.0, 7.0), (55.5, 6.5), (56.5, 7.1)])
    r0 = RankInput(0, 36.7, 0.787, steps0, parts_ms={"device": 7.3, "input": 2.8, "host": 1.6})
    r1 = RankInput(1, 36.8, 0.183, steps1, parts_ms={"device": 27.5, "input": 14.5, "host": 5.0})
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.wait_cause"] == "straggler" and m["ranks.slowest_rank"] == 1
    assert (m["ranks.slowest_extra_device_ms"], m["ranks.slowest_extra_input_ms"], m["ranks.slowest_extra_host_ms"]) \
        == pytest.approx((20.2, 11.7, 3.4))
    assert m["ranks.slowest_extra_part"] == "device"                   # 20.2 of 35.3 ms: more than half
    v = {"bound": "communication", "rule": "PD115", "summary": "Straggler: rank 1 ...", "confidence": 1.0,
         "confidence_label": "high", "secondary": [], "notes": []}
    own = {"bound": "input_cpu", "summary": "Input-bound (CPU): ...", "confidence": 0.5, "notes": []}
    # the cluster's own confidence note on the device line (its rules judged a communication
    # bound on rank 1's metrics) gives way to the straggler's confidence
    note = "the CPU ops run 48% of the step, near the 80% that would make the step compute-bound"
    job = _straggler_verdict({**v, "notes": [note]}, m, own, 1)
    assert note not in job["notes"]
    assert job["bound"] == "device" and job["secondary"] == ["communication"]
    # the slow rank's own note on how near its input verdict came to the compute line judged that
    # verdict: under the job's compute-bound one it would read as doubting it
    own_note = "the CPU ops' compute (their own time, 20 us or more an op) takes 46% of the step, near the 50% that would make the step compute-bound"
    job = _straggler_verdict(v, m, {**own, "notes": [own_note, "only 2 step(s) traced"]}, 1)
    assert job["bound"] == "device" and job["notes"] == ["only 2 step(s) traced",
                                                         "no surer than rank 1's own verdict (input_cpu, 0.50), "
                                                         "whose pace the job runs at"]
    assert job["summary"] == ("Straggler: rank 1 ... Its own work beyond rank 0's: compute +20.2 ms a traced step, "
                              "data loading +11.7 ms, other host time +3.4 ms: mostly compute. "
                              "Rank 1 itself: Input-bound (CPU): ...")
    # a rank slow in its data loading: its own verdict already names it
    r1.parts_ms = {"device": 8.0, "input": 40.0, "host": 2.0}
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_extra_part"] == "input"
    assert _straggler_verdict(v, m, own, 1)["bound"] == "input_cpu"
    # no part holds half of the growth: the rank's own verdict stays, and the text says so
    r1.parts_ms = {"device": 17.3, "input": 12.8, "host": 9.6}          # +10, +10, +8
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_extra_part"] is None
    job = _straggler_verdict(v, m, own, 1)
    assert job["bound"] == "input_cpu" and ": no part holds most of it." in job["summary"]
    # parts unknown on a rank: nothing said, nothing changed
    r1.parts_ms = None
    m, _ = cross_rank([r0, r1], 2)
    assert m["ranks.slowest_extra_part"] is None and m["ranks.slowest_extra_device_ms"] is None
    assert _straggler_verdict(v, m, own, 1)["summary"] == "Straggler: rank 1 ... Rank 1 itself: Input-bound (CPU): ..."


def test_waits_unknown_without_a_trace():
    m, rows = cross_rank([RankInput(0, 10.0, None), RankInput(1, 10.5, None)], 2)
    assert m["ranks.wait_cause"] is None and m["ranks.slowest_rank"] is None
    assert m["ranks.step_time_spread"] == pytest.approx(0.05)
    assert rows[0].busy_ms is None


# -- pure: collect/ranks.py -------------------------------------------------------------------
def test_identity_from_launcher_env():
    tr = identity({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    assert (tr.rank, tr.world_size, tr.local_rank, tr.local_world_size, tr.node) == (3, 8, 1, 2, "1")
    sl = identity({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
                   "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"})
    assert (sl.rank, sl.world_size, sl.local_rank, sl.local_world_size, sl.source) == (5, 8, 1, 4, "slurm")
    assert identity({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None      # a batch script, not an srun step
    assert identity({}) is None and identity({"RANK": "2", "WORLD_SIZE": "2"}) is None


def test_ranks_of_one_launch_agree_on_a_directory():
    from perfdoctor.collect.launcher import RunConfig
    from perfdoctor.collect.ranks import default_dir, job_key
    cfg = RunConfig(argv=["jobs/train.py"])
    assert default_dir(cfg, {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "3"}).name == "train-slurm-12-3"
    assert job_key({"TORCHELASTIC_RUN_ID": "a/b"}) == "torchrun-a_b"
    assert job_key({"TORCHELASTIC_RUN_ID": "none"}) == f"torchrun-pid{os.getppid()}"   # the agent: every rank's parent


def test_rank_directories_found_under_ranks_or_directly(tmp_path):
    """`perfdoctor report RUN_DIR/ranks`, or a directory the nodes' rank-K/ were copied into, said
    "no trace files (*.json, *.json.gz) in directory": the ranks are found there too."""
    from perfdoctor.collect.ranks import is_multi_rank
    for k in (0, 1, 3):
        d = tmp_path / "run" / "ranks" / f"rank-{k}"
        d.mkdir(parents=True)
        (d / ("run.json" if k != 3 else "notes.txt")).write_text("{}")      # rank-3: no run in it
    run = tmp_path / "run"
    assert [k for k, _ in rank_dirs(run)] == [0, 1]
    assert rank_dirs(run / "ranks") == [(0, run / "ranks" / "rank-0"), (1, run / "ranks" / "rank-1")]
    assert is_multi_rank(run / "ranks") and not is_multi_rank(run / "ranks" / "rank-0")
    assert rank_dirs(tmp_path / "nowhere") == []


def test_torchrun_args():
    assert DistOptions("2").torchrun_args() == ["--nproc-per-node", "2", "--standalone"]
    multi = DistOptions("4", nnodes="2", node_rank=1, master_addr="10.0.0.1", master_port=29500).torchrun_args()
    assert multi == ["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                     "--master-port", "29500"]
    rdzv = DistOptions("8", nnodes="2", rdzv_endpoint="head:29400").torchrun_args()
    assert rdzv[-4:] == ["--rdzv-endpoint", "head:29400", "--rdzv-backend", "c10d"]


# -- live: torchrun on the CPU ---------------------------------------------------------------
pytest.importorskip("torch", reason="multi-rank runs need torch (test dependency)")
needs_dist = pytest.mark.skipif(not shutil.which("torchrun") and not os.path.exists(sys.executable),
                                reason="torch.distributed.run unavailable")


def _prun(*args, out: Path, timeout=120):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _merged(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_slow_rank_is_named_and_the_other_waits_in_the_all_reduce(tmp_path):
    """Rank 1's data loading takes 30 ms a batch (num_workers=0): the job is input-bound on
    rank 1, and rank 0 waits for it in the all-reduce."""
    out = tmp_path / "run"
    r = _prun("--nproc-per-node", "2", "--skip-steps", "3", "--trace-steps", "8", DDP, "--steps", "40",
              "--slow-rank", "1", "--slow-ms", "30", "--slow-in", "data", out=out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ddp_gloo rank ") == 2 and r.stdout.count(": 40 steps, loss ") == 2
    assert [k for k, _ in rank_dirs(out)] == [0, 1]
    doc = _merged(out)
    sec = doc["ranks"]
    m = sec["metrics"]
    assert m["ranks.wait_cause"] == "straggler" and sec["slowest_rank"] == 1 and sec["fastest_rank"] == 0
    assert doc["verdict"]["rule"] == "PD115" and "rank 1" in doc["verdict"]["summary"]
    r0, r1 = sec["per_rank"]
    # the job is bound by what bounds rank 1: its data loading, not the collective it makes rank 0 wait in
    assert r1["verdict"] == "input_cpu" and r0["verdict"] == "communication"
    assert doc["verdict"]["bound"] == "input_cpu" and doc["verdict"]["secondary"] == ["communication"]
    assert "Rank 1 itself: Input-bound" in doc["verdict"]["summary"]
    assert r1["data_wait_share"] > 0.5
    # rank 0 waits for most of the 30 ms rank 1 spends loading a batch, in the gloo all-reduce
    assert r0["straggler_wait_ms"] > 20 and r0["collective_wait_share"] > 0.5
    assert r1["collective_wait_share"] < 0.3
    rank0 = json.loads((out / "ranks" / "rank-0" / "report.json").read_text())
    colls = rank0["traces"][0]["tables"]["collectives"]
    assert colls and colls[0]["name"] == "all_reduce"
    fix = next(f for f in doc["findings"] if f["id"] == "PD360")
    assert 1 < fix["gain"]["expected"] <= fix["gain"]["ceiling"]          # bounded by the measured wait
    # other processes' cores leave out both ranks' own CPU: rank 0's own report, which takes rank 1
    # to use what rank 0 (waiting) does, counts rank 1's busy loading as other work
    from perfdoctor.analyze.system import ranks_other_cores
    rank1 = json.loads((out / "ranks" / "rank-1" / "report.json").read_text())
    each = [x["traces"][0]["metrics"] for x in (rank0, rank1)]
    merged = doc["traces"][0]["metrics"]["system.other_cores"]
    assert merged == ranks_other_cores(each) and merged <= each[0]["system.other_cores"] + 0.05
    assert "Across 2 rank(s)" in r.stderr and "straggler" in r.stderr
    # the run line's figures are the slowest rank's, and it says so (uneven inputs had shown one
    # rank's step count as the job's)
    assert "\nrank 1 (the table below has every rank's): 40 steps, 39 timed" in r.stderr, r.stderr[:1500]
    # `perfdoctor report RUN_DIR` merges the same way
    rep = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(out), "-f", "json"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    again = json.loads(rep.stdout)
    assert again["ranks"]["slowest_rank"] == 1 and again["verdict"]["rule"] == "PD115"
    rep = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(out / "ranks"), "-f", "json"],
                         capture_output=True, text=True, timeout=120)      # its ranks/ alone: the same merge
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["ranks"]["slowest_rank"] == 1
    # another node's ranks not copied in yet: merged from what is there, and the report says so
    shutil.rmtree(out / "ranks" / "rank-1")
    rep = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(out), "-f", "json"],
                         capture_output=True, text=True, timeout=120)
    part = json.loads(rep.stdout)
    assert part["ranks"]["count"] == 1 and part["ranks"]["world_size"] == 2
    assert any("1 of 2 ranks found" in n and "missing: 1" in n for n in part["run"]["notes"])
    assert part["ranks"]["metrics"]["ranks.wait_cause"] is None and part["verdict"]["rule"] != "PD115"


@pytest.mark.quiet      # a judgement of the ranks' timings: beside the other test worker, one CI run read
@pytest.mark.slow       # a rank of this balanced job as a straggler
def test_balanced_ranks_have_no_straggler(tmp_path):
    def job(out):
        r = _prun("--nproc-per-node", "2", "--skip-steps", "3", "--trace-steps", "10", DDP, "--steps", "40",
                  "--width", "512", out=out)
        assert r.returncode == 0, r.stderr[-3000:]
        return _merged(out)
    foreign = Foreign()
    doc = job(tmp_path / "run")
    # on a loaded machine one rank may fall behind waiting for a core: contention, not a straggler.
    # Work outside this machine's processes (a CI run read a straggler while the test held the
    # machine: the VM's host) is not seen as contention; where it was there, the timings measured it.
    # Where no other process was seen, the job runs again and the second reading is judged (a CI
    # run read a straggler with nothing else seen, where the job passed in every local run)
    if doc["ranks"]["metrics"]["ranks.wait_cause"] == "straggler":
        skip_if_shared(foreign)
        doc = job(tmp_path / "again")
    assert doc["ranks"]["metrics"]["ranks.wait_cause"] in ("network", "none", "uneven", "contention")
    assert doc["verdict"]["rule"] != "PD115"
    assert not any(f["id"] == "PD360" for f in doc["findings"])


@pytest.mark.slow
def test_per_rank_launch_gives_the_same_layout(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "--no-python", str(Path(sys.executable).parent / "perfdoctor"), "run", "--out", str(out),
                        "--skip-steps", "2", "--trace-steps", "3", str(DDP), "--steps", "12"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [k for k, _ in rank_dirs(out)] == [0, 1]
    for k in (0, 1):
        d = out / "ranks" / f"rank-{k}"
        assert RANK_FILES <= {p.name for p in d.iterdir()}
        assert json.loads((d / "rank.json").read_text())["world_size"] == 2
        recs = [json.loads(ln) for ln in (d / "steps.jsonl").read_text().splitlines() if ln]
        assert len(recs) >= 10
        # the step thread's CPU and run-queue time per step (schedstat): never more than the step
        # (each written to the microsecond: three roundings of up to 0.5 us)
        assert all(0 <= r["cpu"] and 0 <= r["runq"] and r["cpu"] + r["runq"] <= r["dur"] + 2e-6 for r in recs)
        assert sum(r["cpu"] for r in recs) > 0.05 * sum(r["dur"] for r in recs)   # the rank computes
    doc = _merged(out)                       # the node's last rank merged
    assert doc["ranks"]["count"] == 2 and r.stderr.count("Across 2 rank(s)") == 1


@pytest.mark.slow
def test_exit_code_as_torchrun_gives_it(tmp_path):
    args = [str(DDP), "--steps", "4", "--exit-rank", "1", "--exit-code", "3"]
    bare = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], capture_output=True, text=True, timeout=120)
    out = tmp_path / "run"
    r = _prun("--nproc-per-node", "2", "--no-trace", *args, out=out)
    assert bare.returncode != 0 and r.returncode == bare.returncode
    # the ranks' bytes, untouched (two ranks' unbuffered prints may interleave, under torchrun alone too)
    assert sorted(r.stdout) == sorted(bare.stdout) and "ddp_gloo rank" in r.stdout
    codes = {i["rank"]: i["exit_code"] for i in _merged(out)["ranks"]["per_rank"]}
    # Rank 1 leaves with 3. Rank 0 leaves with 0, unless torchrun, on seeing rank 1 fail, SIGTERMs
    # it first (a race of torchrun's own, seen under plain torchrun 2 times in 20 on a loaded
    # machine): then torchrun's report says -15, and rank 0's code is 143 if the signal reached
    # its script, or still 0 if the script had ended and the signal met perfdoctor's rank process
    # after it (seen once in a CI run). Never 3, never anything else.
    assert codes[1] == 3, codes
    term = re.search(r"rank\s*: 0 \(local_rank: 0\)\s*exitcode\s*: -15", r.stderr)
    assert codes[0] in ((0, 143) if term else (0,)), (codes, r.stderr[-2000:])


def test_torchrun_passthrough_splits_options_from_the_script(tmp_path, monkeypatch):
    from perfdoctor.collect.ranks import one_node, torchrun_passthrough
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PerfdoctorError, match="can't open file 'train.py': no such file"):
        torchrun_passthrough(["--nproc_per_node", "2", "train.py"])
    (tmp_path / "train.py").write_text("pass\n")
    opts, script, is_module, nnodes = torchrun_passthrough(["--nproc_per_node", "2", "--max-restarts", "0", "train.py",
                                                            "--lr", "3", "-m", "x"])
    assert opts == ["--nproc_per_node", "2", "--max-restarts", "0"] and not is_module
    assert script == ["train.py", "--lr", "3", "-m", "x"] and one_node(nnodes)
    opts, script, is_module, nnodes = torchrun_passthrough(["--nproc-per-node", "2", "--nnodes=2", "-m", "pkg.train",
                                                            "--epochs", "1"])
    assert opts == ["--nproc-per-node", "2", "--nnodes=2"] and script == ["pkg.train", "--epochs", "1"] and is_module
    assert nnodes == "2" and not one_node(nnodes)


@pytest.mark.slow
def test_run_of_torchrun_module_watches_every_rank(tmp_path):
    """Issue 10's first attempt: `perfdoctor run -m torch.distributed.run --nproc_per_node 2 train.py`
    used to watch the launcher (0 steps); it now starts the ranks with perfdoctor's hooks."""
    out = tmp_path / "run"
    r = _prun("--no-trace", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", DDP,
              "--steps", "12", out=out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [k for k, _ in rank_dirs(out)] == [0, 1]
    for k in (0, 1):
        child = json.loads((out / "ranks" / f"rank-{k}" / "child.json").read_text())
        assert child["steps"] >= 11 and child["mode"] == "optimizer"
    assert r.stdout.count("/2: 12 steps") == 2 and _merged(out)["ranks"]["count"] == 2


def test_a_launcher_or_interpreter_as_the_first_word_runs_the_script_as_it_names_it(capsys, tmp_path):
    """A command line typed as it runs without perfdoctor: `torchrun ...` is -m torch.distributed.run,
    `python train.py` and `python -m pkg` drop the interpreter."""
    from perfdoctor.script_argv import launcher_words as words
    assert words(["torchrun", "--nproc-per-node", "2", "t.py", "--lr", "1"], None) == \
        (["--nproc-per-node", "2", "t.py", "--lr", "1"], "torch.distributed.run")
    assert words(["/venv/bin/torchrun", "t.py"], None) == (["t.py"], "torch.distributed.run")
    assert words(["torchrun.py", "x"], None) == (["torchrun.py", "x"], None)   # a script of that name
    assert words(["torchrun", "x"], "pkg") == (["torchrun", "x"], "pkg")
    assert words(["python", "t.py", "--lr", "1"], None) == (["t.py", "--lr", "1"], None)
    assert words(["python3.11", "-m", "pkg.train", "-x"], None) == (["-x"], "pkg.train")
    assert words(["python", "x"], "pkg") == (["python", "x"], "pkg")          # the module's own argument
    assert words(["python.py", "a"], None) == (["python.py", "a"], None)       # a script of that name
    capsys.readouterr()
    assert words([sys.executable, "t.py"], None) == (["t.py"], None)
    assert capsys.readouterr().err == ""            # this interpreter: nothing to say
    # another virtual environment's python is named, though it links to the same interpreter
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    assert words([str(venv / "bin" / "python"), "t.py"], None) == (["t.py"], None)
    assert f"(not {venv / 'bin' / 'python'})" in capsys.readouterr().err
    with pytest.raises(PerfdoctorError, match="python's own option -u is not passed on"):
        words(["python", "-u", "t.py"], None)
    capsys.readouterr()
    # torchrun's own options are not perfdoctor's misplaced ones (a note said "--nproc-per-node ...
    # after torch.distributed.run is passed to the script")
    from perfdoctor import cli
    from perfdoctor.script_argv import script_argv
    args = ["--nproc-per-node", "2", "--master_port", "29511", "t.py"]
    assert script_argv("run", cli.run, args, "torch.distributed.run") == ["torch.distributed.run", *args]
    assert capsys.readouterr().err == ""


TWO_RANKS = r"""
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(6):
    dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)       # not the interpreter's teardown: gloo's sometimes aborts there (examples/ddp_gloo.py)
"""


@pytest.mark.slow
def test_run_torchrun_command_line_starts_every_rank(tmp_path):
    """`perfdoctor run torchrun --nproc-per-node 2 train.py`, a launcher's command line prefixed as
    with any profiler, said "can't open file 'torchrun': no such file" (exit 2)."""
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    out = tmp_path / "run"
    r = _prun("--no-trace", "--no-stacks", "torchrun", "--nproc-per-node", "2", "--standalone", script, out=out)
    assert r.returncode == 0, r.stderr[-3000:]
    # the ranks' bytes, passed through (two ranks' prints may interleave, under torchrun alone too)
    assert sorted(r.stdout) == sorted("rank 0 sum 64\nrank 1 sum 64\n")
    assert [k for k, _ in rank_dirs(out)] == [0, 1]
    assert json.loads((out / "ranks.json").read_text())["dist"]["torchrun_options"] == \
        ["--nproc-per-node", "2", "--standalone"]


DDP_PLAIN = r"""
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2000):
    loss = model(torch.randn(32, 64)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_max_steps_stops_ranks_that_end_with_their_own_destroy_process_group(tmp_path):
    """--max-steps stops every rank before its destroy_process_group(): the ranks leave without
    the interpreter's teardown (a gloo group torn down there aborted a rank: exit 134, and the run
    exited 1 about one time in two), and the run exits 0, as a --max-steps stop does."""
    script = tmp_path / "ddp_plain.py"
    script.write_text(DDP_PLAIN)
    out = tmp_path / "run"
    r = _prun("--nproc-per-node", "2", "--max-steps", "30", "--no-trace", "--no-stacks", script, out=out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr
    for k in (0, 1):
        child = json.loads((out / "ranks" / f"rank-{k}" / "child.json").read_text())
        assert child["outcome"] == "stopped" and child["steps"] == 30


def test_ranks_that_never_communicate_are_not_described_by_their_collectives():
    """Two ranks with no collective (29 and 79 steps): no 'every rank waits at least 0% (the
    transfer)' and no pairing; one line says they did not wait for each other, with their steps."""
    import io

    from perfdoctor.report.ranks_view import render_ranks
    from perfdoctor.report.sanitize import console

    row = {"host": "vm", "exit_code": 0, "step_time_ms": 1.5, "busy_ms": 1.5, "collective_wait_ms": 0.0,
           "collective_wait_share": 0.0, "straggler_wait_ms": 0.0, "data_wait_share": 0.0, "verdict": "device"}
    sec = {"count": 2, "world_size": 2, "slowest_rank": 1,
           "per_rank": [dict(row, rank=0, steps=29), dict(row, rank=1, steps=79, step_time_ms=4.0)],
           "metrics": {"ranks.wait_cause": "none", "ranks.comm_wait_share_mean": 0.0, "ranks.network_wait_share": 0.0,
                       "ranks.straggler_wait_share": 0.0, "ranks.paired_steps": 5}}
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    out = c.file.getvalue()
    assert ("no rank ran a collective in its traced steps: the ranks did not wait for each other "
            "(independent processes?); they ran 29-79 steps") in out
    assert "the transfer" not in out and "paired over" not in out
    sec["metrics"].update({"ranks.comm_wait_share_mean": 0.02, "ranks.network_wait_share": 0.02})
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    assert "every rank waits at least 2% of the step (the collective itself)" in c.file.getvalue()
    # ranks that all-reduce but ran different numbers of steps (a user trial: Join, rank 1 with 70%
    # of the batches) are said to; one step apart is a stop mid-step, not uneven inputs
    assert ("the ranks ran different numbers of steps (rank 0 29, rank 1 79): uneven inputs (a rank that ran out "
            "of batches joined, under torch.distributed.algorithms.Join, or left)") in c.file.getvalue()
    sec["per_rank"][1]["steps"] = 30
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    assert "different numbers of steps" not in c.file.getvalue()
    # mostly the transfer, the waits differing by 17%: a rank is "also slower" only where it is
    # step after step (a balanced run's rank 1, 5.3 ms to rank 0's 5.4, had been called slower)
    sec["metrics"].update({"ranks.wait_cause": "network", "ranks.network_wait_share": 0.4,
                           "ranks.straggler_wait_share_max": 0.17, "ranks.straggler_consistent": False,
                           "ranks.slowest_rank": 1})
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    assert "differ by up to 17% of the step: no rank is slower step after step" in c.file.getvalue()
    sec["metrics"]["ranks.straggler_consistent"] = True
    c = console(file=io.StringIO(), width=300)
    render_ranks(c, sec)
    assert "differ by up to 17% of the step: rank 1 is also slower than the other" in c.file.getvalue()
    # waits unknown: another node's ranks not copied in is said as such, not as a rank without a trace
    from perfdoctor.report.ranks_view import rank_notes
    gone = {"count": 1, "world_size": 2, "per_rank": sec["per_rank"][:1], "metrics": {"ranks.wait_cause": None}}
    assert rank_notes(gone)[0][0].startswith("  collective waits unknown (1 of the job's 2 ranks here)")
    assert "(no trace on some rank)" in rank_notes({**gone, "count": 2, "per_rank": sec["per_rank"]})[0][0]
    # a straggler whose step thread used about the CPU the others did (a balanced job under another
    # job's load: 2.7% of a step more) is said to have spent its extra time off that CPU
    strag = {**sec, "metrics": {**sec["metrics"], "ranks.wait_cause": "straggler", "ranks.slowest_rank": 0,
                                "ranks.fastest_rank": 1, "ranks.slowest_ratio": 1.85,
                                "ranks.straggler_wait_share_max": 0.34}}
    for extra, said in ((0.027, True), (0.2, False), (None, False)):
        strag["metrics"]["ranks.slowest_extra_cpu_share"] = extra
        lines = [t for t, _ in rank_notes(strag)]
        assert "rank 0 is busy 1.85x as long per step as rank 1, which waits 34% of its step" in lines[0]
        assert any(t.startswith("  rank 0's step thread used about as much CPU per step as the others' (+3% of its "
                                "step): its extra time was spent off that CPU") for t in lines) == said, (extra, lines)


def test_the_html_rank_table_has_the_terminals_columns():
    """for slower, data wait and exit were in the terminal's rank table only."""
    from perfdoctor.report import html

    row = {"host": "vm", "step_time_ms": 7.5, "busy_ms": 0.3, "collective_wait_ms": 7.2, "collective_wait_share": 0.96,
           "straggler_wait_ms": 1.29, "data_wait_share": 0.25, "verdict": "communication"}
    sec = {"count": 2, "per_rank": [dict(row, rank=0, exit_code=143), dict(row, rank=1, exit_code=1)],
           "metrics": {"ranks.wait_cause": "straggler"}}
    page = html._ranks({"ranks": sec})
    for head in ("for slower", "data wait", "exit"):
        assert f"<th class=\"num\">{head}</th>" in page
    assert "<td class=\"num\">1.3 ms</td><td class=\"num\">25%</td>" in page       # 0.1 ms, as the terminal
    assert "<td class=\"num\">143</td>" in page and "<td class=\"num\">1</td>" in page


@pytest.mark.slow
def test_ctrl_c_on_a_multi_rank_run_exits_130(tmp_path):
    """torchrun exits 1 when interrupted; perfdoctor, forwarding the SIGINT, exits 130 as a single
    run does (it had exited 1, each rank's rank.json saying 130)."""
    import signal
    import time
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--nproc-per-node", "2", "--no-trace", "--out",
                          str(out), str(DDP), "--steps", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any((d / "steps.jsonl").exists() for _, d in rank_dirs(out)):
        time.sleep(0.3)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert json.loads((out / "ranks.json").read_text())["forwarded_signals"] == [signal.SIGINT]


def test_the_html_rank_section_says_what_the_terminal_says(shared_traces, tmp_path):
    """Two sampled ranks of a 128-rank job: the HTML had said 'Across 2 ranks', without the job's
    size, each rank's wait share, the line on what every rank pays, or what the bar's colours are."""
    from perfdoctor.report import html
    from perfdoctor.report.ranks_view import rank_notes
    src = shared_traces / "hta" / "trace_filter"
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(src), "--format", "json", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    sec = doc["ranks"]
    assert (sec["count"], sec["world_size"]) == (2, 128)
    page = html.render(doc)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(src)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "COLUMNS": "300"})
    term = " ".join((r.stdout + r.stderr).split())
    assert "Across 2 rank(s) of 128" in term and "<h2>Across 2 rank(s) of 128</h2>" in page
    for rank in sec["per_rank"]:            # 168.0 ms 27%, as the terminal's "168.0 27%"
        share = f"{100 * rank['collective_wait_share']:.0f}%"
        assert f"{rank['collective_wait_ms']:.1f} {share}" in term
        assert f"{rank['collective_wait_ms']:.1f} ms <span class=\"dim\">{share}</span>" in page
    notes = rank_notes(sec)
    assert len(notes) == 2 and "every rank waits at least 24% of the step" in notes[1][0]
    for line, _ in notes:
        assert " ".join(line.split()) in term and line.strip() in page
    assert "own work (step - wait)</span>" in page and "wait (exposed collective time per step)</span>" in page
    # the markdown summary (a pull request's) has the table and its lines too: it had the straggler's
    # summary and the ranks.* evidence only
    from perfdoctor.report import markdown
    from perfdoctor.report.sanitize import markdown as M
    md = markdown.report(doc)
    assert "**Across 2 rank\\(s\\) of 128**" in md and "| rank | step ms | own ms | wait ms |" in md
    for rank in sec["per_rank"]:
        assert (f"| {rank['rank']} | {rank['step_time_ms']:.1f} | {rank['busy_ms']:.1f} | "
                f"{rank['collective_wait_ms']:.1f} {100 * rank['collective_wait_share']:.0f}% |") in md
    for line, _ in notes:
        assert M(line.strip()) in md


DDP_ENDLESS = DDP_PLAIN.replace("for step in range(2000):", "while True:")


@pytest.mark.slow
def test_duration_stops_every_rank_after_the_same_step(tmp_path):
    """--duration on several ranks of one node (it was refused): each rank's launcher keeps its
    clock, the first request writes the step to stop after and every rank stops there, so none
    is left waiting in a collective for the grace period. The same through the user's launcher
    (torchrun --no-python perfdoctor run). Across nodes it is refused in one line."""
    script = tmp_path / "ddp_endless.py"
    script.write_text(DDP_ENDLESS)
    own = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           str(Path(sys.executable).parent / "perfdoctor"), "run"]
    for name, cmd in (("nproc", [sys.executable, "-m", "perfdoctor", "run", "--nproc-per-node", "2"]),
                      ("own", own)):
        out = tmp_path / name
        t0 = time.monotonic()
        r = subprocess.run([*cmd, "--duration", "6", "--no-trace", "--no-stacks", "--out", str(out), str(script)],
                           capture_output=True, text=True, timeout=120)
        wall = time.monotonic() - t0
        assert r.returncode == 0, r.stderr[-3000:]
        children = [json.loads((out / "ranks" / f"rank-{k}" / "child.json").read_text()) for k in (0, 1)]
        runs = [json.loads((out / "ranks" / f"rank-{k}" / "run.json").read_text()) for k in (0, 1)]
        assert [c["outcome"] for c in children] == ["stopped", "stopped"], (name, children)
        steps = [c["steps"] for c in children]
        # how many steps fit in the 6 s depends on how long two torch imports took (17 on a busy CI)
        assert steps[0] == steps[1] == children[0]["shared_stop"]["step"] > 0, (name, steps)
        assert any(c["shared_stop"]["requested"] for c in children)
        assert [x["stopped_by"] for x in runs] == ["duration", "duration"]
        assert not any("did not stop within" in n for x in runs for n in x["notes"]), runs
        assert wall < 6 + 25, wall                    # well inside the 30 s grace
        assert not list((out / "ranks").glob(".stop-*"))      # the file of the launch went with it
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--nproc-per-node", "2", "--nnodes", "2",
                        "--duration", "5", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--duration stops the ranks of one node together, not those of several nodes" in r.stderr
