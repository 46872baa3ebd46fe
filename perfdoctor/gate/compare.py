"""`perfdoctor compare BEFORE AFTER`: two runs side by side, each change set against the noise
measured inside the two runs.

Noise:
- step time and throughput: each run's steady-state step time (perfdoctor.stats.steptime: wall
  time of the steady window / its steps); a change is "beyond noise" when the 95% CI of the
  ratio after / before (moving-block bootstrap of both windows) excludes 1. Runs of the same
  command (gate/load.py same_command) are paired by step number: the same blocks of step
  numbers resampled on both sides (stats.speedups.speedup, `by_step`), so work that repeats step
  for step (image sizes from a seeded generator) cancels. After may be an edited script: its
  step n still does step n's work when the data order is unchanged, and where it is not,
  nothing repeats and pairing leaves the interval as wide. Different commands are not paired:
  their step numbers need not mean the same work. The median and
  p90 of the same windows are listed as secondary figures, without a noise test: with a bursty
  loader most steps are short, and the median says nothing about the time per step;
- breakdown shares: the per-step breakdown of the profiled steps of each trace; a change is beyond
  noise when it exceeds 2 standard errors of the difference of the per-step means;
- without step records (a bare report file) the noise is unknown.

Runs of different commands (gate/load.py command_key) are compared all the same, and every
output says so in one line (`commands.warning`).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.diagnose.stepnotes import drift_note
from perfdoctor.gate.load import (RunData, busy_texts, command_warning, fingerprint_diff, load_run, queued_texts,
                                  same_command, settings_diff)
from perfdoctor.report.compare_text import beyond_word, compare_lines
from perfdoctor.report.labels import MIN_SHARE, bound_title, script_failure
from perfdoctor.report.values import change, value
from perfdoctor.stats.speedups import speedup

BREAKDOWN = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loading", "cpu_exec", "other")
RELATIVE = ("ms", "steps/s", "samples/s")


def compare_paths(before, after) -> dict:
    return compare_runs(load_run(before), load_run(after))


def _row(metric, unit, b, a, noise, beyond, note=""):
    change = None
    if b is not None and a is not None:
        change = (a / b - 1) if unit in RELATIVE and b else (a - b)
    return {"metric": metric, "unit": unit, "before": b, "after": a, "change": change,
            "kind": "relative" if unit in RELATIVE else "absolute",
            "noise": noise, "beyond_noise": beyond, "note": note}


def _ids(before: list, after: list, unknown_before: set, unknown_after: set) -> dict:
    """Rule ids before and after, added and removed; one a side could not evaluate (a metric it
    needs is unknown there: a run without a trace) is neither: it is in `unchecked_before` or
    `unchecked_after` (a tune trial's untraced run had read as every trace rule "gone")."""
    return {"before": before, "after": after,
            "added": [f for f in after if f not in before and f not in unknown_before],
            "removed": [f for f in before if f not in after and f not in unknown_after],
            "unchecked_before": [f for f in after if f not in before and f in unknown_before],
            "unchecked_after": [f for f in before if f not in after and f in unknown_after]}


def _title(bound, metrics: dict):
    """A run's verdict in its badge's words (None: unknown, shown as the bound is)."""
    return bound_title(bound, metrics) if isinstance(bound, str) else None


def compare_runs(b: RunData, a: RunData) -> dict:
    rows, ci = _step_rows(b, a)
    rows[2:2] = _sample_rows(rows[0], ci, b.fingerprint.get("batch_size"), a.fingerprint.get("batch_size"))
    mb, ma = b.metrics, a.metrics
    for cat in BREAKDOWN:
        key = f"breakdown.{cat}"
        vb, va = mb.get(key), ma.get(key)
        if (vb or 0.0) < MIN_SHARE and (va or 0.0) < MIN_SHARE:     # in neither run (GPU roles on a CPU run)
            continue
        eb, ea = _per_step_shares(b, cat), _per_step_shares(a, cat)
        noise, beyond = None, None
        if vb is not None and va is not None and len(eb) >= 2 and len(ea) >= 2:
            se = float(np.sqrt(eb.var(ddof=1) / len(eb) + ea.var(ddof=1) / len(ea)))
            # within-run noise of the profiled steps alone (a rerun of one setting can differ more):
            # the step counts say how few it rests on
            noise = f"±{200 * se:.1f} pts ({len(eb)}/{len(ea)} traced steps)"
            beyond = abs(va - vb) > 2 * se and abs(va - vb) >= 0.005
        rows.append(_row(key, "share", vb, va, noise, beyond))
    fb, fa = b.fix_ids, a.fix_ids
    diffs, unknown = fingerprint_diff(b.fingerprint, a.fingerprint)
    differ, warning = command_warning([b], a, ("before", "after"))
    busy = busy_texts([("before", b), ("after", a)])
    queued = [] if busy else queued_texts([("before", b), ("after", a)])
    return {"before": b.label, "after": a.label, "rows": rows,
            "verdict": {"before": b.verdict, "after": a.verdict, "changed": b.verdict != a.verdict},
            # as the reports' badges say it: a CPU-only run's "device" is COMPUTE-BOUND (CPU), not a GPU
            "verdict_titles": {"before": _title(b.verdict, mb), "after": _title(a.verdict, ma)},
            "findings": _ids(fb, fa, b.unevaluated, a.unevaluated),
            "flags": _ids(list(b.flags), list(a.flags), b.unevaluated, a.unevaluated),
            "environment": {"before": b.fingerprint, "after": a.fingerprint, "differs": diffs, "unknown": unknown},
            "settings_differ": settings_diff(b, a),
            "notes": [n for n in (b.read_note, a.read_note, b.schema_note, a.schema_note) if n]
            + [f"{side}: the script {e}: its steps cover the run up to that failure"
               for side, r in (("before", b), ("after", a)) if (e := script_failure(r.doc.get("run")))]
            + ([f"the machine was busy with other work ({'; '.join(busy)} used by other processes): the step times "
                "carry that load (gate calls such runs inconclusive)"] if busy else [])
            + ([f"{'; '.join(queued)}: that step time carries the wait, and the change with it; compare runs on a "
                "quiet machine"] if queued else [])
            + _drift_notes(b, a),
            "machine_shared": bool(busy or queued),
            "step_noise": _step_noise(rows[0]),
            "commands": {"before": b.command, "after": a.command, "differ": differ, "warning": warning}}


def _drift_notes(b: RunData, a: RunData) -> list[str]:
    """A side whose steady steps' length drifts through its run, as its report says it (a user
    trial: an RL loop's episodes grew 3.6x through a 30 s run; compare read +20.6% "beyond noise"
    without a word): its step time depends on how long the run was."""
    out = []
    for side, r in (("before", b), ("after", a)):
        est = r.steady if r.steps else None
        if est is not None and est.n:
            out += [f"{side}: {n}" for n in drift_note(est.window(r.steps))]
    return out


STEP_NOISE = ("one run on each side: the step time's interval is the noise within each run, and two runs of "
              "one command can differ by more; to weigh that, run the baseline 3 times and `perfdoctor gate "
              "AFTER -b RUN1 -b RUN2 -b RUN3`")


def _step_noise(step_row: dict) -> str | None:
    """What the step time's interval leaves out, where there is one: the spread between runs (a
    user trial: fused AdamW read +21.9%, "beyond noise", where interleaved plain runs measured
    0.90x and 1.005x, and two runs of the unchanged script differed by 6%)."""
    return STEP_NOISE if step_row["beyond_noise"] is not None else None


def _step_rows(b: RunData, a: RunData) -> tuple[list[dict], tuple[float, float] | None]:
    """step time (the estimator, with the CI of the ratio), throughput, then median and p90 of the
    same steady windows as secondary figures; and the step time's interval (after / before). Without
    step records: the reports' numbers, noise unknown."""
    sb, sa, ci = b.steady, a.steady, None
    ms = (lambda x: None if x is None else 1e3 * x)
    if sb is not None and sa is not None and sb.n >= 3 and sa.n >= 3:
        faster, (lo, hi) = speedup(sb, sa, by_step=same_command(b, a))      # before / after
        r_lo, r_hi = ci = 1 / hi, 1 / lo                   # after / before
        noise, beyond = f"CI95 {r_lo:.2f}-{r_hi:.2f}x", r_lo > 1 or r_hi < 1
        rate_noise = f"CI95 {lo:.2f}-{hi:.2f}x"            # throughput after / before: the inverse ratio
        note = f"steady steps {sb.n} / {sa.n}"
        if not (sb.conclusive and sa.conclusive):
            beyond = None
            note += "; too short to tell: " + "; ".join(x.reason for x in (sb, sa) if x.reason)
        vals = {"step": (sb.step_s, sa.step_s), "median": (sb.median_s, sa.median_s), "p90": (sb.p90_s, sa.p90_s)}
    else:
        noise, beyond, note = None, None, "no step records: noise unknown"
        rate_noise = None
        pick = (lambda r, *keys: next((r.time_ms(k) / 1e3 for k in keys if r.time_ms(k) is not None), None))
        traced = [r.label for r in (b, a) if r.time_ms("run.step_time_ms") is None
                  and r.time_ms("steps.time_mean_ms") is not None]
        if traced:
            note += f"; {' and '.join(traced)}: the traced steps' mean (the profiler slows them)"
        vals = {"step": (pick(b, "run.step_time_ms", "steps.time_mean_ms"), pick(a, "run.step_time_ms", "steps.time_mean_ms")),
                "median": (pick(b, "run.step_time_median_ms", "steps.time_median_ms"),
                           pick(a, "run.step_time_median_ms", "steps.time_median_ms")),
                "p90": (pick(b, "run.step_time_p90_ms", "steps.time_p90_ms"), pick(a, "run.step_time_p90_ms", "steps.time_p90_ms"))}
    (tb, ta), secondary = vals["step"], "secondary figure (not the time per step with a bursty loader)"
    return ([_row("step time", "ms", ms(tb), ms(ta), noise, beyond, note),
             _row("throughput", "steps/s", 1 / tb if tb else None, 1 / ta if ta else None, rate_noise, beyond,
                  "1 / step time"),
             _row("step time median", "ms", ms(vals["median"][0]), ms(vals["median"][1]), None, None, secondary),
             _row("step time p90", "ms", ms(vals["p90"][0]), ms(vals["p90"][1]), None, None, secondary)], ci)


def _sample_rows(step: dict, ci: tuple[float, float] | None, bs_b, bs_a) -> list[dict]:
    """Samples per second, where the runs' batch sizes are known and differ: a step of a larger
    batch is longer and still faster per sample (a user trial of a DDP job at batch 32 and 64 read
    step time +15.8%, throughput -13.7% "beyond noise", where samples per second rose 1.73x). Its
    interval is the step time's (`ci`: after / before), scaled by the batch sizes' ratio."""
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (bs_b, bs_a)) or bs_b == bs_a:
        return []
    tb, ta = step["before"], step["after"]
    if not tb or not ta:
        return []
    scale, noise, beyond = bs_a / bs_b, None, step["beyond_noise"]
    if ci is not None:
        lo, hi = scale / ci[1], scale / ci[0]             # samples per second after / before
        noise = f"CI95 {lo:.2f}-{hi:.2f}x"
        beyond = None if beyond is None else (lo > 1 or hi < 1)
    return [_row("samples/s", "samples/s", 1e3 * bs_b / tb, 1e3 * bs_a / ta, noise, beyond,
                 f"batch {bs_b} -> {bs_a}: batch size / step time")]


