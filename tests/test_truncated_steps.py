"""A trace file cut off mid-write (profiler killed, gzip stream cut short): the step the cut runs
through is not analysed, nor are the steps after it, and with no complete step left the verdict is
inconclusive instead of one read from the first events of a step (analyze/steps.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib

import pytest

import tracegen as tg
from perfdoctor.analyze.pipeline import analyze
from perfdoctor.diagnose.confidence import confidence
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.trace.loader import load_trace

S = tg.StepSpec


def cut_gz(spec: tg.TraceSpec, path, event: str, nth: int = 1, into: int = 60, props: dict | None = None) -> str | None:
    """Write the trace as a gzip stream that stops `into` characters inside the `nth` event named
    `event` (every event before it complete), as a writer killed there leaves it: no final deflate
    block, no gzip trailer. Returns the number of the last ProfilerStep written before the cut.
    `props`: the trace's deviceProperties (a CPU-trained script's trace on a machine with a GPU)."""
    obj, _ = tg.build(spec)
    if props is not None:
        obj = {"deviceProperties": [props], **{k: v for k, v in obj.items() if k != "deviceProperties"}}
    text = tg.render(obj)
    blocks = [m.start() for m in re.finditer(r"\n  \{\n", text)]       # one per event, in file order
    names = [e["name"] for e in obj["traceEvents"]]
    at = [i for i, n in enumerate(names) if n == event][nth - 1]
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    path.write_bytes(c.compress(text[:blocks[at] + into].encode()) + c.flush(zlib.Z_SYNC_FLUSH))
    begun = [n.split("#")[1] for n in names[:at] if n.startswith("ProfilerStep#")]
    return begun[-1] if begun else None


def steps_of(path):
    a = analyze(load_trace(path))
    return a, (list(a.steps.labels) if a.steps is not None else None)


def test_cut_in_the_host_events_drops_the_step_it_runs_through(tmp_path):
    spec = tg.TraceSpec(steps=[S(cpu_ops_us=2000)] * 6, device="cpu")           # ProfilerStep#5..#10
    assert cut_gz(spec, tmp_path / "cut.json.gz", "aten::relu", nth=8) == "7"    # inside step 7's ops
    a, labels = steps_of(tmp_path / "cut.json.gz")
    assert a.metrics["trace.truncated"] is True
    assert labels == ["5", "6"] and a.metrics["steps.count"] == 2
    assert a.notes[-1].startswith("dropped step 7: the trace file was cut off during step 7")
    # the kept steps are the whole steps: 2 ms of ops each (tracegen's exact durations)
    assert a.metrics["steps.time_mean_ms"] == pytest.approx(2.0, abs=0.05)


def test_cut_in_the_device_events_drops_the_steps_whose_kernels_are_missing(tmp_path):
    """Device events follow the host events and run behind them: the cut's time is the device's.
    Step 7 lost only its last kernel, too few for the rule that drops a last step with fewer than
    80% of the kernels of the step before it."""
    spec = tg.TraceSpec(steps=[S(cpu_ops_us=500, kernels=10, kernel_us=200)] * 5)   # steps 5..9 on a GPU
    obj, _ = tg.build(spec)
    kernels = [e for e in obj["traceEvents"] if e.get("cat") == "kernel"]
    last_host = max(i for i, e in enumerate(obj["traceEvents"]) if e.get("cat") == "cpu_op")
    assert obj["traceEvents"].index(kernels[0]) > last_host                       # the layout kineto writes
    name = kernels[29]["name"]                                                     # the last kernel of step 7
    cut_gz(spec, tmp_path / "cut.json.gz", name, nth=sum(k["name"] == name for k in kernels[:30]))
    a, labels = steps_of(tmp_path / "cut.json.gz")
    assert labels == ["5", "6"] and a.metrics["trace.platform"] == "cuda"
    assert any("cut off during step 7" in n for n in a.notes)


def test_gpu_trace_cut_before_its_device_events_has_no_step_to_judge(tmp_path):
    """Cut in the host events, a GPU trace holds no kernel at all: read as is, it would pass for a
    CPU-only trace of complete steps."""
    spec = tg.TraceSpec(steps=[S(cpu_ops_us=500, kernels=10, kernel_us=200)] * 5)
    assert cut_gz(spec, tmp_path / "cut.json.gz", "ProfilerStep#8") == "7"
    a, labels = steps_of(tmp_path / "cut.json.gz")
    assert labels is None and a.metrics["steps.count"] == 0
    assert any("cut off before its first device event" in n for n in a.notes)
    # nor is it a CPU-only trace: its header names the device its properties describe
    assert a.metrics["trace.platform"] == "cuda" and a.metrics["trace.device_name"] == "Tesla V100-SXM2-32GB"


@pytest.mark.parametrize("cut_in", ["host events", "trailer"])
def test_cpu_trained_trace_on_a_gpu_machine_is_cpu_unless_the_cut_hid_that(tmp_path, cut_in):
    """A script trained on the CPU of a machine with a GPU: its trace has the device's properties
    and no device event. Cut in its trailer, every step is there and it is a CPU trace; cut in
    its host events, the device events it may have had are lost: its steps are dropped, and it is
    not called CPU only."""
    spec = tg.TraceSpec(steps=[S(cpu_ops_us=2000)] * 4, device="cpu")
    event, into = ("aten::relu", 60) if cut_in == "host events" else ("Iteration Start: PyTorch Profiler", 20)
    cut_gz(spec, tmp_path / "cut.json.gz", event, nth=3 if cut_in == "host events" else 1, into=into,
           props={"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0})
    a, labels = steps_of(tmp_path / "cut.json.gz")
    assert a.metrics["trace.truncated"] is True
    if cut_in == "trailer":
        assert a.metrics["trace.platform"] == "cpu" and labels == ["5", "6", "7", "8"]
    else:
        assert a.metrics["trace.platform"] == "cuda" and labels is None
        assert a.metrics["trace.device_name"] == "NVIDIA H100 80GB HBM3"


def test_cut_in_the_trailer_keeps_every_step(tmp_path):
    """Metadata and the profiler's own span come after every activity: a cut there cut no step."""
    spec = tg.TraceSpec(steps=[S(cpu_ops_us=2000)] * 4, device="cpu")
    cut_gz(spec, tmp_path / "cut.json.gz", "Iteration Start: PyTorch Profiler", into=20)
    a, labels = steps_of(tmp_path / "cut.json.gz")
    assert a.metrics["trace.truncated"] is True and labels == ["5", "6", "7", "8"]


