"""What the host-to-device copies carry (analyze/host.py, the loader's copy_src column):
the HtoD copy time whose source tensor is float vs 8-bit, from record_shapes' "Input type", and
PD308 (send uint8, normalise on the device) held back when the copies are already 8-bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tracegen as tg
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.trace.schema import TENSOR_TYPES

S = tg.StepSpec
RULES = load_rules()


def shares(truth, kinds):
    """Ground truth: the copy time of the steps whose copies carry one of `kinds` / all copy time."""
    return sum(us for us, k in zip(truth.memcpy_us, kinds) if k) / sum(truth.memcpy_us)


@pytest.mark.parametrize("fmt_ns", [False, True])
def test_float_and_uint8_shares_match_the_copies(analyze_spec, fmt_ns):
    types = ["float", "unsigned char", "float", "bool", "c10::BFloat16", "float"]
    steps = [S(pinned_h2d=2, pageable_h2d=i % 2, copy_type=ty) for i, ty in enumerate(types)]
    a, truth = analyze_spec(tg.TraceSpec(steps=steps, ns_resolution=fmt_ns, seed=3))
    m = a.metrics
    assert m["memcpy.h2d_float_share"] == pytest.approx(shares(truth, [ty == "float" for ty in types]), rel=1e-9)
    assert m["memcpy.h2d_uint8_share"] == pytest.approx(
        shares(truth, [ty in ("unsigned char", "bool") for ty in types]), rel=1e-9)
    assert 0 < m["memcpy.h2d_float_share"] + m["memcpy.h2d_uint8_share"] < 1      # bf16's copies are neither


def test_unknown_without_types_or_with_most_copies_untyped(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S(pinned_h2d=3)] * 4), name="none.json")
    assert a.metrics["memcpy.h2d_share"] > 0
    assert a.metrics["memcpy.h2d_float_share"] is None and a.metrics["memcpy.h2d_uint8_share"] is None
    # one step of four typed: a quarter of the copy time known, under MIN_KNOWN (half)
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(pinned_h2d=3, copy_type="float")] + [S(pinned_h2d=3)] * 3),
                            name="few.json")
    assert shares(truth, [1, 0, 0, 0]) < 0.5
    assert a.metrics["memcpy.h2d_float_share"] is None
    a, truth = analyze_spec(tg.TraceSpec(steps=[S(pinned_h2d=3, copy_type="float")] * 3 + [S(pinned_h2d=3)]),
                            name="most.json")
    assert a.metrics["memcpy.h2d_float_share"] == pytest.approx(shares(truth, [1, 1, 1, 0]), rel=1e-9)
    assert a.metrics["memcpy.h2d_uint8_share"] == 0


def test_legacy_and_rocm_traces_and_cpu(analyze_spec):
    steps = [S(pinned_h2d=2, copy_type="unsigned char")] * 3
    a, _ = analyze_spec(tg.TraceSpec(steps=steps, device="rocm"), name="rocm.json")
    assert a.metrics["memcpy.h2d_uint8_share"] == 1 and a.metrics["memcpy.h2d_float_share"] == 0
    a, _ = analyze_spec(tg.TraceSpec(steps=steps, fmt="legacy2021"), name="legacy.json")   # Input type []
    assert a.metrics["memcpy.h2d_uint8_share"] is None


def _pd308(m: dict):
    d = evaluate(RULES, m)
    return next((f for f in d.fixes if f.rule.id == "PD308"), None)


def test_pd308_fires_on_float_copies_not_on_uint8_ones(analyze_spec):
    """An input-bound step whose HtoD copies are ~25% of it: PD308 with the float copies' share
    as its ceiling; the same step with uint8 copies: no PD308 (already done)."""
    def spec(ty):
        return tg.TraceSpec(steps=[S(data_wait_us=4000, pinned_h2d=6, kernels=4, cpu_ops_us=400, copy_type=ty)] * 4)
    found = {}
    for ty in ("float", "unsigned char", None):
        a, _ = analyze_spec(spec(ty), name=f"{ty}.json")
        m = a.metrics
        assert m["share.input"] >= 0.05 and m["memcpy.h2d_share"] >= 0.02
        found[ty] = (m, _pd308(m))
    m, f = found["float"]
    assert f is not None and m["memcpy.h2d_float_share"] == 1
    assert f.share == pytest.approx(m["memcpy.h2d_share"], rel=1e-9)
    assert found["unsigned char"][1] is None and found["unsigned char"][0]["memcpy.h2d_uint8_share"] == 1
    m, f = found[None]        # types not recorded: offered on its stated assumption, as before
    assert f is not None and m["memcpy.h2d_float_share"] is None
    assert f.share == pytest.approx(m["memcpy.h2d_share"], rel=1e-9)


def test_pd308_credits_only_the_float_copies(analyze_spec):
    """Half the steps copy float, half int64 (labels, indices): the gain's share is the float
    copies' part of the copy time, not all of it."""
    steps = [S(data_wait_us=4000, pinned_h2d=6, kernels=4, cpu_ops_us=400, copy_type=ty)
             for ty in ("float", "long int") * 3]
    a, truth = analyze_spec(tg.TraceSpec(steps=steps))
    m = a.metrics
    assert m["memcpy.h2d_float_share"] == pytest.approx(shares(truth, [1, 0] * 3), rel=1e-9)
    f = _pd308(m)
    assert f is not None and f.share == pytest.approx(m["memcpy.h2d_share"] * m["memcpy.h2d_float_share"], rel=1e-9)


def test_loader_reads_the_types_torch_records(tmp_path):
    """record_shapes on CPU: aten::to / _to_copy / copy_ of a uint8 and a float tensor carry
    their source's type; other ops and a trace without shapes get none."""
    torch = pytest.importorskip("torch", reason="torch records the trace")
    from perfdoctor.trace.loader import load_trace
    x8, xf = torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 8)
    for shapes in (True, False):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as p:
            x8.to(torch.float32)
            xf.to(torch.float64)
            torch.add(xf, 1)
        path = tmp_path / f"t{shapes}.json"
        p.export_chrome_trace(str(path))
        t = load_trace(path)
        code = t.args["copy_src"]
        got = {(t.names[n], TENSOR_TYPES[int(c)]) for n, c in zip(t.name, code) if not math.isnan(c)}
        if not shapes:
            assert not got
            continue
        assert {("aten::to", "uint8"), ("aten::_to_copy", "uint8"), ("aten::copy_", "uint8"),
                ("aten::to", "float32"), ("aten::_to_copy", "float32"), ("aten::copy_", "float32")} <= got
        assert {n for n, _ in got} <= {"aten::to", "aten::_to_copy", "aten::copy_"}
        assert np.isnan(code[np.asarray([t.names[n] == "aten::add" for n in t.name])]).all()
