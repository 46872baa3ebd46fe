"""Markdown for pull-request comments and GitHub job summaries (`--format markdown` of report,
run, compare and tune): the verdict, the breakdown, the top fixes with their gains, the flags,
and the evidence folded in a <details> block. Compact: a reviewer reads it in ten seconds.

Every string from the input goes through sanitize.markdown (one line, no link, HTML, code span,
emphasis or table cell can form); code snippets sit in a fence longer than any backtick run in
them, with control characters shown escaped.
"""

from __future__ import annotations

import re

from perfdoctor.report.compare_text import beyond_word, compare_lines
from perfdoctor.report.labels import (BOUND_TITLE, NO_FIX, NONE_MODELLED, SAME_SHARE, WORTH_A_LOOK, abnormal_end,
                                       bound_title, breakdown_rows, device_text, first_step_shown, from_other_traces,
                                       off_bottleneck_note, overlapping, role_labels, script_failure, secondary_text,
                                       shown_rank, shown_trace, steps_counted, unranked_gain)
from perfdoctor.report.tune_labels import (MEASURE_FIXES, budget_hint, measured_by_rule, pace_text, per_sample_note,
                                            predicted_note, tune_baselines_note, tune_best_step, tune_hint,
                                            tune_measured, tune_model_check, tune_no_best, tune_only, tune_predicted,
                                            tune_step_times)
from perfdoctor.report.sanitize import markdown as M, terminal
from perfdoctor.report.values import change, changes_label, number, s_as_ms, value
from perfdoctor.stats.steptime import inconclusive_text, left_out_text, ms

TOP_FIXES = 5


def _fence(code: str, lang: str = "") -> str:
    code = terminal(code, keep_newlines=True).rstrip()
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", code)), default=0))
    lang = re.sub(r"[^A-Za-z0-9_+-]", "", lang or "")
    return f"{ticks}{lang}\n{code}\n{ticks}"


def report(doc: dict, tune: dict | None = None) -> str:
    v = doc["verdict"]
    first = shown_trace(doc)
    m = first["metrics"]
    out = [f"### perfdoctor: {bound_title(v['bound'], m) if v['bound'] in BOUND_TITLE else M(v['bound'])} · {v['confidence_label']} confidence "
           f"({v['confidence']:.2f})", "", M(v["summary"]), ""]
    if also := secondary_text(v):
        out[-1:-1] = ["", f"_{M(also)}_"]
    run = doc.get("run")
    ended = abnormal_end(run) or (f"The script {failed}" if (failed := script_failure(run)) else None)
    if ended:
        out[-1:-1] = ["", f"**{M(ended)}**"]
    dev = device_text(m)
    facts = [M(doc["input"]), M(dev)]
    if m.get("steps.count"):
        facts.append(f"{m['steps.count']} traced steps, median {ms(m['steps.time_median_ms'])} ms")
    if m.get("run.step_time_ms") is not None:
        ci, t = m.get("run.step_time_ci95_ms"), m["run.step_time_ms"]
        counted = steps_counted(m.get("run.steps"), all_timed=(doc.get("run") or {}).get("first_step_timed"))
        rank = shown_rank(doc)
        facts.append(f"run{'' if rank is None else f' (rank {rank})'}: {counted + ': ' if counted else ''}**{ms(t)} ms/step**" + (f" (95% CI {ms(ci[0], t)}-{ms(ci[1], t)})" if ci else "")
                     + f" over {m['run.steady_steps']} steady steps"
                     + (f" (left out: {why})" if (why := left_out_text((doc.get("run") or {}).get("steps_left_out")))
                        else "")
                     + (M(inconclusive_text((doc.get("run") or {}).get("step_time_reason")))
                        if m.get("run.step_time_conclusive") is False else ""))
        wall = (doc.get("run") or {}).get("wall_s")
        if (first_s := first_step_shown(m, wall)) is not None:
            facts.append(f"the first step {first_s:.1f} s into a {wall:.1f} s run")
    out += [" · ".join(facts), ""]
    # the run's first note, as the terminal shows it by default (a drift, steps of two kinds, what a
    # step is: how to read the step time), the others with the evidence
    run_notes = [str(n) for n in (run or {}).get("notes") or []]
    if run_notes:
        out += [f"_note: {M(run_notes[0])}_", ""]
    if first.get("steps"):
        rows = sorted(breakdown_rows(first, role_labels(m)), key=lambda r: -r[3])
        out += ["| step breakdown | ms/step | share |", "|---|--:|--:|"]
        out += [f"| {name} | {ms:.2f} | {100 * sh:.1f}% |" for _, name, ms, sh in rows]
        out.append("")
    if doc.get("ranks"):
        out += _ranks(doc["ranks"])
    out += _fixes(doc, tune)
    if doc["flags"]:
        out += ["**Flags:** " + "; ".join(f"{M(f['severity'])}: {M(f['title'])} ({M(f['id'])}"
                                          + (f"; from {M(w)})" if (w := from_other_traces(doc, f)) else ")")
                                          for f in doc["flags"]), ""]
    # what the terminal and the HTML print as warnings (damaged or doubtful input): a PR comment too
    for w in dict.fromkeys(w for t in doc["traces"] for w in t.get("warnings") or []):
        out += [f"> **warning:** {M(w)}", ""]        # a blank line each: one quote would run them together
    ev = v.get("evidence") or {}
    notes = list(v.get("notes") or []) + run_notes[1:]
    if ev or notes:
        out += ["<details><summary>Evidence</summary>", ""]
        if ev:
            out += ["| metric | value |", "|---|--:|"] + [f"| {M(k)} | {_val(x)} |" for k, x in ev.items()]
        out += [""] + [f"- {M(n)}" for n in notes] + ["", "</details>", ""]
    out.append(f"<sub>{M(doc.get('tool', 'perfdoctor'))}: `perfdoctor report --format json` has every number</sub>")
    return "\n".join(out) + "\n"


