"""Training that ran in child processes of the launched one, which `perfdoctor run` does not time.

- Forked children that stepped an optimizer (torch.multiprocessing with fork, Hogwild!, os.fork)
  leave their counts in forked/<pid>.json (collect/forked.py).
- Spawned children (multiprocessing's spawn or forkserver, a launcher's subprocess) run without
  the hooks. A multiprocessing start in the launched process is counted with its target function
  (collect/procstarts.py, child.json process_starts): with no step of its own, or where their CPU
  shows they worked, the note names the function, the start method and how many, and says how to
  diagnose them (torchrun ranks under --nproc-per-node, or the function called in the main
  process), and how to share the cores where their threads queued. Steps of the launched process
  with no backward pass (pytorch/examples' Hogwild!: the test after its trainers joined) are
  said to be no training (own_loop_only). Otherwise (a subprocess) python
  child processes that used CPU are the only sign of them. The sampler calls them loader workers
  (python descendants of the trainer); with no step in the launched process, DataLoader workers
  of an untimed loop look the same, so the note says "if they train".

Their CPU is read over the steps window, or, where the launched process's own steps are no
training, over the whole run (trainers spawned and joined before a test loop long enough to fill
that window: none of them ran during it).

elsewhere(kids, steps, m, starts, whole) -> one note, or None. The note goes into the run's notes, and with
no step of its own it replaces "no bottleneck" as the reason the verdict is inconclusive
(diagnose/ending.py).
"""

from __future__ import annotations

from perfdoctor.diagnose.confidence import TUNE_MEASURES

LEAD = ("the script trained in", "the script may train in")     # the notes' beginnings (live.py shows them first)
MIN_CHILD_CORES = 0.25          # a child process busy a quarter of a core: work, not a helper's idling
OVERSUBSCRIBED = 1.1            # runnable threads per usable core that queue (PD213's threshold)


def elsewhere(kids: list[dict], steps: list[dict], m: dict, starts: list[dict] | None = None,
              whole: dict | None = None) -> str | None:
    """kids: the forked children's step records (collect/forked.read); starts: the processes the
    launched process started through multiprocessing (child.json process_starts,
    collect/procstarts.py); whole: the sampled means over the whole run (the `sampling` section's
    whole_run), for trainers that had finished before the launched process's own steps began (its
    steps window then saw no child: a Hogwild! test loop long enough to fill that window)."""
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
    busy = bool(workers and cpu is not None and cpu >= MIN_CHILD_CORES)
    if not busy and whole and (not steps or untrained(steps)):
        w, c = whole.get("loader.workers"), whole.get("loader.worker_cpu_mean")
        if w and c is not None and c >= MIN_CHILD_CORES:
            workers, cpu, busy, m = w, c, True, whole       # their queueing too, from the same samples
    spawned = [s for s in starts or [] if s.get("method") in ("spawn", "forkserver") and s.get("count")]
    if not steps and spawned:
        return _spawned(spawned, workers if busy else None, cpu) + _queued(m, busy)
    if spawned and busy:            # steps of its own too: a test after the training (Hogwild!), or a rank
        return _spawned(spawned, workers, cpu, steps) + _queued(m, busy)
    if not steps and busy:
        return (f"the script may train in child processes: no step was recorded in the launched process, while "
                f"{workers} python child process(es) used {cpu:.1f} core(s) each. If they train (multiprocessing with "
                "spawn or forkserver, a subprocess), "
                "perfdoctor does not follow them. Run perfdoctor on one trainer in the main process (the script "
                "set to a single process), or on the training command itself")
    return None


def untrained(steps: list[dict]) -> bool:
    """The launched process's steps are no training: DataLoader batches or module calls with no
    backward pass (collect/stepsource.py), an evaluation or inference loop."""
    return bool(steps) and steps[-1].get("mode") in ("dataloader", "module")


def _spawned(spawned: list[dict], workers: int | None, cpu: float | None, steps: list[dict] | None = None) -> str:
    """The note for processes the script started with spawn or forkserver (torch.multiprocessing.
    spawn: one DDP rank per device), named by their function; "trained" when its python children
    used CPU, "may train" when nothing showed they worked. `steps`: the launched process's own,
    where it had some (they are then said to be its own, and no training where they are not)."""
    n = sum(s["count"] for s in spawned)
    targets = sorted({s.get("target") or "?" for s in spawned})
    via = sorted({s.get("via") or "multiprocessing" for s in spawned})
    methods = sorted({s["method"] for s in spawned})
    what = (f"{n} process(es) running {', '.join(t + '()' for t in targets)}, started with {' and '.join(via)} "
            f"({' and '.join(methods)} start method)")
    seen = (f", while {workers} python child process(es) used {cpu:.1f} core(s) each" if workers else "")
    call = targets[0] + "()" if len(targets) == 1 and targets[0] != "?" else "the trainer function"
    own = ("the launched process itself stepped no optimizer" if not steps else
           f"the {len(steps)} step(s) timed here are the launched process's own"
           + (", a loop with no backward pass (an evaluation or inference, not the training)" if untrained(steps)
              else ""))
    return ((f"the script trained in {what}" if workers else f"the script may train in {what}")
            + f": {own}{seen}. A process started with spawn or "
            "forkserver runs without perfdoctor's hooks, so its steps were not timed. To diagnose them, start "
            "one process per rank with torchrun instead, under `perfdoctor run --nproc-per-node N script.py` "
            "(each rank reading RANK, LOCAL_RANK and WORLD_SIZE from its environment; perfdoctor then records "
            f"every rank), or call {call} directly in the main process")


def _queued(m: dict, busy: bool) -> str:
    """Where the trainers' threads queued for the cores: what to do about it, since no step of
    theirs is timed for a fix to be ranked on (PD341 sizes the launched process's queueing). A
    user trial: Hogwild! with 2 processes of 2 torch threads on 2 cores, 2x faster with 1 each."""
    over, wait = m.get("loader.threads_oversubscription"), m.get("loader.worker_runq_wait_mean")
    if not busy or over is None or over <= OVERSUBSCRIBED:
        return ""
    queued = f", and each child queued for a core {wait:.2f} s a second" if wait else ""
    return (f". Their threads wanted {over:.2f} cores per usable core{queued}: give each trainer process its "
            "share of the cores (torch.set_num_threads(cores // processes) first thing in its function, or "
            "OMP_NUM_THREADS set before the script starts), and time whole runs of the script with and without it")


def own_loop_only(doc: dict, steps: list[dict], note: str | None) -> None:
    """doc["run"]["training_elsewhere"]: the training ran in child processes (`note`, from elsewhere)
    while the launched process's own steps are no training (a Hogwild! script's test after its
    trainers joined). Then every verdict says first that it diagnoses that loop, not the training,
    and no tune is offered (it would measure that loop)."""
    away = bool(note and note.startswith(LEAD[0]) and untrained(steps))
    doc["run"]["training_elsewhere"] = away
    if away:
        said = ("These steps are the launched process's own loop with no backward pass (an evaluation or "
                "inference): the training ran in its child processes, which perfdoctor does not time (the first "
                "note says how to diagnose them). ")
        for v in [doc["verdict"]] + [t["verdict"] for t in doc["traces"]]:
            v["summary"] = said + v["summary"]
            v["notes"] = [n.replace(TUNE_MEASURES, "") for n in v.get("notes") or []]
