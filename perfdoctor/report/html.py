"""The HTML report: one self-contained file (inline CSS and SVG, no script, no request of any
kind: a Content-Security-Policy of default-src 'none' makes the browser refuse one), from the
report document alone (plus tune's JSON when a tune measured the fixes).

Sections: verdict (confidence, evidence, notes), the run, the run over time (CPU, GPU, memory),
the ranks, the step breakdown (bars per step), one representative step as a timeline with its
idle gaps, memory over time, the fixes
(expected gain against its ceiling, measured gain from tune), flags, Python stacks, the detail
tables. Every string from the input is escaped by sanitize.html.
"""

from __future__ import annotations

from perfdoctor.analyze.ranks import spread_text
from perfdoctor.report import svg
from perfdoctor.report.fixcards import fixes_section, flags_section
from perfdoctor.report.labels import (OUTCOME, abnormal_end, bound_title, breakdown_rows, cause_text, cut_text,
                                     data_wait_text, device_text, first_step_shown, median_label, passes_text,
                                     rank_bound, role_labels, shown_trace, source_text, trace_bound,
                                     secondary_text, steps_counted, windows_text)
from perfdoctor.report.ranks_view import rank_notes, rank_title, several_hosts
from perfdoctor.report.runcharts import run_charts
from perfdoctor.report.sanitize import html as H, html_name
from perfdoctor.report.stepchart import step_chart
from perfdoctor.report.values import ms_text, number
from perfdoctor.stats.steptime import inconclusive_text, left_out_text, ms

