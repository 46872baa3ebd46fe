"""Hand-written attention (matmul, scale, mask, softmax, matmul): found among a thread's
outermost ops in traces torch records on the CPU, and sized by its kernels in a CUDA trace."""

from __future__ import annotations

import json
import math

import pytest
from kineto import HandTrace

from perfdoctor.diagnose.offline import diagnose_path

torch = pytest.importorskip("torch")


def _record(path, fn, steps=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            fn().sum().backward()
            p.step()
    p.export_chrome_trace(str(path))


@pytest.mark.torch
def test_cpu_traces_tell_hand_written_attention_from_sdpa(tmp_path):
    B, H, T, D = 2, 2, 64, 16
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def manual():
        s = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~mask, float("-inf"))
        return torch.nn.functional.dropout(s.softmax(-1), 0.1) @ v

    def fused():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def math_path():         # SDPA with dropout: on the CPU always its math path
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)

    def softmax_only():      # a softmax classifier head: not attention
        return (q.flatten(2) @ torch.ones(T * D, 10)).softmax(-1)

    _record(tmp_path / "manual.json", manual)
    _record(tmp_path / "fused.json", fused)
    _record(tmp_path / "head.json", softmax_only)
    _record(tmp_path / "math.json", math_path)
    per_step, shares, math_path_shares, fixes = {}, {}, {}, {}
    for name in ("manual", "fused", "head", "math"):
        doc = diagnose_path(str(tmp_path / f"{name}.json"))
        m = doc["traces"][0]["metrics"]
        per_step[name] = m["attention.manual_per_step"] * m["steps.count"]
        shares[name] = m["attention.manual_cpu_share"]
        math_path_shares[name] = (m["attention.math_cpu_share"], m["attention.math_cpu_gemm_share"])
        fixes[name] = {f["id"] for f in doc["findings"]} & {"PD378", "PD381"}
    # the math path's backward nodes (BmmBackward, SoftmaxBackward) are no hand-written attention:
    # a tiny BERT trained with accelerate (dropout 0.1) read PD378 "replace the hand-written attention"
    assert per_step == {"manual": 3.0, "fused": 0.0, "head": 0.0, "math": 0.0}
    assert shares["math"] == 0.0 and shares["manual"] > 0
    # the math path is timed as such (forward op and backward nodes), and offered no dropout (PD381)
    ms = math_path_shares
    assert ms["fused"] == ms["manual"] == (0.0, 0.0) and 0 < ms["math"][1] < ms["math"][0] <= 1
    assert fixes == {"manual": {"PD378"}, "fused": set(), "head": set(), "math": {"PD381"}}


def _causal_layer_step(fused: bool, T: int = 512, B: int = 4, H: int = 4, D: int = 128):
    """A training step of one causal self-attention layer on the CPU: hand-written or SDPA."""
    torch.manual_seed(0)
    qkv, out = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
    x = torch.randn(B, T, D)

    def step():
        q, k, v = qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if fused:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
            y = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1) @ v
        return out(y.transpose(1, 2).reshape(B, T, D))
    return step


