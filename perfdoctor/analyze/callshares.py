"""Checkpoint saves, logging calls, optimizer steps and evaluations as shares of the steady steps.

Saves and logging calls come from two sources:

- calls.*: the wall time the training thread spent inside torch.save / safetensors' save_file
  and TensorBoard's SummaryWriter.add_* calls, timed per step by `perfdoctor run`
  (collect/timedcalls.py; steps.jsonl `save` and `log`). Exact, on every run, whatever the
  machine; blind to writers and loggers it does not wrap (wandb, mlflow, logging, np.save,
  torch.distributed.checkpoint) and to a `.item()` line.
- stacks.*: py-spy's sampled frames (analyze/stacks.py), which see every writer and logger
  and the user's lines that read device values, but only where py-spy could run.

Each source sees part of the cost, so the cost is at least the larger of the two: save.share and
logging.share (what the rules use) take the larger share, and save.interval_steps comes with
the share it was taken from. None where neither source measured anything.

calls.nograd_share: the training's root module (the model) called with grad mode off, timed per
step (collect/nogradcalls.py; steps.jsonl `nograd`): an evaluation that draws no DataLoader batch
(nanoGPT's estimate_loss) and leaves no trace in a window of usual steps. A no-grad call in every
step (a teacher, a target network) is no evaluation: each step's no-grad time beyond the median
step's cancels it, and only a step whose excess is at least SIGNIFICANT of the usual step counts
(the jitter of a teacher's time is not an evaluation). The calls are timed with the time between
two in a row (get_batch, loss.item(), where a GPU's queued work is waited for); the work before
the first and after the last is not, so this is a lower bound of the evaluation's cost. None
where the run did not time the calls, and for loops that do not train (every step of an
inference loop is a no-grad call; nothing evaluates inside).

calls.optimizer_share: the time inside optimizer.step() (collect/optclock.py; steps.jsonl `opt`),
un-profiled: the trace's optimizer.step_share pays the profiler's per-op cost, which a for-loop
optimizer's many small ops pay the most.

evaluation.nograd_run_share: the trace's no-grad evaluation share, taken from the traced window
to the run. evaluation.nograd_forward_share (analyze/evalforward.py) is a share of the traced
steps. An
evaluation every P steps that falls inside a window of 5 traced steps is 1 in 5 there, 1 in P
in the run: the window's share overstates it (a 2-rank DDP run evaluating every 10 steps read
88% where its steady steps put it at 80%). The run's long-step analysis (analyze/longsteps.py)
knows what the window cannot: the long steps recur every loop.long_steps_every steps and cost
loop.long_steps_share of the run's steady wall time beyond as many usual steps, measured on the
run's own un-profiled steps.

The trace says which part of its no-grad stretch only its long steps hold
(evaluation.nograd_long_steps_share: beyond the no-grad time of the median step, which a teacher
or an evaluation in every step puts in each step) and which fraction of those steps' time
beyond the median step that part is (evaluation.nograd_long_steps_fraction: 1 when the long
steps are the evaluation, less when a checkpoint or a log shares them). So, where the run saw
long traced steps (loop.long_steps_traced >= 1) and measured their share:

    evaluation.nograd_run_share = (nograd_forward_share - nograd_long_steps_share)
                                  + nograd_long_steps_fraction * loop.long_steps_share

the every-step part at the window's rate (a teacher run before the training forward, in every
step: its share is the same in any window), plus the long steps' part at the run's. The
long-step part is taken on the run's clock rather than scaled by the window's step count
(s_w/(kP) against (1 - s_w)/N): the profiler slows a small training step's many short ops far
more than an evaluation's large ones (a CPU MLP: usual step 2.8 ms traced, 1.3 ms un-profiled),
so the trace's usual step is no measure of the run's; within the trace, the evaluation and the
long step it lengthens are timed on the same clock.

Where the run's long steps show no period (a steady window of 20 steps with an evaluation every
10 holds 2, too few to show one), loop.long_steps_any_share, every long step's time beyond the
median step, stands in for loop.long_steps_share: an evaluation only the trace's long steps hold
costs the run no more than all its long steps do (HF Trainer, eval_steps=10, 39 steps: 43% in the
window, 22% in the run by the steps that drew the evaluation's batches). Capped at the window's
share: a fallback that never raises it.

Otherwise the window's share stands: no long step traced, none measured in the run, or a trace
whose long steps hold no more no-grad work than the others (a teacher every step beside a
checkpoint every N steps: nograd_long_steps_share 0, so nothing is rescaled). None where the
trace measured no no-grad share. Under a run that timed the model's own no-grad calls
(calls.nograd_share known), the every-step part is the step's own work (an RL rollout, a
teacher) and counts nothing: only the long steps' part does.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import median
from perfdoctor.analyze.stepwait import positive, timed_steps

SIGNIFICANT = 0.5   # a step's no-grad time beyond the median step's, as a share of the usual step, to count
TRAINING = ("optimizer", "backward")    # steps.jsonl modes of a training step

NAMES = ("calls.save_share", "calls.save_interval_steps", "calls.log_share", "calls.optimizer_share",
         "calls.nograd_share", "calls.gc_share", "calls.convert_share", "calls.pre_forward_share",
         "calls.convert_traced_share", "calls.pre_forward_typical_share", "gc.share",
         "save.share", "save.interval_steps", "logging.share", "evaluation.share", "evaluation.nograd_run_share")


def call_metrics(steady: list[dict], timed: bool, optimizer_timed: bool = False, nograd_timed: bool = False,
                 convert_timed: bool = False, pre_timed: bool = False, profiled: list[dict] = ()) -> dict:
    """calls.* over the steady steps; None unless the run timed the calls (`timed`,
    `optimizer_timed`, `nograd_timed`: child.json says so; a run directory from an older
    perfdoctor has no `save`/`log`/`opt`/`nograd` fields). calls.optimizer_share: optimizer.step()
    (collect/optclock.py); calls.nograd_share: the model's no-grad calls (nograd_share);
    calls.gc_share: gc.collect() (`gc`, timed since this field came: 0 in older run directories);
    calls.convert_share: torch.tensor / as_tensor on Python lists (`conv`, where `convert_timed`);
    calls.pre_forward_share: from each step's start and each optimizer step's end to the model's next
    training call, less the data wait (`pre`, where the model's calls were watched: `pre_timed`; older runs had none);
    calls.convert_traced_share: the conversions in the `profiled` steps (_traced_convert_share);
    calls.pre_forward_typical_share: the median steady step's `pre` over its time."""
    out = dict.fromkeys(NAMES[:10]) | _traced_convert_share(profiled, convert_timed)
    recs, total = timed_steps(steady)
    if optimizer_timed and total > 0:
        out["calls.optimizer_share"] = min(1.0, sum(positive(s.get("opt")) for s in recs) / total)
    if nograd_timed and total > 0:
        out["calls.nograd_share"] = nograd_share(recs, total)
    if pre_timed and total > 0:
        out["calls.pre_forward_share"] = min(1.0, sum(positive(s.get("pre")) for s in recs) / total)
        # the median step's: a batch is made every step, where an export or an evaluation after some
        # updates fills a few long ones (a script's own profiler: 75% of the time, the median step's 15%)
        out["calls.pre_forward_typical_share"] = median([min(1.0, positive(s.get("pre")) / s["dur"]) for s in recs])
    if not timed or total <= 0:
        return out
    save = [positive(s.get("save")) for s in recs]
    out["calls.save_share"] = min(1.0, sum(save) / total)
    out["calls.log_share"] = min(1.0, sum(positive(s.get("log")) for s in recs) / total)
    out["calls.gc_share"] = min(1.0, sum(positive(s.get("gc")) for s in recs) / total)
    if convert_timed:
        out["calls.convert_share"] = min(1.0, sum(positive(s.get("conv")) for s in recs) / total)
    out["calls.save_interval_steps"] = _save_interval(recs, save)
    return out


def _traced_convert_share(profiled: list[dict], convert_timed: bool) -> dict:
    """calls.convert_traced_share: the conversions' time in the profiled steps over those steps'
    time, the share to set against the trace's breakdown.other (the steady window's share is
    another window's: beside a busy process the two differed by more than 0.1)."""
    recs, total = timed_steps(profiled)
    share = min(1.0, sum(positive(s.get("conv")) for s in recs) / total) if convert_timed and total > 0 else None
    return {"calls.convert_traced_share": share}


def nograd_share(recs: list[dict], total: float) -> float | None:
    """The steps' no-grad time beyond the median step's, where that excess is at least SIGNIFICANT
    of the median step's time, over `total` (the steps' time); None unless they train."""
    recs = [s for s in recs if s.get("mode") in TRAINING]
    if not recs or total <= 0:
        return None
    nograd = np.array([positive(s.get("nograd")) for s in recs])
    excess = nograd - median(nograd)
    usual = float(median(np.array([s["dur"] for s in recs])))
    return min(1.0, float(excess[excess >= max(SIGNIFICANT * usual, 1e-9)].sum()) / total)


def _save_interval(recs: list[dict], save: list[float]) -> float | None:
    """Steps per save: the median gap between the numbers of the steps that saved, where two or
    more did (saves every 10 steps, 2 of them in 27 steady steps: 10, where steps over saves read
    13.5); with one save, or steps without numbers (an older run), the steps over the saves."""
    at = [s.get("step") for s, x in zip(recs, save) if x > 0]
    if len(at) >= 2 and all(isinstance(n, int) for n in at):
        return float(median(np.diff(at)))
    return len(recs) / len(at) if at else None


def combined(m: dict) -> dict:
    """save.share, save.interval_steps, logging.share, gc.share from the calls.* and stacks.* metrics in m;
    evaluation.share from the extra-batch steps, the stacks' evaluation frames, the trace's
    no-grad forward after the backward pass (analyze/evalforward.py), at the run's rate where
    evaluation.nograd_run_share has it (below), else the traced window's, and the run's timed
    no-grad calls of the model (calls.nograd_share); untraced.unnamed_share: the trace's untraced
    share less the conversions timed in its steps (the steady steps' where those were not timed)."""
    save = [(m.get(share), m.get(interval)) for share, interval in
            (("calls.save_share", "calls.save_interval_steps"),
             ("stacks.checkpoint_share", "stacks.checkpoint_interval_steps")) if m.get(share) is not None]
    best = max(save, key=lambda x: x[0], default=(None, None))
    logs = [m[k] for k in ("calls.log_share", "stacks.logging_sync_share") if m.get(k) is not None]
    nograd = m.get("evaluation.nograd_run_share")       # the run's rate, where perfdoctor run found it
    nograd = m.get("evaluation.nograd_forward_share") if nograd is None else nograd
    evals = [x for x in (m.get("loop.extra_batches_excess_share"), m.get("stacks.evaluation_share"), nograd,
                         m.get("calls.nograd_share")) if x is not None]
    collect = [m[k] for k in ("calls.gc_share", "stacks.gc_collect_share") if m.get(k) is not None]
    return {"save.share": best[0], "save.interval_steps": best[1] if best[0] else None,
            "logging.share": max(logs) if logs else None, "evaluation.share": max(evals) if evals else None,
            "gc.share": max(collect) if collect else None, "untraced.unnamed_share": _unnamed(m)}


def _unnamed(m: dict) -> float | None:
    other, traced = m.get("breakdown.other"), m.get("calls.convert_traced_share")
    named = traced if traced is not None else m.get("calls.convert_share") or 0.0
    return None if other is None else max(0.0, other - named)


def nograd_run_share(m: dict) -> dict:
    """evaluation.nograd_run_share from the trace's evaluation.nograd_* and the run's loop.long_steps_*.
    Where the run timed the model's own no-grad calls (calls.nograd_share known), the part of the
    stretch in every step is part of each step's work (an RL rollout's policy calls, a teacher, a
    target network): no evaluation that could run less often, and not counted (an RL loop's 16
    no-grad policy calls and its environment between them read "evaluate less often", 31%)."""
    window = m.get("evaluation.nograd_forward_share")
    if window is None:
        return {"evaluation.nograd_run_share": None}
    live = m.get("calls.nograd_share") is not None
    in_long, fraction = m.get("evaluation.nograd_long_steps_share"), m.get("evaluation.nograd_long_steps_fraction")
    long_share, traced = m.get("loop.long_steps_share"), m.get("loop.long_steps_traced")
    if in_long is None or fraction is None:      # no long traced step: the stretch is in every step
        return {"evaluation.nograd_run_share": 0.0 if live else window}
    every_step = 0.0 if live else max(0.0, window - in_long)
    if m.get("loop.long_steps_every") is None:
        # no period to the run's long steps (too few in the window to show one): they still
        # bound what the trace's long-step evaluation costs the run, at most the window's share
        any_share = m.get("loop.long_steps_any_share")
        if in_long > 0 and any_share:
            return {"evaluation.nograd_run_share": min(window, every_step + fraction * any_share)}
        return {"evaluation.nograd_run_share": min(window, every_step + in_long)}
    if long_share is None or not traced or traced < 1:
        return {"evaluation.nograd_run_share": min(window, every_step + in_long)}
    return {"evaluation.nograd_run_share": min(1.0, every_step + fraction * long_share)}
