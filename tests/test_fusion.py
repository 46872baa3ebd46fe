"""Unfused memory-bound kernels (analyze/fusion.py) and the compile-for-fusion fix (PD344)."""

from __future__ import annotations

import gzip
import json

import pytest
import tracegen as tg

from perfdoctor.analyze.fusion import is_memory_bound

S = tg.StepSpec

NAMES = {
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": True,
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": True,
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float)": True,
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::MeanOps<float>>>": True,
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>": True,
    "void at::native::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>": True,
    "void at::native::index_elementwise_kernel<128, 4>": True,
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4>": True,
    # not what compile's fusion acts on
    "cutlass_80_simt_sgemm_64x64_8x5_tn_align1": False,
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)": False,
    "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float>>": False,
    "triton_poi_fused_add_gelu_native_layer_norm_0": False,
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": False,
    "Memcpy HtoD (Pinned -> Device)": False,
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_memory_bound_by_name(name):
    assert is_memory_bound(name) is NAMES[name]


def _elementwise_truth(path, analysis) -> float:
    """Elementwise kernel time in the steps / step time, the kernels read from the raw JSON."""
    doc = json.load(gzip.open(path) if str(path).endswith(".gz") else open(path))
    lo, hi = analysis.steps.span
    kern = sum(float(e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "kernel"
               and "elementwise_kernel" in e["name"] and lo <= float(e["ts"]) < hi)
    return kern / float(analysis.steps.duration.sum())


def test_device_bound_trace_offers_compile_for_fusion(tmp_path):
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.trace.loader import load_trace

    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=2000, kernels=40, kernel_us=400, gemm_ops=20)] * 4, compute_major=9), path)
    a = analyze(load_trace(path))
    m = a.metrics
    assert m["share.device"] > 0.9 and m["fusion.compiled"] is False
    want = _elementwise_truth(path, a) * m["share.device"]
    assert 0.2 < want < 0.8 and m["fusion.unfused_share"] == pytest.approx(want, rel=1e-6)
    assert m["fusion.unfused_kernels_per_step"] == pytest.approx(20.0)     # 40 kernels, 20 of them GEMMs
    doc = diagnose_path(str(path))
    fix = next(f for f in doc["findings"] if f["id"] == "PD344")
    share = m["fusion.unfused_share"]
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (1 - share), abs=1e-4)     # rounded in JSON
    # a chain of n kernels: n passes over memory eager, about two fused
    n = m["fusion.chain_kernels"]
    assert 2 < n < 4
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share + share / (n / 2)), abs=1e-4)


def test_host_bound_trace_does_not(tmp_path):
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace

    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=8000, kernels=40, kernel_us=20)] * 4, compute_major=9), path)
    m = analyze(load_trace(path)).metrics
    assert m["share.device"] < 0.2 and m["fusion.unfused_share"] < 0.1


def test_compiled_steps_are_recognised(shared_traces):
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace

    for case, compiled in (("launch_compiled", True), ("compute", False)):
        path = next((shared_traces / "h100" / case / "trace").glob("*.json.gz"))
        assert analyze(load_trace(path)).metrics["fusion.compiled"] is compiled, case


def test_chain_kernels_weighs_each_run_of_fusable_kernels_by_its_time():
    """Two streams, in start order. Stream 1: GEMM, 3 fusable (10 us each), GEMM, 1 fusable
    (60 us); stream 2: 2 fusable (15 us each) right after stream 1's last kernel in time, which
    must not join stream 1's run. Runs (kernels, time): (3, 30), (1, 60), (2, 30)."""
    import numpy as np

    from perfdoctor.analyze.fusion import chain_kernels

    stream = np.array([1, 1, 1, 1, 1, 1, 2, 2])
    start = np.array([0, 10, 20, 30, 40, 50, 110, 125], float)
    dur = np.array([10, 10, 10, 10, 10, 60, 15, 15], float)
    fusable = np.array([False, True, True, True, False, True, True, True])
    assert chain_kernels(stream, start, dur, fusable) == pytest.approx((3 * 30 + 1 * 60 + 2 * 30) / 120)
    # order comes from the start times, not the rows
    p = np.random.default_rng(0).permutation(8)
    assert chain_kernels(stream[p], start[p], dur[p], fusable[p]) == pytest.approx(210 / 120)
    assert chain_kernels(stream, start, dur, np.zeros(8, bool)) is None
