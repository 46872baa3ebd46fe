"""The terminal report's printing helpers: paragraphs that keep their indentation, code never
wrapped, one-line rows cut with an ellipsis, and where a fix or flag comes from."""

from __future__ import annotations

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from perfdoctor.report.labels import from_other_traces
from perfdoctor.report.sanitize import terminal as T, text


def para(c: Console, s: str, indent: int, style: str = "") -> None:
    """A paragraph whose wrapped lines keep its indentation (not padded to the console's width:
    a file or a pipe gets an unlimited one, sanitize.console)."""
    c.print(Padding(text(s, style=style), (0, 0, 0, indent), expand=False))


def code(c: Console, snippet: str, indent: int) -> None:
    """Code, never wrapped mid-line: a line wider than the screen is cut with an ellipsis."""
    for row in snippet.rstrip().splitlines():
        c.print(Padding(text(row, style="cyan"), (0, 0, 0, indent), expand=False), no_wrap=True, overflow="ellipsis")


def line(c: Console, t: Text) -> None:
    c.print(t, no_wrap=True, overflow="ellipsis")


def elsewhere(doc: dict, item: dict) -> tuple[str, str]:
    """' [trace a, trace b]' after the id (a narrow terminal cuts the title, not this): the
    traces a fix or flag comes from when the shown trace lacks it (labels.from_other_traces)."""
    where = from_other_traces(doc, item)
    return (f" [{T(where)}]" if where else ""), "dim"
