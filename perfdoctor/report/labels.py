"""What every renderer calls things, and the rows of the step breakdown they all show.

Plain data and a pure function: no rich here, so the HTML, markdown and annotated-trace
renderers need not import it.
"""

from __future__ import annotations

import re

from perfdoctor.analyze.ranks import bound_name
from perfdoctor.diagnose.confidence import median_is_cut
from perfdoctor.rules.gain import times

BOUND_TITLE = {
    "input_io": "INPUT-BOUND (IO)", "input_cpu": "INPUT-BOUND (CPU)", "input": "INPUT-BOUND",
    "host": "HOST-BOUND", "device": "DEVICE-BOUND", "communication": "COMMUNICATION-BOUND",
    "inconclusive": "INCONCLUSIVE",
}


# why the ranks of a job wait in collectives (ranks.wait_cause); each follows "the wait is "
WAIT_CAUSE = {"straggler": "a straggler: the other ranks wait for the slowest one",
              "network": "mostly the collective itself, which every rank waits for: its transfer, or for small "
                         "messages its per-call latency (network, collective library, bucket sizes)",
              "contention": "CPU contention: the slowest rank spent most of its extra time waiting in the run queue for "
                            "a core (an oversubscribed host), not working",
              "uneven": "uneven: no rank is slower step after step (uneven work or a noisy machine)",
              "none": "no material wait (under 5% of the step on every rank)"}


# how a run ended (run.outcome), as every output words it
OUTCOME = {"completed": "the script finished", "stopped": "perfdoctor stopped the script",
           "exit": "the script exited", "crashed": "the script crashed", "interrupted": "interrupted",
           "killed": "the script was killed", "unknown": "outcome unknown", "no_module": "no such module"}


def device_text(m: dict) -> str:
    """The header's device: the model the trace names; 'CPU only', or for a trace that lists a
    device whose activity it did not record, that it is not known to be CPU only."""
    if m.get("trace.device_name"):
        return str(m["trace.device_name"])
    if m.get("trace.untraced_device"):
        return f"CPU ops traced, {m['trace.untraced_device']} activity not recorded"
    cc = m.get("trace.compute_capability")
    if m.get("trace.capability_from_kernels") and isinstance(cc, (int, float)):
        return f"device unknown (compute capability {cc:.1f} or later, from its kernels' names)"
    return {"cpu": "CPU only", "mtia": "MTIA"}.get(m.get("trace.platform"), "device unknown")


def bound_title(bound: str, metrics: dict) -> str:
    """The verdict's badge: a device-bound CPU-only run is COMPUTE-BOUND (CPU) (its "device" is
    the CPU, and no GPU is involved); an unknown bound (a hostile report.json) as it is."""
    if bound == "device" and metrics.get("trace.platform") == "cpu":
        return "COMPUTE-BOUND (CPU)"
    return BOUND_TITLE.get(bound, str(bound))


def rank_bound(row: dict) -> str:
    """A rank's verdict in a table of ranks: its bound, the CPU's "device" named as compute."""
    return bound_name(row.get("verdict"), row.get("platform"))


def trace_bound(t: dict) -> str:
    """A trace's verdict in the table of a folder's traces, as rank_bound names a rank's."""
    return bound_name(t["verdict"]["bound"], t["metrics"].get("trace.platform"))


# the fixes that are not ranked: no model of their gain, or one that expects too little to rank
WORTH_A_LOOK = "worth a look (no modelled gain, or none expected here)"
# the heading where every fix is one of those: not "no fix applies" (a CPU loop of small ops read
# "No fix with a measurable speed-up applies" above torch.compile, which tune then measured at 11x)
NO_FIX = "No fix with a measurable speed-up applies."       # no fix at all
NONE_MODELLED = "No fix has a modelled gain here; the fixes below are worth a look, and tune measures them"
OFF_BOTTLENECK_SHARE = 0.5     # the bottleneck's share of the step from which the note below is said
BOTTLENECK_NAMES = {"input": "the data wait", "host": "the host's time", "device": "the device's time",
                    "communication": "communication"}     # by rules.model.target_of; share.<key> is its share


