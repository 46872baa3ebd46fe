"""Rich terminal rendering of a report document: verdict, breakdown, ranked fixes, flags, gaps."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfdoctor.analyze.ranks import spread_text
from perfdoctor.report.labels import (OUTCOME, bound_title, breakdown_rows, cause_text, cut_text, data_wait_text,
                                       device_text, error_line, first_step_shown, median_label, passes_text,
                                       role_labels, shown_rank, shown_trace, secondary_text, source_text,
                                       steps_counted, trace_bound, windows_text)

from perfdoctor.report.terminal_fixes import fixes as _fixes, top_fixes as _top_fixes
from perfdoctor.report.termtext import elsewhere as _elsewhere, line as _line, para as _para
from perfdoctor.report.tune_labels import MEASURE_FIXES, further_down, tune_hint
from perfdoctor.report.sanitize import console as _console, terminal as T, text
from perfdoctor.report.values import number
from perfdoctor.stats.steptime import inconclusive_text, left_out_text, ms

SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
BAR = 28


def render(doc: dict, console: Console | None = None, details: bool = False, tune: dict | None = None) -> None:
    """The report on one screen (verdict, breakdown, the top fixes and flags in a line each), or
    with details=True everything: evidence, notes, fixes in full with their snippets, gaps, tables.
    tune: tune's JSON, whose measured gains go under the fixes (and replace the command to measure them)."""
    c = console or _console()
    v = doc["verdict"]
    first = shown_trace(doc)
    m = first["metrics"]
    dev = T(device_text(m))
    traced = m.get("steps.count") is not None        # False: a live run without a trace
    none_of = _nothing_measured(doc, traced)
    where = T(f"{len(doc['traces'])} traces in {doc['input']}" if len(doc["traces"]) > 1 else first["path"])
    if doc.get("run"):
        _run_header(c, doc["run"], m, details, shown_rank(doc))
    else:
        c.print(Text.assemble(("perfdoctor ", "bold"), (where, "dim")))
    median = m.get("steps.time_median_ms") if traced else m.get("run.step_time_median_ms")
    c.print(Text(f"{T(m['trace.platform'])} · {dev} · "
                 + (f"{m['steps.count']} step(s) from {T(m['steps.source'])}" if traced else "no trace")
                 + windows_text(m)
                 + (f" · {median_label(doc, traced)} {ms(median)} ms{cut_text(m) if traced else ''}"
                    if median is not None else ""), style="dim"))
    c.print()
    c.print(Text.assemble((f" {T(bound_title(v['bound'], m))} ", "bold reverse"),
                          (f"  {v['confidence_label']} confidence ({v['confidence']:.2f})", "dim")))
    c.print(text(v["summary"]))
    if also := secondary_text(v):
        _para(c, also, 2, "dim")
    for n in v["notes"] if details else v["notes"][:2]:
        _para(c, f"note: {n}", 2, "dim")
    if details:
        _evidence(c, v)
    if doc.get("cross_rank"):
        _ranks(c, doc)
    if doc.get("ranks"):                 # a multi-rank run (report/ranks_view.py)
        from perfdoctor.report.ranks_view import render_ranks
        render_ranks(c, doc["ranks"])
    _breakdown(c, first)
    _stacks(c, doc.get("stacks"), details)
    if details:
        _fixes(c, doc, none_of, tune)
        _flags(c, doc)
        _gaps(c, first)
        _details(c, first)
    else:
        on_screen = _top_fixes(c, doc, none_of, tune)
        _flags_compact(c, doc)
    if details:
        _trace_notes(c, doc)
    for w in dict.fromkeys(w for t in doc["traces"] for w in t["warnings"]):
        _para(c, f"warning: {w}", 0, "yellow")
    if tune is None and (cmd := tune_hint(doc)):    # a command to paste: never wrapped nor cut (the terminal folds it)
        c.print(Text(MEASURE_FIXES if details else T(further_down(MEASURE_FIXES, cmd, on_screen)), style="dim"))
        c.print(Text("    " + T(cmd)), no_wrap=True, overflow="ignore", crop=False)
    if not details:
        c.print(Text("--details: evidence, the fixes in full with code, gaps and tables; --format html: "
                     "the pictures", style="dim"), no_wrap=True, overflow="ellipsis")


def _trace_notes(c: Console, doc: dict) -> None:
    """The traces' own notes (steps left out and why: a cut file, repeated step numbers, the
    profiler's partial last step), those the run header and the verdict did not show already."""
    shown = set((doc.get("run") or {}).get("notes") or []) | set(doc["verdict"].get("notes") or [])
    several = len(doc["traces"]) > 1
    for t in doc["traces"]:
        for n in dict.fromkeys(t.get("notes") or []):
            if n not in shown:
                _para(c, f"note: {t['label']}: {n}" if several else f"note: {n}", 0, "dim")


def _nothing_measured(doc: dict, traced: bool) -> str | None:
    """What 'no fix applies' is said of: the trace, or what a run without one measured; None for a
    run that measured nothing (it failed before its first step, and the verdict says so)."""
    if traced:
        return "this trace"
    steps = (doc.get("run") or {}).get("steps")
    return "what this run measured" if steps or not doc.get("run") else None