@pytest.mark.torch
@pytest.mark.quiet
def test_a_cpu_trace_sizes_hand_written_attention_and_sdpa_bounds_its_gain(tmp_path):
    """On a CPU-only step the hand-written attention is host ops: its matches' time and their
    matmuls' (attention.manual_cpu_*) size PD378 (SDPA's fused CPU kernel). A user's two causal
    layers at T=512 had no attention advice at all, and SDPA measured 3.1x."""
    from quiet import interleaved_speedup
    hand, fused = _causal_layer_step(False), _causal_layer_step(True)
    _record(tmp_path / "hand.json", hand)
    _record(tmp_path / "fused.json", fused)
    doc = diagnose_path(str(tmp_path / "hand.json"))
    m = doc["traces"][0]["metrics"]
    assert m["attention.manual_per_step"] * m["steps.count"] == 3.0      # one a step, forward and backward
    att, gemm = m["attention.manual_cpu_share"], m["attention.manual_cpu_gemm_share"]
    assert 0.3 < att < 1 and 0 < gemm < 0.8 * att
    fix = next(f for f in doc["findings"] if f["id"] == "PD378")
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (1 - att), rel=1e-3)
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - att + 0.9 * gemm), rel=1e-3)
    fm = diagnose_path(str(tmp_path / "fused.json"))
    assert fm["traces"][0]["metrics"]["attention.manual_cpu_share"] == 0.0
    assert "PD378" not in {f["id"] for f in fm["findings"]}

    # the gain SDPA gives, timed interleaved outside the profiler, lies within the ceiling (2.2-2.8x
    # on a quiet 2-core VM; a CI run read 1.197 from 5 pairs, and a suite run 1.18 from 9: some
    # stretches of this VM do not show SDPA's gain, and then the bound is not put to the test)
    measured = interleaved_speedup(lambda: hand().sum().backward(), lambda: fused().sum().backward(), 9)
    assert measured <= fix["gain"]["ceiling"] * 1.15, (measured, fix["gain"])
    if measured <= 1.2:
        pytest.skip(f"SDPA measured {measured:.2f}x here (2.2-2.8x on a quiet 2-core VM): no gain shown to "
                    "bound")


def _cuda_trace(path, attention_us: float, other_us: float, steps: int = 3, kernels: dict | None = None):
    """A kineto trace: per step an attention block (matmul, div, softmax, matmul) and a linear
    layer, each op launching one kernel of the given length (attention_us split evenly, or by
    the `kernels` op -> (kernel name, us)), run back to back on the device."""
    tr, t = HandTrace(), 0.0
    for i in range(steps):
        s0 = t = max(t, tr.device_free)
        for name, us in (("aten::matmul", attention_us / 4), ("aten::div", attention_us / 4),
                         ("aten::softmax", attention_us / 4), ("aten::matmul", attention_us / 4),
                         ("aten::linear", other_us)):
            kernel, us = (kernels or {}).get(name, (f"kernel_{name}", us))
            tr.op(1, t, name, 20.0, ext=tr.corr + 1)
            tr.launch(1, t + 5, kernel, us)
            t += 25.0
        t = max(t, tr.device_free)
        tr.step(i, s0, t)
    tr.write(path)


def test_cuda_trace_sizes_hand_written_attention_and_offers_sdpa(tmp_path):
    p = tmp_path / "attn.json"
    _cuda_trace(p, attention_us=3000.0, other_us=1000.0)
    doc = diagnose_path(str(p))
    m = doc["traces"][0]["metrics"]
    assert m["attention.manual_per_step"] == pytest.approx(1.0)
    # attention kernels are 3000 of each ~4000 us device-bound step
    assert m["attention.manual_kernel_share"] == pytest.approx(0.75, abs=0.03)
    fix = {f["slug"]: f for f in doc["findings"]}["flash-attention"]
    assert fix["ranked"]
    assert fix["gain"]["expected"] == pytest.approx(1 / (0.25 + 0.75 / 2), rel=0.05)
    assert "math-attention" in {f["slug"] for f in doc["flags"]}


