"""Math precision of the device work, and what mixed precision would do to it.

Every kernel in the steps is put in one class by its name (cuBLAS/cuDNN/CUTLASS/ATen naming):

- GEMM/convolution kernels: fp32 on the SIMT cores (`sgemm`, `ffma`, `f32f32_f32f32`), TF32 on
  tensor cores (`tf32`, Ampere+ `s1688`/`s16816`), half (bf16/fp16, incl. Volta's `884`) or fp8;
  cuBLASLt's Hopper+ `nvjet` tensor-core kernels by their type letters: `nvjet_tst`/`nvjet_hsh`
  bf16/fp16 in, `nvjet_sss` fp32 in, which on tensor cores means TF32 (five letters when A, B
  and C differ: `nvjet_qqtst` fp8); ROCm Tensile `Cijk_..._<types>_` by its A/B type (S fp32,
  X xf32, H/B half); cuDNN's legacy convolutions (`volta_scudnn_`, `turing_fp16_s1688cudnn_`);
  fp64 is a class of its own (`dgemm`/`zgemm`, tensor-core `d884gemm`, cuBLASLt/CUTLASS type
  letters `f64f64_f64f64_f64` as in Hopper's `sm90_xmma_gemm_f64f64_...`, `<double>` templates,
  Tensile D/Z): autocast never casts it, and it is no fp32 math; Inductor's max-autotune
  templates (`triton_tem_`) do not tell their dtype and claim none;
- attention kernels (`fmha`, flash, memory-efficient): fp32 when the name says f32/float (not
  "bfloat16");
- collectives (NCCL/RCCL kernels): other, whatever type they reduce (gradients stay fp32);
- the kernels of SDPA's math path, forward and backward (analyze/attention.py): other, since it
  upcasts bf16/fp16 inputs to fp32 and autocast cannot change them (a fused kernel does: PD321);
- NCHW <-> NHWC layout transposes cuDNN inserts around its NHWC convolutions (channels_last
  removes them);
- fp32 layer/group norms, softmax, losses: other, since autocast runs them in fp32 whatever
  their input (its fp32 op list); an H200 MLP-Mixer in TF32 measured 1.33x under autocast where
  crediting them promised 1.64x;
- other fp32 kernels (elementwise, batch norms, reductions, pooling) outside Optimizer.step: memory
  bound, they move half the bytes once autocast makes their inputs bf16/fp16. Autocast casts the
  inputs of GEMMs and convolutions only; the kernels between them go half because they read a
  half GEMM's output. So the memory-bound credit is scaled by the part of the GEMM/convolution/
  attention time still in fp32/TF32: none when that work is already half (what stays fp32 under
  autocast, norms, softmax, the loss, an fp32 residual stream, stays so by design), and none
  without any GEMM (autocast has nothing to cast);
- the rest (half already, integer, optimizer kernels on fp32 weights): unchanged.

The expected effect of autocast (bf16 on Ampere+, fp16 on Volta/Turing) follows from the peak
throughput ratios of the GPU generation (vendor data sheets, dense tensor math; GeForce parts from
their own, fp32-accumulate tensor math at half rate; compute capability 11 or later, GeForce aside,
has no table: the shares are measured, the speed-ups unknown), damped because
no real kernel reaches peak: a ratio r is expected to deliver r**0.8 (range r**0.6 .. r**0.95:
an H200 Transformer encoder on the fp32 SIMT cores measured ~r**0.93, the H100 ResNet-50 in TF32
with channels_last lies 7-10% above the expectation at r**0.7-0.8);
memory-bound kernels 1.7x (range 1.0-2.0x: half the bytes, or none: an elementwise kernel with
an fp32 operand stays fp32 by type promotion, as on a residual stream that autocast's fp32 norms
feed; an H200 ViT and MLP-Mixer, both such streams, measured below the range's low end with 1.3x
there: 2.93x vs 3.09x, 1.33x vs 1.35x). Kernel time only
shortens the step where the device is the critical path: the affected kernel time is weighted by
the device's busy share of the step (1.0 on a device-bound step, ~0 on a host-bound one).
Under DataParallel the replicas run side by side: only the busiest replica's kernels count,
weighted by its busy share (replicas.critical_device).
float64 GEMM/convolution time (precision.fp64_share, weighted the same way) is what float32
would shorten (PD357): the fp64 -> TF32 peak ratio of the generation (fp64 tensor cores where the
part has them: H100 67 vs 495 TFLOPS, A100 19.5 vs 156; 1/64 of fp32 on the consumer parts),
damped alike (r**0.8, range r**0.6 .. r**0.95). Conservative: the fp64 elementwise, norm and
optimizer kernels, which would move half the bytes, get no credit, and cc 10.x is taken as B200
(40 TFLOPS fp64; parts with less fp64 gain more). Without TF32 the GEMMs gain only the fp32 SIMT
ratio: 1x on A100/H100, whose fp64 tensor cores match it.
Kernels on concurrent compute streams overlap: when their summed time exceeds the time some of
them runs, every class's time is scaled by that ratio, so no share exceeds the device's busy time.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze.arrays import isin
from perfdoctor.analyze.kinds import COMM_KERNEL_RX, Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

CLASSES = ("gemm_fp32", "gemm_tf32", "gemm_half", "gemm_fp64", "attention_fp32", "attention_half", "layout",
           "memory_fp32", "other")

GEMM_RX = re.compile(r"gemm|gemv|nvjet|conv(?!ert)|winograd|implicit_convolve|fprop|dgrad|wgrad|cutlass|xmma|Cijk_|"
                     r"\bdot_kernel|splitKreduce|"
                     # cuDNN's legacy convolutions: <arch>_[<type>_]<acc><mma>cudnn_... (volta_scudnn_128x64_relu_...,
                     # turing_fp16_s1688cudnn_fp16_..., volta_fp16_s884cudnn_fp16_...)
                     r"_[shi]\d{0,5}cudnn_|"
                     # the forward/inverse FFTs of cuDNN's FFT convolution (fft2d_r2c_32x32<float, ...>, fft1d_r2c_32<...>)
                     r"\bfft[12]d_[rc]2[rc]_\d+(?:x\d+)?", re.I)
ATTENTION_RX = re.compile(r"fmha|flash|attention|cutlassF|cutlassB", re.I)
LAYOUT_RX = re.compile(r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw", re.I)
# Batch-norm kernels that work on NCHW tensors: ATen's per-channel kernels (batch_norm_backward_kernel,
# batch_norm_collect_statistics_kernel, ...; their NHWC versions say channels_last) and cuDNN's
# (bn_fw_tr_1C11_kernel_NCHW, bn_bw_1C11_kernel_new). channels_last runs them as NHWC kernels.
BATCH_NORM_RX = re.compile(r"batch_?norm|cudnn::bn_|\bbn_(?:fw|bw)_", re.I)
NHWC_NAME_RX = re.compile(r"channels_?last|nhwc", re.I)
NOT_GEMM_RX = re.compile(r"cudnn::bn_|batch_?norm|bn_fw|bn_bw|softmax|reduce_kernel|elementwise|"
                         r"compute\w*Offsets\w*Kernel|"       # cudnn::gemm::computeOffsetsKernel: index setup
                         r"^triton_(?:poi|red|per|for)_", re.I)  # Inductor pointwise/reduction kernels named after aten ops
# Inductor's templates (max-autotune): a GEMM/convolution whose dtype the name does not tell
TRITON_TEMPLATE_RX = re.compile(r"^triton_tem_")
# ROCm Tensile/hipBLASLt: Cijk_<A>_<B>_<types>_..., types led by the A/B data type: S fp32, D fp64, C/Z complex,
# X xf32, H fp16, B bf16, F8/B8 fp8, I8/4xi8 int8 (Cijk_Ailk_Bljk_SB_..., ..._HHS_BH_..., ..._BBS_BH_...)
TENSILE_RX = re.compile(r"Cijk_A[a-z]+_B[a-z]+_([0-9A-Za-z]+?)_")
# fp64: BLAS d/z GEMMs, the DMMA tensor-core d884gemm, cuBLASLt/CUTLASS type letters (sm90_xmma_gemm_f64f64_f64f64_f64_...,
# A/B, C, compute), templates on double
FP64_RX = re.compile(r"dgemm|zgemm|d884gemm|f64f64|(?<![a-z0-9])f64_f64|<double\b|\bdouble,", re.I)
HALF_RX = re.compile(r"bf16|bfloat16|BFloat16|f16|fp16|half|Half|__half|h884|h1688|h16816|hmma|"
                     r"s884|e4m3|e5m2|fp8|f8f8|_i8|int8|i8816|gemm_s8_|_s4_", re.I)
TF32_RX = re.compile(r"tf32|tfloat32|s1688gemm|s16816gemm|s1688|s16816", re.I)
FP32_GEMM_RX = re.compile(r"sgemm|ffma|f32f32_f32f32|simt|scudnn|implicit_convolve_sgemm|float", re.I)
FP32_RX = re.compile(r"float|f32|fp32", re.I)
# nvjet_[smNN_]<A/B><compute><C/D>_...: h fp16, t bf16, s fp32 (e.g. nvjet_sm90_tst_..., nvjet_hsh_...)
# 3 letters (A/B, compute, C/D) or 5 letters (A, B, C, compute, D) when they differ: nvjet_qqtst_ fp8 in,
# nvjet_sm100_ootst_ fp4 in; only fp32 inputs (s) mean TF32
NVJET_RX = re.compile(r"nvjet_(?:sm\d+_)?([a-z])(?:[a-z]{2}|[a-z]{4})_")
# fp32 as the *element* type: fmha_cutlassF_f32_..., AttentionKernel<float, ...>; not the accumulator that
# FlashAttention-3 lists after its element type (FlashAttnFwdSm90<..., cutlass::bfloat16_t, float, ...>)
EXPLICIT_FP32_RX = re.compile(r"_f32(?![0-9])|<float\b", re.I)
# What autocast runs in fp32 whatever its input (its fp32 op list: layer/group norm, softmax and
# log-softmax, the losses, logsumexp): these kernels move the same bytes after it.
AUTOCAST_FP32_RX = re.compile(r"layer_norm|LayerNorm|GammaBeta|RowwiseMoments|group_norm|GroupNorm|rms_norm|"
                              r"softmax|SoftMax|nll_loss|cross_entropy|mse_loss|l1_loss|logsumexp", re.I)
OPTIMIZER_KERNEL_RX = re.compile(r"multi_tensor_apply|fused_adam|FusedAdam|fused_sgd|_fused_", re.I)

# Dense peak throughput (TFLOPS) by compute capability, data-center parts: fp32 SIMT, TF32 tensor,
# bf16/fp16 tensor with fp32 accumulation (what autocast's GEMMs use). V100 15.7/-/125; T4 8.1/-/65;
# A100 19.5/156/312; A10/A40/L4/L40S (cc 8.6/8.9) ~4x and 2x, as 40/80/160; H100 SXM 67/495/989;
# B200 ~80/1100/2250. Each entry holds from its floor up to the next; past cc 11 (Thor, consumer and
# workstation Blackwell, parts to come) no table: the ratios are unknown, not taken from the last row.
PEAKS = ((10.0, (80.0, 1100.0, 2250.0)), (9.0, (67.0, 495.0, 989.0)), (8.6, (40.0, 80.0, 160.0)),
         (8.0, (19.5, 156.0, 312.0)), (7.0, (15.7, None, 125.0)))
KNOWN_BELOW = 11.0
# GeForce parts run fp16/bf16 tensor math with fp32 accumulation at half their data-center rate and
# TF32 at the fp32 SIMT rate (NVIDIA's architecture whitepapers: RTX 3090 35.6 fp32 / 35.6 TF32 /
# 71 fp16-with-fp32-accumulate TFLOPS, RTX 4090 82.6 / 82.6 / 165, RTX 5090 104.8 / 104.8 / 209.5;
# Turing's RTX 2080 Ti 13.4 fp32 / 53.8, no TF32), and fp64 at 1/64 of fp32 (Turing 1/32).
GEFORCE_RX = re.compile(r"GeForce", re.I)
GEFORCE = ((8.0, (1.0, 1.0, 2.0), 1 / 64), (7.5, (1.0, None, 4.0), 1 / 32))
# Turing parts without tensor cores (TU116/TU117: GTX 16xx, MX450/550, the small Quadro/T parts):
# fp16 at twice the fp32 rate on their CUDA cores (GTX 1660 Ti 5.4 / 10.9 TFLOPS), fp64 1/32
NO_TENSOR_CORES_RX = re.compile(r"GTX 16\d\d|\bMX ?[45]\d0\b|Quadro T[12]000|\bT(?:400|600|1000|1200)\b", re.I)
NO_TENSOR_CORES = ((1.0, None, 2.0), 1 / 32)
# Dense fp64 peak (TFLOPS; fp64 tensor cores where the part has them): B200 40, H100 SXM 67, consumer
# Ampere/Ada 1/64 of fp32, A100 19.5, V100 7.8 (T4, cc 7.5, has 1/32 of fp32: taken as V100, less gain)
PEAKS64 = ((10.0, 40.0), (9.0, 67.0), (8.6, 40.0 / 64), (8.0, 19.5), (7.0, 7.8))
DAMP, DAMP_LOW, DAMP_HIGH = 0.8, 0.6, 0.95
MEMORY_SPEEDUP = (1.7, 1.0, 2.0)        # expected, low, high


def kernel_class(name: str) -> str:
    if COMM_KERNEL_RX.search(name):
        return "other"
    if LAYOUT_RX.search(name) and not GEMM_RX.search(name):   # ..._nhwc2nchw_tn_v1 is a convolution
        return "layout"
    if ATTENTION_RX.search(name):
        return "attention_half" if HALF_RX.search(name) and not EXPLICIT_FP32_RX.search(name) else \
            "attention_fp32" if FP32_RX.search(name) else "other"
    if TRITON_TEMPLATE_RX.search(name):       # dtype unknown: not claimed as fp32 SIMT work
        return "other"
    if GEMM_RX.search(name) and not NOT_GEMM_RX.search(name):
        if re.search(r"tf32|tfloat32", name, re.I):     # CUTLASS's element type: cutlass::tfloat32_t
            return "gemm_tf32"
        nvjet = NVJET_RX.match(name)
        if nvjet:              # cuBLASLt's Hopper+ tensor-core kernels: fp32 inputs there are TF32
            return "gemm_tf32" if nvjet.group(1) == "s" else "gemm_half"
        tensile = TENSILE_RX.search(name)
        if tensile:
            t = tensile.group(1)
            return ("gemm_fp32" if t[0] in "SC" else "gemm_tf32" if t[0] == "X" else
                    "gemm_fp64" if t[0] in "DZ" else "gemm_half")
        if FP64_RX.search(name):           # autocast does not touch float64
            return "gemm_fp64"
        if HALF_RX.search(name):
            return "gemm_half"
        if TF32_RX.search(name):          # Ampere s1688/s16816 with fp32 in and out: TF32
            return "gemm_tf32"
        if FP32_GEMM_RX.search(name) or not HALF_RX.search(name):
            return "gemm_fp32"
    if OPTIMIZER_KERNEL_RX.search(name) or HALF_RX.search(name):
        return "other"
    if FP32_RX.search(name):
        return "other" if AUTOCAST_FP32_RX.search(name) else "memory_fp32"
    return "other"


def nchw_norm(name: str) -> bool:
    """A batch-norm kernel on NCHW tensors (one channels_last would replace by its NHWC version;
    Inductor's fused kernels choose their own layout and are not counted)."""
    return bool(BATCH_NORM_RX.search(name)) and not NHWC_NAME_RX.search(name) and not name.startswith("triton_")


def class_of_rows(t: EventTable, k: Kinds, rows: np.ndarray) -> np.ndarray:
    """Index into CLASSES of each row's kernel class (names classified once per trace)."""
    lut = k.cache.get("precision_lut")
    if lut is None:
        lut = np.fromiter((CLASSES.index(kernel_class(n)) for n in t.names), np.int8, len(t.names))
        k.cache["precision_lut"] = lut
    return lut[t.name[rows]]


def device_weight(device_share: float | None) -> float:
    """Kernel time shortens the step only where the device is the critical path: the weight of a
    kernel-time share is the device's busy share of the step (1.0 when unknown)."""
    return min(max(device_share if device_share is not None else 1.0, 0.0), 1.0)


def _peaks(cc: float | None, name: str | None) -> tuple[tuple[float, float | None, float], float] | None:
    """((fp32, tf32, half), fp64) peak throughputs (any one unit) of the part, or None when this
    model has no data for it: no tensor cores (cc < 7), the capability unknown, or past the table."""
    if cc is None or cc < 7.0:
        return None
    if not tensor_cores(cc, name):
        (fp32, tf32, half), fp64 = NO_TENSOR_CORES
        return (fp32, tf32, half), fp64 * fp32
    if name and GEFORCE_RX.search(name):
        for floor, peaks, fp64 in GEFORCE:
            if cc >= floor:
                return peaks, fp64 * peaks[0]
    if cc >= KNOWN_BELOW:
        return None
    return (next(p for floor, p in PEAKS if cc >= floor), next(v for floor, v in PEAKS64 if cc >= floor))


def tensor_cores(cc: float | None, name: str | None) -> bool | None:
    """Whether the GPU has tensor cores: from compute capability 7.0 on, but for the Turing parts
    built without them; None when the capability is unknown."""
    if cc is None:
        return None
    return cc >= 7.0 and not (cc < 8.0 and bool(name) and bool(NO_TENSOR_CORES_RX.search(name)))


def peak_ratios(cc: float | None, name: str | None = None) -> tuple[float, float] | None:
    """(fp32 -> half, tf32 -> half) peak ratios for a compute capability (and device name: GeForce
    parts differ); None when unknown."""
    peaks = _peaks(cc, name)
    if peaks is None:
        return None
    fp32, tf32, half = peaks[0]
    return half / fp32, (half / tf32 if tf32 else 1.0)


def fp64_ratios(cc: float | None, name: str | None = None) -> tuple[float, float] | None:
    """(fp64 -> fp32 SIMT, fp64 -> TF32 tensor) peak ratios for a compute capability (TF32: fp32
    where the part has none); None when unknown."""
    peaks = _peaks(cc, name)
    if peaks is None:
        return None
    (fp32, tf32, _), fp64 = peaks
    return fp32 / fp64, (tf32 or fp32) / fp64


CONV_4D = frozenset({"aten::conv2d", "aten::conv3d", "aten::conv_transpose2d", "aten::conv_transpose3d"})
CONV_3D = frozenset({"aten::conv1d", "aten::conv_transpose1d"})


def conv_layout_applies(t: EventTable, k: Kinds, steps: Steps) -> bool | None:
    """Whether channels_last can change the convolutions' layout: True where the steps run a 2-D or
    3-D convolution op (4-D/5-D tensors: channels_last, channels_last_3d), False where their only
    convolution ops are 1-D (3-D tensors, which no memory format reorders: cuDNN runs them as 2-D
    convolutions of height 1 and converts the layout around them whatever the model's format),
    None where no convolution op is named (a compiled graph calls aten::convolution directly)."""
    lo, hi = steps.span
    ops = np.flatnonzero(k.cpu_op)
    ops = ops[(t.ts[ops] >= lo) & (t.ts[ops] < hi)]
    if t.name_mask(lambda n: n in CONV_4D)[ops].any():
        return True
    return False if t.name_mask(lambda n: n in CONV_3D)[ops].any() else None


def precision_metrics(t: EventTable, k: Kinds, steps: Steps, cc: float | None,
                      device_share: float | None, on: np.ndarray | None = None, name: str | None = None,
                      ratios_known: bool = True, math_path: np.ndarray | None = None) -> dict:
    """`on`: a mask over the rows, the one device to measure (the busiest DataParallel replica,
    replicas.critical_device, with device_share its busy share); None: every device. `name`: the
    device's name (GeForce parts have other peak ratios). On a part with tensor cores whose ratios
    the table lacks the shares are measured and the speed-ups left unknown, as where `cc` is only
    a floor read from kernel names (ratios_known False: the part is unknown). `math_path`: the
    kernels of SDPA's math path (attention.attention_metrics), which are no precision work."""
    total = float(steps.duration.sum())
    lo, hi = steps.span
    kr = np.flatnonzero(k.kernel if on is None else k.kernel & on)
    kr = kr[(t.ts[kr] >= lo) & (t.ts[kr] < hi)]
    out = {f"precision.{c}_share": 0.0 for c in CLASSES[:-1]}
    out["precision.nchw_norm_share"] = 0.0
    out.update({"precision.amp_share": None, "precision.amp_speedup": None,
                "precision.amp_speedup_low": None, "precision.amp_speedup_high": None,
                "precision.amp_speedup_peak": None})
    out.update(dict.fromkeys(FP64_KEYS))
    if not len(kr) or total <= 0:
        return {key: None for key in out} | {"precision.conv_layout_applies": None}
    out["precision.conv_layout_applies"] = conv_layout_applies(t, k, steps)
    cls = class_of_rows(t, k, kr)
    mem, other = CLASSES.index("memory_fp32"), CLASSES.index("other")
    cls = np.where(_in_optimizer(t, k, kr) & (cls == mem), other, cls)
    # SDPA's math path computes in fp32 whatever its inputs (it upcasts bf16/fp16): autocast cannot
    # change its kernels, a fused attention kernel can (PD321)
    if math_path is not None and len(math_path):
        cls = np.where(isin(kr, math_path), other, cls)
    dur = t.dur[kr] * _overlap_scale(t, k, kr)
    for i, c in enumerate(CLASSES[:-1]):
        out[f"precision.{c}_share"] = float(dur[cls == i].sum()) / total
    out["precision.nchw_norm_share"] = float(dur[t.name_mask(nchw_norm)[kr]].sum()) / total
    crit = device_weight(device_share)
    out.update(_fp64(out["precision.gemm_fp64_share"] * crit, fp64_ratios(cc, name) if ratios_known else None))
    if cc is None or cc < 7.0:
        return out
    ratios = peak_ratios(cc, name) if ratios_known else None
    fp32_r, tf32_r = ratios or (None, None)
    wide = out["precision.gemm_fp32_share"] + out["precision.attention_fp32_share"] + out["precision.gemm_tf32_share"]
    narrow = out["precision.gemm_half_share"] + out["precision.attention_half_share"]
    follows = wide / (wide + narrow) if wide + narrow > 0 else 0.0    # memory kernels fed by fp32 GEMMs
    parts = [(out["precision.gemm_fp32_share"] + out["precision.attention_fp32_share"], fp32_r),
             (out["precision.gemm_tf32_share"], tf32_r)]
    shares = [s * crit for s, _ in parts] + [out["precision.memory_fp32_share"] * follows * crit]
    amp = sum(shares)
    if amp <= 0 or ratios is None:
        out.update({"precision.amp_share": max(amp, 0.0)})
        return out

    def combined(exponent: float | None, memory: float) -> float:
        new = sum(s / (r ** exponent if exponent is not None else r) for s, (_, r) in zip(shares, parts))
        return amp / (new + shares[-1] / memory)

    out.update({"precision.amp_share": amp,
                "precision.amp_speedup": combined(DAMP, MEMORY_SPEEDUP[0]),
                "precision.amp_speedup_low": combined(DAMP_LOW, MEMORY_SPEEDUP[1]),
                "precision.amp_speedup_high": combined(DAMP_HIGH, MEMORY_SPEEDUP[2]),
                "precision.amp_speedup_peak": combined(None, 2.0)})
    return out


FP64_KEYS = ("precision.fp64_share", "precision.fp64_speedup", "precision.fp64_speedup_low",
             "precision.fp64_speedup_high", "precision.fp64_speedup_peak")


def _fp64(share: float, ratios: tuple[float, float] | None) -> dict:
    """float64 GEMM/convolution time on the critical path, and what float32 with TF32 does to it."""
    if ratios is None:
        return {"precision.fp64_share": share}
    r = ratios[1]
    return dict(zip(FP64_KEYS, (share, r ** DAMP, r ** DAMP_LOW, r ** DAMP_HIGH, r)))


def _overlap_scale(t: EventTable, k: Kinds, kr: np.ndarray) -> float:
    """1, or (time some kernel runs) / (summed kernel time) when the kernels other than
    collectives overlap on streams (collectives overlap the compute by design; they are "other")."""
    from perfdoctor.analyze.intervals import total as covered

    keep = kr[~k.comm_kernel[kr]]
    summed = float(t.dur[keep].sum())
    if summed <= 0:
        return 1.0
    return min(1.0, covered(t.ts[keep], t.ts[keep] + t.dur[keep]) / summed)


def _in_optimizer(t: EventTable, k: Kinds, kr: np.ndarray) -> np.ndarray:
    """Kernels launched from inside Optimizer.step (by correlation to a launch inside it)."""
    from perfdoctor.analyze.nesting import kernels_launched_inside

    opt = np.flatnonzero(k.cpu_op & t.name_mask(lambda s: s.startswith("Optimizer.step#")))
    if not len(opt):
        return np.zeros(len(kr), bool)
    return isin(kr, kernels_launched_inside(t, k, opt))
