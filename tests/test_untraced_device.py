"""A trace that lists a device (deviceProperties) yet holds no device activity and no runtime call
was recorded without that device's activity (torch.profiler without ProfilerActivity.CUDA): its
ops may have run on the GPU and its copies gone to it. A public trace of that kind (an RTX 4080
SUPER listed, 110 CPU ops of rand/square/to) read "CPU only" with full confidence in the header."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tracegen as tg
from perfdoctor.diagnose.offline import diagnose_path

S = tg.StepSpec
GPU = {"id": 0, "name": "NVIDIA GeForce RTX 4080 SUPER", "computeMajor": 8, "computeMinor": 9}


def _trace(tmp_path, props: list, profiler_sync: bool = False, gpu_labels: int = 0):
    """CPU-only steps (device='cpu': no kernel, no runtime call) with `props` as deviceProperties,
    and with `profiler_sync` the profiler's own cudaDeviceSynchronize after the last step, as a
    run recorded with the CUDA activity on a GPU machine has it; `gpu_labels`: an older torch's
    trace, no deviceProperties but a process label for each GPU it found."""
    obj, _ = tg.build(tg.TraceSpec(steps=[S(cpu_ops_us=3000)] * 4, device="cpu", fmt="legacy2021" if gpu_labels else "kineto"))
    if gpu_labels:
        obj["traceEvents"] += [{"name": "process_labels", "ph": "M", "ts": 0, "pid": g, "tid": 0,
                                "args": {"labels": f"GPU {g}"}} for g in range(gpu_labels)]
    else:
        obj["deviceProperties"] = props
    if profiler_sync:
        end = max(e["ts"] + e.get("dur", 0) for e in obj["traceEvents"] if e.get("ph") == "X")
        obj["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1,
                                   "tid": 1, "ts": end + 10, "dur": 50, "args": {"correlation": 1}})
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize("case", ["listed, not recorded", "recorded, CPU-trained", "no device listed",
                                  "older torch, GPU labels"])
def test_a_listed_device_without_its_activity_is_not_called_cpu_only(tmp_path, case):
    """The older torch's case: a public trace (10 x randn/to/square, a first aten::to of 3.8 s)
    with process labels GPU 0-7 and no deviceProperties had read "CPU only" with no caveat."""
    props = [] if case == "no device listed" else [GPU]
    path = _trace(tmp_path, props, profiler_sync=case == "recorded, CPU-trained",
                  gpu_labels=8 if case == "older torch, GPU labels" else 0)
    doc = diagnose_path(str(path))
    m = doc["traces"][0]["metrics"]
    assert m["trace.platform"] == "cpu" and m["steps.count"] == 4       # read as the CPU run it shows
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(path)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "step(s) from" in line)
    notes = " ".join(doc["verdict"]["notes"])
    if case in ("listed, not recorded", "older torch, GPU labels"):
        name = GPU["name"] if case == "listed, not recorded" else "GPU 0-7"
        assert m["trace.untraced_device"] == name
        assert "CPU only" not in header and f"{name} activity not recorded" in header, header
        assert doc["verdict"]["confidence"] <= 0.5 and "ProfilerActivity.CUDA" in notes
    else:
        assert m["trace.untraced_device"] is None and "CPU only" in header, header
        assert "ProfilerActivity.CUDA" not in notes
