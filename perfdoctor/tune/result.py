"""`perfdoctor tune`'s result: the JSON document (-o FILE) and the terminal table.

Document (docs/commands.md, the tune JSON table): baseline {step_time_s, ci95, median_s, steps, dir, verdict,
ranks, pace_rank, data_wait_share, stacks_note, repeats}, trials[] {changes, label, group, rule, bound, predicted,
step_time_s, speedup, ci95, status, reason, dir, loss, confirm, model_check}, best {changes, speedup, ci95, confirmed} or null,
apply (text), untested[] {id, title, ranked, expected, ceiling},
skipped_for_budget, budget_s, elapsed_s, run_s, noisy, noise, run_spread, closing, dir, command, only, failed
(null; when the baseline could not be tuned, {exit_code, error}, with baseline null and no trial: failed_doc).
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfdoctor import __version__
from perfdoctor.report.values import changes_label, s_as_ms
from perfdoctor.tune import modelcheck
from perfdoctor.tune.apply import apply_text
from perfdoctor.tune.session import Outcome, Tuner

SCHEMA_VERSION = 1


def _r(x, nd):
    return None if x is None else round(float(x), nd)


def _t(x):
    """A time in seconds, to 6 significant digits: 1 us steps keep the precision that 1 s ones do
    (rounding to whole microseconds left a 250 us step 3 digits, and run_spread, computed before
    rounding, could not be recomputed from the document)."""
    return None if x is None else float(f"{float(x):.6g}")


def _at(fixes: dict, t) -> dict:
    """The report's fixes, with the trial's rule's gain at the trial's setting where tune has one
    (a worker count: tune/predict.trial_gain)."""
    if not t.gain or t.rule not in fixes:
        return fixes
    return {**fixes, t.rule: {**fixes[t.rule], "gain": {**(fixes[t.rule].get("gain") or {}), **t.gain}}}


def _trial_doc(o: Outcome, fixes: dict) -> dict:
    m = o.run
    return {"changes": o.trial.changes, "label": o.trial.label, "group": o.trial.group, "rule": o.trial.rule,
            "bound": bool(o.trial.bound),
            "offered": o.offered, "predicted": _r(o.predicted, 4),
            "step_time_s": _t(m.step_s) if m and m.ok else None,      # a failed run measured nothing
            "speedup": _r(o.ratio, 4), "ci95": [_r(o.ci95[0], 4), _r(o.ci95[1], 4)] if o.ci95 else None,
            "status": o.status, "reason": o.reason, "dir": str(m.run_dir) if m else None,
            "baseline_dirs": [str(b.run_dir) for b in o.bases],
            "baseline_step_time_s": [_t(b.step_s) for b in o.bases], "loss": o.loss,
            "model_check": modelcheck.check(o.trial.rule, o.offered, o.status, o.ratio, o.ci95, _at(fixes, o.trial),
                                            modelled=o.predicted is not None),
            "confirm": ({"dir": o.confirm["dir"], "speedup": _r(o.confirm["speedup"], 4),
                         "ci95": [_r(x, 4) for x in o.confirm["ci95"]] if o.confirm["ci95"] else None,
                         "step_time_s": _t(o.confirm.get("step_time_s")),
                         "baseline_step_time_s": _t(o.confirm.get("baseline_step_time_s"))}
                        if o.confirm else None)}


def _head(t: Tuner) -> dict:
    """What every tune document starts with, tuned or not: the tool, the command, the budget."""
    return {"schema_version": SCHEMA_VERSION, "tool": f"perfdoctor {__version__}",
            "command": " ".join((["torchrun", *t.o.dist] if t.o.dist else []) + (["-m"] if t.o.module else [])
                                + list(t.o.argv)), "dir": str(t.dir),
            "budget_s": t.o.budget_s, "elapsed_s": round(t.elapsed(), 1), "run_s": round(t.run_s, 1)}


def build(t: Tuner) -> dict:
    b = t.baselines[0]
    est = b.estimate
    best = t.best()
    verdict = (t.doc.get("verdict") or {}).get("bound")
    skipped = [o for o in t.outcomes if o.status == "skipped" and o.reason == "budget"]
    return {
        **_head(t),
        "noisy": t.noisy, "noise": t.noise_text, "run_spread": _r(t.spread, 4),
        "closing": str(t.closing.run_dir) if t.closing else None,
        "baseline": {"step_time_s": _t(est.step_s), "ci95": [_t(est.ci95[0]), _t(est.ci95[1])],
                     "median_s": _t(est.median_s), "steps": est.n, "dir": str(b.run_dir), "verdict": verdict,
                     "report_dir": str(t.diagnosed) if t.diagnosed else None,
                     "ranks": b.ranks, "pace_rank": b.pace_rank,
                     "verdict_title": t.verdict_title(),
                     "data_wait_share": _r(est.wait_share, 4), "stacks_note": _stacks_note(t.doc),
                     "repeats": [{"dir": str(x.run_dir), "step_time_s": _t(x.step_s)} for x in t.baselines[1:]]},
        "trials": [_trial_doc(o, t.fixes) for o in t.outcomes],
        "best": ({"changes": best.trial.changes, "speedup": _r(best.ratio, 4),
                  "ci95": [_r(best.ci95[0], 4), _r(best.ci95[1], 4)], "step_time_s": _t(best.run.step_s),
                  "confirmed": best.confirm is not None}
                 if best else None),
        "apply": apply_text(best.trial.changes if best else {}, _inject_for(b, best), t.facts.cuda),
        "skipped_for_budget": [o.trial.label for o in skipped],
        "budget_for_all_s": t.budget_for(len(skipped)),
        "untested": untested(t),
        "only": sorted(t.o.only) if t.o.only else None,
        "failed": None,
    }


def failed_doc(t: Tuner, exc) -> dict:
    """The document of a tune whose baseline could not be tuned (the script failed, exit 1, or
    gave too few steps, exit 3): why, and no trial. A CI job that reads -o FILE finds it, as it
    would a tune's, instead of no file at all."""
    return {
        **_head(t),
        "noisy": None, "noise": None, "run_spread": None, "closing": None, "baseline": None, "trials": [],
        "best": None, "apply": None, "skipped_for_budget": [], "budget_for_all_s": None, "untested": [],
        "only": sorted(t.o.only) if t.o.only else None,
        "failed": {"exit_code": exc.exit_code, "error": str(exc)},
    }


