"""The HTML report's fix and flag cards: each ranked fix with its expected gain against its
ceiling as a bar, the gain `perfdoctor tune` measured and its check of the fix's model, the
fix's text and code, its model and source; the fixes worth a look; the `perfdoctor tune`
command that measures them; the flags."""

from __future__ import annotations

from perfdoctor.report.labels import (NO_FIX, NONE_MODELLED, SAME_SHARE, WORTH_A_LOOK, cite, from_other_traces,
                                      off_bottleneck_note, overlapping, unranked_gain)
from perfdoctor.report.tune_labels import MEASURE_FIXES, measured_by_rule, tune_hint, tune_measured
from perfdoctor.report.sanitize import html as H
from perfdoctor.rules.gain import times

SEV_COLOUR = {"high": "#c0392b", "medium": "#d68910", "low": "#2874a6"}


def saved_share(speedup: float) -> float:
    """The share of the step time a speed-up removes, 1 - 1/speedup (0 for none or a slowdown): the
    gain bar's scale, the same for every report, so 2x fills half the bar whatever else is listed."""
    return max(0.0, 1.0 - 1.0 / speedup) if speedup and speedup > 0 else 0.0


def _gain_bar(g: dict, measured: dict | None) -> str:
    """Expected gain (dark) inside its ceiling (light), measured gain (a mark), as the share of the
    step time each removes (saved_share): a fixed scale, not one stretched to the largest ceiling
    of the report, where a 1.5x fix listed alone filled the bar and a 1.9x fix beside a 13x
    ceiling drew as a sliver."""
    ceil = g.get("ceiling") or 0.0
    exp = g.get("expected")
    if not ceil and not exp and not measured:
        return ""
    parts = []
    if ceil:
        parts.append(f"<i style=\"width:{100 * saved_share(ceil):.1f}%;background:#cfe8d9\" "
                     f"title=\"ceiling {times(ceil)}: {100 * saved_share(ceil):.0f}% of the step time\"></i>")
    if exp:
        parts.append(f"<i style=\"width:{100 * saved_share(exp):.1f}%;background:#2e8b57\" "
                     f"title=\"expected {exp:.2f}x: {100 * saved_share(exp):.0f}% of the step time\"></i>")
    if measured:
        parts.append(f"<i style=\"width:{100 * saved_share(measured['speedup']):.1f}%;background:none;border-right:3px solid #1f2328;"
                     f"border-radius:0\" title=\"measured {measured['speedup']:.2f}x\"></i>")
    return f"<div class=\"gbar\">{''.join(parts)}</div>"


def _model_check(mc: dict | None) -> str:
    """Tune's check of this fix's model against the measurement (tune/modelcheck.py), under the
    measured gain: 'agrees', or where the report's numbers were wrong, in what way."""
    if not mc:
        return ""
    return f"<div class=\"small\">model check: {H(mc.get('text'))}</div>"


def from_note(doc: dict, item: dict) -> str:
    """' (from a.json, b.json)' after a fix or flag of a report on several traces that the shown trace lacks."""
    where = from_other_traces(doc, item)
    return f" <span class=\"dim small\">(from {H(where)})</span>" if where else ""


