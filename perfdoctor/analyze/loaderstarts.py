"""What starting DataLoader iterators costs the steady steps (loop.peek_*, loader.restart_share; `run` only).

collect/loaderiters.py records per step the time inside DataLoader.__iter__ (`istart`), inside
worker shutdowns (`ishut`) and inside the first __next__ of each new iterator (`ifirst`, `nfirst`
of them), and finds peeks: iterators that drew at most two batches, never ran out, and were
followed by a new iterator of the same loader (`next(iter(loader))` before an epoch, or an
iterator re-created every step). A peek's time (`peek`: its start, and its batches and shutdown
when it drew in the step where it is found) is waste: the loop draws its own batches. An
iterator re-created every step is found a peek in the next step; its batch was its step's batch,
which the step needed: its start and shutdown count, and, with workers, the wait for its first
batch beyond the usual wait (`peek_first`, `npeek_first` of them): fresh workers make that batch
while the trainer waits, where a kept iterator's workers have it ready. (A user trial, 2 workers
and `next(iter(loader))` every step: the start alone was 20% of the wall time, start, shutdown and
first batch 48%; keeping one iterator measured 10x and more on a busy 2-core VM.)

    loop.peek_share = (sum(peek) + sum(max(0, peek_first - npeek_first x usual wait))) / steady wall time

    loader.restart_share = sum(istart + ishut + max(0, ifirst - nfirst x usual wait)) / steady wall time

every iterator start, peeks included: with workers and persistent_workers=False each one starts
the worker processes, the old ones are shut down, and the first batch waits for fresh workers
(beyond the usual wait for a batch: the median wait per batch of the steps that started none).
With persistent workers all of that is a reset of the sampler.

Both are None when the run did not time iterator starts (an older run); loop.peek_share is None
when a generation called a peek drew again later (two iterators of one loader used in turn: not a
peek, and which steps hold the error is unknown).
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import positive, timed_steps

NAMES = ("loop.peek_share", "loop.peek_batches", "loader.restart_share", "loader.restarting")


def start_metrics(steady: list[dict], info: dict | None) -> dict:
    out = dict.fromkeys(NAMES)
    if not isinstance(info, dict) or info.get("installed") is not True:
        return out
    recs, total = timed_steps(steady)
    if total <= 0:
        return out
    restarting = info.get("restarting")
    out["loader.restarting"] = restarting if isinstance(restarting, bool) else None
    plain = sorted(positive(s.get("wait")) / s["batches"] for s in recs
                   if not positive(s.get("nfirst")) and isinstance(s.get("batches"), (int, float)) and s["batches"] > 0)
    usual = plain[len(plain) // 2] if plain else 0.0
    peek = sum(positive(s.get("peek")) + max(0.0, positive(s.get("peek_first")) - positive(s.get("npeek_first")) * usual)
               for s in recs)
    starts = sum(positive(s.get("istart")) + positive(s.get("ishut"))
                 + max(0.0, positive(s.get("ifirst")) - positive(s.get("nfirst")) * usual) for s in recs)
    batches = sum(int(positive(s.get("peek_batches"))) for s in recs)
    out["loader.restart_share"] = min(1.0, starts / total)
    if not info.get("relabelled"):
        out["loop.peek_share"] = min(1.0, peek / total)
        out["loop.peek_batches"] = batches
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
