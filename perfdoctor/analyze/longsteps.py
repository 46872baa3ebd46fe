"""Long steps among the usual ones: work that runs every N steps (`perfdoctor run` only).

An evaluation every 20 steps, a checkpoint, a log line that reads device values, Python's
garbage collector: a few steps run far longer than the others. The steady step time counts
them (a step time is wall time over steps), but the profiled window of a few steps most often
holds only usual steps, so the trace's breakdown describes the usual step and says nothing of
where the long steps' time goes. With 1 step in 20 taking 50x the others, the trace
describes a third of the run.

Each step's own time is what it spent outside DataLoader __next__ and outside the run queue
(`dur - wait - runq` from steps.jsonl): a bursty loader's long waits are input (run.data_wait_
share says so) and a neighbour's load is the machine's, not the step's work. A step is long when
its own time is at least LONG times the median step's.

Work every N steps recurs at a period: the steps are folded by a period P (step i in phase
i mod P), and a phase is long when at least two thirds of its steps (3 or more) are long, beyond
chance (long steps at the run's rate anywhere would make a phase that long with a probability,
times every phase of every period tried at every threshold, of at most ALPHA). A period's phases
are judged at the lowest threshold (2x, 4x ... the usual step) where they pass: on a busy machine
1 step in 8 runs 2-4x long at random, and at 2x a phase of 4 steps is then long by chance, while
past 8x only an evaluation's steps remain. Long steps that recur at no period (a page fault
storm, another process's burst) are the machine's noise and stay out. The period taken is
the one whose long phases hold the most time beyond the usual step (the shortest of those within
5% of it: twice the period holds the same steps); the candidates are the most frequent distances
between nearby long steps, among the steps past each of a few thresholds (2x, 4x ... 128x the
usual step: the rarest work is the longest, and past its own threshold its neighbours are its own).

    loop.long_steps_share = sum(dur_i - median(dur), steps in long phases) / sum(dur_i)

the steps' cost to the run beyond as many usual steps, their queueing for a CPU (a step that
works longer queues longer) and their own DataLoader waits (an evaluation's batches) included:
what making that work rarer, or taking it off the training step, can save. At most a third of the phases may be long (more is a loop of two kinds
of step, not a few long ones). loop.long_steps_traced counts the profiled steps that fall in the
long phases, by their step numbers, so the diagnosis can say whether the breakdown saw any.

loop.long_steps_any_share is the same sum over every long step, at a period or not: a steady
window of 20 steps with an evaluation every 10 holds 2 of them, too few to show a period, yet
their cost to that window is measured all the same. It bounds what work that only long steps
hold (a trace's evaluation in its long step) can cost the run (analyze/callshares.py).

loop.long_steps_plain_share is loop.long_steps_share over the long steps that hold no timed work
of a named cause: a step's no-grad calls (`nograd`), checkpoint saves (`save`), logging (`log`)
and loader starts (`istart`, `ishut`, `ifirst`) beyond their median per step are its named time
(a teacher's no-grad forward in every step names no step), and a long step whose named time is
at least half its excess over the usual step is that cause's. The rest of such a step's excess is
the cause's too: its glue (model.eval(), model.train()) and what it does to the step's own work
(an evaluation of 40 forwards left the training part of its step 0.93 ms against 0.61 ms usually:
a tenth of the evaluation's cost, untimed). unexplained() takes the smaller of this and the
long-step share less the named shares, so a cause in the same steps as a named one goes unseen
until the named one is fixed: it errs low, as a lower bound should.
"""

from __future__ import annotations

import math

import numpy as np

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.stepwait import positives, timed_steps

LONG = 2.0          # a step doing twice the usual step's work does something the usual one does not
MIN_REPEATS = 3     # a phase needs 3 steps in the window to show a pattern
PHASE_LONG = 2 / 3  # of its steps long, for a phase to be long
MOST = 1 / 3        # of the phases long, at most
NEARBY = 4          # candidate periods: distances from each long step to the next few
MIN_STEPS = 10
SAME = 0.95         # a shorter period holding this share of the best one's time is the period
ALPHA = 0.01        # a long phase by chance, over every phase tried: at most this likely
UNKNOWN_AT = 0.1    # long steps at no period holding this share of the time: unknown, not none
TIERS = 7           # thresholds LONG x 1, 2, 4 ... 64 times the usual step
PER_TIER = 8        # the most frequent distances tried from each (each a pass over the steps)

