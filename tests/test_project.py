"""The project keeps its promises: README documents every metric, CI runs the README's test
command, the Dockerfile lints clean."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from perfdoctor.analyze import registry

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_readme_documents_every_metric():
    missing = [n for n in registry.REGISTRY if f"`{n}`" not in README]
    assert not missing, f"README metrics table lacks {missing}"


def test_ci_runs_the_readme_test_command():
    block = README.split("## Run the tests", 1)[1]
    cmd = re.search(r"```bash\n(.+?)\n```", block, re.S).group(1).strip()
    ci = (REPO / ".ci" / "run").read_text()
    for part in cmd.split("&&"):
        assert part.strip() in ci, part


def test_readme_documents_exit_codes():
    from perfdoctor import errors
    for code in (errors.EXIT_OK, errors.EXIT_INPUT, errors.EXIT_INTERNAL):
        assert f"| {code} |" in README


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (it comes with the test extra on Linux x86_64/aarch64)")
    r = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_shows_a_complete_rule_file():
    rule = (REPO / "rules" / "PD301-loader-workers.toml").read_text()
    assert "```toml\n" + rule + "```" in README


def test_readme_coverage_table_lists_every_fix_rule():
    from perfdoctor.rules.loader import load_rules
    table = README.split("### Which rule covers which article section", 1)[1]
    fixes = [r.id for r in load_rules() if r.kind == "fix"]
    cited = set(re.findall(r"PD\d{3}", table))
    for lo, hi in re.findall(r"PD(\d{3})-PD(\d{3})", table):
        cited |= {f"PD{i}" for i in range(int(lo), int(hi) + 1)}
    missing = [f for f in fixes if f not in cited]
    assert not missing, f"fix rules missing from the README coverage table: {missing}"
    for art in ("000", "001", "002", "003"):
        assert f"| {art} |" in table


def test_readme_demo_command_runs(tmp_path):
    """The quick start's demo (its last `&&` part) runs from the repo root and diagnoses."""
    pytest.importorskip("torch", reason="the demo trains with torch")
    import shlex
    import sys
    block = README.split("## Quick start (set up and run the demo)", 1)[1]
    cmd = re.search(r"```bash\n(.+?)\n```", block, re.S).group(1).strip()
    demo = shlex.split(cmd.split("&&")[-1])
    assert demo[:2] == ["perfdoctor", "run"]
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(tmp_path / "run"), *demo[2:]],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "INPUT-BOUND (CPU)" in r.stderr and "DataLoader runs with num_workers=0" in r.stderr
