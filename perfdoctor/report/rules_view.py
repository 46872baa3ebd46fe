"""Rendering of `perfdoctor rules list/show/check` (formatting only)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfdoctor.report.labels import cite, cite_also
from perfdoctor.report.sanitize import console as _console, terminal as T, text
from perfdoctor.rules.check import CaseResult
from perfdoctor.rules.expr import normalize
from perfdoctor.rules.model import Rule
from perfdoctor.rules.tunable import CUDA_ONLY, OPT_IN, knobs_of

KIND_ORDER = {"verdict": 0, "flag": 1, "fix": 2}


def render_list(rules: list[Rule], console: Console | None = None) -> None:
    c = console or _console()
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for col, wrap in (("id", False), ("kind", False), ("devices", False), ("title", True), ("source", True)):
        table.add_column(col, no_wrap=not wrap, overflow="fold")
    for r in sorted(rules, key=lambda r: (KIND_ORDER[r.kind], r.id)):
        art = str(r.source.get("article"))
        art = art[:3] if art[:3].isdigit() else art   # articles are cited by their number: 000..003
        table.add_row(text(r.id), text(r.kind), text(",".join(r.devices)), text(r.title),
                      text(f"{art} · {r.source.get('section')}", style="dim"))
    c.print(table)
    c.print(Text(f"{len(rules)} rules", style="dim"))


def render_show(r: Rule, console: Console | None = None) -> None:
    c = console or _console()
    c.print(Text.assemble((T(f"{r.id} {r.slug}"), "bold"), (T(f"  ({r.kind}; devices: {', '.join(r.devices)})"), "dim")))
    c.print(text(r.title, style="bold"))
    c.print(text("file: " + r.path, style="dim"))
    c.print()
    c.print(Text("when", style="bold"))
    c.print(text("  " + normalize(r.when)))
    if r.bound:
        c.print(Text.assemble(("verdict ", "bold"), T(r.bound), (T(f"  (priority {r.priority})"), "dim")))
    c.print(Text("summary template", style="bold"))
    c.print(text("  " + r.summary))
    if r.gain:
        c.print(Text("expected gain", style="bold"))
        c.print("  step speed-up <= 1 / ((1 - f) + f / s)   (Amdahl)")
        for name, value in r.gain.let.items():           # [gain.let]: the names the expressions below use
            c.print(text(f"  where {name} = {normalize(value)}"))
        c.print(text(f"  f = {normalize(r.gain.share)}   ({r.gain.label.rstrip(',')})"))
        c.print(text(f"  s = {normalize(r.gain.speedup)}"))
        c.print(text(f"  assumption: {r.gain.assumption}"))
        if r.gain.work:
            c.print(text("  f is work: in a run directory the ceiling uses up to f x run.trace_inflation "
                         "(the profiler only lengthens work, the un-profiled step may be shorter)"))
        if r.gain.unprofiled_share:
            c.print(text(f"  where known, f timed on un-profiled steps = {normalize(r.gain.unprofiled_share)} replaces f "
                         "for the ceiling and the expected gain"))
        if r.gain.unbounded:
            c.print(text(f"  no ceiling where {normalize(r.gain.unbounded)}: {r.gain.unbounded_reason}"))
        if r.gain.expected_speedup:
            c.print(text(f"  expected: s = {normalize(r.gain.expected_speedup)} on f = "
                         f"{normalize(r.gain.expected_share or r.gain.share)}"))
            if r.gain.expected_range:
                c.print(text(f"  range: s from {normalize(r.gain.expected_range[0])} to "
                             f"{normalize(r.gain.expected_range[1])}"))
            c.print(text(f"  model: {r.gain.model}"))
            if r.gain.expected_with:
                c.print(text(f"  said beside it: expected ... {r.gain.expected_with}"))
    elif r.kind == "fix":
        c.print(Text.assemble(("expected gain ", "bold"), T(f"none claimed: {r.no_gain_reason}")))
    if r.fix_text:
        c.print(Text("fix", style="bold"))
        c.print(text("  " + " ".join(r.fix_text.split())))
    if r.snippet:
        for line in r.snippet.rstrip().splitlines():
            c.print(text("    " + line, style="cyan"))
    if r.snippet_cpu:
        c.print(text("  on a CPU-only trace, instead:"))
        for line in r.snippet_cpu.rstrip().splitlines():
            c.print(text("    " + line, style="cyan"))
    if r.snippets:
        c.print(text(f"  where {r.snippet_by} is {', '.join(r.snippets)}: that one's own snippet"))
    if r.kind == "fix" and (knobs := knobs_of(r.id)):
        flags = sorted({OPT_IN[k] for k in knobs if k in OPT_IN})
        c.print(Text("measured by", style="bold"))
        c.print(text(f"  perfdoctor tune --only {r.id}{''.join(' ' + f for f in flags)} SCRIPT [ARGS]   "
                     f"(trials: {', '.join(knobs)}"
                     + ("; CUDA only" if all(k in CUDA_ONLY for k in knobs) else "") + ")"))
    c.print(Text("source", style="bold"))
    c.print(text(f"  {r.source.get('article')}: {cite(r.source)}"))
    for also in r.source.get("also", []):
        c.print(text(f"  also: {cite_also(also)}", style="dim"))
    c.print(Text(f"test cases: {len(r.cases)} ({sum(x.fires for x in r.cases)} firing)", style="dim"))


def render_check(results: list[CaseResult], n_rules: int, console: Console | None = None) -> None:
    c = console or _console()
    failed = [x for x in results if not x.ok]
    for x in failed:
        c.print(text(f"FAIL {x.rule.path}: {x.rule.id}: case {x.name!r}: {x.message}", style="red"))
    c.print(f"{n_rules} rules valid; {len(results) - len(failed)} passed, {len(failed)} failed")
