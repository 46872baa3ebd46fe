"""Kernel math precision from names, and the mixed-precision model built on it."""

from __future__ import annotations

import pytest

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


def test_peak_ratios_by_generation():
    fp32, tf32 = peak_ratios(9.0)            # H100: 67 / 495 / 989 TFLOPS
    assert fp32 == pytest.approx(989 / 67) and tf32 == pytest.approx(989 / 495)
    assert peak_ratios(8.0) == pytest.approx((16.0, 2.0))     # A100
    assert peak_ratios(7.0)[0] == pytest.approx(125 / 15.7)  # V100: fp16 tensor cores, no TF32
    assert peak_ratios(6.1) is None and peak_ratios(None) is None
