"""How a `perfdoctor run` ended, and what a run without a trace can still say.

The outcome comes from child.json (the script's own summary), else from the signal that ended
it; a run that recorded no trace says why (--no-trace, too few steps, the script's own profiler,
a failure before the first step...), and its verdict, which rests on step timings and system
samples alone, gets its confidence capped with the reason stated.
"""

from __future__ import annotations

import math
import re

from perfdoctor.collect.launcher import RunResult
from perfdoctor.diagnose.confidence import label


def outcome(res: RunResult) -> str:
    """How the script ended: child.json's word; without it (SIGKILL leaves none), killed when a
    signal ended it, else unknown (child.json missing or damaged)."""
    return res.child.get("outcome") or ("killed" if res.signal is not None else "unknown")


def stopped_by_perfdoctor(res: RunResult) -> bool:
    """perfdoctor interrupted or killed the script after a --duration stop it did not reach a step
    boundary to obey (its training in spawned processes): perfdoctor's ending, not the script's failure."""
    return bool(res.stopped_by) and outcome(res) in ("interrupted", "killed")


def why_no_trace(res: RunResult, steps: list[dict]) -> str:
    state = res.child.get("profiler")
    if res.child.get("trace_enabled") is False:
        return "--no-trace"
    if not steps and stopped_by_perfdoctor(res):
        return f"perfdoctor stopped the script (--{res.stopped_by}) before its first step"
    if not res.child and res.signal is None:   # child.json missing or damaged, and no signal known
        return "child.json, the script's summary, is missing or unreadable"
    if not res.child:                    # no summary: the script was killed (SIGKILL, OOM killer)
        return (f"the script was killed after {len(steps)} step(s), before its trace was written" if steps
                else "the script was killed before its first step")
    if not res.child.get("torch_imported"):
        return "the script never imported torch"
    if not steps and failed(res):
        return ("the script was interrupted before its first step" if outcome(res) == "interrupted"
                else "the script failed before its first step")
    if state == "skipped":
        return "the script runs its own profiler"
    if state == "failed":
        return "torch.profiler failed"
    if state == "empty":
        win = res.child.get("window") or {}
        skip, warm = win.get("start_after_steps"), win.get("profiler_warmup_steps")
        opens = (f"the trace opens after {skip} warm-up step(s) and {warm} profiler warm-up step(s)"
                 if isinstance(skip, int) and isinstance(warm, int) else "the trace opens after the warm-up steps")
        return f"the run ended after {len(steps)} step(s), before a whole step was recorded: {opens}{_sooner(steps)}"
    if not steps:
        return "the script recorded no step"
    return (f"the run ended after {len(steps)} step(s), before the profiled window (it opens after --skip-steps "
            f"steps, or after PERFDOCTOR_WARMUP_S seconds of long steps){_sooner(steps)}")


def _sooner(steps: list) -> str:
    """How to trace a run of a few steps: open the window after the first (a user's 6 steps of 3 s
    got no trace and no word of the flags that give one)."""
    return "; to trace one of so few steps: --skip-steps 1 --trace-steps 1" if len(steps) >= 2 else ""


def failed(res: RunResult) -> bool:
    """Known to have failed (a kill by signal has exit code 128+N); an unknown ending is not, nor
    perfdoctor's own interrupt or kill after --duration."""
    if stopped_by_perfdoctor(res):
        return False
    return res.child.get("outcome") in ("crashed", "interrupted") or bool(res.exit_code)


ERROR_CHARS = 200     # of an exception's message in the verdict (report.json's run.error keeps it whole)
SGR = re.compile(r"\x1b\[[0-9;]*m")    # colours and bold in a message: formatting, not content


def _headline(error: str) -> str:
    """An exception's first line, at most ERROR_CHARS: torch's own messages run to a dozen lines
    (torch.load's weights_only error: 1,200 characters, with terminal bold codes) that the
    script's traceback already shows above the report."""
    line = SGR.sub("", error.strip().splitlines()[0]) if error.strip() else ""
    more = len(line) > ERROR_CHARS or "\n" in error.strip()
    return (line[:ERROR_CHARS].rstrip() + " ...") if more else line


