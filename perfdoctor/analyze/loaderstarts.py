"""What starting DataLoader iterators costs the steady steps (loop.peek_*, loader.restart_share; `run` only).

collect/loaderiters.py records per step the time inside DataLoader.__iter__ (`istart`), inside
iterator shutdowns (`ishut`) and inside the first __next__ of each new iterator (`ifirst`, `nfirst`
of them), and finds peeks: iterators that drew at most two batches, never ran out, and were
followed by a new iterator of the same loader (`next(iter(loader))` before an epoch, or an
iterator re-created every step). A peek's time (`peek`: its start, and its batches and shutdown
when it drew in the step where it is found) is waste: the loop draws its own batches. An
iterator re-created every step is found a peek in the next step; its batch was its step's batch,
which the step needed: its start and shutdown count, and, with workers, the wait for its first
batch beyond the usual wait (`peek_first`, `npeek_first` of them): fresh workers make that batch
while the trainer waits, where a kept iterator's workers have it ready; without workers, the
sampler's order it drew in that wait (`peek_order`, in `peek`: a shuffled dataset's permutation,
less a kept iterator's one an epoch), and its shutdown is that order's release. (A user trial,
2 workers and `next(iter(loader))` every step: the start alone was 20% of the wall time, start,
shutdown and first batch 48%; keeping one iterator measured 10x and more on a busy 2-core VM.)

    loop.peek_share = (sum(peek) + sum(max(0, peek_first - npeek_first x usual wait))) / steady wall time
    loop.peek_order_share = sum(peek_order) / steady wall time      (inside the trainer's wait)

    loader.restart_share = (sum(istart + ishut + max(0, ifirst - nfirst x usual wait))
                            + the waits beyond the usual one for the new iterator's batches 2..W) / steady wall time

every iterator start, peeks included: with workers and persistent_workers=False each one starts
the worker processes, the old ones are shut down, and the first batch waits for fresh workers
(beyond the usual wait for a batch: the median wait per batch of the steps that started none);
so do the first batches of the other W - 1 workers, in the steps after the start that draw them
(a 2-core VM, 2 workers, 10-batch epochs: 22 ms in the step after each start, 2.4 ms usually;
persistent workers measured 5.0x (2.1-9.5x) where the starts' share without them claimed 2.4x,
under a 2.9x ceiling).
With persistent workers all of that is a reset of the sampler.

Both are None when the run did not time iterator starts (an older run); loop.peek_share is None
when a generation called a peek drew again later (two iterators of one loader used in turn: not a
peek, and which steps hold the error is unknown).

What each fix leaves of that time (kept_metrics). F = loader.kept_pace_ms, what one batch takes
a worker that makes batches for a kept iterator:

    loader.kept_pace_ms = loader.fetch_ms / (1 - run.runq_runnable_share)

the batch's work, queued for a CPU as the training thread is queued now (loader.fetch_wall_ms, the
workers' own wall per batch, when the trainer's queueing is unknown). Not the workers' own
queueing: fresh workers each make a batch or two of which the trainer takes one (a 2-core VM,
2 workers, 32 ms of CPU a batch: 3.8 batches made a step, one used), and that waste queues them
more than a kept iterator's workers (their wall per batch 131-144 ms; a kept iterator measured
40-150 ms a step, persistent workers' first batch and drain about 75 ms a batch). W = the workers.

    loop.peek_kept_share = sum(npeek_first) x F / W / steady wall time

keeping one iterator, its W workers still make the batch each step draws, one every F / W: the
step that waited for a fresh iterator's first batch waits for that (the VM above, torch on 2
threads: keeping one iterator measured 3.4x where the first batch's whole wait leaving claimed
5.4x; on 1 thread 9.5x measured, 5.3x claimed).

    loader.persistent_kept_share = sum(nfirst x max(0, F - usual wait) + (npeek_first + peek_batches) x (P - 1) x F) / steady wall time

persistent workers still make each new iterator's first batch while the trainer waits (F, of
which restart_share counts what is beyond the usual wait for a batch), and an
iterator dropped before it ran out leaves P (prefetch_factor, torch's default 2) batches queued in
each worker, which a persistent worker makes before it takes the reset (torch's _reset waits for
every worker's acknowledgement): the first of them in the making since the dropped iterator's
first batch, (P - 1) x F more. (A peek draws one batch: peek_batches counts the peeks
of the step.) The same VM, an iterator re-created every step: persistent workers measured 1.14x
(torch on 2 threads) and 1.59x (1 thread) where the starts' whole time leaving claimed 3.7x.

    loop.peek_every_step = the steady steps holding a start of an iterator re-created every step / the steady steps

such a step also forks the workers, which slows the rest of the step by an amount the run does
not measure: the fresh workers take the cores while the trainer computes, and torch's intra-op
threads wait for each other when one is parked (PD348). A probe on the shared 2-core VM, 2
workers: with torch's 2 threads the forward, backward and optimizer step took 7-137 ms in steps
that re-created the iterator, 1-77 ms with one kept, from one run to the next; with 1 thread
2.0 ms against 0.7 ms. Without workers such a step allocates and frees the sampler's order (a
shuffled TensorDataset of 2M rows, torch on 1 thread: the rest of the step took 2.3 ms against
1.45 ms with one iterator kept, which made the gain 100-119x where the order's draw and release
alone claimed 43-56x). The rules' ceilings leave that share of the rest of the step open.
None (each) when the run did not time starts; the kept shares also when F is unknown and there
were starts with workers.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.stepwait import positive, positives, timed_steps

NAMES = ("loop.peek_share", "loop.peek_batches", "loop.peek_order_share", "loader.restart_share", "loader.restarting")
KEPT = ("loop.peek_kept_share", "loader.persistent_kept_share", "loop.peek_every_step", "loader.kept_pace_ms")
MAX_QUEUED = 0.95      # a runnable share queued beyond this reads as a stalled thread, not a pace
PREFETCH_DEFAULT = 2  # torch DataLoader prefetch_factor with workers


def _count(x) -> int:
    """A count from child.json (workers, prefetch_factor): a positive int, else 0."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else 0


