"""A bf16 MLP stack written op by op (x * sigmoid(1.702 x) activations, LayerNorm, dropout,
residuals): many memory-bound elementwise kernels on a device-bound step.
Fix (--fixed): torch.compile(model). Prints `STEADY_MS <ms>` (after 20 warm-up steps, in which
the compiling happens)."""
import argparse
import time

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--batch", type=int, default=16384)
ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU check of the harness)")
ap.add_argument("--fixed", action="store_true")
a = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
D, L, B = (64, 2, 256) if a.small else (1024, 8, a.batch)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        h = h * torch.sigmoid(1.702 * h)
        h = self.drop(h) * 0.5 + 0.5 * h
        return x + self.drop(self.fc2(h))


model = nn.Sequential(*[Block() for _ in range(L)]).to(dev)
if a.fixed:
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(B, D, device=dev)
t0 = None
for step in range(a.steps):
    if step == 20:
        torch.cuda.synchronize() if dev == "cuda" else None
        t0 = time.perf_counter()
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize() if dev == "cuda" else None
print(f"STEADY_MS {1000 * (time.perf_counter() - t0) / (a.steps - 20):.2f}", flush=True)
