"""Kernel math precision from names, and the mixed-precision model built on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdoctor.analyze.fusion import is_memory_bound
from perfdoctor.analyze.kinds import COMM_KERNEL_RX
from perfdoctor.analyze.precision import kernel_class, peak_ratios

NAMES = {
    # cuBLAS / cuDNN / CUTLASS GEMMs and convolutions
    "volta_sgemm_128x64_nn": "gemm_fp32",
    "cutlass_80_simt_sgemm_64x64_8x5_tn_align1": "gemm_fp32",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4": "gemm_fp32",
    "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int)": "gemm_fp32",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1": "gemm_tf32",
    "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32": "gemm_tf32",
    "ampere_s16816gemm_128x64_ldg8_stages_64x3_nn": "gemm_tf32",
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn": "gemm_half",
    "volta_h884gemm_64x64_ldg8_nn": "gemm_half",
    "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32": "gemm_half",
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm_half",
    "nvjet_hsh_256x128_64x4_2x1_v_bz_TNN": "gemm_half",
    "nvjet_sss_tf32_128x256_TNT": "gemm_tf32",
    "nvjet_sm90_sss_128x128_64x4_1x2_h_bz_coopA_NNT": "gemm_tf32",   # fp32 in on tensor cores: TF32
    # attention
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)": "attention_fp32",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64": "attention_half",
    # "bfloat16" holds "float": still half (PyTorch's FlashAttention-2 and memory-efficient kernels)
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true>": "attention_half",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention_half",
    # collectives reduce fp32 gradients under autocast too: not work autocast changes
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "other",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "other",
    # "convert" is not a convolution
    "void cudnn::fusion::convert_dq_to_16bits<float, __nv_bfloat16>(float const*, __nv_bfloat16*)": "other",
    # not GEMMs
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float)": "memory_fp32",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>": "layout",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": "memory_fp32",
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>": "other",
    "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float>>": "other",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_kernel_class(name):
    assert kernel_class(name) == NAMES[name]


# Real kernel names as profilers and Nsight print them, gathered from public traces, kernel tables
# and generated code (each with where it was seen and why its class is what it is): fp8/MXFP8
# cuBLASLt (5-letter nvjet type codes), ROCm Tensile bf16/fp16, fp64, legacy cuDNN convolutions,
# FlashAttention-3 (a bf16 element type with a float accumulator), Inductor's kernels, PyTorch's
# symmetric-memory collectives. 22 of them were classified wrongly before.
REAL = json.loads((Path(__file__).parent / "kernel_names.json").read_text())


@pytest.mark.parametrize("row", REAL, ids=[r["name"][:60] for r in REAL])
def test_real_kernel_names(row):
    assert kernel_class(row["name"]) == row["class"], row["why"]
    assert bool(COMM_KERNEL_RX.search(row["name"])) == row["communication"]
    if row["communication"]:                  # a collective is never fusable memory-bound work
        assert not is_memory_bound(row["name"])


def test_cudnn_1d_fft_convolution_and_intra_node_all_reduce():
    assert kernel_class("void fft1d_r2c_32<float, float, float2, false, false>(float2*, float const*, int, int3)") \
        == "gemm_fp32"
    assert COMM_KERNEL_RX.search("void c10d::intra_node_comm::oneShotAllReduceKernel<16ul, true>(at::BFloat16*)")
    assert not COMM_KERNEL_RX.search("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>")


def test_names_that_do_not_tell_their_precision_claim_none():
    """Inductor's max-autotune templates (a GEMM whose dtype the name does not give) and its
    pointwise kernels named after the convolution they follow are not fp32 SIMT convolutions."""
    for name in ("triton_tem_fused_mm_0", "triton_tem_fused_mm_relu_0", "triton_poi_fused_convolution_1",
                 "triton_red_fused_convolution_backward_3"):
        assert kernel_class(name) == "other", name


def test_peak_ratios_by_generation():
    fp32, tf32 = peak_ratios(9.0)            # H100: 67 / 495 / 989 TFLOPS
    assert fp32 == pytest.approx(989 / 67) and tf32 == pytest.approx(989 / 495)
    assert peak_ratios(8.0) == pytest.approx((16.0, 2.0))     # A100
    assert peak_ratios(7.0)[0] == pytest.approx(125 / 15.7)  # V100: fp16 tensor cores, no TF32
    assert peak_ratios(6.1) is None and peak_ratios(None) is None



def test_peak_ratios_past_the_table_are_unknown_and_geforce_parts_have_their_own():
    """cc 12.0 (an RTX 5090) and 13.0 were given B200's 28x fp32 -> bf16; past cc 11 there is no
    table unless the part is a GeForce, whose fp32-accumulate tensor math runs at half rate and TF32
    at the fp32 rate (RTX 3090 35.6 / 35.6 / 71 TFLOPS, 4090 82.6 / 82.6 / 165, 5090 104.8 / 104.8 / 209.5)."""
    assert peak_ratios(10.0) == pytest.approx((2250 / 80, 2250 / 1100))          # B200
    for cc in (11.0, 12.0, 12.1, 13.0):
        assert peak_ratios(cc) is None and peak_ratios(cc, "NVIDIA RTX PRO 6000 Blackwell") is None
    for cc, name in ((8.6, "NVIDIA GeForce RTX 3090"), (8.9, "NVIDIA GeForce RTX 4090"),
                     (12.0, "NVIDIA GeForce RTX 5090")):
        assert peak_ratios(cc, name) == pytest.approx((2.0, 2.0)), name
    assert peak_ratios(8.9, "NVIDIA L4") == pytest.approx((4.0, 2.0))          # data-center Ada: 30.3 / 60 / 121
    assert peak_ratios(7.5, "NVIDIA GeForce RTX 2080 Ti") == pytest.approx((4.0, 1.0))
    assert peak_ratios(6.1, "NVIDIA GeForce GTX 1080") is None


def _with_device(path, name, major, minor):
    doc = json.loads(path.read_text())
    doc["deviceProperties"] = [{"id": 0, "name": name, "computeMajor": major, "computeMinor": minor,
                                "totalGlobalMem": 34e9}]
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("props, cc, name", [
    ({"computeMajor": "abc", "computeMinor": 0}, 7.0, "X"), ({"computeMajor": 13, "computeMinor": None}, 7.0, "X"),
    ({"computeMajor": 1e308}, 7.0, "X"), ({"computeMajor": True, "computeMinor": 0}, 7.0, "X"),
    ({"computeMajor": 8, "name": 7}, 8.0, None), ({"computeMajor": 7, "computeMinor": 5, "name": ["GTX 1660"]}, 7.5, None)])
def test_device_properties_of_any_type_never_crash_the_report(tmp_path, props, cc, name):
    """A compute capability that is not two small integers is unknown (then read from the kernels'
    names: volta_sgemm is 7.x), a name that is not a string none (both raised: '13.None' was parsed
    as a float, an int name searched as a string)."""
    path = tmp_path / "odd.json"
    _step_trace(path, [("volta_sgemm_128x64_nn", 900)])
    doc = json.loads(path.read_text())
    doc["deviceProperties"] = [{"id": 0, "name": "X", **props}]
    path.write_text(json.dumps(doc))
    m, _ = _metrics_and_fixes(path)
    assert m["trace.compute_capability"] == cc and m["trace.device_name"] == name
    assert m["trace.capability_from_kernels"] == (name == "X")


def test_an_unknown_generation_gets_autocast_with_no_expected_gain(tmp_path):
    """fp32 SIMT GEMMs filling a device-bound step on a cc 13.0 part: PD320 fires with the share
    measured, no expected gain and the whole share as its ceiling (was: 11x expected from B200's
    ratios); the same trace on an RTX 5090 expects the GeForce ratio, 2**0.8 on that share."""
    from perfdoctor.rules.gain import amdahl

    path = tmp_path / "sgemm.json"
    _step_trace(path, [("volta_sgemm_128x64_nn", 900)])
    _with_device(path, "NVIDIA Future", 13, 0)
    m, fixes = _metrics_and_fixes(path)
    s = m["precision.amp_share"]
    assert s == pytest.approx(m["precision.gemm_fp32_share"] * m["share.device"]) and s > 0.9
    assert m["precision.amp_speedup"] is None and m["precision.amp_speedup_peak"] is None
    gain = fixes["mixed-precision"]["gain"]
    assert gain["expected"] is None and gain["ceiling"] == pytest.approx(amdahl(s, float("inf")), rel=1e-3)
    _with_device(path, "NVIDIA GeForce RTX 5090", 12, 0)
    m, fixes = _metrics_and_fixes(path)
    assert m["precision.amp_speedup"] == pytest.approx(2 ** 0.8) and m["precision.amp_speedup_peak"] == pytest.approx(2)
    gain = fixes["mixed-precision"]["gain"]
    assert gain["expected"] == pytest.approx(amdahl(s, 2 ** 0.8), rel=1e-3)
    assert gain["expected"] < gain["ceiling"] == pytest.approx(amdahl(s, 2), rel=1e-3)


def test_fp64_on_an_unknown_generation_has_no_expected_gain(tmp_path):
    from perfdoctor.analyze.precision import fp64_ratios

    assert fp64_ratios(8.6, "NVIDIA GeForce RTX 3090") == pytest.approx((64.0, 64.0))   # TF32 at the fp32 rate
    assert fp64_ratios(12.0, "NVIDIA GeForce RTX 5090") == pytest.approx((64.0, 64.0))
    assert fp64_ratios(13.0) is None and fp64_ratios(12.0) is None
    path = tmp_path / "fp64.json"
    _step_trace(path, [(DGEMM, 900)])
    _with_device(path, "NVIDIA Future", 13, 0)
    m, fixes = _metrics_and_fixes(path)
    assert m["precision.fp64_share"] > 0.9 and m["precision.fp64_speedup"] is None
    assert fixes["float32-not-float64"]["gain"]["expected"] is None

# --- the model: what autocast would change ------------------------------------------------------

def _step_trace(path, kernels, steps=3, second=None, op="aten::op"):
    """Per step each (name, us) kernel launched by its own op (named `op`), back to back on one
    stream; with second=(name, us), that kernel on a second stream, overlapping the end of the step."""
    from kineto import HandTrace

    tr, t = HandTrace(), 0.0
    for i in range(steps):
        s0 = t = max(t, tr.device_free)
        for name, us in kernels:
            tr.op(1, t, op, 20.0, ext=tr.corr + 1)
            tr.launch(1, t + 5, name, us)
            t += 25.0
        t = max(t, tr.device_free)
        if second:
            tr.events.append({"ph": "X", "cat": "kernel", "name": second[0], "pid": 0, "tid": 9,
                              "ts": t - second[1], "dur": second[1], "args": {"device": 0, "stream": 9}})
        tr.step(i, s0, t)
    tr.write(path)


TF32 = "nvjet_sm90_sss_128x128_64x4_1x2_h_bz_coopA_NNT"
BF16 = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
LN = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*)"
SOFTMAX = "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*, float const*)"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)::float>"
FLASH_BF16 = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
              "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true>")


def _metrics_and_fixes(path):
    from perfdoctor.diagnose.offline import diagnose_path

    doc = diagnose_path(str(path))
    return doc["traces"][0]["metrics"], {f["slug"]: f for f in doc["findings"]}


def test_a_model_already_in_bf16_is_not_told_to_use_mixed_precision(tmp_path):
    """bf16 GEMMs and flash attention with the norms and softmax autocast keeps in fp32: nothing
    for autocast to change. Beside TF32 GEMMs the fp32 elementwise kernels go half (their inputs
    do); the norms and softmax stay fp32 there too (autocast's fp32 op list)."""
    _step_trace(tmp_path / "bf16.json", [(BF16, 400), (FLASH_BF16, 300), (LN, 200), (SOFTMAX, 100)])
    m, fixes = _metrics_and_fixes(tmp_path / "bf16.json")
    assert m["precision.attention_half_share"] > 0.25 and m["precision.attention_fp32_share"] == 0
    assert m["precision.memory_fp32_share"] == 0
    assert m["precision.amp_share"] == 0 and "mixed-precision" not in fixes
    _step_trace(tmp_path / "tf32.json", [(TF32, 400), (LN, 200), (SOFTMAX, 100), (GELU, 200)])
    m, fixes = _metrics_and_fixes(tmp_path / "tf32.json")
    assert m["precision.memory_fp32_share"] == pytest.approx(200 / 900, rel=0.05)       # the GELU alone
    assert m["precision.amp_share"] == pytest.approx(
        (m["precision.gemm_tf32_share"] + m["precision.memory_fp32_share"]) * m["share.device"])
    assert fixes["mixed-precision"]["ranked"]


def test_an_overlapping_fp32_all_reduce_is_not_precision_work(tmp_path):
    _step_trace(tmp_path / "ddp.json", [(BF16, 600), (LN, 100)], second=("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 300))
    m, fixes = _metrics_and_fixes(tmp_path / "ddp.json")
    assert m["precision.gemm_half_share"] > 0.8 and m["precision.amp_share"] == 0
    assert "mixed-precision" not in fixes


def test_kernels_on_concurrent_streams_never_fill_more_than_the_step(tmp_path):
    """A TF32 GEMM on a second stream overlaps the first: the class shares add up to the time some
    kernel runs (the whole step here), not to the summed kernel time (1.5x the step)."""
    _step_trace(tmp_path / "two.json", [(TF32, 600)], second=(TF32, 300))
    m, _ = _metrics_and_fixes(tmp_path / "two.json")
    assert m["precision.gemm_tf32_share"] == pytest.approx(600 / 610, rel=0.02)


# --- float64: not fp32 math, not autocast's; float32 with TF32 is the fix (PD357) ----------------

DGEMM = "sm90_xmma_gemm_f64f64_f64f64_f64_nt_n_tilesize128x128x16_stage3_warpsize4x2x1_tensor16x8x16"
TANH_F64 = ("void at::native::vectorized_elementwise_kernel<2, at::native::tanh_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda(double)#1}>")


def test_a_float64_model_on_hopper_is_told_float32_not_autocast(tmp_path):
    """Hopper's DGEMMs (sm90_xmma_gemm_f64f64_...) are fp64: no fp32 math for PD206 to flag and
    nothing autocast casts (PD320); PD357 fires from the trace alone, its expected gain the fp64
    GEMM share at the H100's fp64 -> TF32 peak ratio (495 / 67) damped to r**0.8."""
    _step_trace(tmp_path / "fp64.json", [(DGEMM, 900), (TANH_F64, 100)])
    from perfdoctor.diagnose.offline import diagnose_path

    m, fixes = _metrics_and_fixes(tmp_path / "fp64.json")
    doc_flags = {f["id"] for f in diagnose_path(str(tmp_path / "fp64.json"))["flags"]}
    assert m["precision.gemm_fp32_share"] == 0 and m["tensor_core.eligible_share"] == 0
    assert m["precision.gemm_fp64_share"] == pytest.approx(900 / 1025, rel=0.03)
    assert m["precision.amp_share"] == 0 and "mixed-precision" not in fixes and "PD206" not in doc_flags
    r = 495 / 67
    assert m["precision.fp64_speedup"] == pytest.approx(r ** 0.8) and m["precision.fp64_speedup_peak"] == pytest.approx(r)
    fix = fixes["float32-not-float64"]
    s = m["precision.fp64_share"]
    assert s == pytest.approx(m["precision.gemm_fp64_share"] * m["share.device"])
    assert fix["ranked"] and fix["gain"]["expected"] == pytest.approx(1 / (1 - s + s / r ** 0.8), rel=1e-3)
    assert fix["gain"]["expected"] < fix["gain"]["ceiling"] <= r + 1e-6


def test_fp64_beside_fp32_is_credited_to_neither_fix_twice(tmp_path):
    """An fp32 GEMM beside an fp64 one: autocast acts on the fp32 one only, float32 on the fp64 one."""
    _step_trace(tmp_path / "mixed.json", [(DGEMM, 300), ("ampere_sgemm_128x64_nn", 600)])
    m, fixes = _metrics_and_fixes(tmp_path / "mixed.json")
    assert m["precision.gemm_fp32_share"] == pytest.approx(2 * m["precision.gemm_fp64_share"], rel=1e-4)
    assert m["precision.gemm_fp32_share"] + m["precision.gemm_fp64_share"] > 0.95
    assert m["precision.amp_share"] == pytest.approx(m["precision.gemm_fp32_share"] * m["share.device"], rel=1e-4)
    assert "mixed-precision" in fixes and "float32-not-float64" in fixes


def test_fp64_ratios_by_generation():
    from perfdoctor.analyze.precision import fp64_ratios

    assert fp64_ratios(9.0) == pytest.approx((1.0, 495 / 67))      # H100: fp64 tensor cores = fp32 SIMT rate
    assert fp64_ratios(8.0) == pytest.approx((1.0, 8.0))            # A100
    assert fp64_ratios(8.9) == pytest.approx((64.0, 128.0))         # Ada / consumer Ampere: 1/64-rate fp64
    assert fp64_ratios(7.0)[1] == pytest.approx(15.7 / 7.8)         # V100: no TF32, fp32 SIMT
    assert fp64_ratios(6.1) is None and fp64_ratios(None) is None


def test_an_a100_already_on_tensor_cores_is_not_told_to_move_to_an_a100(tmp_path):
    """A GPU-bound A100 trace whose GEMMs already run fp16 on tensor cores (a public matmul
    benchmark's, JeremyMorlier/GPUModel): the hardware cost note fires, and proposed 'a newer GPU
    generation (A100 / H100)' to an A100. Its title names no generation; its text says what each
    generation adds over the one before."""
    path = tmp_path / "a100.json"
    _step_trace(path, [("ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_nn", 15_000)])
    doc = json.loads(path.read_text())
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0,
                                "totalGlobalMem": 85095874560}]
    path.write_text(json.dumps(doc))
    m, fixes = _metrics_and_fixes(path)
    assert m["trace.compute_capability"] == 8.0 and m["share.device"] > 0.99 and "no-tensor-cores" not in fixes
    note = fixes["faster-gpu"]
    assert "A100" not in note["title"], note["title"]
    assert "H100 (Hopper) over an A100" in note["fix"]["text"]


# --- channels_last: the layout conversions and NCHW batch norm (PD342) ----------------------------

CONV_BF16 = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1"
TO_NHWC = "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>"
BN_NCHW = "void at::native::batch_norm_backward_kernel<c10::BFloat16, float, float, int>(float)"
BN_NHWC = "void at::native::batch_norm_backward_elemt_channels_last_kernel<4, c10::BFloat16, float, float>(float)"


@pytest.mark.parametrize("name, nchw", [
    (BN_NCHW, True), (BN_NHWC, False),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(float)", True),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float)", True),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::BFloat16>", False),
    ("triton_red_fused__native_batch_norm_legit_functional_0", False),     # Inductor picks its own layout
    (CONV_BF16, False), (TO_NHWC, False), (LN, False)])