def _evidence(c: Console, v: dict) -> None:
    ev = v.get("evidence") or {}
    if not ev:
        return
    table = Table.grid(padding=(0, 2))
    for k, x in ev.items():
        table.add_row("  " + T(k), text(number(x) if isinstance(x, float) else x))
    c.print(Text(f"  evidence ({T(v.get('rule') or '-')}):", style="dim"))
    c.print(table)


def _flags_compact(c: Console, doc: dict) -> None:
    flags = doc["flags"]
    if not flags:
        return
    c.print()
    c.print(Text("Flags", style="bold"))
    for f in flags:
        _line(c, Text.assemble((T(f"  [{f['severity']}] "), SEV_STYLE.get(f["severity"], "")), (T(f["id"]), "dim"),
                               _elsewhere(doc, f), (T(f" {f['title']}"), "")))


def _run_header(c: Console, run: dict, m: dict, details: bool = True, rank: int | None = None) -> None:
    how = OUTCOME.get(run["outcome"], T(run["outcome"]))
    if run.get("stopped_by"):
        how += f" (--{T(run['stopped_by'])})"
    code = "unknown" if run.get("exit_code") is None else T(run["exit_code"])   # a damaged run.json
    # a multi-rank job names the rank whose failure it was, however that rank ended
    err = error_line(run) if run.get("outcome") == "crashed" or run.get("failed_rank") is not None else None
    c.print(Text.assemble(("perfdoctor run ", "bold"), (T(run["command"] or "(command unknown)"), "bold"),
                          (f" · {how} · exit code {code}", ""), (f" · {T(err)}" if err else "", "red")))
    whose = "" if rank is None else f"rank {rank} (the table below has every rank's): "
    if m.get("run.step_time_ms") is not None:
        c.print(Text(whose + _run_steps_line(m, run.get("wall_s"), run.get("steps_left_out"), run.get("step_source"),
                                             run.get("step_time_reason"), run.get("first_step_timed"))
                     + f"; median {ms(m['run.step_time_median_ms'])} ms; {data_wait_text(m)}", style="dim"))
    elif counted := steps_counted(run.get("steps"), all_timed=run.get("first_step_timed")):
        # a run of a step or two says how many it had (a user's --duration run showed no count at all)
        why = run.get("step_time_reason")      # with what would leave enough (ending.more_steps)
        c.print(Text(f"{whose}{counted}: too few for a step time" + (f" ({T(why)})" if isinstance(why, str) and why
                                                                     else ""), style="dim"))
    board = f"  (tensorboard --logdir {run['dir']})" if run.get("steps") else ""   # nothing to plot before a step
    c.print(text(f"run directory: {run['dir']}{board}", style="dim"))
    notes = run.get("notes", [])
    for n in notes if details else notes[:1]:
        _para(c, f"note: {n}", 0, "yellow")


def _run_steps_line(m: dict, wall_s: float | None, left_out: dict | None = None, source: str | None = None,
                    reason: str | None = None, all_timed: bool = False) -> str:
    """'100 steps, 99 timed, in a 24.1 s run: 193.6 ms/step (95% CI 191.4-195.9) over 87 steady
    steps (left out: 10 profiled, 2 warm-up)' (labels.steps_counted); the wall time is the whole
    run's (imports and set-up included), not the steps'. Steps that are not optimizer steps say
    what they are; a step time the window cannot tell says why (`reason`: the estimate's, in
    run.json's step_time_reason)."""
    why = left_out_text(left_out)
    ci = m.get("run.step_time_ci95_ms")
    t = m["run.step_time_ms"]
    wall = f" in a {wall_s:.1f} s run" if wall_s is not None else " measured"
    if (first_s := first_step_shown(m, wall_s)) is not None:    # set-up a material part of the run
        wall += f" (the first after {first_s:.1f} s)"
    what = T(source_text(source)) + passes_text(m)
    return (f"{steps_counted(m.get('run.steps'), what, all_timed) or 'steps'},{wall}: {ms(t)} ms/step"
            + (f" (95% CI {ms(ci[0], t)}-{ms(ci[1], t)})" if ci else "")
            + f" over {m['run.steady_steps']} steady steps"
            + (f" (left out: {why})" if why else "")
            + ("" if m.get("run.step_time_conclusive")
               else inconclusive_text(T(reason) if isinstance(reason, str) else None)))


def _breakdown(c: Console, t: dict) -> None:
    if not t["steps"]:          # a live run without a trace: nothing to break down
        return
    n = len(t["steps"])
    c.print()
    c.print(Text(f"Step breakdown ({T(t['label'])}, mean of {n} step(s))", style="bold"))
    table = Table.grid(padding=(0, 2))
    for _, name, mean_ms, share in breakdown_rows(t, role_labels(t["metrics"])):
        table.add_row("  " + name, f"{mean_ms:9.2f} ms", f"{100 * share:5.1f}%",
                      Text("█" * int(round(share * BAR)) or "▏", style="green"))
    c.print(table)


