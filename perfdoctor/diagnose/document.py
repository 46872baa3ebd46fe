"""The report document: the versioned, JSON-serialisable result of a diagnosis.

Schema version SCHEMA_VERSION, documented in README ("JSON output"). Top level: schema_version,
tool, input, verdict, flags, findings (ranked fixes), traces (per file: metrics, steps,
idle_gaps, memory_timeline, tables (analyze/tables.py), its own verdict/flags/findings, skipped
rules; for the pictures: origin_us, the representative step's `timeline` and `marked_gaps`,
analyze/stepview.py), cross_rank, units.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

from perfdoctor import __version__
from perfdoctor.analyze import registry
from perfdoctor.analyze.pipeline import TraceAnalysis
from perfdoctor.analyze.ranks import bound_name, overall_bound, spread_text, summarize
from perfdoctor.analyze.stepview import step_dominant
from perfdoctor.analyze.timeline import BREAKDOWN
from perfdoctor.diagnose.confidence import confidence, label
from perfdoctor.rules.engine import Diagnosis, Finding, order_key
from perfdoctor.stats.steptime import ms as ms_text

SCHEMA_VERSION = 2


def trace_label(a: TraceAnalysis, index: int) -> str:
    r = a.metrics.get("trace.rank")
    return f"rank {r}" if r is not None else os.path.basename(a.path) or f"trace {index}"


def build_document(input_path: str, results: list[tuple[TraceAnalysis, Diagnosis]]) -> dict:
    labels = _unique([trace_label(a, i) for i, (a, _) in enumerate(results)])
    traces = [_trace_doc(a, d, lab) for (a, d), lab in zip(results, labels)]
    # a trace too thin to judge beside traces that were judged (the stub torch writes when the
    # profiler stops mid-cycle: one step of 0.02 ms) is listed, not compared
    judged = [i for i, t in enumerate(traces) if t["verdict"]["bound"] != "inconclusive"]
    compared = judged if judged else list(range(len(results)))
    verdict, cross = _overall_verdict(results, traces, labels, compared)
    left = [labels[i] for i in range(len(traces)) if i not in compared]
    if left:
        verdict["notes"].append(f"left out of the comparison (too little traced to judge: a stub trace?): "
                                f"{', '.join(left)}")
    return _clean({
        "schema_version": SCHEMA_VERSION, "tool": f"perfdoctor {__version__}", "input": input_path,
        "verdict": verdict, "flags": _merge(labels, [t["flags"] for t in traces], _flag_order),
        "findings": _merge(labels, [t["findings"] for t in traces], _finding_order),
        "traces": traces, "cross_rank": cross,
        "units": {name: m.unit for name, m in registry.REGISTRY.items()},
    })


def _overall_verdict(results: list[tuple[TraceAnalysis, Diagnosis]], traces: list[dict], labels: list[str],
                     compared: list[int]) -> tuple[dict, dict | None]:
    """(the document's verdict, the cross-rank summary or None): one compared trace's own
    verdict, or the majority bound of several with their disagreement and spread in its notes."""
    if len(compared) == 1:
        own = traces[compared[0]]["verdict"]
        # beside stubs left out of the comparison, the figures shown are still the judged trace's
        return dict(own, notes=list(own["notes"]), **({"figures_of": labels[compared[0]]} if len(traces) > 1 else {})), None
    # traces that carry no rank (no distributedInfo) are not called ranks: they may be
    # traces of different processes or jobs (the windows of one process were joined before)
    word = "ranks" if all(results[i][0].metrics.get("trace.rank") is not None for i in compared) else "traces"
    labs = [labels[i] for i in compared]
    bounds = [traces[i]["verdict"]["bound"] for i in compared]
    rs = summarize(labs, [results[i][0].metrics for i in compared], bounds)
    slow = labs.index(rs.slowest)
    bound = overall_bound(bounds, slow)
    src = compared[slow if bounds[slow] == bound else bounds.index(bound)]
    base = traces[src]["verdict"]
    # the figures in the summary are one trace's: say which (figures_of: the reports show that
    # trace's header and breakdown too, report/labels.shown_trace)
    verdict = {**base, "summary": f"[{bounds.count(bound)}/{len(bounds)} {word}; figures of {labels[src]}] "
                                  f"{base['summary']}",
               "confidence": min(traces[i]["verdict"]["confidence"] for i in compared
                                 if traces[i]["verdict"]["bound"] == bound),
               "notes": list(base["notes"]), "figures_of": labels[src]}
    verdict["confidence_label"] = label(verdict["confidence"])
    apart = _unrelated(results, compared, rs.spread) if word == "traces" else None
    if apart:
        verdict["notes"].insert(0, f"these traces look like different jobs ({apart}): the verdict is the majority of "
                                "their own verdicts, no one job's; read each trace's own report "
                                "(perfdoctor report FILE)")
    if not rs.agree:
        platform = {labels[i]: results[i][0].metrics.get("trace.platform") for i in compared}
        verdict["notes"].append(f"{word} disagree: " + ", ".join(f"{k}: {bound_name(b, platform[k])}"
                                                                 for k, b in rs.verdicts.items()))
    if rs.spread > 0.05:
        verdict["notes"].append(f"step time differs by {spread_text(rs.spread)} across {word} "
                                f"(slowest {rs.slowest}, fastest {rs.fastest})")
    if word == "traces" and not apart:
        verdict["notes"].append("the traces do not all carry a rank (distributedInfo): each is diagnosed on its own "
                                "(traces of different processes or jobs; the profiler windows of one process "
                                "are joined into one trace)")
    return verdict, asdict(rs)


APART = 10.0    # step times an order of magnitude apart: no one job's processes or windows


def _unrelated(results: list[tuple[TraceAnalysis, Diagnosis]], compared: list[int], spread: float) -> str | None:
    """Why traces without ranks cannot be one job's, or None: they ran on different kinds of
    device or on different GPU models, or their steps are APART times apart (one job's processes
    and one process's windows run the same step; a straggler that slow has stopped, not lagged)."""
    mets = [results[i][0].metrics for i in compared]
    why = []
    platforms = sorted({str(m.get("trace.platform")) for m in mets if m.get("trace.platform")})
    if len(platforms) > 1:
        why.append(f"{' and '.join(platforms)} traces")
    devices = sorted({str(m.get("trace.device_name")) for m in mets if m.get("trace.device_name")})
    if len(devices) > 1:
        why.append(f"devices {', '.join(devices)}")
    if 1.0 + spread >= APART:
        steps = [m["steps.time_median_ms"] for m in mets if m.get("steps.time_median_ms") is not None]
        why.append(f"steps of {ms_text(min(steps))} to {ms_text(max(steps))} ms")
    return "; ".join(why) or None


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def _verdict_doc(d: Diagnosis, m: dict) -> dict:
    v = d.verdict
    bound = v.rule.bound if v else "inconclusive"
    conf, notes, secondary = confidence(bound, m)
    return {"bound": bound, "rule": v.rule.id if v else None, "title": v.rule.title if v else "Inconclusive",
            "confidence": conf, "confidence_label": label(conf),
            "summary": v.summary if v else _no_verdict(m),
            "evidence": v.evidence if v else {}, "secondary": secondary, "notes": notes}


def _no_verdict(m: dict) -> str:
    if m.get("trace.events") is None:       # a run without a trace (--no-trace): its step timings alone
        return ("No verdict rule applies to the step timings alone (no trace: the step breakdown the other "
                "verdicts need is unknown).")
    return "No verdict rule applies to this trace (the numbers it needs are unknown)."


def _flag_doc(f: Finding) -> dict:
    r = f.rule
    return {"id": r.id, "slug": r.slug, "title": r.title, "severity": r.severity, "summary": f.summary,
            "evidence": f.evidence, "source": r.source}


def _finding_doc(f: Finding, platform: str | None = None) -> dict:
    """`platform`: the trace's (trace.platform); a CPU-only trace gets the rule's snippet_cpu, when it has
    one, instead of its snippet (no CUDA-only code such as TF32 flags or pin_memory on a CPU run). A rule
    with snippet_by shows the snippet its evidence's value names (the script's optimizer class), if any."""
    r = f.rule
    snippet = r.snippet_cpu if platform == "cpu" and r.snippet_cpu else r.snippet
    if r.snippet_by and isinstance(f.evidence.get(r.snippet_by), str):
        snippet = r.snippets.get(f.evidence[r.snippet_by], snippet)
    gain = None
    if r.gain is not None:
        gain = {"expected": f.expected, "range": [f.low, f.high] if f.low is not None else None,
                "model_range": list(f.model_range) if f.model_range else None,
                "ceiling": f.ceiling, "share": f.share, "ceiling_share": f.ceiling_share, "speedup": f.speedup, "label": r.gain.label,
                "assumption": r.gain.assumption, "model": r.gain.model, "setting": f.setting, "text": f.gain_text,
                "overlaps": r.gain.overlaps}
    return {"id": r.id, "slug": r.slug, "kind": r.kind, "title": r.title, "summary": f.summary,
            "evidence": f.evidence, "ranked": f.ranked, "modelled": f.modelled, "on_bottleneck": f.on_bottleneck, "gain": gain, "no_gain_reason": r.no_gain_reason,
            "fix": {"text": " ".join((r.fix_text or "").split()), "snippet": snippet,
                    "snippet_lang": r.snippet_lang},
            "source": r.source}


def _flag_order(d: dict):
    return ({"high": 0, "medium": 1, "low": 2}.get(d["severity"], 3), d["id"])


def _finding_order(d: dict):
    """As rules.engine.rank_key, from the document."""
    g = d.get("gain") or {}
    best = g.get("expected") if g.get("expected") is not None else g.get("ceiling")
    return order_key(d["ranked"], best, d["on_bottleneck"], d["id"])


def _merge(labels: list[str], per_trace: list[list[dict]], order) -> list[dict]:
    """One entry per rule id: the entry of the trace where it matters most, and which traces had it."""
    merged: dict[str, dict] = {}
    for lab, items in zip(labels, per_trace):
        for item in items:
            cur = merged.get(item["id"])
            if cur is None or order(item) < order(cur):
                merged[item["id"]] = {**item, "traces": (cur or {}).get("traces", [])}
            merged[item["id"]]["traces"].append(lab)
    return sorted(merged.values(), key=order)


def _trace_doc(a: TraceAnalysis, d: Diagnosis, lab: str) -> dict:
    s = a.steps      # None when a live run recorded no trace
    dom = [] if s is None else step_dominant(a.step_breakdown_ms, a.metrics["trace.platform"],
                                                  getattr(a, "step_device_ms", None))
    steps = [] if s is None else [
        {"label": s.labels[i], "start_ms": (s.start[i] - s.start[0]) / 1e3,
         "duration_ms": (s.end[i] - s.start[i]) / 1e3,
         "breakdown_ms": dict(zip(BREAKDOWN, a.step_breakdown_ms[i].tolist())),
         "dominant": {"bound": dom[i][0], "share": dom[i][1]}}
        for i in range(len(s))]
    return {"path": a.path, "label": lab, "rank": a.metrics.get("trace.rank"), "metrics": a.metrics,
            "verdict": _verdict_doc(d, a.metrics), "flags": [_flag_doc(f) for f in d.flags],
            "findings": [_finding_doc(f, a.metrics.get("trace.platform")) for f in d.fixes],
            "skipped": [{"rule": rid, "unknown": names} for rid, names in d.skipped],
            "steps": steps, "idle_gaps": [asdict(g) for g in a.gaps],
            "memory_timeline": a.memory_series or None, "tables": getattr(a, "tables", None) or None,
            "origin_us": None if s is None else int(round(float(s.start[0]))), "timeline": getattr(a, "view", None),
            "marked_gaps": [asdict(g) for g in getattr(a, "marked_gaps", [])],
            "notes": a.notes, "warnings": a.warnings}


def _clean(x):
    """JSON-safe: numpy scalars to Python, NaN/inf to None, floats rounded to 6 significant digits."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float):
        return None if not math.isfinite(x) else float(f"{x:.6g}")
    return x