def _ranks(sec: dict) -> list[str]:
    """The rank table, as the terminal's (report/ranks_view.py) with its lines under it: what a
    pull-request comment on a multi-rank job needs most (the summary named the straggler only)."""
    from perfdoctor.report.labels import rank_bound
    from perfdoctor.report.ranks_view import cell_ms, cell_pct, rank_notes, rank_title
    m = sec.get("metrics") or {}
    star = sec.get("slowest_rank") if m.get("ranks.wait_cause") == "straggler" else None
    out = [f"**{M(rank_title(sec))}** (steady steps; wait = exposed collective time per step, own work = step - wait)",
           "", "| rank | step ms | own ms | wait ms | for slower | data wait | verdict | exit |",
           "|--:|--:|--:|--:|--:|--:|---|--:|"]
    for r in sec.get("per_rank") or []:
        mark = "\\*" if star is not None and r.get("rank") == star else ""      # the straggler, as the terminal's *
        out.append(f"| {M(r.get('rank'))}{mark} | "
                   f"{cell_ms(r.get('step_time_ms'))} | {cell_ms(r.get('busy_ms'))} | {cell_ms(r.get('collective_wait_ms'))} "
                   f"{cell_pct(r.get('collective_wait_share'))} | {cell_ms(r.get('straggler_wait_ms'))} | "
                   f"{cell_pct(r.get('data_wait_share'))} | {M(rank_bound(r))} | {M('-' if r.get('exit_code') is None else r['exit_code'])} |")
    return out + [""] + [M(line.strip()) + "  " for line, _ in rank_notes(sec)] + [""]


def _val(x) -> str:
    if isinstance(x, float):
        return number(x)
    return M("unknown" if x is None else x)


def _fixes(doc: dict, tune: dict | None) -> list[str]:
    ranked = [f for f in doc["findings"] if f["ranked"]][:TOP_FIXES]
    # the fixes without a modelled gain (or none expected here), as the terminal lists them: the
    # tune command below can name one (a bf16 fix, max 2.20x, was in its --only and nowhere else)
    rest = [f for f in doc["findings"] if not f["ranked"]]
    measured = measured_by_rule(tune)
    # a fix without a modelled gain that tune measured says so (PD306 at 10.45x had been nowhere)
    also = ([f"Also {WORTH_A_LOOK}: " + "; ".join(
        f"{M(f['title'])} ({M(f['id'])}{unranked_gain(f)})"
        + (f", measured by tune: **{M(tune_measured(meas))}**" if (meas := measured.get(f["id"])) else "") for f in rest)]
        if rest else [])
    measure = (["", MEASURE_FIXES.capitalize(), "", _fence(cmd, "sh")]
               if tune is None and (cmd := tune_hint(doc)) else [])
    if not ranked:      # the fixes worth a look may still be measured (CPU bf16 autocast, say)
        return [f"{NONE_MODELLED}." if rest else NO_FIX, "", *also, *measure, *([""] if also or measure else [])]
    note = off_bottleneck_note(doc)
    out = ["**Fixes** (expected gain: a model of the change, never above its ceiling)", "",
           *([f"*{M(note)}*", ""] if note else [])]
    for i, f in enumerate(ranked, 1):
        g = f.get("gain") or {}
        meas = measured.get(f["id"])
        extra = f"; measured by tune: **{M(tune_measured(meas))}**" if meas else ""
        where = from_other_traces(doc, f)
        same = overlapping(f, ranked[:i - 1])
        extra += f"; {M(SAME_SHARE.format(same))}" if same else ""
        out.append(f"{i}. **{M(f['title'])}**: {M(g.get('text') or '')}{extra} ({M(f['id'])}"
                   + (f"; from {M(where)})" if where else ")"))
    if also:
        out += ["", *also]
    snippet = ranked[0]["fix"].get("snippet")
    if snippet:
        out += ["", _fence(snippet, ranked[0]["fix"].get("snippet_lang") or "")]
    out += measure
    out.append("")
    return out


