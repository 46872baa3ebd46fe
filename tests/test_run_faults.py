"""`perfdoctor run` under faults (issue 12): binary output, the script killed by SIGKILL, SIGTERM
to perfdoctor, a terminal's Ctrl-C, an unwritable --out and a full disk. Each keeps the script's stdout byte for byte
(as a plain `python` run writes it), its exit code, and leaves a usable report or a clear
message. `run -m` with a module that does not exist or raises ends as `python -m` does. (A crash's
traceback, SIGINT and exit codes are covered in tests/test_run.py.)"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")

SCRIPT = '''
import os, random, signal, sys, time
import torch
rng = random.Random(7)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
mode = sys.argv[1]
for step in range(int(sys.argv[2])):
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    sys.stdout.buffer.write(bytes(rng.randrange(256) for _ in range(300)))   # any bytes: NUL, CR, not UTF-8
    sys.stderr.buffer.write(bytes(rng.randrange(256) for _ in range(100)))
    sys.stdout.buffer.flush(); sys.stderr.buffer.flush()
    if step == 9 and mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 9 and mode == "wait":
        time.sleep(120)
    if step == 9 and mode == "os_exit":
        os._exit(6)                                    # no interpreter teardown, no atexit
sys.exit(5)
'''


@pytest.fixture
def script(tmp_path) -> Path:
    p = tmp_path / "binout.py"
    p.write_text(SCRIPT)
    return p


def bare(script: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, timeout=120)


def prun(out: Path, script: Path, *args, opts=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", *opts, "--out", str(out), str(script), *args],
                          capture_output=True, timeout=240)


@pytest.mark.slow
def test_binary_output_and_exit_code_byte_for_byte(tmp_path, script):
    b = bare(script, "exit", "14")
    r = prun(tmp_path / "run", script, "exit", "14", opts=("--no-trace",))
    assert b.returncode == r.returncode == 5
    assert r.stdout == b.stdout and len(b.stdout) == 14 * 300
    assert r.stderr.startswith(b.stderr)                 # the script's stderr first, untouched
    t = prun(tmp_path / "traced", script, "exit", "14", opts=("--skip-steps", "2", "--trace-steps", "2"))
    assert t.returncode == 5 and t.stdout == b.stdout    # with the profiler too
    assert json.loads((tmp_path / "traced" / "report.json").read_text())["run"]["exit_code"] == 5


@pytest.mark.slow
def test_script_killed_by_sigkill(tmp_path, script):
    b = bare(script, "kill", "14")
    r = prun(tmp_path / "run", script, "kill", "14")
    assert b.returncode == -signal.SIGKILL and r.returncode == 128 + signal.SIGKILL
    assert r.stdout == b.stdout and len(r.stdout) == 10 * 300
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["run"]["outcome"] == "killed" and doc["run"]["exit_code"] == 137
    assert doc["traces"][0]["metrics"]["run.steps"] >= 8          # the steps before the kill are kept
    assert any("the script was killed after 9 step(s)" in n for n in doc["run"]["notes"]), doc["run"]["notes"]
    # its last steps' records can go with it (steps.jsonl is written in batches): the note says so
    assert any("may be lost with it: the step counts cover the steps written" in n for n in doc["run"]["notes"])


@pytest.mark.slow
def test_output_into_a_file_holds_both_streams_byte_for_byte_even_when_killed(tmp_path, script, capfd):
    """tune's runs (RunConfig.output): the script's stdout and stderr go into one file, in the order
    written, as a plain python run with both streams on that file leaves them, byte for byte, the
    last lines of a killed run included; nothing reaches perfdoctor's own streams."""
    from perfdoctor.collect.launcher import RunConfig, launch
    with open(tmp_path / "bare.log", "wb") as f:
        b = subprocess.run([sys.executable, str(script), "kill", "14"], stdout=f, stderr=f, timeout=120)
    res = launch(RunConfig(argv=[str(script), "kill", "14"], run_dir=tmp_path / "run", trace=False,
                           output=tmp_path / "run" / "output.log"))
    assert b.returncode == -signal.SIGKILL and res.exit_code == 128 + signal.SIGKILL
    got, want = (tmp_path / "run" / "output.log").read_bytes(), (tmp_path / "bare.log").read_bytes()
    assert got == want and len(got) == 10 * 400
    seen = capfd.readouterr()
    assert seen.out == "" and len(seen.err) < 200          # the script's 1000 bytes of stderr are not here


