"""[gain.let]: names a rule's gain expressions share (rules/loader.py, expr.Evaluator.scope)."""

from __future__ import annotations

import textwrap

import pytest

from perfdoctor.analyze import registry
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import RulesInvalid, load_rules

RULE = '''
id = "PD991"
slug = "test-let"
kind = "fix"
targets = ["input"]
title = "A fix whose model names its parts"
devices = ["any"]
when = "share.input >= 0.1"
summary = "waits {share.input:pct}"

[gain]
share = "wait"
speedup = "inf"
assumption = "the wait goes"
label = "data wait"
expected_speedup = "wait / max(1e-6, wait - half)"
model = "half the wait is left"

[gain.let]
wait = "max(0, share.input - (loop.peek_order_share or 0))"
half = "wait / 2"

[fix]
text = "Load in parallel."

[source]
article = "000_b401e2bda0f90be3.txt"
section = "tip 2"

[[cases]]
name = "waits 40%, 10% of it the sampler's"
metrics = { "share.input" = 0.4, "loop.peek_order_share" = 0.1 }
fires = true
gain = [1.42, 1.43]
expected = [1.17, 1.18]

[[cases]]
name = "no wait"
metrics = { "share.input" = 0.0 }
fires = false
'''


def _rules(tmp_path, text: str = RULE):
    (tmp_path / "PD991-test-let.toml").write_text(textwrap.dedent(text))
    return load_rules([tmp_path])


def _metrics(**kw) -> dict:
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"share.device": 0.1, "share.host": 0.1, "share.communication": 0.0, "steps.count": 5,
              "steps.source": "ProfilerStep", "trace.platform": "cpu"})
    m.update(kw)
    return m


def test_names_are_evaluated_in_order_for_that_rules_gain(tmp_path):
    rules = _rules(tmp_path)
    rule = next(r for r in rules if r.id == "PD991")
    assert rule.gain.let == {"wait": "max(0, share.input - (loop.peek_order_share or 0))", "half": "wait / 2"}
    # the metrics behind the names count as the expressions' own (evidence of a measured share)
    assert rule.gain.share_names == ["share.input", "loop.peek_order_share"]
    from perfdoctor.rules.check import run_cases
    assert [(c.name, c.ok, c.message) for c in run_cases(rule)] == [
        ("waits 40%, 10% of it the sampler's", True, "ok"), ("no wait", True, "ok")]   # its ceiling and expected gain
    d = evaluate(rules, _metrics(**{"share.input": 0.4, "loop.peek_order_share": 0.1}))
    f = next(f for f in d.fixes if f.rule.id == "PD991")
    assert f.share == pytest.approx(0.3) and f.ceiling == pytest.approx(1 / 0.7)
    assert f.expected == pytest.approx(1 / (1 - 0.3 + 0.15))        # half the wait is left
    # a name whose metric is unknown is unknown, and so is the model that uses it
    d = evaluate(rules, _metrics(**{"share.input": 0.4, "loop.peek_order_share": "x"}))
    f = next(f for f in d.fixes if f.rule.id == "PD991")
    assert f.share is None and f.expected is None and f.ceiling is None


def test_a_name_is_no_other_rules_and_not_the_conditions(tmp_path):
    other = RULE.replace('"PD991"', '"PD992"').replace('"test-let"', '"test-let-2"').replace(
        '[gain.let]\nwait = "max(0, share.input - (loop.peek_order_share or 0))"\nhalf = "wait / 2"\n', '')
    (tmp_path / "PD992-test-let-2.toml").write_text(other)
    with pytest.raises(RulesInvalid, match="unknown metric 'wait'"):
        _rules(tmp_path)                               # PD992 uses wait without defining it
    uses_in_when = RULE.replace('when = "share.input >= 0.1"', 'when = "wait >= 0.1"')
    (tmp_path / "PD992-test-let-2.toml").unlink()
    with pytest.raises(RulesInvalid, match="unknown metric 'wait'"):
        _rules(tmp_path, uses_in_when)


