"""Across the ranks of one synchronous job: who sets the pace, who waits, and why (ranks.* metrics).

In data-parallel training every rank meets the others in the gradient all-reduce once per step,
so all ranks run at the pace of the slowest: their step times are equal and the difference
shows as *waiting* in the collective. Per rank and step:

    wait  = exposed collective time (the trace's communication share: NCCL kernels on a GPU not
            hidden behind compute, gloo ops on the CPU)
    busy  = step - wait (the rank's own work: forward, backward, data, optimizer)

The rank with the most own work (the straggler candidate) arrives last and waits only for the
transfer itself; every other rank also waits for it. So, for each step:

    network wait        = the smallest wait of any rank (what all ranks wait alike)
    straggler wait (i)  = wait(i) - network wait (= busy of the slowest - busy(i))

The network wait is taken step by step (paired steps, below: each step's smallest wait, over the
steps' time): where ranks take turns being last, each rank's mean wait holds its turns of waiting
for the other, and the smallest mean (47% of the step on two ranks adding 15 ms of work on
alternate steps, where the transfer took 2.2 ms) had read as the network's, "communication-bound".
With fewer than MIN_PAIRED paired steps, the smallest of the ranks' mean waits.

Only durations are compared, never timestamps across ranks: each rank's own clock measures its
own waits, so hosts whose clocks differ compare as well as ranks on one host. Steps are paired by
their ProfilerStep number (every rank counts the same steps; the profiled windows coincide).

A straggler is called only when it is consistently the slowest: over the paired steps its busy
time exceeds the mean of the other ranks' by more than twice the standard error of that
difference (a balanced job's ranks take turns being last, which averages out), or it is busier
in so many of the steps that a sign test rejects turns at SIGN_P, one-sided and over the ranks
(the rank tested is the busiest of them on these steps: any could have been busier as often by
chance, so its p times the rank count): a rank whose evaluation every N steps makes one traced
step 50x longer is busier in every step, yet that step's spread hides it from the mean's standard
error. Two ranks need 6 steps of 6; over the default 5 traced steps the 'uneven' wait names the
rank waited for instead (ranks.slowest_last_wait_share). At least MIN_PAIRED steps either way.
`wait_cause`: 'straggler' when that holds and the straggler wait of the ranks that wait for it
(ranks.others_wait_share: the mean over the ranks other than the slowest, which itself waits for
nobody; over all ranks it would halve a 2-rank job's straggler) is at least MATERIAL of the
step and at least the network wait; 'network' when the network wait is at least MATERIAL and
larger; 'none' when neither is material; None when the waits are unknown (no trace).
MATERIAL = 5% of the step: below it a fix's ceiling is under 1.05x, the line the fix rules use.
'contention' instead of 'straggler' when at least half of the straggler's extra time per
profiled step (CONTENTION) was spent in the run queue waiting for a CPU core beyond what the
other ranks waited (the step thread's schedstat, steps.jsonl `runq`): the rank is not doing more
work, its host's cores are oversubscribed (too many ranks, threads or other jobs per core).
"Beyond what the others waited" is per CPU second when the step threads' CPU times are known
(steps.jsonl `cpu`): on a host every rank shares, a rank queues in proportion to the time it is
runnable, so a rank with 30 ms more work on a host whose cores are half taken by other jobs also
queues ~30 ms more. That queueing comes with its work (the others, at the same rate per CPU
second, would have queued as much for it): it stays a straggler. Only queueing above the other
ranks' rate (runq / cpu) is the slow rank's own contention.
Contention is a claim that the rank is not doing more work, and with CPU times known it is
checked: the slow rank's CPU time per profiled step beyond the others' mean, as a share of its
step (ranks.slowest_extra_cpu_share), is the wait its extra work alone costs the others. When that
alone is a straggler's wait (at least MATERIAL of the step and at least the network wait), the
rank is a straggler whatever it also queued: rebalancing its work removes that wait, and the
queueing is the host's contention on top (flag PD214, fix PD348). On a loaded 2-core host a rank
given 2x the batch ran 10.5 ms of CPU per step to the other's 6.5 ms (17% of a 22 ms step, the
transfer 12%) yet queued 10.7 ms to its 1.1 ms: the scheduler favours the rank that sleeps in its
collective and wakes briefly over the one that computes without a break, so per CPU second the
busier rank queues more, and the rate model above read 'contention'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean, stdev

from perfdoctor.analyze.ranks import step_time_spread

MIN_PAIRED = 3
MATERIAL = 0.05
SIGN_P = 0.05               # the sign test's level, over the ranks: 2 ranks need 6 of 6 steps (2/64), 8 ranks 8 of 8
CONTENTION = 0.5             # share of the straggler's extra time spent queued for a CPU
NAMES = ("ranks.count", "ranks.world_size", "ranks.step_time_spread", "ranks.slowest_rank", "ranks.fastest_rank",
         "ranks.slowest_ratio", "ranks.comm_wait_share_mean", "ranks.network_wait_share",
         "ranks.straggler_wait_share", "ranks.straggler_wait_share_max", "ranks.straggler_consistent",
         "ranks.paired_steps", "ranks.slowest_last_wait_share", "ranks.slowest_last_steps", "ranks.slowest_runq_excess",
         "ranks.slowest_extra_cpu_share", "ranks.others_wait_share", "ranks.wait_cause",
         "ranks.slowest_extra_device_ms", "ranks.slowest_extra_input_ms", "ranks.slowest_extra_host_ms",
         "ranks.slowest_extra_part")
PARTS = ("device", "input", "host")    # own work by what it is (the share.* names): compute, data loading, the rest


@dataclass
class RankInput:
    rank: int
    step_ms: float | None                 # steady-state step time (stats/steptime.py)
    wait_share: float | None              # exposed collective time / step (the trace window)
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)   # step label -> (dur ms, wait ms)
    runq_ms: float | None = None          # mean run-queue wait of the step's thread per profiled step
    cpu_ms: float | None = None           # mean CPU time of the step's thread per profiled step
    parts_ms: dict[str, float] | None = None   # own work per traced step by part (PARTS): share.* x the traced step


@dataclass
class RankRow:
    rank: int
    step_ms: float | None
    wait_ms: float | None
    busy_ms: float | None
    wait_share: float | None
    straggler_wait_ms: float | None       # the part of its wait spent waiting for a slower rank


def cross_rank(ranks: list[RankInput], world_size: int | None = None) -> tuple[dict, list[RankRow]]:
    """ranks.* metrics and a row per rank (see the module docstring)."""
    out = dict.fromkeys(NAMES)
    out["ranks.count"] = len(ranks)
    out["ranks.world_size"] = world_size
    out["ranks.step_time_spread"] = step_time_spread([r.step_ms for r in ranks if r.step_ms])
    rows = [RankRow(r.rank, r.step_ms, None, None, r.wait_share, None) for r in ranks]
    known = [(r, row) for r, row in zip(ranks, rows) if r.step_ms and r.wait_share is not None]
    for r, row in known:
        r.wait_share = row.wait_share = min(1.0, max(0.0, r.wait_share))
        row.wait_ms = r.step_ms * r.wait_share
        row.busy_ms = r.step_ms - row.wait_ms
    if len(known) < 2 or len(known) < len(ranks):
        return out, rows
    slow = max(known, key=lambda x: x[1].busy_ms)[1]
    fast = min(known, key=lambda x: x[1].busy_ms)[1]
    out["ranks.slowest_rank"], out["ranks.fastest_rank"] = slow.rank, fast.rank
    if fast.busy_ms > 0:
        out["ranks.slowest_ratio"] = slow.busy_ms / fast.busy_ms
    shares = [r.wait_share for r, _ in known]
    out["ranks.comm_wait_share_mean"] = fmean(shares)
    net = _network_share(ranks, min(shares))
    out["ranks.network_wait_share"] = net
    for r, row in known:
        row.straggler_wait_ms = r.step_ms * (r.wait_share - net)
    skew = [r.wait_share - net for r, _ in known]
    out["ranks.straggler_wait_share"] = fmean(skew)
    out["ranks.straggler_wait_share_max"] = max(skew)
    out["ranks.others_wait_share"] = fmean([s for (r, _), s in zip(known, skew) if r.rank != slow.rank])
    consistent, paired = _consistent(ranks, slow.rank)
    out["ranks.straggler_consistent"], out["ranks.paired_steps"] = consistent, paired
    out["ranks.slowest_last_wait_share"], out["ranks.slowest_last_steps"] = _last_share(ranks, slow.rank)
    st, nw = out["ranks.others_wait_share"], net
    contention = _contention(ranks, slow.rank)
    out["ranks.slowest_runq_excess"] = contention
    extra_cpu = out["ranks.slowest_extra_cpu_share"] = _extra_cpu_share(ranks, slow.rank)
    out.update(_extra_parts(ranks, slow.rank))
    more_work = extra_cpu is not None and extra_cpu >= MATERIAL and extra_cpu >= nw
    if (consistent and st >= MATERIAL and st >= nw and contention is not None and contention >= CONTENTION
            and not more_work):
        out["ranks.wait_cause"] = "contention"
    elif consistent and st >= MATERIAL and st >= nw:
        out["ranks.wait_cause"] = "straggler"
    elif nw >= MATERIAL and nw >= st:
        out["ranks.wait_cause"] = "network"
    elif st < MATERIAL and nw < MATERIAL:
        out["ranks.wait_cause"] = "none"
    else:            # a material straggler wait that does not hold step after step: ranks take turns
        out["ranks.wait_cause"] = "uneven"
    return out, rows


def _contention(ranks: list[RankInput], slow: int) -> float | None:
    """How much of the slowest rank's extra own work (over the others' mean, per profiled step) it
    spent waiting for a CPU core in the run queue, beyond what the others waited (None: unknown).
    With CPU times known, the others' wait is scaled to the slow rank's CPU time (module docstring)."""
    by = {r.rank: r for r in ranks}
    if any(r.runq_ms is None for r in ranks) or not all(r.steps for r in ranks):
        return None
    busy = {r.rank: fmean(d - w for d, w in r.steps.values()) for r in ranks}
    others = [k for k in by if k != slow]
    extra = busy[slow] - fmean(busy[k] for k in others)
    if extra <= 0:
        return None
    expected = fmean(by[k].runq_ms for k in others)
    cpu_o = fmean(by[k].cpu_ms or 0.0 for k in others) if all(r.cpu_ms is not None for r in ranks) else 0.0
    if cpu_o > 0:
        expected = by[slow].cpu_ms * expected / cpu_o        # the others' queueing rate, on its CPU time
    return max(0.0, by[slow].runq_ms - expected) / extra


def _extra_cpu_share(ranks: list[RankInput], slow: int) -> float | None:
    """The slowest rank's CPU time per profiled step beyond the other ranks' mean, as a share of
    its step time (None: CPU times or the step time unknown)."""
    by = {r.rank: r for r in ranks}
    if any(r.cpu_ms is None for r in ranks) or not by[slow].step_ms:
        return None
    return max(0.0, by[slow].cpu_ms - fmean(by[k].cpu_ms for k in by if k != slow)) / by[slow].step_ms


def _extra_parts(ranks: list[RankInput], slow: int) -> dict:
    """What the slowest rank's extra own work is made of: per part (compute, data loading, other
    host time) its ms per traced step beyond the other ranks' mean, and the part that holds at
    least half of the extra (the sum of the parts that grew), else None (no part dominates, or
    the parts are unknown). A rank with 4x the batch is slower in its compute and in its loading:
    the part that holds most of the difference is what to fix, whatever its own verdict names."""
    out = {f"ranks.slowest_extra_{p}_ms": None for p in PARTS} | {"ranks.slowest_extra_part": None}
    by = {r.rank: r for r in ranks}
    if len(by) < 2 or any(not r.parts_ms or any(r.parts_ms.get(p) is None for p in PARTS) for r in ranks):
        return out
    extra = {p: by[slow].parts_ms[p] - fmean(by[k].parts_ms[p] for k in by if k != slow) for p in PARTS}
    for p, v in extra.items():
        out[f"ranks.slowest_extra_{p}_ms"] = v
    grown = sum(v for v in extra.values() if v > 0)
    top = max(PARTS, key=extra.get)
    if grown > 0 and extra[top] >= 0.5 * grown:
        out["ranks.slowest_extra_part"] = top
    return out


def _network_share(ranks: list[RankInput], fallback: float) -> float:
    """What every rank waits alike: per paired step the smallest wait of any rank, over the paired
    steps' mean time (module docstring); `fallback` with fewer than MIN_PAIRED of them."""
    labels = _paired_labels(ranks)
    if len(labels) < MIN_PAIRED:
        return fallback
    net = sum(min(r.steps[lab][1] for r in ranks) for lab in labels)
    time = sum(fmean(r.steps[lab][0] for r in ranks) for lab in labels)
    return min(fallback, max(0.0, net / time)) if time > 0 else fallback