def test_cut_inside_the_only_step_is_inconclusive(tmp_path):
    """The user trial's case: the first 1000 bytes of a gzipped trace held the step annotation and
    its first ops, so 91% of the step read as untraced and the verdict said host-bound."""
    spec = tg.TraceSpec(steps=[S(data_wait_us=1300, cpu_ops_us=50000)], device="cpu")
    assert cut_gz(spec, tmp_path / "cut.pt.trace.json.gz", "aten::relu", nth=2) == "5"
    a, labels = steps_of(tmp_path / "cut.pt.trace.json.gz")
    assert labels is None and a.metrics["steps.count"] == 0 and a.metrics["share.host"] is None
    notes = confidence("inconclusive", a.metrics)[1]
    assert any("cut off before any step was complete" in n for n in notes)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(tmp_path / "cut.pt.trace.json.gz"),
                        "--format", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"]["bound"] == "inconclusive" and doc["verdict"]["confidence"] == 0.0
    assert doc["findings"] == [] or all(not f["ranked"] for f in doc["findings"])
    assert any("truncated" in w or "ends early" in w for w in doc["traces"][0]["warnings"])
    assert doc["traces"][0]["steps"] == [] and "dropped step 5" in doc["traces"][0]["notes"][-1]
    term = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(tmp_path / "cut.pt.trace.json.gz")],
                          capture_output=True, text=True, timeout=60)
    assert term.returncode == 0 and "INCONCLUSIVE" in term.stdout and "HOST-BOUND" not in term.stdout


@pytest.mark.integration
def test_real_gpu_trace_cut_in_its_device_events(shared_traces, tmp_path):
    """An H100 trace: the device events come one launching thread after the other (the main
    thread's, then the autograd thread's). Cut in the first pass, no step has its backward
    kernels; cut in the last step's, the four steps before it stand."""
    data = (shared_traces / "h100" / "compute" / "trace" / "vm_504.pt.trace.json.gz").read_bytes()
    (tmp_path / "a.json.gz").write_bytes(data[:int(len(data) * 0.6)])
    a, labels = steps_of(tmp_path / "a.json.gz")
    assert labels is None and "every launching thread" in a.notes[-1]
    (tmp_path / "b.json.gz").write_bytes(data[:int(len(data) * 0.995)])
    a, labels = steps_of(tmp_path / "b.json.gz")
    assert labels == ["1", "2", "3", "4"] and a.notes[-1].startswith("dropped step 5: the trace file was cut off during")
    b = evaluate(load_rules(), a.metrics)
    assert b.verdict.rule.bound == "device"                       # as the whole trace says


