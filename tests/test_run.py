"""`perfdoctor run` on the example scripts: exit codes, output, signals, steps, trace."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"


def prun(*args, out: Path, cwd=None, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, **kw)


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def steps(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]


def test_exit_code_and_output_pass_through(tmp_path):
    bare = subprocess.run([sys.executable, str(EX / "exit_code.py"), "--exit-after", "8", "--code", "3"],
                          capture_output=True, text=True, timeout=120)
    r = prun("--skip-steps", "2", "--trace-steps", "2", EX / "exit_code.py", "--exit-after", "8",
             "--code", "3", out=tmp_path / "run")
    assert bare.returncode == 3 and r.returncode == 3
    assert r.stdout == bare.stdout                      # the script's stdout, untouched
    doc = report(tmp_path / "run")
    assert doc["run"]["outcome"] == "exit" and doc["run"]["exit_code"] == 3
    assert doc["traces"][0]["metrics"]["run.exit_code"] == 3
    assert "perfdoctor run" in r.stderr                  # the report goes to stderr
    # the script's stderr comes first, as a plain run prints it: kineto's own log lines
    # ("USDT: ... profiler_start") are not the script's and stay silent
    assert r.stderr.startswith(bare.stderr) and "profiler_start" not in r.stderr


def test_crash_keeps_traceback_exit_code_and_partial_report(tmp_path):
    r = prun("--skip-steps", "1", "--trace-steps", "20", EX / "crash.py", "--crash-after", "6", out=tmp_path / "run")
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr   # Python's own traceback, from the script
    doc = report(tmp_path / "run")
    assert doc["run"]["outcome"] == "crashed"
    assert doc["traces"][0]["metrics"]["run.steps"] >= 4
    # the report says what crashed it, on the header line and in the markdown and HTML
    assert ("· the script crashed · exit code 1 · RuntimeError: simulated training failure at step 6"
            in " ".join(r.stderr.split()))                  # the header line wraps at the terminal's width
    from perfdoctor.report import html, markdown
    assert "**The script crashed \\(exit code 1\\): RuntimeError: simulated training failure at step 6**" in \
        markdown.report(doc)
    assert "<b>The script crashed (exit code 1): RuntimeError: simulated training failure at step 6</b>" in html.render(doc)
    assert list((tmp_path / "run" / "trace").glob("*.pt.trace.json.gz"))   # the cut-short window is kept


def test_max_steps_stops_gracefully(tmp_path):
    r = prun("--max-steps", "12", "--skip-steps", "2", "--trace-steps", "3", EX / "compute_bound.py",
             "--steps", "100000", "--width", "256", "--batch-size", "32", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "done" not in r.stdout                        # the script did not run to its end
    doc = report(tmp_path / "run")
    assert doc["run"]["outcome"] == "stopped" and doc["run"]["stopped_by"] == "max-steps"
    assert len(steps(tmp_path / "run")) == 12
    assert "--max-steps" in r.stderr
    m = doc["traces"][0]["metrics"]
    assert m["steps.source"] == "ProfilerStep" and m["steps.count"] == 3
    assert (tmp_path / "run" / "tensorboard").is_dir()


def test_duration_stops_gracefully(tmp_path):
    t0 = time.monotonic()
    r = prun("--duration", "6", "--no-trace", EX / "compute_bound.py", "--steps", "100000", "--width", "256",
             "--batch-size", "32", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 40
    doc = report(tmp_path / "run")
    assert doc["run"]["stopped_by"] == "duration" and doc["run"]["outcome"] == "stopped"


def test_sigint_is_forwarded_and_leaves_a_report(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), "--no-trace",
                          str(EX / "compute_bound.py"), "--steps", "100000", "--width", "256", "--batch-size", "32"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "steps.jsonl").exists() and len(steps(out)) >= 3:
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)                          # to perfdoctor only: it must forward it
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, err      # as python: killed by the SIGINT it did not handle
    assert "KeyboardInterrupt" in err and "exit code 130" in err
    assert "collect/child.py" not in err and "runpy" not in err, err     # the traceback python would print
    assert report(out)["run"]["outcome"] == "interrupted"


def test_no_optimizer_falls_back_to_dataloader_iterations(tmp_path):
    r = prun("--skip-steps", "2", "--trace-steps", "3", EX / "no_optimizer.py", "--steps", "40", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    recs = steps(tmp_path / "run")
    assert recs and all(s["mode"] == "dataloader" for s in recs)
    assert len(recs) >= 25                                # 40 batches minus the fallback's first 8
    assert any("DataLoader iteration" in n for n in report(tmp_path / "run")["run"]["notes"])


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    r = prun("--no-trace", EX / "grad_accum.py", "--steps", "40", "--accum", "4", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    recs = steps(tmp_path / "run")
    # Boundaries every 4 micro-batches (micro 4, 8, ..., 40); the script skips the updates at
    # micro 20 and 40 by hand, so 8 updates of two optimizers each. The first update starts the
    # count; a hand-skipped update merges its micro-batches into the next step.
    assert [s["batches"] for s in recs] == [4, 4, 4, 8, 4, 4, 4]


GRADSCALER = r"""
import torch, torch.nn as nn
m = nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for i in range(12):
    loss = m(torch.randn(8, 4)).sum()
    scaler.scale(loss).backward()
    if i in (5, 6):
        m.weight.grad.fill_(float("inf"))        # overflow: GradScaler skips this optimizer step
    scaler.step(opt); scaler.update(); opt.zero_grad()
