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
    first = prefetch.take(files[0]) or PendingLoad(files[0])
    try:
        first.start()   # inside the try: its finally reaps the helper whatever interrupts
        from perfdoctor.analyze.pipeline import analyze
        from perfdoctor.diagnose.document import build_document
        from perfdoctor.rules.engine import evaluate
        from perfdoctor.rules.loader import load_rules

        rules = load_rules(rule_dirs)
        analyses = [analyze(first.finish())]
    finally:
        first.close()
    analyses += [analyze(load_trace(f)) for f in files[1:]]
    analyses[0].warnings[:0] = skipped
    results = [(a, evaluate(rules, a.metrics)) for a in analyses]
    if len(results) > 1:          # one trace per rank: merged as a multi-rank run is (diagnose/ranks.py)
        from perfdoctor.diagnose.ranks import merge_rank_traces
        merged = merge_rank_traces(str(path), results, rules)
        if merged is not None:
            return merged
    return build_document(str(path), results)
