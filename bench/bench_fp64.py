"""Calibration of PD357 (float32, not float64) on this machine's CPU.

    python bench/bench_fp64.py [--rounds 3] [--models mlp1024,conv,lstm,mlp64]

Each model trains (SGD, random data) in float64 and in float32 in interleaved rounds, printing
its training time; measured speed-up = median over rounds of fp64 / fp32. `perfdoctor run
--no-stacks` on the float64 script gives PD357's expected gain and ceiling; prints them against
the measurement and the 25% bar.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bench_loader_starts import slowdown   # bench/ is on the path when run as a script

SCRIPT = """
import sys, time, torch
name, dtype, steps = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
if name == "mlp1024":
    model, x = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)), torch.randn(256, 1024)
elif name == "conv":
    model, x = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3)), torch.randn(16, 16, 32, 32)
elif name == "mlp64":
    model, x = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]), torch.randn(32, 64)
else:                                     # an LSTMCell sequence model, as pytorch/examples' time_sequence_prediction
    class Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.out = torch.nn.LSTMCell(1, 51), torch.nn.LSTMCell(51, 51), torch.nn.Linear(51, 1)
        def forward(self, x):
            h = c = h2 = c2 = torch.zeros(x.size(0), 51, dtype=x.dtype)
            ys = []
            for xt in x.split(1, dim=1):
                h, c = self.l1(xt, (h, c))
                h2, c2 = self.l2(h, (h2, c2))
                ys.append(self.out(h2))
            return torch.cat(ys, 1)
    model, x = Seq(), torch.randn(97, 100)
model, x = model.to(dtype), x.to(dtype)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
for i in range(steps + 3):
    if i == 3:
        t0 = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
print(f"TRAIN_S {time.perf_counter() - t0:.4f}", flush=True)
"""
STEPS = {"mlp1024": 60, "conv": 40, "lstm": 30, "mlp64": 600}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="mlp1024,conv,lstm,mlp64")
    a = ap.parse_args()
    print(f"{'model':<9}{'measured':>9}{'rounds':>14}{'expected':>10}{'range':>12}{'ceiling':>9}{'error':>8}")
    with tempfile.TemporaryDirectory(prefix="pd-bench-fp64-") as tmp:
        tmp = Path(tmp)
        script = tmp / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        for name in a.models.split(","):
            n = str(STEPS[name])
            ratios = [slowdown(script, name, "float64", "float32", n, tmp, i) for i in range(a.rounds)]
            out = tmp / f"run-{name}"
            r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), str(script),
                                name, "float64", n], capture_output=True, text=True, timeout=900)
            try:
                doc = json.loads((out / "report.json").read_text())
            except (OSError, ValueError):
                raise SystemExit(f"perfdoctor run wrote no report (exit {r.returncode}):\n{r.stderr[-2000:]}")
            f = next((x for x in doc["findings"] if x["id"] == "PD357"), None)
            g = (f or {}).get("gain") or {}
            meas, exp, rng, cap = statistics.median(ratios), g.get("expected"), g.get("range"), g.get("ceiling")
            err = f"{(exp - meas) / meas:+.0%}" if exp else "-"
            rs = f"{rng[0]:.2f}-{rng[1]:.2f}x" if rng and None not in rng else "-"
            print(f"{name:<9}{meas:>8.2f}x{min(ratios):>7.2f}-{max(ratios):.2f}x"
                  f"{(f'{exp:.2f}x' if exp else 'silent'):>10}{rs:>12}{(f'{cap:.2f}x' if cap else '-'):>9}{err:>8}",
                  flush=True)


if __name__ == "__main__":
    main()
