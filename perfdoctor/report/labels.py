"""What every renderer calls things, and the rows of the step breakdown they all show.

Plain data and a pure function: no rich here, so the HTML, markdown and annotated-trace
renderers need not import it.
"""

from __future__ import annotations

from perfdoctor.report.values import s_as_ms
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
    bound = row.get("verdict")
    return "compute (CPU)" if bound == "device" and row.get("platform") == "cpu" else str(bound)


# the fixes that are not ranked: no model of their gain, or one that expects too little to rank
WORTH_A_LOOK = "worth a look (no modelled gain, or none expected here)"


# The four articles the fix rules cite by file name (`source.article`, e.g. 003_7bbbd8e6e30a68ae.txt):
# Chinese texts, three of them translations of these English originals. A citation names the
# article, not only its number ("article 003, tip 0" meant nothing to a user).
ARTICLES = {
    "000": 'Hope Wang, "This Is How To Optimize PyTorch for Faster Model Training"',
    "001": 'Alex Dremov, "Simple ways to speed up your PyTorch model training" (2024)',
    "002": 'a blog post on distributed training and performance optimisation in PyTorch',
    "003": 'Eugene Khvedchenya, "Efficient PyTorch: eliminating training bottlenecks" (2020)',
}


def cite(src: dict) -> str:
    """'article 003 (Eugene Khvedchenya, "Efficient PyTorch: ..." (2020)), tip 0 (...)': a rule's
    source as the reports show it; an article outside the four (a user's rule) as its file says."""
    art = str(src.get("article"))
    num = art[:3]
    name = f"article {num} ({ARTICLES[num]})" if num in ARTICLES else art
    return f"{name}, {src.get('section')}"


def unranked_gain(f: dict) -> str:
    """', expected ~1.00x, at most 1.01x' for a fix that has a model (what it expects is too small
    to rank); ', at most 1.30x' where only the ceiling is known; '' where neither is."""
    g = f.get("gain") or {}
    exp, c = g.get("expected"), g.get("ceiling")
    return (f", expected ~{times(exp)}" if exp else "") + (f", at most {c:.2f}x" if c and c >= 1.01 else "")


ABNORMAL = {"crashed": "The script crashed", "killed": "The script was killed", "interrupted": "The run was interrupted"}


def shown_trace(doc: dict) -> dict:
    """The trace whose figures the report shows (header, breakdown, timeline): the one the
    verdict's summary quotes among several (verdict.figures_of), else the first."""
    want = doc["verdict"].get("figures_of")
    return next((t for t in doc["traces"] if want is not None and t.get("label") == want), doc["traces"][0])


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
           "no_module": "found no module to run"}.get(outcome, "did not finish")
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


def tune_predicted(tr: dict) -> str:
    """A tune trial's "predicted" cell: the report's expected gain of the fix it tests; "?" when
    the report offers that fix without a model of its gain (as `run` prints it); a fix the report
    did not raise predicts nothing (it found no sign of that bottleneck), which "?" would hide."""
    rule = tr.get("rule")
    if tr.get("predicted") is not None:
        return f"{tr['predicted']:.2f}x ({rule})"
    if not rule:
        return "-"
    return f"? ({rule})" if tr.get("offered", True) else f"- ({rule} not raised)"


MEASURE_FIXES = "measure these fixes on the script:"     # the line above tune_hint's command


def tune_hint(doc: dict) -> str | None:
    """Under a run's fixes: the `perfdoctor tune` command line that measures those of them a trial
    can test on this device (rules/tunable.py), on the same script; None for a trace alone, a
    multi-rank run (tune runs one process), a run without a step in the launched process, or
    fixes no trial tests."""
    from perfdoctor.rules.tunable import tune_command

    run = doc.get("run") or {}
    if not run.get("command") or doc.get("ranks") or doc.get("cross_rank") or not doc.get("traces"):
        return None
    if run.get("steps") == 0:     # tune measures the launched process's steps: it had none (trained elsewhere?)
        return None
    if script_failure(run):       # tune refuses a baseline whose script fails: fix that first
        return None
    m = shown_trace(doc)["metrics"]
    platform = m.get("trace.platform")
    cuda = platform in ("cuda", "rocm") or (platform is None and m.get("gpu.util_mean") is not None)
    fixes = [f["id"] for f in doc.get("findings") or [] if f.get("kind", "fix") == "fix" and f.get("id")]
    return tune_command(fixes, run["command"], cuda)


def tune_only(doc: dict) -> str:
    """What `--only` kept: the names, and how many trials test them here (none: the fix was not
    raised by the baseline's report, or no setting tests it)."""
    names = ", ".join(doc.get("only") or [])
    n = len(doc["trials"])
    return (f"only {names} (--only): " + (f"{n} trial{'s' if n != 1 else ''}" if n else
            "no trial tests it on this run (the baseline's report did not raise it, or no setting tests it)"))


def tune_no_best(doc: dict) -> list[str]:
    """What tune says when no trial was measurably faster: whether anything was measured, and
    which trials could not be told from the baseline (then not "keep the script as it is": they
    were not measured equal, only not told apart)."""
    settings = [tr for tr in doc["trials"] if not tr.get("bound")]
    measured = any(tr["speedup"] is not None for tr in settings)
    out = ["none of the trials was measurably faster than the baseline." if measured
           else "nothing was measured: --only left no trial to run." if doc.get("only") and not doc["trials"]
           else "nothing was measured: no trial could run (reasons above)."]
    bounds = [tr for tr in doc["trials"] if tr.get("bound") and tr["status"] == "faster"]
    if bounds:          # a measure of a code change, not a setting to apply (tune/plan.py)
        out[0] = ("no setting tune can make was measurably faster; " if measured else "no setting was measured; ") + \
            "; ".join(f"{tr['label']} measured {tr['speedup']:.2f}x: the most {tr['rule']}'s code change (in the "
                      "report) can give" for tr in bounds) + "."
    unsure = [tr["label"] for tr in settings if tr["status"] == "inconclusive"]
    if unsure:
        out.append(f"{len(unsure)} trial(s) inconclusive ({'; '.join(unsure)}): the runs varied too much to tell a "
                   "gain from a loss; rerun on a quiet machine, or with a larger --budget")
    elif measured and not bounds:     # "no change was measured faster": not so, with a bound faster
        out += (doc.get("apply") or "").splitlines()
    return out


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