def test_nchw_batch_norm_kernels_by_name(name, nchw):
    from perfdoctor.analyze.precision import nchw_norm

    assert nchw_norm(name) is nchw


def test_channels_last_is_credited_with_the_conversions_and_nchw_batch_norm(tmp_path):
    """A bf16 CNN in NCHW: PD342's expected gain is the conversions gone and batch norm 3x faster,
    its ceiling both gone; the same network in channels_last (NHWC batch-norm kernels, no
    conversions) gets no such advice."""
    _step_trace(tmp_path / "nchw.json", [(CONV_BF16, 300), (TO_NHWC, 200), (BN_NCHW, 400)])
    m, fixes = _metrics_and_fixes(tmp_path / "nchw.json")
    L, N, d = m["precision.layout_share"], m["precision.nchw_norm_share"], m["share.device"]
    assert L == pytest.approx(200 / 900, rel=0.05) and N == pytest.approx(400 / 900, rel=0.05)
    g = fixes["channels-last"]["gain"]
    assert g["expected"] == pytest.approx(1 / (1 - d * (L + N * 2 / 3)), rel=0.01)
    assert g["ceiling"] == pytest.approx(1 / (1 - d * (L + N)), rel=0.01)
    assert g["range"][0] == pytest.approx(1 / (1 - d * (L / 2 + N / 2)), rel=0.01)
    assert g["range"][0] < g["expected"] < g["range"][1] <= g["ceiling"]
    _step_trace(tmp_path / "nhwc.json", [(CONV_BF16, 300), (BN_NHWC, 150)])
    m, fixes = _metrics_and_fixes(tmp_path / "nhwc.json")
    assert m["precision.nchw_norm_share"] == 0 and m["precision.layout_share"] == 0
    assert "channels-last" not in fixes


