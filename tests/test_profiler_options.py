"""The profiler options a trace was recorded with (trace.profiler_options): record_shapes,
with_stack and profile_memory add the profiler's work to every op on the host. A trace found on
GitHub (367 ops of a median 3 us, recorded with record_shapes) read host-bound with nothing said
of it; a host-bound verdict on a trace alone now says which options were on."""

from __future__ import annotations

import json

import pytest
from kineto import HandTrace

from perfdoctor.diagnose.offline import diagnose_path


def _host_bound(path, shapes: bool = False, frames: bool = False, header: dict | None = None):
    """Host-bound GPU steps of tiny ops (kineto.HandTrace), their ops with input types as
    record_shapes writes them, Python frames as with_stack does, or a header field of torch's."""
    tr = HandTrace()
    tr.tiny_op_steps(3, 40, 100.0)
    for e in tr.events:
        if shapes and e.get("cat") == "cpu_op":
            e["args"] |= {"Input Dims": [[4, 8], []], "Input type": ["float", "Scalar"]}
    if frames:
        ops = [e for e in tr.events if e.get("cat") == "cpu_op"]
        tr.events += [{"ph": "X", "cat": "python_function", "name": "train.py(12): step", "pid": 1, "tid": 1,
                       "ts": e["ts"] - 1, "dur": e["dur"] + 2} for e in ops[:10]]
    tr.write(path)
    if header:
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**header, **doc}))
    return diagnose_path(str(path))


@pytest.mark.parametrize("shapes,frames,header,want", [
    (False, False, None, None),
    (True, False, None, "record_shapes"),
    (True, True, None, "record_shapes, with_stack"),
    (False, False, {"record_shapes": 1}, "record_shapes"),      # torch's own field, beside deviceProperties
])
def test_the_options_a_trace_was_recorded_with_are_named_on_a_host_bound_verdict(tmp_path, shapes, frames,
                                                                                 header, want):
    doc = _host_bound(tmp_path / "t.json", shapes, frames, header)
    m = doc["traces"][0]["metrics"]
    assert doc["verdict"]["bound"] == "host"
    assert m["trace.profiler_options"] == want
    said = [n for n in doc["verdict"]["notes"] if n.startswith("the trace was recorded with")]
    one = want is not None and "," not in want
    assert said == ([] if want is None else [
        f"the trace was recorded with {want}, which add{'s' if one else ''} the profiler's own work to every op "
        f"on the host: part of this host time may be the profiler's; record the next trace without "
        f"{'it' if one else 'them'} to confirm (PD319)"])


def test_a_trace_torch_records_with_the_options_names_them(tmp_path):
    """record_shapes, with_stack and profile_memory on the CPU, as torch writes them; none without."""
    torch = pytest.importorskip("torch", reason="torch records the trace")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    for on in (True, False):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=on, with_stack=on, profile_memory=on) as p:
            for _ in range(3):
                model(x).sum().backward()
                p.step()
        path = tmp_path / f"t{on}.json"
        p.export_chrome_trace(str(path))
        m = diagnose_path(str(path))["traces"][0]["metrics"]
        assert m["trace.profiler_options"] == ("record_shapes, with_stack, profile_memory" if on else None)
