"""Which system samples the sampled means cover: the run's steps, and each phase of them.

A run's samples start with the interpreter, the imports and the model build, and end with the
teardown: a GPU that the steps kept 99% busy averages 41% over the whole process. So the sampled
means (gpu.util_mean, system.cpu_busy_share, loader.*_cpu_mean, the input split...) are taken
over the samples between the first and the last step end (steps.jsonl's `end` and the samples'
`unix` are both wall-clock seconds). The same means are also given per phase of the steps:

  warmup   from the first step end to the start of the first profiled step;
  traced   the profiled steps (torch.profiler's window: its own cost is in them);
  steady   from the end of the last profiled step to the last step end
(a sample on a boundary belongs to the earlier phase: it measured the interval before it).

Without profiled steps there is one phase, steady, the whole steps window. A phase shorter than
two samples has no means (None): the trace window of a fast script often lasts less than one
sampling interval. When the steps window holds fewer than MIN_WINDOW_SAMPLES samples (a run of
a second or two, or a script with fewer than two steps), the whole run's samples are used, and
the window says so. Each sample's CPU and GPU percentages cover the interval before it, so the
first sample of a window reaches up to one interval (0.5 s) before the window's start.
"""

from __future__ import annotations

from typing import Callable

from perfdoctor.analyze.system import MIN_SAMPLES

MIN_WINDOW_SAMPLES = MIN_SAMPLES
PHASES = ("warmup", "traced", "steady")
# The sampled means given per phase (all of them are also registered metrics over the window).
PHASE_METRICS = ("gpu.util_mean", "gpu.memory_used_fraction_peak", "system.cpu_busy_share",
                 "system.iowait_share", "loader.trainer_cpu_mean", "loader.worker_cpu_mean",
                 "loader.worker_disk_sleep_share", "loader.threads_oversubscription")


def step_windows(steps: list[dict]) -> dict[str, tuple[float, float] | None]:
    """Wall-clock (unix seconds) windows of the steps and their phases, from steps.jsonl records."""
    ends = [(s["end"] - s.get("dur", 0.0), s["end"], bool(s.get("profiled"))) for s in steps
            if isinstance(s.get("end"), (int, float))]
    out: dict[str, tuple[float, float] | None] = dict.fromkeys(("steps", *PHASES))
    if len(ends) < 2:
        return out
    lo, hi = ends[0][1], ends[-1][1]
    out["steps"] = (lo, hi)
    prof = [(a, b) for a, b, p in ends if p]
    if not prof:
        out["steady"] = (lo, hi)
        return out
    t_start, t_end = min(a for a, _ in prof), max(b for _, b in prof)
    out["warmup"] = (lo, t_start) if t_start > lo else None
    out["traced"] = (max(lo, t_start), t_end)
    out["steady"] = (t_end, hi) if hi > t_end else None
    return out


def select(samples: list[dict], window: tuple[float, float] | None, open_start: bool = False) -> list[dict]:
    """Samples taken inside `window` (its start excluded with open_start: a sample at a phase
    boundary measured the interval before it, so it belongs to the earlier phase)."""
    if window is None:
        return []
    lo, hi = window
    return [s for s in samples if s.get("unix") is not None and (lo < s["unix"] if open_start else lo <= s["unix"])
            and s["unix"] <= hi]


def windowed_metrics(samples: list[dict], steps: list[dict], notes: list[str],
                     metrics_of: Callable[[list[dict], list[str]], dict]) -> tuple[dict, dict]:
    """(metrics over the steps window, the `sampling` section: window, counts, per-phase means).

    metrics_of(samples, notes) computes the metrics (analyze.system.system_metrics); notes gets
    its notes for the chosen window and one line saying which window that was."""
    samples = samples or []
    win = step_windows(steps)
    picked = select(samples, win["steps"])
    n_steps = len(steps)
    if len(picked) >= MIN_WINDOW_SAMPLES:
        lo, hi = win["steps"]
        used = {"window": "steps", "from_unix": round(lo, 3), "to_unix": round(hi, 3), "seconds": round(hi - lo, 3)}
        notes.append(f"sampled means (CPU, loader, GPU) over the {n_steps} steps: {len(picked)} of the "
                     f"{len(samples)} samples, those between the first and the last step end ({hi - lo:.1f} s); "
                     "per phase (warm-up, traced, steady) in the JSON run.sampling")
    else:
        picked = samples
        used = {"window": "whole run", "from_unix": None, "to_unix": None, "seconds": None}
        if samples:
            notes.append(f"sampled means (CPU, loader, GPU) over the whole run, start-up included: the steps "
                         f"window held {len(select(samples, win['steps']))} of {len(samples)} samples "
                         f"(fewer than {MIN_WINDOW_SAMPLES})")
    metrics = metrics_of(picked, notes)
    sampling = {**used, "samples": len(picked), "samples_total": len(samples), "phases": {}}
    for phase in PHASES:
        w = win[phase]
        sub = select(samples, w, open_start=phase != "warmup")
        entry = {"from_unix": round(w[0], 3) if w else None, "to_unix": round(w[1], 3) if w else None,
                 "seconds": round(w[1] - w[0], 3) if w else None, "samples": len(sub)}
        vals = metrics_of(sub, []) if len(sub) >= 2 else {}
        entry.update({k: _r(vals.get(k)) for k in PHASE_METRICS})
        sampling["phases"][phase] = entry
    whole = metrics_of(samples, []) if len(samples) >= 2 else {}
    sampling["whole_run"] = {"samples": len(samples), "loader.workers": whole.get("loader.workers"),
                             "loader.worker_runq_wait_mean": _r(whole.get("loader.worker_runq_wait_mean")),
                             **{k: _r(whole.get(k)) for k in PHASE_METRICS}}
    return metrics, sampling


def _r(v):
    return round(v, 4) if isinstance(v, float) else v
