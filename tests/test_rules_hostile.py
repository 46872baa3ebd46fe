"""Rules from users are data (issue 12): hostile conditions and templates are refused when the
rule file is loaded, naming the file and the rule id; what passes evaluates within a time and
size bound (no `**`, no sequence arithmetic, bounded literals, depth and length)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from perfdoctor.analyze import registry
from perfdoctor.rules import expr
from perfdoctor.rules.loader import RulesInvalid, load_rules

KNOWN = set(registry.REGISTRY) | {"verdict.bound"}

RULE = '''id = "PD990"
slug = "hostile"
kind = "flag"
title = "hostile"
devices = ["any"]
when = {when}
summary = {summary}

[source]
article = "a"
section = "b"

[[cases]]
name = "fires"
metrics = {{ "share.input" = 0.9, "input.loader" = "single_process" }}
fires = true

[[cases]]
name = "quiet"
metrics = {{ "share.input" = 0.1 }}
fires = false
'''

HOSTILE = {
    "huge exponent": "share.input >= 10**10**10",
    "string repetition": "share.input >= 0 and 'a' * 1000000000 != ''",
    "tuple repetition": "share.input >= 0 and (1,) * 1000000000 != ()",
    "attribute access": "share.input.__class__ != 0",
    "dunder on a function": "min.__self__ != 0 or share.input >= 0",
    "list comprehension": "share.input >= 0 and [x for x in (1, 2)] != []",
    "generator expression": "share.input >= 0 and max(x for x in (1, 2)) > 0",
    "lambda": "share.input >= (lambda: 0)()",
    "call to a name not whitelisted": "share.input >= len('ab')",
    "import": "__import__('os').system('true') == 0 or share.input >= 0",
    "subscript": "share.input >= (1, 2)[0]",
    "walrus": "(x := share.input) >= 0",
    "f-string": "f'{share.input}' != ''",
    "huge integer literal": "share.input >= " + "9" * 5000,
    "integer beyond 1e18": "share.input * 100000000000000000000 >= 0",
    "deep nesting": "not " * 100 + "share.input >= 0",
    "parser bomb": "-" * 200000 + "share.input",
    "long string literal": "share.input >= 0 and input.loader != '" + "a" * 1000 + "'",
    "keyword argument": "max(share.input, key=abs) >= 0",
    "starred argument": "max(*(share.input, 1)) >= 0",
}


def write_rule(tmp_path, when: str, summary: str = "x {share.input:pct}"):
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    f = d / "PD990-hostile.toml"
    q = lambda s: "'''" + s + "'''"
    f.write_text(RULE.format(when=q(when), summary=q(summary)))
    return d, f


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_condition_is_refused_at_load(tmp_path, name):
    d, f = write_rule(tmp_path, HOSTILE[name])
    t0 = time.monotonic()
    with pytest.raises(RulesInvalid) as exc:
        load_rules([d])
    assert time.monotonic() - t0 < 5
    p = exc.value.problems[0]
    assert p.path == str(f) and p.rule_id == "PD990" and "when" in p.message
    assert len(str(exc.value)) < 1000          # one line, the expression cut short


@pytest.mark.parametrize("spec", ["{share.input:>1000000000}", "{share.input:.999999f}", "{share.input!z}",
                                  "{share.input", "{}", "{share.input.__class__}", "{share.input[0]}"])
def test_hostile_summary_template_is_refused(tmp_path, spec):
    d, f = write_rule(tmp_path, "share.input >= 0.5", "x " + spec)
    with pytest.raises(RulesInvalid) as exc:
        load_rules([d])
    p = exc.value.problems[0]
    assert p.path == str(f) and p.rule_id == "PD990"


def test_rules_check_names_file_and_rule_and_exits_2(tmp_path):
    d, f = write_rule(tmp_path, HOSTILE["string repetition"])
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "check", str(d)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert f"{f}: PD990: when: arithmetic on strings" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_rules_directory_names_no_rule():
    """A problem of no rule (a directory not found, a file that is not TOML) read `nosuch: ?:
    rules directory not found`: the `?` stood for a rule id there is none of."""
    from perfdoctor.rules.loader import RulesInvalid, load_rules
    with pytest.raises(RulesInvalid) as e:
        load_rules(["nosuch-dir"])
    # nor is it an invalid rule (`rules check /nosuchdir` said "invalid rule /nosuchdir: ...")
    assert str(e.value) == "nosuch-dir: rules directory not found" and e.value.exit_code == 2


def test_evaluation_is_bounded_in_time_and_size():
    """What the loader lets through (metric values may be strings) cannot blow up: a string
    metric repeated is capped and reads as unknown, like a division by zero or an overflow."""
    ev = expr.Evaluator({"input.loader": "x" * 100, "share.input": 0.0, "machine.cpu_count": 10 ** 17})
    for text in ("input.loader * 99999", "input.loader + input.loader", "1 / share.input",
                 "machine.cpu_count * machine.cpu_count * machine.cpu_count * machine.cpu_count"
                 " * machine.cpu_count * machine.cpu_count * machine.cpu_count * machine.cpu_count"
                 " * machine.cpu_count * machine.cpu_count * machine.cpu_count * machine.cpu_count"
                 " * machine.cpu_count * machine.cpu_count * machine.cpu_count * machine.cpu_count * 1e300"):
        expr.metric_names(text, KNOWN | {"input.loader"})
        t0 = time.monotonic()
        try:
            v = ev.eval(text)
        except TypeError:                    # the engine's "unknown"
            v = None
        assert time.monotonic() - t0 < 1
        assert v is None or len(str(v)) <= expr.MAX_RESULT_CHARS


def test_a_rule_whose_model_divides_by_zero_is_unknown_not_a_crash(tmp_path):
    from perfdoctor.rules.engine import evaluate
    d, _ = write_rule(tmp_path, "share.input >= 1 / share.device")
    rules = [r for r in load_rules([d]) if r.id == "PD990"]
    diag = evaluate(rules, {"share.input": 0.5, "share.device": 0.0})
    assert diag.skipped == [("PD990", [])] and not diag.flags     # undecided, listed under skipped


def test_builtin_rules_stay_within_the_bounds():
    rules = load_rules()
    assert rules and max(len(expr.normalize(r.when)) for r in rules) < expr.MAX_EXPR_CHARS / 4


def test_a_severity_outside_high_medium_low_is_refused(tmp_path):
    d, f = write_rule(tmp_path, "share.input >= 0.5")
    f.write_text(f.read_text().replace('kind = "', 'severity = "<img src=x onerror=alert(1)> \\u001b]52;c;x\\u0007"\nkind = "', 1))
    with pytest.raises(RulesInvalid) as exc:
        load_rules([d])
    assert any("severity" in p.message for p in exc.value.problems)