def fixes_section(doc: dict, tune: dict | None) -> str:
    findings = doc["findings"]
    ranked = [f for f in findings if f["ranked"]]
    rest = [f for f in findings if not f["ranked"]]
    measured = measured_by_rule(tune)
    marked = any(f["id"] in measured for f in ranked)       # a card below draws tune's mark
    cards = []
    for i, f in enumerate(ranked, 1):
        g = f.get("gain") or {}
        meas = measured.get(f["id"])
        mtxt = ""
        if meas:
            speed, _, interval = tune_measured(meas).partition(" ")
            mtxt = (f"<div><b>measured by tune: {H(speed)}</b> {H(interval)} with {H(meas.get('label'))}</div>"
                    + _model_check(meas.get("model_check")))
        model = (f"<p class=\"dim small\">model: {H(g.get('model'))}; assumption: {H(g.get('assumption'))}</p>"
                 if g.get("model") else "")
        same = overlapping(f, ranked[:i - 1])
        same = f"<div class=\"dim small\">{H(SAME_SHARE.format(same))}</div>" if same else ""
        cards.append(
            f"<section class=\"card fix\"><h3>{i}. {H(f['title'])}{from_note(doc, f)}</h3><div class=\"gain\">{H(g.get('text') or '')}</div>"
            + same
            + _gain_bar(g, meas) + mtxt + _fix_body(f) + model + _source(f) + "</section>")
    head = ("<h2>Fixes, ranked by expected gain</h2><p class=\"dim small\">The expected gain models the change; it never "
            "exceeds its ceiling (light bar: the Amdahl bound on the measured share). A bar's length is the share of the step "
            "time the change removes (1 - 1/speed-up: 1.25x a fifth, 2x half, 4x three quarters)"
            + ("; the black mark is the speed-up tune measured." if marked else ".") + "</p>"
            + (f"<p class=\"small\"><b>{H(note)}</b></p>" if (note := off_bottleneck_note(doc)) else "")
            if ranked else f"<h2>Fixes</h2><p>{H(NONE_MODELLED + '.' if rest else NO_FIX)}</p>")
    more = (f"<section class=\"card\"><b>Also {H(WORTH_A_LOOK)}</b><ul class=\"notes\">"
            + "".join(_worth_a_look(doc, f, measured.get(f["id"])) for f in rest) + "</ul></section>") if rest else ""
    cmd = tune_hint(doc) if tune is None else None     # with tune's JSON the cards show what it measured
    measure = (f"<section class=\"card\"><b>{H(MEASURE_FIXES.capitalize())}</b>"
               f"<pre><code>{H(cmd)}</code></pre></section>") if cmd else ""
    return head + "".join(cards) + more + measure


def _worth_a_look(doc: dict, f: dict, meas: dict | None) -> str:
    """A fix worth a look: its title, id and ceiling, and, unfolded on a click, what was measured,
    the fix and its code, and its source."""
    line = (f"{H(f['title'])} <span class=\"dim\">({H(f['id'])}{H(unranked_gain(f))})</span>"
            + (f", measured by tune: <b>{H(tune_measured(meas))}</b>" if meas else "") + from_note(doc, f))
    body = _fix_body(f)
    return f"<li><details><summary>{line}</summary>{body}{_source(f)}</details></li>" if body else f"<li>{line}</li>"


def _fix_body(f: dict) -> str:
    """What was measured, the fix and its code: a ranked fix's card and a fix worth a look alike."""
    fix = f.get("fix") or {}
    return ((f"<p>{H(f['summary'])}</p>" if f.get("summary") else "")
            + (f"<p><b>Fix:</b> {H(fix['text'])}</p>" if fix.get("text") else "")
            + (f"<pre><code>{H_block(fix['snippet'])}</code></pre>" if fix.get("snippet") else ""))


def _source(f: dict) -> str:
    return f"<div class=\"dim small\">{H(f['id'])} · {H(cite(f.get('source') or {}))}</div>"


def H_block(s: str) -> str:
    """A multi-line snippet: escaped, its newlines kept."""
    return "\n".join(H(line) for line in str(s).rstrip().splitlines())


def flags_section(doc: dict) -> str:
    flags = doc["flags"]
    if not flags:
        return ""
    items = "".join(f"<div class=\"flag\" style=\"border-color:{SEV_COLOUR.get(f['severity'], '#999')}\"><b>{H(f['title'])}</b> "
                    f"<span class=\"dim\">({H(f['severity'])}, {H(f['id'])})</span>{from_note(doc, f)}<div>{H(f['summary'])}</div></div>"
                    for f in flags)
    return f"<h2>Flags</h2><section class=\"card\">{items}</section>"
