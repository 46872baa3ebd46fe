"""Calibration of PD378 (SDPA for hand-written attention on a CPU) on this machine.

    python bench/bench_cpu_sdpa.py [--rounds 5] [--shapes 128x4x512x8,256x4x256x8,...]

Each shape (model width D x heads H x sequence T x batch B) trains two causal self-attention
layers (AdamW, random data), hand-written (matmul, scale, masked_fill with a triu mask, softmax,
matmul) and with scaled_dot_product_attention(is_causal=True), in interleaved rounds of three
steps each. The hand-written model's trace, recorded by torch.profiler, is diagnosed as `perfdoctor
report` would: a row prints the attention's share of the step and its matmuls' (the
attention.manual_cpu_* metrics), PD378's expected gain and range, the measured speed-up (median
over rounds), and the fused kernel's time over the matmuls' that the measurement implies (the
model takes 0.9).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = "128x4x512x8,256x4x256x8,128x2x1024x4,512x8x128x32,256x4x64x64"


def model_step(fused: bool, D: int, H: int, T: int, B: int):
    import torch
    import torch.nn as nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
            if fused:
                y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
                y = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1) @ v
            return self.o(y.transpose(1, 2).reshape(b, t, d))

    torch.manual_seed(0)
    m = nn.Sequential(Attn(), nn.LayerNorm(D), Attn(), nn.Linear(D, 10))
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    x, y = torch.randn(B, T, D), torch.randint(0, 10, (B, T))

    def step():
        loss = nn.functional.cross_entropy(m(x).reshape(-1, 10), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def row(shape: str, rounds: int, tmp: Path) -> str:
    from torch.profiler import ProfilerActivity, profile

    from perfdoctor.diagnose.offline import diagnose_path
    D, H, T, B = map(int, shape.split("x"))
    hand, fused = model_step(False, D, H, T, B), model_step(True, D, H, T, B)
    for _ in range(2):
        hand(), fused()
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(3):
            hand()
        t1 = time.perf_counter()
        for _ in range(3):
            fused()
        ratios.append((t1 - t0) / (time.perf_counter() - t1))
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(4):
            hand()
            p.step()
    path = tmp / f"{shape}.json"
    p.export_chrome_trace(str(path))
    doc = diagnose_path(str(path))
    m = doc["traces"][0]["metrics"]
    att, gemm = m["attention.manual_cpu_share"], m["attention.manual_cpu_gemm_share"]
    fix = next((f for f in doc["findings"] if f["id"] == "PD378"), None)
    measured = statistics.median(ratios)
    implied = (1 / measured - (1 - att)) / gemm if gemm else float("nan")
    if fix is None:
        return f"| {shape} | {att:.2f} | {gemm:.2f} | not raised | | {measured:.2f}x | {implied:.2f} |"
    g = fix["gain"]
    lo, hi = g["range"]
    return (f"| {shape} | {att:.2f} | {gemm:.2f} | {g['expected']:.2f}x | {lo:.2f}-{hi:.2f}x | "
            f"{measured:.2f}x | {implied:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args(argv)
    print("| D x H x T x B | attention share | matmul share | expected | range | measured | fused / matmuls |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for shape in args.shapes.split(","):
            print(row(shape, args.rounds, Path(d)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
