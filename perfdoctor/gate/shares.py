"""The gate's share rows (gate.SHARES: the traced data wait, the idle device): regression when a
share grows by at least --min-share AND beyond the baselines' noise (gate.py's docstring), with
three guards, each from a user trial:

- a share is of its step: one that grew while the step got shorter can mean the same wait or less
  (2 workers: the traced data wait 33% -> 82% while the step fell 46 -> 25 ms and the wait per
  traced step 42 -> 17 ms). The share times its traced steps' mean is the time per step: where it
  did not grow (or, for a share that fell, did not fall), the row passes and says why.
- baselines whose shares are so far apart that the noise threshold reaches 100 points (2 baselines
  at 33% and 95%: ±137 pts) can tell no change: inconclusive, not pass.
- a current share inside the baselines' own range is "within the baselines' range", which is
  what the row checked (it had said "not beyond the noise" beside a change 4x its threshold).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.gate.load import RunData
from perfdoctor.gate.rows import IMPROVEMENT, INCONCLUSIVE, PASS, REGRESSION, GateOptions, Row, _pct
from perfdoctor.stats import speedups
from perfdoctor.stats.speedups import wait_share_change

STEP_MS = "steps.time_mean_ms"      # the traced steps' mean: the steps the shares are of


def _per_step_ms(r: RunData, key: str) -> float | None:
    v, t = r.metrics.get(key), r.metrics.get(STEP_MS)
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) and x >= 0 for x in (v, t))
    return float(v) * float(t) if ok else None


def _time_moved_with(cur: RunData, bases: list[RunData], key: str, diff: float) -> tuple[float, float] | None:
    """(baselines' median, current) time per traced step of the share, where the share moved one
    way and its time per step did not follow (grew: the time did not grow; fell: did not fall);
    None otherwise or where a step time is unknown."""
    c = _per_step_ms(cur, key)
    bs = [_per_step_ms(b, key) for b in bases if b.metrics.get(key) is not None]
    if c is None or not bs or any(b is None for b in bs):
        return None
    b = float(np.median(bs))
    return (b, c) if (diff > 0 and c <= b) or (diff < 0 and c >= b) else None


def share_row(cur: RunData, bases: list[RunData], key: str, label: str, opt: GateOptions) -> Row | None:
    cv = cur.metrics.get(key)
    bv = [b.metrics.get(key) for b in bases]
    bv = [v for v in bv if v is not None]
    if cv is None and not bv:
        return None                                  # e.g. gpu.idle_share of CPU-only runs
    name = f"{label} ({key})"
    if cv is None or not bv:
        return Row(name, _pct(float(np.median(bv)) if bv else None), _pct(cv), "", "", INCONCLUSIVE,
                   f"{label} unknown on one side")
    arr = np.array(bv, dtype=float)
    center = float(np.median(arr))
    diff = cv - center
    need = opt.min_share
    evidence = "threshold only"
    ok_evidence = True
    spread_of = ""
    if len(arr) > 1:
        need = max(opt.min_share, opt.noise_k * speedups.spread(arr))
        ok_evidence = cv > arr.max() if diff > 0 else cv < arr.min()
        evidence = f"{len(arr)} baselines"
        spread_of = f"the baselines' range {_pct(float(arr.min()))}-{_pct(float(arr.max()))}"
    elif key == "share.input" and cur.steps and bases[0].steps:
        b, c = bases[0].steady, cur.steady
        if b.n >= opt.min_steps and c.n >= opt.min_steps and b.wait_share is not None and c.wait_share is not None:
            d, (lo, hi) = wait_share_change(b, c, level=opt.level)
            ok_evidence = lo > 0 if diff > 0 else hi < 0
            evidence = (f"steady-window data wait {_pct(b.wait_share)} -> {_pct(c.wait_share)}, "
                        f"CI{100 * opt.level:.0f} of the change {100 * lo:+.0f} to {100 * hi:+.0f} pts")
    # a change within a point of its threshold gets a decimal: "+10 pts" beside "±10 pts" and pass
    # read as a contradiction (+9.83)
    near = abs(abs(100 * diff) - 100 * need) < 1
    chg = f"{100 * diff:+.{1 if near else 0}f} pts"
    thr = f"±{100 * need:.{1 if near and need * 100 != round(need * 100) else 0}f} pts"
    values = {"baseline": center, "current": cv, "change": diff, "threshold": need, "evidence": evidence}
    words = f"{label} {_pct(center)} -> {_pct(cv)}"
    if abs(diff) >= opt.min_share and (moved := _time_moved_with(cur, bases, key, diff)) is not None:
        values["per_step_ms"] = {"baseline": moved[0], "current": moved[1]}
        how = "grew as the step got shorter" if diff > 0 else "fell as the step got longer"
        return Row(name, _pct(center), _pct(cv), chg, thr, PASS,
                   f"{words}: the share {how}; its time per traced step {moved[0]:.3g} -> {moved[1]:.3g} ms", values)
    if need >= 1.0:
        return Row(name, _pct(center), _pct(cv), chg, thr, INCONCLUSIVE,
                   f"{words}: the baselines' shares differ too much to tell a change ({spread_of})", values)
    if abs(diff) >= need and ok_evidence:
        status = REGRESSION if diff > 0 else IMPROVEMENT
        return Row(name, _pct(center), _pct(cv), chg, thr, status, f"{words} ({evidence})", values)
    if abs(diff) >= need:
        why = f"within {spread_of}" if spread_of else f"not beyond the noise ({evidence})"
        return Row(name, _pct(center), _pct(cv), chg, thr, INCONCLUSIVE, f"{words} but {why}", values)
    return Row(name, _pct(center), _pct(cv), chg, thr, PASS, f"{words}, within {thr}", values)
