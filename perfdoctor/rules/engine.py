"""Evaluate rules over one trace's metrics: verdict, flags, then ranked fixes.

Order: verdict rules by priority (the first that fires gives the verdict), then flag rules,
then fix rules. Later stages can refer to earlier results as metrics: `verdict.bound` and
`flag.<slug_with_underscores>` (true/false). Conditions use three-valued logic: `True or unknown` fires,
`False or unknown` is unknown, and an unknown condition never fires (its missing metrics are
listed in `skipped`). Fix gains are Amdahl bounds (gain.py). Ranking: fixes that target the
bottleneck the verdict names come first (fix the bottleneck before anything else: 003 tip 0),
each group ordered by its bound; fixes without a measurable bound come last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfdoctor.rules import expr
from perfdoctor.rules.gain import MIN_REPORTED_GAIN, amdahl, describe
from perfdoctor.rules.model import Rule, target_of

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Finding:
    rule: Rule
    summary: str
    evidence: dict[str, Any]
    gain: float | None = None              # Amdahl bound of the step speed-up
    gain_text: str | None = None
    share: float | None = None
    speedup: float | None = None

    on_bottleneck: bool = False           # the fix targets the class the verdict names

    @property
    def ranked(self) -> bool:
        return self.gain is not None and math.isfinite(self.gain) and self.gain >= MIN_REPORTED_GAIN


@dataclass
class Diagnosis:
    verdict: Finding | None
    flags: list[Finding] = field(default_factory=list)
    fixes: list[Finding] = field(default_factory=list)       # ranked: highest bound first
    skipped: list[tuple[str, list[str]]] = field(default_factory=list)   # (rule id, unknown metrics)


class _Unknown(Exception):
    pass


def dynamic_names(rules: list[Rule]) -> set[str]:
    """Names rules may use besides registered metrics."""
    return {"verdict.bound"} | {r.flag_name for r in rules if r.kind == "flag"}


def evaluate(rules: list[Rule], metrics: dict[str, Any]) -> Diagnosis:
    platform = metrics.get("trace.platform") or "any"
    values = dict(metrics)
    values["verdict.bound"] = None
    for r in rules:
        if r.kind == "flag":
            values[r.flag_name] = False
    applicable = [r for r in rules if r.applies_to(platform)]
    diag = Diagnosis(verdict=None)
    ev = expr.Evaluator(values)

    for r in sorted((r for r in applicable if r.kind == "verdict"), key=lambda r: (r.priority, r.id)):
        f = _fire(r, diag, ev)
        if f is not None:
            diag.verdict = f
            ev.set("verdict.bound", r.bound)
            break
    for r in (r for r in applicable if r.kind == "flag"):
        f = _fire(r, diag, ev)
        if f is not None:
            diag.flags.append(f)
            ev.set(r.flag_name, True)
    bottleneck = target_of(values["verdict.bound"])
    for r in (r for r in applicable if r.kind == "fix"):
        f = _fire(r, diag, ev)
        if f is not None:
            _gain(f, ev)
            f.on_bottleneck = bottleneck in r.targets
            diag.fixes.append(f)
    diag.flags.sort(key=lambda f: (SEVERITY_ORDER.get(f.rule.severity, 3), f.rule.id))
    diag.fixes.sort(key=rank_key)
    return diag


def rank_key(f: Finding):
    return (not f.ranked, not f.on_bottleneck, -(f.gain or 0.0) if f.ranked else 0.0, f.rule.id)


def _truth(text: str, ev: expr.Evaluator) -> bool:
    try:
        result = ev.eval(text)
    except TypeError:           # a comparison met None: the answer depends on a missing number
        raise _Unknown() from None
    if result is None:
        raise _Unknown()
    return bool(result)


def _fire(r: Rule, diag: Diagnosis, ev: expr.Evaluator) -> Finding | None:
    values = ev.values
    try:
        fired = _truth(r.when, ev)
    except _Unknown:
        diag.skipped.append((r.id, [n for n in r.when_names if values.get(n) is None]))
        return None
    if not fired:
        return None
    evidence = {n: values.get(n) for n in (r.evidence or r.when_names)}
    return Finding(r, expr.render_template(r.summary, values), evidence)


def _gain(f: Finding, ev: expr.Evaluator) -> None:
    g = f.rule.gain
    if g is None:
        return
    try:
        share = float(ev.eval(g.share))
        speedup = float(ev.eval(g.speedup))
    except (TypeError, ValueError):
        return                   # a number the model needs is unknown: no claim
    if share <= 0 or speedup <= 1:
        f.share, f.speedup, f.gain = max(share, 0.0), speedup, 1.0
        f.gain_text = f"no measurable gain ({g.label} is {100 * max(share, 0.0):.1f}% of each step)"
        return
    bound = amdahl(share, speedup)
    f.share, f.speedup = share, speedup
    if math.isinf(bound):
        f.gain, f.gain_text = None, f"not bounded by this trace ({g.label} is the whole step)"
        return
    f.gain, f.gain_text = bound, describe(bound, share, g.label)
