"""Which trials `perfdoctor tune` runs, in which order, from the baseline run.

The baseline tells us: the verdict and the data-wait share (from its report), the script's own
DataLoader arguments, optimizer classes and thread count (from inject.json), the core count and
whether a CUDA device exists (child.json). A trial is one dict of changes (collect/inject.py) and
the fix rule of the report whose gain it tests (its `gain.expected` is the prediction).

Groups and order. Each group is one knob a user would turn: the DataLoader, host threads, the
optimizer implementation, the memory layout (channels_last, where the report found convolutions
on NCHW tensors: PD342 on a GPU, PD392 on the CPU), CUDA settings, the loader's iterator kept
where the report found iterators started for a peek or re-created every step (PD355:
collect/inject_iter.py), a TensorDataset indexed once a
batch where the report found it fetched sample by sample (PD358), the loader's samples prepared
once where the report offers preprocessing them (PD306: a bound, below), autograd anomaly
detection left off where the report found it on (PD374: first on a host- or device-bound
verdict, a debugging mode that slows every op), the script's torch.cuda.empty_cache() calls (a
trial only when the baseline made some), its checkpoint saves (one in SAVE_EVERY written, only where
the report found saving a material share of the step: PD350), numerics (opt-in), compilation
(opt-in). The report's
ranked fixes order the groups first: the group of its first-ranked fix runs first, and so on
(the trial that tests the report's top claim is never the one a short budget leaves out); a fix
whose ceiling is under a material gain (1 + MIN_EFFECT) orders nothing (predict._material), nor,
on an input-bound verdict, one off the bottleneck that cannot gain the data wait's Amdahl bound
(predict._outweighs_the_wait). The
other groups follow in the verdict's order (input-bound: the loader first; host/overhead-bound:
optimizer and compilation first; device-bound: numerics and CUDA first), and a data wait of at
least MATERIAL_WAIT of the step puts the loader first among them whatever the verdict, unless
the report found no idle core (PD309: more workers would take CPU time from the trainer and
from each other): then the loader's trials come after the threads group on an input-bound
verdict, last on the others (PD309 could be wrong, and fewer workers may be the gain). An
input-bound step is mostly its data wait, and the optimizer or compile groups can gain at most
the rest: ranked behind them, the loader was what a short budget left out (a Dataset whose
__getitem__ does 2-thread matmuls, 89% data wait, PD309: tune measured only optimizer=fused,
within the 4% of the step the ops took, while bare reruns with num_workers=2 ran 2.5-33x
faster on this shared 2-core VM). Within
the loader group, num_workers candidates come first (zero among them when the script has
workers: an in-memory dataset with a cheap __getitem__ loads fastest in the trainer) (kept alive across epochs, persistent_workers=True, when the
script had no workers: worker_changes); persistent_workers (for a script that already has
workers) and prefetch_factor refine the best worker count (they do nothing without workers), so
they are planned after the first pass.
When the training thread queued for a CPU (PD214) while other processes held cores, the threads
group comes first and tries fewer threads, one per core they leave free (PD348), not more. The
one trial that tests the report's first-ranked fix comes before everything, threads included.
The compile trial uses the mode the report advises: "reduce-overhead" (CUDA graph replay) where
PD311 ranks, the default mode elsewhere; a graph-replay trial that fails is followed by a
default-mode one (`fallback`), since graph replay refuses some scripts that compile alone takes.
A bound trial measures the most a code change tune cannot make gives, not a setting: store_samples
(collect/inject_store.py) serves samples prepared once, augmentations frozen, so it is never the
best setting nor combined with others; its measurement is set against PD306's ceiling.
A trial that cannot apply here is planned as skipped with its reason (never measured, never
invented): CUDA settings without a CUDA device, numerics and compilation without their flag.
`--only` keeps the trials of the groups or fix ids it names (`only_names`, `wanted`): the others
are neither run nor listed, and the budget goes to those asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfdoctor.errors import PerfdoctorError
from perfdoctor.rules.loader import builtin_rules_dir
from perfdoctor.rules.tunable import KNOB_RULES, NO_WORKERS_RULE, STACKS_ONLY, fixes_tested

MATERIAL_WAIT = 0.05         # data wait share of the step from which the loader group comes first
FREE_CORE = 0.5              # a core counts as free when other processes leave it idle at least this much
MAX_WORKER_CANDIDATES = 4
PREFETCH_TRY = 4             # prefetch_factor tried against torch's default 2

ORDER = {"input": ("iterator", "loader", "indexing", "preprocessing", "anomaly", "distributions", "threads",
                   "optimizer", "checkpoint", "recompute", "layout", "cuda", "allocator", "numerics", "compile"),
         "host": ("anomaly", "distributions", "checkpoint", "iterator", "optimizer", "compile", "allocator",
                  "recompute", "threads", "loader", "indexing", "preprocessing", "layout", "cuda", "numerics"),
         "device": ("anomaly", "distributions", "numerics", "recompute", "allocator", "layout", "cuda", "compile",
                    "checkpoint", "iterator", "optimizer", "loader", "indexing", "preprocessing", "threads")}
STORED = "a bound, not a setting: the samples prepared once and replayed, augmentations frozen; PD306 is the change"
SAVE_EVERY = 100             # the save_every trial: PD350's model (one save every 100 steps)
THREADS_FEWER, THREADS_MORE = ("PD348", "PD341"), ("PD346",)   # a threads trial's rules, by its direction


@dataclass
class Trial:
    changes: dict
    group: str
    rule: str | None = None          # the fix rule whose expected gain this trial tests
    skip: str | None = None          # planned as skipped, with the reason
    refines: bool = False            # applied on top of the group's best first-pass setting
    bound: str | None = None         # a bound trial's caveat: it measures a fix's most, not a setting (module doc)
    label: str = ""
    tests: tuple | None = None       # the rules it tests where its direction decides (THREADS_*); None: KNOB_RULES'
    gain: dict | None = None         # its rule's gain at this setting (a worker count), not the report's

    def __post_init__(self):
        if not self.label:
            self.label = describe(self.changes)


@dataclass
class Facts:
    """What the baseline run says about the script and the machine."""

    cores: int
    cuda: bool
    verdict: str | None = None
    data_wait: float | None = None
    loader: dict | None = None        # the script's DataLoader arguments (first DataLoader)
    optimizers: list = field(default_factory=list)
    threads: int | None = None        # the trainer's intra-op threads as the script set them
    bf16: bool = True
    checkpoints: int = 0              # activation-checkpoint calls the script made
    empty_cache_calls: int = 0        # torch.cuda.empty_cache() calls the script made
    frequent_saves: bool = False      # checkpoint saves take a material share of the step (PD350 fires)
    fp64: bool = False                # the model trains with float64 parameters (params.fp64_share)
    half: bool = False                # bf16/fp16 parameters on a CPU without their math (PD368 fired)
    compiled: bool = False            # the steps already run compiled code (fusion.compiled)
    graph_replay: bool = False        # the report advises compile mode "reduce-overhead" (PD311)
    ranked: list = field(default_factory=list)   # the report's ranked fix rule ids, best first
    contended: bool = False           # the training thread queued for a CPU (flag PD214)
    other_cores: float | None = None  # cores other processes kept busy (system.other_cores)
    demand: float | None = None       # the job's runnable threads per core (loader.threads_oversubscription)
    worker_cores: float | None = None  # cores the script's DataLoader workers kept busy
    saturated: bool = False           # no idle core for more DataLoader workers (PD309 fired)
    modelled_workers: float | None = None   # the workers PD301's model credits (up to 8 for a loader that waits)
    nchw: bool = False                # convolutions on NCHW tensors: layout conversions (PD342) or a CPU's (PD392)
    peeks: bool = False               # DataLoader iterators started to peek, or re-created every step (PD355 fired)
    per_sample: bool = False          # an in-memory dataset fetched sample by sample (PD358 fired)
    preprocess: bool = False          # the report offers preprocessing the data set once (PD306 fired)
    anomaly: bool = False             # autograd anomaly detection checks the backward (PD374 fired)
    distribution_checks: bool = False  # torch.distributions checks its arguments (PD379 fired)
    sdpa_dropout: bool = False        # attention dropout keeps the CPU's SDPA on its math path (PD381 fired)
    small_batch: bool = False         # the step is mostly a fixed cost a larger batch shares (PD385 fired)
    gathers: bool = False             # x[idx] and its backward take a material share of a CPU step (PD386 fired)
    host_faults: bool = False         # freed host memory faulted in again every step (PD393 fired)


def describe(changes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "baseline"


def worker_candidates(cores: int, current: int, modelled: float | None = None) -> list[int]:
    """1, 2, 4, ... up to the core count, plus cores-1 and cores, and 0 when the script has
    workers; never the current value and never more workers than cores (extra workers fight
    the trainer for CPU), unless PD301's model credits more (`modelled`: a loader that waits
    rather than computes, a sleep or a remote source, overlaps its waits beyond the cores: a
    user's sleeping loader on 2 cores measured 2.27x with 2 workers where 8 were modelled)."""
    top = max(cores, int(modelled or 0))
    vals, v = {0} if current > 0 else set(), 1
    while v <= top:
        vals.add(v)
        v *= 2
    vals.update(x for x in (cores - 1, cores, top) if x >= 1)
    vals.discard(current)
    # keep the ones nearest the core count when there are too many; 0, the other way out, last
    keep = sorted(vals - {0}, key=lambda x: -x)[:MAX_WORKER_CANDIDATES - (0 in vals)]
    return sorted(keep) + ([0] if 0 in vals else [])