def test_channels_last_is_not_offered_where_the_only_convolutions_are_1d(tmp_path):
    """A Conv1d model's convolutions run on 3-D tensors, which no memory format reorders; cuDNN
    runs them as 2-D convolutions of height 1 with the layout conversions around them, so
    channels_last would leave them: PD342 is not offered. The same kernels under aten::conv2d are."""
    kernels = [(CONV_BF16, 300), (TO_NHWC, 200), (BN_NCHW, 400)]
    for op, applies in (("aten::conv1d", False), ("aten::conv2d", True), ("aten::op", None)):
        _step_trace(tmp_path / "c.json", kernels, op=op)
        m, fixes = _metrics_and_fixes(tmp_path / "c.json")
        assert m["precision.conv_layout_applies"] is applies, op
        assert m["precision.layout_share"] > 0.2 and ("channels-last" in fixes) is (applies is not False), op


# --- bf16 only where the part has it: Volta/Turing get fp16 -------------------------------------

BF16_HARDCODED = ("dtype=torch.bfloat16", "torch.autocast(\"cuda\", torch.bfloat16", ".to(torch.bfloat16)")


def test_no_fix_shown_on_a_pre_ampere_gpu_hard_codes_bf16():
    """Volta and Turing have fp16 tensor cores and no bf16 ones (autocast to bf16 there is emulated
    or disabled): a CUDA fix that can fire below compute capability 8.0 picks the dtype from the
    device (as PD320's snippet does), never torch.bfloat16 outright. PD342 and PD329 did."""
    from perfdoctor.rules.loader import load_rules

    bad = []
    for rule in load_rules():
        if not rule.snippet or not ({"cuda", "any"} & set(rule.devices)) or "compute_capability >= 8" in rule.when:
            continue
        picked = "get_device_capability() >= (8, 0)" in rule.snippet
        bad += [f"{rule.id}: {s}" for s in BF16_HARDCODED if s in rule.snippet and not (picked and s.startswith(".to"))]
    assert not bad, bad


