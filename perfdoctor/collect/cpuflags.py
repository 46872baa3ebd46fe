"""Whether the CPU has bfloat16 / float16 math instructions (child.json `cpu_bf16`, `cpu_fp16`).

torch.autocast("cpu", dtype=torch.bfloat16), or a model kept in bfloat16, is fast on a CPU with
bf16 dot products: x86 AVX512_BF16 or AMX-BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4
and later), Arm's BF16 extension (Neoverse V1/N2, Graviton 3 and later). Without them oneDNN
converts every element to fp32 and back around fp32 math, and the bf16 matrix products run
slower than fp32 ones: on an AVX2-only AMD EPYC VM (torch 2.13, 2 threads) a 64x512 @ 512x512
product took 26.7 ms in bf16 against 8.3 ms in fp32, and a 3-layer MLP's training step under CPU
autocast 43.6 ms against 6.0 ms without it; float16 is no better there (bench/bench_cpu_half.py).
Read where the run happens (a report may be read on another machine); None where /proc/cpuinfo
says nothing (not Linux).
"""

from __future__ import annotations

X86 = ("avx512_bf16", "amx_bf16")
ARM = ("bf16",)
# float16 math: x86 AVX512-FP16 (Sapphire Rapids and later) or AMX-FP16 (Granite Rapids). Arm's
# half-precision arithmetic (asimdhp) is common, but whether torch's CPU kernels use it for
# training ops is not known here: on Arm the answer is None (nothing is claimed).
X86_FP16 = ("avx512_fp16", "amx_fp16")


def _first_cpu_flags(path: str) -> tuple[str, set[str]] | None:
    """("x86", flags) or ("arm", features) of the first CPU in `path`; None without them."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for row in f:
                key, _, value = row.partition(":")
                key = key.strip().lower()
                if key == "flags":
                    return "x86", set(value.split())
                if key == "features":
                    return "arm", set(value.split())
    except OSError:
        return None
    return None


def cpu_bf16(path: str = "/proc/cpuinfo") -> bool | None:
    """True where the first CPU's flags (x86 `flags`, Arm `Features`) name bf16 math, False where
    they name none, None without them."""
    found = _first_cpu_flags(path)
    if found is None:
        return None
    kind, flags = found
    return any(flag in (X86 if kind == "x86" else ARM) for flag in flags)


def cpu_fp16(path: str = "/proc/cpuinfo") -> bool | None:
    """True where the first x86 CPU's flags name float16 math, False where they name none; None
    on Arm (see X86_FP16) or without flags."""
    found = _first_cpu_flags(path)
    if found is None or found[0] != "x86":
        return None
    return any(flag in X86_FP16 for flag in found[1])