def worker_changes(f: Facts, n: int) -> dict:
    """A worker-count trial. From a script without workers, the workers are made persistent, as
    PD301 advises: non-persistent workers are started again every epoch, and on a short epoch
    that restart is the trial's cost, not the workers' (measured: 0.31x for one restarting
    worker where the same worker kept alive ran at 0.96x). A script that already has workers
    keeps its own setting; persistent_workers is then a refinement of its own."""
    if f.loader and not f.loader.get("num_workers") and not f.loader.get("persistent_workers"):
        return {"num_workers": n, "persistent_workers": True}
    return {"num_workers": n}


def threads_for_free_cores(f: Facts) -> int | None:
    """Fewer torch threads when other processes, or the job's own DataLoader workers, hold cores
    and the training thread queued for one (PD348, PD341): a thread per core they leave free (at
    least FREE_CORE of it), at least one; None when that is not fewer than the script's own. An op
    split over threads waits for the slowest, so a thread the scheduler parks can cost many times
    the queueing (measured: 15-27x from one thread fewer on two shared cores, while on a quiet
    machine the two counts ran alike).
    Where neither holds a core but the job's runnable threads outnumber the cores all the same
    (f.demand > 1: a thread of the script's own beside torch's, a logger's writer or a producer),
    one torch thread fewer per core's worth of that excess beyond FREE_CORE. (A user's loop that
    wrote TensorBoard histograms every step: 1.40 runnable threads per core on 2 cores, PD341
    ~1.26x and no trial; one torch thread measured 1.10x.)"""
    if not f.contended or f.other_cores is None or not f.threads:
        return None
    n = max(1, int(f.cores - f.other_cores - (f.worker_cores or 0.0) + FREE_CORE))
    if n >= f.threads and f.demand is not None and f.demand > 1:
        n = max(1, f.threads - math.ceil(f.cores * (f.demand - 1) - FREE_CORE))
    return n if n < f.threads else None


