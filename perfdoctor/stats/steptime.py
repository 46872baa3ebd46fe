"""Step time of a training run: the steady-state wall time per step, with a confidence interval
that respects the autocorrelation of the step series. The one estimator of step time, used by
`run`'s summary, `compare`, `gate` and `tune` (numpy only; never imports torch).

Why wall time over steps and never a median. With a bursty loader (3 DataLoader workers on 2
cores, say) batches arrive in bursts: most steps find a batch waiting and are short, and one in
a few waits for the next burst and is long. The median is then a short step, a fraction of the
time a step really costs, and dropping long steps as "outliers" drops the steps that carry the
waiting. So a run's step time is the wall time of its steady window divided by the steps in it
(the mean), no step inside the window is ever dropped, and the median is a secondary figure.

The steady window is detected, in this order:
1. disturbed steps are never in it: inside the profiled window (`profiled`), right after the
   trace export (`perturbed`), without a positive duration (`invalid`), and the first
   WARMUP_MIN steps of the run (`warmup`). The window is the longest run of consecutive
   remaining steps; the other remaining steps are `outside_window`.
2. prefetch fill: with num_workers > 0, the DataLoader's first num_workers x prefetch_factor
   (default 2) batches may wait ready at the start; leading steps of the window within those
   batches that are shorter than the window's level L are dropped (`prefetch_fill`). Only steps
   that drew a loader batch: a script without a DataLoader (its child processes a
   multiprocessing Pool, counted as workers by the samplers) has no prefetched batches.
3. transients: from the window's start, blocks of whole burst cycles (at least the block length
   and DETECT_BLOCK steps; a block cut mid-burst would look fast or slow) whose mean
   lies more than K_SPREAD robust spreads (1.4826 x MAD of the block means, at least
   SPREAD_FLOOR x L) and more than MATERIAL x L away from L (the median of the block means)
   are dropped: above L `warmup`, below L `fast_start`. The first block within that band ends
   the transient. A slow drift over the whole window stays inside the band and is kept. A
   window too short for such blocks drops, as `warmup`, its leading steps that are each more
   than MATERIAL slower than every later step (at most half of it): a level never returned to.
4. whole burst cycles: the window's last (n mod cycle) steps are dropped (`partial_cycle`), so
   its wall time / steps does not depend on where the bursts fall.

Block length and CI95: perfdoctor.stats.blockboot (the moving-block bootstrap of the mean).

Conclusive: at least MIN_STEPS steady steps, and at least MIN_BLOCKS blocks of 2 burst cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.stats.blockboot import MIN_BLOCKS, block_length, bootstrap_means, burst_cycle, relative_means

MIN_STEPS = 10
WARMUP_MIN = 2
DETECT_BLOCK = 8
K_SPREAD = 4.0
MATERIAL = 0.10               # a step-time change this large matters: a shift of level here, a
                              # speed-up or slowdown in tune, gate's --min-effect default
SPREAD_FLOOR = 0.01
MAD_SCALE = 1.4826
PREFETCH_DEFAULT = 2          # torch's DataLoader default prefetch_factor with workers
SEED = 20240601
LEVEL = 0.95
END_TOLERANCE = 0.02          # `end` timestamps agree with the durations within 2% (no clock jump)


def ms(v: float, like: float | None = None) -> str:
    """A step time in ms as every output prints it: >= 3 significant figures (0.312, not 0.3), and
    no decimal from a second up (7821, not 7820.8); `like`: its decimals."""
    ref = abs(v if like is None else like)
    digits = 0 if ref >= 1000 else 1 if ref >= 10 or not ref or ref != ref else min(6, 2 - math.floor(math.log10(ref)))
    return f"{v:.{digits}f}"


@dataclass
class StepEstimate:
    step_s: float | None                    # steady wall time / steps in the window
    ci95: tuple[float, float] | None        # block-bootstrap CI of step_s
    median_s: float | None                  # secondary figure only
    n: int                                  # steps in the steady window
    total: int                              # steps given
    first: int                              # index of the first steady step in the input
    dropped: dict                           # reason -> count
    wait_share: float | None                # data wait / wall time of the window
    block: int                              # block length the CI used
    conclusive: bool
    reason: str | None
    p90_s: float | None = None              # secondary figure only
    source: str = "durations"               # or "end timestamps": where the wall time came from
    durs: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    waits: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    step_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    # the window's step numbers (the records' "step", else their place in the input), one per
    # entry of durs: two runs of one script are paired by them (stats.speedups)

    @property
    def scale(self) -> float:
        """step_s / mean(durs): 1 unless `end` timestamps gave the wall time."""
        m = float(self.durs.mean()) if len(self.durs) else 0.0
        return self.step_s / m if self.step_s and m > 0 else 1.0

    @property
    def steps_per_s(self) -> float | None:
        return 1.0 / self.step_s if self.step_s else None

    def window(self, steps: list) -> list:
        """The steady window's entries of `steps`, the list this estimate was made from."""
        return steps[self.first:self.first + self.n]

    def describe(self) -> str:
        parts = [f"{v} {k.replace('_', ' ')}" for k, v in self.dropped.items() if v]
        where = f"{self.n} of {self.total} steps" + (f" (dropped {', '.join(parts)})" if parts else "")
        if self.step_s is None:
            return f"no steady step time: {where}" + (f"; {self.reason}" if self.reason else "")
        t = 1e3 * self.step_s
        text = f"{ms(t)} ms/step"
        if self.ci95:
            text += f" (95% CI {ms(1e3 * self.ci95[0], t)}-{ms(1e3 * self.ci95[1], t)} ms, blocks of {self.block})"
        text += f", median {ms(1e3 * self.median_s)} ms, over {where}"
        return text + ("" if self.conclusive else f"; inconclusive: {self.reason}")

    def to_dict(self) -> dict:
        return {"step_s": self.step_s, "ci95": list(self.ci95) if self.ci95 else None, "median_s": self.median_s,
                "p90_s": self.p90_s, "n": self.n, "total": self.total, "first": self.first,
                "dropped": dict(self.dropped), "wait_share": self.wait_share, "block": self.block,
                "conclusive": self.conclusive, "reason": self.reason, "source": self.source}