def test_the_gain_of_a_fused_kernel_grows_with_the_passes_over_the_scores(tmp_path):
    """Named kernels: the two matmuls are bf16 GEMMs (250 us each), the scale and the softmax over
    the T x T scores 1000 us each (long sequences). The fused kernel keeps ~1.25x the GEMMs' time
    and drops the passes: 2500 us of attention -> 625 us."""
    p = tmp_path / "named.json"
    gemm = ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 250.0)
    _cuda_trace(p, attention_us=0, other_us=1000.0, kernels={
        "aten::matmul": gemm, "aten::div": ("void at::native::elementwise_kernel<128, 2, DivFunctor<c10::BFloat16>>", 1000.0),
        "aten::softmax": ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>", 1000.0)})
    doc = diagnose_path(str(p))
    m = doc["traces"][0]["metrics"]
    step = 3500.0                                        # 2 x 250 + 2 x 1000 + 1000 us back to back
    assert m["attention.manual_kernel_share"] == pytest.approx(2500 / step, rel=0.03)
    assert m["attention.manual_gemm_share"] == pytest.approx(500 / step, rel=0.03)
    fix = {f["slug"]: f for f in doc["findings"]}["flash-attention"]
    share = m["attention.manual_kernel_share"]
    assert fix["gain"]["expected"] == pytest.approx(1 / ((1 - share) + share / (2500 / (1.25 * 500))), rel=0.01)
    assert fix["gain"]["expected"] > 1.9 and fix["gain"]["ceiling"] == pytest.approx(1 / (1 - share), rel=0.01)


NODE = "autograd::engine::evaluate_function: "


def _ops_trace(path, ops_of_step, steps: int = 3):
    """A kineto trace from ops_of_step(i) -> [(tid, op name, kernel or None, us)]: each op 20 us
    on its thread, launching its kernel (a "Memcpy ..." name: a copy), run back to back."""
    tr, t = HandTrace(), 0.0
    for i in range(steps):
        s0 = t = max(t, tr.device_free)
        for tid, name, kernel, us in ops_of_step(i):
            tr.op(tid, t, name, 20.0, ext=tr.corr + 1)
            if kernel:
                tr.launch(tid, t + 5, kernel, us, cat="gpu_memcpy" if kernel.startswith("Memcpy") else "kernel")
            t += 25.0
        t = max(t, tr.device_free)
        tr.step(i, s0, t)
    tr.write(path)
    return diagnose_path(str(path))["traces"][0]["metrics"]


def test_the_backward_counts_through_views_and_a_cut_forward_counts_as_often_as_the_backward(tmp_path):
    """As an H200 trace of a GPT stack showed it: the backward puts six view, expand and cast
    nodes between BmmBackward and SoftmaxBackward (beyond the window of 4 if they counted), a
    Clone among them copies on the device, and the profiler's window starts after the forward
    of its first step (the host runs a step ahead). Per step: forward 800 us of attention
    kernels, backward 1200 us of kernels and a 100 us copy, a linear layer 1000 us."""
    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    fwd = [("aten::matmul", gemm, 100.0), ("aten::div", "elementwise_div", 300.0),
           ("aten::softmax", "softmax_warp_forward", 300.0), ("aten::matmul", gemm, 100.0)]
    bwd = [("BmmBackward0", gemm, 200.0), ("UnsafeViewBackward0", None, 0), ("CloneBackward0", "Memcpy DtoD", 100.0),
           ("ExpandBackward0", None, 0), ("ViewBackward0", None, 0), ("ExpandBackward0", None, 0),
           ("ToCopyBackward0", None, 0), ("SoftmaxBackward0", "softmax_warp_backward", 400.0),
           ("MaskedFillBackward0", "masked_fill_kernel", 200.0), ("DivBackward0", "elementwise_div", 200.0),
           ("BmmBackward0", gemm, 200.0)]
    m = _ops_trace(tmp_path / "cut.json", lambda i: ([] if i == 0 else [(1, *f) for f in fwd])
                   + [(1, "aten::linear", "gemm_other", 1000.0)] + [(2, NODE + n, k, us) for n, k, us in bwd])
    assert m["attention.manual_per_step"] == pytest.approx(1.0)       # 3 backward, 2 forward matches
    total = 2300.0 + 2 * 3100.0                                         # device back to back
    # forward 2 x 800 us counted 3 times over, backward 3 x 1300 us (the copy included)
    assert m["attention.manual_kernel_share"] == pytest.approx((1.5 * 1600 + 3900) / total, rel=0.03)
    assert m["attention.manual_gemm_share"] == pytest.approx((1.5 * 400 + 1200) / total, rel=0.03)


def test_forward_attention_without_a_backward_counts_as_seen(tmp_path):
    """A frozen encoder's attention runs forward only, beside a trained one: per step two forward
    matches (400 us each) and one backward (600 us). The window cuts at most a step's worth of one
    direction, so a larger difference is real and nothing is scaled: (800 + 600) / 2400."""
    fwd = [("aten::matmul", "gemm_a", 100.0), ("aten::softmax", "softmax_warp_forward", 200.0),
           ("aten::matmul", "gemm_b", 100.0)]
    bwd = [(NODE + "BmmBackward0", "gemm_c", 200.0), (NODE + "SoftmaxBackward0", "softmax_warp_backward", 200.0),
           (NODE + "BmmBackward0", "gemm_d", 200.0)]
    m = _ops_trace(tmp_path / "frozen.json", lambda i: [(1, *f) for f in fwd + fwd]
                   + [(1, "aten::linear", "gemm_other", 1000.0)] + [(2, *b) for b in bwd])
    assert m["attention.manual_per_step"] == pytest.approx(2.0)
    assert m["attention.manual_kernel_share"] == pytest.approx(1400 / 2400, rel=0.03)


FP32_GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_cublas"
BF16_GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
SOFTMAX_FWD = "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*, float const*)"
SOFTMAX_BWD = "void (anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, Epilogue>(float*, float const*)"


def _math_path_trace(path, steps: int = 3, first_forward: bool = True):
    """Per step, as an H200 trace of SDPA forced onto its math path under bf16 autocast showed it:
    the forward inside aten::_scaled_dot_product_attention_math (two fp32 GEMMs of 200 us, the
    inputs upcast, and a 300 us fp32 softmax), a bf16 linear layer (1000 us), and the backward as
    the autograd nodes of the ops the math path decomposes into (two fp32 BmmBackward GEMMs of
    400 us, a 300 us SoftmaxBackward). first_forward False: the window starts after the first
    step's forward."""
    tr, t = HandTrace(), 0.0
    for i in range(steps):
        s0 = t = max(t, tr.device_free)
        if first_forward or i:
            tr.op(1, t, "aten::scaled_dot_product_attention", 100.0)
            tr.op(1, t + 2, "aten::_scaled_dot_product_attention_math", 96.0)
            for j, (kernel, us) in enumerate(((FP32_GEMM, 200.0), (SOFTMAX_FWD, 300.0), (FP32_GEMM, 200.0))):
                tr.launch(1, t + 5 + 25 * j, kernel, us)
            t += 105.0
        for tid, name, kernel, us in ((1, "aten::linear", BF16_GEMM, 1000.0), (2, NODE + "BmmBackward0", FP32_GEMM, 400.0),
                                      (2, NODE + "SoftmaxBackward0", SOFTMAX_BWD, 300.0),
                                      (2, NODE + "BmmBackward0", FP32_GEMM, 400.0)):
            tr.op(tid, t, name, 20.0, ext=tr.corr + 1)
            tr.launch(tid, t + 5, kernel, us)
            t += 25.0
        t = max(t, tr.device_free)
        tr.step(i, s0, t)
    tr.write(path)
    doc = diagnose_path(str(path))
    return doc["traces"][0]["metrics"], {f["slug"]: f for f in doc["findings"]}


def test_sdpa_math_path_is_sized_with_its_fp32_gemms_and_left_out_of_mixed_precision(tmp_path):
    """The math path computes in fp32 whatever autocast does: its kernels are the attention fix's,
    not mixed precision's; the fused kernel does its GEMM work in bf16 (the H100's fp32 -> bf16
    peak ratio, damped to r**0.8 as PD320 damps it) at 1.25x, and drops the softmax passes."""
    from perfdoctor.analyze.precision import DAMP, peak_ratios

    m, fixes = _math_path_trace(tmp_path / "math.json")
    step = 700.0 + 1000.0 + 1100.0                               # device back to back
    # the backward's matmul, softmax, matmul is the math path's own, not hand-written attention
    assert m["attention.math_ops_per_step"] == 1.0 and m["attention.manual_per_step"] == 0.0
    assert m["attention.math_kernel_share"] == pytest.approx(1800 / step, rel=0.03)
    assert m["attention.math_gemm_share"] == pytest.approx(1200 / step, rel=0.03)
    assert m["attention.manual_kernel_share"] == 0.0
    half = peak_ratios(9.0, "NVIDIA H100")[0] ** DAMP
    assert m["attention.gemm_half_speedup"] == pytest.approx(half, rel=1e-6)
    assert m["precision.gemm_fp32_share"] == 0 and "mixed-precision" not in fixes
    att, gemm = 1800 / step, 1200 / step
    fix = fixes["flash-attention"]
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - att + att / (att / (1.25 * gemm / half))), rel=0.03)
    assert fix["gain"]["expected"] > 2 > 1 / (1 - att + att / 2) and fix["ranked"]    # 2x on the share: 1.47x