def group_order(f: Facts) -> list[str]:
    v = f.verdict or ""
    key = "input" if v.startswith("input") else "host" if v in ("host", "cpu_overhead") else \
        "device" if v in ("device", "cpu_compute") else "input"
    order = list(ORDER[key])
    if f.saturated:
        order.remove("loader")
        if key == "input":               # right after the threads (PD309's own knob): the wait is the step
            order.insert(order.index("threads") + 1, "loader")
        else:
            order.append("loader")
    elif f.data_wait is not None and f.data_wait >= MATERIAL_WAIT and order[0] != "loader":
        order.remove("loader")
        order.insert(0, "loader")
    return order


def plan(f: Facts, *, allow_numerics: bool = False, allow_compile: bool = False,
         only: frozenset[str] | None = None) -> list[Trial]:
    """First-pass trials in order (refinements are planned later, by `refinements`); `only`: the
    groups and fix ids `--only` named."""
    by_group: dict[str, list[Trial]] = {g: [] for g in ORDER["input"]}
    if f.loader is not None:
        cur = int(f.loader.get("num_workers") or 0)
        by_group["loader"] += [Trial(worker_changes(f, n), "loader")
                               for n in worker_candidates(f.cores, cur, f.modelled_workers)]
        if not f.loader.get("pin_memory"):
            by_group["loader"].append(Trial({"pin_memory": True}, "loader", skip=None if f.cuda else "no CUDA device"))
    fewer = threads_for_free_cores(f)
    if fewer is not None:
        by_group["threads"].append(Trial({"threads": fewer}, "threads", tests=THREADS_FEWER))
    elif f.cores > 1 and f.threads is not None and f.threads != f.cores:
        # on a machine other work keeps busy, more threads queue for the cores it holds (and an op
        # split over threads waits for the slowest): not measured there, and said so
        by_group["threads"].append(Trial({"threads": f.cores}, "threads", tests=THREADS_MORE,
                                         skip="other processes kept the cores busy: more threads would queue for "
                                              "them (rerun on a quiet machine)" if f.contended else None))
    # On the CPU fused first: it is what PD338 advises there (foreach measured 0.8-1.19x, fused
    # faster on every bench model), so a short budget measures it rather than foreach. An optimizer
    # already fused is left alone: foreach would be a step back (a user's fused AdamW got a foreach
    # trial, which took a short budget's time)
    for impl in ("foreach", "fused") if f.cuda else ("fused", "foreach"):
        opts = [o for o in f.optimizers if impl in o.get("supports", []) and not o.get(impl) and not o.get("fused")]
        if opts:
            by_group["optimizer"].append(Trial({"optimizer": impl}, "optimizer"))
    if f.peeks:                       # the loader's iterator kept, not started again for a batch or two
        by_group["iterator"].append(Trial({"keep_iterator": True}, "iterator"))
    if f.per_sample:                  # a TensorDataset indexed once a batch, not once a sample
        by_group["indexing"].append(Trial({"index_batches": True}, "indexing"))
    if f.gathers:                     # the same rows gathered with index_select (PD386: CPU runs alone)
        by_group["indexing"].append(Trial({"gather_select": True}, "indexing"))
    if f.preprocess:                  # the samples prepared once: PD306's most, augmentations frozen
        by_group["preprocessing"].append(Trial({"store_samples": True}, "preprocessing", bound=STORED))
    if f.anomaly:                     # a debugging mode left on: the same numerics without its checks
        by_group["anomaly"].append(Trial({"anomaly": "off"}, "anomaly"))
    if f.distribution_checks:         # argument checks on by default: the same numerics without them
        by_group["distributions"].append(Trial({"distribution_checks": "off"}, "distributions"))
    if f.checkpoints:
        by_group["recompute"].append(Trial({"recompute": "off"}, "recompute"))
    if f.frequent_saves:
        by_group["checkpoint"].append(Trial({"save_every": SAVE_EVERY}, "checkpoint"))
    cuda_skip = None if f.cuda else "no CUDA device"
    if f.nchw:                        # a layout change, numerics kept: PD342 on a GPU, PD392 on the CPU
        by_group["layout"].append(Trial({"channels_last": True}, "layout"))
    by_group["cuda"] += [Trial({"cudnn_benchmark": True}, "cuda", skip=cuda_skip),
                         Trial({"tf32": True}, "cuda", skip=cuda_skip),
                         Trial({"expandable_segments": True}, "cuda", skip=cuda_skip)]
    if f.host_faults:                 # glibc's malloc keeps what it frees: no fresh pages every step
        by_group["allocator"].append(Trial({"keep_host_memory": True}, "allocator"))
    if f.empty_cache_calls:           # each call frees the allocator's cache, which the next steps refill
        by_group["allocator"].append(Trial({"empty_cache": "off"}, "allocator", skip=cuda_skip))
    dtype = "bfloat16" if (f.bf16 or not f.cuda) else "float16"
    numerics_skip = None if allow_numerics else "changes numerics: needs --allow-numerics"
    if f.small_batch and f.loader is not None:     # twice the samples a step, compared per sample
        by_group["numerics"].append(Trial({"batch_scale": 2}, "numerics", skip=numerics_skip))
    if f.sdpa_dropout:                # SDPA without dropout: its fused CPU kernel; training without attention dropout
        by_group["numerics"].append(Trial({"attention_dropout": "off"}, "numerics", skip=numerics_skip))
    if f.fp64 or f.half:              # float32 first: the step PD357 advises before any 16-bit autocast
        by_group["numerics"].append(Trial({"float32": True}, "numerics", skip=numerics_skip))
    # autocast leaves float64 ops in float64 (only float32 ones are eligible): on a float64 model
    # it alone changes nothing (a trial measured 1.07x, its loss identical), so it goes on float32;
    # a 16-bit model on a CPU without its math (PD368) gets no 16-bit autocast trial: float32 is the fix
    if not f.half:
        by_group["numerics"].append(Trial({"float32": True, "autocast": dtype} if f.fp64 else {"autocast": dtype},
                                          "numerics", skip=numerics_skip))
    # the mode the report advises: graph replay for a launch-bound CUDA step (PD311), else default
    mode = "reduce-overhead" if f.cuda and f.graph_replay else True
    by_group["compile"].append(Trial({"compile": mode}, "compile",
                                     skip="the script compiles its model already" if f.compiled else
                                     None if allow_compile else "costs compile time: needs --allow-compile"))
    verdict_order = group_order(f)
    order = sorted(verdict_order, key=lambda g: _first_rank(f.ranked, by_group[g], verdict_order.index(g)))
    if fewer is not None:               # before the report's ranked fixes: contention distorts their trials
        order.remove("threads")
        order.insert(0, "threads")
    trials = [t for g in order for t in by_group[g] if wanted(t, only)]
    # but the trial of the report's first-ranked fix runs first of all: a short budget leaves it out
    # never (a shared machine's threads trial, put first, had taken a 110 s budget, and tune called
    # threads=1 best where num_workers=0, PD347's 1.95x, measured 4.4x by hand)
    top = next((t for t in trials if t.skip is None and f.ranked and f.ranked[0] in tested(t)), None)
    if top is not None:
        trials.remove(top)
        trials.insert(0, top)
    return trials