NAMES = ("loop.long_steps_share", "loop.long_steps_every", "loop.long_step_ms", "loop.usual_step_ms",
         "loop.long_steps_traced", "loop.long_steps_any_share", "loop.long_steps_plain_share")
NAMED = ("nograd", "save", "log", "istart", "ishut", "ifirst")   # step record fields timing a named cause


def own_times(recs: list[dict]) -> np.ndarray:
    """Each step's time outside the data wait and the run queue (seconds): its own work."""
    dur = np.fromiter((s["dur"] for s in recs), dtype=float, count=len(recs))
    return np.maximum(0.0, dur - positives(recs, "wait") - positives(recs, "runq"))


def periodic_long(own: np.ndarray, usual: float, pos: np.ndarray | None = None) -> tuple[int, np.ndarray] | None:
    """(period, mask of the steps in its long phases) for the period whose long phases hold the
    most time beyond `usual`; None when no period has one whose long phases are beyond chance (a
    phase of 3 steps is long by chance now and then, among the many phases tried).
    `pos`: each step's position (its step number from the first), the index by default."""
    pos = np.arange(own.size) if pos is None else pos
    span = int(pos[-1]) + 1 if pos.size else 0
    if int((own >= LONG * usual).sum()) < MIN_REPEATS:
        return None
    excess = np.clip(own - usual, 0, None)
    # candidate periods: the most frequent distances between nearby long steps, among the steps
    # past each of a few thresholds (LONG x 2^k): work every 500 steps, 50x the usual step, among
    # noise at 5x every few steps has only its own kind as neighbours past 16x. A period's phases
    # are judged at the lowest threshold where they stand out beyond chance: a busy machine's 2-4x
    # steps at random make a phase long at 2x by chance, not one long at 8x
    cands: set[int] = set()
    tiers: list[np.ndarray] = []        # each threshold's long steps, while 3 or more pass it
    for k in range(TIERS):
        past = own >= LONG * 2 ** k * usual
        at = pos[past]
        if at.size < MIN_REPEATS:
            break
        tiers.append(past)
        d = np.concatenate([at[j:] - at[:-j] for j in range(1, min(NEARBY, at.size - 1) + 1)])
        d = d[(d >= 2) & (d <= span // MIN_REPEATS)]
        if d.size:
            tally = np.bincount(d)                  # d holds small positive ints
            values = np.flatnonzero(tally)
            counts = tally[values]
            cands.update(int(v) for v in values[np.argsort(-counts, kind="stable")[:PER_TIER]])
    best: list[tuple[int, float, np.ndarray]] = []
    tried = sum(cands) * len(tiers)     # phases tried at each threshold: the Bonferroni factor
    for period in sorted(cands):
        phase = pos % period
        counts = np.bincount(phase, minlength=period)
        for past in tiers:                          # the lowest threshold whose long phases pass
            phases = _long_phases(phase, counts, past, period, tried)
            if phases is not None:
                mask = phases[phase]
                best.append((period, float(excess[mask].sum()), mask))
                break
    if not best:
        return None
    top = max(x[1] for x in best)
    period, _, mask = next(x for x in best if x[1] >= SAME * top)        # sorted: the shortest
    return period, mask


def _long_phases(phase: np.ndarray, counts: np.ndarray, past: np.ndarray, period: int,
                 tried: int) -> np.ndarray | None:
    """The phases of `period` where at least PHASE_LONG of the steps are past a threshold (`past`:
    each step's), when there are some, at most MOST of the phases, and each is that long beyond
    chance: steps past it at their rate anywhere, the chance of a phase this long (a Chernoff
    bound of its binomial tail), times every phase tried (Bonferroni), at most ALPHA."""
    longs = np.bincount(phase, weights=past, minlength=period)
    phases = (counts >= MIN_REPEATS) & (longs >= PHASE_LONG * counts)
    if not phases.any() or phases.sum() > MOST * period:
        return None
    rate = float(past.mean())
    if any(_tail(int(longs[i]), int(counts[i]), rate) * tried > ALPHA for i in np.flatnonzero(phases)):
        return None
    return phases


def _tail(k: int, n: int, p: float) -> float:
    """An upper bound of P(X >= k) for X ~ Binomial(n, p) (Chernoff: exp(-n KL(k/n || p)))."""
    a = k / n
    if a <= p:
        return 1.0
    if p <= 0:
        return 0.0
    kl = a * math.log(a / p) + ((1 - a) * math.log((1 - a) / (1 - p)) if a < 1 else 0.0)
    return math.exp(-n * kl)


def long_step_metrics(steady: list[dict], profiled: list[dict]) -> dict:
    """loop.long_steps_* over the steady steps (a contiguous window), folded by step number;
    loop.long_steps_traced: the profiled steps in the long phases (None without any). None when
    the steps are too few to tell, or when long steps hold a tenth of the time or more at no
    period this window shows (too short to see one repeat, or at random); 0.0 when no long
    steps stand out."""
    out = dict.fromkeys(NAMES)
    recs, wall = timed_steps(steady)
    if len(recs) < MIN_STEPS:
        return out
    own = own_times(recs)
    usual = float(median(own))
    steps = [s.get("step") for s in recs]
    numbered = all(isinstance(x, int) and not isinstance(x, bool) for x in steps) and steps == sorted(set(steps))
    pos = np.array(steps) - steps[0] if numbered else np.arange(len(recs))
    found = periodic_long(own, usual, pos) if usual > 0 else None
    dur = np.array([s["dur"] for s in recs])
    typical = float(median(dur))
    if usual > 0:
        out["loop.long_steps_any_share"] = float(np.clip(dur[own >= LONG * usual] - typical, 0, None).sum()) / wall
    if found is None:
        loose = float(np.clip(own - usual, 0, None)[own >= LONG * usual].sum()) / wall if usual > 0 else 0.0
        out["loop.long_steps_share"] = None if loose >= UNKNOWN_AT else 0.0
        return out
    period, mask = found
    # the time those steps cost the run beyond as many usual steps: their wall time, their
    # queueing and their own loader's waits included (an evaluation's batches are its work)
    long_phases = {int(p) % period for p in pos[mask]}
    out["loop.long_steps_share"] = float(np.clip(dur[mask] - typical, 0, None).sum()) / wall
    named = sum(np.clip(col - median(col), 0, None) for col in (positives(recs, k) for k in NAMED))
    plain = mask & (named < 0.5 * (dur - typical))
    out["loop.long_steps_plain_share"] = float(np.clip(dur[plain] - typical, 0, None).sum()) / wall
    out["loop.long_steps_every"] = period / len(long_phases)
    out["loop.long_step_ms"] = 1e3 * float(median(dur[mask]))
    out["loop.usual_step_ms"] = 1e3 * typical
    if profiled and numbered and all(isinstance(s.get("step"), int) for s in profiled):
        out["loop.long_steps_traced"] = sum(1 for s in profiled if (s["step"] - steps[0]) % period in long_phases)
    return out


def long_steps_part(dur: np.ndarray, part: np.ndarray, total: float) -> tuple[float | None, float | None]:
    """Of a per-step time `part` (a trace's no-grad stretch, its compile time), what only the long
    traced steps hold: in each step at least LONG times the median step, its part beyond the median
    step's (work in every step puts about as much in each: none of it counts), as a share of the
    steps' time `total` and as a fraction of those steps' time beyond the median step's (1: the
    long steps are this part). (None, None) with fewer than 3 steps or no long one."""
    usual, p_usual = median(dur), median(part)
    long = dur >= LONG * usual
    if len(dur) < 3 or usual <= 0 or not long.any():
        return None, None
    extra = float(np.clip(part[long] - p_usual, 0, None).sum())
    excess = float((dur[long] - usual).sum())
    return min(1.0, extra / total), min(1.0, extra / excess)


def unexplained(m: dict) -> float | None:
    """loop.long_steps_share less what the run already names (an evaluation, checkpoint saves,
    logging, DataLoader iterators started each epoch, recompiles): what no measured cause accounts for. The
    named shares can include work spread over every step, so this errs low: a lower bound of the
    unnamed long-step time. At most loop.long_steps_plain_share: a long step that is mostly a
    named cause's work is that cause's (module doc)."""
    share = m.get("loop.long_steps_share")
    if share is None:
        return None
    named = sum(m.get(k) or 0.0 for k in ("evaluation.share", "save.share", "logging.share", "loader.restart_share",
                                          "compile.run_share"))
    plain = m.get("loop.long_steps_plain_share")
    return max(0.0, min(share - named, share if plain is None else plain))
