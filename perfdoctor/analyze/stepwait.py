"""What the training thread did while it waited for batches, from the step records of a live run.

Each steps.jsonl record holds the step's wall time (`dur`), its time inside DataLoader __next__
(`wait`), and the step thread's own time on a CPU (`cpu`) and queued for one (`runq`), from
/proc/thread-self/schedstat. The rest of the step, dur - cpu - runq, the thread slept: blocked
on a queue, a lock, a pipe or storage. Asleep for at most that long, the thread was awake (on a
CPU or queued for one) for at least wait - sleep of its wait. Summed over the steps:

    input.wait_busy_share = sum(max(0, wait - sleep)) / sum(wait)

a lower bound of the share of the data wait that the training thread spent doing the loading
work itself (num_workers=0: the whole batch; with workers: receiving it, i.e. unpickling, shared-
memory handles and queue bookkeeping) or queuing for a core, rather than waiting on the workers.
1.0 says the wait is work in the trainer; near 0 says it slept (workers late, storage, network).
None without schedstat, or when the wait is under MIN_WAIT_SHARE of the steps (nothing to split).

    run.runq_share = sum(runq) / sum(dur)

the share of the steps' wall time the training thread waited for a CPU: on a machine shared with
another job, or with more runnable threads than cores, the thread is ready but not running.

    run.runq_runnable_share = sum(runq) / sum(cpu + runq)

the share of the thread's runnable time it spent queued: its work took about 1 / (1 - this) as
long as it would on a core of its own (the sleeping part of the step is left out).

    run.thread_awake_share = sum(cpu + runq) / sum(dur)

the share of the steps' wall time the training thread was runnable (the rest it slept): the
bound of what removing its own work (Python, dispatch) can save. Only from runs whose `cpu` is
the thread's CPU clock (child.json "cpu_clock"): schedstat's runtime, read by older runs, lags a
running thread by up to a scheduler tick and read far too low on short steps.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

MIN_WAIT_SHARE = 0.01


def positive(x) -> float:
    """A step record's optional number (seconds, counts): itself when a positive number, else 0."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else 0.0


def positives(steps: list[dict], key: str) -> np.ndarray:
    """positive(s.get(key)) of each step record, as an array (a run of hours has hundreds of
    thousands of records: one pass, no call per record)."""
    c = _column(steps, key, bools=False)
    return np.where(c > 0, c, 0.0)


def timed_steps(steps: list[dict]) -> tuple[list[dict], float]:
    """The step records with a positive duration, and their summed duration (seconds)."""
    recs = [s for s in steps if isinstance(s.get("dur"), (int, float)) and s["dur"] > 0]
    return recs, sum(s["dur"] for s in recs)


class SleepSums(NamedTuple):
    """Summed over the step records that have a positive dur, cpu and runq (_sleeps)."""
    dur: float      # their wall time
    sleep: float    # the step thread's sleep in them
    wait: float     # their DataLoader data wait, each step's within [0, dur]
    runq: float     # the step thread's time queued for a CPU, each step's within [0, dur]


def sleep_sums(steps: list[dict]) -> SleepSums:
    """The steps' wall time, and the step thread's sleep, data wait and run-queue wait in it."""
    d, slept, w, runq = _sleeps(steps)
    return SleepSums(float(d.sum()), float(slept.sum()), float(np.clip(np.nan_to_num(w), 0.0, d).sum()),
                     float(np.clip(runq, 0.0, d).sum()))


def wait_busy_share(steps: list[dict]) -> float | None:
    d, slept, w, _ = _sleeps(steps)
    ok = ~np.isnan(w)
    d, slept, w = d[ok], slept[ok], w[ok]
    wait, total = float(np.maximum(w, 0.0).sum()), float(d.sum())
    busy = float(np.maximum(np.minimum(w, d) - slept, 0.0).sum())
    if total <= 0 or wait < MIN_WAIT_SHARE * total:
        return None
    return min(1.0, busy / wait)


