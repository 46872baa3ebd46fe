"""Property-based fuzzing of everything perfdoctor reads (issue 12): traces (structured random,
byte mutations and truncations of small real traces, gzip), run directories, report.json files
for compare and gate, and user rule files. The outcome is always a report (exit 0; gate 0/1/3)
or one line on stderr and exit 2: never a traceback, exit 70, a hang or another code.

Fixed seed (derandomize) and bounded examples keep it reproducible and under a minute on 2
cores; `bench/fuzz_long.py --examples N` runs the same properties longer. Generators and the
outcome check: tests/fuzzing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import fuzzing as fz

EXAMPLES = int(os.environ.get("PERFDOCTOR_FUZZ_EXAMPLES", "0")) or None
# No shrinking: a failing example is reported as found (with @reproduce_failure's blob), and
# shrinking one of these inputs can take minutes.
FUZZ = settings(derandomize=not os.environ.get("PERFDOCTOR_FUZZ_RANDOM"), deadline=None, database=None, print_blob=True,
                phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def examples(n: int) -> settings:
    return settings(FUZZ, max_examples=EXAMPLES or n)


SEEDS = fz.seed_traces()


def _report(data: bytes, name: str = "t.json") -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        code, out, err = fz.run_cli(["report", str(p), "-o", str(Path(d) / "r.json")])
        if code == 0:
            doc = json.loads((Path(d) / "r.json").read_bytes())
            assert doc["schema_version"] == 2 and doc["traces"]
            assert "\x1b" not in out


@examples(80)
@given(fz.trace_texts())
def test_structured_random_traces(data):
    _report(data)


@examples(120)
@given(fz.mutations(SEEDS))
def test_mutated_and_truncated_real_traces(data):
    _report(data, "t.json.gz" if data[:2] == b"\x1f\x8b" else "t.json")


@examples(40)
@given(st.lists(fz.trace_texts(), min_size=1, max_size=3))
def test_directories_of_random_traces(texts):
    with tempfile.TemporaryDirectory() as d:
        for i, t in enumerate(texts):
            (Path(d) / f"rank{i}.json").write_bytes(t)
        fz.run_cli(["report", d])


def _run_dir(draw, root: Path, name: str, report: bool) -> Path:
    files = {"run.json": fz.dumps(draw(fz.run_json())), "child.json": fz.dumps(draw(fz.child_json())),
             "steps.jsonl": draw(st.one_of(fz.step_records(), st.none())),
             "samples.json": draw(st.one_of(st.builds(fz.dumps, fz.samples_doc()), st.none()))}
    if draw(st.booleans()):
        files["trace/h_1.pt.trace.json.gz"] = __import__("gzip").compress(draw(st.sampled_from(SEEDS)))
    if report:
        files["report.json"] = fz.dumps(fz.perturb_report(draw, REPORT))
    return fz.write_run_dir(root / name, files)


REPORT = json.loads(subprocess.run(
    [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import tracegen as tg, tempfile, os;"
     "p = os.path.join(tempfile.mkdtemp(), 't.json'); tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500)"
     " for _ in range(4)]), p); from perfdoctor.cli import main; main(['report', p, '--format', 'json'])"],
    capture_output=True, cwd=Path(__file__).resolve().parent.parent, check=True).stdout)


@examples(60)
@given(st.data())
def test_random_run_directories_are_reported(data):
    with tempfile.TemporaryDirectory() as d:
        run = _run_dir(data.draw, Path(d), "run", report=False)
        fz.run_cli(["report", str(run)])


@examples(50)
@given(st.data())
def test_compare_and_gate_on_random_runs(data):
    with tempfile.TemporaryDirectory() as d:
        a = _run_dir(data.draw, Path(d), "a", report=True)
        b = _run_dir(data.draw, Path(d), "b", report=True)
        fz.run_cli(["compare", str(a), str(b)])
        fz.run_cli(["gate", str(b), "--baseline", str(a), "--junit", str(Path(d) / "j.xml")], ok=(0, 1, 3))


@examples(60)
@given(st.data())
def test_random_report_files(data):
    """compare/gate given report.json files (not directories), any JSON in them."""
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a.json", Path(d) / "b.json"
        a.write_text(fz.dumps(fz.perturb_report(data.draw, REPORT)))
        b.write_text(fz.dumps(data.draw(st.one_of(st.just(fz.perturb_report(data.draw, REPORT)), fz.ANY_JSON))))
        fz.run_cli(["compare", str(a), str(b)])
        fz.run_cli(["gate", str(a), "--baseline", str(b)], ok=(0, 1, 3))


@examples(60)
@given(fz.rule_files())
def test_random_user_rule_files(text):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "PD950-fuzz.toml").write_text(text)
        code, _, _ = fz.run_cli(["rules", "check", d], ok=(0, 1))
        if code in (0, 1):        # valid: it must also show and apply
            fz.run_cli(["rules", "show", "PD950", "--rules", d])
            p = Path(d) / "t.json"
            p.write_bytes(SEEDS[0])
            fz.run_cli(["report", str(p), "--rules", d])


# A few through the real console script: exit codes and stderr as a shell sees them.
SUBPROCESS_CASES = {
    "deep nesting": b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    "NaN and duplicate keys": b'{"traceEvents": [{"ph": "X", "ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1",'
                              b' "ts": NaN, "dur": Infinity, "pid": 1, "tid": 1}]}',
    "not UTF-8": b'{"traceEvents": [{"name": "\xff\xfe", "ph": "X"}]}',
    "truncated gzip": __import__("gzip").compress(SEEDS[0])[:300],
}


@pytest.mark.parametrize("name", list(SUBPROCESS_CASES))
def test_console_script_outcomes(tmp_path, name):
    data = SUBPROCESS_CASES[name]
    p = tmp_path / ("t.json.gz" if data[:2] == b"\x1f\x8b" else "t.json")
    p.write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(p)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode in (0, 2), r.stderr
    assert "Traceback" not in r.stderr
    if r.returncode == 2:
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("perfdoctor: error:")
    else:
        assert "warning" in r.stdout or "step(s)" in r.stdout
