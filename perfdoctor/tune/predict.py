"""What the baseline's report tells `perfdoctor tune`: the facts its plan starts from
(tune/plan.py), the fix rule each trial tests and that rule's expected gain (the prediction a
trial's measurement is set against), and the verdict in its badge's words."""

from __future__ import annotations

import os

from perfdoctor.rules.gain import stacked
from perfdoctor.rules.tunable import KNOB_RULES, WORKERS_RULE, knob_lets
from perfdoctor.tune import plan as planmod


def _metrics(doc: dict) -> dict:
    return (doc.get("traces") or [{}])[0].get("metrics") or {}


def verdict_title(doc: dict) -> str:
    """The baseline report's verdict in its badge's words (COMPUTE-BOUND (CPU), not 'device')."""
    from perfdoctor.report.labels import bound_title
    bound = (doc.get("verdict") or {}).get("bound")
    return bound_title(bound, _metrics(doc)) if bound else "unknown"


def facts(doc: dict, fixes: dict, b) -> planmod.Facts:
    """The plan's facts from the report (`doc`, its fixes by id) and the baseline run `b`
    (inject.json's loader, optimizers, threads; child.json's CUDA)."""
    m = _metrics(doc)
    inj = b.inject
    loaders = inj.get("loaders") or []
    bound, wait = (doc.get("verdict") or {}).get("bound"), getattr(b.estimate, "wait_share", None)
    return planmod.Facts(
        cores=int(m.get("machine.cpu_count") or os.cpu_count() or 1),
        cuda=bool(b.child.get("cuda_available")),
        verdict=bound,
        data_wait=wait,
        loader=loaders[0]["asked"] if loaders else None,
        optimizers=inj.get("optimizers") or [],
        threads=inj.get("threads"),
        checkpoints=int(inj.get("checkpoint_calls") or 0),
        empty_cache_calls=int(inj.get("empty_cache_calls") or 0),
        frequent_saves="PD350" in fixes,
        fp64=bool(m.get("params.fp64_share")),
        half="PD368" in fixes,
        compiled=bool(m.get("fusion.compiled")),
        graph_replay=bool((fixes.get("PD311") or {}).get("ranked")),
        ranked=[i for i, f in fixes.items() if f.get("ranked") and f.get("kind", "fix") == "fix" and _material(f)
                and _outweighs_the_wait(f, bound, wait)],
        contended="cpu-contention" in {f.get("slug") for f in doc.get("flags") or []},
        other_cores=m.get("system.other_cores"),
        demand=m.get("loader.threads_oversubscription"),
        worker_cores=_worker_cores(m),
        saturated="PD309" in fixes,
        nchw="PD342" in fixes or "PD392" in fixes,
        peeks="PD355" in fixes,
        per_sample="PD358" in fixes,
        preprocess="PD306" in fixes,
        anomaly="PD374" in fixes,
        distribution_checks="PD379" in fixes,
        sdpa_dropout="PD381" in fixes,
        small_batch="PD385" in fixes,
        gathers="PD386" in fixes,
        host_faults="PD393" in fixes)


def _material(fix: dict) -> bool:
    """A ranked fix that may gain a material step time (its ceiling, else its expected gain, at
    least 1 + MIN_EFFECT; unknown counts): one below orders no trial group before the verdict's
    (a fused optimizer at ~1.02x, max 1.04x, took an input-bound tune's budget before its loader
    trials ran)."""
    from perfdoctor.tune.measure import MIN_EFFECT

    return _may_gain(fix, 1 + MIN_EFFECT)


def _outweighs_the_wait(fix: dict, bound, wait) -> bool:
    """On an input-bound verdict, a ranked fix off the bottleneck orders a trial group before the
    verdict's (the loader, preprocessing, ...) only where it may gain as much as the data wait's
    Amdahl bound, 1 / (1 - wait): a user's tabular loop waited 81% of its steps for samples built
    from Python values (stored once: 2.7x in tune's bound, 3.5x by hand), and its budget went to
    optimizer=fused (PD338 ~1.12x, max 1.14x) before store_samples. Its ceiling, else its expected
    gain, is set against the bound; an unknown one keeps its place."""
    if fix.get("on_bottleneck") is True or not str(bound or "").startswith("input") \
            or not isinstance(wait, (int, float)) or not 0 < wait < 1:
        return True
    return _may_gain(fix, 1 / (1 - wait))


def _may_gain(fix: dict, bar: float) -> bool:
    """The fix's ceiling, else its expected gain, reaches `bar`; an unknown one may."""
    g = fix.get("gain") or {}
    top = g.get("ceiling") if g.get("ceiling") is not None else g.get("expected")
    return not isinstance(top, (int, float)) or top >= bar


