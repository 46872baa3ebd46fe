"""Renderers of a GateResult: rich table, GitHub step summary (markdown) and workflow commands,
JUnit XML, JSON."""

from __future__ import annotations

import os
from pathlib import Path
from xml.etree import ElementTree as ET

from perfdoctor.errors import PerfdoctorError
from perfdoctor.gate.gate import FAILED, INCONCLUSIVE, NOT_COMPARABLE, REGRESSION, STEP_TIME, GateResult
from perfdoctor.report import sanitize

COLUMNS = ("metric", "baseline", "current", "change", "threshold", "status")
STYLE = {"pass": "green", "improvement": "green", "regression": "bold red", "failed": "bold red", "inconclusive": "yellow",
         "not comparable": "yellow", "warning": "yellow"}


def render_terminal(res: GateResult, console=None) -> None:
    from rich.table import Table
    from rich.text import Text

    text = sanitize.text
    c = console or sanitize.console()
    t = Table(title=text(f"perfdoctor gate: {res.outcome.upper()}"), title_justify="left")
    for col in COLUMNS:
        t.add_column(col, no_wrap=col in ("metric", "change", "status"))
    for r in res.rows:
        t.add_row(*(text(x) for x in (r.metric, r.baseline, r.current, r.change, r.threshold)),
                  text(r.status, style=STYLE.get(r.status, "")))
    c.print(t)
    c.print(Text.assemble((sanitize.terminal(res.outcome), STYLE.get(res.outcome, "")),
                          sanitize.terminal(f": {res.reason}")))
    if res.warning:
        c.print(text(f"warning: {res.warning}", style="yellow"))
    c.print(text(f"method: {res.method}"))
    for n in res.notes:
        c.print(text(f"  note: {n}"))


def _cell(s: str) -> str:
    return sanitize.markdown(s)


def markdown(res: GateResult) -> str:
    lines = [f"### perfdoctor gate: {res.outcome}", "", f"**{_cell(res.reason)}**", ""]
    if res.warning:
        lines += [f"Warning: {_cell(res.warning)}", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in res.rows:
        lines.append("| " + " | ".join(_cell(x) for x in (r.metric, r.baseline, r.current, r.change,
                                                           r.threshold, r.status)) + " |")
    lines += ["", f"Method: {_cell(res.method)}."] + [f"- {_cell(n)}" for n in res.notes]
    return "\n".join(lines) + "\n"


def github(res: GateResult, strict: bool = False, stream=None) -> None:
    """When GITHUB_STEP_SUMMARY is set: append the markdown table there and print workflow commands
    (::error:: for a regression or a failed script, ::warning:: for inconclusive / not comparable /
    a verdict change, and one more ::warning:: when the runs ran different commands) on `stream` (stdout; the CLI
    passes stderr with --format json so stdout stays one document)."""
    import sys

    out = stream or sys.stdout
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown(res) + "\n")
    except OSError as exc:
        raise PerfdoctorError(f"cannot append to GITHUB_STEP_SUMMARY {path}: {exc.strerror or exc}") from None
    msg = sanitize.github_data(res.reason)      # the reason quotes paths and verdicts: input
    title = f"perfdoctor gate: {res.outcome}"   # our own words (GitHub reads ': ' in a title as is)
    if res.outcome in (REGRESSION, FAILED) or (strict and res.outcome in (INCONCLUSIVE, NOT_COMPARABLE)):
        print(f"::error title={title}::{msg}", file=out, flush=True)
    elif res.outcome in (INCONCLUSIVE, NOT_COMPARABLE) or any(r.status == "warning" for r in res.rows):
        print(f"::warning title={title}::{msg}", file=out, flush=True)
    if res.warning:                             # the commands are input
        print(f"::warning title=perfdoctor gate: different commands::{sanitize.github_data(res.warning)}",
              file=out, flush=True)


def junit(res: GateResult, path: Path) -> None:
    """One testsuite "perfdoctor-gate", one testcase per gated metric: <failure> for a regression
    (and for the current run's script when it failed), <skipped> for inconclusive or not
    comparable. When the runs ran different commands, the step time's testcase says so in its
    <system-err>."""
    suite = ET.Element("testsuite", name="perfdoctor-gate", time="0")
    counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    for r in res.rows:
        x = sanitize.xml
        case = ET.SubElement(suite, "testcase", classname="perfdoctor-gate", name=x(r.metric), time="0")
        counts["tests"] += 1
        text = x(f"baseline {r.baseline}, current {r.current}, change {r.change}, threshold {r.threshold}")
        if r.status in (REGRESSION, FAILED):
            ET.SubElement(case, "failure", message=x(r.reason), type=r.status).text = text
            counts["failures"] += 1
        elif r.status in (INCONCLUSIVE, NOT_COMPARABLE):
            ET.SubElement(case, "skipped", message=x(f"{r.status}: {r.reason}"))
            counts["skipped"] += 1
        else:
            ET.SubElement(case, "system-out").text = x(f"{r.status}: {r.reason}")
        if res.warning and r.metric == STEP_TIME:
            ET.SubElement(case, "system-err").text = x(f"warning: {res.warning}")
    for k, v in counts.items():
        suite.set(k, str(v))
    try:
        ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as exc:
        raise PerfdoctorError(f"cannot write {path}: {exc.strerror or exc}") from None
