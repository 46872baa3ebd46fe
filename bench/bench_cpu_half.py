"""Calibration of PD367 / PD368 (16-bit floats on a CPU without their math) on this machine.

    python bench/bench_cpu_half.py [--rounds 3] [--models mlp512,mlp1024,conv,encoder] [--modes ...]

Each model trains (AdamW, random data) in float32 and in each 16-bit mode, in interleaved rounds:
bf16ac / fp16ac (torch.autocast("cpu") to bfloat16 / float16), bf16 / fp16 (the model and its
input converted with .to(dtype)). Measured slowdown = median over rounds of mode / fp32 time.
Prints the CPU's flags as perfdoctor reads them (collect/cpuflags.py), so a row says on what CPU
it holds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
from pathlib import Path

from bench_loader_starts import slowdown   # bench/ is on the path when run as a script

SCRIPT = """
import sys, time, torch
import torch.nn as nn, torch.nn.functional as F
name, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
if name == "mlp512":
    model, x = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)), torch.randn(64, 64)
elif name == "mlp1024":
    model, x = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), torch.randn(128, 1024)
elif name == "conv":
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    x = torch.randn(16, 3, 32, 32)
else:
    layer = nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Flatten(), nn.Linear(32 * 128, 10))
    x = torch.randn(16, 32, 128)
y = torch.randint(0, 10, (x.shape[0],))
half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
if half is not None:
    model, x = model.to(half), x.to(half)
ac = {"bf16ac": torch.bfloat16, "fp16ac": torch.float16}.get(mode)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i in range(steps + 3):
    if i == 3:
        t0 = time.perf_counter()
    opt.zero_grad()
    with torch.autocast("cpu", dtype=ac or torch.bfloat16, enabled=ac is not None):
        out = model(x)
    F.cross_entropy(out.float(), y).backward()
    opt.step()
print(f"TRAIN_S {time.perf_counter() - t0:.4f}", flush=True)
"""
STEPS = {"mlp512": 30, "mlp1024": 10, "conv": 10, "encoder": 10}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="mlp512,mlp1024,conv,encoder")
    ap.add_argument("--modes", default="bf16ac,fp16ac,bf16,fp16")
    a = ap.parse_args()
    from perfdoctor.collect.cpuflags import cpu_bf16, cpu_fp16
    print(f"this CPU: bf16 math {cpu_bf16()}, fp16 math {cpu_fp16()}")
    modes = a.modes.split(",")
    print(f"{'model':<9}" + "".join(f"{m:>18}" for m in modes))
    with tempfile.TemporaryDirectory(prefix="pd-bench-half-") as tmp:
        tmp = Path(tmp)
        script = tmp / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        for name in a.models.split(","):
            n = str(STEPS[name])
            ratios = {m: [] for m in modes}
            for i in range(a.rounds):          # the modes of a round next to each other
                for m in modes:
                    ratios[m].append(slowdown(script, name, m, "fp32", n, tmp, i))
            print(f"{name:<9}" + "".join(f"{statistics.median(r):>7.1f}x {min(r):>4.1f}-{max(r):<4.1f}x"
                                         for r in ratios.values()), flush=True)


if __name__ == "__main__":
    main()
