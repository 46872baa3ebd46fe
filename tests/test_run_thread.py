"""`perfdoctor run` of a script that trains in a thread other than the main one (a user trial).
Kineto's line when the profiler first starts off the thread that imported torch is kept off the
script's stderr (perfdoctor/collect/profquiet.py)."""

from __future__ import annotations

import os
import subprocess
import sys


KINETO = r'''
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from perfdoctor.collect import profquiet
os.write(2, b"before\n")
def other():
    os.write(2, b"from another thread\n")
with profquiet.without_kineto_line():
    os.write(2, b"a\xff\x00b\n")
    os.write(2, b"ERROR: External init callback must run in same thread as registerClient (-12 != 34)\n")
    t = threading.Thread(target=other); t.start(); t.join()
    sys.stderr.write("no newline")
os.write(2, b"|after\n")
'''


def test_kinetos_line_is_dropped_and_every_other_byte_kept(tmp_path):
    p = tmp_path / "k.py"
    p.write_text(KINETO)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, str(p), repo], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b"before\na\xff\x00b\nfrom another thread\nno newline|after\n"
