"""`perfdoctor tune --only`: the trials of the groups and fixes it names, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tunecases import facts

from perfdoctor.errors import PerfdoctorError
from perfdoctor.report.tune_labels import tune_only
from perfdoctor.report.markdown import tune as tune_markdown
from perfdoctor.tune import plan


def test_only_keeps_the_named_groups_and_the_trials_of_the_named_fixes():
    everything = plan.plan(facts(), allow_compile=True)
    assert {t.group for t in everything} >= {"loader", "threads", "optimizer", "compile"}
    loader = plan.plan(facts(), only=plan.only_names(["loader"]))
    assert loader == [t for t in everything if t.group == "loader"] and len(loader) == 3   # 1, 2 workers, pinning
    # a fix id keeps the trials that test it, across groups: PD338 the optimizer's two
    assert [t.changes for t in plan.plan(facts(), only=plan.only_names(["pd338"]))] == [
        {"optimizer": "fused"}, {"optimizer": "foreach"}]
    # comma-separated and repeated names add up, in the plan's own order
    both = plan.plan(facts(), allow_compile=True, only=plan.only_names(["compile, PD346", "PD338"]))
    assert [t.group for t in both] == [t.group for t in everything if t.group in ("threads", "optimizer", "compile")]
    assert plan.plan(facts(), only=plan.only_names(["PD306"])) == []          # not raised: no trial tests it
    assert plan.only_names([]) is None and plan.only_names(None) is None      # no --only: everything


def test_only_applies_to_the_loader_refinements_too():
    f = facts(loader={**facts().loader, "num_workers": 2})
    assert [t.changes for t in plan.refinements(f, None, only=plan.only_names(["PD356"]))] == [
        {"persistent_workers": True}]
    assert len(plan.refinements(f, None, only=plan.only_names(["PD301"]))) == 2     # PD301 is each one's too
    assert len(plan.refinements(f, None, only=plan.only_names(["loader"]))) == 2
    assert plan.refinements(f, None, only=plan.only_names(["threads"])) == []


def test_an_unknown_name_is_a_usage_error_that_lists_the_known_ones(tmp_path):
    with pytest.raises(PerfdoctorError) as e:
        plan.only_names(["loader,PD999"])
    assert e.value.exit_code == 2 and "unknown PD999;" in str(e.value) and "loader" in str(e.value)
    with pytest.raises(PerfdoctorError) as e:    # a fix of the report's that is a code change: said so
        plan.only_names(["PD395"])
    assert e.value.exit_code == 2 and str(e.value).startswith("--only: no trial tests PD395 (a change to the code")
    for empty in ([""], [" , "]):      # `--only "$FIXES"` with the variable empty: said, not "everything"
        with pytest.raises(PerfdoctorError) as e:
            plan.only_names(empty)
        assert e.value.exit_code == 2 and str(e.value).startswith("--only: no name given; groups: iterator, loader")
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "tune", "--only", "warp", "--out", str(tmp_path / "t"),
                        str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--only: unknown warp" in r.stderr
    assert "never run" not in r.stdout and not (tmp_path / "t").exists()


def test_what_only_kept_is_said_in_the_terminal_and_the_markdown():
    doc = {"command": "train.py", "noise": "quiet machine", "only": ["PD306"], "trials": [], "best": None,
           "apply": "keep the script as it is", "baseline": {"step_time_s": 0.002, "ci95": [0.0019, 0.0021],
                                                             "steps": 900, "verdict": "input_cpu"}}
    assert tune_only(doc) == ("only PD306 (--only): no trial tests it on this run (the baseline's report did not "
                              "raise it, or no setting tests it)")
    assert tune_only({**doc, "trials": [{}]}) == "only PD306 (--only): 1 trial"
    md = tune_markdown(doc)
    assert "only PD306 \\(--only\\): no trial tests it" in md and "--only left no trial to run" in md
    assert "--only" not in tune_markdown({**doc, "only": None})


def test_a_runs_report_names_the_tune_command_that_measures_its_fixes():
    from perfdoctor.report.tune_labels import tune_hint
    from perfdoctor.rules.tunable import fixes_tested, tune_command

    cmd = "train.py --data 'my data'"
    # on the CPU: no CUDA-only trial (pinning), the compile trial's opt-in flag, the report's order
    assert tune_command(["PD312", "PD302", "PD319", "PD301"], cmd, cuda=False) == (
        "perfdoctor tune --only PD312,PD301 --allow-compile train.py --data 'my data'")
    assert tune_command(["PD302", "PD320"], cmd, cuda=True) == (
        "perfdoctor tune --only PD302,PD320 --allow-numerics train.py --data 'my data'")   # autocast's flag; tf32's none
    assert tune_command(["PD347"], cmd, cuda=False) == "perfdoctor tune --only PD347 train.py --data 'my data'"
    assert tune_command(["PD319", "PD317"], cmd, cuda=True) is None and tune_command(["PD301"], None, False) is None
    # every fix it can name is one --only takes
    assert plan.only_names([",".join(sorted(fixes_tested()))]) == fixes_tested()
    doc = {"run": {"command": cmd}, "findings": [{"id": "PD301", "kind": "fix"}, {"id": "PD201", "kind": "flag"}],
           "verdict": {}, "traces": [{"metrics": {"trace.platform": "cpu"}, "label": "t", "path": "t"}]}
    assert tune_hint(doc) == "perfdoctor tune --only PD301 " + cmd
    assert tune_hint({**doc, "run": None}) is None                       # a trace alone: no script to tune
    assert tune_hint({**doc, "ranks": {"ranks": []}}) is None           # several ranks: tune runs one process


def test_rules_show_names_the_tune_command_of_a_fix_a_trial_tests():
    show = [sys.executable, "-m", "perfdoctor", "rules", "show"]
    out = subprocess.run([*show, "PD312"], capture_output=True, text=True, timeout=60).stdout
    assert "measured by\n  perfdoctor tune --only PD312 --allow-compile SCRIPT [ARGS]   (trials: compile)" in out
    out = subprocess.run([*show, "PD302"], capture_output=True, text=True, timeout=60).stdout
    assert "(trials: pin_memory; CUDA only)" in out
    out = subprocess.run([*show, "PD319"], capture_output=True, text=True, timeout=60).stdout
    assert "measured by" not in out and "source" in out            # a profiling advice: no trial tests it


def test_markdown_and_html_reports_of_a_run_name_the_tune_command_too(mlp_run, tmp_path):
    """The terminal's last lines name the `perfdoctor tune` command that measures a run's fixes; a
    PR comment (markdown) and the HTML report carry it too, as code to copy (the script's arguments
    kept as given), and not beside tune's own measurements."""
    from perfdoctor.report import html, markdown
    from perfdoctor.report.tune_labels import tune_hint

    run = mlp_run("a")
    doc = json.loads((run / "report.json").read_text())
    cmd = tune_hint(doc)
    assert cmd and cmd.startswith("perfdoctor tune --only ") and cmd.endswith(
        "examples/compute_bound.py --batch-size 64 --width 512"), cmd
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", "--format", "markdown", str(run)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"Measure these fixes on the script:\n\n```sh\n{cmd}\n```" in r.stdout
    page = html.render(doc)
    assert f"<b>Measure these fixes on the script:</b><pre><code>{cmd}</code></pre>" in page
    # with tune's measurements the fixes show what it measured: no command to run it again
    tuned = {"trials": [{"rule": doc["findings"][0]["id"], "speedup": 1.2, "status": "faster", "label": "x"}]}
    assert "Measure these fixes" not in html.render(doc, tuned) and "Measure these" not in markdown.report(doc, tuned)
    # a command from hostile arguments is escaped in the page
    evil = {**doc, "run": {**doc["run"], "command": "t.py --name '</code><script>x</script>'"}}
    assert "<script>x" not in html.render(evil) and "&lt;script&gt;x" in html.render(evil)


