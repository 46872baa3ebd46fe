"""A Transformer encoder in fp32 (matmuls on the SIMT cores: TF32 off, PyTorch's default).
Fix (--fixed): bf16 autocast. Prints `STEADY_MS <ms>` (after 20 warm-up steps, synchronised)."""
import argparse
import time

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU check of the harness)")
ap.add_argument("--fixed", action="store_true")
a = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
D, L, T = (64, 2, 32) if a.small else (1024, 4, 256)
layer = nn.TransformerEncoderLayer(D, nhead=max(D // 64, 1), dim_feedforward=4 * D, batch_first=True)
model = nn.TransformerEncoder(layer, L, enable_nested_tensor=False).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)
t0 = None
for step in range(a.steps):
    if step == 20:
        torch.cuda.synchronize() if dev == "cuda" else None
        t0 = time.perf_counter()
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.fixed):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize() if dev == "cuda" else None
print(f"STEADY_MS {1000 * (time.perf_counter() - t0) / (a.steps - 20):.2f}", flush=True)
