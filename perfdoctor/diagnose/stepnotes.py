"""Notes the steady step series warrants on its own (`perfdoctor run`): steps that drew extra
DataLoader batches (another loop inside them), a step time that drifts through the run (work
that grows or shrinks, or load on the machine that came or went), steps of two kinds mixed
through the run, and other processes that used a material part of the machine during the run."""

from __future__ import annotations

import math

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.stepwait import extra_batches
from perfdoctor.analyze.system import shared_by_others
from perfdoctor.stats.steptime import ms


def extra_batches_note(steady: list[dict]) -> list[str]:
    """A note when steady steps draw more batches than the usual step (an evaluation inside them)
    and those steps are 5% or more of the wall time: their time and wait are part of the figures."""
    x = extra_batches(steady)
    if x is None or x["time_share"] < 0.05:
        return []
    wait = f", and {x['wait_share']:.0%} of the data wait" if x["wait_share"] is not None else ""
    return [f"{x['steps']} of {x['of']} steady steps drew more DataLoader batches than the usual {x['usual']:g} "
            f"(up to {x['most']:g}): another loop (an evaluation?) runs inside them. They take {x['time_share']:.0%} "
            f"of the steady wall time{wait}: the step time and the input share include it"]


def shared_note(m: dict) -> list[str]:
    """A note when other processes used more of the machine than gate allows (analyze/system
    SHARED_SHARE): a user's run read clean under 0.9 of 2 cores busy with another job, which gate
    then called inconclusive. Its step time holds that load; the queueing notes say how much."""
    other, cores = m.get("system.other_cores"), m.get("machine.cpu_count")
    if not shared_by_others(other, cores):
        return []
    return [f"other processes used {other:.1f} of the {cores or '?'} cores during the run: the step time holds "
            "what they took (gate calls a run this shared not comparable with another)"]


DRIFT = 2.0          # the last third's median step this many times the first third's (or 1/this)
QUEUE_SHIFT = 0.2    # run-queue share of the steps, first third against last: a change of load
CONTENDED = 0.1      # run-queue share in both thirds from which the thread's own time says nothing
                     # of the work (PD214's threshold): intra-op threads spin, on the CPU clock,
                     # while they wait for a sibling the scheduler parked


def drift_note(steady: list[dict]) -> list[str]:
    """A note when the steady steps' length drifts through the run (an RL loop whose episodes
    grow: 4 ms to 54 ms a step): a time per step then depends on how long the run was. When the
    training thread's run-queue wait (schedstat, `runq`) accounts for the drift, so that the time
    it was not queued does not drift, the machine changed, not the work: the note says so."""
    rows = [(s["dur"], s.get("runq")) for s in steady if isinstance(s.get("dur"), (int, float)) and s["dur"] > 0]
    third = len(rows) // 3
    if third < 4:
        return []
    durs = [d for d, _ in rows]
    first, last = float(median(durs[:third])), float(median(durs[-third:]))
    if first <= 0 or 1 / DRIFT < last / first < DRIFT:
        return []
    head = (f"the steady steps' length drifts: median {ms(1e3 * first)} ms in the first third, {ms(1e3 * last)} ms "
            f"in the last ({last / first:.2g}x)")
    if all(isinstance(q, (int, float)) for _, q in rows):
        own = [max(0.0, d - q) for d, q in rows]
        a, b = float(median(own[:third])), float(median(own[-third:]))
        queued = [sum(q for _, q in part) / sum(d for d, _ in part) for part in (rows[:third], rows[-third:])]
        if a > 0 and 1 / DRIFT < b / a < DRIFT:
            return [f"{head}, while the time the training thread was not waiting for a CPU stays {ms(1e3 * a)} -> "
                    f"{ms(1e3 * b)} ms: it waited in the run queue {queued[0]:.0%} of the first third and "
                    f"{queued[1]:.0%} of the last. Other work on the machine came or went, not the script's: "
                    "rerun on a quiet machine, and compare and gate runs made in the same conditions"]
        if abs(queued[0] - queued[1]) >= QUEUE_SHIFT and (queued[1] > queued[0]) == (last > first):
            # the slower third also queued far more: the load changed; threads the scheduler parks
            # make an intra-op pool wait for the slowest, so the slowdown can exceed the queueing
            return [f"{head}, and the training thread waited in the run queue for a CPU {queued[0]:.0%} of the first "
                    f"third against {queued[1]:.0%} of the last: other work on the machine came or went, and "
                    "torch's threads wait for any the scheduler parks, so the drift can be that rather than the "
                    "script's work. Rerun on a quiet machine before reading the step time"]
        if min(queued) >= CONTENDED:
            # queued alike in both thirds, yet the own time moved: the spin of torch's threads for a
            # parked sibling counts as CPU time, so the load can move it as well as the work can
            # (pytorch/examples vae, fixed work a step: 1.2 s -> 0.23 s at 65% queued throughout)
            return [f"{head}, and the training thread waited in the run queue for a CPU {queued[0]:.0%} of the first "
                    f"third and {queued[1]:.0%} of the last. On a machine this busy the time it ran is no measure "
                    "of the work either (torch's threads spin on the CPU while they wait for one the scheduler "
                    f"parked): the steps may do {'more' if last > first else 'less'} work as the run goes on, or "
                    "the other work on the machine changed. Rerun on a quiet machine before reading the step time"]
    why = ("episodes or sequences that grow, a curriculum, a later phase or model" if last > first
           else "episodes that get shorter, work that stops part-way through, caches that fill")
    return [f"{head}. The steps do {'more' if last > first else 'less'} work as the run goes on ({why}), so the "
            "time per step depends on how long the run was: compare and gate runs of the same length"]


