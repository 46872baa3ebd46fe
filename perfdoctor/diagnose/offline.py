"""`perfdoctor report`'s pipeline: path -> traces -> analyses -> rules -> report document."""

from __future__ import annotations

from perfdoctor.analyze.pipeline import analyze
from perfdoctor.report.document import build_document
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.trace.loader import find_trace_files, load_trace


def diagnose_path(path: str, rule_dirs: list[str] | None = None) -> dict:
    rules = load_rules(rule_dirs)
    files = find_trace_files(path)
    analyses = [analyze(load_trace(f)) for f in files]
    return build_document(str(path), [(a, evaluate(rules, a.metrics)) for a in analyses])
