"""How sure a verdict is: the margin over the runner-up, weakened where evidence is thin.

The verdict rules (rules/PD1xx) decide *what* bounds the step; this policy says how firmly.
- device-bound: 0.6 at the 80% line, rising to 1.0 at 90% device busy (on the CPU also 0.6 at
  the 50% line of the ops' compute, their own time of 20 us or more, PD102's, rising to 1.0 at 60%);
- input / host / communication: 0.4 when the top idle cause ties the runner-up, 1.0 when it
  is at least twice the runner-up; and at most 0.4 just under the 80% device line (or the CPU's
  50% compute line), rising to 1.0 ten points under it (a verdict that a few points of device time would flip is not firm);
- capped at 0.5 for fallback steps, 0.6 for fewer than 3 steps (noted whatever marked them)
  or a truncated file, 0.5 when a live run's steady data wait and the traced one differ by 10
  points or more, 0.5 when the profiler made the traced steps twice as long as the steady ones
  or more, 0.5 when other processes took half a core or more while the trainer queued for a CPU a quarter of its time,
  0.5 when long steps every N steps hold a tenth of the time or more and the trace holds none of
  them, 0.5 when the steady steps' median is twice the traced one or more (the profiler only adds
  time: the trace saw another state of the run), and 0.4 when most of the step is untraced
  time that the Python stacks do not name, and 0.4 when device work starts before its launch
  call in over 5% of the launches (the trace's clocks disagree: analyze/launches.py).
A truncated file is judged on the steps completed before the cut (analyze/steps.py); with none,
the verdict is inconclusive and says why.
"""

from __future__ import annotations

from perfdoctor.analyze.launches import CLOCK_SHARE

CAUSES = ("input", "host", "communication")
CPU_COMPUTE = 0.5    # PD102: a CPU step whose compute (ops' own time of 20 us or more) is half of it is compute-bound
# Traced steps this many times as long as the steady ones: at least half of a traced step is the
# profiler's own per-op cost (tiny ops: a 1 ms CPU step traced at 6.6 ms), so its shares are not
# the un-profiled step's.
SKEWED = 2.0         # traced steps' mean over their median: one step far longer than the others
PROFILED_MUCH_SLOWER = 2.0
# Another job's load that makes the shares the machine's, not the job's: half a core of other
# processes (quiet.py's bar for timing tests too) while the trainer queues for a CPU a quarter of
# its time (PD214 flags a tenth; a quarter moves every share of the step).
SHARED_CORES = 0.5
SHARED_RUNQ = 0.25
QUEUED_WORK = 0.05   # below this run-queue share the training thread had a CPU whenever it wanted one
# Long steps every N steps (analyze/longsteps.py) holding this share of the steady time, none of
# them traced: PD218's line, where the usual step's breakdown leaves out more than its own error.
LONG_STEPS = 0.1
TUNE_MEASURES = "; `perfdoctor tune` measures it"    # dropped where tune would time no training (childtrainers)


def median_is_cut(m: dict) -> bool:
    """The traced steps' median is the length of a step the memory budget cut short: the trace
    stopped inside its last step (trace.cut_s) and fewer than 3 were traced, so that step sets
    the median; its length is no step's (its shares hold)."""
    return m.get("trace.cut_s") is not None and (m.get("steps.count") or 0) < 3


