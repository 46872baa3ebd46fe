"""Checkpoint saves, logging calls and optimizer steps as shares of the steady steps.

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

calls.optimizer_share: the time inside optimizer.step() (collect/optclock.py; steps.jsonl `opt`),
un-profiled: the trace's optimizer.step_share pays the profiler's per-op cost, which a for-loop
optimizer's many small ops pay the most.
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import positive, timed_steps

NAMES = ("calls.save_share", "calls.save_interval_steps", "calls.log_share", "calls.optimizer_share",
         "save.share", "save.interval_steps", "logging.share", "evaluation.share")


def call_metrics(steady: list[dict], timed: bool, optimizer_timed: bool = False) -> dict:
    """calls.* over the steady steps; None unless the run timed the calls (`timed`,
    `optimizer_timed`: child.json says so; a run directory from an older perfdoctor has no
    `save`/`log`/`opt` fields). calls.optimizer_share: optimizer.step() (collect/optclock.py)."""
    out = dict.fromkeys(NAMES[:4])
    recs, total = timed_steps(steady)
    if optimizer_timed and total > 0:
        out["calls.optimizer_share"] = min(1.0, sum(positive(s.get("opt")) for s in recs) / total)
    if not timed or total <= 0:
        return out
    save = [positive(s.get("save")) for s in recs]
    out["calls.save_share"] = min(1.0, sum(save) / total)
    out["calls.log_share"] = min(1.0, sum(positive(s.get("log")) for s in recs) / total)
    saves = sum(1 for x in save if x > 0)
    out["calls.save_interval_steps"] = len(recs) / saves if saves else None
    return out


def combined(m: dict) -> dict:
    """save.share, save.interval_steps, logging.share from the calls.* and stacks.* metrics in m;
    evaluation.share from the extra-batch steps, the stacks' evaluation frames and the trace's
    no-grad forward after the backward pass (analyze/evalforward.py)."""
    save = [(m.get(share), m.get(interval)) for share, interval in
            (("calls.save_share", "calls.save_interval_steps"),
             ("stacks.checkpoint_share", "stacks.checkpoint_interval_steps")) if m.get(share) is not None]
    best = max(save, key=lambda x: x[0], default=(None, None))
    logs = [m[k] for k in ("calls.log_share", "stacks.logging_sync_share") if m.get(k) is not None]
    evals = [m[k] for k in ("loop.extra_batches_excess_share", "stacks.evaluation_share",
                            "evaluation.nograd_forward_share") if m.get(k) is not None]
    return {"save.share": best[0], "save.interval_steps": best[1] if best[0] else None,
            "logging.share": max(logs) if logs else None, "evaluation.share": max(evals) if evals else None}
