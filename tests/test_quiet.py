"""A test marked `quiet` runs while no other test does (tests/quiet.py's lock across the workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

BODY = '''
import json, os, time
import pytest

def window(name, seconds):
    t0 = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["WINDOWS"], "a") as f:
        f.write(json.dumps([name, t0, time.monotonic(), os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
'''


def test_a_quiet_test_runs_alone_and_the_others_two_at_a_time_each_file_on_one_worker(tmp_path):
    """Two quiet tests in a row keep the machine between them; the others share it."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the suite runs in one worker (conftest.pytest_xdist_auto_num_workers)")
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    for helper in ("quiet.py", "fileorder.py"):      # conftest's; no durations.json: files in their order
        (tmp_path / helper).write_text((TESTS / helper).read_text())
    # the quiet tests first in the first file: the other worker has tests to run while they wait
    quiet = textwrap.dedent('''
        @pytest.mark.quiet
        def test_q():
            from quiet import _exclusive
            assert _exclusive
            window("q", 1.0)

        @pytest.mark.quiet
        def test_q2():
            window("q2", 0.3)
        ''')
    for f in "abcd":
        tests = "".join(f"\ndef test_{f}{i}():\n    window('{f}{i}', 0.3)\n" for i in range(4))
        (tmp_path / f"test_{f}.py").write_text(BODY + (quiet if f == "a" else "") + tests)
    windows = tmp_path / "windows.jsonl"
    # the project's own options (pyproject's addopts: the workers and how tests are dealt to them)
    addopts = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *addopts.split(),
                        "-o", "markers=quiet: alone", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "WINDOWS": str(windows)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(line) for line in windows.read_text().splitlines()]
    assert len(rows) == 18
    (q0, _), = [(a, b) for n, a, b, _ in rows if n == "q"]
    (_, q1), = [(a, b) for n, a, b, _ in rows if n == "q2"]
    others = [(a, b) for n, a, b, _ in rows if n[0] != "q"]
    # nothing ran beside them, nor between them: the hold passed from one quiet test to the next
    assert not [w for w in others if w[0] < q1 and w[1] > q0]
    # ... while the other tests did run side by side: the lock is shared for them
    assert any(a0 < b1 and a1 > b0 for i, (a0, a1) in enumerate(others) for b0, b1 in others[i + 1:])
    # and a file's tests run on one worker (its module fixtures are made once)
    workers = {f: {w for n, _, _, w in rows if n[0] == f} for f in "abcd"}
    assert all(len(w) == 1 for w in workers.values()) and set().union(*workers.values()) == {"gw0", "gw1"}


def test_a_timing_test_that_is_not_marked_quiet_fails_with_the_reason():
    from quiet import skip_if_shared
    with pytest.raises(pytest.fail.Exception, match="marked @pytest.mark.quiet"):
        skip_if_shared()
