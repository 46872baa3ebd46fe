"""A decoder whose cross-attention (256 queries over 1024 encoder states, bf16 autocast on) is
written by hand: q @ k^T, scale, softmax, @ v, no mask. Fix (--fixed):
scaled_dot_product_attention. Prints `STEADY_MS <ms>` (steady.py)."""
import math

import torch
import torch.nn.functional as F
from steady import arguments, train_stack
from torch import nn

a, dev = arguments(__doc__, batch=16, queries=256, keys=1024)
D, H, L = (64, 4, 2) if a.small else (768, 12, 6)
TQ, TK = (16, 32) if a.small else (a.queries, a.keys)


class CrossLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.kv, self.out = nn.Linear(D, D), nn.Linear(D, 2 * D), nn.Linear(D, D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, mem):
        b = x.shape[0]
        q = self.q(self.ln(x)).view(b, TQ, H, D // H).transpose(1, 2)
        k, v = self.kv(mem).view(b, TK, 2, H, D // H).permute(2, 0, 3, 1, 4)
        if a.fixed:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            o = ((q @ k.transpose(-2, -1)) / math.sqrt(D // H)).softmax(-1) @ v
        x = x + self.out(o.transpose(1, 2).reshape(b, TQ, D))
        return x + self.ff(self.ln2(x))


x = torch.randn(a.batch, TQ, D, device=dev)
mem = torch.randn(a.batch, TK, D, device=dev)
train_stack([CrossLayer() for _ in range(L)], x, a, dev, None, mem)