def compare(doc: dict) -> str:
    out = [f"### perfdoctor compare: {M(doc['before'])} → {M(doc['after'])}", "",
           "| metric | before | after | change | noise | beyond noise |", "|---|--:|--:|--:|--:|---|"]
    for r in doc["rows"]:
        beyond = {True: "**yes**", False: "no", None: "unknown"}[r["beyond_noise"]]
        if shared := beyond_word(doc, r):
            beyond = f"**{shared}**"
        noise = M(r["noise"] or "unknown")
        if r["note"].startswith("secondary"):
            noise, beyond = "", "secondary figure"
        out.append(f"| {M(r['metric'])} | {value(r['before'], r['unit'])} | {value(r['after'], r['unit'])} | "
                   f"{change(r)} | {noise} | {beyond} |")
    v, titles = doc["verdict"], doc.get("verdict_titles") or {}
    out.append(f"| verdict | {M(titles.get('before') or v['before'])} | {M(titles.get('after') or v['after'])} | "
               f"{'changed' if v['changed'] else ''} | | |")
    for kind, line in compare_lines(doc):
        line = M(line[:1].upper() + line[1:])
        out += ["", f"**{line}**" if kind == "environment" else f"_{line}_" if kind == "note" else line]
    return "\n".join(out) + "\n"


def tune(doc: dict) -> str:
    if failed := doc.get("failed"):
        return (f"### perfdoctor tune: {M(doc['command'])}\n\nNot tuned (exit code {failed['exit_code']}): "
                f"{M(failed['error'])}\n")
    b = doc["baseline"]
    out = [f"### perfdoctor tune: {M(doc['command'])}", "",
           f"Baseline {s_as_ms(b['step_time_s'])}/step (95% CI {s_as_ms(b['ci95'][0])}-{s_as_ms(b['ci95'][1])}) over {b['steps']} "
           f"steady steps{M(pace_text(b))}; verdict {M(b.get('verdict_title') or b['verdict'] or 'unknown')}; {M(doc['noise'])}", "",
           *([M(tune_only(doc)), ""] if doc.get("only") else []),
           "| change | step time | vs baseline | speed-up | 95% CI | predicted | status |", "|---|--:|--:|--:|--:|--:|---|"]
    for tr in doc["trials"]:
        ci = tr["ci95"]
        pred = M(tune_predicted(tr))
        status = tr["status"] + (f": {tr['reason']}" if tr["reason"] else "")
        step, vs = tune_step_times(tr)
        out.append(f"| {M(tr['label'])} | {step} | {vs} | "
                   + (f"{tr['speedup']:.2f}x" if tr["speedup"] else "-") + " | "
                   + (f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-") + f" | {pred} | {M(status)} |")
    best = doc["best"]
    if note := tune_baselines_note(doc):
        out += ["", f"_{M(note)}_"]
    if note := predicted_note(doc["trials"]):
        out += ["", f"_{M(note)}_"]
    if note := per_sample_note(doc["trials"]):
        out += ["", f"_{M(note)}_"]
    if checks := tune_model_check(doc["trials"]):
        out += ["", M(checks[0]) + (":" if len(checks) > 1 else ""), *(f"- {M(c)}" for c in checks[1:])]
    out.append("")
    if best:
        runs = "two runs" if best.get("confirmed") else "one run"
        out += [f"**Best:** {M(changes_label(best['changes']))}: **{best['speedup']:.2f}x** (95% CI {best['ci95'][0]:.2f}-"
                f"{best['ci95'][1]:.2f}, {runs}), {tune_best_step(doc)}/step. Apply:", "", _fence(doc["apply"])]
    else:
        first, *rest = tune_no_best(doc)
        out += [f"**Best:** {first}", *(f"- {M(line)}" for line in rest)]
    if note := b.get("stacks_note"):
        out += ["", f"_Baseline: {M(note)} (fixes only the stacks find are not listed)._"]
    if doc.get("skipped_for_budget"):
        out += ["", f"Skipped for lack of budget ({doc['budget_s']:.0f} s): " + M("; ".join(doc["skipped_for_budget"]))
                + f" ({M(budget_hint(doc))})"]
    return "\n".join(out) + "\n"