def only_names(values: list[str] | None) -> frozenset[str] | None:
    """`--only`'s names (comma-separated, repeatable): trial groups and the fix ids trials test;
    an unknown name is a usage error that lists the known ones, and so is `--only ""` (an empty
    shell variable: it had meant no filter, and the whole budget went to every trial)."""
    if not values:
        return None
    names = frozenset(v.strip() for value in values for v in value.split(",") if v.strip())
    groups = set(ORDER["input"])
    fixes = fixes_tested()
    known = f"groups: {', '.join(ORDER['input'])}; fixes: {', '.join(sorted(fixes))}"
    if not names:
        raise PerfdoctorError(f"--only: no name given; {known}")
    unknown = sorted(n for n in names if n not in groups and n.upper() not in fixes)
    rule_ids = {f.name[:5] for f in builtin_rules_dir().glob("PD*.toml")} if unknown else set()
    untested = [n.upper() for n in unknown if n.upper() in rule_ids]
    if untested:              # a rule id no trial tests (a user tried --only PD395: its fix is a code change)
        raise PerfdoctorError(f"--only: no trial tests {', '.join(untested)} (a change to the code, which tune "
                              f"cannot make: the report's fix says what to change, then `perfdoctor compare`); "
                              f"{known}")
    if unknown:
        raise PerfdoctorError(f"--only: unknown {', '.join(unknown)}; {known}")
    return frozenset(n if n in groups else n.upper() for n in names)


