"""A real trace, recorded by torch.profiler on the CPU during the test (examples/record_trace.py,
the README demo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "record_trace.py"


@pytest.fixture(scope="module")
def cpu_trace_dir(tmp_path_factory):
    pytest.importorskip("torch", reason="torch is a test dependency (pip install -c constraints.txt -e '.[test]')")
    d = tmp_path_factory.mktemp("tb")
    r = subprocess.run([sys.executable, str(EXAMPLE), str(d)], capture_output=True, text=True, timeout=300)
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
    assert "num-workers-zero" in {f["slug"] for f in doc["flags"]}
    assert doc["findings"][0]["slug"] == "loader-workers"          # the DataLoader fix ranks first
    assert "GPU" not in doc["verdict"]["summary"]
