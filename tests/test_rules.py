"""The rule engine and the rule catalog in rules/."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfdoctor.analyze import registry
from perfdoctor.rules import expr
from perfdoctor.rules.check import run_cases
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.gain import amdahl, combined, describe, stacked, times
from perfdoctor.rules.loader import RulesInvalid, builtin_rules_dir, load_rules

RULES = load_rules()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.id}-{r.slug}")
def test_rule_cases(rule):
    failures = [f"{c.name}: {c.message}" for c in run_cases(rule) if not c.ok]
    assert not failures, failures


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.id}-{r.slug}")
def test_rule_is_complete_and_bounded(rule):
    assert rule.source.get("article") and rule.source.get("section")
    assert any(c.fires for c in rule.cases) and any(not c.fires for c in rule.cases)
    if rule.kind != "fix":
        return
    assert rule.fix_text and (rule.gain is not None or rule.no_gain_reason)
    if rule.gain is None:
        return
    # the attacked share is a measured metric; a ceiling of the whole step (share 1: PD348, a parked
    # thread can stall any op) still rests its expected gain on a measured share
    assert rule.gain.share_names or (rule.gain.share.strip() == "1" and rule.gain.expected_names), \
        "the attacked share must be a measured metric"
    # Whatever the speed-up assumption evaluates to, the bound never exceeds removing the share.
    for share in (0.05, 0.3, 0.9):
        values = dict.fromkeys(registry.REGISTRY)
        for c in rule.cases:
            values.update(c.metrics)
        for n in rule.gain.share_names:
            values[n] = share
        ev = expr.Evaluator(values)
        try:
            with ev.scope(rule.gain.let):            # the rule's [gain.let] names
                s, sp = float(ev.eval(rule.gain.share)), float(ev.eval(rule.gain.speedup))
        except (TypeError, ValueError):
            continue
        if 0 < s < 1 and sp > 1:
            assert amdahl(s, sp) <= 1 / (1 - s) + 1e-12


def test_catalog_has_every_verdict_and_the_catalog_flags():
    bounds = {r.bound for r in RULES if r.kind == "verdict"}
    assert {"device", "input", "input_cpu", "host", "communication", "inconclusive"} <= bounds
    flags = {r.slug for r in RULES if r.kind == "flag"}
    assert {"allocator-thrashing", "idle-gpu-gaps", "host-device-sync", "pageable-copies", "num-workers-zero",
            "no-tensor-cores", "math-attention", "data-parallel", "memory-pressure", "memory-headroom",
            "unfused-optimizer", "shape-churn"} <= flags
    assert sum(r.kind == "fix" for r in RULES) >= 20


def test_every_article_is_cited():
    cited = {r.source["article"] for r in RULES} | {a for r in RULES for a in r.source.get("also", [])}
    text = " ".join(cited)
    for art in ("000_b401e2bda0f90be3.txt", "001_83940edd4f8b10bc.txt", "002_49d6f12255666ecc.txt",
                "003_7bbbd8e6e30a68ae.txt"):
        assert art in text


def test_amdahl():
    assert amdahl(0.5, math.inf) == pytest.approx(2.0)
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.0, 10.0) == 1.0
    assert amdahl(0.229, math.inf) == pytest.approx(1 / 0.771)
    assert math.isinf(amdahl(1.0, math.inf))
    assert describe(None, None, None, 1.297, 0.229, "data wait") == \
        "at most 1.30x, no model of the expected gain (data wait is 22.9% of each step)"
    assert describe(1.2, 1.1, 1.25, 1.297, 0.229, "data wait") == \
        "expected ~1.20x (1.10-1.25x), at most 1.30x (data wait is 22.9% of each step)"
    # no ceiling: the whole step is the share, which is no measurement ("... is 100.0% of each step")
    assert describe(1.53, None, None, None, 1.0, "what other jobs on the cores cost the step") == \
        "expected ~1.53x, no ceiling from this trace (nothing measured bounds what other jobs on the cores cost the step)"


def test_a_ceiling_beyond_what_a_share_can_tell_prints_as_more_than_1000x():
    """1 / (1 - 0.99993) = 14996x (pytorch/examples' regression.py): no share is measured to a
    hundredth of a percent, so from 1000x on the figure is '>1000x', in the text and the labels."""
    from perfdoctor.report.labels import unranked_gain
    assert [times(v) for v in (1.523, 13.4, 999.4, 1000.0, 14996.4)] == ["1.52x", "13x", "999x", ">1000x", ">1000x"]
    assert describe(None, None, None, 1 / (1 - 0.99993), 0.99993, "untraced time") == \
        "at most >1000x, no model of the expected gain (untraced time is 100.0% of each step)"
    assert unranked_gain({"gain": {"ceiling": 14996.4}}) == ", at most >1000x"
    assert unranked_gain({"gain": {"expected": 1.004, "ceiling": 1.3}}) == ", expected ~1.00x, at most 1.30x"


def test_fixes_applied_together_add_savings_unless_their_shares_overlap():
    """Disjoint fixes save 1 - 1/g each (1.5x and 2x: 1/3 + 1/2 saved, 6x); fixes whose shares
    overlap (either names the other in `overlaps`) multiply, and a group of them joins the rest
    as one; an unknown number makes the whole unknown."""
    a, b, c = {"expected": 1.5}, {"expected": 2.0}, {"expected": 1.2, "overlaps": ["a"]}
    pick = lambda g: g.get("expected")  # noqa: E731
    assert stacked({"a": a, "b": b}, pick) == pytest.approx(6.0) == combined([1.5, 2.0])
    assert stacked({"a": a, "c": c}, pick) == pytest.approx(1.5 * 1.2)
    assert stacked({"c": c, "a": a, "b": b}, pick) == pytest.approx(combined([1.5 * 1.2, 2.0]))
    assert stacked({"c": c, "b": b}, pick) == pytest.approx(combined([1.2, 2.0]))    # "a" not applied
    assert stacked({"a": a, "b": {"expected": None}}, pick) is None and stacked({}, pick) is None


def test_expressions_are_validated_not_evaluated_blindly():
    known = {"share.input", "verdict.bound", "machine.free_cores"}
    assert expr.metric_names("share.input >= 0.2 and verdict.bound in ('input', 'host')", known) == [
        "share.input", "verdict.bound"]
    for bad in ("__import__('os').system('x')", "share.input.__class__", "[x for x in (1, 2)]",
                "(lambda: 1)()", "share.inputs > 0", "share.input[0]", "open('f')", "share.input >=",
                "share.input > 0; share.input < 1", "x = share.input", "import os", "del share"):
        with pytest.raises(expr.ExprError):
            expr.metric_names(bad, known)


def test_three_valued_logic(tmp_path):
    """A condition that needs an unknown metric does not fire; `True or unknown` does."""
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"trace.platform": "cuda", "steps.count": 4, "steps.time_mean_ms": 10.0, "share.device": 0.5,
              "share.input": 0.1, "share.host": 0.4, "share.communication": 0.0,
              "memory.free_per_step": 2.0})   # reserved_swing unknown
    d = evaluate(RULES, m)
    assert "allocator-thrashing" in {f.rule.slug for f in d.flags}       # True or unknown
    m["memory.free_per_step"] = 0.0
    d = evaluate(RULES, m)
    assert "allocator-thrashing" not in {f.rule.slug for f in d.flags}   # False or unknown
    assert any(rid == "PD205" for rid, _ in d.skipped)


def test_an_unmeasured_flag_is_unknown_not_false():
    """PD346 asks `not flag.cpu_oversubscription`. When oversubscription could not be measured
    the flag is unknown, so is its negation, and PD346 does not fire; measured, it does."""
    assert expr.Evaluator({"a.b": None}).eval("not a.b") is None
    assert expr.Evaluator({"a.b": False}).eval("not a.b") is True
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"trace.platform": "cpu", "steps.count": 20, "steps.time_mean_ms": 50.0, "share.device": 0.9,
              "share.input": 0.0, "share.host": 0.1, "share.communication": 0.0, "machine.torch_threads": 1,
              "machine.physical_cores": 2, "machine.free_cores": 0.9, "threads.splittable_share": 0.8})
    d = evaluate(RULES, m)                         # loader.threads_oversubscription unknown
    assert "PD346" not in {f.rule.id for f in d.fixes}
    assert ("PD213", ["loader.threads_oversubscription"]) in d.skipped
    assert ("PD346", ["flag.cpu_oversubscription", "run.runq_share"]) in d.skipped
    m["loader.threads_oversubscription"] = 0.6
    d = evaluate(RULES, m)
    assert "PD346" in {f.rule.id for f in d.fixes}
    m["loader.threads_oversubscription"] = 1.8
    assert "PD346" not in {f.rule.id for f in evaluate(RULES, m).fixes}


def test_templates_render_metrics():
    assert expr.render_template("{a.b:pct} and {c:.1f} {d}", {"a.b": 0.2291, "c": 2.25, "d": None}) == \
        "22.9% and 2.2 unknown"


BROKEN = {
    "syntax": ('id = "X1"\nslug = "x"\nkind = "flag"\ntitle = [unclosed\n', "TOML syntax error"),
    "unknown_metric": ("""
        id = "X2"
        slug = "x2"
        kind = "flag"
        title = "t"
        devices = ["any"]
        when = "input.no_such_metric > 1"
        summary = "s"
        [source]
        article = "a"
        section = "s"
        [[cases]]
        metrics = {}
        fires = true
        [[cases]]
        metrics = {}
        fires = false
        """, "unknown metric 'input.no_such_metric'"),
    "missing_field": ('id = "X3"\nslug = "x3"\nkind = "fix"\n', "missing field 'title'"),
    "no_cases": ("""
        id = "X4"
        slug = "x4"
        kind = "flag"
        title = "t"
        devices = ["any"]
        when = "share.input > 0.1"
        summary = "s"
        [source]
        article = "a"
        section = "s"
        """, "needs at least one firing and one non-firing test case"),
    "duplicate": (open(RULES[0].path).read(), "duplicate id/slug"),
    "overlaps_unknown": (open(next(r.path for r in RULES if r.id == "PD342")).read()
                         .replace('id = "PD342"', 'id = "X5"').replace('slug = "channels-last"', 'slug = "x5"')
                         .replace('overlaps = ["mixed-precision"]', 'overlaps = ["no-such-fix"]'),
                         "gain.overlaps names 'no-such-fix'"),
    "unbounded_alone": (open(next(r.path for r in RULES if r.id == "PD306")).read()
                        .replace('id = "PD306"', 'id = "X6"').replace('slug = "offline-preprocessing"', 'slug = "x6"')
                        .replace('\nunbounded_reason = ', '\n# unbounded_reason = '),
                        "gain.unbounded and gain.unbounded_reason go together"),
    "unbounded_unknown": (open(next(r.path for r in RULES if r.id == "PD306")).read()
                          .replace('id = "PD306"', 'id = "X7"').replace('slug = "offline-preprocessing"', 'slug = "x7"')
                          .replace('unbounded = "trace.platform', 'unbounded = "trace.no_such'),
                          "unknown metric 'trace.no_such"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_rules_check_rejects_broken_files_with_file_and_id(tmp_path, case):
    text, message = BROKEN[case]
    (tmp_path / f"{case}.toml").write_text(textwrap.dedent(text))
    with pytest.raises(RulesInvalid) as err:
        load_rules([tmp_path])
    assert any(message in str(p) and f"{case}.toml" in p.path for p in err.value.problems)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "check", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{case}.toml" in r.stderr and message in r.stderr
    assert "Traceback" not in r.stderr


def test_rules_check_fails_on_a_wrong_case(tmp_path):
    (tmp_path / "mine.toml").write_text(textwrap.dedent("""
        id = "USR1"
        slug = "my-rule"
        kind = "flag"
        title = "mine"
        devices = ["any"]
        when = "share.input > 0.1"
        summary = "input {share.input:pct}"
        [source]
        article = "team wiki"
        section = "input budget"
        [[cases]]
        name = "claims to fire but will not"
        metrics = { "share.input" = 0.05 }
        fires = true
        [[cases]]
        metrics = { "share.input" = 0.0 }
        fires = false
        """))
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "check", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "USR1" in r.stdout and "1 failed" in r.stdout


def test_user_rules_join_the_report(tmp_path):
    import tracegen as tg
    rules_dir = tmp_path / "myrules"
    rules_dir.mkdir()
    (rules_dir / "USR2.toml").write_text(textwrap.dedent("""
        id = "USR2"
        slug = "team-input-budget"
        kind = "fix"
        targets = ["input"]
        title = "Our input budget is exceeded"
        devices = ["any"]
        when = "share.input > 0.1"
        summary = "input takes {share.input:pct}"
        [gain]
        share = "share.input"
        speedup = "2"
        assumption = "our cache halves loading time"
        label = "data wait"
        [fix]
        text = "Use the team cache."
        [source]
        article = "team wiki"
        section = "input budget"
        [[cases]]
        metrics = { "share.input" = 0.5 }
        fires = true
        gain = [1.33, 1.34]
        [[cases]]
        metrics = { "share.input" = 0.0 }
        fires = false
        """))
    trace = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=4000)] * 4), trace)
    import json
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(trace), "--rules", str(rules_dir), "-f", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    found = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    assert "USR2" in found and found["USR2"]["gain"]["ceiling"] < 2.0


def test_device_filter_keeps_cuda_advice_off_rocm_and_cpu():
    for platform in ("rocm", "cpu"):
        m = dict.fromkeys(registry.REGISTRY)
        m.update({"trace.platform": platform, "steps.count": 4, "steps.time_mean_ms": 10.0,
                  "share.device": 0.5, "share.input": 0.3, "share.host": 0.2, "share.communication": 0.0,
                  "memcpy.pageable_h2d_per_step": 4.0, "tensor_core.eligible_share": 0.9,
                  "tensor_core.kernel_share": 0.0, "trace.compute_capability": 9.0})
        d = evaluate(RULES, m)
        fired = [f.rule for f in d.flags + d.fixes]
        assert all(r.devices != ["cuda"] for r in fired), [r.id for r in fired if r.devices == ["cuda"]]


def test_rules_cli_list_and_show():
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "list"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": ""})
    assert r.returncode == 0 and "PD301" in r.stdout and "verdict" in r.stdout
    s = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "show", "loader-workers"],
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0 and "Amdahl" in s.stdout and "000_b401e2bda0f90be3.txt" in s.stdout
    assert "model: workers prepare the next batches" in " ".join(s.stdout.split())   # the expected gain's model too
    # an id in lower case is the rule (`rules show pd301` was "no rule with id or slug 'pd301'"), and
    # the articles of `also` are cited by name as the main one is, not by their file names
    low = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "show", "pd301"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
    assert low.returncode == 0 and "PD301" in low.stdout, low.stderr
    assert 'also: article 001 (Alex Dremov, "Simple ways to speed up your PyTorch model training" (2024)): data loading' \
        in low.stdout and "also: 001_" not in low.stdout
    bad = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "show", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no rule" in bad.stderr


def test_parsed_rules_are_cached_and_edits_invalidate_the_cache(tmp_path, monkeypatch):
    from perfdoctor.rules import loader as rule_loader
    rules_dir = tmp_path / "rules"
    shutil.copytree(builtin_rules_dir(), rules_dir)
    monkeypatch.setenv("PERFDOCTOR_RULES", str(rules_dir))
    monkeypatch.setenv("PERFDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    first = load_rules()
    assert len(list((tmp_path / "cache").glob("rules-*.json"))) == 1
    real_read, parsed = rule_loader._read, []
    monkeypatch.setattr(rule_loader, "_read", lambda f: (parsed.append(f.name), real_read(f))[1])
    second = load_rules()
    assert parsed == [] and [r.__dict__ for r in second] == [r.__dict__ for r in first]
    # an edit (same size even) is seen: the key is the contents, not the mtime
    victim = rules_dir / Path(first[0].path).name
    text = victim.read_text()
    victim.write_text(text.replace(f'title = "{first[0].title}"', f'title = "{first[0].title[:-1]}X"'))
    third = load_rules()
    assert parsed and third[0].title == first[0].title[:-1] + "X"
    # a corrupt cache and an unwritable cache directory only mean parsing again
    for f in (tmp_path / "cache").glob("rules-*.json"):
        f.write_bytes(b'{"version": 1, "stamp": [')
    assert [r.title for r in load_rules()] == [r.title for r in third]
    (tmp_path / "blocked").write_text("a file, not a directory")
    monkeypatch.setenv("PERFDOCTOR_CACHE_DIR", str(tmp_path / "blocked"))
    assert [r.title for r in load_rules()] == [r.title for r in third]
    monkeypatch.setenv("PERFDOCTOR_CACHE_DIR", "off")
    parsed.clear()
    load_rules()
    assert len(parsed) == len(first)


def test_naming_the_builtin_folder_again_loads_it_once():
    """`perfdoctor rules check rules` in a checkout: the same folder, not a set of duplicates."""
    builtin = load_rules()
    again = load_rules([builtin_rules_dir(), str(builtin_rules_dir()) + "/."])
    assert [r.id for r in again] == [r.id for r in builtin] and len(builtin) > 30


def test_ceilings_bound_the_share_of_an_unprofiled_step():
    """A run whose traced steps ran 1.5x longer than its steady ones: the share a fix attacks is at
    most 1.5x larger un-profiled (the profiler only adds time), so its ceiling uses that; the
    expected gain stays on the measured share. A faster traced window lowers no ceiling."""
    from perfdoctor.stats.steptime import trace_inflation
    assert trace_inflation(15.0, 10.0) == 1.5 and trace_inflation(8.0, 10.0) == 1.0
    assert trace_inflation(None, 10.0) is None and trace_inflation(12.0, 0.0) is None

    def pd312(inflation):
        m = dict.fromkeys(registry.REGISTRY)
        m.update({"trace.platform": "cpu", "steps.count": 5, "steps.time_mean_ms": 12.7, "share.device": 0.56,
                  "share.input": 0.01, "share.host": 0.43, "share.communication": 0.0, "breakdown.other": 0.43,
                  "run.trace_inflation": inflation})
        return next(f for f in evaluate(RULES, m).fixes if f.rule.id == "PD312")
    plain, inflated = pd312(None), pd312(1.5)
    assert plain.ceiling == pytest.approx(amdahl(0.43, math.inf)) and plain.ceiling_share == pytest.approx(0.43)
    assert inflated.ceiling == pytest.approx(amdahl(0.645, math.inf)) and inflated.share == pytest.approx(0.43)
    assert "43.0% of each traced step, up to 64.5% of an un-profiled one" in inflated.gain_text
    assert "of each step" in plain.gain_text and pd312(1.0).ceiling == plain.ceiling
    assert pd312(3.0).ceiling in (None, math.inf)          # the whole step: no bound
    # ... said so, not as "43.0% of each traced step, up to 100.0% of an un-profiled one"
    assert "43.0% of each traced step; the profiler slowed those steps so much that it may be nearly all of an " \
        "un-profiled one" in pd312(3.0).gain_text and "100.0%" not in pd312(3.0).gain_text
    # a wait is not work: a faster host lengthens it, so the data wait's ceiling stays as measured
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"trace.platform": "cpu", "share.input": 0.3, "input.num_workers_zero": True, "run.trace_inflation": 1.5})
    workers = next(f for f in evaluate(RULES, m).fixes if f.rule.id == "PD301")
    assert not workers.rule.gain.work and workers.ceiling == pytest.approx(amdahl(0.3, math.inf))
    # a range whose high end has no bound (the share may be the whole un-profiled step)
    assert describe(1.5, 1.2, math.inf, None, 0.9, "x").startswith("expected ~1.50x (1.20x or more), no ceiling")


def test_workers_that_take_the_models_cores_leave_the_loading_fixes_without_a_ceiling():
    """PD215 fires when the DataLoader workers use the cores the trainer queues for; then the
    data wait bounds nothing (a 2-core VM measured 2.45x without the augmentation against a 7.6%
    wait), so PD306 claims no ceiling; without the contention the wait is its Amdahl bound."""
    from perfdoctor.rules.engine import evaluate
    from perfdoctor.rules.loader import load_rules

    rules = load_rules()
    base = dict.fromkeys(registry.REGISTRY)
    base.update({"trace.platform": "cpu", "share.device": 0.889, "share.input": 0.076, "share.host": 0.035,
                 "share.communication": 0.0, "input.split": "cpu", "loader.workers": 2,
                 "loader.worker_cpu_mean": 0.51, "machine.cpu_count": 2, "machine.free_cores": 0.0,
                 "run.runq_share": 0.47, "system.other_cores": 0.03, "steps.time_median_ms": 160.0})
    busy = evaluate(rules, base)
    fix = {f.rule.id: f for f in busy.fixes}
    assert "PD215" in [f.rule.id for f in busy.flags]
    assert "PD306" in fix and fix["PD306"].ceiling is None and fix["PD306"].expected is None
    quiet = evaluate(rules, {**base, "run.runq_share": 0.02, "machine.free_cores": 1.0})
    fix = {f.rule.id: f for f in quiet.fixes}
    assert "PD215" not in [f.rule.id for f in quiet.flags]
    # on a CPU-only run the rest of the step speeds up too when the loading leaves it (gain.unbounded)
    assert fix["PD306"].ceiling is None and fix["PD306"].share == pytest.approx(0.076)
    assert fix["PD306"].gain_text.startswith("no ceiling (on a CPU-only run the rest of the step")
    assert fix["PD306"].gain_text.endswith("(data wait is 7.6% of each step)")
    gpu = evaluate(rules, {**base, "trace.platform": "cuda", "run.runq_share": 0.02, "machine.free_cores": 1.0})
    fix = {f.rule.id: f for f in gpu.fixes}
    assert fix["PD306"].ceiling == pytest.approx(1 / (1 - 0.076), rel=1e-3)


def test_rules_citing_the_four_articles_are_cited_by_author_and_title():
    """Reports cite a fix's source as 'article 003 (Eugene Khvedchenya, "Efficient PyTorch..."),
    tip 0': a user read 'article 003, tip 0' and could not tell what it was. A source outside the
    four articles (PyTorch's documentation, a user's rule) is cited as its file says."""
    from perfdoctor.report.labels import ARTICLES, cite
    rules = load_rules()
    numbered = [r for r in rules if str(r.source["article"])[:3].isdigit()]
    assert {str(r.source["article"])[:3] for r in numbered} == set(ARTICLES) and len(numbered) > 100
    for r in rules:
        said = cite(r.source)
        art = str(r.source["article"])
        assert said.startswith(f"article {art[:3]} (" if r in numbered else art), said
        assert said.endswith(f", {r.source['section']}")
    assert cite({"article": "003_7bbbd8e6e30a68ae.txt", "section": "tip 0"}) == (
        'article 003 (Eugene Khvedchenya, "Efficient PyTorch: eliminating training bottlenecks" (2020)), tip 0')
    assert cite({"article": "our wiki", "section": "page 2"}) == "our wiki, page 2"