def test_a_cpu_steps_stub_left_by_the_profilers_stop_is_dropped(tmp_path):
    """A script that ends inside the traced window leaves its last ProfilerStep as a stub (the
    profiler stopped in it: 0 ops, 0.14 ms beside 1157 ms in a user's trial). On a CPU trace
    there is no device work to tell it by: its host ops are. A usual step after a heavier one
    (an evaluation) is kept."""
    stub = [S(kernels=10)] * 4 + [S(kernels=0, cpu_ops_us=100)]
    a = analyze(load_trace(_write(tmp_path / "stub.json", tg.TraceSpec(steps=stub, device="cpu"))))
    assert a.metrics["steps.count"] == 4
    assert any("the profiler stopped inside it" in n for n in a.steps.notes)
    heavy_before = [S(kernels=10)] * 3 + [S(kernels=40)] + [S(kernels=10)]
    a = analyze(load_trace(_write(tmp_path / "eval.json", tg.TraceSpec(steps=heavy_before, device="cpu"))))
    assert a.metrics["steps.count"] == 5 and not a.steps.notes


def _write(path, spec):
    tg.write(spec, path)
    return path


def _with_last_step_longer(tmp_path, spec, extra_us: float, every_us: float = 0.0):
    """The trace of `spec` with the last ProfilerStep range `extra_us` longer (nothing traced in
    it), and every other one `every_us` longer."""
    path = tmp_path / "t.json"
    tg.write(spec, path)
    doc = json.loads(path.read_text())
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    for e in steps[:-1]:
        e["dur"] += every_us
    steps[-1]["dur"] += extra_us
    path.write_text(json.dumps(doc))
    return analyze(load_trace(path))


def test_the_profilers_stop_inside_the_last_step_is_not_the_steps_time(tmp_path):
    """The TensorBoard plugin's ResNet-50 sample (4 workers): its last step's range ran 80 ms past
    its last op and device work, with nothing traced, where every earlier step ended at its last
    op: that is the profiler stopping. Counted, it made the window host-bound. The last step ends
    at its last traced work; untraced time at the end of every step is the script's, and stays."""
    for device in ("cuda", "cpu"):
        # the device-bound CUDA steps end with their kernels (8 ms), after their host range (1 ms)
        spec = tg.TraceSpec(steps=[tg.StepSpec(kernels=20, kernel_us=400)] * 5, device=device, gap_us=2000)
        tg.write(spec, tmp_path / "plain.json")
        plain = analyze(load_trace(tmp_path / "plain.json"))
        usual = float(plain.steps.duration[:-1].mean())
        cut = _with_last_step_longer(tmp_path, spec, 40_000)
        assert cut.steps.duration[-1] == pytest.approx(plain.steps.duration[-1], abs=5), device
        assert any("cut the last step after its last traced work" in n for n in cut.steps.notes), device
        kept = _with_last_step_longer(tmp_path, spec, 1500, every_us=1500)     # every step has such a tail
        assert not any("cut the last step" in n for n in kept.steps.notes), device
        if device == "cpu":
            assert kept.steps.duration[-1] == pytest.approx(plain.steps.duration[-1] + 1500) and usual > 0


def test_a_first_step_waiting_on_work_the_profiler_never_saw_is_dropped(tmp_path):
    """The TensorBoard plugin's ResNet-50 (4 workers): the window's first step blocks 45.7 ms in a
    cudaMemcpyAsync before any device event is traced, waiting on kernels launched before the
    profiler started; the device read idle there, which made the window host-bound. Such a step is
    dropped (the device state is unknown); a short wait of the same kind is kept."""
    from kineto import HandTrace

    def trace(wait_us: float):
        tr = HandTrace()
        t = 0.0
        for i in range(5):
            s0 = t
            if i == 0:                         # the copy waits for unseen work, then its own copy runs
                tr.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                                  "ts": t + 10, "dur": wait_us, "args": {"correlation": 999}})
                tr.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                                  "pid": 0, "tid": 7, "ts": t + 10 + wait_us - 30, "dur": 25.0,
                                  "args": {"correlation": 999, "device": 0, "stream": 7}})
                t += wait_us + 20
                tr.device_free = t
            for _ in range(20):
                tr.op(1, t, "aten::mul", 20.0, ext=tr.corr + 1)
                tr.launch(1, t + 5, "void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 100.0)
                t += 25.0
            t = max(t, tr.device_free) + 10
            tr.step(i, s0, t)
        path = tmp_path / f"w{wait_us:.0f}.json"
        tr.write(path)
        return analyze(load_trace(path)).steps

    long_wait, short_wait = trace(1500.0), trace(50.0)
    assert len(long_wait) == 4 and long_wait.labels[0] == "1"
    assert any("dropped the first step: its host waited 1.5 ms in cudaMemcpyAsync" in n for n in long_wait.notes), long_wait.notes
    assert len(short_wait) == 5 and not any("dropped the first step" in n for n in short_wait.notes)
