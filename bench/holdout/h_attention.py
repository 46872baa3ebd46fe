"""Hand-written causal attention in a small GPT block stack (bf16 autocast already on).
Fix (--fixed): torch.nn.functional.scaled_dot_product_attention(is_causal=True).
Prints its steady step time as `STEADY_MS <ms>` (steady.py)."""
import math

import torch
import torch.nn.functional as F
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=8, seq=1024)
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


run_steady(train_step(lambda: model(x), opt, dev), a.steps, dev)
