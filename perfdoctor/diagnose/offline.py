"""`perfdoctor report`'s pipeline: path -> traces -> analyses -> rules -> report document.

The first trace's load starts before anything heavy is imported (or was started by the console
script already, perfdoctor.trace.prefetch): on a big trace a helper process decodes its head
while this process imports numpy, the analysis and the rules. A `perfdoctor run` directory
(run.json, steps.jsonl, samples.json, trace/) goes through the live diagnosis instead
(diagnose/live.py), so it gets what `run` gave. One trace per rank is merged as a multi-rank run's
ranks are (diagnose/ranks.py: the straggler, the pace-setting rank's verdict)."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.collect.ranks import is_multi_rank
from perfdoctor.collect.rundir import is_run_dir
from perfdoctor.trace import prefetch
from perfdoctor.errors import TraceFormatError
from perfdoctor.trace.loader import PendingLoad, find_trace_files, load_trace


def diagnose_path(path: str, rule_dirs: list[str] | None = None) -> dict:
    if is_multi_rank(path):       # ranks/rank-K/ of a multi-rank run: merged (diagnose/ranks.py)
        from perfdoctor.diagnose.ranks import diagnose_ranks
        return diagnose_ranks(Path(path), rule_dirs)
    if is_run_dir(path):          # a `perfdoctor run` directory: re-diagnosed as `run` did
        from perfdoctor.diagnose.live import diagnose_dir
        return diagnose_dir(Path(path), rule_dirs)
    skipped: list[str] = []
    files = find_trace_files(path, skipped)
    traces, first = [], None
    try:
        first = (prefetch.take(files[0]) or PendingLoad(files[0])).start()
    except TraceFormatError as exc:
        _skip(files, files[0], exc, skipped)
    try:                # its finally reaps the first load's helper whatever interrupts
        from perfdoctor.analyze.pipeline import analyze
        from perfdoctor.diagnose.document import build_document
        from perfdoctor.rules.engine import evaluate
        from perfdoctor.rules.loader import load_rules

        rules = load_rules(rule_dirs)
        if first is not None:
            try:
                traces.append(first.finish())
            except TraceFormatError as exc:
                _skip(files, files[0], exc, skipped)
    finally:
        if first is not None:
            first.close()
    for f in files[1:]:
        try:
            traces.append(load_trace(f))
        except TraceFormatError as exc:
            _skip(files, f, exc, skipped)
    if not traces:
        raise TraceFormatError(f"no trace in {path} could be read: " + _listed(skipped))
    if len(files) > 1:                  # among several files, a warning names its own
        for t in traces:
            t.meta.warnings = [f"{Path(t.meta.path).name}: {w}" for w in t.meta.warnings]
    from perfdoctor.diagnose.profwindows import join_windows
    analyses = []
    for t in join_windows(traces):
        try:
            analyses.append(analyze(t))
        except TraceFormatError as exc:      # no timed events (metadata only): skipped as a damaged file is
            if len(files) == 1:
                raise
            skipped.append(f"skipped {Path(t.meta.path).name}: {str(exc).removeprefix(f'{t.meta.path}: ')}")
    if not analyses:
        raise TraceFormatError(f"no trace in {path} could be analysed: " + _listed(skipped))
    analyses[0].warnings[:0] = skipped
    results = [(a, evaluate(rules, a.metrics)) for a in analyses]
    if len(results) > 1:          # one trace per rank: merged as a multi-rank run is (diagnose/ranks.py)
        from perfdoctor.diagnose.ranks import merge_rank_traces
        merged, why = merge_rank_traces(str(path), results, rules)
        if merged is not None:
            return merged
        if why:
            doc = build_document(str(path), results)
            doc["verdict"].setdefault("notes", []).insert(0, why)      # before what the traces differ in
            return doc
    return build_document(str(path), results)


LISTED = 3


def _listed(skipped: list[str]) -> str:
    """The first LISTED skipped files for a one-line error, then how many more (2,000 damaged
    files made a 135 KB line)."""
    more = len(skipped) - LISTED
    return "; ".join(skipped[:LISTED]) + (f"; and {more:,} more file(s) skipped" if more > 0 else "")


def _skip(files: list[Path], f: Path, exc: TraceFormatError, skipped: list[str]) -> None:
    """One damaged file among several (an empty trace of a killed rank) is skipped and named;
    a file given alone is the error, with its path."""
    if len(files) == 1:
        if str(f) in str(exc):
            raise exc
        raise TraceFormatError(f"{f}: {exc}") from None
    skipped.append(f"skipped {f.name}: {exc}")
