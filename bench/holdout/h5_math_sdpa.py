"""A GPT-style stack (4 blocks of width 512, 8 heads, 1024 tokens, bf16 autocast) whose causal
attention calls F.scaled_dot_product_attention inside sdpa_kernel(SDPBackend.MATH), left over
from debugging: every call takes SDPA's unfused math path. Fix (--fixed): no sdpa_kernel
context, so SDPA picks its fused kernel. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import GPTBlock, arguments, train_stack
from torch.nn.attention import SDPBackend, sdpa_kernel

a, dev = arguments(__doc__, steps=60, batch=16)
D, H, L, T = (64, 4, 2, 32) if a.small else (512, 8, 4, 1024)


class Block(GPTBlock):
    def attend(self, q, k, v):
        if a.fixed:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)


x = torch.randn(a.batch, T, D, device=dev)
train_stack([Block(D, H) for _ in range(L)], x, a, dev, None)
