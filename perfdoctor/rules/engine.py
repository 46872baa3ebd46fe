"""Evaluate rules over one trace's metrics: verdict, flags, then ranked fixes.

Order: verdict rules by priority (the first that fires gives the verdict), then flag rules,
then fix rules. Later stages can refer to earlier results as metrics: `verdict.bound` and
`flag.<slug_with_underscores>` (true, false, or unknown when its own condition could not be
evaluated; false where the flag does not apply to the platform). Conditions use three-valued logic:
`True or unknown` fires, `False or unknown` and `not unknown` are unknown, and an unknown condition
never fires (its missing metrics are listed in `skipped`). Each fix carries a ceiling (the Amdahl bound, gain.py) and, when its rule
models it, an expected gain (never above the ceiling). Ranking (rank_key): modelled fixes by
expected gain, the bottleneck the verdict names breaking near-ties (fix the bottleneck before
anything else: 003 tip 0); fixes with only a ceiling, or no measurable gain, are listed after
them as worth a look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from perfdoctor.rules import expr
from perfdoctor.rules.gain import MIN_REPORTED_GAIN, amdahl, calibrated_range, describe
from perfdoctor.rules.model import Rule, target_of

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Finding:
    rule: Rule
    summary: str
    evidence: dict[str, Any]
    ceiling: float | None = None           # Amdahl bound of the step speed-up (None: unbounded / unknown)
    expected: float | None = None          # the model's expected step speed-up, <= ceiling
    low: float | None = None               # expected range: the model's, widened to gain.MODEL_ERROR
    high: float | None = None
    model_range: tuple[float, float] | None = None   # the model's own range (its expected_range), if any
    gain_text: str | None = None
    share: float | None = None
    speedup: float | None = None
    ceiling_share: float | None = None     # the share the ceiling uses: at most share x run.trace_inflation
    lets: dict[str, Any] = field(default_factory=dict)   # its gain's [gain.let] values (the model's inputs)
    setting: str | None = None             # what the expected gain assumes is done (gain.expected_with)

    on_bottleneck: bool = False           # the fix targets the class the verdict names

    @property
    def gain(self) -> float | None:
        """The figure the fix is ranked by: expected when modelled, else the ceiling."""
        return self.expected if self.expected is not None else self.ceiling

    @property
    def modelled(self) -> bool:
        return self.expected is not None

    @property
    def ranked(self) -> bool:
        """Only a modelled gain is ranked; a fix with just a ceiling is listed as worth a look."""
        g = self.expected
        return g is not None and math.isfinite(g) and g >= MIN_REPORTED_GAIN


@dataclass
class Diagnosis:
    verdict: Finding | None
    flags: list[Finding] = field(default_factory=list)
    fixes: list[Finding] = field(default_factory=list)       # ranked: highest bound first
    skipped: list[tuple[str, list[str]]] = field(default_factory=list)   # (rule id, unknown metrics)


class _Unknown(Exception):
    pass


def evaluate(rules: list[Rule], metrics: dict[str, Any], given: dict[str, Any] | None = None) -> Diagnosis:
    """`given`: [gain.let] values to use instead of the rules' own (tune's prediction for the
    setting a trial tries: rules/tunable.py knob_lets)."""
    platform = metrics.get("trace.platform") or "any"
    values = dict(metrics)
    values["verdict.bound"] = None
    applicable = [r for r in rules if r.applies_to(platform)]
    for r in rules:
        if r.kind == "flag":       # unknown until evaluated; a flag that cannot apply here is false
            values[r.flag_name] = None if r.applies_to(platform) else False
    diag = Diagnosis(verdict=None)
    ev = expr.Evaluator(values)

    for r in sorted((r for r in applicable if r.kind == "verdict"), key=lambda r: (r.priority, r.id)):
        f = _fire(r, diag, ev)
        if f is not None:
            diag.verdict = f
            ev.set("verdict.bound", r.bound)
            break
    for r in (r for r in applicable if r.kind == "flag"):
        unknown_before = len(diag.skipped)
        f = _fire(r, diag, ev)
        if f is not None:
            diag.flags.append(f)
        if len(diag.skipped) == unknown_before:       # evaluated: true or false; else stays unknown
            ev.set(r.flag_name, f is not None)
    bottleneck = target_of(values["verdict.bound"])
    # An inconclusive verdict means too little was measured for any share to be evidence.
    fix_rules = [] if ev.values.get("verdict.bound") == "inconclusive" else [r for r in applicable if r.kind == "fix"]
    for r in fix_rules:
        f = _fire(r, diag, ev)
        if f is not None:
            _gain(f, ev, given)
            f.on_bottleneck = bottleneck in r.targets
            diag.fixes.append(f)
    diag.flags.sort(key=lambda f: (SEVERITY_ORDER.get(f.rule.severity, 3), f.rule.id))
    diag.fixes.sort(key=rank_key)
    return diag


def rank_key(f: Finding):
    """Ranked (modelled) fixes by expected gain, the verdict breaking near-ties (gains within 2%
    of each other are one bucket): it orders, it never hides a fix. Then the fixes with only a
    ceiling, by ceiling."""
    return order_key(f.ranked, f.gain, f.on_bottleneck, f.rule.id)


def order_key(ranked: bool, gain: float | None, on_bottleneck: bool, rule_id: str):
    """rank_key's order from plain values (the report document sorts merged entries with it).
    Among the fixes with only a ceiling, one whose ceiling is under MIN_REPORTED_GAIN comes after
    those without one: it cannot pay off here, an unknown gain may."""
    g = gain if gain is not None and math.isfinite(gain) else 0.0
    bucket = -round(math.log(g) / math.log(1.02)) if ranked and g > 0 else 0
    negligible = not ranked and gain is not None and gain < MIN_REPORTED_GAIN
    return (not ranked, negligible, bucket, not on_bottleneck, -g, rule_id)


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


def _gain(f: Finding, ev: expr.Evaluator, given: dict[str, Any] | None = None) -> None:
    g = f.rule.gain
    if g is None:
        return
    with ev.scope(g.let, given) as lets:     # the rule's [gain.let] names, for its gain's expressions only
        f.lets = lets
        _gain_in_scope(f, g, ev)


def _gain_in_scope(f: Finding, g, ev: expr.Evaluator) -> None:
    try:
        share = float(ev.eval(g.share))
        speedup = float(ev.eval(g.speedup))
    except (TypeError, ValueError):
        return                   # a number the model needs is unknown: no claim
    f.share, f.speedup = max(share, 0.0), speedup
    if share <= 0 or speedup <= 1:
        f.ceiling = f.expected = 1.0
        f.gain_text = f"no measurable gain ({g.label} is {100 * max(share, 0.0):.1f}% of each step)"
        return
    # Work the share measures (ops, kernels, copies, Python) takes no longer un-profiled, while the
    # step may take less, so its share of an un-profiled step is at most share x inflation. Not for
    # waits (they grow when the host gets faster) or shares measured un-profiled (py-spy stacks).
    # Where the run timed the same share on un-profiled steps, that share is the one to use.
    unprofiled = _optional_share(ev, g.unprofiled_share)
    inflation = _trace_inflation(ev) if g.work and unprofiled is None else 1.0
    f.ceiling_share = min(1.0, share * inflation) if unprofiled is None else unprofiled
    ceiling = amdahl(f.ceiling_share, speedup)
    # gain.unbounded: where the fix changes the rest of the step too, the share bounds nothing
    unbounded = g.unbounded is not None and _holds(g.unbounded, ev)
    f.ceiling = None if math.isinf(ceiling) or unbounded else ceiling
    _expected(f, ev, share if unprofiled is None else unprofiled, inflation)
    f.setting = _setting(f, ev)
    f.gain_text = describe(f.expected, f.low, f.high, f.ceiling, share, g.label, f.ceiling_share,
                           unprofiled is not None, g.unbounded_reason if unbounded else None, f.setting)


def _setting(f: Finding, ev: expr.Evaluator) -> str | None:
    """gain.expected_with rendered with the metrics and the gain's [gain.let] values: None without
    an expected gain, or where a value it names is unknown."""
    text = f.rule.gain.expected_with
    if text is None or f.expected is None:
        return None
    values = {**ev.values, **f.lets}
    if any(values.get(n) is None for n in expr.template_names(text)):
        return None
    try:
        return expr.render_template(text, values)
    except (TypeError, ValueError):
        return None


def _holds(text: str, ev: expr.Evaluator) -> bool:
    """A gain's condition: true only when it evaluates true (an unknown metric keeps the default)."""
    try:
        return _truth(text, ev)
    except _Unknown:
        return False