def _stacks_note(doc: dict) -> str | None:
    """The baseline report's note that its Python stacks were not recorded (no idle core for
    py-spy): the fixes only the stacks find (a loop waiting on its own producers, logging,
    checkpoints on the step) are then missing from the untested list too, and tune says so."""
    notes = (doc.get("run") or {}).get("notes") or []
    return next((n for n in notes if isinstance(n, str) and n.startswith("Python stacks not recorded")), None)


def _inject_for(b, best) -> dict:
    """The baseline's record of the script (its own settings), with what the best trial's run
    found only by making its change: the submodules the model's own code fed float64, and the
    dtypes its float32 change converted the model from."""
    found = (best.run.inject if best and best.run else None) or {}
    extra = {k: found[k] for k in ("float32_inner", "float32_from") if found.get(k)}
    return {**b.inject, **extra} if extra else b.inject


UNTESTED_SHOWN = 5


def untested(t: Tuner) -> list[dict]:
    """The baseline report's fixes that no trial tested (a code change, or a setting the baseline
    gave no reason to try) and that have a gain to weigh (an expected gain or a ceiling): the ranked ones first, as
    the report ranks them, at most UNTESTED_SHOWN; their expected gain and ceiling as the report
    gave them, so the biggest win left is not lost."""
    tested = {r for o in t.outcomes if o.trial.rule for r in str(o.trial.rule).split("+")}
    out = []
    for fid, f in t.fixes.items():
        g = f.get("gain") or {}
        if fid in tested or f.get("kind", "fix") != "fix" or (g.get("expected") is None and g.get("ceiling") is None):
            continue                    # tested, a flag, or a fix with no gain to weigh (profile next time)
        out.append({"id": fid, "title": f.get("title"), "ranked": bool(f.get("ranked")),
                    "expected": _r(g.get("expected"), 4), "ceiling": _r(g.get("ceiling"), 4)})
    out.sort(key=lambda x: not x["ranked"])             # stable: the report's order within each
    return out[:UNTESTED_SHOWN]


def _verdict(baseline: dict) -> str:
    """The verdict's words (a tune.json older than verdict_title has the bound only)."""
    return baseline.get("verdict_title") or baseline["verdict"] or "unknown"


STATUS_CHARS = 120          # a trial's status and reason in the table, at most
MIN_WORDS = {"change": 20, "predicted": 9, "status": 12}   # the wrapping columns' least widths
WIDE = 110                  # narrower terminals get the table without its step-time columns


def emit(t: Tuner, output: Path | None, fmt: str, failed=None) -> None:
    """The finished tune's result: tune.json in its directory; -o FILE in fmt (json for the
    terminal format); on stdout the table, or markdown when there is no -o FILE (tune's progress
    lines go to stderr: `tune ... > result.txt` keeps the result, as a user expected).
    `failed`: the baseline's TuneFailed, whose one line the command prints as its error: the
    files only, then."""
    from perfdoctor.report.json_out import to_json
    from perfdoctor.report.outputs import rendered, write

    doc = build(t) if failed is None else failed_doc(t, failed)
    if t.dir.is_dir():
        (t.dir / "tune.json").write_bytes(to_json(doc))
    if output is not None:
        write(output, rendered(doc, "json" if fmt == "terminal" else fmt, kind="tune"))
    if failed is not None:
        return
    if fmt == "markdown" and output is None:
        sys.stdout.write(rendered(doc, "markdown", kind="tune").decode())
        return
    render(doc)


