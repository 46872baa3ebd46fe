"""Each measured trial set against the baseline report's model of the fix it tests.

The report gives a fix an expected gain (with a range where the model is uncertain) and an
Amdahl ceiling; a tune trial measures the change with a 95% interval. The two are compared, so
that tune says where the report's own numbers were wrong, not only which setting was fastest:

- `beats-ceiling`: the whole interval lies above the ceiling. A ceiling is the step's speed-up
  with the fix's measured share removed entirely, so a measurement above it means the share was
  under-measured or the change did more than the fix models: the bound is wrong here.
- `above` / `below`: the interval lies wholly above / below the model (its range, else its
  expected gain): the model under- or over-predicts here.
- `agrees`: the interval holds the expected gain, or meets its range.
- `missed`: the report did not raise the fix (it saw no sign of that bottleneck) and the trial
  measured faster: a gain the report did not see.
- `unmodelled`: the report offers the fix with no expected gain and no ceiling to hold it to.

Only trials that measured something decisive are checked (faster, slower, no change): an
inconclusive interval (0.04x-45x on a busy machine) agrees with every model and tells nothing.
A combined trial (rule "PD345+PD346") is held to its fixes combined, as tune predicts it
(gain.stacked for the expected gain and the range, gain.combined for the ceilings: the union of
the shares is at most their sum).
"""

from __future__ import annotations

import math

from perfdoctor.rules.gain import combined, range_text, stacked, times

CHECKED = ("faster", "slower", "no change")


def check(rule: str | None, offered: bool, status: str, ratio: float | None, ci95, fixes: dict,
          modelled: bool = True) -> dict | None:
    """{"rule", "verdict", "expected", "range", "ceiling", "text"} for one trial, or None when there is
    nothing to check (no rule tests the change, nothing decisive measured). `modelled` False: the
    rule's expected gain is not this trial's (foreach on the CPU, where PD338 models fused): only
    its ceiling holds."""
    if not rule or status not in CHECKED or ratio is None or not ci95:
        return None
    lo, hi = float(ci95[0]), float(ci95[1])
    measured = f"measured {times(ratio)} [{_x(lo)}-{_x(hi)}]"
    if not offered:
        if status != "faster":
            return None               # not raised, and no gain found: the report and the run agree
        return _out(rule, "missed", None, None, None,
                    f"not raised by the report (no sign of that bottleneck), {measured}: a gain it did not see")
    gains = {r: (fixes.get(r) or {}).get("gain") or {} for r in rule.split("+")}
    expected = stacked(gains, lambda g: g.get("expected"))
    rng = None
    if expected is not None and all(g.get("range") for g in gains.values()):
        low = stacked(gains, lambda g: g["range"][0])
        high = stacked(gains, lambda g: _num(g["range"][1]))
        rng = (low, high) if low is not None and high is not None else None
    ceilings = [g.get("ceiling") for g in gains.values()]
    ceiling = combined(ceilings) if ceilings and all(c for c in ceilings) else None
    if not modelled:
        expected, rng = None, None
    model = _model_text(expected, rng, ceiling)
    if ceiling is not None and math.isfinite(ceiling) and lo > ceiling:
        return _out(rule, "beats-ceiling", expected, rng, ceiling,
                    f"{model}, {measured}: beats its ceiling, so the share that bounds it was under-measured "
                    "or the change did more than the fix models (the bound is wrong here)")
    if expected is None:
        return _out(rule, "unmodelled", None, None, ceiling, f"{model}, {measured}")
    top, bottom = (rng[1], rng[0]) if rng else (expected, expected)
    if lo > top:
        return _out(rule, "above", expected, rng, ceiling, f"{model}, {measured}: the model under-predicts here")
    if hi < bottom:
        return _out(rule, "below", expected, rng, ceiling, f"{model}, {measured}: the model over-predicts here")
    return _out(rule, "agrees", expected, rng, ceiling, f"{model}, {measured}: agrees")


def _model_text(expected, rng, ceiling) -> str:
    parts = []
    if expected is not None:
        parts.append(f"expected ~{times(expected)}" + (range_text(*rng) if rng else ""))
    else:
        parts.append("no model of its gain")
    if ceiling is not None:
        parts.append(f"at most {times(ceiling)}" if math.isfinite(ceiling) else "no ceiling")
    return ", ".join(parts)


def _x(v: float) -> str:
    """An interval end: two decimals, whole numbers from 10 on (as gain.times)."""
    return times(v)[:-1]


def _num(x) -> float | None:
    """A range's end as a number: null (no upper end) is unbounded."""
    return math.inf if x is None else float(x)


def _r(x):
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def _out(rule, verdict, expected, rng, ceiling, text) -> dict:
    return {"rule": rule, "verdict": verdict, "expected": _r(expected), "range": [_r(rng[0]), _r(rng[1])] if rng else None,
            "ceiling": _r(ceiling), "text": text}