def _paired_busy(ranks: list[RankInput]) -> list[dict[int, float]]:
    """Each rank's own work (step time less its collective wait), per step every rank recorded
    (paired by ProfilerStep number)."""
    return [{r.rank: r.steps[lab][0] - r.steps[lab][1] for r in ranks} for lab in _paired_labels(ranks)]


def _paired_labels(ranks: list[RankInput]) -> set[str]:
    """The steps every rank recorded (their ProfilerStep labels)."""
    return set.intersection(*(set(r.steps) for r in ranks)) if ranks else set()


def _last_share(ranks: list[RankInput], slow: int) -> tuple[float | None, int | None]:
    """Of the time the ranks waited for a slower rank over the paired steps (per step: each rank's
    own work short of the busiest rank's), the share spent in steps where `slow` was the busiest,
    and in how many steps it was. Ranks that take turns share the wait; a rank with a long step of
    its own every N steps (an evaluation, a checkpoint on rank 0) holds nearly all of it, though it
    is not busier step after step. (None, None) without paired steps or without any such wait."""
    paired = _paired_busy(ranks)
    total = mine = 0.0
    last = 0
    for busy in paired:
        top = max(busy, key=busy.get)
        waited = sum(busy[top] - b for b in busy.values())
        total += waited
        if top == slow:
            mine += waited
            last += 1
    if not paired or total <= 0:
        return None, None
    return mine / total, last


