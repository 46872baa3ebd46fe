"""The successive profiler windows of one process (torch.profiler schedule repeat=N with
tensorboard_trace_handler: one file per window) are joined into one trace; windows of other
processes, and files that are not successive windows, are not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.torch

WINDOWS = r"""
import sys, torch, torch.nn as nn
from torch.profiler import profile, schedule, tensorboard_trace_handler, ProfilerActivity
distributed = len(sys.argv) > 2
if distributed:
    import torch.distributed as dist
    dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
if distributed:
    m = nn.parallel.DistributedDataParallel(m)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=3),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as p:
    for i in range(20):
        loss = nn.functional.cross_entropy(m(x), y); opt.zero_grad(); loss.backward(); opt.step(); p.step()
if distributed:
    dist.destroy_process_group()
    # torch 2.13's gloo sometimes aborts in a C++ destructor at a normal exit after
    # destroy_process_group() (examples/ddp_gloo.py): leave without the interpreter's teardown
    import os
    os._exit(0)
"""


def _record(tmp_path: Path, out: Path, ranks: int = 0) -> list[Path]:
    script = tmp_path / "windows.py"
    script.write_text(WINDOWS)
    if ranks:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(script), str(out), "ddp"]
    else:
        cmd = [sys.executable, str(script), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    return sorted(out.glob("*.pt.trace.json"))


def test_the_windows_of_one_process_are_one_trace_of_all_their_steps(tmp_path):
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.trace.loader import load_trace

    files = _record(tmp_path, tmp_path / "tb")
    assert len(files) == 3
    apart = [analyze(load_trace(f)) for f in files]
    doc = diagnose_path(str(tmp_path / "tb"))
    assert len(doc["traces"]) == 1 and doc["cross_rank"] is None
    t = doc["traces"][0]
    m = t["metrics"]
    assert m["trace.windows"] == 3 and m["steps.count"] == 9
    assert [s["label"] for s in t["steps"]] == [str(i) for i in (2, 3, 4, 7, 8, 9, 12, 13, 14)]
    assert t["notes"][0].startswith("3 profiler windows of one process joined into this trace (steps 2-14, 9 traced")
    # the joined trace's steps are the windows' steps: the same durations, and shares that are
    # the windows' shares weighted by their traced time
    durs = np.concatenate([a.steps.duration for a in apart]) / 1e3
    assert np.allclose([s["duration_ms"] for s in t["steps"]], durs, rtol=1e-4)
    weights = np.array([a.steps.duration.sum() for a in apart])
    for share in ("share.host", "share.device"):
        want = float(np.dot([a.metrics[share] for a in apart], weights) / weights.sum())
        assert m[share] == pytest.approx(want, abs=2e-3), share
    term = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(tmp_path / "tb")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"}).stdout
    assert "9 step(s) from ProfilerStep in 3 profiler windows of one process, joined" in term
    from perfdoctor.report import html
    assert "9 step(s) from ProfilerStep in 3 profiler windows of one process, joined" in html.render(doc)


def test_windows_that_do_not_follow_each_other_stay_apart(tmp_path):
    """Two runs of the script (other processes) and a copy of a window (the same steps again)
    are not one process's successive windows: each file is a trace of its own."""
    from perfdoctor.diagnose.offline import diagnose_path

    first = _record(tmp_path, tmp_path / "a")
    second = _record(tmp_path, tmp_path / "b")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(first[0], mixed / first[0].name)
    shutil.copy(second[1], mixed / second[1].name)
    doc = diagnose_path(str(mixed))
    assert [t["metrics"]["trace.windows"] for t in doc["traces"]] == [1, 1]
    shutil.copy(first[0], mixed / ("copy." + first[0].name))
    shutil.copy(first[1], mixed / first[1].name)
    doc = diagnose_path(str(mixed))
    assert sorted(t["metrics"]["trace.windows"] for t in doc["traces"]) == [1, 1, 1, 1]


@pytest.mark.slow
def test_the_windows_of_each_rank_are_joined_before_the_ranks_are_merged(tmp_path):
    """DDP over gloo, 2 ranks x 3 windows: two ranks of 9 steps each (before, six "ranks" of
    3 steps: "rank 0 (2)" ...)."""
    from perfdoctor.diagnose.offline import diagnose_path

    files = _record(tmp_path, tmp_path / "tb", ranks=2)
    assert len(files) == 6
    doc = diagnose_path(str(tmp_path / "tb"))
    got = sorted((t["label"], t["metrics"]["steps.count"], t["metrics"]["trace.windows"]) for t in doc["traces"])
    assert got == [("rank 0", 9, 3), ("rank 1", 9, 3)]
    assert doc["verdict"]["bound"] in ("communication", "host", "device")
    assert doc["ranks"]["count"] == 2 and len(doc["ranks"]["per_rank"]) == 2