def test_a_math_path_forward_cut_by_the_window_counts_as_often_as_its_backward(tmp_path):
    m, _ = _math_path_trace(tmp_path / "cut.json", first_forward=False)
    total = 2 * 2800.0 + 2100.0
    assert m["attention.math_kernel_share"] == pytest.approx((1.5 * 2 * 700 + 3 * 1100) / total, rel=0.03)


def test_a_mask_built_on_every_call_and_the_casts_at_either_end_are_the_attentions(tmp_path):
    """As an H200 GPT block with attention upcast to fp32 by hand showed it: q and k cast to fp32
    before the first matmul, a causal mask made on every call (ones, tril, bitwise_not: three ops
    between the matmul and the softmax, past the window if they counted), the weights cast back
    for the second matmul; the backward ends with the casts' ToCopyBackward. Per step: forward
    casts 2 x 100 us and the attention 1000 us, a linear layer 1000 us; backward 1200 us, its
    casts 2 x 100 us and the qkv split's UnbindBackward 300 us."""
    fwd = [("aten::to", "copy_fp32", 100.0), ("aten::to", "copy_fp32", 100.0), ("aten::transpose", None, 0),
           ("aten::matmul", "gemm_qk", 200.0), ("aten::div", "elementwise_div", 100.0), ("aten::ones", "fill", 20.0),
           ("aten::tril", "tril_kernel", 30.0), ("aten::bitwise_not", "not_kernel", 50.0),
           ("aten::masked_fill", "masked_fill_kernel", 200.0), ("aten::softmax", "softmax_warp_forward", 200.0),
           ("aten::to", "copy_bf16", 100.0), ("aten::matmul", "gemm_pv", 100.0)]
    bwd = [("BmmBackward0", "gemm_a", 200.0), ("ToCopyBackward0", "copy_a", 100.0),
           ("SoftmaxBackward0", "softmax_warp_backward", 300.0), ("MaskedFillBackward0", "masked_fill_kernel", 200.0),
           ("DivBackward0", "elementwise_div", 100.0), ("BmmBackward0", "gemm_b", 300.0),
           ("TransposeBackward0", None, 0), ("ToCopyBackward0", "copy_b", 100.0), ("ToCopyBackward0", "copy_c", 100.0),
           ("UnbindBackward0", "stack_kernel", 300.0)]
    m = _ops_trace(tmp_path / "upcast.json", lambda i: [(1, *f) for f in fwd] + [(1, "aten::linear", "gemm_other", 1000.0)]
                   + [(2, NODE + n, k, us) for n, k, us in bwd])
    assert m["attention.manual_per_step"] == pytest.approx(1.0)
    step = 1200.0 + 1000.0 + 1700.0                                     # device back to back
    # everything but the linear layer and the UnbindBackward (the qkv split, not attention)
    assert m["attention.manual_kernel_share"] == pytest.approx((1200 + 1400) / step, rel=0.03)