@pytest.mark.slow
def test_script_leaving_through_os_exit_is_an_exit_not_a_kill(tmp_path, script):
    """os._exit skips atexit and `finally`: perfdoctor's child still records its summary first,
    and a forked process (a DataLoader worker leaves that way) is left alone."""
    b = bare(script, "os_exit", "14")
    r = prun(tmp_path / "run", script, "os_exit", "14", opts=("--no-trace",))
    assert b.returncode == r.returncode == 6 and r.stdout == b.stdout and len(r.stdout) == 10 * 300
    child = json.loads((tmp_path / "run" / "child.json").read_text())
    assert (child["outcome"], child["exit_code"], child["steps"]) == ("exit", 6, 9)
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["run"]["outcome"] == "exit" and doc["run"]["exit_code"] == 6
    assert not any("killed" in n for n in doc["run"]["notes"]), doc["run"]["notes"]


@pytest.mark.slow
def test_sigterm_to_perfdoctor_is_forwarded_and_leaves_a_report(tmp_path, script):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--out", str(out), str(script),
                          "wait", "14"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if (out / "steps.jsonl").exists() and len((out / "steps.jsonl").read_text().splitlines()) >= 9:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)                       # to perfdoctor only
    stdout, stderr = p.communicate(timeout=90)
    assert p.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stdout == bare(script, "exit", "10").stdout            # the first 10 steps' bytes, intact
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["exit_code"] == 143 and doc["run"]["outcome"] in ("interrupted", "killed")


CLEANUP = r'''
import sys, time
import torch
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
try:
    while True:
        model(x).square().mean().backward(); opt.step(); opt.zero_grad()
        time.sleep(0.05)                  # where a Ctrl-C lands: the main thread reacts at once
except KeyboardInterrupt:
    time.sleep(0.5)                       # the script's own cleanup after a Ctrl-C
    print("cleanup done", flush=True)
    sys.exit(3)
'''


def test_a_terminals_ctrl_c_reaches_the_script_once(tmp_path):
    # Ctrl-C at a terminal sends SIGINT to the whole foreground process group: perfdoctor and the
    # script. perfdoctor used to send the script a second one, which cut its cleanup short (and,
    # landing in perfdoctor's own ending, lost child.json: "the script was killed")
    script, out = tmp_path / "cleanup.py", tmp_path / "run"
    script.write_text(CLEANUP)
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--out", str(out), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ((out / "steps.jsonl").exists()
                                               and len((out / "steps.jsonl").read_text().splitlines()) >= 3):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)                     # as the terminal does
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 3, stderr[-2000:]
    assert stdout == b"cleanup done\n" and b"Traceback" not in stderr
    assert json.loads((out / "child.json").read_text())["outcome"] == "exit"
    assert json.loads((out / "run.json").read_text())["forwarded_signals"] == [signal.SIGINT]


LOOP_FOREVER = r'''
import time
import torch
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
while True:
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.05)
'''