def steps_only_verdict(doc: dict, res: RunResult, steps: list[dict], traced: bool,
                       elsewhere: str | None = None, why: str | None = None) -> None:
    """The run section names the step source and the script's failure; a run without a trace
    gets its verdict (PD111, PD114) with the confidence capped and the reason stated, and a
    script that failed before its first step gets that failure as its verdict. `elsewhere`:
    training in child processes (diagnose/childtrainers.py), the reason a run without steps
    has nothing to diagnose. `why`: the reason there is no trace to use, when it is not one
    why_no_trace tells (a trace file that could not be read)."""
    run = doc["run"]
    run["step_source"] = res.child.get("step_source")
    run["first_step_timed"] = res.child.get("first_step_timed") is True    # a closure optimizer's (all timed)
    run["error"] = res.child.get("error")
    run["error_line"] = _headline(run["error"]) if isinstance(run["error"], str) and run["error"] else None
    if traced:
        return
    why = why or why_no_trace(res, steps)
    verdicts = [doc["verdict"]] + [t["verdict"] for t in doc["traces"]]
    if not steps and stopped_by_perfdoctor(res):
        # not the script's failure (a spawn DDP script read "Fix the failure"): what perfdoctor did
        summary = (f"perfdoctor stopped the script (--{res.stopped_by}) before the launched process recorded a "
                   "step: nothing was measured to diagnose" + (
                       ". Its training ran in its child processes, which perfdoctor does not time (the note says how "
                       "to diagnose them)." if elsewhere else ". A longer --duration lets it reach its first steps."))
        for v in verdicts:
            v.update(summary=summary, notes=[], secondary=[])
        return
    if not steps and (failed(res) or outcome(res) == "unknown"):
        code = "unknown" if res.exit_code is None else res.exit_code
        what = (f"{_headline(run['error'])}; " if run["error"] else "") + f"exit code {code}"
        summary = (f"The script was interrupted before its first step ({what}): nothing was measured to "
                   "diagnose. Run it again, to its steps." if outcome(res) == "interrupted" else
                   f"The script failed before its first step ({what}): nothing was measured to diagnose. Fix "
                   "the failure and run again." if failed(res) else
                   f"No step was recorded, and how the script ended is unknown ({what}): nothing was measured "
                   "to diagnose.")
        for v in verdicts:
            v.update(summary=summary, notes=[], secondary=[])
        return
    for v in verdicts:
        notes = [n for n in v["notes"] if not n.startswith("steps come from")]
        if v["bound"] == "inconclusive":
            if not steps and elsewhere:
                v["summary"] = ("No step was recorded in the launched process: "
                                + ("the training ran in its child processes, which perfdoctor does not time. Nothing "
                                   "of theirs was measured to diagnose." if elsewhere.startswith("the script trained")
                                   else "its python child processes did the work, and if they trained, perfdoctor "
                                        "did not time them. Nothing was measured to diagnose."))
                v["notes"] = notes
            elif not steps and not res.child.get("torch_imported") and res.child:
                v["notes"] = notes + ["no step was recorded: the script had not imported torch in its own process "
                                      "when it ended. A launcher that trains in another process (subprocess, "
                                      "os.system) is not followed: run perfdoctor on the training command itself"]
            elif not steps and res.child:
                # the script ran to its end and no step source ever fired: no training loop
                # (a user trial's matmul script read "no verdict rule applies to the step timings")
                v["summary"] = ("No training step was recorded: the script ran no optimizer step, backward pass, "
                                "DataLoader batch or repeated module call in this process, so nothing was measured "
                                "to diagnose: perfdoctor times the steps of a training loop.")
                v["notes"] = notes
            else:
                v["notes"] = notes + [f"no trace ({why}), and the step timings and system samples show no bottleneck"]
            continue
        cap = 0.5 if len(steps) >= 3 else 0.4
        v["confidence"] = min(v["confidence"], cap)
        v["confidence_label"] = label(v["confidence"])
        v["notes"] = notes + [f"no trace ({why}): the verdict rests on {len(steps)} measured step(s) and the "
                              f"system samples, so its confidence is capped at {cap}"]


def more_steps(reason: str | None, conclusive: bool, n: int, stopped_by: str | None, max_steps,
               late: str | None = None) -> str | None:
    """The step time's reason, with the --max-steps that would have left enough steady steps when
    --max-steps ended the run too soon (a user's --max-steps 20 left 8 after the trace, "need 10",
    and no word of what to ask for): the steps added at the end lengthen the run of undisturbed
    steps after the trace, which is the longest one then. When --duration ended it too soon, the
    `late` hint (late_start_hint) where there is one."""
    from perfdoctor.stats.steptime import MIN_STEPS
    if conclusive or n >= MIN_STEPS:
        return reason
    if stopped_by == "max-steps" and isinstance(max_steps, int) and not isinstance(max_steps, bool):
        hint = f"--max-steps {max_steps + MIN_STEPS - n} or more would leave enough"
    elif stopped_by == "duration" and late:
        hint = late
    else:
        return reason
    return f"{reason}; {hint}" if reason else hint


def late_start_hint(steps: list[dict], first_s: float | None, config: dict) -> str | None:
    """`run --duration` counts from the launch (run.json's config: duration_from "launch"), so a
    script whose first step ends late in it has few steps left (a torch.compile'd simulation's
    first step ended 24 s after its launch, and --duration 8 left it that one): the --duration that
    leaves enough, from when the first step ended and the recorded steps' pace, for the steps the
    window sets aside (warm-up, the trace's own and the one after its export) and MIN_STEPS
    steady ones, half as many again for the pace's change, and a quarter more start-up (the same
    script's first step ended 24-34 s after its launch in three runs). None without a duration, a
    first step's time or a timed step."""
    from perfdoctor.analyze.stepwait import positive
    from perfdoctor.stats.steptime import MIN_STEPS, WARMUP_MIN
    duration, first = positive(config.get("duration")), positive(first_s)
    durs = [d for d in (positive(s.get("dur")) for s in steps) if d > 0]
    launch = config.get("duration_from", "launch") == "launch"       # tune's runs count from the first step
    if not (launch and durs and 0 < duration < math.inf and 0 < first < math.inf):
        return None
    traced = int(positive(config.get("skip")) + positive(config.get("active"))) + 1 if config.get("trace") else 0
    want = math.ceil(1.25 * first + 1.5 * (WARMUP_MIN + MIN_STEPS + traced) * sum(durs) / len(durs))
    return (f"--duration counts from the launch, and the first step ended {first:.0f} s after it: "
            f"--duration {max(want, math.ceil(duration) + 1)} or more would leave enough")