def tune_step_times(tr: dict) -> tuple[str, str]:
    """A tune trial's "step time" and "vs baseline" cells. A trial run a second time to confirm it
    shows both runs' step times and all the baseline runs they were compared with, as its speed-up
    and interval pool both runs (the cells had shown the first run alone, 0.378 ms against 0.555 ms
    beside a pooled 1.16x)."""
    conf = tr.get("confirm") or {}
    steps = [tr.get("step_time_s")] + ([conf["step_time_s"]] if conf.get("step_time_s") is not None else [])
    bases = list(tr.get("baseline_step_time_s") or [])
    if conf.get("baseline_step_time_s") is not None:
        bases.append(conf["baseline_step_time_s"])

    def cell(xs):
        return "/".join(s_as_ms(x, "?").removesuffix(" ms") for x in xs) + " ms"
    return (cell(steps) if len(steps) > 1 else s_as_ms(steps[0]),
            cell(bases) if bases and steps[0] is not None else "-")      # a failed run: no comparison


def tune_baselines_note(doc: dict, column: bool = True) -> str:
    """Under tune's table when the baseline ran more than once: each row's "vs baseline" is the
    baseline run(s) beside that trial, not the header's first run (a trial read 62.0 ms under a
    header of 59.2 ms, unexplained). '' for a baseline run once."""
    b = doc["baseline"]
    runs = [b.get("step_time_s")] + [r.get("step_time_s") for r in b.get("repeats") or []]
    if len(runs) < 2:
        return ""
    times = ", ".join(s_as_ms(x, "?").removesuffix(" ms") for x in runs)
    # interleaved only once the machine was found noisy (tune/session.py): a trial then has the
    # baseline runs before and after it; on a quiet one each is measured against the last before it
    # and the closing run after all the trials (tune/verify.py), when the budget left one
    closing = doc.get("closing")
    interleaved = any(len([d for d in tr.get("baseline_dirs") or [] if d != closing]) > 1
                      for tr in doc.get("trials") or [] if isinstance(tr, dict))
    if interleaved:
        how = ("before the trials and, once the machine was found noisy, after each trial, so that a drift of the "
               "machine hits both sides alike" + (", and once after all the trials" if closing else ""))
    elif closing:
        how = ("before the trials and once after them all: each trial is compared with the run before it and the "
               "one after them all, pooled, so that a drift during the trials weighs on both sides")
    else:
        how = ("before the trials only (and before a confirmation), not after them: a drift during the trials is "
               "not cancelled, only the runs' spread widens each interval")
    head = ("vs baseline: the baseline run(s) beside each trial, which its speed-up is measured against." if column
            else "Each trial's speed-up is measured against the baseline run(s) beside it.")   # the column left out
    return f"{head} The baseline ran {len(runs)} times, {how}: {times} ms/step (the header's is the first)."


def tune_model_check(trials: list[dict]) -> list[str]:
    """The lines under tune's table: how many checked trials agree with the report's model of
    the fix they test (naming their rules), then each other trial in full, by its label (one
    rule can be tested by several trials: workers 1 and 2). tune/modelcheck.py judges each
    trial. A trial whose fix has no model of its gain (`unmodelled`) can neither agree nor not:
    it is listed, not counted ("0 of 1 agree" had stood over "no model of its gain, at most 1.57x,
    measured 1.38x"). [] when no trial was checked."""
    checked = [tr for tr in trials if tr.get("model_check")]
    if not checked:
        return []
    judged = [tr for tr in checked if tr["model_check"]["verdict"] != "unmodelled"]
    agree = [tr["model_check"]["rule"] for tr in judged if tr["model_check"]["verdict"] == "agrees"]
    head = ([f"the report's gains against these runs: {len(agree)} of {len(judged)} agree"
             + (f" ({', '.join(dict.fromkeys(agree))})" if agree else "")] if judged else [])
    return head + [f"{tr['label']} ({tr['model_check']['rule']}): {tr['model_check']['text']}"
                   for tr in checked if tr["model_check"]["verdict"] != "agrees"]


def tune_best_step(doc: dict) -> str:
    """The best setting's step time after "best:": both runs' when a second run confirmed it, as
    its speed-up pools both (the first run alone, picked as the fastest of several, leans fast:
    "1.69x (two runs), 18.4 ms/step" where the second run took 22.2 ms)."""
    best = doc["best"]
    row = next((tr for tr in doc["trials"] if tr["changes"] == best["changes"] and tr.get("confirm")), None)
    if not best.get("confirmed") or row is None:
        return s_as_ms(best["step_time_s"])
    return tune_step_times({**row, "step_time_s": best["step_time_s"]})[0]


def budget_hint(doc: dict) -> str:
    """After the trials tune skipped for lack of budget: how large a budget would run them."""
    need = doc.get("budget_for_all_s")
    return f"--budget {need:.0f} would run them all, at this run length" if need else "raise --budget to run them"
