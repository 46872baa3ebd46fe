"""A real trace, recorded by torch.profiler on the CPU during the test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

RECORD = r"""
import sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.profiler import profile, schedule, tensorboard_trace_handler, ProfilerActivity
torch.manual_seed(0)
class Slow(Dataset):           # CPU-heavy __getitem__: a loader that is the bottleneck
    def __len__(self): return 4096
    def __getitem__(self, i):
        x = torch.randn(64, 64)
        for _ in range(12): x = torch.tanh(x @ x.T / 64)
        return x[0], i % 10
dl = DataLoader(Slow(), batch_size=32, num_workers=0)
m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1], use_gzip=True), profile_memory=True) as p:
    for i, (x, y) in enumerate(dl):
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); p.step()
        if i == 7: break
"""


@pytest.fixture(scope="module")
def cpu_trace_dir(tmp_path_factory):
    pytest.importorskip("torch", reason="torch is a test dependency (pip install -c constraints.txt -e '.[test]')")
    d = tmp_path_factory.mktemp("tb")
    r = subprocess.run([sys.executable, "-c", RECORD, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d


def test_real_cpu_trace(cpu_trace_dir):
    files = list(cpu_trace_dir.glob("*.pt.trace.json.gz"))
    assert len(files) == 1
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(files[0]), "-f", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    m = doc["traces"][0]["metrics"]
    assert m["trace.platform"] == "cpu" and m["steps.source"] == "ProfilerStep" and m["steps.count"] == 4
    assert m["input.loader"] == "single_process" and m["input.num_workers_zero"] is True
    # The dataset does 12 matmuls per sample on the trainer thread: loading dominates, as traced ops.
    assert m["input.data_wait_share"] > 0.5
    assert m["input.traced_op_share_of_wait"] > 0.5
    assert doc["verdict"]["bound"] == "input_cpu"
    assert all(v is None for k, v in m.items() if k.startswith(("gpu.", "tensor_core.", "sync.", "memcpy.")))
    assert m["memory.events"] > 0 and m["memory.peak_reserved_bytes"] is None   # CPU allocations only
    assert "num_workers_zero" in {f["id"] for f in doc["flags"]}
    assert "GPU" not in doc["verdict"]["summary"]