def confidence(bound: str, m: dict) -> tuple[float, list[str], list[str]]:
    """(confidence 0..1, notes explaining reductions, secondary causes >= 5% of the step)."""
    sh = {c: m.get(f"share.{c}") or 0.0 for c in ("device",) + CAUSES}
    cause = "input" if bound.startswith("input") else bound
    steady = _steady_wait(m)
    rest = 1.0          # what the trace's shares of the step are scaled by (the steady wait's verdict)
    if cause == "input" and isinstance(steady, (int, float)) and steady >= 0.5 and steady - sh["input"] >= 0.1 \
            and sh["input"] < 1 and m.get("share.device") is not None:       # a trace to rescale
        # the verdict is the steady steps' (PD117, PD370): their wait, and the trace's split of the rest
        rest = (1 - steady) / (1 - sh["input"])
        sh = {c: steady if c == "input" else v * rest for c, v in sh.items()}
    secondary = [c for c in sorted(CAUSES, key=sh.get, reverse=True) if sh[c] >= 0.05 and c != cause]
    notes: list[str] = []
    if bound == "inconclusive":
        if m.get("trace.truncated") and m.get("steps.count") == 0:
            notes.append("the trace file was cut off before any step was complete, so no step is judged "
                         "(a step cut short shows only its first events); record the trace again")
        return 0.0, notes, []           # nothing judged: no other cause is named either
    cpu = m.get("trace.platform") == "cpu"
    # on the CPU the step is also compute-bound when its compute (ops less the small ones, mostly
    # dispatch) is half of it (PD102): the margin over either line counts
    compute = (m.get("cpu.compute_share") or 0.0) * rest if cpu else None
    if bound == "device":
        over = max(sh["device"] - 0.8, compute - CPU_COMPUTE if compute is not None else -1.0)
        conf = 0.6 + 0.4 * min(1.0, max(0.0, over) / 0.1)
    else:
        others = [sh[c] for c in CAUSES if c != cause]
        top, runner = sh.get(cause, 0.0), max(others)
        margin = (top - runner) / top if top > 0 else 0.0
        conf = 0.4 + 0.6 * min(1.0, margin / 0.5)
        # the other side of the device line: 0.4 just under 80% busy, firm from 70% down, as a
        # device-bound verdict is 0.6 at the line and firm at 90%
        under = 0.8 - sh["device"]
        closer = compute is not None and CPU_COMPUTE - compute < under
        if closer:
            under = CPU_COMPUTE - compute
        near = 0.4 + 0.6 * min(1.0, max(0.0, under) / 0.1)
        if near < conf:
            conf = near
            # at or over the line (a verdict that comes before the device's, as PD115's or PD117's)
            line, share = (CPU_COMPUTE, compute) if closer else (0.8, sh["device"])
            what = ("CPU ops' compute (their own time, 20 us or more an op) takes" if closer
                    else "CPU ops run" if cpu else "device runs")
            where = f"near the {line:.0%}" if under > 0 else f"at or over the {line:.0%}"
            notes.append(f"the {what} {share:.0%} of the step, {where} "
                         f"that would make the step {'compute-bound' if cpu else 'device-bound'}")
    if m.get("steps.source") != "ProfilerStep":
        conf = min(conf, 0.5)
        if m.get("steps.source"):         # without a trace, the run's own note says so
            notes.append(f"steps come from {m.get('steps.source')}, not ProfilerStep annotations")
    # fallback steps are thin evidence too, and say so; a whole trace is one "step" however many
    # iterations it holds, so its count says nothing of what was recorded (the source note does)
    # no trace at all (steps.count unknown): the run's own note says so, and caps the confidence
    if m.get("steps.count") is not None and m["steps.count"] < 3 and m.get("steps.source") != "whole trace":
        conf = min(conf, 0.6)
        notes.append(f"only {m.get('steps.count')} step(s) traced; record 3 or more for a firm verdict")
    if (m.get("trace.clock_early_share") or 0.0) > CLOCK_SHARE:
        conf = min(conf, 0.4)
        notes.append("the trace's host and device clocks disagree (its warning says how far): confidence capped")
    if m.get("trace.truncated"):
        conf = min(conf, 0.6)
        notes.append("the trace file was truncated; the verdict uses the steps completed before the cut")
    inflation, queued = m.get("run.trace_inflation"), m.get("run.traced_runq_share")
    contended = isinstance(queued, (int, float)) and queued >= SHARED_RUNQ    # the trace shared the cores
    # the same quantity both ways: host time inside DataLoader __next__, overlapped or not
    mean_t, med_t, med_s = m.get("steps.time_mean_ms"), m.get("steps.time_median_ms"), m.get("run.step_time_median_ms")
    # traced steps far shorter than the steady ones: the profiler only adds time, so the trace
    # caught the run in another state (below), which is then why their waits differ too (a user's
    # loader that slowed after batch 30, past the trace: "the profiler changes the pace" had read
    # beside traced steps 18x shorter)
    # (steps of two kinds in turn: a median is one kind's, and the traced few hold either)
    two_kinds = m.get("run.step_kinds") == 2
    # (an LBFGS step of 22 s, cut at 9.7 s, had read "the trace caught the run in another state"
    # under the note that the step was cut: median_is_cut)
    shorter = all(isinstance(x, (int, float)) and x > 0 for x in (med_t, med_s)) \
        and med_s >= PROFILED_MUCH_SLOWER * med_t and not two_kinds and not median_is_cut(m)
    steady_wait, traced_wait = m.get("run.data_wait_share"), m.get("input.data_wait_host_share")
    if steady_wait is not None and traced_wait is not None and abs(steady_wait - traced_wait) >= 0.1:
        conf = min(conf, 0.5)
        why = ("the trace caught the run in another state (the next note), so the input share of most of the run "
               "differs from the trace's" if shorter else
               f"the profiler{' (and here other work on the cores)' if contended else ''} changes the pace of the "
               "step's own work, so the input share of the un-profiled run differs from the trace's")
        notes.append(f"the steady steps waited for batches {steady_wait:.0%} of their time, the traced ones "
                     f"{traced_wait:.0%}: {why}")
    # one long step among the few traced ones (an evaluation, a save) pulls their mean far above
    # their median: that, not the profiler's cost per op, which every traced step pays, is the gap
    skewed = all(isinstance(x, (int, float)) and x > 0 for x in (mean_t, med_t, med_s)) and mean_t >= SKEWED * med_t \
        and not two_kinds
    skew_told = isinstance(inflation, (int, float)) and inflation >= PROFILED_MUCH_SLOWER and skewed
    if skew_told:
        conf = min(conf, 0.5)
        profiled = (f"; the profiler's cost per op also makes the typical traced step {med_t / med_s:.1f}x the "
                    "steady one's" if med_t / med_s >= PROFILED_MUCH_SLOWER else "")
        head = (f"a long step fell in the traced window: the traced steps' mean is {mean_t:.3g} ms against their "
                f"median {med_t:.3g} ms (steady steps: {m.get('run.step_time_ms') or 0:.3g} ms, median "
                f"{med_s:.3g} ms)")
        if contended:
            # the trace queued for a CPU: the long step may be that wait, not the script's work (a
            # GAN on a shared 2-core VM: traced mean 223 ms, median 25.7 ms, the trace queued 47%;
            # its loop has no evaluation, no checkpoint, and had been told it had one)
            notes.append(head + f", and the training thread waited for a CPU {queued:.0%} of their time: other work "
                         "took the cores during the trace, so the long step may be that wait rather than the "
                         "script's own work (an evaluation, a checkpoint, a log every N steps); either way it weighs "
                         "on the breakdown far more than on the run" + profiled + "; rerun on a quiet machine")
        else:
            notes.append(head + ". It (an evaluation, a checkpoint, a log every N steps) weighs on the breakdown "
                         "far more than on the run" + profiled)
    elif isinstance(inflation, (int, float)) and inflation >= PROFILED_MUCH_SLOWER:
        conf = min(conf, 0.5)
        times = f"({m.get('steps.time_mean_ms') or 0:.3g} vs {m.get('run.step_time_ms') or 0:.3g} ms)"
        if contended:
            # the training thread queued for a CPU through much of the trace: other work took the
            # cores then (a neighbour's burst), and the trace's op times hold that wait
            notes.append(f"the traced steps ran {inflation:.1f}x as long as the steady ones {times}, and the "
                         f"training thread waited for a CPU {queued:.0%} of their time: other work took the cores "
                         "during the trace, so its milliseconds and shares are not the un-profiled step's (its ops "
                         "hold that wait); rerun on a quiet machine")
        else:
            notes.append(f"the profiler made the traced steps {inflation:.1f}x as long as the steady ones {times}: "
                         "most of a traced step is the profiler's own cost per op, so its milliseconds and shares "
                         "are not the un-profiled step's (they lean towards host time)")
    if shorter:
        # the profiler only adds time: traced steps far shorter than the steady ones ran in another
        # state of the run (a tiny GPT-2 on a busy 2-core VM: 432 ms traced, 2232 ms steady, the
        # same work a step, the machine's load flipping between two paces)
        conf = min(conf, 0.5)
        from perfdoctor.stats.steptime import ms
        head = (f"the traced steps took {ms(med_t)} ms (median) and the steady ones {ms(med_s)} ms, "
                f"{med_s / med_t:.1f}x as long, though the profiler only adds time: the trace caught the run ")
        steps, runq = m.get("run.steps"), m.get("run.runq_share")
        queues = isinstance(queued, (int, float)) and isinstance(runq, (int, float))   # both measured
        if queues and max(queued, runq) < QUEUED_WORK and isinstance(steps, int) and steps >= 20:
            # neither the traced steps nor the steady ones queued for a CPU: the machine did not
            # change, the steps' work did (a user's RL loop: episodes that grow as the policy
            # learns, traced at steps 7-12 of 335; "rerun on a quiet machine" would trace the same)
            notes.append(head + "in another state: neither the traced steps nor the steady ones waited for a CPU, so "
                         "the steps' work changed (as where episodes or sequences grow through a run), and its "
                         "breakdown and shares describe the early steps only; trace later in the run: "
                         f"--skip-steps {steps // 2} (half of its {steps} steps)")
        elif queues and queued < QUEUED_WORK and runq >= SHARED_RUNQ:
            # the steady steps queued for a CPU and the traced ones did not: work came after the
            # trace (a user's GPT-2: 458 ms traced, 6.5 s steady once a neighbour took a core and
            # torch's two threads waited for each other), and the trace is the job without it
            notes.append(head + f"before other work took the cores: the steady steps waited for a CPU {runq:.0%} of "
                         f"their time, the traced ones {queued:.0%}, so its breakdown and shares describe the job "
                         "without that load; the step time is the run's with it")
        else:
            notes.append(head + "in another state (other work on the machine came or went, or the steps' work "
                         "changed), so its breakdown and shares may not describe most of the run; rerun, on a quiet "
                         "machine if it is shared")
    # another job took cores and the training thread queued for them: the shares describe this
    # run on a shared machine, not the job alone (its own threads queueing it are the job's)
    other, runq = m.get("system.other_cores"), m.get("run.runq_share")
    if isinstance(other, (int, float)) and isinstance(runq, (int, float)) and other >= SHARED_CORES \
            and runq >= SHARED_RUNQ:
        conf = min(conf, 0.5)
        threads = m.get("machine.torch_threads")
        notes.append(f"other processes kept {other:.1f} cores busy and the training thread waited for a CPU "
                     f"{runq:.0%} of its steady time: the shares are of a shared machine; rerun on a quiet one "
                     "to judge the job alone"
                     # an op split over threads waits for a parked one: its time is not the op's work
                     + (f"; its ops split over {threads:.0f} threads and wait for any the scheduler parks, so "
                        "fewer threads can be many times faster here (PD348" + TUNE_MEASURES + ")"
                        if isinstance(threads, (int, float)) and threads > 1 else ""))
    long_share, traced_long = m.get("loop.long_steps_share"), m.get("loop.long_steps_traced")
    every, traced_n = m.get("loop.long_steps_every"), m.get("steps.count")
    periodic = isinstance(long_share, (int, float)) and long_share >= LONG_STEPS and isinstance(every, (int, float))
    if periodic and traced_long == 0:
        # work every N steps the profiled window missed: the breakdown is the usual step's only
        conf = min(conf, 0.5)
        notes.append(f"the traced steps are all usual ones: one step in {every:.0f} "
                     f"takes {m.get('loop.long_step_ms') or 0:.3g} ms (the usual step {m.get('loop.usual_step_ms') or 0:.3g}"
                     f" ms) and those long steps hold {long_share:.0%} of the steady time, which the breakdown and "
                     "the verdict do not describe (PD218" + ("; the Python stacks below cover them)"
                                                            if m.get("stacks.steady_steps") else ")"))
    elif periodic and isinstance(traced_long, int) and traced_long > 0 and isinstance(traced_n, int) and traced_n > 0 \
            and traced_long / traced_n >= 2 / every and not skew_told:
        # the trace holds them more often than the run does: its breakdown over-weights their work
        conf = min(conf, 0.5)
        notes.append(f"{traced_long} of the {traced_n} traced steps are long ones, where the run has one in "
                     f"{every:.0f}: the breakdown weighs their work {traced_long * every / traced_n:.1f}x as much as "
                     "the run does (PD218)")
    elif every is None and not skew_told and not two_kinds and (over := _window_overweight(m)) is not None:
        # the run's long steps too few to show a period (2 evaluations in a steady window of 20
        # steps): their time, not their rate, says how much more the window holds of them
        conf = min(conf, 0.5)
        window, run, odds = over
        notes.append(f"a long step fell in the traced window: the traced steps' time beyond their median is "
                     f"{window:.0%} of the trace, the run's long steps hold {run:.0%} of its steady time beyond "
                     f"the usual step: the breakdown weighs their work about {odds:.1f}x as much as the run does")
    if bound == "host" and m.get("trace.profiler_options") and m.get("run.trace_inflation") is None:
        # a trace alone (a run measures what its own trace costs its steps: run.trace_inflation)
        opts = str(m["trace.profiler_options"])
        one = "," not in opts
        notes.append(f"the trace was recorded with {opts}, which add{'s' if one else ''} the profiler's own "
                     "work to every op on the host: part of this host time may be the profiler's; record the next "
                     f"trace without {'it' if one else 'them'} to confirm (PD319)")
    if m.get("trace.untraced_device"):
        # no device activity and no runtime call, yet a device listed: recorded without it
        conf = min(conf, 0.5)
        notes.append(f"the trace lists a device ({m['trace.untraced_device']}) but holds none of its activity and "
                     "no runtime call: it was recorded without the device's activity (torch.profiler without "
                     "ProfilerActivity.CUDA), so whether these ops ran on it, and copied to it, is unknown; read "
                     "as a CPU-only run. Record with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    # untraced time the stacks name is evidence, not a gap: the loop's wait on its own producers, its
    # blocking on its own line, its Python data work (PD370's verdict rests on the first; 84% waiting
    # read "low confidence, 0.40"); so is the untraced time the run timed (untraced.unnamed_share
    # leaves out the conversions of Python lists: 69% of a step)
    named = sum(m.get(f"stacks.{k}_share") or 0 for k in ("producer_wait", "waiting", "python_data"))
    unnamed = m.get("untraced.unnamed_share")
    if ((m.get("breakdown.other") if unnamed is None else unnamed) or 0) - named > 0.5:
        conf = min(conf, 0.4)
        notes.append("most of the step is untraced host time (Python outside ops, compilation, waits); "
                     + ("the Python stacks below name it" if m.get("stacks.steady_steps")
                        else "Python stacks name it (`perfdoctor run --stacks`)"))
    return round(conf, 2), notes, secondary


def label(conf: float) -> str:
    return "high" if conf >= 0.75 else "medium" if conf >= 0.5 else "low"


def _window_overweight(m: dict) -> tuple[float, float, float] | None:
    """(window's long-step share, the run's, their odds ratio) where the traced window holds the
    run's long steps (loop.long_steps_any_share) at least twice as often as the run does. The
    window's share is the traced steps' time beyond their median step, (mean - median) / mean; the
    odds ratio, (w / (1 - w)) / (r / (1 - r)), is the ratio of the rates (long steps per usual
    step) where a long step's excess and a usual step cost the same in both: 2, as for a period
    (an evaluation every 10 steps, 1 of 5 traced). None below LONG_STEPS of the window."""
    mean_t, med_t, run = m.get("steps.time_mean_ms"), m.get("steps.time_median_ms"), m.get("loop.long_steps_any_share")
    if not all(isinstance(x, (int, float)) for x in (mean_t, med_t, run)) or mean_t <= 0 or not 0 < run < 1:
        return None
    window = max(0.0, (mean_t - med_t) / mean_t)
    if window < LONG_STEPS or window >= 1:
        return None
    odds = (window / (1 - window)) / (run / (1 - run))
    return (window, run, odds) if odds >= 2 else None


def _steady_wait(m: dict) -> float | None:
    """The steady steps' wait for their batches: in DataLoader fetches (the step records), or on
    the loop's own producers (the Python stacks; on a GPU only what the device spends idle,
    PD370's line), whichever is larger; None when neither was measured."""
    loader, own = m.get("run.data_wait_share"), m.get("stacks.producer_wait_exposed_share")
    waits = [w for w in (loader, own) if isinstance(w, (int, float))]
    return max(waits) if waits else None
