"""system_metrics(samples, notes) -> registered metrics from `perfdoctor run`'s system samples.

Pure functions of the SystemSampler samples (perfdoctor/collect/samplers.py). A value that the
samples cannot support is None ("unknown"), never a default.

The loader: DataLoader worker processes (role 'worker') seen in at least two samples (a python
process seen once is a short-lived helper, not a worker); with num_workers=0 there are none and
the trainer process itself is the loader, so `input.split` uses the trainer's numbers (the
loader.worker_* metrics stay None: there is no worker to measure).

input.split (does the loader wait on storage, on the CPU or on neither?) is decided in
analyze/inputsplit.py from the loader's numbers computed here.

Evidence is sized by the time it covers, not by the number of point samples. DataLoader workers
are judged over their whole lives from cumulative per-process counters (the sampler's
cpu_life_s, runq_life_s, blkio_life_s and read_bytes at each worker's last sample, divided by its
age): CPU, run-queue wait and storage reads are then exact however few samples landed in a short
run; the disk-sleep share is the block-IO delay over the life where the kernel accounts it
(delayacct), else the share of sampled states. With num_workers=0 the trainer's life holds its
imports and model build, so its numbers come from the samples of the window. None only when the
loader was observed for less than MIN_COVERED_S seconds in all: CPU times are counted in
scheduler ticks (10 ms), so 0.5 s keeps that rounding under a few percent, and at the sampler's
young-run rate (0.1 s) it holds five state samples. The trainer's waits timed by the step hooks
(num_workers=0) need MIN_TIMED_WAIT_S (0.1 s) of waits: their CPU comes from an exact clock.

loader.threads_oversubscription = (on-CPU time + run-queue wait) of the trainer and the
workers per wall second, summed over their threads, divided by the usable cores: the average
number of runnable threads per core. <= 1: every runnable thread had a core; > 1: threads
queued for CPU (too many workers, or intra-op thread pools in every worker). Averaged over
the intervals in which workers ran (the whole run with num_workers=0), so the trainer's
start-up before the first worker does not dilute it.
"""

from __future__ import annotations

import math
from statistics import fmean

import numpy as np

from perfdoctor.analyze.inputsplit import MIN_COVERED_S, MIN_TIMED_WAIT_S, runnable_share, split as _split
from perfdoctor.analyze.stepwait import positives

# A machine is shared when other processes use more than this share of its cores (and at least
# SHARED_FLOOR cores) during a run: gate's --max-other-load default (its step times then compare
# with nothing), compare's and the run report's note.
SHARED_SHARE = 0.25
SHARED_FLOOR = 0.5


def shared_by_others(other: float | None, cores, share: float = SHARED_SHARE) -> bool:
    """Other processes used more of the machine than `share` of its cores (SHARED_FLOOR at least;
    a report without its core count keeps the floor)."""
    return other is not None and other > max(share * (cores or 0), SHARED_FLOOR)


MIN_SAMPLES = 4              # samples a window needs for its sampled means (analyze/windows.py)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return fmean(xs) if xs else None


def _key(p: dict):
    return p["pid"], p.get("create_time")


def _span(samples: list[dict]) -> float:
    return samples[-1]["t"] - samples[0]["t"] if len(samples) >= 2 else 0.0


def _rate(samples: list[dict], procs_of, field: str) -> float | None:
    """Per wall second while the processes ran: the sum over processes of positive deltas of a
    cumulative field, divided by the time of the intervals in which they were measured."""
    total, span = 0.0, 0.0
    for a, b in zip(samples, samples[1:]):
        before = {_key(p): p for p in procs_of(a)}
        pairs = [(before[_key(p)], p) for p in procs_of(b) if _key(p) in before
                 and p.get(field) is not None and before[_key(p)].get(field) is not None]
        if pairs and b["t"] > a["t"]:
            span += b["t"] - a["t"]
            total += sum(max(0.0, p[field] - q[field]) for q, p in pairs)
    return total / span if span > 0 else None