def _per_step_shares(r: RunData, cat: str) -> np.ndarray:
    steps = ((r.doc.get("traces") or [{}])[0].get("steps")) or []
    out = []
    for s in steps:
        bd, d = s.get("breakdown_ms") or {}, s.get("duration_ms")
        if d and bd.get(cat) is not None:
            out.append(bd[cat] / d)
    return np.array(out, dtype=float)


def render_compare(doc: dict, console=None) -> None:
    from rich.table import Table

    from perfdoctor.report import sanitize
    from perfdoctor.report.sanitize import text

    c = console or sanitize.console()
    t = Table(title=text(f"perfdoctor compare: {doc['before']} -> {doc['after']}"), title_justify="left")
    for col in ("metric", "before", "after", "change", "noise", "beyond noise"):
        t.add_column(col, no_wrap=col in ("metric", "change"))
    for r in doc["rows"]:
        beyond = {True: text("yes", "bold"), False: "no", None: "unknown"}[r["beyond_noise"]]
        if shared := beyond_word(doc, r):
            beyond = text(shared, "bold")
        noise = r["noise"] or "unknown"
        if r["note"].startswith("secondary"):
            noise, beyond = "secondary figure", ""
        t.add_row(text(r["metric"]), value(r["before"], r["unit"]), value(r["after"], r["unit"]), change(r),
                  text(noise), beyond)
    v, titles = doc["verdict"], doc.get("verdict_titles") or {}
    t.add_row("verdict", text(titles.get("before") or v["before"]), text(titles.get("after") or v["after"]),
              "changed" if v["changed"] else "", "", "")
    c.print(t)
    for kind, line in compare_lines(doc):
        c.print(text(line, "yellow") if kind in ("environment", "warning") else text(line))
