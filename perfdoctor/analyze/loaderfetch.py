"""What the loader's batches cost to make, and the step without the loader (`run` only).

collect/loaderfetch.py times torch's fetcher in each forked DataLoader worker: a batch's
__getitem__ calls (or __getitems__) and its collate, in wall time and in time the worker waited
in the run queue for a CPU meanwhile, and in allocating the shared memory a worker's collate
stacks the batch into. Each worker's last line holds its totals (`batches`, `wall_s`, `runq_s`,
`shm_s`). Over all the workers of the run:

    loader.fetch_ms    = sum(wall_s - runq_s - shm_s) / sum(batches)

what making one batch costs on a core of its own (the dataset's CPU work, any wait on storage,
the collate), without the handing over to the trainer (shared memory, pickling, the queue).

    loader.fetch_wall_ms = sum(wall_s - shm_s) / sum(batches)

what one batch takes a worker on this machine as it is, its waits for a CPU included: the
workers' own pace, which batches the trainer throws away (fresh workers' first ones) slow too.

    loader.fetch_share = loader.fetch_ms x (batches the steady steps drew) / steady wall time

what the steady steps' batches would cost a trainer that made them itself (num_workers=0), as a
share of today's steady wall time. None when no worker fetch was timed (num_workers=0, spawned
workers, an older run).

    run.outside_loader_share = sum(dur - wait - istart - ishut) / sum(dur)

the steady steps' time outside DataLoader.__next__, iterator starts and worker shutdowns: the
step's own work (forward, backward, the optimizer, the loop's Python), with its queueing for a
CPU. PD347 models loading in the trainer from these three and run.runq_runnable_share.

The system samples (one a second) see a worker only when it lives through two of them: workers
started again for every short epoch (persistent_workers=False, an epoch under a second or two)
are missed or undercounted, loader.workers reads 0 or 1 of 2, and the missed workers' CPU reads
as another job's (system.other_cores). `sampled_workers_or_fetched` then takes the loader's own
num_workers (child.json loader_iters) and, where the samples saw no worker at all, a worker's
CPU use from the fetch lines: sum(cpu_s) / sum(at - first) over the workers that drew two batches
or more (a worker's CPU from its first fetch to its line, over that time).

    input.sample_random_share = fetches that drew random numbers / fetches probed

over the first few fetches of the trainer and of each worker (collect/samplerandom.py): random
augmentation, which no preprocessing done once can store (PD224).
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import positive, timed_steps
from perfdoctor.analyze.system import other_cores

NAMES = ("loader.fetch_ms", "loader.fetch_wall_ms", "loader.fetch_share", "run.outside_loader_share")


def last_per_worker(lines: list[dict]) -> list[dict]:
    """Each worker's latest totals (its lines are cumulative; the one with most batches wins)."""
    best: dict[int, dict] = {}
    for r in lines:
        pid = r.get("pid")
        if not isinstance(pid, int):
            continue
        if pid not in best or positive(r.get("batches")) >= positive(best[pid].get("batches")):
            best[pid] = r
    return list(best.values())


def fetch_metrics(steady: list[dict], lines: list[dict]) -> dict:
    out = dict.fromkeys(NAMES)
    recs, total = timed_steps(steady)
    if total <= 0:
        return out
    outside = sum(max(0.0, s["dur"] - positive(s.get("wait")) - positive(s.get("istart")) - positive(s.get("ishut")))
                  for s in recs)
    out["run.outside_loader_share"] = min(1.0, outside / total)
    workers = last_per_worker(lines)
    batches = sum(int(positive(w.get("batches"))) for w in workers)
    if batches <= 0:
        return out
    cost = sum(max(0.0, positive(w.get("wall_s")) - positive(w.get("runq_s")) - positive(w.get("shm_s")))
               for w in workers)
    per_batch = cost / batches
    out["loader.fetch_ms"] = 1e3 * per_batch
    wall = sum(max(0.0, positive(w.get("wall_s")) - positive(w.get("shm_s"))) for w in workers)
    out["loader.fetch_wall_ms"] = 1e3 * wall / batches
    drawn = sum(positive(s.get("batches")) for s in recs)
    out["loader.fetch_share"] = per_batch * drawn / total
    return out


def sampled_workers_or_fetched(m: dict, info: dict | None, lines: list[dict]) -> dict:
    """loader.workers, loader.worker_cpu_mean and system.other_cores when the system samples saw
    fewer workers than the loader has ({} when they saw them all, or nothing better is known).
    A worker's CPU use stays the samples' where they saw one."""
    if not isinstance(info, dict):
        return {}
    n = info.get("workers")
    if not isinstance(n, int) or isinstance(n, bool) or n <= (m.get("loader.workers") or 0):
        return {}
    out = {"loader.workers": n}
    cpu = life = 0.0
    for w in last_per_worker(lines):
        span = positive(w.get("at")) - positive(w.get("first"))
        if positive(w.get("batches")) >= 2 and span > 0 and isinstance(w.get("cpu_s"), (int, float)):
            cpu += positive(w.get("cpu_s"))
            life += span
    if m.get("loader.worker_cpu_mean") is None and life > 0:
        out["loader.worker_cpu_mean"] = cpu / life
    if {**m, **out}.get("loader.worker_cpu_mean") is not None:
        oc = other_cores({**m, **out})
        if oc is not None:
            out["system.other_cores"] = oc
    return out


def random_draw_metrics(lines: list[dict], trainer: dict | None) -> dict:
    """input.sample_random_share: of the fetches probed (collect/samplerandom.py: the first few of
    the trainer's own, child.json "sample_random", and of each worker's, its last line), the share
    that drew random numbers from torch's, Python's or numpy's global generator; None where none
    was probed (no DataLoader, a spawned worker, an older run)."""
    probes = last_per_worker(lines) + ([trainer] if isinstance(trainer, dict) else [])
    probed = sum(int(positive(p.get("probed"))) for p in probes)
    drew = sum(min(int(positive(p.get("drew"))), int(positive(p.get("probed")))) for p in probes)
    return {"input.sample_random_share": drew / probed if probed > 0 else None}
