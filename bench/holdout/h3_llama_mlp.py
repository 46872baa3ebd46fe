"""A LLaMA-style stack in bf16 written op by op: RMSNorm as x * rsqrt(mean(x^2) + eps) * w and
a SwiGLU feed-forward (silu(x W1) * (x W3)) W2 with residual adds, no attention: a device-bound
step full of memory-bound elementwise kernels. Fix (--fixed): torch.compile(model).
Prints `STEADY_MS <ms>` (steady.py: the compiling happens in the warm-up steps)."""
import torch
import torch.nn.functional as F
from steady import arguments, train_stack
from torch import nn

a, dev = arguments(__doc__, batch=32)
D, L, T = (64, 2, 16) if a.small else (1024, 6, 512)


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm()
        self.w1, self.w3 = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, 3 * D, bias=False)
        self.w2 = nn.Linear(3 * D, D, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


x = torch.randn(a.batch, T, D, device=dev)
train_stack([Block() for _ in range(L)], x, a, dev, "compile")
