"""bfloat16 on a CPU without bf16 math (PD367): the CPU's flags (collect/cpuflags.py) and the
dtype CPU autocast casts to while the model runs (collect/modules.py, loop.model_cpu_autocast)."""

from __future__ import annotations

import pytest
from runs import child, prun, prun_script, report

from perfdoctor.collect.cpuflags import cpu_bf16, cpu_fp16
from perfdoctor.rules.gain import amdahl

X86_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: avx512_bf16\n"
X86_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM_V1 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\n"
ARM_N1 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n"


@pytest.mark.parametrize("text, has", [(X86_AVX2, False), (X86_AMX, True), (ARM_V1, True), (ARM_N1, False),
                                       ("processor\t: 0\n", None)])
def test_the_cpu_flags_tell_bf16_math(tmp_path, text, has):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_bf16(str(path)) is has                       # the first CPU's flags, not a later one's
    assert cpu_bf16(str(tmp_path / "missing")) is None


X86_SPR = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"


@pytest.mark.parametrize("text, has", [(X86_AVX2, False), (X86_AMX, False), (X86_SPR, True), (ARM_V1, None),
                                       (ARM_N1, None), ("processor\t: 0\n", None)])
def test_the_cpu_flags_tell_fp16_math_on_x86_only(tmp_path, text, has):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_fp16(str(path)) is has                       # Arm: whether torch uses its fp16 is unknown


# A 512-wide MLP trained under torch.autocast("cpu", dtype=torch.bfloat16) (with GradScaler and
# an EMA copy updated every step, as public CPU-AMP loops do); the evaluation at the end runs
# without autocast. On an AVX2-only EPYC its step took 43.6 ms, 6.0 ms without the autocast.
AUTOCAST = r"""
import copy, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 2))
ema = copy.deepcopy(model).eval()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
x, y = torch.randn(64, 64), torch.randint(0, 2, (64,))
for step in range(24):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update()
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.mul_(0.999).add_(pm, alpha=0.001)
with torch.no_grad():
    print("ema", ema(x).shape[0])
"""


def test_bf16_autocast_is_seen_and_pd367_follows_the_cpu(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "autocast.py", AUTOCAST, opts=("--no-stacks",), trace=True)
    script = tmp_path / "autocast.py"
    c = child(out)
    assert c["root_calls"]["cpu_autocast"] == "bfloat16" and c["cpu_bf16"] is cpu_bf16()
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.model_cpu_autocast"] == "bfloat16" and m["machine.cpu_bf16"] is cpu_bf16()
    fixes = {f["id"]: f for f in doc["findings"]}
    assert ("PD367" in fixes) is (cpu_bf16() is False)
    if "PD367" in fixes:                                    # 8x on the ops' traced share
        assert fixes["PD367"]["gain"]["expected"] == pytest.approx(amdahl(m["share.device"], 8), rel=1e-3)
    # the same loop without autocast: nothing to say
    script.write_text(AUTOCAST.replace('with torch.autocast("cpu", dtype=torch.bfloat16):', "if True:"))
    r = prun("--no-stacks", script, out=tmp_path / "fp32")
    assert r.returncode == 0, r.stderr
    assert child(tmp_path / "fp32")["root_calls"]["cpu_autocast"] is None
    assert "PD367" not in {f["id"] for f in report(tmp_path / "fp32")["findings"]}


# accelerate's Accelerator(mixed_precision="bf16").prepare(model) wraps model.forward in
# torch.autocast: the outermost call begins without autocast and the layers run under it. On the
# 2-core AVX2 VM a 1024-wide MLP prepared that way took 1.35 s a step against 0.47 s with
# mixed_precision="no" (interleaved), and PD367 was missing: the census read autocast only at the
# outermost call (helper73's probe). Done here as accelerate does it, without accelerate.
MLP = r"""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 2)){convert}
{wrap}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 64{dtype}), torch.randint(0, 2, (64,))
for step in range(16):
    loss = F.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print("loss", round(loss.item(), 3) > 0)
"""
FORWARD_AUTOCAST = MLP.format(convert="", dtype="",
                              wrap='model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)')


def test_autocast_entered_inside_the_models_forward_is_seen(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "fwd_autocast.py", FORWARD_AUTOCAST, opts=("--no-stacks",), trace=True)
    assert child(out)["root_calls"]["cpu_autocast"] == "bfloat16"
    doc = report(out)
    assert doc["traces"][0]["metrics"]["loop.model_cpu_autocast"] == "bfloat16"
    assert ("PD367" in {f["id"] for f in doc["findings"]}) is (cpu_bf16() is False)


# The same MLP converted with .bfloat16() (its batches too), trained with AdamW on its bf16
# parameters: the run counts the optimizer's parameters per dtype (params.half_dtype).
HALF_MODEL = MLP.format(convert=".bfloat16()", dtype=", dtype=torch.bfloat16", wrap="")