def _sleeps(steps: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Over the step records with a positive dur, and cpu and runq as numbers (no schedstat: none):
    their dur, the thread's sleep (dur - cpu - runq, at least 0), data wait (NaN where it is no
    number) and runq, as columns (a run of hours has hundreds of thousands of records)."""
    d, cpu, runq, w = (_column(steps, k, bools=False) for k in ("dur", "cpu", "runq", "wait"))
    ok = np.isfinite(d) & np.isfinite(cpu) & np.isfinite(runq) & (np.nan_to_num(d) > 0)
    d, cpu, runq, w = d[ok], cpu[ok], runq[ok], w[ok]
    return d, np.maximum(0.0, d - cpu - runq), w, runq


def _summed_share(steps: list[dict], num: tuple[str, ...], den: tuple[str, ...]) -> float | None:
    """sum(num fields) / sum(den fields) over the steps that have every field as a finite number
    and a positive denominator (each field at least 0), at most 1; None when no step does. In
    columns: a run of hours has hundreds of thousands of step records."""
    cols = {k: _column(steps, k) for k in (*num, *den)}
    ok = np.logical_and.reduce([np.isfinite(c) for c in cols.values()])
    d = sum(np.maximum(cols[k], 0.0) for k in den)
    ok &= np.nan_to_num(d) > 0
    b = float(d[ok].sum())
    if b <= 0:
        return None
    a = float(sum(np.maximum(cols[k], 0.0) for k in num)[ok].sum())
    return min(1.0, a / b)


def _column(steps: list[dict], key: str, bools: bool = True) -> np.ndarray:
    """The steps' field `key` as floats, NaN where it is no number (`bools` False: nor a bool)."""
    if bools:
        values = (v if isinstance(v := s.get(key), (int, float)) else np.nan for s in steps)
    else:
        values = (v if type(v := s.get(key)) in (int, float) else np.nan for s in steps)
    return np.fromiter(values, dtype=float, count=len(steps))


def runq_share(steps: list[dict]) -> float | None:
    return _summed_share(steps, ("runq",), ("dur",))


def thread_awake_share(steps: list[dict]) -> float | None:
    """sum(cpu + runq) / sum(dur): the share of the steps' wall time the training thread was
    runnable, on a CPU or queued for one (the rest it slept: in a wait, a lock, storage,
    time.sleep). What removing the thread's own work (compiling away its Python) can save is at
    most this: the queueing goes with the work it queued for."""
    return _summed_share(steps, ("cpu", "runq"), ("dur",))


def runq_runnable_share(steps: list[dict]) -> float | None:
    return _summed_share(steps, ("runq",), ("runq", "cpu"))


def extra_batches(steps: list[dict]) -> dict | None:
    """Steps that drew more DataLoader batches than the usual step (an evaluation or a second
    loader inside them): {"steps", "of", "usual", "most", "time_share", "excess_share",
    "wait_share"} (excess_share: their time beyond as many usual steps, the median usual step's
    duration each, over all the steps' time: what running that loop less often can save;
    wait_share: their data wait over all the steps' data wait), or None when no step did. A step
    that draws one batch where the usual step draws none is the loop's own batch, not another
    loop: several updates per batch (GAN critics, PPO epochs over a batch) draw one every few steps."""
    recs = [s for s in steps if isinstance(s.get("batches"), (int, float)) and isinstance(s.get("dur"), (int, float))]
    if len(recs) < 3:
        return None
    counts = sorted(s["batches"] for s in recs)
    usual = counts[len(counts) // 2]
    extra = [s for s in recs if s["batches"] > max(usual, 1)]
    total = sum(s["dur"] for s in recs)
    wait = sum(s.get("wait") or 0.0 for s in recs)
    if not extra or total <= 0:
        return None
    plain = sorted(s["dur"] for s in recs if s["batches"] <= max(usual, 1))
    typical = plain[len(plain) // 2]
    extra_time = sum(s["dur"] for s in extra)
    return {"steps": len(extra), "of": len(recs), "usual": usual, "most": max(s["batches"] for s in extra),
            "time_share": extra_time / total,
            "excess_share": max(0.0, extra_time - len(extra) * typical) / total,
            "wait_share": (sum(s.get("wait") or 0.0 for s in extra) / wait) if wait > 0 else None}


def few_steps_metrics(steps: list[dict]) -> dict:
    """Data wait over every measured step, warm-up included: the steady-window statistics need
    more steps than a run of a few long ones has, yet its wait was measured (PD114 reads it)."""
    dur = sum(s["dur"] for s in steps)
    return {"run.all_steps_wait_share": sum(s["wait"] for s in steps) / dur if dur > 0 else None}