def _per_proc_rate(samples: list[dict], procs_of, field: str) -> float | None:
    """Mean over (interval, process) of delta(field) / delta(t): e.g. run-queue seconds per second."""
    vals = []
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        before = {_key(p): p for p in procs_of(a)}
        for p in procs_of(b):
            q = before.get(_key(p))
            if q is not None and p.get(field) is not None and q.get(field) is not None:
                vals.append(max(0.0, p[field] - q[field]) / dt)
    return fmean(vals) if vals else None


def _usable_cores(sys0: dict) -> float | None:
    n = sys0.get("usable_cpus") or sys0.get("cpu_count")
    q = sys0.get("cpu_quota_cores")
    if n is None:
        return q
    return min(n, q) if q else n


def system_metrics(samples: list[dict], notes: list[str] | None = None,
                   wait_cpu: tuple[float, float] | None = None) -> dict:
    """Registered system/loader/gpu/machine metrics and input.split from sampler samples.

    notes: the sampler's notes; explanations for unknown results are appended to it (when a
    list is given). wait_cpu: (seconds the trainer's process was runnable inside DataLoader
    __next__ of loaders without workers, seconds inside it), from the step records
    (wait_cpu_of): the trainer's loading judged over its waits, not over its whole run.
    """
    out: dict = {}
    notes = notes if notes is not None else []
    samples = sorted((s for s in samples or [] if s.get("system") is not None), key=lambda s: s["t"])
    n = len(samples)
    out["system.samples"] = n
    out["system.sampler_core_fraction"] = None
    if n == 0:
        notes.append("no system samples: machine and loader metrics unknown")
        return _fill(out)
    span = _span(samples)
    costs = [s.get("cost_s") for s in samples if s.get("cost_s") is not None]
    if costs and n >= 2 and span > 0:
        out["system.sampler_core_fraction"] = sum(costs) / (span * n / (n - 1))
    systems = [s["system"] for s in samples]
    last = systems[-1]

    # -- machine ---------------------------------------------------------------------------
    cores = _usable_cores(last)
    out["system.cpu_count"] = last.get("cpu_count")
    out["machine.cpu_count"] = cores
    phys, quota = last.get("usable_physical_cores"), last.get("cpu_quota_cores")
    out["machine.physical_cores"] = None if phys is None else min(phys, quota) if quota else phys
    busy = _mean([(x.get("cpu_usable_percent") if x.get("cpu_usable_percent") is not None
                   else x.get("cpu_total_percent")) for x in systems])
    busy = busy / 100 if busy is not None else None
    out["system.cpu_busy_share"] = busy
    iowait = _mean([x.get("iowait_percent") for x in systems])
    out["system.iowait_share"] = iowait / 100 if iowait is not None else None
    for res in ("cpu", "io", "memory"):
        v = _mean([((x.get("psi") or {}).get(res) or {}).get("some_avg10") for x in systems])
        out[f"system.psi_{res}_some_avg10"] = v / 100 if v is not None else None
    out["system.psi_io_some_share"] = _psi_share(samples, "io")
    out.update(_disk(samples))
    avail = [x.get("ram_available_bytes") for x in systems if x.get("ram_available_bytes") is not None]
    out["system.ram_available_bytes"] = int(fmean(avail)) if avail else None
    out["machine.ram_free_bytes"] = min(avail) if avail else None

    # -- processes -------------------------------------------------------------------------
    counts: dict = {}
    for s in samples:
        for w in s.get("workers") or []:
            counts[_key(w)] = counts.get(_key(w), 0) + 1
    steady = {k for k, c in counts.items() if c >= 2}

    def workers(s):
        return [w for w in s.get("workers") or [] if _key(w) in steady]

    def trainer(s):
        return [s["trainer"]] if s.get("trainer") else []

    def tree(s):
        return trainer(s) + workers(s)

    out["loader.workers"] = max(len(workers(s)) for s in samples)
    wsamples = [w for s in samples for w in workers(s)]
    tsamples = [p for s in samples for p in trainer(s)]
    loader = _loader_numbers(samples, workers, wsamples)
    trainer_n = _loader_numbers(samples, trainer, tsamples)
    has_workers = bool(steady)
    if has_workers:                        # workers: judged over their whole lives (docstring)
        _use_life(loader, _life(samples, workers))
    out["loader.worker_cpu_mean"] = loader["cpu"] if has_workers else None
    out["loader.worker_disk_sleep_share"] = loader["d"] if has_workers else None
    out["loader.worker_read_mb_s"] = loader["read"] if has_workers else None
    out["loader.worker_runq_wait_mean"] = loader["runq"] if has_workers else None
    out["loader.trainer_cpu_mean"] = trainer_n["cpu"]
    out["loader.trainer_runq_wait_mean"] = trainer_n["runq"]     # all its threads: intra-op ones too
    out["loader.trainer_disk_sleep_share"] = trainer_n["d"]
    out["loader.trainer_read_mb_s"] = trainer_n["read"]
    demand = None
    if cores:
        vals = []
        for a, b in zip(samples, samples[1:]):
            dt = b["t"] - a["t"]
            before = {_key(p): p for p in tree(a)}
            pairs = [(before[_key(p)], p) for p in tree(b) if _key(p) in before]
            if steady and not any(p["role"] == "worker" for _, p in pairs):
                continue                     # start-up / tear-down without the loader running
            if dt <= 0 or not pairs or any(p.get("sched_cpu_s") is None or q.get("sched_cpu_s") is None
                                           for q, p in pairs):
                continue
            vals.append(sum(max(0.0, p["sched_cpu_s"] - q["sched_cpu_s"])
                            + max(0.0, p["runq_wait_s"] - q["runq_wait_s"]) for q, p in pairs) / dt)
        demand = fmean(vals) / cores if vals else None
    out["loader.threads_oversubscription"] = demand

    # free cores: idle share of the usable cores; under a cgroup quota also quota - tree usage
    free = None
    if cores is not None and busy is not None:
        free = cores * (1 - busy)
        quota = last.get("cpu_quota_cores")
        tree_cpu = _mean([sum((p.get("cpu_percent") or 0) for p in trainer(s) + (s.get("workers") or [])
                              + (s.get("helpers") or [])) / 100 for s in samples[1:]])
        if quota and tree_cpu is not None:
            free = min(free, quota - tree_cpu)
        free = round(max(0.0, free), 2)   # fractional: 0.98 idle is a core, not none
    out["machine.free_cores"] = free
    out["system.other_cores"] = other_cores(out)

    out.update(_gpu(samples))
    ld = loader if has_workers else trainer_n
    out["loader.runnable_share"] = runnable_share(ld, not has_workers) if ld["covered_s"] >= MIN_COVERED_S else None
    in_waits = min(1.0, wait_cpu[0] / wait_cpu[1]) if not has_workers and wait_cpu and wait_cpu[1] >= MIN_TIMED_WAIT_S \
        else None
    out["loader.trainer_wait_runnable_share"] = in_waits
    # the trainer's loading is judged over its waits where the hooks timed them
    out["input.split"] = _split(out, ld if in_waits is None else {**ld, "running": in_waits, "timed": True},
                                not has_workers, notes)
    return _fill(out)


