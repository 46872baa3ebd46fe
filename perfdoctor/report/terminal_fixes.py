"""The terminal report's fixes: the top ones on the one-screen report, every one in full with
--details (the ranked ones with their expected gain, then those worth a look), each with the gain
`perfdoctor tune` measured where its JSON is given (`report --tune`, `report TUNE_DIR`)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from perfdoctor.report.labels import (NONE_MODELLED, SAME_SHARE, WORTH_A_LOOK, cite, off_bottleneck_note, overlapping,
                                      unranked_gain)
from perfdoctor.report.sanitize import terminal as T
from perfdoctor.report.termtext import code as _code, elsewhere as _elsewhere, line as _line, para as _para
from perfdoctor.report.tune_labels import measured_by_rule, tune_measured
from perfdoctor.rules.gain import times

TOP = 3          # fixes in the one-screen report


def no_fix(c: Console, of: str | None, blank: bool = True) -> None:
    """'No fix ... applies to this trace.' (after a blank line); nothing where nothing was measured."""
    if of:
        if blank:
            c.print()
        c.print(Text(f"No fix with a measurable speed-up applies to {of}.", style="bold"))


def _gain_column(g: dict) -> str:
    """'~2.56x (max 4.19x)  ', padded to one width: the numbers come before the title, so a
    narrow terminal cuts the title, never the gain."""
    exp, cap = g.get("expected"), g.get("ceiling")
    head = f"~{times(exp)}" if exp else "?"
    tail = f" (max {times(cap)})" if cap else ""
    return f"{head + tail:<18}  "


def _measured(c: Console, trial: dict | None, indent: int) -> None:
    """'measured by tune: 0.66x (95% CI 0.55-0.82; slower)' under a fix tune measured."""
    if trial:
        _line(c, Text.assemble((" " * indent + "measured by tune: ", "dim"), (T(tune_measured(trial)), "bold")))


def top_fixes(c: Console, doc: dict, none_of: str | None, tune: dict | None = None) -> list[str]:
    """The one screen's fixes; returns the ids it showed."""
    findings = doc["findings"]
    measured = measured_by_rule(tune)
    ranked = [f for f in findings if f["ranked"]]
    if not findings:
        no_fix(c, none_of)
        return []
    c.print()
    if ranked:
        c.print(Text("Top fixes (~ expected gain, max: its ceiling, ? no model)", style="bold"))
        if note := off_bottleneck_note(doc):
            _para(c, note, 4, "dim")
    else:           # only fixes whose gain no model bounds: still the advice there is
        c.print(Text(f"{NONE_MODELLED} (? no model, ~ expected, max: its ceiling)", style="bold"))
    shown = ranked[:TOP] + [f for f in findings if not f["ranked"]][:max(0, TOP - len(ranked))]
    for i, f in enumerate(shown, 1):
        if ranked and i == len(ranked) + 1:      # the rest of the screen: fixes no model ranks
            _line(c, Text(f"    {WORTH_A_LOOK}:", style="dim"))
        _top_line(c, doc, i, f, measured, shown[:i - 1])
    later = _measured_later(ranked, findings, shown, measured)
    if later:
        _line(c, Text("    measured faster by tune, further down the ranking:", style="dim"))
    for i, f in later:
        _top_line(c, doc, i, f, measured, shown)
    shown += [f for _, f in later]
    rest = len(findings) - len(shown)
    if rest:
        _line(c, Text(f"    + {rest} more (--details, or `perfdoctor rules show ID`)", style="dim"))
    if _tie_broken(ranked[:TOP]):
        _line(c, Text("    (gains within 2% of each other: the fix on the verdict's bottleneck first)", style="dim"))
    return [f["id"] for f in shown]


def _top_line(c: Console, doc: dict, i: int, f: dict, measured: dict, above: list[dict]) -> None:
    """' 1. ~1.19x (max 1.35x)  PD348 Title' and what tune measured of it under the rule id; a fix
    whose share overlaps one listed above it says so."""
    same = overlapping(f, above)
    _line(c, Text.assemble((f" {i}. ", "bold"), (_gain_column(f.get("gain") or {}), "green"), (T(f["id"]), "dim"),
                           _elsewhere(doc, f), (T(f" {f['title']}"), "bold"),
                           (f" ({T(SAME_SHARE.format(same))})" if same else "", "dim")))
    _measured(c, measured.get(f["id"]), 24)


