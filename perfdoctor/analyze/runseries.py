"""The run over time, for pictures: `perfdoctor run`'s system samples as a few aligned series.

run_series(samples, steps) -> {"t_s": [...], <series>: [...], "steps": [a, b] | None,
"traced": [a, b] | None} with times in seconds since the first sample, or None with fewer than
two samples. Series (None where a sample did not measure the value):

  cpu_cores           cores busy on the machine (all processes): busy share x usable cores
  trainer_cpu_cores   the trainer process (all its threads; 1.0 = one full core)
  workers_cpu_cores   the DataLoader workers together
  trainer_rss_bytes   the trainer's resident memory
  workers_rss_bytes   the workers' resident memory summed (pages shared with the trainer by fork
                      count in each)
  ram_used_bytes      the machine's RAM in use (total - available)
  ram_total_bytes     one value: the machine's RAM
  usable_cpus         one value: the cores the run could use (its CPU quota or affinity), so
                      the CPU panel's scale can be read against them
  gpu_util            mean utilisation of the GPUs the trainer uses (0..1)
  gpu_memory_bytes    memory in use on those GPUs, summed

first_step_s(samples, steps): the seconds from the launch to the first step's start
(run.first_step_s).

A run longer than MAX_POINTS samples keeps every k-th sample (and the last): the points drawn are
samples as taken, never averages that would smooth a spike away. A series no sample measured is
left out, and so are the workers' with num_workers=0.
"""

from __future__ import annotations

from perfdoctor.analyze.windows import step_windows

MAX_POINTS = 400


def _sum(procs: list[dict], key: str, scale: float = 1.0):
    """Summed over the processes; None when one was not measured, or none was alive (a gap in
    the line, not workers at zero)."""
    vals = [p.get(key) for p in procs]
    if not vals or any(v is None for v in vals):
        return None
    return sum(vals) * scale


def _gpus(s: dict, ours: set[int]) -> list[dict]:
    devs = s.get("gpu") or []
    mine = [d for d in devs if d.get("pids") and ours & set(d["pids"])]
    return mine or devs


def _cores(system: dict):
    """The cores a sample says the run could use: its quota or affinity, else the machine's."""
    return system.get("usable_cpus") or system.get("cpu_count")


def _point(s: dict, ours: set[int]) -> dict:
    trainer, workers, system = s.get("trainer") or {}, s.get("workers") or [], s.get("system") or {}
    busy, cores = system.get("cpu_usable_percent"), _cores(system)
    total, avail = system.get("ram_total_bytes"), system.get("ram_available_bytes")
    gpus = _gpus(s, ours)
    util = [d.get("util_percent") for d in gpus]
    mem = [d.get("memory_used_bytes") for d in gpus]
    return {
        "cpu_cores": busy / 100 * cores if busy is not None and cores else None,
        "trainer_cpu_cores": trainer["cpu_percent"] / 100 if trainer.get("cpu_percent") is not None else None,
        "workers_cpu_cores": _sum(workers, "cpu_percent", 0.01),
        "trainer_rss_bytes": trainer.get("rss_bytes") or None,      # 0: read as it exited
        "workers_rss_bytes": _sum(workers, "rss_bytes"),
        "ram_used_bytes": total - avail if total is not None and avail is not None else None,
        "gpu_util": sum(util) / len(util) / 100 if util and None not in util else None,
        "gpu_memory_bytes": sum(mem) if mem and None not in mem else None,
    }


def run_series(samples: list[dict], steps: list[dict]) -> dict | None:
    pts = sorted((s for s in samples if isinstance(s.get("t"), (int, float))), key=lambda s: s["t"])
    if len(pts) < 2:
        return None
    ours = {p["pid"] for s in pts for p in ([s["trainer"]] if s.get("trainer") else []) + (s.get("workers") or [])}
    k = -(-len(pts) // MAX_POINTS)
    kept = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
    t0, unix0 = kept[0]["t"], kept[0].get("unix")
    rows = [_point(s, ours) for s in kept]
    if not any(s.get("workers") for s in pts):          # num_workers=0: no worker lines at zero
        for r in rows:
            del r["workers_cpu_cores"], r["workers_rss_bytes"]
    out: dict = {"t_s": [round(s["t"] - t0, 3) for s in kept]}
    for name in rows[0]:
        col = [r[name] for r in rows]
        if any(v is not None for v in col):
            out[name] = [round(v, 3) if isinstance(v, float) and "bytes" not in name else v for v in col]
    totals = [(s.get("system") or {}).get("ram_total_bytes") for s in kept]
    out["ram_total_bytes"] = max((x for x in totals if x), default=None)
    usable = [_cores(s.get("system") or {}) for s in kept]
    out["usable_cpus"] = max((x for x in usable if isinstance(x, (int, float)) and x > 0), default=None)
    win = step_windows(steps)
    for key, phase in (("steps", "steps"), ("traced", "traced")):
        w = win.get(phase)
        out[key] = [round(w[0] - unix0, 3), round(w[1] - unix0, 3)] if w and unix0 is not None else None
    return out


def first_step_s(samples: list[dict], steps: list[dict]) -> float | None:
    """Seconds from the launch to the first step's start (imports, data loading, set-up,
    compilation: what the steady steps leave out). The sampler's clock starts with the launch:
    each sample's unix time less its `t` is that moment (their median, against a late sample)."""
    starts = sorted(smp["unix"] - smp["t"] for smp in samples)
    first = next((s for s in steps
                  if isinstance(s.get("end"), (int, float)) and isinstance(s.get("dur"), (int, float))), None)
    if not starts or first is None:
        return None
    return max(0.0, first["end"] - first["dur"] - starts[len(starts) // 2])