def _consistent(ranks: list[RankInput], slow: int) -> tuple[bool | None, int]:
    """Is `slow` busier than the others step after step (module docstring)? (None: too few steps.)"""
    diffs = []
    for busy in _paired_busy(ranks):
        others = [b for k, b in busy.items() if k != slow]
        diffs.append(busy[slow] - fmean(others))
    if len(diffs) < MIN_PAIRED:
        return None, len(diffs)
    mean = fmean(diffs)
    se = stdev(diffs) / math.sqrt(len(diffs))
    # the rank tested is the busiest of len(ranks) on these same steps: any of them could have
    # been busier in as many steps by chance (Bonferroni), 2 ranks of 5 steps each 1/32, 1/16 in all
    return bool(mean > 0 and (mean > 2 * se or _sign_test(diffs) * len(ranks) <= SIGN_P)), len(diffs)


def _sign_test(diffs: list[float]) -> float:
    """One-sided sign test: the chance that a rank no busier than the others would be the busier
    one in at least as many of these steps (ties left out). It holds where the mean's standard
    error does not: one long step (an evaluation or a checkpoint on that rank) dominates the
    spread, while the rank is busier in every step."""
    n = sum(1 for d in diffs if d != 0)
    k = sum(1 for d in diffs if d > 0)
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n if n else 1.0