def other_cores(m: dict, siblings: int = 0) -> float | None:
    """Cores used by processes other than the trainer and its loader workers: the machine's busy
    share x its cores - the trainer's cores - workers x a worker's cores (None when unknown).
    `siblings`: other ranks of the same job on this machine, taken to use as much as this one."""
    busy, cores, trainer = m.get("system.cpu_busy_share"), m.get("machine.cpu_count"), m.get("loader.trainer_cpu_mean")
    if busy is None or not cores or trainer is None:
        return None
    return round(max(0.0, busy * cores - _own_cores(m) * (1 + max(0, siblings))), 2)


def _own_cores(m: dict) -> float:
    """The trainer's cores and its DataLoader workers' (their count x each one's mean)."""
    return m["loader.trainer_cpu_mean"] + (m.get("loader.workers") or 0) * (m.get("loader.worker_cpu_mean") or 0.0)


def ranks_other_cores(systems: list[dict]) -> float | None:
    """Cores that processes other than a job's ranks on one machine and their DataLoader workers
    used, from each rank's system metrics: the machine's busy cores (each rank sampled the same
    machine: their mean) less every rank's own. other_cores with `siblings` takes the other ranks
    to use as much as the one measured, which a rank that waits for a busy straggler does not
    (0.96 of 2 cores "other" on a quiet machine). None when unknown."""
    busy, own = [], 0.0
    for m in systems:
        share, cores = m.get("system.cpu_busy_share"), m.get("machine.cpu_count")
        trainer = m.get("loader.trainer_cpu_mean")
        if share is None or not cores or trainer is None:
            return None
        busy.append(share * cores)
        own += _own_cores(m)
    return round(max(0.0, sum(busy) / len(busy) - own), 2) if busy else None


