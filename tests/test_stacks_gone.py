"""py-spy started on a script that has already ended: its own words ("Failed to get process
executable name. Check that the process is running.") were shown as perfdoctor's failure, with
an exit code (a user trial, on a script that crashed after 20 short steps)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perfdoctor.collect.stacks import StackRecorder, find_py_spy


def test_py_spy_on_an_ended_script_says_the_script_had_ended(tmp_path):
    spy = find_py_spy()
    if not spy:
        pytest.skip("py-spy is not installed (it comes with perfdoctor's dependencies)")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()                                   # reaped: its pid names no process now
    rec = StackRecorder(gone.pid, tmp_path, tmp_path / "steps.jsonl", py_spy=spy)
    with open(tmp_path / f"pyspy-{gone.pid}.log", "w") as log:     # as the recorder starts py-spy
        code = subprocess.run([*(spy if isinstance(spy, list) else [spy]), "record", "--pid", str(gone.pid),
                               "--format", "raw", "-o", str(tmp_path / f"pyspy-{gone.pid}.json")],
                              stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode
    assert code != 0
    rec._check_failure(code)
    assert rec.notes == ["py-spy recorded no stacks: the script had ended before py-spy read its first sample"], \
        (tmp_path / f"pyspy-{gone.pid}.log").read_text()