def _worker_cores(m: dict) -> float | None:
    """The cores the script's DataLoader workers kept busy (their count x each one's mean)."""
    n, each = m.get("loader.workers"), m.get("loader.worker_cpu_mean")
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (n, each))
    return float(n) * float(each) if ok and n > 0 else None


def prediction(t: planmod.Trial, fixes: dict, applicable: set[str] | None,
               cuda: bool | None = None) -> tuple[str | None, float | None]:
    """The fix rule a trial tests and its expected gain. A combined trial tests several: its
    rule reads "PD338+PD346" (so no single fix is credited with its measurement) and its
    prediction is theirs combined (gain.stacked: their savings add, or multiply where their shares
    overlap), unknown if any one is unknown; with a
    change that no rule predicts here, it has neither."""
    def expected(rule):
        return ((fixes.get(rule) or {}).get("gain") or {}).get("expected") if rule else None
    ranked = {i for i, f in fixes.items() if f.get("ranked")}
    if t.group != "combined" and not _stacked(t.changes):
        rule = planmod.rule_for(t.changes, set(fixes), applicable, ranked, t.tests)
        if cuda is False and t.changes == {"optimizer": "foreach"}:
            # PD338's gain on the CPU is the fused step's (its fix: "on the CPU use fused only";
            # foreach measured 0.8-1.19x there): a foreach trial had been shown fused's 1.06x and
            # "agreed" with it at 1.00x [0.95, 1.06]. It still tests PD338, with no model.
            return rule, None
        return rule, expected(rule)
    parts = [planmod.rule_for({k: v}, set(fixes), applicable, ranked) for k, v in t.changes.items()]
    if None in parts:
        return None, None
    rules = list(dict.fromkeys(parts))
    gains = {(fixes.get(r) or {}).get("slug") or r: (fixes.get(r) or {}).get("gain") or {} for r in rules}
    both = stacked(gains, lambda g: g.get("expected")) if rules else None
    return "+".join(rules) or None, both


def _stacked(changes: dict) -> bool:
    """Changes that different fixes test, stacked in one trial (autocast on float32 for a float64
    model): predicted as those fixes combined, like a combined trial. Changes that share a rule
    (num_workers with persistent_workers: PD301) test that one rule."""
    tested = [set(KNOB_RULES.get(k, ())) for k in changes]
    return len(tested) > 1 and all(a.isdisjoint(b) for i, a in enumerate(tested) for b in tested[i + 1:])


def applicable(doc: dict, f: planmod.Facts | None, rule_dirs) -> set[str] | None:
    """Ids of the rules that apply on the baseline's device (None: unknown, all of them)."""
    from perfdoctor.rules.loader import load_rules
    platform = _metrics(doc).get("trace.platform") or ("cuda" if f and f.cuda else "cpu")
    try:
        return {r.id for r in load_rules(rule_dirs) if "any" in r.devices or platform in r.devices}
    except Exception:
        return None


def _rule_finding(doc: dict, rule_dirs, rule_id: str, given: dict | None = None):
    """The rule's finding over the baseline report's metrics (with `given` [gain.let] values),
    or None when the rule is not found or does not fire."""
    from perfdoctor.rules.engine import evaluate
    from perfdoctor.rules.loader import load_rules
    try:
        rules = [r for r in load_rules(rule_dirs) if r.id == rule_id]
    except Exception:
        return None
    if not rules:
        return None
    from perfdoctor.analyze.registry import REGISTRY
    values = dict.fromkeys(REGISTRY)               # unknown unless the report has it, as in the run's diagnosis
    values.update(_metrics(doc))
    fixes = evaluate(rules, values, given).fixes
    return fixes[0] if fixes else None


def modelled_workers(doc: dict, rule_dirs) -> float | None:
    """The worker count WORKERS_RULE's model credits the baseline's loader with (its let
    `workers`: the free cores, or up to 8 for a loader that waits rather than computes)."""
    f = _rule_finding(doc, rule_dirs, WORKERS_RULE)
    w = f.lets.get("workers") if f is not None else None
    return float(w) if isinstance(w, (int, float)) else None


def trial_gain(doc: dict, rule_dirs, rule: str | None, changes: dict, current_workers: int) -> dict | None:
    """WORKERS_RULE's gain for the worker count a trial tries, the report's metrics otherwise
    unchanged: {"expected", "range", "ceiling"} as the report's fix holds them; None for another
    rule or setting (the report's own gain stands)."""
    if rule != WORKERS_RULE:
        return None
    own = _rule_finding(doc, rule_dirs, rule)
    given = knob_lets(changes, current_workers, own.lets) if own is not None else None
    f = _rule_finding(doc, rule_dirs, rule, given) if given else None
    if f is None:
        return None
    return {"expected": f.expected, "range": [f.low, f.high] if f.low is not None else None, "ceiling": f.ceiling}
