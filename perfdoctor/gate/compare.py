"""`perfdoctor compare BEFORE AFTER`: two runs side by side, each change set against the noise
measured inside the two runs.

Noise:
- step time (median, p90) and throughput: the steady-state steps of each run (stats.steady_state);
  a change is "beyond noise" when the 95% bootstrap CI of the ratio (after / before) excludes 1;
- breakdown shares: the per-step breakdown of the profiled steps of each trace; a change is beyond
  noise when it exceeds 2 standard errors of the difference of the per-step means;
- without step records (a bare report file) the noise is unknown.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.gate import stats
from perfdoctor.gate.load import RunData, fingerprint_diff, load_run

BREAKDOWN = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loading", "cpu_exec", "other")


def compare_paths(before, after) -> dict:
    return compare_runs(load_run(before), load_run(after))


def _row(metric, unit, b, a, noise, beyond, note=""):
    change = None
    if b is not None and a is not None:
        change = (a / b - 1) if unit in ("ms", "steps/s") and b else (a - b)
    return {"metric": metric, "unit": unit, "before": b, "after": a, "change": change,
            "kind": "relative" if unit in ("ms", "steps/s") else "absolute",
            "noise": noise, "beyond_noise": beyond, "note": note}


def compare_runs(b: RunData, a: RunData) -> dict:
    rows = []
    sb = stats.steady_state(b.steps) if b.steps else None
    sa = stats.steady_state(a.steps) if a.steps else None
    have = sb is not None and sa is not None and sb.n >= 3 and sa.n >= 3
    mb, ma = b.metrics, a.metrics
    for label, stat, key in (("step time median", np.median, "run.step_time_median_ms"),
                             ("step time p90", stats.p90, "run.step_time_p90_ms")):
        if have:
            vb, va = 1e3 * float(stat(sb.durs)), 1e3 * float(stat(sa.durs))
            lo, hi = stats.bootstrap_ratio_ci(sb.durs, sa.durs, stat=stat)
            rows.append(_row(label, "ms", vb, va, f"CI95 {lo:.2f}-{hi:.2f}x", lo > 1 or hi < 1,
                             f"steady steps {sb.n} / {sa.n}"))
        else:
            rows.append(_row(label, "ms", mb.get(key) or mb.get("steps.time_median_ms" if "median" in key else
                                                                "steps.time_p90_ms"),
                             ma.get(key) or ma.get("steps.time_median_ms" if "median" in key else "steps.time_p90_ms"),
                             None, None, "no step records: noise unknown"))
    med = rows[0]
    tb = 1e3 / med["before"] if med["before"] else None
    ta = 1e3 / med["after"] if med["after"] else None
    rows.append(_row("throughput", "steps/s", tb, ta, med["noise"], med["beyond_noise"], "1 / median step time"))
    for cat in BREAKDOWN:
        key = f"breakdown.{cat}"
        vb, va = mb.get(key), ma.get(key)
        if vb is None and va is None:
            continue
        eb, ea = _per_step_shares(b, cat), _per_step_shares(a, cat)
        noise, beyond = None, None
        if vb is not None and va is not None and len(eb) >= 2 and len(ea) >= 2:
            se = float(np.sqrt(eb.var(ddof=1) / len(eb) + ea.var(ddof=1) / len(ea)))
            noise = f"±{200 * se:.1f} pts"
            beyond = abs(va - vb) > 2 * se and abs(va - vb) >= 0.005
        rows.append(_row(key, "share", vb, va, noise, beyond))
    fb, fa = b.fix_ids, a.fix_ids
    diffs, unknown = fingerprint_diff(b.fingerprint, a.fingerprint)
    return {"before": b.label, "after": a.label, "rows": rows,
            "verdict": {"before": b.verdict, "after": a.verdict, "changed": b.verdict != a.verdict},
            "findings": {"before": fb, "after": fa, "added": [f for f in fa if f not in fb],
                         "removed": [f for f in fb if f not in fa]},
            "environment": {"before": b.fingerprint, "after": a.fingerprint, "differs": diffs, "unknown": unknown}}


def _per_step_shares(r: RunData, cat: str) -> np.ndarray:
    steps = ((r.doc.get("traces") or [{}])[0].get("steps")) or []
    out = []
    for s in steps:
        bd, d = s.get("breakdown_ms") or {}, s.get("duration_ms")
        if d and bd.get(cat) is not None:
            out.append(bd[cat] / d)
    return np.array(out, dtype=float)


def _fmt(v, unit):
    if v is None:
        return "unknown"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "steps/s":
        return f"{v:.2f}/s"
    return f"{100 * v:.1f}%"


def _fmt_change(r):
    c = r["change"]
    if c is None:
        return ""
    return f"{100 * c:+.1f}%" if r["kind"] == "relative" else f"{100 * c:+.1f} pts"


def render_compare(doc: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    c = console or Console(highlight=False)
    t = Table(title=f"perfdoctor compare: {doc['before']} -> {doc['after']}", title_justify="left")
    for col in ("metric", "before", "after", "change", "noise", "beyond noise"):
        t.add_column(col, no_wrap=col in ("metric", "change"))
    for r in doc["rows"]:
        beyond = {True: "[bold]yes[/]", False: "no", None: "unknown"}[r["beyond_noise"]]
        t.add_row(r["metric"], _fmt(r["before"], r["unit"]), _fmt(r["after"], r["unit"]), _fmt_change(r),
                  r["noise"] or "unknown", beyond)
    v = doc["verdict"]
    t.add_row("verdict", str(v["before"]), str(v["after"]), "changed" if v["changed"] else "", "", "")
    c.print(t)
    f = doc["findings"]
    c.print(f"findings before: {', '.join(f['before']) or 'none'}; after: {', '.join(f['after']) or 'none'}"
            + (f"; new: {', '.join(f['added'])}" if f["added"] else "")
            + (f"; gone: {', '.join(f['removed'])}" if f["removed"] else ""))
    env = doc["environment"]
    if env["differs"]:
        c.print("[yellow]environment differs[/] (" + "; ".join(env["differs"]) + "): absolute times may not compare")
    if env["unknown"]:
        c.print("environment unknown: " + ", ".join(env["unknown"]))
