from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("runs")     # its asserts report like a test's

sys.path.insert(0, str(Path(__file__).parent))  # tracegen

REPO = Path(__file__).resolve().parent.parent
# The rule-file cache goes to a directory of this test session (children inherit it), never ~/.cache.
os.environ["PERFDOCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="perfdoctor-test-cache-")
# ... and is removed when the session ends: each session had left up to 27 MB in /tmp.
atexit.register(shutil.rmtree, os.environ["PERFDOCTOR_CACHE_DIR"], ignore_errors=True)
# `perfdoctor run` records py-spy stacks by default only when a core is idle at the first step: a
# coin toss on a busy 2-core machine. Tests run without them unless they ask (--stacks, or
# tests/test_stacks.py's auto-mode tests, which remove this variable).
os.environ["PERFDOCTOR_STACKS"] = "0"
SHARED_TRACES = REPO.parent / "shared" / "traces"


TERMINAL_SIZE = ("COLUMNS", "LINES")


def pytest_configure_node(node) -> None:
    """The controller's terminal size variables, for the workers (below)."""
    node.workerinput["terminal_size"] = {k: os.environ.get(k) for k in TERMINAL_SIZE}


def pytest_configure(config) -> None:
    """A worker's environment as the controller's: the workers start with COLUMNS=80 and LINES=24
    where the controller has none, and perfdoctor's console wraps at 80 columns under COLUMNS (on
    a pipe without it, lines run whole): tests of a report's lines would read another output."""
    if not hasattr(config, "workerinput"):
        _compile_package()
    given = getattr(config, "workerinput", {}).get("terminal_size")
    for k, v in (given or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _compile_package() -> None:
    """perfdoctor's bytecode, written once before the tests: the suite starts `perfdoctor` and the
    scripts it runs some hundreds of times, and where PYTHONDONTWRITEBYTECODE is set (these
    machines set it, and an editable install leaves no .pyc) each start compiled the ~200
    modules it imports again: ~0.3 s of a 4-s `perfdoctor run` of a small script. Python reads
    bytecode already there whatever that variable says."""
    import compileall
    compileall.compile_dir(REPO / "perfdoctor", quiet=1)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject): two workers, or one per core on a smaller machine. Most tests start a
    script that imports torch (single-threaded, seconds): two at a time keep both cores busy."""
    return max(1, min(2, os.cpu_count() or 1))


def pytest_collection_modifyitems(session, config, items) -> None:
    """The longest test files first (tests/fileorder.py): the workers take them in this order, and
    the last files to start are short ones."""
    from fileorder import longest_first
    longest_first(items, REPO)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test, with the fixtures it sets up, holds the machine shared with the other workers;
    a test marked `quiet` (it judges timings) holds it alone (quiet.machine_share), and passes the
    hold on to the next test where that is quiet too."""
    from quiet import machine_share
    quiet = item.get_closest_marker("quiet") is not None
    keep = nextitem is not None and nextitem.get_closest_marker("quiet") is not None
    path = os.environ.get("PERFDOCTOR_TEST_TIMELINE") if item.config.rootpath == REPO else None
    t0 = time.time()
    with machine_share(item.config, quiet, keep):
        t1, cpu, busy = (time.time(), _cpu(), _machine_busy()) if path else (0.0, 0.0, 0.0)
        yield
    if path:            # not the sessions tests/test_quiet.py starts
        _timeline(path, item, quiet, t0, t1, time.time(), _cpu() - cpu, _machine_busy() - busy)


def _cpu() -> float:
    """CPU seconds of this worker and of the children it waited for (the scripts a test runs)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _machine_busy() -> float:
    """Seconds every core of the machine has been busy (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _timeline(path: str, item, quiet: bool, asked: float, held: float, done: float, cpu: float,
              busy: float) -> None:
    """PERFDOCTOR_TEST_TIMELINE=FILE: one JSON line per test (worker, test, quiet, when it asked for
    the machine, got it and ended, the CPU seconds it used, the machine's busy core-seconds while it
    ran), for tests/timeline.py to tell where a suite's wall time goes."""
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
    line = json.dumps({"worker": worker, "test": item.nodeid, "quiet": quiet, "asked": asked, "held": held,
                       "done": done, "cpu": round(cpu, 2), "busy": round(busy, 2)})
    with open(path, "a") as f:
        f.write(line + "\n")


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"integration data absent: {SHARED_TRACES} (present in CI beside the checkout)")
    return SHARED_TRACES


@pytest.fixture
def analyze_spec(tmp_path):
    """Write a tracegen spec to disk, load and analyse it; returns (analysis, truth)."""
    import tracegen as tg
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace

    def run(spec, name="t.json", **write_kw):
        path = tmp_path / name
        truth = tg.write(spec, path, **write_kw)
        return analyze(load_trace(path)), truth
    return run


# `perfdoctor run` of examples/compute_bound.py (single-threaded torch: on a shared 2-core machine
# multithreaded GEMMs slow down several-fold when another process takes a core), made at most once
# a session and shared by the gate and compare tests: "a" and "b" the same MLP twice, "wide" 3x
# wider (~9x the FLOPs). 80 steps: with a neighbour's load coming and going, 40 steps left 28
# steady steps correlated over 14, too few for an interval (seen with 2 busy loops).
MLP_RUNS = {"a": "512", "b": "512", "wide": "1536"}


@pytest.fixture(scope="session")
def mlp_run(request, tmp_path_factory):
    import fcntl
    import subprocess
    made: dict[str, Path] = {}
    # the test workers share the session's base temp folder: one worker makes each run, the other
    # waits for it and takes it (each worker had made all three)
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if hasattr(request.config, "workerinput") else root) / "mlp-runs"
    root.mkdir(exist_ok=True)

    def get(name: str) -> Path:
        if name not in made:
            d = root / name
            with open(root / f"{name}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (d / "report.json").is_file():
                    p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "80", "--out", str(d),
                                        "--force", "examples/compute_bound.py", "--batch-size", "64", "--width",
                                        MLP_RUNS[name]],
                                       cwd=REPO, capture_output=True, text=True, timeout=300,
                                       env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                            "COLUMNS": "200"})
                    assert p.returncode == 0 and (d / "report.json").is_file(), p.stderr[-2000:]
                fcntl.flock(lock, fcntl.LOCK_UN)
            made[name] = d
        return made[name]
    return get
