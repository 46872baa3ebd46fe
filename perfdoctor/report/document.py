"""The report document: the versioned, JSON-serialisable result of a diagnosis.

Schema (version SCHEMA_VERSION; documented in README "JSON output"):
{
  "schema_version": 1, "tool": "perfdoctor 0.1.0", "input": PATH,
  "verdict": {bound, confidence, confidence_label, summary, evidence, secondary, notes},
  "flags": [{id, title, severity, summary, evidence, traces}],
  "traces": [{path, label, rank, metrics{name: value}, verdict, flags,
              steps[{label, start_ms, duration_ms, breakdown_ms{role: ms}}],
              idle_gaps[{step, offset_ms, duration_ms, kind, host_activity, host_event}],
              memory_timeline{t_ms, reserved_bytes, allocated_bytes} | null, notes, warnings}],
  "cross_rank": null | {count, step_time_median_ms{label: ms}, spread, slowest, fastest, verdicts, agree},
  "units": {metric name: unit}
}
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

from perfdoctor import __version__
from perfdoctor.analyze import registry
from perfdoctor.analyze.pipeline import TraceAnalysis
from perfdoctor.analyze.ranks import overall_bound, summarize
from perfdoctor.analyze.timeline import BREAKDOWN
from perfdoctor.diagnose.flags import Flag, flags_for
from perfdoctor.diagnose.verdict import Verdict, decide

SCHEMA_VERSION = 1


def trace_label(a: TraceAnalysis, index: int) -> str:
    r = a.metrics.get("trace.rank")
    return f"rank {r}" if r is not None else os.path.basename(a.path) or f"trace {index}"


def build_document(input_path: str, analyses: list[TraceAnalysis]) -> dict:
    traces, verdicts, flag_lists = [], [], []
    labels = _unique([trace_label(a, i) for i, a in enumerate(analyses)])
    for a, label in zip(analyses, labels):
        v = decide(a.metrics)
        fl = flags_for(a.metrics, a.gaps)
        verdicts.append(v)
        flag_lists.append(fl)
        traces.append(_trace_doc(a, label, v, fl))
    cross = None
    if len(analyses) == 1:
        verdict = verdicts[0]
    else:
        rs = summarize(labels, [a.metrics for a in analyses], [v.bound for v in verdicts])
        cross = asdict(rs)
        slow = labels.index(rs.slowest)
        bound = overall_bound([v.bound for v in verdicts], slow)
        base = verdicts[slow] if verdicts[slow].bound == bound else next(v for v in verdicts if v.bound == bound)
        verdict = Verdict(bound, min(v.confidence for v in verdicts if v.bound == bound),
                          f"[{sum(v.bound == bound for v in verdicts)}/{len(verdicts)} ranks] {base.summary}",
                          base.evidence, base.secondary, list(base.notes))
        if not rs.agree:
            verdict.notes.append("ranks disagree: " + ", ".join(f"{k}: {b}" for k, b in rs.verdicts.items()))
        if rs.spread > 0.05:
            verdict.notes.append(f"step time differs by {100 * rs.spread:.0f}% across ranks "
                                 f"(slowest {rs.slowest}, fastest {rs.fastest})")
    return _clean({
        "schema_version": SCHEMA_VERSION, "tool": f"perfdoctor {__version__}", "input": input_path,
        "verdict": _verdict_doc(verdict), "flags": _merge_flags(labels, flag_lists),
        "traces": traces, "cross_rank": cross,
        "units": {name: m.unit for name, m in registry.REGISTRY.items()},
    })


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def _verdict_doc(v: Verdict) -> dict:
    return {"bound": v.bound, "confidence": v.confidence, "confidence_label": v.confidence_label,
            "summary": v.summary, "evidence": v.evidence, "secondary": v.secondary, "notes": v.notes}


def _flag_doc(f: Flag) -> dict:
    return {"id": f.id, "title": f.title, "severity": f.severity, "summary": f.summary, "evidence": f.evidence}


def _merge_flags(labels: list[str], flag_lists: list[list[Flag]]) -> list[dict]:
    """One entry per flag id; the evidence of the first trace raising it, and which traces did."""
    merged: dict[str, dict] = {}
    for label, fl in zip(labels, flag_lists):
        for f in fl:
            d = merged.setdefault(f.id, {**_flag_doc(f), "traces": []})
            d["traces"].append(label)
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(merged.values(), key=lambda d: order[d["severity"]])


def _trace_doc(a: TraceAnalysis, label: str, v: Verdict, fl: list[Flag]) -> dict:
    s = a.steps
    steps = [{"label": s.labels[i], "start_ms": (s.start[i] - s.start[0]) / 1e3,
              "duration_ms": (s.end[i] - s.start[i]) / 1e3,
              "breakdown_ms": dict(zip(BREAKDOWN, a.step_breakdown_ms[i].tolist()))}
             for i in range(len(s))]
    return {"path": a.path, "label": label, "rank": a.metrics.get("trace.rank"),
            "metrics": a.metrics, "verdict": _verdict_doc(v), "flags": [_flag_doc(f) for f in fl],
            "steps": steps, "idle_gaps": [asdict(g) for g in a.gaps],
            "memory_timeline": a.memory_series or None, "notes": a.notes, "warnings": a.warnings}


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