def test_ctrl_c_stops_a_shell_loop_around_the_run_as_around_python(tmp_path):
    # A script killed by an uncaught Ctrl-C dies of SIGINT under python; a shell running it in a
    # loop (a sweep of configs) then stops too, since its child died of the signal. perfdoctor
    # used to exit 130 instead, which tells the shell the child handled the Ctrl-C: the loop went on
    # to the next config. perfdoctor now dies of SIGINT too, after its report.
    script, out = tmp_path / "forever.py", tmp_path / "run"
    script.write_text(LOOP_FOREVER)
    cmd = f"{shlex.quote(sys.executable)} -m perfdoctor run --no-trace --out {shlex.quote(str(out))}-$i " \
          f"{shlex.quote(str(script))}"
    p = subprocess.Popen(["bash", "-c", f"for i in 1 2; do {cmd}; echo \"next $?\"; done"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    first = Path(f"{out}-1") / "steps.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (first.exists() and len(first.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)                     # as the terminal does
    try:
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert b"interrupted" in stderr and b"KeyboardInterrupt" in stderr, stderr[-2000:]
    assert stdout == b"" and p.returncode == -signal.SIGINT, (stdout, stderr[-2000:])
    assert not Path(f"{out}-2").exists()
    assert json.loads((Path(f"{out}-1") / "run.json").read_text())["exit_code"] == 130


def test_unwritable_out_is_one_line_and_the_script_does_not_run(tmp_path, script):
    (tmp_path / "afile").write_text("x")
    r = prun(tmp_path / "afile" / "run", script, "exit", "3")
    assert r.returncode == 2 and r.stdout == b""
    err = r.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("perfdoctor: error: cannot create the run directory")


def test_a_directory_for_the_script_says_what_to_give(tmp_path):
    """`perfdoctor run DIR` (python runs DIR/__main__.py) had said "can't open file: no such file"."""
    app = tmp_path / "app"
    app.mkdir()
    r = prun(tmp_path / "run", app)
    assert r.returncode == 2 and r.stderr.decode() == f"perfdoctor: error: {str(app)!r} is a directory: give a script file in it\n"
    (app / "__main__.py").write_text("print('hi')\n")
    r = prun(tmp_path / "run", app)
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and not (tmp_path / "run").exists()
    assert f"give a script file ({str(app / '__main__.py')!r}) or its package as a module (-m app" in r.stderr.decode()


@pytest.mark.slow
def test_full_disk_keeps_output_and_exit_code(tmp_path, script):
    small = tmp_path / "small"
    small.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(small)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({m.stderr.strip() or 'not root'})")
    try:
        b = bare(script, "exit", "40")
        r = prun(small / "run", script, "exit", "40", opts=("--skip-steps", "2", "--trace-steps", "20"))
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)
    assert r.returncode == b.returncode == 5
    assert r.stdout == b.stdout                         # the hooks' failed writes never reach the script
    err = r.stderr.decode(errors="replace")
    assert "No space left on device" in err and "Traceback" not in err[len(b.stderr):]
    assert "perfdoctor run" in err and "exit code 5" in err        # the report, from what was kept


# -- `run -m MODULE` as `python -m MODULE`: a module python cannot run, a module that raises --------

def _modules(root: Path) -> Path:
    """Modules without torch (so each run takes a second): one that raises, a package whose
    __init__ raises, a package without __main__."""
    (root / "raises_here.py").write_text('print("before")\nraise ValueError("boom from the module")\n')
    for pkg, init in (("pkg_badinit", 'raise RuntimeError("package init")\n'), ("pkg_nomain", "")):
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text(init)
        (root / pkg / "train.py").write_text('print("never")\n')
    return root


def _both(cwd: Path, out: Path, module: str):
    """(python -m MODULE, perfdoctor run --out OUT -m MODULE), run in cwd."""
    py = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60, cwd=cwd)
    pd = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), "-m", module],
                        capture_output=True, text=True, timeout=120, cwd=cwd)
    return py, pd