@pytest.mark.parametrize("name,why", [
    ("share", "metric group"), ("min", "function"), ("inf", "constant"), ("Wait", "lower-case"),
    ("a" * 40, "short"), ("x-y", "identifier")])
def test_names_that_would_shadow_a_metric_a_function_or_a_constant_are_refused(tmp_path, name, why):
    text = RULE.replace('half = "wait / 2"', f'"{name}" = "1"')
    with pytest.raises(RulesInvalid, match="is no name a rule can define"):
        _rules(tmp_path, text)


def test_a_name_may_use_only_the_names_before_it(tmp_path):
    text = RULE.replace('wait = "max(0, share.input - (loop.peek_order_share or 0))"\nhalf = "wait / 2"',
                        'half = "wait / 2"\nwait = "max(0, share.input - (loop.peek_order_share or 0))"')
    with pytest.raises(RulesInvalid, match="gain.let.half: unknown metric 'wait'"):
        _rules(tmp_path, text)
    not_a_table = RULE.replace('[gain.let]\nwait = "max(0, share.input - (loop.peek_order_share or 0))"\n'
                               'half = "wait / 2"\n', '').replace('share = "wait"', 'share = "share.input"\nlet = 3')
    with pytest.raises(RulesInvalid, match="gain.let must be"):
        _rules(tmp_path, not_a_table.replace('"wait / max(1e-6, wait - half)"', '"2"'))


def test_expected_with_says_the_setting_the_expected_gain_assumes(tmp_path):
    text = RULE.replace('label = "data wait"', 'label = "data wait"\nexpected_with = "with {half:.2f} of the step left waiting"')
    rules = _rules(tmp_path, text)
    d = evaluate(rules, _metrics(**{"share.input": 0.4, "loop.peek_order_share": 0.1}))
    f = next(f for f in d.fixes if f.rule.id == "PD991")
    assert f.setting == "with 0.15 of the step left waiting"
    assert f.gain_text.startswith("expected ~1.18x with 0.15 of the step left waiting (1.00-1.43x), at most 1.43x")
    # a name it uses is unknown: no setting (the gain itself is unknown here too)
    d = evaluate(rules, _metrics(**{"share.input": 0.4, "loop.peek_order_share": "x"}))
    assert next(f for f in d.fixes if f.rule.id == "PD991").setting is None
    with pytest.raises(RulesInvalid, match=r"expected_with uses unknown names \['halves'\]"):
        _rules(tmp_path, text.replace("{half:.2f}", "{halves:.2f}"))
    no_model = text.replace('expected_speedup = "wait / max(1e-6, wait - half)"\nmodel = "half the wait is left"\n', "")
    with pytest.raises(RulesInvalid, match="expected_with names the setting of an expected-gain model"):
        _rules(tmp_path, no_model.replace("\nexpected = [1.17, 1.18]", ""))


def test_pd301_names_the_worker_count_its_expected_gain_assumes():
    """The H100 corpus loader: the fix's text had said 'num_workers equal to the free cores' (2.38)
    where the model assumes 8 workers (the trainer's own loading cores move to them); measured 3.5x
    with 8. With workers already, the count is theirs plus the free cores the model adds."""
    rules = load_rules()
    h100 = {"share.input": 0.82, "input.num_workers_zero": True, "machine.free_cores": 2.38, "machine.cpu_count": 16,
            "system.cpu_busy_share": 0.85, "loader.trainer_cpu_mean": 13.6}
    f = next(f for f in evaluate(rules, _metrics(**h100)).fixes if f.rule.id == "PD301")
    assert f.setting == "with num_workers=8" and "expected ~3.5" in f.gain_text and "with num_workers=8 (" in f.gain_text
    more = {**h100, "input.num_workers_zero": False, "loader.workers": 2, "machine.free_cores": 2.0}
    f = next(f for f in evaluate(rules, _metrics(**more)).fixes if f.rule.id == "PD301")
    assert f.setting == "with num_workers=4" and f.expected is not None