def render(doc: dict, console=None) -> None:
    from rich.table import Table

    from perfdoctor.report.sanitize import UNCROPPED, console as _console, text
    from perfdoctor.report.tune_labels import (budget_hint, pace_text, per_sample_note, predicted_note,
                                               tune_baselines_note, tune_best_step, tune_model_check, tune_no_best,
                                               tune_only, tune_predicted, tune_step_times)
    con = console or _console()
    b = doc["baseline"]
    con.print(text("perfdoctor tune", "bold") + text(f" {doc['command']}"))
    con.print(text(f"baseline: {s_as_ms(b['step_time_s'])}/step [{s_as_ms(b['ci95'][0])}, {s_as_ms(b['ci95'][1])}] over "
                   f"{b['steps']} steady steps{pace_text(b)}; verdict {_verdict(b)}; {doc['noise']}"))
    if doc.get("only"):
        con.print(text(tune_only(doc)))
    tab = Table(show_edge=False, pad_edge=False)
    # the numbers never wrap nor shrink; the words wrap instead, and below WIDE columns the step
    # times are left to the JSON (at 100 columns the status column had vanished and the speed-ups
    # read "1.…")
    wide = con.width >= WIDE
    numbers = ("step time", "vs baseline", "speed-up", "95% CI") if wide else ("speed-up (95% CI)",)
    for col in ("change", *numbers, "predicted", "status"):
        tab.add_column(col, justify="right" if col in numbers else "left", no_wrap=col in numbers,
                       min_width=MIN_WORDS.get(col), overflow="fold" if col == "change" else "ellipsis")
    colour = {"faster": "green", "slower": "red", "failed": "red", "skipped": "dim", "inconclusive": "yellow"}
    for tr in doc["trials"]:
        ci = tr["ci95"]
        pred = tune_predicted(tr)
        status = tr["status"] + (f": {tr['reason']}" if tr["reason"] else "")
        if tr.get("loss") and tr["status"] != "failed":
            status += f" ({tr['loss']['text']})"
        if len(status) > STATUS_CHARS and con.width < UNCROPPED:   # the whole reason is in the JSON
            status = status[:STATUS_CHARS - 1] + "…"
        c = colour.get(tr["status"])
        step, vs = tune_step_times(tr)
        gain = f"{tr['speedup']:.2f}x" if tr["speedup"] else "-"
        interval = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
        cells = (step, vs, gain, interval) if wide else (f"{gain} ({interval})" if ci else gain,)
        tab.add_row(text(tr["label"]), *cells, text(pred), text(status, c or ""))
    con.print(tab)
    if not wide:
        con.print(text(f"(each run's step time and its baselines': a terminal of {WIDE} columns or more, or -o FILE)",
                       "dim"))
    if note := tune_baselines_note(doc, column=wide):
        con.print(text(note, "dim"))
    if note := predicted_note(doc["trials"]):
        con.print(text(note, "dim"))
    if note := per_sample_note(doc["trials"]):
        con.print(text(note, "dim"))
    for i, line in enumerate(tune_model_check(doc["trials"])):
        con.print(text(("    " if i else "") + line, "dim" if i == 0 else ""))
    if doc["skipped_for_budget"]:
        con.print(text(f"skipped for lack of budget ({doc['budget_s']:.0f} s): " + "; ".join(doc["skipped_for_budget"])
                       + f" ({budget_hint(doc)})"))
    best = doc["best"]
    if best:
        runs = "two runs" if best.get("confirmed") else "one run (no budget left to confirm it)"
        con.print(text("best:", "bold") + text(f" {changes_label(best['changes'])}: {best['speedup']:.2f}x "
                  f"(95% CI {best['ci95'][0]:.2f}-{best['ci95'][1]:.2f}, {runs}), {tune_best_step(doc)}/step. "
                  "Apply:"))
        for line in doc["apply"].splitlines():
            con.print(text(f"    {line}"))
    else:
        first, *rest = tune_no_best(doc)
        con.print(text("best:", "bold") + text(f" {first}"))
        for line in rest:
            con.print(text(f"    {line}"))
    left = doc.get("untested") or []
    if left:
        # not only code changes: a setting tune had no reason to try on this run (threads, with the
        # cores free at the baseline) had been listed as one beside a threads trial of another tune
        why = ("left out by --only, code changes, or settings this run gave no reason to try" if doc.get("only")
               else "code changes, or settings this run gave no reason to try")
        con.print(text(f"not measured by tune ({why}; the baseline's report has them in full):", "dim"))
        for u in left:
            gain = ", ".join(x for x in (f"~{u['expected']:.2f}x" if u["expected"] else "?",
                                         f"max {u['ceiling']:.2f}x" if u["ceiling"] else "") if x)
            con.print(text(f"    {u['id']} {u['title']} ({gain})", "dim"))
    if note := b.get("stacks_note"):
        con.print(text(f"baseline: {note} (fixes only the stacks find are not listed)", "dim"))
    con.print(text(f"runs: {doc['dir']} ({doc['elapsed_s']:.0f} s)"))