print("gradscaler: done")
"""


def test_gradscaler_skipped_steps_still_end_a_step(tmp_path):
    script = tmp_path / "scaler.py"
    script.write_text(GRADSCALER)
    r = prun("--no-trace", script, out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    recs = steps(tmp_path / "run")
    assert len(recs) == 11                     # 12 iterations, the first starts the count
    assert [s["step"] for s in recs if s.get("skipped")] == [5, 6]


def test_spawned_workers(tmp_path):
    r = prun("--skip-steps", "2", "--trace-steps", "2", EX / "spawn_workers.py", "--steps", "12", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "spawn_workers: done" in r.stdout
    assert len(steps(tmp_path / "run")) >= 10


def test_module_mode(tmp_path):
    r = prun("--skip-steps", "2", "--trace-steps", "2", "-m", "pkg_train.train", "--steps", "12",
             out=tmp_path / "run", cwd=EX)
    assert r.returncode == 0, r.stderr
    assert "as module __main__" in r.stdout
    assert report(tmp_path / "run")["run"]["command"].startswith("-m pkg_train.train")


def test_script_that_profiles_itself(tmp_path):
    r = prun("--skip-steps", "0", EX / "self_profiling.py", "--trace-dir", tmp_path / "own", "--steps", "12",
             out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    notes = " ".join(report(tmp_path / "run")["run"]["notes"])
    assert "own profiler" in notes
    assert list((tmp_path / "own").glob("*.json*"))        # the script's own trace still got written


def test_missing_script_is_a_usage_error(tmp_path):
    r = prun(tmp_path / "nope.py", out=tmp_path / "run")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


# Steps per run: enough measured time after the ~3 s of imports for the 0.5 s samplers to see
# the steady state. The IO-bound example's verdict and split: tests/test_short_runs.py.
@pytest.mark.quiet
@pytest.mark.parametrize("script,args,n,bound,split", [
    ("cpu_bound_loader.py", ["--workers", "0"], 30, "input_cpu", "cpu"),
    ("cpu_bound_loader.py", ["--workers", "2"], 150, "input_cpu", "cpu"),
    ("compute_bound.py", [], 15, "device", None),
    ("overhead_bound.py", [], 60, "host", None),
], ids=["cpu-loader-w0", "cpu-loader-w2", "compute", "overhead"])
def test_examples_get_their_verdict(tmp_path, script, args, n, bound, split):
    out = tmp_path / "run"
    r = prun("--max-steps", str(n), EX / script, *args, out=out)
    assert r.returncode == 0, r.stderr
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert doc["verdict"]["bound"] == bound, doc["verdict"]["summary"]
    if split:
        assert m["input.split"] == split
    assert m["steps.source"] == "ProfilerStep" and m["run.steps"] == n
    assert m["machine.cpu_count"] >= 1 and m["gpu.util_mean"] is None     # no GPU here: no GPU numbers
    assert "no NVIDIA GPU found" in " ".join(doc["run"]["notes"])
    # memory that warms up (torch's allocator, the loader's buffers, the profiler's) is no leak
    assert m["host.rss_peak_bytes"] > 0 and m["host.rss_growth_per_step_bytes"] in (0.0, None)
    assert "PD216" not in {f["id"] for f in doc["flags"]}


EARLY = r"""
import os, sys
assert "torch" not in sys.modules, "torch was imported before the script"
os.environ["OMP_NUM_THREADS"] = "1"               # must still take effect
import torch
assert torch.get_num_threads() == 1, torch.get_num_threads()
print("argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(6):
    m(torch.randn(8, 4)).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_script_imports_torch_itself_with_python_semantics(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(EARLY)
    r = prun("--no-trace", script, "--flag", "x", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "argv ['--flag', 'x'] path0 True" in r.stdout


@pytest.mark.quiet
def test_stacks_are_sampled_or_refusal_is_explained(tmp_path):
    r = prun("--stacks", "--no-trace", "--duration", "10", EX / "cpu_bound_loader.py", "--workers", "1",
             "--batch-size", "2", "--steps", "100000", out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    doc = report(tmp_path / "run")
    notes = " ".join(doc["run"]["notes"])
    if "py-spy could not attach" in notes or "py-spy not found" in notes:
        assert doc["stacks"] is None
        return
    assert len(list((tmp_path / "run" / "stacks").glob("pyspy-*.json"))) >= 2      # trainer and worker
    # the worker's per-sample work and the trainer's wait for it are named
    roles = {t["role"] for t in doc["stacks"]["top"]}
    assert doc["stacks"]["steady_steps"] >= 3 and roles == {"trainer", "worker"}, doc["stacks"]
    assert "Where the steady steps go" in r.stderr


def test_trace_compression_off_the_training_thread(tmp_path):
    """The child writes plain JSON and compresses it in the background; readers take the .gz,
    or the plain file when compression never finished; hidden partial files are never traces."""
    import gzip

    from perfdoctor.collect.hooks import compress_trace
    from perfdoctor.diagnose.live import run_traces

    d = tmp_path / "trace"
    d.mkdir()
    plain = d / "h_1.pt.trace.json"
    body = b'{"traceEvents": [' + b",".join(b'{"ph": "X", "ts": %d}' % i for i in range(5000)) + b"]}"
    plain.write_bytes(body)
    assert run_traces(d) == [plain]                       # not compressed (yet): the plain file
    compress_trace(str(plain))
    gz = d / "h_1.pt.trace.json.gz"
    assert not plain.exists() and gzip.decompress(gz.read_bytes()) == body
    assert sorted(p.name for p in d.iterdir()) == ["h_1.pt.trace.json.gz"]
    other = d / "h_2.pt.trace.json"
    other.write_bytes(body)
    (d / ".h_2.pt.trace.json.gz.partial").write_bytes(b"half")   # killed mid-compression
    assert run_traces(d) == [gz, other]
    other.with_name(other.name + ".gz").write_bytes(gzip.compress(body))   # renamed, not yet removed
    assert run_traces(d) == [gz, other.with_name(other.name + ".gz")]
    compress_trace(str(d / "missing.pt.trace.json"))       # a failure leaves no partial file behind
    assert not list(d.glob(".missing*"))


LAUNCHER = r"""
import subprocess, sys
print("launching", flush=True)
subprocess.call([sys.executable, "-c", "import time; time.sleep(120)"])
"""


def test_a_launcher_that_trains_in_another_process_is_stopped_at_once_and_said_so(tmp_path):
    """A script that never imports torch has no step boundary to stop at: --duration stops it at
    once (not after the 30 s grace, as an interrupted failure), and the report says that the
    training ran in a process perfdoctor does not follow."""
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    t0 = time.monotonic()
    r = prun("--duration", "2", script, out=tmp_path / "run")
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout == "launching\n", r.stderr
    assert took < 20, took
    doc = report(tmp_path / "run")
    assert doc["run"]["outcome"] == "stopped" and doc["verdict"]["bound"] == "inconclusive"
    assert any("had not imported torch in its own process" in n for n in doc["verdict"]["notes"])
    assert "median step" not in r.stderr and "median traced step" not in r.stderr


NO_LOOP = r"""
import torch
x = torch.randn(128, 128)
for _ in range(3):
    y = x @ x
print("done", tuple(y.shape))
"""


def test_a_script_without_a_training_loop_is_told_so_in_one_sentence(tmp_path):
    """A script that imports torch, computes and ends without a step (a user trial) reads "No
    training step was recorded", not a verdict rule that found nothing in step timings it never had."""
    script = tmp_path / "noloop.py"
    script.write_text(NO_LOOP)
    r = prun(script, out=tmp_path / "run")
    assert r.returncode == 0 and r.stdout == "done (128, 128)\n", r.stderr
    doc = report(tmp_path / "run")
    v = doc["verdict"]
    assert v["bound"] == "inconclusive" and v["summary"].startswith("No training step was recorded"), v["summary"]
    assert v["notes"] == [] and "no trace was recorded (the script recorded no step)" in doc["run"]["notes"]
    assert "No training step was recorded" in r.stderr and "step timings alone" not in r.stderr


def test_a_path_with_spaces_runs_as_python_runs_it_and_is_quoted_in_the_report(tmp_path):
    """sys.argv as `python "dir with space/s.py" "a b"` gives it; the report's command can be
    pasted back into a shell."""
    d = tmp_path / "my runs"
    d.mkdir()
    (d / "s.py").write_text("import sys\nprint(sys.argv)\n")
    bare = subprocess.run([sys.executable, "my runs/s.py", "a b", "c"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    r = prun("my runs/s.py", "a b", "c", out=tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == bare.stdout == "['my runs/s.py', 'a b', 'c']\n", r.stderr
    assert report(tmp_path / "run")["run"]["command"] == "'my runs/s.py' 'a b' c"
    assert "perfdoctor run 'my runs/s.py' 'a b' c" in r.stderr
