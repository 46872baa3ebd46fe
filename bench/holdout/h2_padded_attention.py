"""A bidirectional encoder (bf16 autocast on) whose attention is written by hand with a key
padding mask and dropout on the probabilities. Fix (--fixed): scaled_dot_product_attention with
the same mask and dropout_p. Prints `STEADY_MS <ms>` (steady.py)."""
import math

import torch
import torch.nn.functional as F
from steady import arguments, train_stack
from torch import nn

a, dev = arguments(__doc__, batch=16, seq=512)
D, H, L = (64, 4, 2) if a.small else (512, 8, 6)
T = 32 if a.small else a.seq


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, keep):                     # keep: [B, 1, 1, T] bool, True = a real token
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if a.fixed:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=0.1)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
            s = s.masked_fill(~keep, float("-inf"))
            o = F.dropout(s.softmax(-1), 0.1) @ v
        x = x + self.out(o.transpose(1, 2).reshape(b, t, D))
        return x + self.ff(self.ln2(x))


x = torch.randn(a.batch, T, D, device=dev)
lengths = torch.randint(T // 2, T + 1, (a.batch,), device=dev)
keep = (torch.arange(T, device=dev)[None, :] < lengths[:, None])[:, None, None, :]
train_stack([Layer() for _ in range(L)], x, a, dev, None, keep)