def test_a_model_kept_in_bf16_is_seen_and_pd368_follows_the_cpu(tmp_path):
    pytest.importorskip("torch")
    _, out = prun_script(tmp_path, "half.py", HALF_MODEL, opts=("--no-stacks",), trace=True)
    c = child(out)
    assert list(c["param_dtypes"]) == ["torch.bfloat16"] and c["root_calls"]["cpu_autocast"] is None
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["params.half_dtype"] == "bfloat16" and m["machine.cpu_bf16"] is cpu_bf16()
    assert m["machine.cpu_fp16"] is cpu_fp16()
    fixes = {f["id"]: f for f in doc["findings"]}
    assert "PD367" not in fixes                              # no autocast
    assert ("PD368" in fixes) is (cpu_bf16() is False and m["share.device"] >= 0.2)
    if "PD368" in fixes:
        assert fixes["PD368"]["gain"]["expected"] == pytest.approx(amdahl(m["share.device"], 8), rel=1e-3)


# A float32 CNN with no autocast: its convolutions and the linear layer (forward and backward) are
# most of the step. On a CPU with bf16 math PD375 offers CPU autocast, with no expected gain and
# the products' time as its ceiling (tune measured this net 1.75x [1.31-2.33] on the project's
# AVX512_BF16 VM); an elementwise loop of the same length has no products to shorten.
CNN = r"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
w = torch.randn(16, 3, 32, 32, requires_grad=True)
opt = torch.optim.SGD(model.parameters() if sys.argv[1] == "cnn" else [w], lr=0.01)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
for step in range(30):
    if sys.argv[1] == "cnn":
        loss = F.cross_entropy(model(x), y)
    else:
        loss = (((w * x).sin() + x.cos()).exp() * 0.5).tanh().square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""


@pytest.mark.parametrize("kind", ["cnn", "elementwise"])
def test_matrix_products_and_convolutions_are_timed_and_pd375_follows_the_cpu(tmp_path, kind):
    pytest.importorskip("torch")
    script = tmp_path / "cnn.py"
    script.write_text(CNN)
    r = prun("--no-stacks", script, kind, out=tmp_path / "run")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    doc = report(tmp_path / "run")
    m = doc["traces"][0]["metrics"]
    share = m["cpu.gemm_conv_share"]
    if kind == "elementwise":
        assert share == 0.0 and "PD375" not in {f["id"] for f in doc["findings"]}
        return
    # the convolutions, forward and backward, hold most of the ops' time; never more than the ops
    assert 0.4 < share <= m["share.device"], (share, m["share.device"])
    fixes = {f["id"]: f for f in doc["findings"]}
    assert ("PD375" in fixes) is (cpu_bf16() is True)
    if "PD375" in fixes:
        g = fixes["PD375"]["gain"]
        assert g["expected"] is None and g["share"] == pytest.approx(share, abs=1e-4)
        # the ceiling: the products' time removed, from the share an un-profiled step may hold (up to
        # the trace's inflation: none left to bound where that reaches the whole step)
        assert g["ceiling"] is None or g["ceiling"] >= 1 / (1 - share) - 1e-3, g
        assert "no model of the expected gain" in g["text"], g
        assert "--allow-numerics" in r.stderr and "PD375" in r.stderr


@pytest.mark.torch
def test_sparse_products_are_no_bf16_work(tmp_path):
    """torch.sparse.mm runs a dense aten::addmm inside aten::_sparse_addmm (and an aten::mm inside
    SparseAddmmBackward0): CPU autocast has no bf16 sparse product (a GCN failed under it with
    "expected scalar type Float but found BFloat16"), so only the dense layer's products count."""
    torch = pytest.importorskip("torch")
    import json

    from torch.profiler import ProfilerActivity, profile, schedule

    from perfdoctor.analyze.cpuops import is_gemm_conv
    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace
    torch.manual_seed(0)
    n = 2000
    adj = torch.sparse_coo_tensor(torch.randint(0, n, (2, 20000)), torch.rand(20000), (n, n)).coalesce()
    x = torch.randn(n, 64)
    lin = torch.nn.Linear(64, 64)
    path = tmp_path / "t.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(path))) as p:
        for _ in range(4):
            torch.sparse.mm(adj, lin(x)).sum().backward()
            p.step()
    analysis = analyze(load_trace(path))
    m = analysis.metrics
    # a plain walk: the outermost products outside any sparse op, in the steps, against the steps
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    dense = sparse = 0.0
    stack = []
    for e in ops:
        while stack and (stack[-1]["tid"] != e["tid"] or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]):
            stack.pop()
        inside = [a["name"] for a in stack]
        if is_gemm_conv(e["name"]) and not any(is_gemm_conv(a) for a in inside):
            if any("sparse" in a.lower() for a in inside):
                sparse += e["dur"]
            elif any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps):
                dense += e["dur"]
        stack.append(e)
    # the analysis' steps: on a loaded machine the profiler's stop ran the last ProfilerStep 4.5 ms
    # past its last op, a tail analyze/steps.py cuts (the plain sum read the share 1.05-1.10x low)
    total = float(analysis.steps.duration.sum())
    assert total <= sum(s["dur"] for s in steps) + 1
    # the sparse products weigh (about as much as the dense ones: which is longer is the machine's
    # load, a CI run had them 31 and 35 ms), so counting them would change the share
    assert dense > 0 and sparse > 0.2 * dense
    assert m["cpu.gemm_conv_share"] == pytest.approx(dense / total, rel=0.05)
