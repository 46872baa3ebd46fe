"""`perfdoctor run` of a script that trains in a thread other than the main one (a user trial:
--max-steps printed "Exception in thread trainer: ... StopRun" into the script's stderr and the
run read as finished by itself; Kineto printed a line of its own; a run ending inside the
profiler window died of SIGSEGV). Each test runs a small CPU script under `python -m perfdoctor
run` and checks its output, exit code and run directory (perfdoctor/collect/threadstop.py,
profquiet.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from runs import bare, child, prun, report, steps

pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")

# mode join: the main thread joins the trainer, then prints; loop: it never returns; return: it
# returns at once (Python waits for the trainer before it exits); ctrlc: a Ctrl-C in the main
# thread asks the trainer to stop, waits for it, and ends as an uncaught KeyboardInterrupt.
SCRIPT = r'''
import sys, threading, time
import torch
mode, n = sys.argv[1], int(sys.argv[2])
stop = threading.Event()

def train():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    try:
        for i in range(n):
            if stop.is_set():
                break
            loss = model(x).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            sys.stderr.write(f"step {i}\n"); sys.stderr.flush()
            time.sleep(0.01)
    finally:
        print("trainer: finally", flush=True)
    print("trainer: done", flush=True)

t = threading.Thread(target=train, name="trainer")
t.start()
if mode == "join":
    t.join()
    print("main: after join", flush=True)
elif mode == "loop":
    while True:
        time.sleep(0.05)
elif mode == "ctrlc":
    try:
        while t.is_alive():      # not t.join(): interrupted, CPython 3.11's join marks a running thread ended
            time.sleep(0.05)
    except KeyboardInterrupt:
        stop.set()
        t.join()
        raise
else:
    print("main: returned", flush=True)
'''

OURS = ("Traceback", "Exception in thread", "StopRun", "External init callback", "[W")


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "thread_train.py"
    p.write_text(SCRIPT)
    return p


def script_err(r) -> str:
    """The run's stderr before perfdoctor's report: the script's own."""
    return r.stderr[:r.stderr.index("perfdoctor run ")]


def test_max_steps_stops_a_trainer_thread_as_it_stops_the_main_one(tmp_path, script):
    out = tmp_path / "run"
    r = prun("--skip-steps", "2", "--trace-steps", "2", "--max-steps", "8", script, "join", 200, out=out)
    assert r.returncode == 0, r.stderr
    err = script_err(r)
    assert not any(s in err for s in OURS), err                 # no traceback, no torch or Kineto line
    assert err == "".join(f"step {i}\n" for i in range(8))        # the 9th optimizer step was the stop
    # the trainer's finally ran; the main thread went on after its join; the loop did not end by itself
    assert r.stdout == "trainer: finally\nmain: after join\n"
    assert "perfdoctor stopped the script (--max-steps) · exit code 0" in " ".join(r.stderr.split())
    assert child(out)["outcome"] == "stopped" and report(out)["run"]["stopped_by"] == "max-steps"
    assert len(steps(out)) == 8
    assert child(out)["profiler"] == "done" and list((out / "trace").glob("*.pt.trace.json.gz"))


def test_trainer_left_running_by_the_main_thread_is_measured_to_its_end(tmp_path, script):
    # the main thread returns at once; the profiler starts in the trainer (Kineto's line) and the
    # trainer's last steps fall inside the window (stopped from the main thread: SIGSEGV)
    out = tmp_path / "run"
    r = prun("--skip-steps", "3", "--trace-steps", "20", script, "return", 12, out=out)
    b = bare(script, "return", 12)
    assert r.returncode == 0 == b.returncode, r.stderr
    assert r.stdout == b.stdout == "main: returned\ntrainer: finally\ntrainer: done\n"
    assert script_err(r) == b.stderr                     # byte for byte: no line of torch's or Kineto's
    assert child(out)["outcome"] == "completed" and len(steps(out)) == 11     # 12 updates: 11 steps
    assert child(out)["profiler"] == "done" and list((out / "trace").glob("*.pt.trace.json.gz"))
    assert report(out)["traces"][0]["metrics"]["steps.count"] >= 6


def test_duration_stops_a_trainer_thread_and_a_main_thread_that_never_returns(tmp_path, script):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = prun("--no-trace", "--duration", "4", script, "loop", 100000, out=out, env={"PERFDOCTOR_STOP_GRACE_S": "1"})
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    assert not any(s in script_err(r) for s in OURS), script_err(r)
    assert r.stdout == "trainer: finally\n"
    assert report(out)["run"]["stopped_by"] == "duration" and child(out)["outcome"] == "stopped"


def test_ctrl_c_of_a_threaded_script_keeps_its_exit_code(tmp_path, script):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--out", str(out), str(script),
                          "ctrlc", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ((out / "steps.jsonl").exists() and len(steps(out)) >= 3):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)                    # to perfdoctor only: it forwards it
    so, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, err      # the script's own: an uncaught KeyboardInterrupt kills python
    assert so == "trainer: finally\ntrainer: done\n"
    assert "KeyboardInterrupt" in err and "collect/child.py" not in err
    assert child(out)["outcome"] == "interrupted" and len(steps(out)) >= 3


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