def baseline_stacks(stacks: bool | None, only: frozenset[str] | None) -> bool | None:
    """The baseline's --stacks: as given; on where --only names a fix only the stacks find
    (rules/tunable.py STACKS_ONLY) or its group, whose trial is planned from the baseline's report
    (the auto mode leaves it without stacks on a busy machine: `--only PD379` planned nothing)."""
    if stacks is None and only and (only & STACKS_ONLY or "distributions" in only):
        return True
    return stacks


def wanted(t: Trial, only: frozenset[str] | None) -> bool:
    """`t` is one `--only` asked for: its group, or a fix it tests, is named (no `--only`: all)."""
    return only is None or t.group in only or any(r in only for r in tested(t))


def tested(t: Trial) -> tuple:
    """The fix rules `t` can test: its own (`tests`), else its changes' (KNOB_RULES)."""
    return t.tests or tuple(r for k, v in t.changes.items() for r in _rules(k, v))


def _first_rank(ranked: list, trials: list[Trial], fallback: int) -> tuple:
    """Where a group stands: the best rank, in the report, of a fix its trials test (ranked
    groups first, best first); unranked groups after them, in the verdict's order."""
    ranks = [ranked.index(r) for t in trials if t.skip is None for k, v in t.changes.items()
             for r in _rules(k, v) if r in ranked]
    return (0, min(ranks)) if ranks else (1, fallback)


