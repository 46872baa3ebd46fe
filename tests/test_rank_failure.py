"""A multi-rank job that fails: a rank killed by SIGKILL dies of it under perfdoctor's per-rank
launcher (collect/ranks.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_rank_launcher_dies_of_its_scripts_signal(sig):
    """SIGKILL takes no handler: setting SIG_DFL for it raised OSError (a traceback, exit 1)."""
    r = subprocess.run([sys.executable, "-c", f"from perfdoctor.collect.ranks import die_of; die_of({int(sig)})"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -sig and r.stderr == ""