@pytest.mark.parametrize("module", ["no_such_module_xyz", "pkg_nomain"])
def test_missing_module_is_pythons_one_line_and_leaves_no_run(tmp_path, module):
    cwd = _modules(tmp_path)
    py, pd = _both(cwd, tmp_path / "runs" / "r1", module)
    assert py.returncode == pd.returncode == 1 and py.stdout == pd.stdout == ""
    assert pd.stderr == py.stderr and pd.stderr.count("\n") == 1           # `<python>: No module named ...`
    assert f"{sys.executable}: No module named {module}" in pd.stderr
    assert not (tmp_path / "runs").exists()                                # nothing ran: no run directory
    keep = tmp_path / "mine"                                                # a folder of the user's: kept as it was
    keep.mkdir()
    (keep / "notes.txt").write_text("keep")
    pd = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(keep), "-m", module],
                        capture_output=True, text=True, timeout=120, cwd=cwd)
    assert pd.returncode == 1 and sorted(p.name for p in keep.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("module", ["raises_here", "pkg_badinit.train"])
def test_module_traceback_is_pythons(tmp_path, module):
    """As for a script: the traceback `python -m` prints (runpy's frames, the module's), with no
    frame of perfdoctor's; exit code 1; the crash still gets its run directory and report."""
    cwd = _modules(tmp_path)
    py, pd = _both(cwd, tmp_path / "run", module)
    assert py.returncode == pd.returncode == 1 and pd.stdout == py.stdout
    assert pd.stderr.startswith(py.stderr), pd.stderr
    assert "runpy" in py.stderr and "perfdoctor/collect" not in pd.stderr[:len(py.stderr)]
    assert json.loads((tmp_path / "run" / "report.json").read_text())["run"]["outcome"] == "crashed"


def test_a_stop_request_after_the_script_ended_is_ignored(tmp_path):
    """--duration's stop signal can cross the script's own exit. Once the script has ended the
    child ignores it (SIG_IGN, which outlives the interpreter's teardown, where Python resets its
    own handlers to the default and a late stop signal would kill the process)."""
    from perfdoctor.collect.threadstop import STOP_SIGNAL
    script = tmp_path / "ends.py"
    flag = tmp_path / "disposition.txt"
    script.write_text(SCRIPT.replace("sys.exit(5)", "import atexit\n"
                      f"atexit.register(lambda: open({str(flag)!r}, 'w').write(str(signal.getsignal({int(STOP_SIGNAL)}) == signal.SIG_IGN)))\n"
                      f"os.kill(os.getpid(), {int(STOP_SIGNAL)})\nsys.exit(5)"))
    r = prun(tmp_path / "run", script, "plain", "12", opts=("--no-trace",))
    assert r.returncode == 5, r.stderr[-2000:]
    assert flag.read_text() == "True"


def test_duration_stops_a_script_that_took_sigusr1_for_itself(tmp_path, capfd):
    """`faulthandler.register(signal.SIGUSR1)` (dump every thread's stack on SIGUSR1) and SLURM's
    requeue handlers take SIGUSR1: --duration's stop, sent there, printed the script a stack dump
    it never asked for and ended the run by SIGINT 30 s later. It has a signal of its own."""
    from perfdoctor.collect.launcher import RunConfig, launch
    script = tmp_path / "dumps.py"
    script.write_text(
        "import faulthandler, signal, sys, torch\n"
        "faulthandler.register(signal.SIGUSR1)\n"
        "torch.set_num_threads(1)\n"
        "m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1); x = torch.randn(4, 8)\n"
        "print('training', flush=True)\n"
        "while True:\n"
        "    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    # the stop comes 2 s into the training (tune's clock), whatever the start took
    res = launch(RunConfig(argv=[str(script)], run_dir=tmp_path / "run", duration=2, duration_from="first-step",
                           startup_s=60, trace=False, progress=False))
    out, err = capfd.readouterr()
    assert res.exit_code == 0 and out == "training\n", err[-2000:]
    assert "most recent call first" not in err and res.child["steps"] > 100
    assert res.stopped_by == "duration" and res.notes == [], res.notes


def test_a_script_with_no_step_to_stop_at_is_interrupted_once_and_not_called_failed(tmp_path, capfd, monkeypatch):
    """--duration on a process that never reaches a step boundary (its training in spawned
    processes): perfdoctor interrupts it once after the grace, kills it one grace later, and the
    report says perfdoctor stopped it, not that the script failed. A SIGINT on every poll had
    interrupted torch.multiprocessing.spawn's own clean-up again and again (three times in 4 s), and
    the verdict read "The script failed before its first step (exit code 130) ... Fix the failure"."""
    from perfdoctor.collect import launcher
    from perfdoctor.diagnose.live import diagnose_run
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 1.5)
    script = tmp_path / "waits.py"
    script.write_text(
        "import signal, sys, time, torch\n"
        "def on_int(*a):\n"
        "    print('interrupted', flush=True)\n"
        "signal.signal(signal.SIGINT, on_int)\n"
        "print('waiting', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.05)\n")
    res = launcher.launch(launcher.RunConfig(argv=[str(script)], run_dir=tmp_path / "run", duration=1,
                                             trace=False, stacks=False, progress=False))
    out, err = capfd.readouterr()
    assert out == "waiting\ninterrupted\n", (out, err[-2000:])          # one SIGINT, then the kill
    assert res.signal == signal.SIGKILL and res.stopped_by == "duration"
    assert res.notes == ["the script did not stop within 2 s of the request; interrupted it",
                         "the script did not end within 2 s of the interrupt; killed it"], res.notes
    doc = diagnose_run(res)
    summary = doc["verdict"]["summary"]
    assert summary.startswith("perfdoctor stopped the script (--duration) before the launched process recorded a "
                              "step") and "fail" not in summary, summary
    # nor do the run's notes call it the script's failure (the trace's absence said so)
    notes = " ".join(doc["run"]["notes"] + doc["traces"][0]["notes"])
    assert "failed" not in notes and "perfdoctor stopped the script (--duration) before its first step" in notes, notes


def test_a_diagnosis_bug_under_debug_prints_its_traceback_and_keeps_going(monkeypatch, capsys):
    """PERFDOCTOR_DEBUG=1 adds the traceback of a diagnosis bug; it no longer raises it, which
    turned the script's exit code 0 into 1."""
    from perfdoctor.run_flow import _internal_error

    try:
        raise TypeError("Encoding objects of type numpy.float64 is unsupported")
    except TypeError as exc:
        monkeypatch.setenv("PERFDOCTOR_DEBUG", "1")
        _internal_error(exc)                    # returns: the caller goes on to exit with the script's code
        monkeypatch.delenv("PERFDOCTOR_DEBUG")
        _internal_error(exc)
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1 and 'raise TypeError("Encoding' in err
    assert err.count("perfdoctor: internal error while diagnosing: TypeError: Encoding objects") == 2


FAILING_DATASET = '''import torch
class DS(torch.utils.data.Dataset):
    def __len__(self): return 256
    def __getitem__(self, i):
        if i == 40: raise ValueError(f"bad sample {i}")
        return torch.ones(4), torch.zeros(1)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
for x, y in torch.utils.data.DataLoader(DS(), batch_size=8, num_workers=int(__import__("sys").argv[1])):
    opt.zero_grad(); torch.nn.functional.mse_loss(m(x), y).backward(); opt.step()
'''


@pytest.mark.torch
@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_datasets_exception_reads_as_under_python(tmp_path, workers):
    """perfdoctor wraps the DataLoader's fetch (collect/loaderfetch.py) to time it; a dataset's
    exception, raised in a worker ("Original Traceback") or in the trainer, shows no frame of that
    wrapper: stderr up to the report is Python's own, byte for byte (a user found perfdoctor's
    fetch in a worker's traceback, pointing at perfdoctor as the culprit)."""
    script = tmp_path / "bad_sample.py"
    script.write_text(FAILING_DATASET)
    py = subprocess.run([sys.executable, str(script), workers], capture_output=True, text=True, timeout=120)
    pd = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(tmp_path / "run"), str(script), workers],
                        capture_output=True, text=True, timeout=180)
    assert py.returncode == pd.returncode == 1 and "ValueError: bad sample 40" in py.stderr
    assert pd.stderr.startswith(py.stderr), pd.stderr[:3000]
    assert "perfdoctor" not in pd.stderr[:len(py.stderr)]


def test_an_interrupt_before_the_first_step_is_called_an_interrupt(tmp_path):
    """Ctrl-C (SIGINT to perfdoctor, which forwards it) while the script still sets up: the verdict
    had read "The script failed before its first step (...exit code 130). Fix the failure" beside
    the run line's "interrupted"."""
    script, out = tmp_path / "slow_setup.py", tmp_path / "run"
    script.write_text("import time\nimport torch\nprint('setting up', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "setting up\n"        # torch imported, no step yet
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=90)
    assert p.returncode == -signal.SIGINT, stderr[-2000:]     # as the script ended: by the signal (130 in a shell)
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["outcome"] == "interrupted" and doc["run"]["steps"] == 0 and doc["run"]["exit_code"] == 130
    assert doc["verdict"]["summary"].startswith("The script was interrupted before its first step"), doc["verdict"]
    assert "Fix the failure" not in stderr