STACK_ROWS = 5


def _stacks(c: Console, st: dict | None, details: bool = True) -> None:
    """The top Python frames of the steady steps (py-spy), one line each."""
    if not st:
        return
    for n in st.get("notes", []) if not st.get("top") else []:
        c.print(text(f"note: {n}", style="dim"))
    if not st.get("top"):
        return
    c.print()
    c.print(Text(f"Where the steady steps go (Python stacks: {st['steady_steps']} steps, "
                 f"{st['sampled_s']:.1f} s sampled)", style="bold"))
    for t in st["top"][:STACK_ROWS]:
        where = f"{t['frame']} at {t['at']}" if t["at"] and t["frame"] != t["at"] else t["frame"]
        _line(c, Text.assemble(f"  {100 * t['share']:5.1f}%  ", (T(where), "bold"),
                               (T(f"  ({cause_text(t)}, {t['role']})"), "dim"),
                               (T(f"  {t['code']}") if t.get("code") else "", "cyan")))


def _flags(c: Console, doc: dict) -> None:
    flags = doc["flags"]
    if not flags:
        return
    c.print()
    c.print(Text("Flags", style="bold"))
    for f in flags:
        c.print(Text.assemble((T(f"  [{f['severity']}] "), SEV_STYLE.get(f["severity"], "")), (T(f["title"]), "bold"),
                              (T(f"  ({f['id']})"), "dim"), _elsewhere(doc, f)))
        _para(c, f["summary"], 4)


def _gaps(c: Console, t: dict) -> None:
    gaps = [g for g in t["idle_gaps"] if g["duration_ms"] >= 0.05]
    if not gaps:
        return
    c.print()
    c.print(Text("Largest idle-GPU gaps", style="bold"))
    table = Table.grid(padding=(0, 2))
    table.add_row(*(text(h, style="dim") for h in ("  step", "starts at", "lasts", "why", "on the host")))
    for g in gaps:
        table.add_row(text(f"  step {g['step']}"), f"+{g['offset_ms']:.2f} ms", f"{g['duration_ms']:.2f} ms",
                      text(g["kind"].replace("_", " ")), text(_short(g["host_event"] or g["host_activity"]), style="dim"))
    c.print(table)


def _details(c: Console, t: dict) -> None:
    """The detail tables in a line or two (all of them: the JSON's traces[].tables)."""
    tb = t.get("tables") or {}
    lines = []
    rows = (tb.get("kernels") or {}).get("rows") or []
    la = tb.get("launches")
    head = [f"{_kernel_name(rows[0]['name'])} {100 * (rows[0]['share'] or 0):.0f}%"] if rows else []
    if la:
        # the time from a launch to its kernel's start, and the kernels queued ahead: "launch p50"
        # had read as a launch's own cost (74 ms on the H100 compute run, past its 71 ms step)
        p50, p90 = la["delay_us"]["p50"], la["delay_us"]["p90"]
        pair = f"{p50:.0f}/{p90:.0f} µs" if p90 < 10_000 else f"{ms(p50 / 1e3, p90 / 1e3)}/{ms(p90 / 1e3)} ms"
        head.append(f"launch to start p50/p90 {pair}, kernels queued ahead p90 {la['queue_depth']['p90']:.0f}")
    if head:
        lines.append("Kernels: " + " · ".join(head))
    host = tb.get("host_ops") or []
    if host:
        lines.append("Host ops, self time: " + " · ".join(
            f"{_short(r['name'], 32)} {100 * r['share']:.0f}%" for r in host[:3]))
    coll = tb.get("collectives") or []
    if coll:
        lines.append("Collectives: " + "; ".join(
            f"{r['name']} x{r['count']}, {r['mean_us']:.0f} µs each"
            + (f", {r['bytes'] / 1e6:.1f} MB" if r.get("bytes") is not None else "")
            + (f", busbw {r['busbw_gbps']:.1f} GB/s" if r.get("busbw_gbps") is not None else "")
            for r in coll[:2]))
    if lines:
        c.print()
        for line in lines:
            c.print(text(line, style="dim"), overflow="ellipsis", no_wrap=True)


def _kernel_name(name: str) -> str:
    name = name[5:] if name.startswith("void ") else name
    cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    return _short(name[:cut], 24)


def _ranks(c: Console, doc: dict) -> None:
    cr = doc["cross_rank"]
    c.print()
    c.print(Text(f"Across {cr['count']} traces (step-time spread {spread_text(cr['spread'])})", style="bold"))
    table = Table(show_edge=False, box=None, padding=(0, 2))
    for col in ("trace", "median step", "verdict", "flags"):
        table.add_column(col)
    for t in doc["traces"]:
        med = t["metrics"].get("steps.time_median_ms")
        table.add_row(text(t["label"]), f"{ms(med)} ms" if med is not None else "-", text(trace_bound(t)),
                      text(", ".join(f["slug"] for f in t["flags"]) or "-"))
    c.print(table)


def _short(s: str, n: int = 48) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