def off_bottleneck_note(doc: dict) -> str | None:
    """Where the verdict's bottleneck holds most of the step, every ranked fix is off it and some
    fix worth a look is on it: which fixes are the bottleneck's. A user's tabular loop waited 78%
    of its steps for its samples: "1. ~1.20x sparse embeddings, 2. ~1.12x fused optimizer" read as
    the advice, and preprocessing, worth a look below them, measured 3.5x. No bound is put on the
    ranked ones: Amdahl on the rest of the step (1.29x there) was beaten by sparse embeddings,
    1.32-1.46x, whose smaller optimizer step left the Dataset's Python, on the same CPU, faster."""
    from perfdoctor.rules.model import target_of

    findings = doc.get("findings") or []
    ranked = [f for f in findings if f.get("ranked")]
    own = [f["id"] for f in findings if not f.get("ranked") and f.get("on_bottleneck")]
    target = target_of((doc.get("verdict") or {}).get("bound"))
    m = ((doc.get("traces") or [{}])[0].get("metrics")) or {}
    share = m.get(f"share.{target}") if target in BOTTLENECK_NAMES else None
    if not ranked or not own or any(f.get("on_bottleneck") for f in ranked) \
            or not isinstance(share, (int, float)) or not OFF_BOTTLENECK_SHARE <= share <= 1:
        return None
    name = "the CPU ops' time" if target == "device" and m.get("trace.platform") == "cpu" else BOTTLENECK_NAMES[target]
    return (f"{name} holds {share:.1%} of the step, and the fixes ranked here are off it; its own "
            f"({', '.join(own)}) have no modelled gain: code changes whose effect the trace cannot size, "
            "listed below them")


# The four articles the fix rules cite by file name (`source.article`, e.g. 003_7bbbd8e6e30a68ae.txt):
# Chinese texts, three of them translations of these English originals. A citation names the
# article, not only its number ("article 003, tip 0" meant nothing to a user).
ARTICLES = {
    "000": 'Hope Wang, "This Is How To Optimize PyTorch for Faster Model Training"',
    "001": 'Alex Dremov, "Simple ways to speed up your PyTorch model training" (2024)',
    "002": 'a blog post on distributed training and performance optimisation in PyTorch',
    "003": 'Eugene Khvedchenya, "Efficient PyTorch: eliminating training bottlenecks" (2020)',
}


def _article(num: str) -> str:
    """'article 003 (Eugene Khvedchenya, "Efficient PyTorch: ..." (2020))' for one of ARTICLES."""
    return f"article {num} ({ARTICLES[num]})"


def cite(src: dict) -> str:
    """'article 003 (Eugene Khvedchenya, "Efficient PyTorch: ..." (2020)), tip 0 (...)': a rule's
    source as the reports show it; an article outside the four (a user's rule) as its file says."""
    art = str(src.get("article"))
    num = art[:3]
    name = _article(num) if num in ARTICLES else art
    return f"{name}, {src.get('section')}"


def cite_also(also: str) -> str:
    """A rule's `source.also` entry with an article's file name as cite names it ('001_83940edd4f8b10bc.txt
    data loading' -> 'article 001 (Alex Dremov, ...): data loading'); other references as written."""
    m = re.match(r"(\d{3})_[0-9a-f]+\.txt\b\s*(.*)", str(also), re.S)
    if not m or m.group(1) not in ARTICLES:
        return str(also)
    return _article(m.group(1)) + (f": {m.group(2)}" if m.group(2) else "")


def unranked_gain(f: dict) -> str:
    """', expected ~1.00x, at most 1.01x' for a fix that has a model (what it expects is too small
    to rank); ', at most 1.30x' where only the ceiling is known; '' where neither is."""
    g = f.get("gain") or {}
    exp, c = g.get("expected"), g.get("ceiling")
    return (f", expected ~{times(exp)}" if exp else "") + (f", at most {times(c)}" if c and c >= 1.01 else "")


ABNORMAL = {"crashed": "The script crashed", "killed": "The script was killed", "interrupted": "The run was interrupted"}


def shown_trace(doc: dict) -> dict:
    """The trace whose figures the report shows (header, breakdown, timeline): the one the
    verdict's summary quotes among several (verdict.figures_of), else the first."""
    want = doc["verdict"].get("figures_of")
    return next((t for t in doc["traces"] if want is not None and t.get("label") == want), doc["traces"][0])


def shown_rank(doc: dict) -> int | None:
    """The rank of a multi-rank run whose figures are shown (the slowest: traces[0]); None for one
    process. Uneven inputs had shown rank 1's 20 steps, "inconclusive", as the job's where rank 0
    ran 40: the run line names its rank."""
    rank = shown_trace(doc).get("rank")
    return rank if doc.get("ranks") and isinstance(rank, int) else None


def from_other_traces(doc: dict, item: dict) -> str:
    """For a fix or flag of a report on several traces that the trace whose figures are shown
    does not have: the traces it comes from ('a.json, b.json', at most 3 named); else ''.
    (Unrelated traces, a CUDA one and a CPU one, had CUDA fixes under a CPU trace's header.)"""
    figures = doc["verdict"].get("figures_of") if len(doc["traces"]) > 1 else None
    where = item.get("traces") or []
    if figures is None or not where or figures in where:
        return ""
    return ", ".join(where[:3]) + (f", +{len(where) - 3}" if len(where) > 3 else "")


