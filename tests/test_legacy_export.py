"""torch.autograd's own Chrome export (EventList.export_chrome_trace: `prof.events()` in torch 2.x,
every torch before 1.8): a bare list of events without categories, ops under pid "CPU functions".
A public trace of that form (KeondoPark/luxmea profiler_trace.json) and this one read as one
whole-trace step of 100% untraced host time."""

from __future__ import annotations

import json

import pytest

from perfdoctor.errors import TraceFormatError


def _record(tmp_path):
    """One CPU training loop of 4 profiled steps, exported both ways by torch itself."""
    torch = pytest.importorskip("torch", reason="torch is a test dependency")
    from torch.profiler import ProfilerActivity, profile, schedule
    torch.manual_seed(0)
    # steps of ~14 ms of ops of several ms each: the loop is compute whatever else the machine runs
    # (a batch of 256, 4 ms steps, read 'host' once in CI: a few ms of preemption a step tipped it)
    m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(1024, 512), torch.randint(0, 10, (1024,))
    legacy, kineto = tmp_path / "legacy.json", tmp_path / "kineto.json"

    def ready(p):
        p.events().export_chrome_trace(str(legacy))
        p.export_chrome_trace(str(kineto))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4),
                 on_trace_ready=ready) as prof:
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return legacy, kineto


@pytest.mark.quiet
def test_legacy_export_reads_its_steps_and_ops(tmp_path):
    from perfdoctor.diagnose.offline import diagnose_path
    legacy, kineto = _record(tmp_path)
    events = json.loads(legacy.read_text())
    assert isinstance(events, list) and not any(e.get("cat") for e in events if e["ph"] == "X")
    steps = sorted(e["dur"] for e in events if e["name"].startswith("ProfilerStep#"))
    doc = diagnose_path(str(legacy))
    m = doc["traces"][0]["metrics"]
    assert m["trace.platform"] == "cpu"
    assert m["steps.source"] == "ProfilerStep" and m["steps.count"] == 4
    assert m["steps.time_median_ms"] == pytest.approx((steps[1] + steps[2]) / 2 / 1000, abs=1e-3)   # us, to 3 places of ms
    # The ops of the same steps, as the Kineto export of the same run reads them: the loop is
    # compute on the CPU, not untraced host time.
    k = diagnose_path(str(kineto))["traces"][0]["metrics"]
    assert m["share.device"] > 0.5 and m["share.device"] == pytest.approx(k["share.device"], abs=0.1)
    assert doc["verdict"]["bound"] == "device"      # the CPU is the device here
    assert any("EventList.export_chrome_trace" in w for w in doc["traces"][0]["warnings"])


def test_legacy_export_of_a_gpu_run_is_refused(tmp_path):
    """The same export of a GPU run (cudnn ops on the CPU side, nothing under "CUDA functions")
    holds none of the device's work: one line, not a CPU-only verdict with CPU-only advice."""
    from perfdoctor.trace.loader import load_trace
    ev = [{"name": "aten::conv2d", "ph": "X", "ts": 100.0, "dur": 900.0, "tid": 1, "pid": "CPU functions", "args": {}},
          {"name": "aten::cudnn_convolution", "ph": "X", "ts": 120.0, "dur": 850.0, "tid": 1,
           "pid": "CPU functions", "args": {}},
          {"name": "aten::relu_", "ph": "X", "ts": 1100.0, "dur": 50.0, "tid": 1, "pid": "CPU functions", "args": {}}]
    p = tmp_path / "gpu_legacy.json"
    p.write_text(json.dumps(ev))
    with pytest.raises(TraceFormatError, match="GPU's activity"):
        load_trace(str(p))


def test_torch_1_7_device_functions_are_kernels(tmp_path):
    """torch <= 1.7 with use_cuda=True wrote each op's device time under pid "CUDA functions"."""
    from perfdoctor.diagnose.offline import diagnose_path
    ev = []
    for i in range(3):
        s = i * 10_000.0
        ev += [{"name": "ProfilerStep#%d" % i, "ph": "X", "ts": s, "dur": 10_000.0, "tid": 1,
                "pid": "CPU functions", "args": {}},
               {"name": "aten::cudnn_convolution", "ph": "X", "ts": s + 100, "dur": 200.0, "tid": 1,
                "pid": "CPU functions", "args": {}},
               {"name": "aten::cudnn_convolution", "ph": "X", "ts": s + 400, "dur": 6_000.0, "tid": 0,
                "pid": "CUDA functions", "args": {}}]
    p = tmp_path / "legacy_cuda.json"
    p.write_text(json.dumps(ev))
    m = diagnose_path(str(p))["traces"][0]["metrics"]
    assert m["trace.platform"] == "cuda" and m["steps.count"] == 3
    assert m["gpu.kernel_busy_share"] == pytest.approx(0.6)