def _optional_share(ev: expr.Evaluator, text: str | None) -> float | None:
    """A share the rule may have (gain.unprofiled_share): None when it has none or it is unknown."""
    if text is None:
        return None
    try:
        v = ev.eval(text)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return min(max(float(v), 0.0), 1.0) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _trace_inflation(ev: expr.Evaluator) -> float:
    """run.trace_inflation when the run measured it (>= 1), else 1."""
    v = ev.values.get("run.trace_inflation")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 1 else 1.0


def _expected(f: Finding, ev: expr.Evaluator, share: float, inflation: float) -> None:
    """The expected gain: the rule's model, never above the ceiling; unknown inputs: no model.
    `inflation`: what the ceiling allows the share to grow by un-profiled (1 for waits)."""
    g = f.rule.gain
    if g.expected_speedup is None:
        return
    cap = f.ceiling if f.ceiling is not None else math.inf

    def at(speedup_text: str, on: float) -> float:
        s = float(ev.eval(speedup_text))
        return min(amdahl(on, s) if s > 0 else 1.0, cap)

    try:
        es = share if g.expected_share is None else float(ev.eval(g.expected_share))
        es = min(max(es, 0.0), 1.0)
        exp = at(g.expected_speedup, es)
        # the high end also allows the share to be as large un-profiled as the ceiling does
        lo, hi = ((at(g.expected_range[0], es), at(g.expected_range[1], min(1.0, es * inflation)))
                  if g.expected_range else (None, None))
    except (TypeError, ValueError, ZeroDivisionError):
        return
    if not math.isfinite(exp):
        return
    f.expected = max(exp, 1.0)
    if lo is not None and hi is not None and math.isfinite(lo):
        f.model_range = (min(max(lo, 1.0), f.expected), max(hi, f.expected))
    f.low, f.high = calibrated_range(f.expected, *(f.model_range or (None, None)), f.ceiling)
