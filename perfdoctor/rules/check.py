"""Run each rule's own test cases: metrics in, fires or not, gain range out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from perfdoctor.analyze import registry
from perfdoctor.rules import expr
from perfdoctor.rules.engine import Diagnosis, _fire, _gain
from perfdoctor.rules.loader import load_rules
from perfdoctor.rules.model import Rule


@dataclass
class CaseResult:
    rule: Rule
    name: str
    ok: bool
    message: str


def check_rules(directory: Path | None) -> tuple[list[CaseResult], int]:
    """`perfdoctor rules check [DIR]`: the case results of the built-in rules, or of the rules in
    DIR only (loaded beside the built-in ones, as --rules does), and how many rules ran. Raises
    RulesInvalid for a file that is not a valid rule."""
    rules = load_rules([str(directory)] if directory else [])
    if directory is not None:
        root = str(directory.resolve())
        rules = [r for r in rules if str(Path(r.path).resolve()).startswith(root)]
    return [res for r in rules for res in run_cases(r)], len(rules)


def run_cases(rule: Rule) -> list[CaseResult]:
    out = []
    for case in rule.cases:
        values = dict.fromkeys(registry.REGISTRY)
        values["verdict.bound"] = None
        values.update(dict.fromkeys(_flag_names(rule)))     # unknown unless the case sets them, as in the engine
        values.update(case.metrics)
        diag = Diagnosis(verdict=None)
        ev = expr.Evaluator(values)
        finding = _fire(rule, diag, ev)
        fired = finding is not None
        if fired != case.fires:
            why = f" (unknown: {', '.join(diag.skipped[0][1]) or 'a comparison met None'})" if diag.skipped else ""
            out.append(CaseResult(rule, case.name, False, f"expected fires={case.fires}, got {fired}{why}"))
            continue
        if fired and (case.gain is not None or case.expected is not None):
            _gain(finding, ev)
            problem = None
            for what, want, got in (("ceiling", case.gain, finding.ceiling),
                                    ("expected gain", case.expected, finding.expected)):
                if want == () and got is not None:              # expected = []: unknown
                    problem = f"{what} {got}, where the case expects it unknown ({finding.gain_text})"
                    break
                if want and (got is None or not want[0] <= got <= want[1]):
                    problem = f"{what} {got} outside [{want[0]}, {want[1]}] ({finding.gain_text})"
                    break
            if problem:
                out.append(CaseResult(rule, case.name, False, problem))
                continue
        out.append(CaseResult(rule, case.name, True, "ok"))
    return out


def _flag_names(rule: Rule) -> list[str]:
    """The `flag.<slug>` names a rule's condition and gain model read."""
    g = rule.gain
    texts = [rule.when] + ([g.share, g.speedup, g.expected_share or "", g.expected_speedup or "", g.unprofiled_share or "",
                            g.unbounded or "", *(g.expected_range or ()), *g.let.values()] if g else [])
    return sorted({n for t in texts for n in re.findall(r"\bflag\.\w+", t or "")})
