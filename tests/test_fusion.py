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
    # the pointwise arithmetic folds into its neighbours; the rest keeps its pass
    pw = m["fusion.pointwise_share"]
    assert 0 < pw < share
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - share + (share - pw)), abs=1e-4)

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


def test_pointwise_share_is_the_arithmetic_copies_and_casts_among_the_unfused_kernels(tmp_path):
    """A device-bound CUDA step: a GEMM, then an add and a dtype copy (pointwise: fusion folds
    them), a layer norm and a dropout (they keep their pass), 100 us each."""
    from kineto import HandTrace

    from perfdoctor.diagnose.offline import diagnose_path

    kernels = ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
               "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >",
               "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
               "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>",
               "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>"]
    tr, t = HandTrace(), 0.0
    for i in range(3):
        s0 = t = max(t, tr.device_free)
        for kname in kernels:
            tr.op(1, t, "aten::op", 10.0, ext=tr.corr + 1)
            tr.launch(1, t + 2, kname, 100.0)
            t += 10.0
        t = max(t, tr.device_free)
        tr.step(i, s0, t)
    tr.write(tmp_path / "pw.json")
    doc = diagnose_path(str(tmp_path / "pw.json"))
    m = doc["traces"][0]["metrics"]
    step = m["steps.time_mean_ms"] * 1000
    assert m["fusion.unfused_share"] == pytest.approx(400 / step * m["share.device"], rel=0.02)
    assert m["fusion.pointwise_share"] == pytest.approx(200 / step * m["share.device"], rel=0.02)
    fix = next(f for f in doc["findings"] if f["slug"] == "compile-fuse")
    u, pw = m["fusion.unfused_share"], m["fusion.pointwise_share"]
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - pw), rel=0.01)
    assert fix["gain"]["model_range"] == pytest.approx([1 / (1 - pw / 2), 1 / (1 - u + (u - pw) / 1.3)], rel=0.01)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_cpu_run_that_compiles_its_model_is_not_told_to_compile_it(tmp_path, compiled):
    """On a CPU-only trace compiled code shows as host ops (Torch-Compiled Region, CompiledFunction):
    fusion.compiled is true there, and PD312 (compile the model) does not fire; a step of small
    ops without them keeps PD312."""
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.trace.loader import load_trace

    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=100)] * 4, device="cpu"), path)     # ten 10-us ops a step
    doc = json.loads(path.read_text())
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    if compiled:
        for s in steps:
            doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0",
                                       "pid": s["pid"], "tid": s["tid"], "ts": s["ts"] + 1, "dur": 10})
    path.write_text(json.dumps(doc))
    m = analyze(load_trace(path)).metrics
    assert m["trace.platform"] == "cpu" and m["cpu.small_op_share"] >= 0.15
    assert m["fusion.compiled"] is compiled
    ids = {f["id"] for f in diagnose_path(path)["findings"]}
    assert ("PD312" in ids) is not compiled
