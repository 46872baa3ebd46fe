"""The console script starts a `report`'s load before importing the CLI (perfdoctor.trace.prefetch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tracegen as tg
from perfdoctor.trace.prefetch import report_path

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.mark.parametrize("argv,path", [
    (["report", "t.json"], "t.json"),
    (["report", "-f", "json", "-o", "r.json", "t.json"], "t.json"),
    (["report", "t.json", "--format=json", "--rules", "mine"], "t.json"),
    (["report", "--details", "t.json", "--annotate", "a.json.gz", "--tune", "tune.json"], "t.json"),
    (["report", "--", "-odd-name.json"], "-odd-name.json"),
    (["report"], None),
    (["report", "a.json", "b.json"], None),          # typer will say what is wrong
    (["report", "t.json", "--help"], None),
    (["report", "t.json", "--bogus"], None),
    (["report", "t.json", "-o"], None),
    (["run", "train.py"], None),
    (["--version"], None),
    ([], None),
])
def test_report_path(argv, path):
    assert report_path(argv) == path


def test_every_report_option_is_known_to_the_prefetch():
    """An option the prefetch does not know turns it off silently: the lists must follow the CLI."""
    import typer.main

    from perfdoctor.cli import app
    from perfdoctor.trace.prefetch import FLAG_OPTIONS, VALUE_OPTIONS

    cmd = typer.main.get_command(app).commands["report"]
    value = {o for p in cmd.params if p.param_type_name == "option" and not p.is_flag for o in p.opts}
    flags = {o for p in cmd.params if p.param_type_name == "option" and p.is_flag for o in p.opts} - {"--help"}
    assert value == VALUE_OPTIONS and flags == FLAG_OPTIONS


SCRIPT = """
import os, sys
sys.argv = ["perfdoctor"] + sys.argv[1:]
from perfdoctor.trace import loader, parallel, prefetch
parallel.PARALLEL_MIN_BYTES = 0
parallel.MIN_PART_BYTES = 0
parallel.usable_cpus = lambda: 2
log = open(os.environ["PD_LOG"], "a")
real_start, real_take = parallel.Helper.start, prefetch.take
def start(work, into, **kw):
    h = real_start(work, into, **kw)
    log.write(f"forked {{h.pid}}\\n"); log.flush()
    return h
def take(path):
    p = real_take(path)
    log.write(f"taken {{p is not None}}\\n"); log.flush()
    return p
parallel.Helper.start = staticmethod(start)
prefetch.take = take
from perfdoctor.console import entry
entry()
"""


def run_console(tmp_path, *args, jobs=None):
    log = tmp_path / "log.txt"
    log.unlink(missing_ok=True)
    env = dict(os.environ, PD_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("PERFDOCTOR_JOBS", None)
    if jobs:
        env["PERFDOCTOR_JOBS"] = jobs
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT).format(), *args],
                       capture_output=True, text=True, env=env, timeout=120)
    return r, (log.read_text().split("\n") if log.exists() else [])


def gone_or_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.json.gz"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500, kernels=8, syncs=1)] * 40, memory_events=True), path)
    return path


def test_prefetched_load_gives_the_same_report(tmp_path, trace):
    r, log = run_console(tmp_path, "report", str(trace), "-f", "json")
    assert r.returncode == 0, r.stderr
    assert log[0].startswith("forked ") and "taken True" in log, log   # started before the CLI, then used
    r1, _ = run_console(tmp_path, "report", str(trace), "-f", "json", jobs="1")
    assert r1.returncode == 0, r1.stderr
    a, b = json.loads(r.stdout), json.loads(r1.stdout)
    assert a["traces"][0]["metrics"] == b["traces"][0]["metrics"] and a["verdict"] == b["verdict"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("args", [["-f", "yaml"], ["--rules", "/no/such/dir"]])
def test_a_failing_report_leaves_no_helper(tmp_path, trace, args):
    r, log = run_console(tmp_path, "report", str(trace), *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    pids = [int(line.split()[1]) for line in log if line.startswith("forked ")]
    assert pids, log   # it did prefetch
    assert all(gone_or_zombie(p) for p in pids)