BOUND_COLOUR = {"input_io": "#d64541", "input_cpu": "#d64541", "input": "#d64541", "host": "#e39b26",
                "device": "#2e8b57", "communication": "#8e5bb5", "inconclusive": "#6b7280"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;background:#f6f7f9;margin:0}
main{max-width:980px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #dde1e6;padding-bottom:4px}
.dim{color:#5b636d}.small{font-size:12px}
section.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:14px 16px;margin:12px 0;overflow-x:auto}
.badge{display:inline-block;color:#fff;font-weight:700;border-radius:6px;padding:4px 10px;letter-spacing:.03em}
.conf{display:inline-block;width:120px;height:8px;background:#e5e7eb;border-radius:4px;vertical-align:middle;margin:0 6px}
.conf i{display:block;height:8px;border-radius:4px;background:#2e8b57}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{padding:3px 8px;text-align:left;vertical-align:top}
th{color:#5b636d;font-weight:600;border-bottom:1px solid #dde1e6}tr+tr td{border-top:1px solid #f0f1f3}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td code{word-break:break-all}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f3f4f6;border-radius:6px;padding:8px 10px;overflow-x:auto;white-space:pre;margin:6px 0}
.legend{margin:4px 0 2px;font-size:12px}.key{margin-right:14px;white-space:nowrap}.kgroup{display:inline-block;margin-right:8px}
.key i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
svg.chart{width:100%;min-width:600px;height:auto;display:block}
.fix h3{font-size:15px;margin:0 0 2px}.gain{color:#1e7b45;font-weight:600}
.gbar{position:relative;height:10px;background:#eef0f2;border-radius:5px;margin:6px 0 4px;max-width:420px}
.gbar i{position:absolute;top:0;bottom:0;left:0;border-radius:5px}
.flag{border-left:4px solid;padding:2px 0 2px 10px;margin:8px 0}
ul.notes{margin:4px 0;padding-left:20px}
"""


MAX_BARS = 30           # the step breakdown's bars at most (report/html._breakdown)


def _ms1(v: float | None) -> str:
    """A rank table's time, to 0.1 ms as the terminal's (three figures had printed 0.000427 ms)."""
    return "-" if v is None else f"{v:.1f} ms"


def render(doc: dict, tune: dict | None = None) -> str:
    first = shown_trace(doc)
    m = first["metrics"]
    labels = role_labels(m)
    body = [_header(doc, m), _verdict(doc), _run(doc.get("run"), m), _every_step(doc.get("run"), m), _over_time(doc.get("run")), _ranks(doc),
            _breakdown(first, labels),
            _timeline(first, labels), _memory(first), fixes_section(doc, tune), flags_section(doc),
            _stacks(doc.get("stacks")), _gaps(first), _kernels(first), _host_ops(first),
            _warnings(doc)]
    title = f"perfdoctor: {bound_title(doc['verdict']['bound'], m)} - {doc['input']}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{H(title)}</title><style>{CSS}</style></head><body><main>\n"
            + "\n".join(b for b in body if b)
            + f"\n<p class=\"dim small\">{H(doc.get('tool', 'perfdoctor'))} · report schema "
              f"{H(doc.get('schema_version'))} · the JSON report (--format json) holds every number shown here."
              "</p></main></body></html>\n")


def _header(doc: dict, m: dict) -> str:
    dev = device_text(m)
    n = len(doc["traces"])
    where = f"{n} traces in {doc['input']}" if n > 1 else doc["input"]
    steps = (f" · {m['steps.count']} step(s) from {m['steps.source']}{windows_text(m)} · "
             f"{median_label(doc, True)} {ms(m['steps.time_median_ms'])} ms{cut_text(m)}"
             if m.get("steps.count") else "")
    return (f"<h1>perfdoctor report</h1><div class=\"dim\">{H(where)}</div>"
            f"<div class=\"dim small\">{H(m.get('trace.platform'))} · {H(dev)}{H(steps)}</div>")


def _fmt(name: str, v, units: dict) -> str:
    u = units.get(name)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return H("unknown" if v is None else v)
    if isinstance(v, (int, float)):
        if u in ("share", "fraction"):
            return f"{100 * v:.1f}%"
        if u in ("ms", "us", "cores", "MB/s"):
            return f"{v:.2f} {u}"
        if u == "bytes":
            return f"{v / 2 ** 20:.1f} MiB"
        return number(v)
    return H(v)


def _verdict(doc: dict) -> str:
    v = doc["verdict"]
    colour = BOUND_COLOUR.get(v["bound"], "#6b7280")
    conf = max(0.0, min(1.0, v["confidence"] or 0.0))
    ev = "".join(f"<tr><td><code>{H(k)}</code></td><td class=\"num\">{_fmt(k, x, doc.get('units', {}))}</td></tr>"
                 for k, x in (v.get("evidence") or {}).items())
    notes = [also] if (also := secondary_text(v)) else []
    notes += v.get("notes") or []
    return ("<section class=\"card\">"
            f"<span class=\"badge\" style=\"background:{colour}\">{H(bound_title(v['bound'], doc['traces'][0]['metrics']))}</span>"
            f" <span class=\"dim\">{H(v['confidence_label'])} confidence</span><span class=\"conf\" "
            f"title=\"confidence {conf:.2f}\"><i style=\"width:{100 * conf:.0f}%\"></i></span>"
            f"<span class=\"dim\">{conf:.2f}</span>"
            f"<p>{H(v['summary'])}</p>"
            + (f"<table><tr><th>evidence ({H(v.get('rule') or 'no rule')})</th><th class=\"num\">value</th></tr>{ev}</table>"
               if ev else "")
            + _notes(notes) + "</section>")


def _notes(notes: list[str]) -> str:
    return ("<ul class=\"notes dim\">" + "".join(f"<li>{H(n)}</li>" for n in notes) + "</ul>") if notes else ""


def _run(run: dict | None, m: dict) -> str:
    if not run:
        return ""
    how = OUTCOME.get(run.get("outcome"), f"{run.get('outcome')}") + (f" (--{run['stopped_by']})" if run.get("stopped_by") else "")
    line = ""
    if m.get("run.step_time_ms") is not None:
        ci, t = m.get("run.step_time_ci95_ms"), m["run.step_time_ms"]
        counted = steps_counted(m.get("run.steps"), source_text(run.get("step_source")) + passes_text(m),
                                run.get("first_step_timed"))
        line = ((f"{H(counted)}: " if counted else "")
                + f"<b>{ms(t)} ms/step</b>"
                + (f" (95% CI {ms(ci[0], t)}-{ms(ci[1], t)})" if ci else "")
                + f" over {m['run.steady_steps']} steady steps"
                + (f" (left out: {H(why)})" if (why := left_out_text(run.get("steps_left_out"))) else "")
                + ("" if m.get("run.step_time_conclusive") else H(inconclusive_text(run.get("step_time_reason"))))
                + f"; {H(data_wait_text(m))}"
                + (f"; the first step {first_s:.1f} s into a {run['wall_s']:.1f} s run"
                   if (first_s := first_step_shown(m, run.get("wall_s"))) is not None else ""))
    return ("<h2>The run</h2><section class=\"card\">"
            f"<div><code>{H(run.get('command') or '(command unknown)')}</code></div><div class=\"dim\">{H(how)} · "
            f"exit code {H(_or_unknown(run.get('exit_code')))} · run directory <code>{H(run.get('dir'))}</code></div>"
            + (f"<div><b>{H(ended)}</b></div>" if (ended := abnormal_end(run)) else "") +
            f"<div>{line}</div>{_notes(run.get('notes') or [])}</section>")


def _every_step(run: dict | None, m: dict) -> str:
    run = run or {}
    legend, pic = step_chart(run.get("step_series"), m.get("run.step_time_ms"), run.get("first_step_timed"))
    if not pic:
        return ""
    return ("<h2>Every step</h2><section class=\"card\"><div class=\"legend\">" + legend + "</div>" + pic
            + "<div class=\"dim small\">Each step's wall time as the step hooks measured it; the step time above is "
              "the steady window's wall time over its steps, long steps included.</div></section>")


def _over_time(run: dict | None) -> str:
    legend, pic = run_charts((run or {}).get("series"))
    if not pic:
        return ""
    shaded = "; the steps lie in the shaded part" if ((run or {}).get("series") or {}).get("steps") else ""
    return ("<h2>The run over time</h2><section class=\"card\"><div class=\"legend\">" + legend + "</div>" + pic
            + "<div class=\"dim small\">As the system sampler saw it (every 0.1-0.5 s): the whole process, from "
              f"its start-up to its exit{shaded}.</div></section>")


def _or_unknown(value):
    return "unknown" if value is None else value


def _ranks(doc: dict) -> str:
    out = []
    if doc.get("cross_rank"):
        cr = doc["cross_rank"]
        rows = "".join(f"<tr><td>{H(t['label'])}</td><td class=\"num\">{ms_text(t['metrics'].get('steps.time_median_ms'))}</td>"
                       f"<td>{H(trace_bound(t))}</td><td>{H(', '.join(f['slug'] for f in t['flags']) or '-')}</td></tr>"
                       for t in doc["traces"])
        out.append(f"<h2>Across {H(cr['count'])} traces (step-time spread {H(spread_text(cr['spread']))})</h2>"
                   "<section class=\"card\"><table><tr><th>trace</th><th class=\"num\">median step</th><th>verdict</th>"
                   f"<th>flags</th></tr>{rows}</table></section>")
    sec = doc.get("ranks")
    if sec:
        per = sec.get("per_rank") or []
        span = max((r.get("step_time_ms") or 0 for r in per), default=0) or 1.0
        hosts = several_hosts(sec)
        rows = []
        for r in per:
            own, wait = r.get("busy_ms") or 0.0, r.get("collective_wait_ms") or 0.0
            bar = (f"<svg viewBox=\"0 0 200 12\" width=\"200\" height=\"12\"><rect width=\"{200 * own / span:.1f}\" height=\"12\" "
                   f"fill=\"#2e8b57\"><title>own work {own:.1f} ms</title></rect><rect x=\"{200 * own / span:.1f}\" "
                   f"width=\"{200 * wait / span:.1f}\" height=\"12\" fill=\"#8e5bb5\"><title>wait {wait:.1f} ms</title></rect></svg>")
            dw, ws = r.get("data_wait_share"), r.get("collective_wait_share")
            star = "*" if r.get("rank") == sec.get("slowest_rank") and sec.get("wait_cause") == "straggler" else ""
            rows.append(f"<tr><td>{H(r.get('rank'))}{star}</td>" + (f"<td>{H(r.get('host') or '-')}</td>" if hosts else "")
                        + f"<td class=\"num\">{_ms1(r.get('step_time_ms'))}</td>"
                        f"<td class=\"num\">{_ms1(r.get('busy_ms'))}</td><td class=\"num\">{_ms1(r.get('collective_wait_ms'))}"
                        + (f" <span class=\"dim\">{100 * ws:.0f}%</span>" if ws is not None and r.get("collective_wait_ms") is not None else "")
                        + f"</td><td class=\"num\">{_ms1(r.get('straggler_wait_ms'))}</td>"
                        f"<td class=\"num\">{'-' if dw is None else f'{100 * dw:.0f}%'}</td>"
                        f"<td>{bar}</td><td>{H(rank_bound(r))}</td><td class=\"num\">{H(_or_unknown(r.get('exit_code')))}</td></tr>")
        notes = "".join(f"<p class=\"{'dim small' if dim else 'dim'}\">{H(line.strip())}</p>" for line, dim in rank_notes(sec))
        out.append(f"<h2>{H(rank_title(sec))}</h2><section class=\"card\"><div class=\"legend\">"
                   "<span class=\"key\"><i style=\"background:#2e8b57\"></i>own work (step - wait)</span>"
                   "<span class=\"key\"><i style=\"background:#8e5bb5\"></i>wait (exposed collective time per step)</span>"
                   "<span class=\"dim\">the steady steps' times</span></div><table><tr><th>rank</th>" + ("<th>host</th>" if hosts else "")
                   + "<th class=\"num\">step</th><th class=\"num\">own work</th><th class=\"num\">wait</th>"
                   "<th class=\"num\">for slower</th><th class=\"num\">data wait</th>"
                   f"<th>own work / wait</th><th>verdict</th><th class=\"num\">exit</th></tr>{''.join(rows)}</table>"
                   + notes + "</section>")
    return "".join(out)


def _breakdown(t: dict, labels: dict) -> str:
    if not t.get("steps"):
        return ""
    shown = breakdown_rows(t, labels)
    rows = "".join(f"<tr><td><span class=\"key\"><i style=\"background:{svg.ROLE_COLOUR[r]}\"></i>{H(name)}</span></td>"
                   f"<td class=\"num\">{ms:.2f} ms</td><td class=\"num\">{100 * share:.1f}%</td></tr>"
                   for r, name, ms, share in shown)
    # the legend keys the table's rows: a role of 0.01% (memset, a sliver no one sees) had a key
    # the table below did not list
    present = {r for r, *_ in shown}
    steps = t["steps"]
    # a bar per step up to MAX_BARS, then that many evenly spaced, first and last among them (a
    # 240-step trace had drawn 240 bars, ~4000 px of rows alike; the table is over them all)
    bars = steps if len(steps) <= MAX_BARS else [steps[round(i * (len(steps) - 1) / (MAX_BARS - 1))]
                                                  for i in range(MAX_BARS)]
    which = "" if bars is steps else f"; bars: {len(bars)} of them, evenly spaced"
    return (f"<h2>Step breakdown ({H(t['label'])}, {len(steps)} step(s){which})</h2><section class=\"card\">"
            + svg.legend(svg.ROLE_COLOUR, labels, present) + svg.step_bars(bars, labels, _whole(t))
            + f"<table style=\"max-width:420px\"><tr><th>mean per step</th><th class=\"num\">time</th>"
              f"<th class=\"num\">share</th></tr>{rows}</table></section>")


def _whole(t: dict) -> bool:
    """A trace without step markers: its one pseudo-step is the whole trace (analyze/steps.py)."""
    return (t.get("metrics") or {}).get("steps.source") == "whole trace"


def _timeline(t: dict, labels: dict) -> str:
    view = t.get("timeline")
    if not view:
        return ""
    gaps = [g for g in t.get("marked_gaps") or [] if g["step"] == view["step"]]
    gaps = sorted(gaps, key=lambda g: -g["duration_ms"])[:6]
    gaps = sorted((g for g in gaps if g["duration_ms"] >= 0.01 * view["duration_ms"]), key=lambda g: g["offset_ms"])
    rows = "".join(f"<tr><td>{i}</td><td class=\"num\">+{g['offset_ms']:.2f} ms</td><td class=\"num\">{g['duration_ms']:.2f} ms</td>"
                   f"<td>{H(g['kind'].replace('_', ' '))}</td><td>{H(svg.HOST_LABEL.get(g['host_activity'], g['host_activity']))}</td>"
                   f"<td><code>{H(g.get('host_event') or '-')}</code></td></tr>" for i, g in enumerate(gaps, 1))
    present = {r for _, _, r in view["breakdown"]}
    hosts = {r for _, _, r in view["host"]}
    what = (f"The whole trace as a timeline ({view['duration_ms']:.2f} ms: it marks no steps)" if _whole(t) else
            f"One step as a timeline (step {H(view['step'])}, {view['duration_ms']:.2f} ms: the traced step closest to their median)")
    return (f"<h2>{what}</h2><section class=\"card\">"
            + ("<div class=\"legend\"><b class=\"key\">device"
               + (f" (busy: any of {int(view['devices'])})" if view.get("devices") else "") + ":</b>"
               "<span class=\"key\"><i style=\"background:#2e8b57\"></i>busy</span>"
               "<span class=\"key\"><i style=\"background:#eceef0\"></i>idle</span></div>" if view.get("device") is not None else "")
            + svg.legend(svg.ROLE_COLOUR, labels, present, "breakdown:") + svg.legend(svg.HOST_COLOUR, svg.HOST_LABEL, hosts, "host:")
            + svg.step_lanes(view, gaps, labels)
            + (f"<table><tr><th>gap</th><th class=\"num\">at</th><th class=\"num\">idle</th><th>kind</th>"
               f"<th>the host was</th><th>host event</th></tr>{rows}</table>" if rows else "")
            + "</section>")


def _memory(t: dict) -> str:
    mem = t.get("memory_timeline")
    pic = svg.memory_lines(mem) if mem else ""
    if not pic:
        return ""
    return ("<h2>Device memory</h2><section class=\"card\"><div class=\"legend\"><span class=\"key\"><i style=\"background:"
            "#3a7dc2\"></i>reserved</span><span class=\"key\"><i style=\"background:#2e8b57\"></i>allocated</span></div>"
            + pic + "</section>")


def _stacks(st: dict | None) -> str:
    if not st or not st.get("top"):
        return ""
    rows = "".join(f"<tr><td class=\"num\">{100 * t['share']:.1f}%</td><td><code>{html_name(t['frame'])}</code></td>"
                   f"<td><code>{H(t.get('at') or '')}</code>"
                   + (f"<div class=\"dim small\"><code>{html_name(t['code'])}</code></div>" if t.get("code") else "")
                   + f"</td><td>{H(cause_text(t))}, {H(t['role'])}</td></tr>"
                   for t in st["top"][:10])
    return ("<h2>Where the steady steps go (Python stacks)</h2><section class=\"card\"><table><tr><th class=\"num\">share"
            f"</th><th>frame</th><th>at (the line)</th><th>cause</th></tr>{rows}</table></section>")


def _gaps(t: dict) -> str:
    gaps = [g for g in t.get("idle_gaps") or [] if g["duration_ms"] >= 0.05]
    if not gaps:
        return ""
    rows = "".join(f"<tr><td>{H(svg.step_name(g['step'], _whole(t)))}</td><td class=\"num\">+{g['offset_ms']:.2f} ms</td>"
                   f"<td class=\"num\">{g['duration_ms']:.2f} ms</td><td>{H(g['kind'].replace('_', ' '))}</td>"
                   f"<td><code>{html_name(g.get('host_event') or g['host_activity'])}</code></td></tr>" for g in gaps)
    return ("<h2>Largest idle-device gaps</h2><section class=\"card\"><table><tr><th>step</th><th class=\"num\">at</th>"
            f"<th class=\"num\">idle</th><th>kind</th><th>host event</th></tr>{rows}</table></section>")


def _kernels(t: dict) -> str:
    rows = ((t.get("tables") or {}).get("kernels") or {}).get("rows") or []
    if not rows:
        return ""
    body = "".join(f"<tr><td><code>{html_name(r['name'])}</code></td><td class=\"num\">{H(r.get('calls'))}</td>"
                   f"<td class=\"num\">{100 * (r.get('share') or 0):.1f}%</td></tr>" for r in rows[:8])
    return ("<h2>Top kernels</h2><section class=\"card\"><table style=\"table-layout:fixed\"><col><col style=\"width:70px\">"
            f"<col style=\"width:70px\"><tr><th>kernel</th><th class=\"num\">calls</th><th class=\"num\">share</th></tr>{body}"
            "</table></section>")


def _host_ops(t: dict) -> str:
    rows = (t.get("tables") or {}).get("host_ops") or []
    if not rows:
        return ""
    body = "".join(f"<tr><td><code>{html_name(r['name'])}</code></td><td class=\"num\">{H(r['calls'])}</td>"
                   f"<td class=\"num\">{ms_text(r['mean_self_us'] / 1000)}</td>"
                   f"<td class=\"num\">{100 * r['share']:.1f}%</td></tr>" for r in rows[:8])
    return ("<h2>Top host ops (self time)</h2><section class=\"card\"><table style=\"table-layout:fixed\"><col>"
            "<col style=\"width:70px\"><col style=\"width:90px\"><col style=\"width:70px\"><tr><th>op</th>"
            "<th class=\"num\">calls</th><th class=\"num\">mean</th><th class=\"num\">of step</th></tr>"
            f"{body}</table>{_host_ops_note(rows)}</section>")


def _host_ops_note(rows: list[dict]) -> str:
    """Under the host-op table when its shares add past the step: ops on several host threads at
    once (gloo's threads, DataLoader or intra-op pools) each count their own time (cpu_only: one
    op read "of step 163.6%", unexplained)."""
    if sum(r.get("share") or 0 for r in rows) <= 1.0:
        return ""
    return ("<div class=\"dim small\">Ops on several host threads run at once (collectives' threads, loader or "
            "intra-op pools), and each counts its own self time: the shares add up past the step.</div>")


def _warnings(doc: dict) -> str:
    ws = list(dict.fromkeys(w for t in doc["traces"] for w in t.get("warnings") or []))
    shown = set((doc.get("run") or {}).get("notes") or [])          # listed under "The run" already
    notes = list(dict.fromkeys(n for t in doc["traces"] for n in t.get("notes") or [] if n not in shown))
    if not ws and not notes:
        return ""
    return "<h2>Notes</h2><section class=\"card\">" + _notes(notes) + _notes([f"warning: {w}" for w in ws]) + "</section>"