def _loader_numbers(samples, procs_of, flat) -> dict:
    cpu = [p["cpu_percent"] / 100 for p in flat if p.get("cpu_percent") is not None]
    states = [p.get("state") for p in flat if p.get("state")]
    reads = _rate(samples, procs_of, "read_bytes")
    n_cpu = sum(any(p.get("cpu_percent") is not None for p in procs_of(s)) for s in samples)
    seen = [s["t"] for s in samples if any(p.get("cpu_percent") is not None for p in procs_of(s))]
    # each sample's CPU covers the interval before it: the first one's too
    covered = (seen[-1] - seen[0] + _first_interval(samples, seen[0])) if seen else 0.0
    return {"cpu": fmean(cpu) if cpu else None, "n_cpu": n_cpu, "covered_s": covered, "life": False,
            "d": sum(st == "disk-sleep" for st in states) / len(states) if states else None,
            "running": sum(st == "running" for st in states) / len(states) if states else None,
            "read": reads / 1e6 if reads is not None else None,
            "runq": _per_proc_rate(samples, procs_of, "runq_wait_s")}


def _first_interval(samples, t: float) -> float:
    before = [s["t"] for s in samples if s["t"] < t]
    return t - before[-1] if before else 0.0


def _life(samples, procs_of) -> dict | None:
    """The loader processes over their whole lives: cumulative counters at each one's last sample
    divided by its age (seconds since create_time), summed over the processes."""
    last: dict = {}
    for s in samples:
        for p in procs_of(s):
            if p.get("cpu_life_s") is not None and isinstance(p.get("create_time"), (int, float)) \
                    and isinstance(s.get("unix"), (int, float)):
                last[_key(p)] = (s["unix"], p)
    ages = [(max(0.0, u - p["create_time"]), p) for u, p in last.values()]
    age = sum(a for a, _ in ages)
    if age <= 0:
        return None

    def total(field):                      # unknown unless every process has a finite number
        vals = [p.get(field) for _, p in ages]
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                 for v in vals)
        return sum(vals) if ok else None
    cpu, runq, blk, rb = total("cpu_life_s"), total("runq_life_s"), total("blkio_life_s"), total("read_bytes")
    if cpu is None:
        return None
    return {"covered_s": age, "cpu": cpu / age, "runq": runq / age if runq is not None else None,
            "d": min(1.0, blk / age) if blk is not None else None,
            "read": rb / max(a for a, _ in ages) / 1e6 if rb is not None else None}


def _use_life(ld: dict, life: dict | None) -> None:
    """Replace the point-sample numbers of the workers by their life numbers (where known)."""
    if life is None:
        return
    ld["covered_s"], ld["life"] = max(ld["covered_s"], life["covered_s"]), True
    for k in ("cpu", "runq", "d", "read"):
        if life[k] is not None:
            ld[k] = life[k]


def _psi_share(samples, res) -> float | None:
    pts = [(s["t"], s["system"]["psi"][res]["some_total_us"]) for s in samples
           if (s["system"].get("psi") or {}).get(res)]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return min(1.0, max(0.0, (pts[-1][1] - pts[0][1]) / 1e6 / (pts[-1][0] - pts[0][0])))