# Why a step is not in the steady window, in words (reports say it beside the steady count).
LEFT_OUT_WORDS = {"warmup": "warm-up", "profiled": "profiled", "perturbed": "after the trace export",
                  "invalid": "without a duration", "outside_window": "outside the longest undisturbed run",
                  "prefetch_fill": "prefetched at the start", "fast_start": "fast start",
                  "partial_cycle": "in a partial burst cycle"}


def left_out_text(dropped) -> str | None:
    """'10 profiled, 8 outside the longest undisturbed run, 2 warm-up' (most first), None when
    nothing was left out or `dropped` is not a {reason: count} (a hand-edited report)."""
    if not isinstance(dropped, dict):
        return None
    parts = [(v, LEFT_OUT_WORDS[k]) for k, v in dropped.items()
             if k in LEFT_OUT_WORDS and isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return ", ".join(f"{v} {w}" for v, w in sorted(parts, key=lambda p: -p[0])) or None


def inconclusive_text(reason) -> str:
    """' (inconclusive: only 6 steady steps (need 10))' for the run's step line: the estimate's
    reason (run.json's step_time_reason); ' (too few to tell)' for a run from an older perfdoctor
    or a hand-edited report, which has none."""
    return f" (inconclusive: {reason})" if isinstance(reason, str) and reason else " (too few to tell)"


# --- the estimate -------------------------------------------------------------------------------

def estimate(steps: list[dict], *, num_workers: int | None = None,
             prefetch_factor: int | None = None) -> StepEstimate:
    """Steady-state step time of step records as in steps.jsonl ({"dur", "wait", "end", "batches",
    "profiled", "perturbed", ...}; seconds). See the module docstring for the rules."""
    total = len(steps)
    why = [_disturbed(s) for s in steps]
    for i in range(min(WARMUP_MIN, total)):
        why[i] = why[i] or "warmup"
    a, e = _longest_run([w is None for w in why])
    dropped: dict = {}
    for i, w in enumerate(why):
        if w is not None or not a <= i < e:
            k = w or "outside_window"
            dropped[k] = dropped.get(k, 0) + 1
    durs = np.array([float(s["dur"]) for s in steps[a:e]], dtype=float)
    waits = np.array([_num(s.get("wait")) for s in steps[a:e]], dtype=float)
    ids = np.array([_step_no(s, a + i) for i, s in enumerate(steps[a:e])], dtype=np.int64)
    ends = [s.get("end") for s in steps]
    batches = np.array([max(_num(s.get("batches"), 1.0), 0.0) for s in steps], dtype=np.float64)
    lead = _leading(durs, a, batches, num_workers, prefetch_factor)
    for k, v in lead.items():
        if v:
            dropped[k] = dropped.get(k, 0) + v
    cut = sum(lead.values())
    first = a + cut
    res = _finish(durs[cut:], waits[cut:], total, first, dropped, num_workers, ends, ids[cut:])
    if cut > (e - a) // 2 and res.conclusive:
        res.conclusive = False
        res.reason = (f"no steady state: the level changed over {cut} of the window's {e - a} steps "
                      "(warm-up or a change of speed)")
    return res


def estimate_durations(durs, waits=None) -> StepEstimate:
    """The estimate of a plain series of step durations (seconds), and optionally data waits."""
    d = np.asarray(durs, dtype=float).ravel()
    w = np.zeros(len(d)) if waits is None else np.asarray(waits, dtype=float).ravel()
    return estimate([{"dur": float(x), "wait": float(y)} for x, y in zip(d, w)])


def _disturbed(s: dict) -> str | None:
    if s.get("profiled"):
        return "profiled"
    if s.get("perturbed"):
        return "perturbed"
    d = s.get("dur")
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d <= 0:
        return "invalid"
    return None


def _step_no(s: dict, i: int) -> int:
    """A record's step number: its "step" when it has one (steps.jsonl) that fits an int64 (a
    hand-edited 1e30 does not), else its place `i`."""
    v = s.get("step")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2 ** 62 else i


def _num(x, default: float = 0.0) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else default


def _longest_run(ok: list[bool]) -> tuple[int, int]:
    """[start, end) of the longest run of True (the later one on a tie); (0, 0) when none."""
    best, start = (0, 0), None
    for i, v in enumerate(ok + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            if i - start >= best[1] - best[0]:
                best = (start, i)
            start = None
    return best


def _level(x: np.ndarray, size: int) -> tuple[float, float, np.ndarray]:
    """(L, spread, block means): median and floored robust spread of non-overlapping block means."""
    k = len(x) // size
    means = x[:k * size].reshape(k, size).mean(axis=1) if k else np.array([float(x.mean())])
    level = float(np.median(means))
    spread = max(MAD_SCALE * float(np.median(np.abs(means - level))), SPREAD_FLOOR * level)
    return level, spread, means


def _leading(durs: np.ndarray, offset: int, batches: np.ndarray, num_workers, prefetch_factor) -> dict:
    """Steps to drop from the window's start, by reason: prefetch fill, then warm-up/fast-start blocks.
    `batches`: the loader batches each step drew (every step's, the window starting at `offset`)."""
    out = {"prefetch_fill": 0, "warmup": 0, "fast_start": 0}
    n = len(durs)
    if n < MIN_STEPS:
        return out
    need, used = block_length(durs, num_workers)
    size = need * math.ceil(max(used, DETECT_BLOCK) / need)     # whole burst cycles: no phase effect
    level, spread, _ = _level(durs, size)
    i = 0
    if num_workers and num_workers > 0:
        ready = num_workers * (prefetch_factor or PREFETCH_DEFAULT)
        drawn = np.cumsum(batches)                  # batches drawn up to each step, that one's included
        # a step that drew no loader batch took none of the prefetched ones
        while i < n // 2 and batches[offset + i] > 0 and drawn[offset + i] <= ready and durs[i] < level:
            i += 1
        out["prefetch_fill"] = i
    margin = max(K_SPREAD * spread, MATERIAL * level)
    if n - i - size < MIN_BLOCKS * size:
        out["warmup"] = _leading_slower(durs[i:])
        return out
    while n - i - size >= MIN_BLOCKS * size:
        m = float(durs[i:i + size].mean())
        if m > level + margin:
            out["warmup"] += size
        elif m < level - margin:
            out["fast_start"] += size
        else:
            break
        i += size
    return out


def _leading_slower(durs: np.ndarray) -> int:
    """A window too short for blocks (under MIN_BLOCKS + 1 of them): its leading steps that are
    each more than MATERIAL slower than every step after them, at most half of it: a level the
    run never returns to is a transient, not a burst (a burst's long steps come back). A 15-step
    run of a 0.6 ms script kept steps of 88, 88 and 48 ms that its start-up had slowed (half of
    each waiting for a core): 11.2 ms/step, and gate called an unchanged script 23x slower."""
    n = len(durs)
    later_max = np.maximum.accumulate(durs[::-1])[::-1]      # the longest step from i on
    k = 0
    while k < n // 2 and durs[:k + 1].min() > (1 + MATERIAL) * later_max[k + 1]:
        k += 1
    return k


def _wall(first: int, n: int, durs: np.ndarray, ends: list) -> tuple[float, str]:
    """Wall time of the window: end[last] - end[first - 1] when the timestamps agree with the
    durations (no clock jump, nothing of ours between the steps), else the sum of durations."""
    s = float(durs.sum())
    if first >= 1 and n:
        e0, e1 = ends[first - 1], ends[first + n - 1]
        if isinstance(e0, (int, float)) and isinstance(e1, (int, float)):
            wall = float(e1) - float(e0)
            if s <= wall * (1 + 1e-6) + 1e-6 and wall <= s * (1 + END_TOLERANCE):
                return wall, "end timestamps"
    return s, "durations"


def _finish(durs, waits, total, first, dropped, num_workers, ends, ids=None) -> StepEstimate:
    n = len(durs)
    ids = np.arange(first, first + n, dtype=np.int64) if ids is None else ids
    if n == 0:
        return StepEstimate(None, None, None, 0, total, first, dropped, None, 0, False,
                            "no steady steps (every step was warm-up, profiled or disturbed)")
    cycle = burst_cycle(durs)
    if cycle > 1 and n % cycle and n >= 2 * cycle:
        # whole burst cycles: any `cycle` consecutive steps of a periodic burst sum to the same
        # time, so the window's wall time / steps does not depend on where the bursts fall
        cut = n % cycle
        dropped["partial_cycle"] = cut
        durs, waits, ids, n = durs[:n - cut], waits[:n - cut], ids[:n - cut], n - cut
    wall, source = _wall(first, n, durs, ends)
    step = wall / n
    need, block = block_length(durs, num_workers)
    est = StepEstimate(step, None, float(np.median(durs)), n, total, first, dropped,
                       float(waits.sum()) / wall if wall > 0 else None, block, True, None,
                       float(np.percentile(durs, 90)), source, durs, waits, ids)
    if n >= 2:
        rel = relative_means(bootstrap_means(durs, block, np.random.default_rng(SEED)))
        lo, hi = step * np.percentile(rel, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
        est.ci95 = (float(min(lo, step)), float(max(hi, step)))
    if n < MIN_STEPS:
        est.conclusive, est.reason = False, f"only {n} steady steps (need {MIN_STEPS})"
    elif need * MIN_BLOCKS > n:
        est.conclusive = False
        est.reason = (f"step times stay correlated over {need} steps (2 burst cycles), more than "
                      f"1/{MIN_BLOCKS} of the {n} steady steps: run longer")
    return est


def trace_inflation(traced_ms: float | None, steady_ms: float | None) -> float | None:
    """Traced over un-profiled step time, never below 1 (a traced window that ran faster than
    the steady one lowers no ceiling); None unless both are known."""
    if not traced_ms or not steady_ms or not math.isfinite(traced_ms / steady_ms) or traced_ms <= 0 or steady_ms <= 0:
        return None
    return max(1.0, traced_ms / steady_ms)
