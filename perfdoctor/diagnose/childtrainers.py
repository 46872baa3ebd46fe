"""Training that ran in child processes of the launched one, which `perfdoctor run` does not time.

- Forked children that stepped an optimizer (torch.multiprocessing with fork, Hogwild!, os.fork)
  leave their counts in forked/<pid>.json (collect/forked.py).
- Spawned children (multiprocessing's spawn or forkserver, a launcher's subprocess) run without
  the hooks: when the launched process recorded no step, python child processes that used CPU are
  the only sign of them. The sampler calls them loader workers (python descendants of the
  trainer); with no step in the launched process, DataLoader workers of an untimed loop look the
  same, so the note says "if they train".

elsewhere(kids, steps, m) -> one note, or None. The note goes into the run's notes, and with
no step of its own it replaces "no bottleneck" as the reason the verdict is inconclusive
(diagnose/ending.py).
"""

from __future__ import annotations

LEAD = ("the script trained in", "the script may train in")     # the notes' beginnings (live.py shows them first)
MIN_CHILD_CORES = 0.25          # a child process busy a quarter of a core: work, not a helper's idling


def elsewhere(kids: list[dict], steps: list[dict], m: dict) -> str | None:
    """kids: the forked children's step records (collect/forked.read)."""
    if kids:
        n, total = len(kids), sum(k["steps"] for k in kids)
        own = (f"the {len(steps)} step(s) timed here are the launched process's own" if steps
               else "the launched process itself stepped no optimizer")
        return (f"the script trained in {n} forked child process(es) (at least {total:,} optimizer steps in all: "
                "torch.multiprocessing with fork, Hogwild!, os.fork): perfdoctor times the steps of the process it "
                f"launched, and {own}; their CPU counts as other work of the script, not the loader's. To diagnose "
                "their steps, run one trainer in the main process (the script set to a single process, or its "
                "train function called directly)")
    workers, cpu = m.get("loader.workers"), m.get("loader.worker_cpu_mean")
    if not steps and workers and cpu is not None and cpu >= MIN_CHILD_CORES:
        return (f"the script may train in child processes: no step was recorded in the launched process, while "
                f"{workers} python child process(es) used {cpu:.1f} core(s) each. If they train (multiprocessing with "
                "spawn or forkserver, a subprocess), "
                "perfdoctor does not follow them. Run perfdoctor on one trainer in the main process (the script "
                "set to a single process), or on the training command itself")
    return None