def test_a_match_takes_in_at_most_edge_casts_at_each_end(tmp_path):
    """Ten casts of 100 us before the first matmul: the eight next to it are the attention's
    (attention.EDGE), the two before them are not."""
    from perfdoctor.analyze.attention import EDGE

    fwd = [("aten::to", "copy_fp32", 100.0)] * 10 + [("aten::matmul", "gemm_qk", 200.0),
                                                   ("aten::softmax", "softmax_warp_forward", 200.0),
                                                   ("aten::matmul", "gemm_pv", 200.0)]
    m = _ops_trace(tmp_path / "casts.json", lambda i: [(1, *f) for f in fwd] + [(1, "aten::linear", "gemm_other", 1000.0)])
    assert EDGE == 8
    assert m["attention.manual_kernel_share"] == pytest.approx((600 + 100 * EDGE) / 2600, rel=0.03)


def test_attention_ops_whose_kernels_no_launch_ties_to_never_crash(tmp_path):
    """A CUDA trace whose kernels carry no correlation to a launch (a hostile or cut file): the
    match is counted, its device time is unknown."""
    fwd = [("aten::matmul", "gemm_qk", 200.0), ("aten::softmax", "softmax_warp_forward", 200.0),
           ("aten::matmul", "gemm_pv", 200.0), ("aten::linear", "gemm_other", 1000.0)]
    p = tmp_path / "uncorrelated.json"
    _ops_trace(p, lambda i: [(1, *f) for f in fwd])
    doc = json.loads(p.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"].pop("correlation", None)
            e["args"].pop("External id", None)
    p.write_text(json.dumps(doc))
    m = diagnose_path(str(p))["traces"][0]["metrics"]
    assert m["attention.manual_per_step"] == pytest.approx(1.0)
    assert m["attention.math_kernel_share"] is None


@pytest.mark.torch
def test_additive_attention_is_not_taken_for_a_dot_product_one(tmp_path):
    """pytorch/tutorials' seq2seq decoder scores with Linear layers (Bahdanau: v^T tanh(W q + U k)),
    over encoder outputs that are strided: the Linear runs as a matmul folded into one 2-D GEMM,
    and its UnsafeViewBackward sat beside SoftmaxBackward as if it were the QK^T product (PD378
    offered SDPA, which has no kernel for it). The dot-product (Luong) form of the same decoder
    is attention SDPA runs."""
    B, T, Hd = 8, 10, 32
    lin = {n: torch.nn.Linear(Hd, o) for n, o in (("W", Hd), ("U", Hd), ("v", 1))}
    enc = torch.randn(T, B, Hd, requires_grad=True)
    query = torch.randn(B, 1, Hd, requires_grad=True)

    def additive_step():
        keys = enc.transpose(0, 1)                       # [B, T, H], not contiguous
        scores = lin["v"](torch.tanh(lin["W"](query) + lin["U"](keys))).squeeze(2).unsqueeze(1)
        return torch.bmm(torch.softmax(scores, dim=-1), keys)

    def dot_step():
        keys = enc.transpose(0, 1)
        return torch.bmm(torch.softmax(torch.bmm(query, keys.transpose(1, 2)), dim=-1), keys)

    # a decoder's loop: the Linears' gradients accumulate after the loop's backward, so the Linear's
    # UnsafeViewBackward sits within four ops of SoftmaxBackward, as in the tutorial's trace
    def additive():
        return sum(additive_step() for _ in range(3))

    def dot():
        return sum(dot_step() for _ in range(3))

    found = {}
    for name, fn in (("additive", additive), ("dot", dot)):
        _record(tmp_path / f"{name}.json", fn)
        with open(tmp_path / f"{name}.json") as f:
            names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]
        doc = diagnose_path(str(tmp_path / f"{name}.json"))
        m = doc["traces"][0]["metrics"]
        found[name] = (m["attention.manual_per_step"] * m["steps.count"], "PD378" in {f["id"] for f in doc["findings"]})
        if name == "additive":      # the case: a Linear's matmul folded into one 2-D GEMM
            assert any(n.endswith("UnsafeViewBackward0") for n in names)
            assert any(n.endswith(": MmBackward0") for n in names)
    assert found["additive"] == (0.0, False)
    assert found["dot"][0] == 9.0           # three a step