def usual_wait(recs: list[dict]) -> float:
    """The median wait per batch of the steps that started no iterator (0 when every step did)."""
    batches = np.fromiter((b if isinstance(b := s.get("batches"), (int, float)) else np.nan for s in recs),
                          dtype=float, count=len(recs))
    plain = (positives(recs, "nfirst") == 0) & (np.nan_to_num(batches) > 0)
    waits = np.sort(positives(recs, "wait")[plain] / batches[plain])
    return float(waits[waits.size // 2]) if waits.size else 0.0


def fresh_workers_wait(recs: list[dict], workers, usual: float) -> float:
    """Seconds the steps after a start waited, beyond the usual wait, for the batches 2..W of the
    new iterator: each of the W workers makes its first batch after its own start, and the steps
    that draw them wait for it (a 2-core VM, 2 workers, 10-batch epochs: the step after each start
    waited 22 ms against 2.4 ms usually). Steps in order; the start is taken to begin its step."""
    workers = _count(workers)
    if workers < 2:
        return 0.0
    extra, since = 0.0, None
    for s in recs:
        b = int(positive(s.get("batches")))
        if positive(s.get("nfirst")):
            since = b
            continue
        if since is not None and since < workers and b:
            early = min(b, workers - since)
            extra += max(0.0, positive(s.get("wait")) - b * usual) * early / b
        since = None if since is None else since + b
    return extra


def start_metrics(steady: list[dict], info: dict | None) -> dict:
    out = dict.fromkeys(NAMES)
    if not isinstance(info, dict) or info.get("installed") is not True:
        return out
    recs, total = timed_steps(steady)
    if total <= 0:
        return out
    restarting = info.get("restarting")
    out["loader.restarting"] = restarting if isinstance(restarting, bool) else None
    usual = usual_wait(recs)
    col = {k: positives(recs, k) for k in ("peek", "peek_first", "npeek_first", "istart", "ishut", "ifirst",
                                           "nfirst", "peek_batches", "peek_order")}
    peek = float((col["peek"] + np.maximum(0.0, col["peek_first"] - col["npeek_first"] * usual)).sum())
    starts = float((col["istart"] + col["ishut"] + np.maximum(0.0, col["ifirst"] - col["nfirst"] * usual)).sum())
    starts += fresh_workers_wait(recs, info.get("workers"), usual)
    batches = int(np.floor(col["peek_batches"]).sum())
    out["loader.restart_share"] = min(1.0, starts / total)
    out["loop.peek_order_share"] = min(1.0, float(col["peek_order"].sum()) / total)
    if not info.get("relabelled"):
        out["loop.peek_share"] = min(1.0, peek / total)
        out["loop.peek_batches"] = batches
    return out


def kept_pace_ms(fetch_ms, runq_runnable, fetch_wall_ms) -> float | None:
    """loader.kept_pace_ms (module doc): None when neither reading is known."""
    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
    if num(fetch_ms) and num(runq_runnable):
        return fetch_ms / (1.0 - min(runq_runnable, MAX_QUEUED))
    return fetch_wall_ms if num(fetch_wall_ms) else None


def kept_metrics(steady: list[dict], info: dict | None, pace_ms: float | None) -> dict:
    """What keeping one iterator and persistent workers leave of the starts' time (module doc);
    pace_ms: loader.kept_pace_ms."""
    out = dict.fromkeys(KEPT)
    if not isinstance(info, dict) or info.get("installed") is not True:
        return out
    recs, total = timed_steps(steady)
    if total <= 0 or not recs:
        return out
    every = sum(1 for s in recs if positive(s.get("npeek_first")) > 0 or positive(s.get("peek_order")) > 0)
    out["loop.peek_every_step"] = every / len(recs)
    workers = _count(info.get("workers"))
    if workers == 0:
        out["loop.peek_kept_share"] = out["loader.persistent_kept_share"] = 0.0
        return out
    if not isinstance(pace_ms, (int, float)) or isinstance(pace_ms, bool) or pace_ms < 0:
        return out
    out["loader.kept_pace_ms"] = pace_ms
    f = pace_ms / 1e3
    pf = _count(info.get("prefetch")) or PREFETCH_DEFAULT
    peek_first = sum(positive(s.get("npeek_first")) for s in recs)
    dropped = sum(positive(s.get("npeek_first")) + positive(s.get("peek_batches")) for s in recs)
    firsts = sum(positive(s.get("nfirst")) for s in recs)
    out["loop.peek_kept_share"] = min(1.0, peek_first * f / workers / total)
    first = max(0.0, f - usual_wait(recs))   # restart_share counts the first batch beyond the usual wait
    out["loader.persistent_kept_share"] = min(1.0, (firsts * first + dropped * (pf - 1) * f) / total)
    return out


def without_peeks(steps: list[dict]) -> list[dict]:
    """The step records with the peeked batches taken out of `batches`: a peek before the epoch
    is not another loop (analyze/stepwait.extra_batches)."""
    out = []
    for s in steps:
        pb = s.get("peek_batches")
        if isinstance(pb, int) and pb > 0 and isinstance(s.get("batches"), (int, float)):
            s = {**s, "batches": max(0, s["batches"] - pb)}
        out.append(s)
    return out
