"""Hand-written causal attention in a small GPT block stack (bf16 autocast already on).
Fix (--fixed): torch.nn.functional.scaled_dot_product_attention(is_causal=True).
Prints its steady step time as `STEADY_MS <ms>` (steady.py)."""
import math

import torch
from steady import GPTBlock, arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=8, seq=1024)
D, H, L = (64, 4, 2) if a.small else (768, 12, 6)
T = 64 if a.small else a.seq


class Block(GPTBlock):
    def __init__(self):
        super().__init__(D, H)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril())

    def attend(self, q, k, v):
        if a.fixed:
            return super().attend(q, k, v)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        s = s.masked_fill(~self.mask, float("-inf"))
        return s.softmax(-1) @ v


model = nn.Sequential(*[Block() for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)


run_steady(train_step(lambda: model(x), opt, dev), a.steps, dev)