def source_text(source) -> str:
    """' of backward passes (...)' after a run's step count when its steps are not optimizer
    steps (what a step is there), else ''."""
    return f" of {source}" if isinstance(source, str) and source and source != "optimizer steps" else ""


def passes_text(m: dict) -> str:
    """' (8 backward passes a step)' after a run's step count when a step holds several backward
    passes (gradient accumulation: the step time is the optimizer step's, not the micro-batch's),
    else ''. The count is of the step whose module calls were counted (loop.backward_passes_per_step)."""
    n = m.get("loop.backward_passes_per_step")
    return f" ({n} backward passes a step)" if isinstance(n, int) and not isinstance(n, bool) and n > 1 else ""


def windows_text(m: dict) -> str:
    """' in 3 profiler windows of one process, joined' after a step count, or ''."""
    n = m.get("trace.windows")
    return f" in {n} profiler windows of one process, joined" if isinstance(n, int) and n > 1 else ""


FIRST_STEP_SHARE = 0.2      # the first step's time is named once set-up took this much of the run


def secondary_text(v: dict) -> str:
    """Under the verdict: the other causes of 5% of the step or more (diagnose/confidence.py), said
    as that ('also significant: host' had stood over a host share of 5.2%); '' when there is none."""
    names = [str(x) for x in v.get("secondary") or []] if isinstance(v.get("secondary"), list) else []
    return f"also 5% of the step or more: {', '.join(names)}" if names else ""