def _measured_later(ranked: list[dict], findings: list[dict], shown: list[dict],
                    measured: dict) -> list[tuple[int, dict]]:
    """The fixes tune measured faster that the top ones leave out, with their places in the ranking
    (a nanoGPT tune: a 40x ceiling ranked above the one fix measured faster, which the one screen
    then hid under "+1 more"). Slower and inconclusive ones stay under --details: the one screen
    keeps its length."""
    order = ranked + [f for f in findings if not f["ranked"]]
    return [(i, f) for i, f in enumerate(order, 1) if (measured.get(f["id"]) or {}).get("status") == "faster"
            and all(f is not g for g in shown)]


def _tie_broken(ranked: list[dict]) -> bool:
    """A shown fix ranked above one with a larger expected gain: rules.engine.rank_key's near-tie
    bucket put the verdict's bottleneck first (a user read 1.13x above 1.14x as a mistake)."""
    gains = [(f.get("gain") or {}).get("expected") or 0.0 for f in ranked]
    return any(b > a for a, b in zip(gains, gains[1:]))


def fixes(c: Console, doc: dict, none_of: str | None, tune: dict | None = None) -> None:
    findings = doc["findings"]
    measured = measured_by_rule(tune)
    ranked = [f for f in findings if f["ranked"]]
    rest = [f for f in findings if not f["ranked"]]
    if not findings:
        no_fix(c, none_of)
        return
    c.print()
    if ranked:
        c.print(Text("Fixes, ranked by expected gain (a model of the change, never above its "
                     "ceiling: the Amdahl bound on the measured share)", style="bold"))
        if note := off_bottleneck_note(doc):
            _para(c, note, 2, "dim")
    else:
        no_fix(c, none_of, blank=False)
    for i, f in enumerate(ranked, 1):
        same = overlapping(f, ranked[:i - 1])
        _line(c, Text.assemble((T(f" {i}. {f['title']}"), "bold"), _elsewhere(doc, f),
                               (f" ({T(SAME_SHARE.format(same))})" if same else "", "dim")))
        _fix_body(c, f, measured=measured.get(f["id"]))
    if rest and all(f.get("summary") and f.get("fix") for f in rest):
        # in full as the ranked ones (--details: every fix with its evidence and code)
        c.print(Text(f"  Also {WORTH_A_LOOK}:", style="bold"))
        for f in rest:
            gain = unranked_gain(f)[2:]          # "expected ~1.00x, at most 1.01x", or ""
            _line(c, Text.assemble((T(f"  - {f['title']}"), "bold"), (f" ({T(gain)})" if gain else "", "dim"),
                                   _elsewhere(doc, f)))
            _fix_body(c, f, gain=False, measured=measured.get(f["id"]))
    elif rest:
        said = [f"{f['title']} ({f['id']}{unranked_gain(f)})"
                + (f", measured by tune: {tune_measured(m)}" if (m := measured.get(f["id"])) else "") for f in rest]
        _para(c, f"Also {WORTH_A_LOOK}: " + "; ".join(said), 2, "dim")
    c.print(Text("  `perfdoctor rules show ID`: the full fix, its gain model and assumption.", style="dim"))


def _fix_body(c: Console, f: dict, gain: bool = True, measured: dict | None = None) -> None:
    """A fix in full under its title: its gain (ranked ones) and tune's measurement, what was
    measured, the fix and its code, its rule and source."""
    if gain and (f.get("gain") or {}).get("text"):
        _para(c, f["gain"]["text"], 4, "green")
    _measured(c, measured, 4)
    _para(c, f["summary"], 4)
    _para(c, f"fix: {_first_sentence(f['fix']['text'])}", 4)
    if f["fix"].get("snippet"):
        _code(c, f["fix"]["snippet"], 6)
    _para(c, f"[{f['id']} · {cite(f['source'])}]", 4, "dim")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end == -1 else text[: end + 1]