KINDS = 2.0          # the long kind's median step this many times the short kind's
KIND_GAP = 1.5       # and no step between them: the sorted steps jump this much from one kind to the other
KIND_SHARE = 0.2     # of the steps in each kind at least (fewer long ones are long steps: analyze/longsteps.py)
KIND_STEPS = 12      # steady steps needed to tell two kinds
MIXED = 0.2          # kind changes per step at least: mixed through the run (fewer: a drift, or two phases)
ALTERNATE = 0.8      # kind changes per step from which the kinds alternate


def kinds_note(steady: list[dict]) -> list[str]:
    """A note when the steady steps come in two kinds mixed through the run (batches of 8 and of
    512 in turn: 2.5 and 13.5 ms): the time per step is their mean, right for the run, while the
    median is one kind's and matches neither the mean nor a typical step; a trace of a few steps
    holds one kind or the other in its own proportion. Two kinds, each at least KIND_SHARE of the
    steps, separated by a jump of KIND_GAP between neighbours in sorted order and KINDS between
    their medians, whose order changes at least MIXED times a step (a drift or a change of phase
    is drift_note's; where this note is made, no drift note is: each third's median falls on
    either kind, a 3.3x "drift" of two kinds in turn)."""
    rows = [s for s in steady if isinstance(s.get("dur"), (int, float)) and s["dur"] > 0]
    durs = [float(s["dur"]) for s in rows]
    n = len(durs)
    if n < KIND_STEPS:
        return []
    least = max(1, math.ceil(KIND_SHARE * n))            # steps in each kind
    order = sorted(durs)
    k = max(range(least, n - least + 1), key=lambda i: order[i] / order[i - 1])
    if order[k] / order[k - 1] < KIND_GAP:
        return []
    short, long_ = float(median(order[:k])), float(median(order[k:]))
    if long_ < KINDS * short:
        return []
    cut = order[k]
    kinds = [d >= cut for d in durs]
    changes = sum(a != b for a, b in zip(kinds, kinds[1:])) / (n - 1)
    if changes < MIXED:
        return []
    how = "they alternate" if changes >= ALTERNATE else "mixed through the run"
    head = (f"the steady steps are of two kinds, {how}: {k} of about {ms(1e3 * short)} ms and {n - k} of about "
            f"{ms(1e3 * long_)} ms (their medians). The time per step is their mean, right for the run; the median "
            "is one kind's, and a trace of a few steps holds each kind in its own proportion")
    if all(isinstance(s.get("runq"), (int, float)) for s in rows):
        # the time the training thread ran, not queued for a CPU: one kind, then the machine made two
        own = [max(0.0, float(s["dur"]) - float(s["runq"])) for s in rows]
        a = float(median([o for o, x in zip(own, kinds) if not x]))
        b = float(median([o for o, x in zip(own, kinds) if x]))
        if a > 0 and b < KINDS * a:
            return [head + ". The long ones waited for a CPU: other work on the machine, not the script's, made "
                    "them long; rerun on a quiet machine"]
    return [head + " (batches of two sizes, or work every other step)"]