def steps_counted(n, what: str = "", all_timed: bool = False) -> str:
    """'100 steps, 99 timed' from run.steps (the timed ones: the first step's end starts the clock,
    so N steps are N - 1 timed; a user counted 100 and read "99 steps"), `what` after "steps"
    (' (optimizer steps)'); '' when run.steps is no count above 0 (a report is input).
    `all_timed` (run.first_step_timed): the first step was timed from its own start (a closure
    optimizer's, LBFGS: 4 steps read "5 steps, 4 timed"): 'N steps, all timed'."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return ""
    return f"{n} steps{what}, all timed" if all_timed is True else f"{n + 1} steps{what}, {n} timed"


def first_step_shown(m: dict, wall_s) -> float | None:
    """run.first_step_s where the set-up before the first step took a fifth of the run or more
    (a GCN spent 5 of its 9 s loading its graph): the renderers name it; None otherwise."""
    first = m.get("run.first_step_s")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (wall_s, first)) or wall_s <= 0:
        return None
    return float(first) if first >= FIRST_STEP_SHARE * wall_s else None


def data_wait_text(m: dict) -> str:
    """'data wait 12.0% of that time' after a run's step time; with the loop's wait on its own
    producers (the Python stacks) beside it, as the step records count DataLoader waits only (a
    loop fed by its own thread pool read "data wait 0.0%" under an input-bound verdict). A loop
    no DataLoader fed says so: "0.0%" read as a measured wait where nanoGPT's get_batch slices a
    memmap inside the step (step time)."""
    own = m.get("stacks.producer_wait_share")
    wait = m.get("run.data_wait_share") or 0
    loader = not (m.get("loop.batches_per_step") == 0 and not wait)
    head = (f"data wait {100 * wait:.1f}% of that time" if loader else
            "no DataLoader batch in these steps (data the loop makes itself is step time)")
    return (head + (f"{' (DataLoader)' if loader else ''}; waiting on its own producers {100 * own:.1f}% (Python stacks)"
                    if isinstance(own, (int, float)) and own >= 0.005 else ""))


def median_label(doc: dict, traced: bool) -> str:
    """The header's median: a run's traced steps are not its steady ones (the run line gives
    their median beside the step time: nanoGPT read "median step 89.4 ms" over its 5 profiled
    steps and "median 80.9 ms" over its 288 steady ones, with nothing to tell them apart)."""
    return "median traced step" if traced and doc.get("run") else "median step"


def cut_text(m: dict) -> str:
    """' (cut short)' after the traced steps' median where it is a cut step's length
    (diagnose.confidence.median_is_cut: an LBFGS step of 22 s read "median traced step 9770 ms")."""
    return " (cut short)" if median_is_cut(m) else ""


def error_line(run: dict) -> str | None:
    """The script's error as one line (run.error_line: its first line, terminal codes removed; an
    older report has the whole message only)."""
    return run.get("error_line") or run.get("error")


def abnormal_end(run: dict | None) -> str | None:
    """'The script crashed (exit code 1): RuntimeError: boom' for a run that did not end as it
    should (its numbers cover what ran before that); None otherwise."""
    if not run or run.get("outcome") not in ABNORMAL:
        return None
    code, err = run.get("exit_code"), error_line(run)
    return (ABNORMAL[run["outcome"]] + (f" (exit code {code})" if code is not None else "")
            + (f": {err}" if err else ""))


STOPPED = ("completed", "stopped")      # run.outcome of a run that ended as it should (exit 0)


def script_failure(run: dict | None) -> str | None:
    """'crashed (exit code 1)', 'exited with exit code 3': how a run's script failed (a non-zero
    exit, a crash, a kill, an interrupt; not perfdoctor's stop at --duration or --max-steps, which
    may end in an interrupt), None for a run that ended as it should or a report without a run."""
    if not isinstance(run, dict) or run.get("stopped_by"):
        return None
    outcome, code = run.get("outcome"), run.get("exit_code")
    outcome = outcome if isinstance(outcome, str) else None             # a report is input
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    if outcome in STOPPED or (outcome in (None, "exit") and code in (None, 0)):
        return None
    how = {"exit": "exited", "crashed": "crashed", "killed": "was killed", "interrupted": "was interrupted",
           "no_module": "found no module to run"}.get(outcome or "exit", "did not finish")
    return how + (f" (exit code {code})" if code is not None else "")


MIXED_CAUSE = 0.9           # a stack row whose main cause holds less of it says how much


def cause_text(row: dict) -> str:
    """A stack row's cause: 'backward', or 'mostly backward (52%)' where the row's stacks differ
    in cause (an older report has no cause_share: the cause alone)."""
    cause = str(row.get("cause") or "other").replace("_", " ")
    part = row.get("cause_share")
    return f"mostly {cause} ({100 * part:.0f}%)" if isinstance(part, (int, float)) and part < MIXED_CAUSE else cause


ROLE_LABEL = {"kernel": "GPU kernels", "memcpy": "memcpy", "memset": "memset",
              "communication": "communication", "runtime": "runtime calls",
              "data_loading": "data loading", "cpu_exec": "CPU ops", "other": "other / untraced"}
CPU_ROLE_LABEL = {**ROLE_LABEL, "cpu_exec": "CPU ops (compute)", "communication": "communication (gloo)"}
MIN_SHARE = 0.0005          # a breakdown row below this share of the step is not shown


def role_labels(metrics: dict) -> dict:
    """The breakdown's role -> label for this trace's platform."""
    return CPU_ROLE_LABEL if metrics.get("trace.platform") == "cpu" else ROLE_LABEL


def breakdown_rows(trace: dict, labels: dict) -> list[tuple[str, str, float, float]]:
    """(role, label, mean ms per step, share of the step) of a trace document's breakdown, in the
    labels' order, rows under MIN_SHARE left out; [] without steps."""
    steps, m = trace.get("steps") or [], trace.get("metrics") or {}
    if not steps:
        return []
    rows = [(r, name, sum(s["breakdown_ms"][r] for s in steps) / len(steps), m.get(f"breakdown.{r}") or 0.0)
            for r, name in labels.items()]
    return [row for row in rows if row[3] >= MIN_SHARE]


def uneven_detail(m: dict) -> str:
    """After an 'uneven' wait cause: whom the ranks waited for ('; of the wait for slower ranks,
    99% was for rank 0, the busiest in 5 of 5 paired steps'), so a rank the others wait for in its
    long steps only (an evaluation every N steps) is named, and turns read as turns."""
    share, last, paired = (m.get(k) for k in ("ranks.slowest_last_wait_share", "ranks.slowest_last_steps",
                                              "ranks.paired_steps"))
    if m.get("ranks.wait_cause") != "uneven" or share is None or not paired:
        return ""
    return (f"; of the wait for slower ranks, {share:.0%} was for rank {m.get('ranks.slowest_rank')}, "
            f"the busiest in {last} of {paired} paired steps")


SAME_SHARE = "its share overlaps {}'s: the gains do not add"


def overlapping(f: dict, above: list[dict]) -> str | None:
    """The id of a fix in `above` whose share `f`'s overlaps (a rule's gain.overlaps names the
    other's slug, either way round): PD341 and PD348 both expect the step's queueing for a CPU
    to go, and a user read two ~1.78x fixes as two gains. None where it overlaps none of them."""
    mine = set((f.get("gain") or {}).get("overlaps") or ())
    for e in above:
        if e.get("slug") in mine or f.get("slug") in ((e.get("gain") or {}).get("overlaps") or ()):
            return e.get("id")
    return None
