"""A GPT-style stack (6 blocks of width 768, 12 heads, 1024 tokens) under bf16 autocast whose
hand-written causal attention upcasts q and k to fp32 for a stable softmax (scores, mask and
softmax in fp32, then the weights back to bf16 for the product with v). Fix (--fixed):
F.scaled_dot_product_attention(q, k, v, is_causal=True) on the bf16 tensors. Prints `STEADY_MS
<ms>` (steady.py)."""
import math

import torch
import torch.nn.functional as F
from steady import GPTBlock, arguments, train_stack

a, dev = arguments(__doc__, steps=50, batch=8)
D, H, L, T = (64, 4, 2, 32) if a.small else (768, 12, 6, 1024)


class Block(GPTBlock):
    def attend(self, q, k, v):
        if a.fixed:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t = q.shape[-2]
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return weights.to(v.dtype) @ v


x = torch.randn(a.batch, T, D, device=dev)
train_stack([Block(D, H) for _ in range(L)], x, a, dev, None)
