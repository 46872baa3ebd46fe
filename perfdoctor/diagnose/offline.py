"""`perfdoctor report`'s pipeline: path -> traces -> analyses -> report document."""

from __future__ import annotations

from perfdoctor.analyze.pipeline import analyze
from perfdoctor.report.document import build_document
from perfdoctor.trace.loader import find_trace_files, load_trace


def diagnose_path(path: str) -> dict:
    analyses = [analyze(load_trace(f)) for f in find_trace_files(path)]
    return build_document(str(path), analyses)