def test_a_v100_cnn_in_nchw_is_shown_fp16_autocast_for_channels_last(tmp_path):
    path = tmp_path / "v100.json"
    _step_trace(path, [("volta_scudnn_128x64_relu_interior_nn_v1", 400),
                       ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>", 200),
                       ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(float)", 300)])
    _with_device(path, "Tesla V100-SXM2-32GB", 7, 0)
    _, fixes = _metrics_and_fixes(path)
    snippet = fixes["channels-last"]["fix"]["snippet"]
    # the fix alone (autocast is PD320's, whose snippet picks fp16 before Ampere)
    assert "channels_last" in snippet and "autocast" not in snippet, snippet
    amp = fixes["mixed-precision"]["fix"]["snippet"]
    assert "torch.float16" in amp and not any(s in amp for s in BF16_HARDCODED), amp


def test_a_turing_part_without_tensor_cores_is_not_told_its_tensor_cores_are_unused(tmp_path):
    """GTX 16xx, MX450 and the small Quadro T parts are compute capability 7.5 without tensor cores
    (TU116/TU117): PD206 told a GTX 1660 its tensor cores sat unused and PD320 expected an RTX
    2080 Ti's 4x. fp16 runs at twice the fp32 rate on their CUDA cores: 2x is the peak ratio."""
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.rules.gain import amdahl

    assert peak_ratios(7.5, "NVIDIA GeForce GTX 1660 SUPER") == pytest.approx((2.0, 1.0))
    assert peak_ratios(7.5, "Quadro T1000") == pytest.approx((2.0, 1.0))
    path = tmp_path / "gtx.json"
    _step_trace(path, [("turing_sgemm_128x64_nn", 900)])
    for name, has in (("NVIDIA GeForce GTX 1660 SUPER", False), ("NVIDIA GeForce RTX 2080 Ti", True)):
        _with_device(path, name, 7, 5)
        m, fixes = _metrics_and_fixes(path)
        flags = {f["id"] for f in diagnose_path(str(path))["flags"]}
        assert m["trace.tensor_cores"] is has and ("PD206" in flags) is has, name
        r = 4.0 if has else 2.0
        s = m["precision.amp_share"]
        assert fixes["mixed-precision"]["gain"]["expected"] == pytest.approx(amdahl(s, r ** 0.8), rel=1e-3), name


def test_the_gpu_that_ran_the_kernels_sets_the_generation_not_the_first_listed(tmp_path):
    """A workstation lists its display GPU (a GT 710, cc 3.5) first and trains on device 1, an RTX
    4090: its fp32 GEMMs were read as a pre-Volta part's (no PD320, PD206 silent)."""
    path = tmp_path / "two.json"
    _step_trace(path, [("ampere_sgemm_128x64_nn", 900)])
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["device"] = 1
    doc["deviceProperties"] = [
        {"id": 0, "name": "NVIDIA GeForce GT 710", "computeMajor": 3, "computeMinor": 5, "totalGlobalMem": 2e9},
        {"id": 1, "name": "NVIDIA GeForce RTX 4090", "computeMajor": 8, "computeMinor": 9, "totalGlobalMem": 24e9}]
    path.write_text(json.dumps(doc))
    m, fixes = _metrics_and_fixes(path)
    assert (m["trace.device_name"], m["trace.compute_capability"], m["trace.device_memory_bytes"]) == \
        ("NVIDIA GeForce RTX 4090", 8.9, 24e9)
    assert m["precision.amp_speedup_peak"] == pytest.approx(2.0) and "mixed-precision" in fixes


@pytest.mark.parametrize("names, floor", [
    (["volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>"], 7.0),
    (["volta_sgemm_128x64_nt", "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn"], 7.5),
    (["maxwell_scudnn_128x32_relu_small_nn"], 5.0),          # also ran on Pascal: a floor, not the part
    (["ampere_sgemm_64x32_sliced1x4_nn"], 8.0),
    (["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4",
      "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1"], 9.0),
    (["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"], 9.0),
    (["nvjet_sm100_ootst_128x128"], 10.0),
    (["cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4"], 8.0),
    (["fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
      "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)"], 8.0),
    (["sm_86_something"], 8.6),
    # names that say nothing of the architecture (or look like it and are not)
    (["void at::native::elementwise_kernel<128, 4>", "smem_transpose", "asm100_kernel", "cudnn_sm12",
      "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>",
      "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"], None),
    ([], None),
])
def test_the_capability_a_traces_kernels_were_built_for(names, floor):
    from perfdoctor.analyze.archnames import capability_floor
    assert capability_floor(names) == floor


def test_kernels_never_claim_more_than_the_gpu_the_trace_names(shared_traces):
    """On every corpus trace that names an NVIDIA GPU, the floor read from its kernels' names is at
    most that GPU's capability (a floor, not the part: the H100 alloc run's GEMMs are all sm80_)."""
    import gzip

    from perfdoctor.analyze.archnames import capability_floor
    checked = 0
    for p in sorted(shared_traces.rglob("*.json.gz")):
        doc = json.load(gzip.open(p, "rt"))
        props = doc.get("deviceProperties") if isinstance(doc, dict) else None
        if not props or "NVIDIA" not in str(props[0].get("name")) and "Tesla" not in str(props[0].get("name")):
            continue
        cc = float(f"{props[0]['computeMajor']}.{props[0]['computeMinor']}")
        floor = capability_floor({e.get("name") for e in doc["traceEvents"]
                                  if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel"})
        if floor is not None:
            assert floor <= cc, (p, floor, cc)
            checked += 1
    assert checked >= 8