def fallback(t: Trial) -> Trial | None:
    """The trial to run when `t` failed: default-mode compile after graph replay, else none."""
    if t.changes.get("compile") == "reduce-overhead":
        return Trial({**t.changes, "compile": True}, t.group)
    return None


def refinements(f: Facts, best_loader: dict | None, workers_measured: bool = True,
                workers_failed: bool = False, only: frozenset[str] | None = None) -> list[Trial]:
    """persistent_workers and prefetch_factor on top of the best worker setting found (or the
    script's own, when it already has workers). `workers_measured`: some num_workers trial was
    measured (false when the budget skipped them all, or they all failed: `workers_failed`)."""
    if f.loader is None:
        return []
    base = dict(best_loader or {})
    workers = base.get("num_workers", f.loader.get("num_workers") or 0)
    out = []
    no_workers = ("needs worker processes (the fastest setting has none)" if best_loader is not None
                  else "needs worker processes (no num_workers setting was faster)" if workers_measured
                  else "needs worker processes (the num_workers trials failed)" if workers_failed
                  else "needs worker processes (no num_workers setting was measured)")
    if f.loader.get("num_workers") and not f.loader.get("persistent_workers"):   # else the first pass had it
        out.append(Trial({**base, "persistent_workers": True}, "loader", refines=True,
                         skip=None if workers else no_workers))
    pf = f.loader.get("prefetch_factor") or 2
    if pf < PREFETCH_TRY:
        out.append(Trial({**base, "prefetch_factor": PREFETCH_TRY}, "loader", refines=True,
                         skip=None if workers else no_workers))
    return [t for t in out if wanted(t, only)]


def _rules(key: str, value) -> tuple:
    """The rules a change tests: num_workers=0 (from a script with workers) is PD347's."""
    return (NO_WORKERS_RULE,) if key == "num_workers" and value == 0 else KNOB_RULES.get(key, ())


def rule_for(changes: dict, fix_ids: set[str], applicable: set[str] | None = None,
             ranked: set[str] | None = None, tests: tuple | None = None) -> str | None:
    """The fix rule this change tests: the first of its rules that the report ranked (`ranked`:
    with a gain), else the first the report gave (`fix_ids`), else the first one it could have
    given (its prediction is then null). `applicable`: the rules that apply on this run's device
    (a CPU run's compile is PD312's, not the CUDA-only PD311's). A threads=1 trial on a contended
    machine tests PD348 (~1.77x, ranked), not PD341 (fired beside it, no gain): it was credited
    to PD341, predicted "?", and PD348 was listed as "not measured by tune". `tests`: the trial's
    own rules where its direction decides (more threads on a contended machine, planned as skipped,
    had been credited to the ranked PD348, fewer threads' fix, which then left the untested list)."""
    ids = [rid for rid in (tests or [r for k, v in changes.items() for r in _rules(k, v)])
           if applicable is None or rid in applicable]
    return next((r for r in ids if r in (ranked or ())), None) or next((r for r in ids if r in fix_ids),
                                                                      ids[0] if ids else None)