def _disk(samples) -> dict:
    pts = [(s["t"], s["system"]["disk"]) for s in samples if s["system"].get("disk")]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return {"system.disk_read_mb_s": None, "system.disk_busy_share": None}
    rate = (pts[-1][1]["read_bytes"] - pts[0][1]["read_bytes"]) / (pts[-1][0] - pts[0][0]) / 1e6
    busy = []
    for (ta, a), (tb, b) in zip(pts, pts[1:]):
        dt_ms = (tb - ta) * 1e3
        ds = [(b["busy_ms"][k] - a["busy_ms"][k]) / dt_ms for k in b.get("busy_ms") or {}
              if dt_ms > 0 and b["busy_ms"][k] is not None and (a.get("busy_ms") or {}).get(k) is not None]
        if ds:
            busy.append(min(1.0, max(0.0, max(ds))))
    return {"system.disk_read_mb_s": max(0.0, rate), "system.disk_busy_share": fmean(busy) if busy else None}


def our_pids(samples: list[dict]) -> set[int]:
    """The pids of the script's processes: the trainer, its workers and its other descendants."""
    return {p["pid"] for s in samples
            for p in ([s["trainer"]] if s.get("trainer") else []) + (s.get("workers") or []) + (s.get("helpers") or [])}


def used_devices(samples: list[dict], ours: set[int]) -> set[int]:
    """Indices of the GPUs that list one of `ours` among their processes in these samples; empty
    when none does (a pid namespace hides them, or no CUDA context yet: then all devices count)."""
    return {d["index"] for s in samples for d in (s.get("gpu") or []) if d.get("pids") and ours & set(d["pids"])}


def _gpu(samples) -> dict:
    gs = [s["gpu"] for s in samples if s.get("gpu")]
    if not gs:
        return {"gpu.util_mean": None, "gpu.memory_used_fraction_peak": None}
    used = used_devices(samples, our_pids(samples))
    pick = (lambda d: d["index"] in used) if used else (lambda d: True)
    util = _mean([_mean([d["util_percent"] for d in g if pick(d)]) for g in gs])
    frac = [d["memory_used_bytes"] / d["memory_total_bytes"] for g in gs for d in g
            if pick(d) and d.get("memory_used_bytes") is not None and d.get("memory_total_bytes")]
    return {"gpu.util_mean": util / 100 if util is not None else None,
            "gpu.memory_used_fraction_peak": max(frac) if frac else None}


_NAMES = ("system.samples", "system.sampler_core_fraction", "system.cpu_count", "system.cpu_busy_share",
          "system.iowait_share", "system.psi_cpu_some_avg10", "system.psi_io_some_avg10",
          "system.psi_memory_some_avg10", "system.psi_io_some_share", "system.disk_read_mb_s",
          "system.disk_busy_share", "system.ram_available_bytes", "loader.workers",
          "loader.worker_cpu_mean", "loader.worker_disk_sleep_share", "loader.worker_read_mb_s",
          "loader.worker_runq_wait_mean", "loader.trainer_cpu_mean", "loader.trainer_runq_wait_mean",
          "loader.trainer_disk_sleep_share",
          "loader.trainer_read_mb_s", "loader.runnable_share", "loader.trainer_wait_runnable_share",
          "loader.threads_oversubscription", "gpu.util_mean",
          "gpu.memory_used_fraction_peak", "machine.cpu_count", "machine.physical_cores", "machine.free_cores",
          "machine.ram_free_bytes", "system.other_cores", "input.split")


def _fill(out: dict) -> dict:
    return {k: out.get(k) for k in _NAMES}


def wait_cpu_of(steps: list[dict]) -> tuple[float, float] | None:
    """(runnable seconds, seconds) inside DataLoader __next__ of loaders without workers over the
    un-profiled steps: the process's CPU there (`wcpu`: its intra-op threads too) and the step's
    run-queue wait pro rata of the wait's part of the step. None for a run without those records
    (workers make the batches, or an older run)."""
    if not any("wcpu" in s for s in steps):
        return None
    # a hand-edited record's odd value counts as none (stepwait.positives); in columns: a run of
    # hours has hundreds of thousands of step records
    w, dur = positives(steps, "wait"), positives(steps, "dur")
    ok = (w > 0) & (dur > 0) & ~np.fromiter((bool(s.get("profiled")) for s in steps), dtype=bool, count=len(steps))
    w, dur = w[ok], dur[ok]
    cpu = float((positives(steps, "wcpu")[ok] + positives(steps, "runq")[ok] * np.minimum(1.0, w / dur)).sum())
    wait = float(w.sum())
    return (cpu, wait) if wait > 0 else None

