"""The GPU generation a CUDA trace's kernels were built for, where the trace does not name its GPU.

Kineto traces before deviceProperties (2021 and older: torch-tb-profiler's profiler_api samples)
and some sampled traces say nothing of the device, so compute capability was unknown and no
precision advice followed (a ResNet-50 in fp32 SIMT on a V100 got none). The kernels' names
often carry the architecture they were compiled for: cuBLAS/cuDNN's `volta_sgemm_128x64_nn`,
`turing_fp16_s1688gemm_...`, `ampere_sgemm_...`, cuBLASLt's `sm80_xmma_gemm_...` and
`nvjet_sm90_tst_...`, CUTLASS's `cutlass_80_tensorop_...` and `cutlass::arch::Sm80`.

A kernel named for an architecture uses what that architecture brought, so it runs on it or a
later one (the H100 corpus runs cuBLAS's sm80_xmma_ kernels beside its sm90_ ones): each name
gives a floor, and the trace's capability is at least the highest floor. It is a floor, not the part:
a GPU named by nothing may be a data-center part or a GeForce one whose tensor math runs at half
the rate, so the peak ratios are left unknown for it (analyze/precision.py) and only what the
floor decides (tensor cores exist from 7.0, bf16 from 8.0) uses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# a family prefix at the start of the name: what cuBLAS and cuDNN called their kernels before
# the sm<NN> names; `maxwell_` kernels also ran on Pascal, hence floors, not the part
FAMILY_RX = re.compile(r"^(maxwell|pascal|volta|turing|ampere|hopper|blackwell)_", re.I)
FAMILY = {"maxwell": 5.0, "pascal": 6.0, "volta": 7.0, "turing": 7.5, "ampere": 8.0, "hopper": 9.0,
          "blackwell": 10.0}
# sm80_xmma_..., nvjet_sm90_..., ..._sm75_..., cutlass::arch::Sm80, cutlass_80_...: two or three
# digits, major then minor (sm100: 10.0, sm120: 12.0), not inside a longer word or number
SM_RX = re.compile(r"(?:(?<![A-Za-z0-9])|(?<=_))[sS]m_?(\d{2,3})[a-z]?(?!\d)")
CUTLASS_RX = re.compile(r"\bcutlass_(\d{2,3})_")


def capability_floor(names: Iterable[str]) -> float | None:
    """The highest capability the kernel names need (e.g. 7.0 for volta_sgemm_128x64_nn, 8.0 for
    sm80_xmma_gemm_...), or None when no name says."""
    best = None
    for name in names:
        for cc in _floors(name):
            best = cc if best is None or cc > best else best
    return best


def _floors(name: str) -> list[float]:
    out = []
    fam = FAMILY_RX.match(name)
    if fam:
        out.append(FAMILY[fam.group(1).lower()])
    for m in (*SM_RX.finditer(name), *CUTLASS_RX.finditer(name)):
        cc = _sm(m.group(1))
        if cc is not None:
            out.append(cc)
    return out


def _sm(digits: str) -> float | None:
    """'80' -> 8.0, '86' -> 8.6, '100' -> 10.0, '120' -> 12.0; None for what no GPU is (sm_10)."""
    major, minor = int(digits[:-1]), int(digits[-1])
    return float(f"{major}.{minor}") if 3 <= major <= 20 else None
