"""Hand-written causal attention in a small GPT block stack (bf16 autocast already on).
Fix (--fixed): torch.nn.functional.scaled_dot_product_attention(is_causal=True).
Prints its steady step time as `STEADY_MS <ms>` (after 20 warm-up steps, synchronised)."""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU check of the harness)")
ap.add_argument("--fixed", action="store_true")
a = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
D, H, L = (64, 4, 2) if a.small else (768, 12, 6)
T = 64 if a.small else a.seq


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril())

    def attend(self, q, k, v):
        if a.fixed:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        s = s.masked_fill(~self.mask, float("-inf"))
        return s.softmax(-1) @ v

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self.attend(q, k, v).transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x))


model = nn.Sequential(*[Block() for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)
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