def test_the_suggested_tune_command_asks_for_stacks_where_a_fix_rests_on_them_alone():
    """A user's REINFORCE run offered `perfdoctor tune --only PD379,...`: PD379 fires on the Python
    stacks alone, which tune's baseline (auto, as `run`) left out on the busy machine, so its trial
    was never planned. The command asks for them; STACKS_ONLY is what the rules say."""
    from perfdoctor.rules.loader import load_rules
    from perfdoctor.rules.tunable import STACKS_ONLY, fixes_tested, tune_command
    rests = {r.id for r in load_rules() if r.id in fixes_tested() and r.when_names
             and all(n.startswith("stacks.") for n in r.when_names)}
    assert STACKS_ONLY == rests and "PD379" in rests
    assert tune_command(["PD312", "PD379", "PD338"], "rl.py 300", cuda=False) == \
        "perfdoctor tune --only PD312,PD379,PD338 --allow-compile --stacks rl.py 300"
    assert "--stacks" not in tune_command(["PD312", "PD338"], "rl.py", cuda=False)


def test_the_one_screen_names_the_measured_fixes_it_left_out():
    """The command under the one screen's three fixes measured a PD338 the screen did not show
    (under "+3 more"): the line above it says where it is."""
    from perfdoctor.report.tune_labels import MEASURE_FIXES, further_down
    cmd = "perfdoctor tune --only PD379,PD312,PD338,PD346 --allow-compile --stacks rl.py 300"
    assert further_down(MEASURE_FIXES, cmd, ["PD379", "PD353", "PD312"]) == \
        "measure these fixes on the script (PD338, PD346 further down the ranking: --details):"
    assert further_down(MEASURE_FIXES, cmd, ["PD379", "PD312", "PD338", "PD346"]) == MEASURE_FIXES


def test_only_a_fix_the_stacks_alone_find_records_the_baselines_stacks():
    """`tune --only PD379` on a busy machine: the auto mode left the baseline without stacks, PD379
    was never raised and no trial planned. Naming it (or its group) turns them on; --no-stacks wins."""
    assert plan.baseline_stacks(None, plan.only_names(["PD379"])) is True
    assert plan.baseline_stacks(None, plan.only_names(["distributions"])) is True
    assert plan.baseline_stacks(None, plan.only_names(["PD338,loader"])) is None        # auto, as `run`
    assert plan.baseline_stacks(False, plan.only_names(["PD379"])) is False
    assert plan.baseline_stacks(None, None) is None
