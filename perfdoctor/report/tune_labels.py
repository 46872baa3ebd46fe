"""The words of `perfdoctor tune`'s results where the report shows them: each trial's predicted
and measured cells, the notes under the table (baselines, model check, no best), and the tune
command line a run's report offers under its fixes (tune_hint)."""

from __future__ import annotations

import re

from perfdoctor.report.labels import script_failure, shown_trace
from perfdoctor.report.values import s_as_ms


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


def predicted_note(trials: list[dict]) -> str:
    """Under tune's table when a trial has a prediction: whose it is (a user compared tune's 1.16x
    for PD350 with the 1.27x of the report of an earlier run of the script, unexplained)."""
    if not any(isinstance(tr, dict) and tr.get("predicted") is not None for tr in trials):
        return ""
    return ("predicted: the gain this tune's baseline report expects of the fix a trial tests (a report of another "
            "run of the script measured its own shares, and may expect another)")


def per_sample_note(trials: list[dict]) -> str:
    """Under tune's table when a trial scaled the batch (batch_scale): its step time is of a larger
    batch, longer than the baseline's, and its speed-up is per sample (tune/measure.py)."""
    scales = sorted({tr["changes"]["batch_scale"] for tr in trials if isinstance(tr, dict)
                     and isinstance(tr.get("changes"), dict) and tr["changes"].get("batch_scale")})
    if not scales:
        return ""
    k = "/".join(str(s) for s in scales)
    return (f"batch_scale={k}: each step trains on {k} times the samples, so its step time is longer; its speed-up "
            f"is in samples per second (the baseline's step time over the trial's, times {k})")


def measured_by_rule(tune: dict | None) -> dict[str, dict]:
    """The best measured trial of each rule, from tune's JSON."""
    out: dict[str, dict] = {}
    for tr in (tune or {}).get("trials") or []:
        rid, sp = tr.get("rule"), tr.get("speedup")
        if rid and sp is not None and tr.get("status") != "failed" and (rid not in out or sp > out[rid]["speedup"]):
            out[rid] = tr
    return out


def tune_measured(tr: dict) -> str:
    """A fix's trial in the report (`report --tune`): '1.03x (95% CI 0.23-4.55: inconclusive)', its
    interval and tune's status with the speed-up (the markdown had shown a bare **1.03x** where
    tune called the trial inconclusive)."""
    ci, status = tr.get("ci95"), tr.get("status")
    inside = "; ".join(x for x in ((f"95% CI {ci[0]:.2f}-{ci[1]:.2f}" if ci else ""),
                                   (str(status) if status else "")) if x)
    return f"{tr['speedup']:.2f}x" + (f" ({inside})" if inside else "")


MEASURE_FIXES = "measure these fixes on the script:"     # the line above tune_hint's command


def tune_hint(doc: dict) -> str | None:
    """Under a run's fixes: the `perfdoctor tune` command line that measures those of them a trial
    can test on this device (rules/tunable.py), on the same script (a job of one node's ranks: with
    --nproc-per-node, tune runs the job whole); None for a trace alone, a job across nodes, a run
    without a step in the launched process, or fixes no trial tests."""
    from perfdoctor.rules.tunable import tune_command

    run = doc.get("run") or {}
    if not run.get("command") or doc.get("cross_rank") or not doc.get("traces"):
        return None
    nproc = _one_node_ranks(doc["ranks"]) if doc.get("ranks") else None
    if doc.get("ranks") and nproc is None:
        return None
    if run.get("steps") == 0 or run.get("training_elsewhere"):
        return None               # tune measures the launched process's steps: none, or no training (children trained)
    if script_failure(run):       # tune refuses a baseline whose script fails: fix that first
        return None
    m = shown_trace(doc)["metrics"]
    platform = m.get("trace.platform")
    cuda = platform in ("cuda", "rocm") or (platform is None and m.get("gpu.util_mean") is not None)
    fixes = [f["id"] for f in doc.get("findings") or [] if f.get("kind", "fix") == "fix" and f.get("id")]
    if m.get("input.loader_batch_size") is None:     # batch_scale scales a DataLoader's batch: none to scale
        fixes = [f for f in fixes if f != "PD385"]
    return tune_command(fixes, run["command"], cuda, nproc)


def further_down(line: str, cmd: str, shown: list[str]) -> str:
    """MEASURE_FIXES under the one screen's fixes, naming those of the command's --only that the
    screen left out (a user asked where the PD338 it measured was: under "+3 more")."""
    m = re.search(r"--only (\S+)", cmd)
    hidden = [i for i in (m.group(1).split(",") if m else []) if i not in shown]
    return f"{line[:-1]} ({', '.join(hidden)} further down the ranking: --details):" if hidden else line


def _one_node_ranks(sec: dict) -> int | None:
    """The ranks of a job that ran whole on one host (every rank of its world found, one host), else None."""
    count, hosts = sec.get("count"), {r.get("host") for r in sec.get("per_rank") or []}
    ok = isinstance(count, int) and count > 1 and count == sec.get("world_size") and len(hosts) == 1
    return count if ok else None


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
    bounds_run = "; ".join(f"{tr['label']} (the most {tr['rule']}'s code change can give)" for tr in doc["trials"]
                           if tr.get("bound") and tr["speedup"] is not None)
    out = ["none of the trials was measurably faster than the baseline." if measured
           else "nothing was measured: --only left no trial to run." if doc.get("only") and not doc["trials"]
           else f"no setting was measured; {bounds_run} was tried." if bounds_run and not settings
           else "nothing was measured: no trial could run (reasons above)."]
    bounds = [tr for tr in doc["trials"] if tr.get("bound") and tr["status"] == "faster"]
    if bounds:          # a measure of a code change, not a setting to apply (tune/plan.py)
        out[0] = ("no setting tune can make was measurably faster; " if measured else "no setting was measured; ") + \
            "; ".join(f"{tr['label']} measured {tr['speedup']:.2f}x: the most {tr['rule']}'s code change (in the "
                      "report) can give" for tr in bounds) + "."
    unsure = [tr["label"] for tr in doc["trials"] if tr["status"] == "inconclusive"]
    if unsure:
        out.append(f"{len(unsure)} trial(s) inconclusive ({'; '.join(unsure)}): the runs varied too much to tell a "
                   "gain from a loss; rerun on a quiet machine, or with a larger --budget")
    if measured and not bounds and not any(tr["status"] == "inconclusive" for tr in settings):
        # "no change was measured faster": not so, with a bound faster or a setting not told apart
        out += (doc.get("apply") or "").splitlines()
    return out


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


def pace_text(baseline: dict) -> str:
    """' (the slowest of 2 ranks, rank 1)' after a job's baseline step time (tune/job.py: a job's
    step time is its slowest rank's); '' for one process."""
    n, k = baseline.get("ranks"), baseline.get("pace_rank")
    return f" (the slowest of {n} ranks, rank {k})" if isinstance(n, int) and n > 1 and k is not None else ""
