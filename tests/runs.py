"""`perfdoctor run` from the tests: a script run under it, or bare, and the files of its run directory;
a script that records its own trace, and that trace diagnosed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def prun(*args, out: Path, env: dict | None = None, cwd=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=dict(os.environ, **(env or {})))


def bare(script: Path, *args, cwd=None):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=240, cwd=cwd)


def prun_script(tmp_path: Path, name: str, text: str, *args, opts: tuple = (), trace: bool = False):
    """Write a script and run it under `perfdoctor run [--no-trace] [opts]` (a trace only when
    `trace`): (result, run directory)."""
    script = tmp_path / name
    script.write_text(text)
    out = tmp_path / "run"
    r = prun(*(() if trace else ("--no-trace",)), *opts, script, *args, out=out)
    assert r.returncode == 0, r.stderr
    return r, out


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def child(out: Path) -> dict:
    return json.loads((out / "child.json").read_text())


def steps(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]


def recorded(tmp_path: Path, text: str, timeout: int = 300) -> tuple[set[str], dict]:
    """Run a script that writes a torch.profiler trace to its first argument: (the trace's event
    names, `perfdoctor report`'s document of it)."""
    from perfdoctor.diagnose.offline import diagnose_path
    script, trace = tmp_path / "recorded.py", tmp_path / "t.json"
    script.write_text(text)
    r = subprocess.run([sys.executable, str(script), str(trace)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}, diagnose_path(str(trace))
